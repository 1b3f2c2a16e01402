"""Emitted files built into models: every preset architecture, CUDA-like, MPS-like and CPU targets.

Parsing is not enough (issue #15): a file can parse and still fail on the user's machine (Gemma 2
with SDPA) or train the wrong thing. So for each LLM format, for a tiny model of every architecture
in presets/models (the preset's own config with small sizes, random weights, saved in bf16 like the
real checkpoints; no download), the plan is made for the target, the file is emitted, and the model
the file describes is built through the trainer's own loading path, with its attention
implementation and dtype; then one optimizer step runs on the CPU under the file's precision (for
full fine-tuning and for fp16, where the weights' dtype decides whether it trains), with the
GradScaler when the file says fp16 (HF Trainer's fp16 path unscales before clipping, which fails
on fp16 gradients).

* hf.yaml: TRL's own parser (``trl sft --config``) and its loader
  (``trl.trainer.utils.create_model_from_path``), peft from ``trl.get_peft_config``.
* llamafactory.yaml, axolotl.yaml: their packages pin other transformers releases, so their loading
  rules are applied to transformers' real loader: LLaMA-Factory loads the checkpoint dtype
  (``torch_dtype="auto"``, model/loader.py @ff6d4d12), maps ``flash_attn`` disabled/sdpa/fa2 to eager/
  sdpa/flash_attention_2 (model_utils/attention.py) and upcasts trainable weights to fp32
  (model/adapter.py); axolotl loads ``torch_dtype`` = bf16 if ``bf16``, fp16 if ``fp16``, else fp32
  (utils/config/__init__.py resolve_dtype @067b021c) with ``attn_implementation`` as written.
* mlx.yaml: mlx-lm needs Apple silicon; its rules are checked (iters a multiple of the accumulation,
  no pure-fp16 full fine-tune, the model converted to the dtype the plan was sized for).

FlashAttention-2 is not installed here: a file naming it is checked against the model class's
``_supports_flash_attn`` and the step runs with eager attention. QLoRA needs bitsandbytes' CUDA
kernels, so only full and LoRA plans are built. A slow test runs TRL's SFTTrainer for one step.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck import emitters
from fitcheck.commands.plan import model_reference
from fitcheck.emitters.common import EmitContext
from fitcheck.measure.build import llamafactory_module_names
from fitcheck.planner import kernels
from fitcheck.sources.resolve import resolve_model
from plan_helpers import plan_for

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

#: One preset per architecture (model_type) in presets/models; test_every_architecture_is_covered.
#: Gemma 3 (multimodal, gemma-3-4b and up) is trained through its text decoder, the gemma3_text
#: architecture of gemma-3-1b, so its tiny model would be the same: it is covered by that row.
ARCH_PRESETS = {
    "gemma": "gemma-2b",
    "gemma2": "gemma-2-2b",
    "gemma3_text": "gemma-3-1b",
    "gpt2": "gpt2",
    "llama": "llama-3.2-1b",
    "mistral": "mistral-7b-v0.1",
    "mixtral": "mixtral-8x7b",
    "phi3": "phi-3-mini",
    "qwen2": "qwen2.5-0.5b",
    "qwen3": "qwen3-0.6b",
    "qwen3_moe": "qwen3-30b-a3b",
}
#: CUDA-like, MPS-like, CPU: the targets without bf16 are where fp16 rules bite; the bf16 ones with
#: FlashAttention-2 (rtx-4090) and bf16 on Apple (M3) are in the smaller `EXTRA` set.
TARGETS = ("rtx-2080-ti", "apple-m1-16gb", "cpu")
EXTRA = ("rtx-4090", "apple-m3-max-36gb")
#: The architectures the bf16/flash targets are tried with: the soft-capped one and a plain one
#: (kernels.ARCH_KERNELS: every other preset type has the same flags as llama).
EXTRA_ARCHS = ("gemma2", "llama")
METHODS = ("full", "lora")
#: Small sizes for every architecture (the preset keeps everything else: soft-capping, windows, ...).
SMALL = {
    "hidden_size": 64,
    "n_embd": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "n_layer": 2,
    "num_attention_heads": 4,
    "n_head": 4,
    "head_dim": 16,
    "query_pre_attn_scalar": 16,
    "vocab_size": 512,
    "max_position_embeddings": 256,
    "n_positions": 256,
    "n_ctx": 256,
    "num_local_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
}
SEQ = 64


def tiny_config(preset: str) -> dict[str, Any]:
    """The preset's config with small sizes. Gemma 3 (multimodal) keeps its text decoder, which is
    the part fitcheck sizes (the vision tower is frozen extra parameters)."""
    cfg = dict(resolve_model(preset).hf_config or {})
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "model_type": cfg["text_config"].get("model_type", "gemma3_text")}
    out = {k: (SMALL[k] if k in SMALL and v is not None else v) for k, v in cfg.items()}
    kv = cfg.get("num_key_value_heads")
    heads = cfg.get("num_attention_heads")
    if kv is not None:
        out["num_key_value_heads"] = 1 if kv == 1 else (4 if kv == heads else 2)
    if cfg.get("sliding_window"):
        out["sliding_window"] = 32
    out |= {"pad_token_id": 1, "bos_token_id": 2, "eos_token_id": 2}  # within the small vocabulary
    out.pop("torch_dtype", None)
    return out


@functools.cache
def tiny_model(preset: str) -> Path:
    """A folder with config.json, bf16 random weights and a small tokenizer (made once per session)."""
    folder = Path(tempfile.mkdtemp(prefix=f"fitcheck-tiny-{preset}-"))
    config = transformers.AutoConfig.for_model(**tiny_config(preset))
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.to(torch.bfloat16).save_pretrained(folder)
    # the config.json as the hub has it (the preset's key names: transformers 5 saves Qwen3-MoE's
    # num_experts as num_local_experts, which fitcheck's config reader does not know)
    saved = json.loads((folder / "config.json").read_text())
    hub = {**tiny_config(preset), "architectures": saved["architectures"], "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(hub))
    _tokenizer(config.vocab_size).save_pretrained(folder)
    return folder


def _tokenizer(vocab_size: int) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, "[EOS]": 2, **{f"w{i}": i for i in range(3, vocab_size)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", eos_token="[EOS]"
    )


@functools.cache
def emitted(fmt: str, preset: str, on: str, method: str, **kw: Any) -> tuple[Any, str]:
    """(plan, text) of ``fmt`` for the tiny model of ``preset`` on ``on``; the grid kept small."""
    folder = str(tiny_model(preset))
    trainer = emitters.TRAINERS[fmt] or "hf"
    plan = plan_for(
        folder,
        on,
        trainer=trainer,
        method=method,
        seq_len=SEQ,
        batch_size=1,
        effective_batch=2,
        grad_ckpt=False,
        optimizer="adamw",
        **kw,
    )
    assert plan.fits and plan.chosen is not None
    spec = resolve_model(folder)
    ctx = EmitContext(spec=spec, model_ref=model_reference(folder, spec), command="fitcheck plan (test)")
    return plan, emitters.get(fmt).emit(plan, ctx)[fmt]


def cases(
    fmt: str, targets: tuple[str, ...] = TARGETS, archs: tuple[str, ...] = tuple(ARCH_PRESETS)
) -> list[Any]:
    allowed = {"axolotl.yaml": ("cuda",), "mlx.yaml": ("mps",)}.get(fmt)
    out = []
    for mtype, preset in ARCH_PRESETS.items():
        if mtype not in archs:
            continue
        for on in targets:
            backend = "cpu" if on == "cpu" else ("mps" if on.startswith("apple") else "cuda")
            if allowed and backend not in allowed:
                continue
            for method in METHODS:
                out.append(pytest.param(preset, on, method, id=f"{mtype}-{on}-{method}"))
    return out


# ------------------------------------------------------------------------------ build and one step

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
#: transformers attention implementation per LLaMA-Factory flash_attn (model_utils/attention.py).
LMF_ATTN = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash_attention_2"}


def flash_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def loadable_attn(folder: Path, attn: str) -> str:
    """The implementation to build with here. FlashAttention-2 is checked against the class flag and
    xformers (axolotl registers it in transformers' AttentionInterface) against the class's
    attention-backend flag; both are then built with eager, since neither is installed here."""
    if attn not in ("flash_attention_2", "xformers") or (attn == "flash_attention_2" and flash_available()):
        return attn
    config = transformers.AutoConfig.from_pretrained(folder)
    cls = transformers.AutoModelForCausalLM._model_mapping[type(config)]
    flag = "_supports_flash_attn" if attn == "flash_attention_2" else "_supports_attention_backend"
    assert getattr(cls, flag), f"{cls.__name__} has no {attn} path"
    return "eager"


def one_step(model: Any, bf16: bool, fp16: bool) -> None:
    """One training step on the CPU under the file's precision: autocast, and for fp16 the GradScaler
    with the unscale the HF Trainer does before clipping (fails on fp16 gradients). Eight tokens: the
    dtypes, not the sizes, are under test."""
    dtype = torch.float16 if fp16 else torch.bfloat16 if bf16 else None
    for m in model.modules():  # CUDA and MPS autocast run layer_norm in fp32 (weights too); CPU does not
        if isinstance(m, torch.nn.LayerNorm) and not any(p.requires_grad for p in m.parameters()):
            m.float()
    params = [p for p in model.parameters() if p.requires_grad]
    assert params, "nothing to train"
    opt = torch.optim.AdamW(params, lr=1e-4)
    ids = torch.randint(3, model.config.get_text_config().vocab_size, (1, 8))
    with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = model(input_ids=ids, labels=ids).loss
    if fp16:
        scaler = torch.amp.GradScaler("cpu")
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)


def check_attention(model: Any, written: str, built: str, preset: str) -> None:
    """The model runs the implementation it was built with; a soft-capped model is written eager or
    flash (the two that apply the soft-cap)."""
    assert model.config._attn_implementation == built
    if tiny_config(preset).get("attn_logit_softcapping"):
        assert written in ("eager", "flash_attention_2"), f"{written} drops the attention soft-capping"


# ----------------------------------------------------------------------------------------- hf.yaml


def trl_objects(text: str, folder: Path, tmp: Path) -> tuple[Any, Any]:
    """(SFTConfig, ModelConfig) from the file, through TRL's own parser, pointed at the tiny model."""
    trl_sft = pytest.importorskip("trl.scripts.sft")
    data = yaml.safe_load(text)
    data["model_name_or_path"] = str(folder)
    data["output_dir"] = str(tmp / "out")
    path = tmp / "hf.yaml"
    path.write_text(json.dumps(data))  # JSON is YAML
    _script, sft, model_cfg, *_rest = trl_sft.make_parser().parse_args_and_config(
        ["--config", str(path), "--use_cpu", "True"],
        return_remaining_strings=True,
        separate_remaining_strings=True,
    )
    return sft, model_cfg


def build_hf(text: str, preset: str, tmp: Path) -> tuple[Any, Any]:
    """The model TRL builds from hf.yaml (create_model_from_path, then peft)."""
    import trl
    from trl.trainer.utils import create_model_from_path

    folder = tiny_model(preset)
    sft, mc = trl_objects(text, folder, tmp)
    attn = loadable_attn(folder, mc.attn_implementation)
    model = create_model_from_path(mc.model_name_or_path, attn_implementation=attn, dtype=mc.dtype)
    assert model.dtype == DTYPES[mc.dtype]
    check_attention(model, mc.attn_implementation, attn, preset)
    cfg = trl.get_peft_config(mc)
    if cfg is not None:
        model = peft.get_peft_model(model, cfg)
    return model, sft


@pytest.mark.parametrize(("preset", "on", "method"), cases("hf.yaml") + cases("hf.yaml", EXTRA, EXTRA_ARCHS))
def test_hf_yaml_builds_and_steps(preset: str, on: str, method: str, tmp_path: Path) -> None:
    _plan, text = emitted("hf.yaml", preset, on, method)
    model, sft = build_hf(text, preset, tmp_path)
    if sft.fp16 or method == "full":
        one_step(model, sft.bf16, sft.fp16)


# -------------------------------------------------------------------------------- LLaMA-Factory


@pytest.mark.parametrize(("preset", "on", "method"), cases("llamafactory.yaml"))
def test_llamafactory_yaml_builds_and_steps(preset: str, on: str, method: str) -> None:
    # LLaMA-Factory's own default, lora_target: all (on GPT-2's Conv1D it finds nothing: peft's all-linear,
    # written as names)
    targets = (
        {} if method == "full" else {"lora_targets": "all-linear" if preset == "gpt2" else "llamafactory-all"}
    )
    _plan, text = emitted("llamafactory.yaml", preset, on, method, **targets)
    data = yaml.safe_load(text)
    folder = tiny_model(preset)
    written = LMF_ATTN[data["flash_attn"]]
    attn = loadable_attn(folder, written)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype="auto", attn_implementation=attn)
    check_attention(model, written, attn, preset)
    if data["finetuning_type"] == "full":
        for p in model.parameters():  # adapter.py _setup_full_tuning: cast_trainable_params_to_fp32
            p.data = p.data.float()
    else:
        # adapter.py _setup_lora_tuning: all is find_all_linear_modules on the loaded model
        lmf_all = llamafactory_module_names(model, model.config.model_type)
        targets = lmf_all if data["lora_target"] == "all" else data["lora_target"].split(",")
        cfg = peft.LoraConfig(r=data["lora_rank"], lora_alpha=data["lora_alpha"], target_modules=targets)
        model = peft.get_peft_model(model, cfg, autocast_adapter_dtype=True)
    if data["fp16"] or method == "full":
        one_step(model, data["bf16"], data["fp16"])


