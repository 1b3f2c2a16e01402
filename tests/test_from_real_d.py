"""``--from`` on real configs, round d: a sweep of published configs fitcheck was never shown (2023-2024
axolotl examples in the legacy layout, axolotl configs of modal-labs/llm-finetuning, TRL configs of
huggingface/open-r1 and the alignment-handbook, allenai/open-instruct's layout and DeepSpeed ``.conf``
files, LLaMA-Factory's 2024 examples, torchtune's 2024 recipes, FastChat's DeepSpeed JSONs, kohya_ss
presets; tests/data/from/real_d/README.md gives each file's source URL and commit).

Run as rounds b and c are (tests/test_from_real_c.py): ``fitcheck check [MODEL] --from FILE --on TARGET
--format json``, MODEL a preset of the same shape where the file's Hub model is no preset; what the file
reads to is compared with its golden in tests/golden/from_real_d/ (``FITCHECK_UPDATE_GOLDEN=1 pytest
tests/test_from_real_d.py`` rewrites them after a deliberate change; read the diff). The facts each file
is in the set for are written out by hand (``READS``, ``NOTES``, ``REFUSED``), each checked against the
trainer's own code (cited in the readers). What was wrong before this round (docs/from.md, "round d"):
torchtune's ``torch.nn.CrossEntropyLoss`` was sized as the chunked loss, open-instruct's ``use_qlora`` read as
full fine-tuning, a DeepSpeed JSON named ``.conf`` was not recognised; the rule tests below also hold
axolotl's ``max_packed_sequence_len`` and ``gradient_checkpointing: unsloth``, ``bnb_4bit_quant_storage``, and
HF's ``fsdp: true`` with ``fsdp_config``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fitcheck.errors import FitcheckError
from fitcheck.readers import read_config
from from_real_helpers import check_case_golden, posed, run_check

DATA = Path(__file__).parent / "data" / "from" / "real_d"
GOLDEN = Path(__file__).parent / "golden" / "from_real_d"
H100, H100X8, RTX4090 = "h100-80gb", "8xh100-80gb", "rtx-4090"

#: file -> (MODEL given on the command line, or None for the file's own; the target).
CASES: dict[str, tuple[str | None, str]] = {
    # axolotl @05b0bd08 (2024-05) and @5b0bc48f (2023-09): flash_attention booleans, fsdp lists
    "axolotl/llama-2-qlora-fsdp-2024.yml": ("llama-2-7b", H100X8),
    "axolotl/llama-3-qlora-fsdp-70b-2024.yaml": ("llama-3-70b", H100X8),
    "axolotl/dbrx-8bit-lora-2024.yaml": ("mixtral-8x7b", H100X8),
    "axolotl/llama-2-fft_optimized-2024.yml": ("llama-2-7b", H100),
    "axolotl/mistral-lora-mps-2024.yml": (None, H100),
    "axolotl/tiny-llama-pretrain-2024.yml": (None, RTX4090),
    "axolotl/phi2-ft-2024.yml": ("phi-3-mini", H100),
    "axolotl/qwen2-moe-qlora-2024.yaml": ("qwen3-30b-a3b", H100),
    "axolotl/falcon-7b-qlora-2024.yml": ("mistral-7b-v0.1", RTX4090),
    "axolotl/bigstral-ds-zero3-2024.yaml": ("mixtral-8x7b", H100X8),
    "axolotl/mistral-qlora-orpo-2024.yml": (None, H100),
    "axolotl/openllama-3b-qlora-2023.yml": ("llama-3.2-3b", RTX4090),
    "axolotl/llama-2-lora-2023.yml": ("llama-2-7b", H100),
    "axolotl/mistral-config-2023.yml": (None, H100),
    "axolotl/openllama-3b-qlora-2023-07.yml": ("llama-3.2-3b", RTX4090),  # @b1f4f7a3: max_packed_sequence_len
    # modal-labs/llm-finetuning @9e977043: axolotl configs outside axolotl
    "axolotl/modal-llama-3.yml": ("llama-3-8b", H100),
    "axolotl/modal-mixtral.yml": (None, H100X8),
    "axolotl/modal-codellama.yml": ("llama-2-7b", H100X8),
    # TRL: huggingface/open-r1, alignment-handbook @925acdfe, allenai/open-instruct @e6c3044a
    "trl/openr1-qwen2.5-1.5b-sft-config_demo.yaml": (None, H100),
    "trl/openr1-olympiccoder-7b-sft.yaml": ("qwen2.5-7b", H100),
    "trl/openr1-qwen2.5-1.5b-grpo-config_demo.yaml": (None, H100),
    "trl/ah-zephyr-7b-gemma-sft-config_full.yaml": (None, H100),
    "trl/ah-constitutional-ai-sft-config_anthropic.yaml": (None, H100),
    "trl/ah-zephyr-141b-orpo-config_full.yaml": (None, H100X8),
    "trl/open-instruct-tulu2_7b_qlora.yaml": ("llama-2-7b", H100),
    # LLaMA-Factory @14f7bfc5 (2024-06)
    "llamafactory/llama3_full_sft_ds3-2024.yaml": (None, H100X8),
    "llamafactory/llama3_lora_sft_bitsandbytes-2024.yaml": (None, RTX4090),
    "llamafactory/loraplus_llama3_lora_sft-2024.yaml": (None, H100),
    "llamafactory/llava1_5_lora_sft-2024.yaml": ("llama-2-7b", H100),
    "llamafactory/mod_llama3_full_sft-2024.yaml": (None, H100),
    "llamafactory/llama3_lora_ppo-2024.yaml": (None, H100),
    # torchtune @c51bafc7 (2024-07: loss torch.nn.CrossEntropyLoss, no max_seq_len) and @bd2a0fc7
    "torchtune/llama2-7B_qlora_single_device-2024.yaml": (None, RTX4090),
    "torchtune/code_llama2-7B_lora_single_device-2024.yaml": ("llama-2-7b", RTX4090),
    "torchtune/mistral-7B_full_low_memory-2024.yaml": (None, H100),
    "torchtune/gemma-7B_qlora_single_device-2024.yaml": (None, RTX4090),
    "torchtune/dev-llama2-7B_qlora_fsdp2-2024.yaml": (None, H100X8),
    "torchtune/llama2-13B_full-2024.yaml": (None, H100X8),
    "torchtune/qwen2_5-7B_lora_single_device.yaml": (None, RTX4090),
    "torchtune/llama3_1-8B_qlora_single_device.yaml": (None, RTX4090),
    # DeepSpeed JSONs: FastChat @0e6d3e4b, LLaMA-Factory @ff6d4d12, open-instruct's .conf @e6c3044a
    "deepspeed/fastchat-deepspeed_config_s2.json": ("llama-2-7b", H100X8),
    "deepspeed/fastchat-deepspeed_config_s3.json": ("llama-2-13b", H100X8),
    "deepspeed/lmf-ds_z2_offload_config.json": ("llama-3-8b", H100X8),
    "deepspeed/lmf-ds_z0_config.json": ("llama-3-8b", H100X8),
    "deepspeed/open-instruct-stage3_offloading_accelerate.conf": ("llama-3.1-8b", H100X8),
    # accelerate: open-instruct @e6c3044a, alignment-handbook @925acdfe
    "accelerate/open-instruct-deepspeed_zero3.yaml": ("llama-3.1-8b", H100X8),
    "accelerate/ah-fsdp.yaml": ("llama-3.1-8b", H100X8),
    # bmaltais/kohya_ss presets @45088f04
    "kohya_ss/sdxl-lora-ai_now-prodigy-v1.0.json": (None, RTX4090),
    "kohya_ss/sdxl-lora-malcolmrey-v1.0.json": (None, RTX4090),
    "kohya_ss/locon-dadaptation-sdxl.json": (None, RTX4090),
    "kohya_ss/sd15-edg_loraoptisettings.json": ("sd15", RTX4090),
    "kohya_ss/finetune-adafactor.json": ("sd15", RTX4090),
    "kohya_ss/sdxl-1-image-lokr-v1.0.json": (None, RTX4090),
}

#: file -> setup facts it is in the set for, as the trainer runs it (each from the file: origin "file").
READS: dict[str, dict[str, object]] = {
    # fsdp: [full_shard, auto_wrap] with fsdp_config.fsdp_offload_params: true (the prefixed 2024 keys)
    "axolotl/llama-2-qlora-fsdp-2024.yml": {
        "method": "qlora",
        "lora_targets": "linear-modules",
        "strategy": "fsdp",
        "offload": "all",
        "fsdp_version": 1,
        "ckpt_reentrant": True,
        "seq_len": 512,
    },
    "axolotl/llama-3-qlora-fsdp-70b-2024.yaml": {"method": "qlora", "lora_rank": 8, "strategy": "fsdp"},
    # gradient_checkpointing: false but fsdp_config.fsdp_activation_checkpointing: true; load_in_8bit LoRA
    "axolotl/dbrx-8bit-lora-2024.yaml": {
        "method": "lora",
        "base_quant": "int8",
        "grad_ckpt": True,
        "optimizer": "paged-adamw8bit",
    },
    "axolotl/llama-2-fft_optimized-2024.yml": {"method": "full", "optimizer": "adamw8bit", "attn": "flash"},
    "axolotl/mistral-lora-mps-2024.yml": {"attn": "sdpa", "method": "lora", "grad_accum": 8},
    "axolotl/falcon-7b-qlora-2024.yml": {"attn": "xformers", "optimizer": "paged-adamw", "lora_rank": 64},
    "axolotl/openllama-3b-qlora-2023.yml": {"precision": "fp16", "method": "qlora"},
    "axolotl/openllama-3b-qlora-2023-07.yml": {"seq_len": 2048, "batch_size": 4, "attn": "xformers"},
    "axolotl/llama-2-lora-2023.yml": {"base_quant": "int8", "method": "lora", "seq_len": 4096},
    "axolotl/modal-llama-3.yml": {"base_quant": "int8", "train_modules": "embed_tokens,lm_head"},
    # deepspeed: /workspace/axolotl/deepspeed_configs/zero2.json (absent): read as axolotl ships it
    "axolotl/modal-mixtral.yml": {"method": "qlora", "strategy": "zero2", "offload": "optimizer"},
    "axolotl/modal-codellama.yml": {"strategy": "zero3", "batch_size": 32},
    # torch_dtype bfloat16 with bf16: true: bf16 weights, no fp32 master; use_liger_kernel under TRL 1.16
    # keeps TRL's fused LM head (Liger's fused cross-entropy off): loss trl
    "trl/openr1-qwen2.5-1.5b-sft-config_demo.yaml": {
        "method": "full",
        "master_weights": False,
        "seq_len": 32768,
        "loss": "trl",
        "attn": "flash",
    },
    "trl/openr1-olympiccoder-7b-sft.yaml": {"batch_size": 2, "grad_accum": 8, "loss": "trl"},
    "trl/ah-zephyr-7b-gemma-sft-config_full.yaml": {"method": "full", "grad_ckpt": True, "attn": "flash"},
    # quantization_bit: 4 is QLoRA; lora_target: all
    "llamafactory/llama3_lora_sft_bitsandbytes-2024.yaml": {
        "method": "qlora",
        "lora_targets": "llamafactory-all",
        "precision": "fp16",
    },
    "llamafactory/llama3_full_sft_ds3-2024.yaml": {
        "method": "full",
        "strategy": "zero3",
        "precision": "fp16",
    },
    # torch.nn.CrossEntropyLoss: the whole fp32 logits (not torchtune's chunked default)
    "torchtune/llama2-7B_qlora_single_device-2024.yaml": {
        "method": "qlora",
        "loss": "standard",
        "lora_rank": 8,
    },
    "torchtune/code_llama2-7B_lora_single_device-2024.yaml": {
        "loss": "standard",
        "lora_targets": "q_proj,v_proj",
        "grad_accum": 64,
    },
    "torchtune/mistral-7B_full_low_memory-2024.yaml": {
        "optimizer": "paged-adamw",
        "optimizer_in_bwd": True,
        "loss": "standard",
    },
    "torchtune/gemma-7B_qlora_single_device-2024.yaml": {"lora_rank": 64, "loss": "standard"},
    "torchtune/dev-llama2-7B_qlora_fsdp2-2024.yaml": {
        "method": "qlora",
        "strategy": "fsdp",
        "fsdp_version": 2,
    },
    "torchtune/qwen2_5-7B_lora_single_device.yaml": {
        "loss": "chunked",
        "lora_targets": "q_proj,v_proj,o_proj,gate_proj,down_proj,up_proj",
    },
    "torchtune/llama3_1-8B_qlora_single_device.yaml": {"method": "qlora", "loss": "chunked"},
    "deepspeed/fastchat-deepspeed_config_s2.json": {"strategy": "zero2", "offload": "optimizer"},
    "deepspeed/fastchat-deepspeed_config_s3.json": {"strategy": "zero3", "offload": "all"},
    "deepspeed/lmf-ds_z2_offload_config.json": {"strategy": "zero2", "offload": "optimizer"},
    "deepspeed/lmf-ds_z0_config.json": {"strategy": "ddp"},
    "deepspeed/open-instruct-stage3_offloading_accelerate.conf": {"strategy": "zero3", "offload": "all"},
    "accelerate/open-instruct-deepspeed_zero3.yaml": {"strategy": "zero3", "gpus": 8},
    "accelerate/ah-fsdp.yaml": {"strategy": "fsdp", "fsdp_version": 1},
    "kohya_ss/sdxl-lora-ai_now-prodigy-v1.0.json": {"optimizer": "prodigy", "lora_rank": 32, "batch_size": 8},
    "kohya_ss/locon-dadaptation-sdxl.json": {"optimizer": "adafactor", "train_text_encoder": False},
    # mem_eff_attn beside xformers: sd-scripts takes mem_eff_attn first
    "kohya_ss/sd15-edg_loraoptisettings.json": {"attn": "flash", "batch_size": 3},
    "kohya_ss/finetune-adafactor.json": {"method": "full", "batch_size": 4, "optimizer": "adafactor"},
}

#: file -> words one of its stderr notes must carry (a value read but not modelled, said so).
NOTES: dict[str, str] = {
    "axolotl/openllama-3b-qlora-2023-07.yml": "max_packed_sequence_len: examples packed into rows of 2048",
    "axolotl/modal-mixtral.yml": "deepspeed: /workspace/axolotl/deepspeed_configs/zero2.json is not here",
    "axolotl/llama-2-qlora-fsdp-2024.yml": "fsdp_version unset: axolotl pins FSDP1",
    "llamafactory/llama3_full_sft_ds3-2024.yaml": "read as the trainer ships it",
    "torchtune/llama2-7B_qlora_single_device-2024.yaml": "loss._component_ CrossEntropyLoss",
    "torchtune/code_llama2-7B_lora_single_device-2024.yaml": "no fitcheck preset for it",
}

#: file -> words the one error line must carry.
REFUSED: dict[str, tuple[str, ...]] = {
    "axolotl/bigstral-ds-zero3-2024.yaml": ("unfrozen_parameters",),
    "axolotl/mistral-qlora-orpo-2024.yml": ("rl: 'orpo'",),
    "trl/openr1-qwen2.5-1.5b-grpo-config_demo.yaml": ("max_prompt_length",),
    "trl/ah-zephyr-141b-orpo-config_full.yaml": ("beta",),
    # open-instruct's own QLoRA switch: read as TRL it would be full fine-tuning
    "trl/open-instruct-tulu2_7b_qlora.yaml": ("use_qlora: true is no TRL key", "--method qlora"),
    "llamafactory/mod_llama3_full_sft-2024.yaml": ("mixture_of_depths",),
    "llamafactory/llama3_lora_ppo-2024.yaml": ("stage: 'ppo'",),
    "kohya_ss/sdxl-1-image-lokr-v1.0.json": ("network_dim 100000", "LoKr"),
}


def _rel(text: str) -> str:
    return text.replace(str(DATA) + "/", "")


def test_every_file_has_a_source_row_and_a_case() -> None:
    rows = (DATA / "README.md").read_text().splitlines()
    listed = {r.split("|")[1].strip().strip("`") for r in rows if r.startswith("| `")}
    on_disk = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"}
    assert listed == on_disk == set(CASES)
    assert set(READS) | set(NOTES) | set(REFUSED) <= set(CASES)
    assert not (set(READS) | set(NOTES)) & set(REFUSED)
    orphans = {p.name for p in GOLDEN.glob("*.json")} - {n.replace("/", "__") + ".json" for n in CASES}
    assert not orphans, orphans


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_config_poses_what_the_trainer_runs_or_refuses_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model, target = CASES[name]
    rc, doc, err = run_check(DATA / name, model, target, capsys)
    assert "Traceback" not in err and "internal error" not in err
    if name in REFUSED:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("fitcheck: error: "), err
        assert all(word in lines[0] for word in REFUSED[name]), lines[0]
        check_case_golden(GOLDEN, name, {"exit": 2, "error": _rel(lines[0])})
        return
    assert rc in (0, 1) and doc is not None, err
    for field, value in READS.get(name, {}).items():
        assert doc["setup"][field] == value, (field, doc["setup"][field])
        assert doc["setup_origin"][field] == "file", (field, doc["setup_origin"][field])
    if name in NOTES:
        assert NOTES[name] in err, err
    check_case_golden(GOLDEN, name, posed(DATA / name, doc, _rel, not_understood=True))


# ------------------------------------------------------------------------------- rules, one at a time


def _read(tmp_path: Path, text: str, name: str = "c.yaml") -> Any:
    path = tmp_path / name
    path.write_text(text)
    return read_config(str(path))


_TT = (
    "model:\n  _component_: torchtune.models.llama2.lora_llama2_7b\n"
    "optimizer:\n  _component_: torch.optim.AdamW\n"
)


@pytest.mark.parametrize(
    ("component", "loss", "note"),
    [
        ("torch.nn.CrossEntropyLoss", "standard", "CrossEntropyLoss: the model returns its whole logits"),
        ("torchtune.modules.loss.CEWithChunkedOutputLoss", "chunked", None),
        ("torchtune.modules.loss.LinearCrossEntropyLoss", "chunked", None),
        ("my.losses.FocalLoss", None, "'FocalLoss' has no fitcheck model"),
    ],
)
def test_torchtune_loss_component_is_read_or_noted(
    tmp_path: Path, component: str, loss: str | None, note: str | None
) -> None:
    """torchtune's recipes chunk the output only for CEWithChunkedOutputLoss (``set_num_output_chunks``);
    ``torch.nn.CrossEntropyLoss`` runs on the whole fp32 logits, and another component is said, not
    silently sized as the chunked default."""
    r = _read(tmp_path, _TT + f"loss:\n  _component_: {component}\n")
    assert r.values.get("loss") == loss
    assert (note is None) == (not [n for n in r.notes if "loss._component_" in n]), r.notes
    assert note is None or any(note in n for n in r.notes), r.notes
    assert "loss._component_" not in r.unused


@pytest.mark.parametrize(
    ("flags", "refused"),
    [
        ("use_qlora: true\nuse_lora: true\n", "use_qlora"),
        ("use_lora: true\n", "use_lora"),
        ("use_lora: false\n", None),
        ("use_peft: true\nuse_lora: true\n", None),  # TRL's own switch is on: read as TRL reads it
    ],
)
def test_trl_reader_refuses_another_tools_adapter_switch(
    tmp_path: Path, flags: str, refused: str | None
) -> None:
    """open-instruct's finetune.py configs (model_name_or_path, per_device_train_batch_size) are picked up
    by the TRL reader; their use_lora / use_qlora would otherwise read as full fine-tuning."""
    text = "model_name_or_path: meta-llama/Llama-2-7b-hf\nper_device_train_batch_size: 1\n" + flags
    if refused is None:
        r = _read(tmp_path, text)
        assert r.values["method"] == ("lora" if "use_peft" in flags else "full")
        return
    with pytest.raises(FitcheckError, match=f"{refused}: true is no TRL key"):
        _read(tmp_path, text)


@pytest.mark.parametrize(
    ("name", "text", "fmt"),
    [
        ("ds.conf", '{"zero_optimization": {"stage": 2}}\n', "deepspeed"),
        ("ds", '  {"train_micro_batch_size_per_gpu": 2, "bf16": {"enabled": true}}', "deepspeed"),
        ("run.cfg", "base_model: x\nmicro_batch_size: 2\n", "axolotl"),
    ],
)
def test_a_json_object_under_another_suffix_is_read_as_json(
    tmp_path: Path, name: str, text: str, fmt: str
) -> None:
    """open-instruct keeps its DeepSpeed configs as ``configs/ds_configs/*.conf``."""
    assert _read(tmp_path, text, name).format == fmt


def test_a_json_file_that_is_not_json_still_says_so(tmp_path: Path) -> None:
    with pytest.raises(FitcheckError, match="not valid JSON"):
        _read(tmp_path, '{"zero_optimization": {"stage": 2}', "ds.conf")


@pytest.mark.parametrize(
    ("value", "offload", "note"),
    [("unsloth", True, True), ("offload", True, False), ("true", False, False), ("false", False, False)],
)
def test_axolotl_unsloth_checkpointing_is_offload(
    tmp_path: Path, value: str, offload: bool, note: bool
) -> None:
    """axolotl 2024-04 .. 2025-05 took ``gradient_checkpointing: unsloth`` for the CPU-offloading wrapper
    ``offload`` names today (utils/models.py ``in ["unsloth", "offload"]``); it was refused as no flag."""
    r = _read(tmp_path, f"base_model: x\nadapter: lora\ngradient_checkpointing: {value}\n")
    assert r.values["grad_ckpt"] is (value != "false")
    assert r.values.get("offload_activations", False) is offload
    assert any("earlier name for offload" in n for n in r.notes) is note


@pytest.mark.parametrize(
    ("packed", "seq_len", "key"), [(1024, 1024, "max_packed_sequence_len"), (4096, 2048, "sequence_len")]
)
def test_axolotl_2023_packing_length(tmp_path: Path, packed: int, seq_len: int, key: str) -> None:
    """axolotl's 2023 ``max_packed_sequence_len`` packs rows of min(it, sequence_len) tokens (utils/data.py
    @b1f4f7a3); it was "not understood" and the micro-batch was said to be padded, not packed."""
    text = f"base_model: x\nsequence_len: 2048\nmax_packed_sequence_len: {packed}\nmicro_batch_size: 4\n"
    r = _read(tmp_path, text)
    assert (r.values["seq_len"], r.keys["seq_len"]) == (seq_len, key)
    assert "max_packed_sequence_len" not in r.unused
    assert not any("padded to its longest" in n for n in r.notes), r.notes


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # TRL ModelConfig.bnb_4bit_quant_storage (trl/trainer/utils.py get_quantization_config)
        (
            "model_name_or_path: x\nuse_peft: true\nload_in_4bit: true\nbnb_4bit_quant_storage: bfloat16\n",
            "bf16",
        ),
        (
            "model_name_or_path: x\nuse_peft: true\nload_in_4bit: true\nbnb_4bit_quant_storage: float32\n",
            "fp32",
        ),
        (
            "model_name_or_path: x\nuse_peft: true\nload_in_4bit: true\nbnb_4bit_quant_storage: uint8\n",
            "uint8",
        ),
        ("model_name_or_path: x\nuse_peft: true\nload_in_4bit: true\n", None),
        # axolotl: bnb_config_kwargs updates its BitsAndBytesConfig (loaders/model.py @067b021c)
        (
            "base_model: x\nadapter: qlora\nload_in_4bit: true\n"
            "bnb_config_kwargs:\n  bnb_4bit_quant_storage: float32\n",
            "fp32",
        ),
    ],
)
def test_qlora_quant_storage_is_read(tmp_path: Path, text: str, want: str | None) -> None:
    """The 4-bit storage dtype decides whether FSDP / ZeRO-3 shard the packed weights; it was "not
    understood" in both formats."""
    r = _read(tmp_path, text)
    assert r.values["method"] == "qlora" and r.values.get("quant_storage") == want
    assert not any("quant_storage" in u for u in r.unused), r.unused


def test_unknown_quant_storage_is_noted(tmp_path: Path) -> None:
    r = _read(
        tmp_path, "model_name_or_path: x\nuse_peft: true\nload_in_4bit: true\nbnb_4bit_quant_storage: int4\n"
    )
    assert "quant_storage" not in r.values and any("not a storage dtype" in n for n in r.notes)


_HF = "model_name_or_path: x\nper_device_train_batch_size: 1\n"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        # transformers TrainingArguments._process_fsdp_args: fsdp_config version, activation_checkpointing,
        # cpu_offload, reshard_after_forward (the fsdp_ prefix stripped)
        (
            "fsdp: full_shard auto_wrap\nfsdp_config:\n  fsdp_version: 1\n  activation_checkpointing: true\n",
            {"strategy": "fsdp", "fsdp_version": 1, "grad_ckpt": True},
        ),
        ("fsdp: full_shard\nfsdp_config:\n  cpu_offload: true\n", {"strategy": "fsdp", "offload": "all"}),
        ("fsdp: true\nfsdp_config:\n  reshard_after_forward: false\n", {"strategy": "fsdp-grad-op"}),
        # transformers 5.x's form (the string and list forms are deprecated): it was refused as no list
        ("fsdp: true\n", {"strategy": "fsdp", "offload": None}),
        ('fsdp: "true"\n', {"strategy": "fsdp"}),
        ("fsdp: false\nfsdp_config:\n  cpu_offload: true\n", {"strategy": None, "offload": None}),
        # without fsdp the Trainer ignores fsdp_config
        ("fsdp_config:\n  activation_checkpointing: true\n", {"strategy": None, "grad_ckpt": None}),
    ],
)
def test_hf_fsdp_config_is_read(tmp_path: Path, text: str, want: dict[str, object]) -> None:
    """A TRL / HF ``fsdp_config`` mapping was listed whole as "not understood"."""
    r = _read(tmp_path, _HF + text)
    for field, value in want.items():
        assert r.values.get(field) == value, (field, r.values)


def test_hf_fsdp_config_file_is_noted(tmp_path: Path) -> None:
    r = _read(tmp_path, _HF + "fsdp: full_shard\nfsdp_config: fsdp.json\n")
    assert any("fsdp_config: 'fsdp.json' is a separate JSON file" in n for n in r.notes), r.notes
    assert "fsdp_config" not in r.unused


def test_file_quant_storage_gives_way_to_a_command_line_method(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--method lora`` over a QLoRA file: its bnb_4bit_quant_storage no longer applies (it was an error)."""
    import json

    from fitcheck.cli import main

    path = tmp_path / "q.yaml"
    path.write_text(
        "model_name_or_path: x\nuse_peft: true\nload_in_4bit: true\nbnb_4bit_quant_storage: bfloat16\n"
    )
    args = ["estimate", "llama-3.1-8b", "--from", str(path), "--on", "8xh100-80gb", "--format", "json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["quant_storage"] == "bf16"
    assert main([*args, "--method", "lora"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (
        doc["setup"]["quant_storage"] is None and doc["setup_origin"]["quant_storage"] == "fitcheck default"
    )
