"""Emitters: golden files, parsed back, and checked by the real objects or key by key against option lists.

* hf.yaml goes through TRL's own parser (`trl sft --config`), which builds SFTConfig (a
  TrainingArguments) and ModelConfig, then TRL's own helpers build peft.LoraConfig and
  transformers.BitsAndBytesConfig; TrainingArguments is also built on its own.
* axolotl.yaml, llamafactory.yaml and mlx.yaml are checked key by key (name, type, choices) against the
  option lists in tests/data/trainer_keys/, and their LoRA / 4-bit fields are turned into the peft and
  transformers objects the trainers build from them.
* env.sh is run by bash.

Golden files: tests/golden/<format>; regenerate with FITCHECK_UPDATE_GOLDEN=1 after a deliberate change.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck import emitters
from fitcheck.cli import main
from fitcheck.commands.plan import model_reference
from fitcheck.emitters.common import EmitContext
from fitcheck.errors import OptionError
from fitcheck.sources.resolve import resolve_model
from golden_helpers import check_golden
from plan_helpers import plan_for
from trainer_keys import choices_ok, fields, header_choices, type_ok

GOLDEN = Path(__file__).parent / "golden"
#: One scenario per format: the command line that writes the golden file.
GOLDEN_CASES = {
    "hf.yaml": ["llama-3.1-8b", "--on", "rtx-4090", "--method", "qlora"],
    "axolotl.yaml": ["mistral-7b-v0.1", "--on", "rtx-3090", "--method", "lora", "--lora-targets", "attn"],
    "llamafactory.yaml": ["qwen2.5-1.5b", "--on", "a100-80gb", "--method", "full", "--epochs", "2"],
    "mlx.yaml": ["llama-3.1-8b", "--on", "apple-m3-max-36gb", "--method", "qlora", "--dataset-tokens", "20M"],
    "env.sh": ["llama-3.2-3b", "--on", "apple-m1-16gb", "--method", "qlora", "--seq-len", "1024"],
}
#: Plans every format is emitted for (model, target, options); the trainer is the format's.
MATRIX = [
    ("llama-3.1-8b", "rtx-4090", {"method": "qlora"}),
    ("llama-3.1-8b", "rtx-4090", {"method": "qlora", "double_quant": False, "lora_targets": "q_proj,v_proj"}),
    ("qwen2.5-1.5b", "a100-80gb", {"method": "full"}),
    ("qwen2.5-1.5b", "rtx-4090", {"method": "lora", "dora": True, "lora_rank": 8, "lora_alpha": 16}),
    ("llama-3.2-1b", "rtx-2080-ti", {"method": "lora", "lora_targets": "attn"}),
    ("qwen2.5-0.5b", "cpu", {"method": "full"}),
    ("qwen2.5-1.5b", "apple-m1-16gb", {"method": "lora"}),
    ("llama-3.1-8b", "apple-m3-max-36gb", {"method": "qlora"}),
    ("llama-3.1-8b", "rtx-4090", {"method": "lora", "loss": "liger", "optimizer_impl": "foreach"}),
]
BACKENDS = {
    "hf.yaml": None,
    "axolotl.yaml": ("cuda", "rocm"),
    "llamafactory.yaml": None,
    "mlx.yaml": ("mps",),
}


def emit_text(fmt: str, model: str, on: str, **kw: Any) -> str:
    trainer = emitters.TRAINERS[fmt] or "hf"
    plan = plan_for(model, on, trainer=trainer, **kw)
    spec = resolve_model(model)
    ctx = EmitContext(spec=spec, model_ref=model_reference(model, spec), command="fitcheck plan (test)")
    files = emitters.get(fmt).emit(plan, ctx)
    assert list(files) == [fmt]  # one file, named after the format when the user gave no name
    return files[fmt]


#: A format's own loss in place of the matrix's Liger case: `trl sft` scores through TRL's fused LM head and
#: refuses a plan for Liger's kernel (emitters/hf.py OWN_LOSS).
OWN_LOSS = {"hf.yaml": "trl"}


def matrix_for(fmt: str) -> list[Any]:
    allowed = BACKENDS[fmt]
    out = []
    for model, on, kw in MATRIX:
        backend = "cpu" if on == "cpu" else ("mps" if on.startswith("apple") else "cuda")
        if kw.get("loss") == "liger" and fmt in OWN_LOSS:
            kw = {**kw, "loss": OWN_LOSS[fmt]}
        if allowed is None or backend in allowed:
            out.append(pytest.param(model, on, kw, id=f"{model}-{on}-{'-'.join(map(str, kw.values()))}"))
    return out


# ------------------------------------------------------------------------------------------ golden


@pytest.mark.parametrize("fmt", sorted(GOLDEN_CASES))
def test_golden_file(fmt: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", *GOLDEN_CASES[fmt], "--emit", fmt, "-o", str(tmp_path), "--format", "json"])
    capsys.readouterr()
    assert rc == 0
    text = (tmp_path / fmt).read_text()
    golden = GOLDEN / fmt
    if os.environ.get("FITCHECK_UPDATE_GOLDEN"):
        golden.write_text(text)
    assert text == golden.read_text(), f"{fmt} changed; FITCHECK_UPDATE_GOLDEN=1 regenerates tests/golden/"
    first = text.splitlines()[0]
    assert first.startswith("# ") and "written by fitcheck" in first
    head = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    for needle in ("hardware:", "estimated peak:", "reproduce: fitcheck plan"):
        assert needle in head


#: LLaMA-Factory's own ``lora_target: all`` (``llamafactory-all``) on MoE models: tests/golden/llamafactory/.
#: Mixtral on an H200: under transformers 5 its fused experts stay 16-bit with QLoRA (93 GB of them;
#: docs/methodology.md#moe-experts-layout), more than an 80 GB card holds.
LMF_GOLDEN = {
    "qwen3-30b-a3b-qlora.yaml": ["qwen3-30b-a3b", "--on", "h100-80gb", "--method", "qlora"],
    "mixtral-8x7b-qlora.yaml": ["mixtral-8x7b", "--on", "h200", "--method", "qlora"],
}


@pytest.mark.parametrize("name", sorted(LMF_GOLDEN))
def test_llamafactory_moe_golden(name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [*LMF_GOLDEN[name], "--lora-targets", "llamafactory-all", "--emit", "llamafactory.yaml"]
    rc = main(["plan", *args, "-o", str(tmp_path), "--format", "json"])
    capsys.readouterr()
    assert rc == 0
    text = (tmp_path / "llamafactory.yaml").read_text()
    check_golden(GOLDEN / "llamafactory" / name, text, name)
    assert yaml.safe_load(text)["lora_target"] == "all"


@pytest.mark.parametrize("fmt", [f for f in sorted(GOLDEN_CASES) if f.endswith(".yaml")])
def test_golden_yaml_parses_back(fmt: str) -> None:
    data = yaml.safe_load((GOLDEN / fmt).read_text())
    assert isinstance(data, dict) and data


def test_golden_env_sh_runs_in_bash() -> None:
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    path = GOLDEN / "env.sh"
    subprocess.run([bash, "-n", str(path)], check=True)
    out = subprocess.run(
        [
            bash,
            "-c",
            f'source "{path}" && echo "$PYTORCH_ENABLE_MPS_FALLBACK|'
            '${PYTORCH_MPS_HIGH_WATERMARK_RATIO-unset}"',
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "1|unset"  # the watermark is shown commented out with its risk


def test_reproduce_line_rebuilds_the_same_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = (GOLDEN / "mlx.yaml").read_text()
    line = next(x for x in text.splitlines() if x.startswith("# reproduce: "))
    import shlex

    argv = shlex.split(line.removeprefix("# reproduce: "))
    assert argv[:2] == ["fitcheck", "plan"]
    assert main([*argv[1:], "-o", str(tmp_path)]) == 0
    capsys.readouterr()
    assert (tmp_path / "mlx.yaml").read_text() == text


# ---------------------------------------------------------------------------------- hf.yaml (TRL)


def trl_parse(path: Path) -> tuple[Any, ...]:
    trl_sft = pytest.importorskip("trl.scripts.sft")
    objs = trl_sft.make_parser().parse_args_and_config(
        ["--config", str(path), "--use_cpu", "True"],
        return_remaining_strings=True,
        separate_remaining_strings=True,
    )
    script, sft, model_cfg, _mixture, cfg_rest, cli_rest = objs
    assert cfg_rest == [] and cli_rest == [], "keys TRL does not know would reach accelerate launch"
    return script, sft, model_cfg


@pytest.mark.parametrize(("model", "on", "kw"), matrix_for("hf.yaml"))
def test_hf_yaml_builds_trl_transformers_peft_objects(model: str, on: str, kw: dict, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    trl = pytest.importorskip("trl")
    text = emit_text("hf.yaml", model, on, **kw)
    path = tmp_path / "hf.yaml"
    path.write_text(text)
    data = yaml.safe_load(text)
    _script, sft, model_cfg = trl_parse(path)
    assert isinstance(sft, trl.SFTConfig) and isinstance(sft, transformers.TrainingArguments)
    assert sft.per_device_train_batch_size == data["per_device_train_batch_size"]
    assert sft.gradient_checkpointing == data["gradient_checkpointing"]
    assert sft.max_length == data["max_length"]
    assert (sft.bf16, sft.fp16) == (data["bf16"], data["fp16"])
    ta_names = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    ta = transformers.HfArgumentParser(transformers.TrainingArguments).parse_dict(
        {**{k: v for k, v in data.items() if k in ta_names}, "use_cpu": True}
    )[0]
    assert ta.optim.value == data["optim"]
    assert ta.gradient_accumulation_steps == data["gradient_accumulation_steps"]
    peft_cfg = trl.get_peft_config(model_cfg)
    if kw["method"] == "full":
        assert peft_cfg is None
    else:
        import peft

        assert isinstance(peft_cfg, peft.LoraConfig)
        assert peft_cfg.r == data["lora_r"] and peft_cfg.lora_alpha == data["lora_alpha"]
        assert peft_cfg.use_dora == bool(kw.get("dora"))
    bnb = trl.get_quantization_config(model_cfg)
    if kw["method"] == "qlora":
        assert isinstance(bnb, transformers.BitsAndBytesConfig)
        assert bnb.load_in_4bit and bnb.bnb_4bit_quant_type == "nf4"
        assert bnb.bnb_4bit_use_double_quant == kw.get("double_quant", True)
    else:
        assert bnb is None


@pytest.mark.parametrize(("model", "on", "kw"), matrix_for("hf.yaml"))
def test_hf_yaml_keys_exist_in_every_transformers_5_release(model: str, on: str, kw: dict) -> None:
    data = yaml.safe_load(emit_text("hf.yaml", model, on, **kw))
    ta = fields("hf_training_arguments.txt")
    sft = fields("trl_sft_config.txt")
    mc = fields("trl_model_config.txt")
    script = {"dataset_name"}  # trl ScriptArguments
    for key, value in data.items():
        if key in ta:
            row = ta[key]
            assert all(row[c] == "y" for c in ("in_5.8.0", "in_5.14.1", "in_5.24.0")), key
        else:
            row = sft.get(key) or mc.get(key)
            assert row is not None or key in script, f"{key} is no TRL/transformers field"
        if row is not None:
            assert type_ok(row["type"], value), (key, value, row["type"])
            assert choices_ok(row, value), (key, value)


# ------------------------------------------------------------------------------------------ axolotl


@pytest.mark.parametrize(("model", "on", "kw"), matrix_for("axolotl.yaml"))
def test_axolotl_yaml_key_by_key(model: str, on: str, kw: dict) -> None:
    data = yaml.safe_load(emit_text("axolotl.yaml", model, on, **kw))
    keys = fields("axolotl_keys.txt")
    hf_optims = set(fields("hf_training_arguments.txt")["optim"]["choices"].split("|"))
    attn = header_choices("axolotl_keys.txt", "attn_implementation canonical values:")
    plugin_keys = {
        k: r for k, r in fields("axolotl_plugin_keys.txt").items() if r["plugin"] in data.get("plugins", [])
    }
    for key, value in data.items():
        if key in plugin_keys:  # a listed plugin's own field (get_input_args)
            assert type_ok(plugin_keys[key]["type"], value), (key, value)
            continue
        assert key in keys, f"axolotl silently drops unknown key {key}"
        row = keys[key]
        assert "deprecated" not in row["flag"], key
        assert type_ok(row["type"], value), (key, value, row["type"])
        if key == "optimizer":
            assert value in hf_optims | set(row["choices"].split("|"))
        elif key == "attn_implementation":
            assert value in attn
        else:
            assert choices_ok(row, value), (key, value)
    for ds in data["datasets"]:
        for sub, value in ds.items():
            row = keys[f"datasets[].{sub}"]
            assert type_ok(row["type"], value)
    assert data["adapter"] == kw["method"] if kw["method"] != "full" else "adapter" not in data
    _peft_and_bnb(
        kw,
        data.get("lora_r"),
        data.get("lora_alpha"),
        "all-linear" if data.get("lora_target_linear") else data.get("lora_target_modules"),
        {"load_in_4bit": True, "bnb_4bit_use_double_quant": True, **data.get("bnb_config_kwargs", {})}
        if data.get("load_in_4bit")
        else None,
    )


def _peft_and_bnb(kw: dict, r: Any, alpha: Any, targets: Any, bnb: dict | None) -> None:
    """Build the objects the trainer builds from these fields (peft.LoraConfig, BitsAndBytesConfig)."""
    if kw["method"] == "full":
        return
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    cfg = peft.LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, task_type="CAUSAL_LM")
    assert cfg.r == r
    if kw["method"] == "qlora":
        assert bnb is not None
        q = transformers.BitsAndBytesConfig(bnb_4bit_quant_type="nf4", **bnb)
        assert q.load_in_4bit and q.bnb_4bit_use_double_quant == kw.get("double_quant", True)


# ------------------------------------------------------------------------------------- LLaMA-Factory


@pytest.mark.parametrize(("model", "on", "kw"), matrix_for("llamafactory.yaml"))
def test_llamafactory_yaml_key_by_key(model: str, on: str, kw: dict) -> None:
    transformers = pytest.importorskip("transformers")
    data = yaml.safe_load(emit_text("llamafactory.yaml", model, on, **kw))
    own = fields("llamafactory_keys.txt")
    hf = fields("hf_training_arguments.txt")
    optims = header_choices("hf_training_arguments.txt", "OptimizerNames in 5.8.0:")
    hf_keys = {}
    for key, value in data.items():
        if key in own:
            row = own[key]
        else:
            row = hf.get(key)
            assert row is not None and row["in_5.8.0"] == "y", f"LLaMA-Factory rejects unknown key {key}"
            hf_keys[key] = value
        assert type_ok(row["type"], value), (key, value, row["type"])
        if key == "optim":
            assert value in optims
        else:
            assert choices_ok(row, value), (key, value)
    ta = transformers.HfArgumentParser(transformers.TrainingArguments).parse_dict(
        {**hf_keys, "use_cpu": True}
    )[0]
    assert ta.per_device_train_batch_size == data["per_device_train_batch_size"]
    targets = (
        "all-linear" if data.get("lora_target") == "all" else str(data.get("lora_target", "")).split(",")
    )
    bnb = (
        {"load_in_4bit": True, "bnb_4bit_use_double_quant": data["double_quantization"]}
        if data.get("quantization_bit") == 4
        else None
    )
    _peft_and_bnb(kw, data.get("lora_rank"), data.get("lora_alpha"), targets, bnb)


# ---------------------------------------------------------------------------------------------- mlx


@pytest.mark.parametrize(("model", "on", "kw"), matrix_for("mlx.yaml"))
def test_mlx_yaml_key_by_key(model: str, on: str, kw: dict) -> None:
    data = yaml.safe_load(emit_text("mlx.yaml", model, on, **kw))
    keys = fields("mlx_lm_lora_keys.txt", key="key")
    for key, value in data.items():
        assert key in keys, f"mlx-lm silently ignores unknown key {key}"
        row = keys[key]
        assert row["yaml_effective"] == "yes", f"mlx-lm drops {key} from YAML"
        assert type_ok(row["type"], value), (key, value, row["type"])
        assert choices_ok(row, value), (key, value)
    assert data["num_layers"] == -1
    if kw["method"] == "full":
        assert "lora_parameters" not in data
    else:
        lp = data["lora_parameters"]
        assert {"rank", "scale", "dropout"} <= set(lp) <= {"rank", "scale", "dropout", "keys"}
        assert isinstance(lp["rank"], int) and isinstance(lp["scale"], float)
    if kw["method"] == "qlora":
        assert data["model"].endswith("-4bit-mlx")


def test_mlx_qlora_header_says_how_to_quantize() -> None:
    text = emit_text("mlx.yaml", "llama-3.1-8b", "apple-m3-max-36gb", method="qlora")
    assert "mlx_lm.convert --hf-path meta-llama/Llama-3.1-8B -q --q-bits 4" in text


# ---------------------------------------------------------------------------------- cannot express


def test_an_emitter_refuses_a_plan_of_another_trainer() -> None:
    plan = plan_for("llama-3.2-1b", "rtx-4090", method="lora", trainer="axolotl")
    spec = resolve_model("llama-3.2-1b")
    ctx = EmitContext(spec=spec, model_ref=spec.hf_id, command="x")
    with pytest.raises(OptionError, match=r"hf\.yaml runs the hf regime"):
        emitters.get("hf.yaml").check(plan, ctx)


def test_a_size_string_names_no_weights_to_load() -> None:
    plan = plan_for("1B", "rtx-4090", method="lora")
    ctx = EmitContext(spec=resolve_model("1B"), model_ref=None, command="x")
    with pytest.raises(OptionError, match="needs a real model"):
        emitters.get("hf.yaml").emit(plan, ctx)


def test_non_integer_alpha_cannot_be_written_for_hf() -> None:
    with pytest.raises(OptionError, match="integer LoRA alpha"):
        emit_text("hf.yaml", "llama-3.2-1b", "rtx-4090", method="lora", lora_alpha=8.5)


def test_mlx_cannot_name_gpt2_modules() -> None:
    with pytest.raises(OptionError, match="cannot name"):
        emit_text("mlx.yaml", "gpt2", "apple-m3-max-36gb", method="lora", lora_targets="c_attn")


def test_format_from_name() -> None:
    assert emitters.format_for("run.hf.yaml") == "hf.yaml"
    assert emitters.format_for("out/my-axolotl.yaml") == "axolotl.yaml"
    assert emitters.format_for("anything.yaml", "mlx.yaml") == "mlx.yaml"
    with pytest.raises(OptionError, match="cannot tell the format"):
        emitters.format_for("train.yaml")
    with pytest.raises(OptionError, match="did you mean"):
        emitters.format_for("x", "hf.yml")
    assert emitters.format_for("sdxl.kohya.toml") == "kohya.toml"