# -------------------------------------------------------------------------------------- axolotl


@pytest.mark.parametrize(
    ("preset", "on", "method"), cases("axolotl.yaml") + cases("axolotl.yaml", EXTRA, EXTRA_ARCHS)
)
def test_axolotl_yaml_builds_and_steps(preset: str, on: str, method: str) -> None:
    _plan, text = emitted("axolotl.yaml", preset, on, method)
    data = yaml.safe_load(text)
    folder = tiny_model(preset)
    dtype = torch.bfloat16 if data["bf16"] else torch.float16 if data["fp16"] else torch.float32
    attn = loadable_attn(folder, data["attn_implementation"])
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn)
    check_attention(model, data["attn_implementation"], attn, preset)
    if "adapter" in data:
        targets = "all-linear" if data.get("lora_target_linear") else data["lora_target_modules"]
        cfg = peft.LoraConfig(r=data["lora_r"], lora_alpha=data["lora_alpha"], target_modules=targets)
        model = peft.get_peft_model(model, cfg)
    if data["fp16"] or method == "full":
        one_step(model, data["bf16"], data["fp16"])


# ------------------------------------------------------------------------------------------ mlx-lm


@pytest.mark.parametrize(
    ("preset", "on", "method"), cases("mlx.yaml", ("apple-m1-16gb", "apple-m3-max-36gb"))
)
def test_mlx_yaml_rules(preset: str, on: str, method: str) -> None:
    plan, text = emitted("mlx.yaml", preset, on, method)
    data = yaml.safe_load(text)
    s = plan.chosen.setup
    assert data["iters"] % data["grad_accumulation_steps"] == 0, "the last micro-batches would not update"
    assert kernels.precision_refusal("mlx", s.method, s.precision) is None
    if data["fine_tune_type"] == "full":
        assert s.precision != "fp16", "mlx-lm has no loss scaling"
    if s.precision != "bf16":  # the model is converted to the dtype the plan was sized for
        dtype = {"fp16": "float16", "fp32": "float32"}[s.precision]
        assert f"--dtype {dtype}" in text
    assert s.attn == kernels.mlx_kernel(resolve_model(str(tiny_model(preset))).arch)


