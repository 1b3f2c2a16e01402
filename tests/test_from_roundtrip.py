"""Round trip: ``plan --emit X`` then ``estimate MODEL --from X`` gives the plan's estimate, for every
emitter whose file carries a full setup (TRL/HF, axolotl, LLaMA-Factory, mlx-lm, kohya)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli import main

LMF = "llamafactory-all"
CASES = [
    ("hf.yaml", "llama-3.1-8b", "rtx-4090", []),
    ("hf.yaml", "llama-3.1-8b", "rtx-4090", ["--method", "qlora"]),
    ("hf.yaml", "qwen2.5-0.5b", "rtx-4090", ["--method", "full", "--master-weights"]),
    ("hf.yaml", "qwen2.5-0.5b", "rtx-4090", ["--method", "full", "--optimizer-impl", "foreach"]),
    ("hf.yaml", "llama-3.1-8b", "rtx-4090", ["--loss", "trl"]),
    ("axolotl.yaml", "llama-3.1-8b", "rtx-4090", ["--loss", "cce"]),
    ("axolotl.yaml", "llama-3.1-8b", "rtx-4090", ["--loss", "liger", "--optimizer-impl", "foreach"]),
    ("llamafactory.yaml", "llama-3.1-8b", "rtx-4090", ["--loss", "liger"]),
    ("axolotl.yaml", "llama-3.1-8b", "rtx-4090", ["--method", "qlora"]),
    ("axolotl.yaml", "smollm2-360m", "rtx-3060-12gb", ["--method", "full"]),
    ("llamafactory.yaml", "llama-3.1-8b", "rtx-4090", []),
    ("llamafactory.yaml", "llama-3.1-8b", "rtx-4090", ["--method", "qlora", "--no-double-quant"]),
    ("hf.yaml", "llama-3.1-8b", "rtx-4090", ["--compile"]),
    ("axolotl.yaml", "llama-3.1-8b", "rtx-4090", ["--method", "qlora", "--compile"]),
    ("llamafactory.yaml", "llama-3.1-8b", "rtx-4090", ["--compile"]),
    ("mlx.yaml", "qwen2.5-7b", "apple-m3-max-36gb", []),
    ("mlx.yaml", "qwen2.5-7b", "apple-m3-max-36gb", ["--method", "qlora"]),
    # MoE: peft's all-linear is written as the string axolotl hands to peft, axolotl's own switch as itself
    # (all-linear on the experts: on an H200 since session 20, whose reserve counts the loss's blocks the
    # experts' adapter gradients regrow; tight on an H100 80GB, 77.0 GiB likely up to 80.4 of 79.2)
    ("axolotl.yaml", "qwen3-30b-a3b", "h200", ["--method", "qlora"]),
    ("axolotl.yaml", "qwen3-30b-a3b", "h100-80gb", ["--method", "qlora", "--lora-targets", "linear-modules"]),
    # LLaMA-Factory's lora_target all on MoE is its own rule: written as all, read back as llamafactory-all
    ("llamafactory.yaml", "qwen3-30b-a3b", "h100-80gb", ["--method", "qlora", "--lora-targets", LMF]),
    ("kohya.toml", "sdxl", "rtx-4090", []),
    ("kohya.toml", "sd15", "rtx-3060-12gb", ["--method", "full"]),
]


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    rc = main(args)
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out), err


#: Trainers whose unset AdamW step is the fused one (engine/regimes.py), which their files name.
FUSED_BY_DEFAULT = ("hf", "axolotl", "llamafactory")


def _same_setup(planned: dict[str, Any], read: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Fields that differ, once alpha is compared as a value (None means 2 x rank), the
    double-quantization flag only where QLoRA quantizes the base, and an unset AdamW step as the
    trainer's own (a file names it: ``optim: adamw_torch_fused``). The axolotl emitter writes
    ``all-linear`` on a dense model as ``lora_target_linear: true``, which reads back as axolotl's
    ``linear-modules``: the same modules there (the caller's device_bytes equality holds it); the
    LLaMA-Factory emitter writes it as ``lora_target: all``, read back as ``llamafactory-all``."""
    out = {}
    for key, want in planned.items():
        got = read[key]
        if key == "optimizer_impl" and want is None and planned["optimizer"] == "adamw":
            want = "fused" if planned["trainer"] in FUSED_BY_DEFAULT else None
        if key == "lora_alpha":
            want = want if want is not None else 2.0 * planned["lora_rank"]
            got = got if got is not None else 2.0 * read["lora_rank"]
        if key == "double_quant" and planned["method"] != "qlora":
            continue
        if key == "lora_targets" and (want, got) in (
            ("all-linear", "linear-modules"),
            ("all-linear", "llamafactory-all"),
        ):
            continue
        if want != got:
            out[key] = (want, got)
    return out


