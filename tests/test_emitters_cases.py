"""Issue #15: emitted files that would fail, or train the wrong thing, on the user's machine.

Each test is one case found by feeding a grid of emitted files to the trainers' own loaders; each
failed before its fix. The loader-level checks (a tiny model built from each file) are in
tests/test_emitters_load.py.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck import emitters
from fitcheck.cli import main
from fitcheck.commands.plan import model_reference
from fitcheck.emitters.common import EmitContext
from fitcheck.engine.verdict import judge_bytes
from fitcheck.errors import OptionError
from fitcheck.sources.resolve import resolve_model
from plan_helpers import plan_for


def emit_yaml(fmt: str, model: str, on: str, **kw: Any) -> tuple[Any, dict[str, Any], str]:
    trainer = emitters.TRAINERS[fmt] or kw.pop("trainer", "hf")
    plan = plan_for(model, on, trainer=trainer, **kw)
    spec = resolve_model(model)
    ctx = EmitContext(spec=spec, model_ref=model_reference(model, spec), command="fitcheck plan (test)")
    text = emitters.get(fmt).emit(plan, ctx)[fmt]
    return plan, (yaml.safe_load(text) if fmt.endswith(".yaml") else {}), text


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


# ------------------------------------------------------------------------------ Gemma 2 attention

#: Off CUDA, and on CUDA before Ampere (no FlashAttention-2), Gemma 2 has only eager attention.
GEMMA2_TARGETS = ["cpu", "apple-m3-max-36gb", "rtx-2080-ti"]
#: 512 tokens: Gemma 2 2B LoRA (7.83 GiB on the device) is close to the 2080 Ti's 10 GiB, where the band's
#: upper edge (engine/band.py, re-derived with the corpus) decides between fits and tight; a tight plan falls
#: back to the best tight configuration (docs/planner.md#tight) and writes it, with its TIGHT header line.
GEMMA2_SEQ = 512


@pytest.mark.parametrize("on", GEMMA2_TARGETS)
def test_gemma2_never_gets_sdpa_in_hf_yaml(on: str) -> None:
    plan, data, text = emit_yaml("hf.yaml", "gemma-2-2b", on, method="lora", seq_len=GEMMA2_SEQ)
    assert data["attn_implementation"] == "eager"
    assert plan.chosen is not None and plan.chosen.setup.attn == "eager"
    chosen = plan.chosen
    expected = judge_bytes(chosen.device_bytes, chosen.high_bytes, chosen.budget_bytes, chosen.paged_bytes)
    assert plan.verdict == expected and (expected == "fits" or on == "rtx-2080-ti")
    assert ("# TIGHT: the estimate fits" in text) == (plan.verdict == "tight")


@pytest.mark.parametrize("on", GEMMA2_TARGETS)
def test_gemma2_never_gets_sdpa_in_llamafactory_yaml(on: str) -> None:
    _, data, _ = emit_yaml("llamafactory.yaml", "gemma-2-2b", on, method="lora", seq_len=GEMMA2_SEQ)
    assert data["flash_attn"] == "disabled"


def test_gemma2_on_ampere_gets_flash_attention() -> None:
    _, data, _ = emit_yaml("hf.yaml", "gemma-2-2b", "rtx-4090", method="lora", seq_len=512)
    assert data["attn_implementation"] == "flash_attention_2"


def test_gemma2_with_sdpa_asked_is_refused() -> None:
    with pytest.raises(OptionError, match="soft-caps its attention"):
        plan_for("gemma-2-2b", "apple-m3-max-36gb", method="lora", attn="sdpa")


def test_gemma3_keeps_sdpa() -> None:
    _, data, _ = emit_yaml("hf.yaml", "gemma-3-1b", "apple-m3-max-36gb", method="lora", seq_len=512)
    assert data["attn_implementation"] == "sdpa"


# ------------------------------------------------------------------------ full fine-tuning in fp16


@pytest.mark.parametrize("on", ["rtx-2080-ti", "apple-m1-16gb"])
def test_full_fp16_hf_loads_fp32_weights_with_amp(on: str) -> None:
    plan, data, text = emit_yaml("hf.yaml", "smollm2-360m", on, method="full", seq_len=512)
    assert data["fp16"] is True and data["bf16"] is False
    assert data["dtype"] == "float32", "GradScaler cannot unscale fp16 gradients"
    assert plan.chosen is not None and plan.chosen.setup.master_weights
    assert plan.estimate is not None and plan.estimate.regime.weight_dtype == "fp32"
    assert "regime hf: fp32 weights, fp16 autocast" in text


def test_full_fp16_memory_is_the_amp_figure() -> None:
    """The plan is sized as fp32 weights + grads + states (16 B/param), not as fp16 weights."""
    plan = plan_for("smollm2-360m", "rtx-2080-ti", method="full", seq_len=512, precision="fp16")
    assert plan.estimate is not None
    mw = {c.name: c.bytes for p in plan.estimate.phases for c in p.components}
    params = plan.estimate.params.trainable
    assert mw["weights"] == pytest.approx(4 * params, rel=0.01)


@pytest.mark.parametrize("on", ["rtx-2080-ti"])
def test_full_fp16_axolotl_trains_in_fp32(on: str) -> None:
    """axolotl loads fp16 weights whenever fp16 is on (resolve_dtype), so a full fine-tune there is fp32."""
    plan, data, _ = emit_yaml("axolotl.yaml", "qwen2.5-0.5b", on, method="full", seq_len=512)
    assert data["fp16"] is False and data["bf16"] is False
    assert plan.chosen is not None and plan.chosen.setup.precision == "fp32"


def test_full_fp16_asked_for_axolotl_is_refused() -> None:
    with pytest.raises(OptionError, match="GradScaler"):
        plan_for("qwen2.5-0.5b", "rtx-2080-ti", method="full", precision="fp16", trainer="axolotl")


# ------------------------------------------------------------------------- LLaMA-Factory template


@pytest.mark.parametrize(
    ("model", "template"),
    [
        ("gemma-2-2b", "gemma2"),
        ("gemma-2-9b", "gemma2"),
        ("gemma-3-1b", "gemma2"),
        ("gemma-3-4b", "gemma3"),
        ("phi-4", "phi4"),
        ("phi-3-mini", "phi"),
        ("smollm2-135m", "smollm2"),
        ("mistral-nemo-12b", "ministral"),
        ("qwen3-0.6b", "qwen3"),
        ("llama-3.2-1b", "llama3"),
    ],
)
def test_llamafactory_template_follows_its_model_registry(model: str, template: str) -> None:
    from fitcheck.emitters.llamafactory import template_for

    spec = resolve_model(model)
    assert template_for(spec.arch, spec.hf_id) == template


# ----------------------------------------------------------------------------------------- mlx-lm


@pytest.mark.parametrize("effective", [16, 24, 12])
def test_mlx_iters_is_a_multiple_of_the_accumulation(effective: int) -> None:
    _, data, _ = emit_yaml(
        "mlx.yaml", "qwen2.5-0.5b", "apple-m3-max-36gb", method="lora", effective_batch=effective
    )
    assert data["grad_accumulation_steps"] > 1
    assert data["iters"] % data["grad_accumulation_steps"] == 0


def test_mlx_full_on_m1_is_not_pure_fp16() -> None:
    plan, _, text = emit_yaml("mlx.yaml", "qwen2.5-0.5b", "apple-m1-16gb", method="full", seq_len=512)
    assert plan.chosen is not None and plan.chosen.setup.precision == "fp32"
    assert "--dtype float32" in text


def test_mlx_full_fp16_asked_is_refused() -> None:
    with pytest.raises(OptionError, match="loss scaling"):
        plan_for("qwen2.5-0.5b", "apple-m1-16gb", method="full", precision="fp16", trainer="mlx")


def test_env_sh_of_an_mlx_plan_reproduces_with_the_mlx_regime(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["plan", "llama-3.2-1b", "--on", "apple-m3-max-36gb", "--emit", "mlx.yaml", "--emit", "env.sh"]
    rc, _, _ = run([*argv, "-o", str(tmp_path / "a")], capsys)
    assert rc == 0
    env = (tmp_path / "a" / "env.sh").read_text()
    mlx = (tmp_path / "a" / "mlx.yaml").read_text()

    def peak(text: str) -> str:
        return next(line for line in text.splitlines() if line.startswith("# estimated peak:"))

    assert peak(env) == peak(mlx) and "regime mlx" in peak(env)
    line = next(x for x in env.splitlines() if x.startswith("# reproduce: "))
    again = shlex.split(line.removeprefix("# reproduce: "))
    rc, _, _ = run([*again[1:], "-o", str(tmp_path / "b")], capsys)
    assert rc == 0
    assert peak((tmp_path / "b" / "env.sh").read_text()) == peak(env)


def test_mlx_yaml_on_nvidia_names_no_trainer_the_user_did_not_give(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, _, err = run(["plan", "llama-3.2-1b", "--on", "rtx-4090", "--emit", "mlx.yaml", "-o", "-"], capsys)
    assert rc == 2
    assert "--trainer" not in err and "mlx.yaml" in err


# ------------------------------------------------------------------------------------------ kohya


def kohya(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[dict, dict, str]:
    rc, _, err = run(["plan", *argv, "--emit", "kohya.toml", "-o", str(tmp_path)], capsys)
    assert rc == 0, err
    text = (tmp_path / "kohya.toml").read_text()
    cfg = tomllib.loads(text)
    flat = {k: v for table in cfg.values() for k, v in table.items()}
    data = tomllib.loads((tmp_path / "dataset.toml").read_text())
    return flat, data, text


@pytest.mark.parametrize("on", ["rtx-2080-ti", "apple-m1-16gb", "v100-32gb"])
def test_kohya_no_bf16_where_the_catalog_says_none(
    on: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flat, _, _ = kohya(["sd15", "--on", on], tmp_path, capsys)
    assert flat["mixed_precision"] == "fp16"
    assert flat["save_precision"] == "fp16"


def test_kohya_bf16_where_the_catalog_has_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flat, _, _ = kohya(["sd15", "--on", "rtx-4090"], tmp_path, capsys)
    assert flat["mixed_precision"] == "bf16"


def test_kohya_conv_targets_reach_network_args(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flat, _, _ = kohya(
        ["sd15", "--on", "rtx-4090", "--lora-targets", "conv", "--lora-rank", "8"], tmp_path, capsys
    )
    args = dict(a.split("=") for a in flat["network_args"])
    assert args["conv_dim"] == "8"
    assert float(args["conv_alpha"]) == pytest.approx(flat["network_alpha"])


def test_kohya_no_bucket_limits_with_bucket_no_upscale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, data, _ = kohya(["sdxl", "--on", "rtx-4090"], tmp_path, capsys)
    for ds in data["datasets"]:
        if ds.get("bucket_no_upscale"):
            assert "min_bucket_reso" not in ds and "max_bucket_reso" not in ds


@pytest.mark.parametrize("model", ["flux.1-dev", "sd35-medium"])
def test_kohya_no_sdpa_in_dit_files(model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flat, _, _ = kohya([model, "--on", "h100-80gb"], tmp_path, capsys)
    assert "sdpa" not in flat and "xformers" not in flat


def test_kohya_to_stdout_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["plan", "sd15", "--on", "rtx-4090", "--emit", "kohya.toml", "-o", "-"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("fitcheck: error:") and "-o DIR" in err and len(err.strip().splitlines()) == 1


def test_kohya_sd15_fine_tune_header_names_the_metadata_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, text = kohya(["sd15", "--on", "a100-80gb", "--method", "full"], tmp_path, capsys)
    head = "\n".join(x for x in text.splitlines() if x.startswith("#"))
    assert "merge_captions_to_metadata.py" in head and "prepare_buckets_latents.py" in head


def test_plan_takes_fp8_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    flat, _, _ = kohya(["flux.1-dev", "--on", "rtx-4090", "--fp8-base"], tmp_path, capsys)
    assert flat["fp8_base"] is True


def test_plan_fp8_base_is_refused_for_an_llm(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["plan", "llama-3.2-1b", "--on", "rtx-4090", "--fp8-base"], capsys)
    assert rc == 2 and "diffusion" in err


def test_emit_help_lists_kohya_toml(capsys: pytest.CaptureFixture[str]) -> None:
    main(["plan", "--help"])
    out = re.sub(r"\s+", " ", capsys.readouterr().out)
    assert "kohya.toml" in out


# ------------------------------------------------------------------------- loss kernel and AdamW step


@pytest.mark.parametrize(
    ("fmt", "loss", "key"),
    [
        ("axolotl.yaml", "liger", "liger_fused_linear_cross_entropy"),
        ("axolotl.yaml", "cce", "cut_cross_entropy"),
        ("llamafactory.yaml", "liger", "enable_liger_kernel"),
    ],
)
def test_a_planned_loss_kernel_is_written(fmt: str, loss: str, key: str) -> None:
    """The file runs the kernel the plan's estimate assumed (without it the trainer's own loss, with
    fp32 logits, would run)."""
    _, data, _ = emit_yaml(fmt, "llama-3.1-8b", "rtx-4090", method="lora", loss=loss)
    assert data[key] is True
    if fmt == "axolotl.yaml":
        assert len(data["plugins"]) == 1 and data["plugins"][0].startswith("axolotl.integrations.")


@pytest.mark.parametrize(("fmt", "loss"), [("llamafactory.yaml", "cce"), ("axolotl.yaml", "plain")])
def test_a_loss_kernel_the_format_cannot_select_is_refused(fmt: str, loss: str) -> None:
    with pytest.raises(OptionError, match=f"cannot select --loss {loss}"):
        emit_yaml(fmt, "llama-3.1-8b", "rtx-4090", method="lora", loss=loss)


@pytest.mark.parametrize("loss", ["liger", "cce", "chunked", "plain"])
def test_hf_yaml_runs_trls_fused_head_only(loss: str) -> None:
    """`trl sft` (TRL 1.16) scores every token through its fused LM head, use_liger_kernel included."""
    with pytest.raises(OptionError, match=f"fused LM head \\(--loss trl\\); it cannot run --loss {loss}"):
        emit_yaml("hf.yaml", "llama-3.1-8b", "rtx-4090", method="lora", loss=loss)
    for ok in ("trl", "standard"):  # TRL's own; the whole logits, more than the head holds
        _, data, _ = emit_yaml("hf.yaml", "llama-3.1-8b", "rtx-4090", method="lora", loss=ok)
        assert "use_liger_kernel" not in data


@pytest.mark.parametrize(("impl", "name"), [("foreach", "adamw_torch"), ("fused", "adamw_torch_fused")])
def test_the_adamw_step_is_written_as_its_optim_name(impl: str, name: str) -> None:
    _, data, _ = emit_yaml("hf.yaml", "qwen2.5-0.5b", "rtx-4090", method="full", optimizer_impl=impl)
    assert data["optim"] == name