# ------------------------------------------------------------------------------- the rule table


def test_every_architecture_is_covered() -> None:
    from fitcheck.presets import preset_ids

    types = {resolve_model(p).arch.model_type for p in preset_ids("models")}
    covered = set(ARCH_PRESETS) | {"gemma3"}  # the gemma3_text decoder (ARCH_PRESETS)
    assert types <= covered, types - covered
    assert tiny_config("gemma-3-4b")["model_type"] == "gemma3_text"


@pytest.mark.parametrize("model_type", sorted(kernels.ARCH_KERNELS))
def test_arch_table_matches_transformers_flags(model_type: str) -> None:
    """kernels.ARCH_KERNELS against the installed transformers' own per-model flags."""
    import importlib

    row = kernels.ARCH_KERNELS[model_type]
    name = {"gemma3_text": "gemma3"}.get(model_type, model_type)
    mod = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    base = next(getattr(mod, n) for n in dir(mod) if n.endswith("PreTrainedModel") and n != "PreTrainedModel")
    assert base._supports_sdpa == row.sdpa
    assert base._supports_flash_attn == row.flash


def test_gemma2_with_sdpa_is_what_transformers_refuses(tmp_path: Path) -> None:
    """The fact the table encodes, seen through the loader the emitted file would use."""
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention|sdpa"):
        transformers.AutoModelForCausalLM.from_pretrained(
            tiny_model("gemma-2-2b"), attn_implementation="sdpa"
        )