@pytest.mark.parametrize(("emit", "model", "on", "extra"), CASES)
def test_plan_emit_then_estimate_from_gives_the_plan(
    emit: str, model: str, on: str, extra: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, _ = _json(
        ["plan", model, "--on", on, *extra, "--emit", emit, "-o", str(tmp_path), "--format", "json"], capsys
    )
    assert plan["fits"], "the case must plan something to write"
    planned_setup, planned_bytes = plan["chosen"]["setup"], plan["chosen"]["device_bytes"]  # one shape
    est, err = _json(
        ["estimate", model, "--from", str(tmp_path / emit), "--on", on, "--format", "json"], capsys
    )
    if emit == "hf.yaml":  # planned as `trl sft` runs it: TRL's fused LM head
        assert planned_setup["loss"] == est["setup"]["loss"] == "trl"
    assert _same_setup(planned_setup, est["setup"]) == {}
    assert est["device_bytes"] == planned_bytes
    assert est["setup_origin"]["method"] == "file" and "from " in err


def test_round_trip_without_model_uses_the_files_base_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The hf.yaml names meta-llama/Llama-3.1-8B, a preset's hf_id: no MODEL, no network."""
    fmt = ["--on", "rtx-4090", "--format", "json"]
    plan, _ = _json(["plan", "llama-3.1-8b", *fmt, "--emit", "hf.yaml", "-o", str(tmp_path)], capsys)
    est, err = _json(["estimate", "--from", str(tmp_path / "hf.yaml"), *fmt], capsys)
    assert est["model"] == "llama-3.1-8b" and "overrides" not in err
    # the plan sized what the file's trl sft holds: TRL's fused LM head (--loss trl), byte for byte
    assert est["setup"]["loss"] == plan["chosen"]["setup"]["loss"] == "trl"
    assert est["device_bytes"] == plan["chosen"]["device_bytes"]


@pytest.mark.parametrize(
    ("targets", "line"),
    [("all-linear", 'lora_target_modules: "all-linear"'), ("linear-modules", "lora_target_linear: true")],
)
def test_axolotl_file_keeps_peft_all_linear_apart_on_moe(
    targets: str, line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "qwen3-30b-a3b", "--method", "qlora", "--lora-targets", targets, "--on", "h100-80gb"]
    _json([*args, "--emit", "axolotl.yaml", "-o", str(tmp_path), "--format", "json"], capsys)
    text = (tmp_path / "axolotl.yaml").read_text()
    assert any(row.startswith(line) for row in text.splitlines()), text


def test_llamafactory_file_refuses_peft_all_linear_on_moe(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """LLaMA-Factory hands lora_target to peft as a list: peft's all-linear (experts, router) cannot be
    written, and lora_target all would size another run."""
    args = ["plan", "qwen3-30b-a3b", "--method", "qlora", "--lora-targets", "all-linear", "--on", "h100-80gb"]
    rc = main([*args, "--emit", "llamafactory.yaml", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "LLaMA-Factory cannot target" in err and "llamafactory-all" in err, err
    assert not (tmp_path / "llamafactory.yaml").exists()


def test_llamafactory_unset_lora_target_is_its_own_all(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """lora_target defaults to all (finetuning_args.py @ff6d4d12): LLaMA-Factory's rule, not peft's."""
    path = tmp_path / "lmf.yaml"
    path.write_text("stage: sft\ndo_train: true\nfinetuning_type: lora\ncutoff_len: 1024\n")
    est, _ = _json(
        ["estimate", "mixtral-8x7b", "--from", str(path), "--on", "h100-80gb", "--format", "json"], capsys
    )
    assert est["setup"]["lora_targets"] == LMF


def test_hf_yaml_runs_trls_own_loss_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`trl sft` scores every token through TRL 1.16's fused LM head (use_liger_kernel included): a plan for
    Liger's kernel cannot be written as hf.yaml."""
    args = ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--loss", "liger"]
    rc = main([*args, "--emit", "hf.yaml", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "fused LM head (--loss trl)" in err, err
    assert not (tmp_path / "hf.yaml").exists()


@pytest.mark.parametrize(
    ("loss", "said"), [([], False), (["--loss", "trl"], False), (["--loss", "standard"], True)]
)
def test_a_plan_written_as_hf_yaml_says_what_trl_sft_holds(
    loss: list[str], said: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --loss a plan for hf.yaml sizes what its trl sft holds (TRL's fused LM head); asked for the
    whole logits (--loss standard), it sizes more than the file holds: said on stderr."""
    assert (
        main(["plan", "qwen2.5-0.5b", "--on", "rtx-4090", *loss, "--emit", "hf.yaml", "-o", str(tmp_path)])
        == 0
    )
    assert ("hf.yaml runs TRL's fused LM head" in capsys.readouterr().err) is said
