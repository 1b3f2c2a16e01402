"""Hostile inputs, fifth red-team pass (session 8): one test per class of failure the fourth pass left, each
failing before its fix.

- ``COLUMNS=0`` printed nothing at all with exit 0 (``check``: exit 1 and no word), and below 80 columns
  table cells were cut to "…" (the breakdown's GiB column at 40) (`fitcheck.render.MIN_COLUMNS`);
- ``--fsdp-version 1`` without an FSDP strategy (one GPU, ddp, ZeRO, a diffusion model) and
  ``--quant-storage`` without QLoRA on one GPU were dropped without a word (`fitcheck.engine.estimate._check`,
  `fitcheck.api.LLM_ONLY`);
- ``--attn flash`` on Apple silicon or a CPU, or with ``--precision fp32``, was sized as if FlashAttention-2
  ran there (``xformers`` on Apple silicon was already refused) (`fitcheck.engine.estimate._check_flash`);
- ``--on 2x4090`` with another script's digits (``２x4090``) counted two GPUs while ``٢٤GB`` was "not a
  usable size", and ``--on AUTO`` (read as ``auto``) lost the "no GPU detected" warning
  (`fitcheck.hardware.budget`, `fitcheck.api.estimate`).
"""

from __future__ import annotations

import pytest

from fitcheck.hardware.env import ProbeEnv
from hw_replay import env_from_fixture
from test_fuzz_cli import hold_contract, invoke

# --- narrow terminals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("columns", ["0", "1", "40", "79"])
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "7B", "--on", "rtx-4090"],
        ["check", "7B", "--on", "rtx-4090"],
        ["matrix", "--on", "rtx-4090", "--models", "7B"],
        ["estimate", "7B", "--on", "2x4090", "--strategy", "zero3"],
    ],
    ids=["estimate", "check", "matrix", "zero3"],
)
def test_a_narrow_terminal_still_shows_every_figure(
    columns: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    _, wide, _ = invoke(argv)
    monkeypatch.setenv("COLUMNS", columns)
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert "…" not in out, out
    assert "GiB" in out and "fit" in out, out
    for figure in ("26.86", "26.9") if argv[0] != "matrix" else ("26.86",):
        assert (figure in wide) == (figure in out), figure


# --- options that were dropped without a word --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["estimate", "7B", "--fsdp-version", "1"], "--fsdp-version applies to an FSDP strategy"),
        (["estimate", "7B", "--gpus", "2", "--strategy", "zero2", "--fsdp-version", "1"], "not zero2"),
        (["estimate", "7B", "--gpus", "2", "--fsdp-version", "1"], "--fsdp-version applies"),
        (["check", "7B", "--on", "rtx-4090", "--fsdp-version", "1"], "--fsdp-version applies"),
        (["plan", "7B", "--on", "rtx-4090", "--fsdp-version", "1"], "--fsdp-version applies"),
        (["estimate", "sdxl", "--fsdp-version", "1"], "--fsdp-version applies to LLMs"),
        (["estimate", "7B", "--quant-storage", "fp16"], "--quant-storage applies to --method qlora"),
        (["estimate", "7B", "--method", "full", "--quant-storage", "bf16"], "--quant-storage applies"),
    ],
)
def test_an_option_the_run_cannot_use_is_refused(argv: list[str], words: str) -> None:
    if "--on" not in argv:
        argv = [*argv, "--on", "none"]
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "2", "--strategy", "fsdp", "--fsdp-version", "1"],
        ["--gpus", "2", "--strategy", "fsdp-no-shard", "--fsdp-version", "1"],
        ["--method", "qlora", "--quant-storage", "fp16"],
        ["--method", "qlora", "--gpus", "2", "--strategy", "fsdp", "--quant-storage", "bf16"],
    ],
)
def test_the_same_options_still_apply_where_they_mean_something(argv: list[str]) -> None:
    rc, _, err = invoke(["estimate", "7B", "--on", "none", *argv])
    assert rc == 0, err


# --- kernels that cannot run where they are asked to ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--attn", "flash", "--on", "apple-m3-max-36gb"], "not mps"),
        (["--attn", "flash", "--on", "36GB-unified"], "not mps"),
        (["--attn", "flash", "--on", "cpu"], "not cpu"),
        (["--attn", "flash", "--trainer", "mlx", "--on", "apple-m3-max-36gb"], "not mps"),
        (["--attn", "flash", "--precision", "fp32", "--on", "rtx-4090"], "fp16 or bf16 only"),
        (["--attn", "flash", "--precision", "fp32", "--on", "none"], "fp16 or bf16 only"),
    ],
)
@pytest.mark.parametrize("command", ["estimate", "check"])
def test_flash_attention_where_it_cannot_run_is_refused(command: str, argv: list[str], words: str) -> None:
    args = [command, "7B", *argv]
    rc, out, err = invoke(args)
    if command == "check" and "none" in argv:
        assert rc == 2 and "--on" in err, err
        return
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and "--attn flash" in err and words in err, err


@pytest.mark.parametrize(
    "argv", [["--on", "rtx-4090"], ["--precision", "fp16", "--on", "none"], ["--on", "mi300x"]]
)
def test_flash_attention_on_a_gpu_in_16_bits_still_estimates(argv: list[str]) -> None:
    rc, _, err = invoke(["estimate", "7B", "--attn", "flash", *argv])
    assert rc == 0, err


# --- targets --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("on", ["２xrtx-4090", "٢xrtx-4090", "٢٤GB", "２４GB", "١٠٢٥", "2x٢٤GB"])
def test_a_target_with_digits_of_another_script_is_refused(on: str) -> None:
    args = ["estimate", "7B", "--on", on]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and "unknown hardware" in err, err


@pytest.mark.parametrize("on", ["auto", "AUTO", " Auto "])
def test_auto_in_any_case_keeps_the_no_gpu_warning(on: str, monkeypatch: pytest.MonkeyPatch) -> None:
    machine = env_from_fixture("container_cgroup")
    monkeypatch.setattr(ProbeEnv, "real", classmethod(lambda cls, use_torch=False: machine))
    rc, _, err = invoke(["estimate", "7B", "--on", on])
    assert rc == 0 and "no GPU detected" in err, err