def test_fp16_weights_fail_the_gradscaler() -> None:
    """The failure the fp16 rule prevents: fp16 weights trained under the GradScaler."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model("qwen2.5-0.5b"), dtype=torch.float16)
    with pytest.raises(ValueError, match="unscale FP16 gradients"):
        one_step(model, bf16=False, fp16=True)


# ----------------------------------------------------------------------------- a real TRL step


@pytest.mark.slow
@pytest.mark.parametrize(
    ("preset", "on", "method"),
    [("gemma-2-2b", "apple-m3-max-36gb", "lora"), ("qwen2.5-0.5b", "rtx-2080-ti", "full")],
)
def test_trl_sft_trainer_runs_one_step(preset: str, on: str, method: str, tmp_path: Path) -> None:
    """TRL's SFTTrainer, built from the emitted hf.yaml as ``trl sft`` builds it, trains one step (and
    under fp16 holds fp32 trainable weights, which the GradScaler on CUDA or MPS needs)."""
    import datasets
    import trl

    _plan, text = emitted("hf.yaml", preset, on, method)
    sft, mc = trl_objects(text, tiny_model(preset), tmp_path)
    args = dataclasses.replace(
        sft,
        max_steps=1,
        output_dir=str(tmp_path / "out"),
        save_strategy="no",
        max_length=32,
        eos_token="[EOS]",
        model_init_kwargs={"attn_implementation": mc.attn_implementation, "dtype": mc.dtype},
    )
    text_ds = datasets.Dataset.from_dict({"text": [" ".join(f"w{i}" for i in range(3, 40))] * 4})
    trainer = trl.SFTTrainer(
        model=mc.model_name_or_path, args=args, train_dataset=text_ds, peft_config=trl.get_peft_config(mc)
    )
    if args.fp16:  # accelerate makes no GradScaler on a CPU; on CUDA and MPS it needs fp32 trainables
        assert trainer.accelerator.mixed_precision == "fp16"
        assert all(p.dtype == torch.float32 for p in trainer.model.parameters() if p.requires_grad)
    out = trainer.train()
    assert out.global_step == 1
