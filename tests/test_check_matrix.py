"""`check` exit codes through the installed console script, and `matrix` against the seeds' table."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fitcheck.cli import main

EXE = Path(sys.executable).parent / "fitcheck"
SCRIPT = str(EXE) if EXE.exists() else shutil.which("fitcheck")


def script(*args: str) -> subprocess.CompletedProcess[str]:
    assert SCRIPT, "the fitcheck console script is not installed (pip install -e .)"
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=120)


def test_check_fits_exit_0() -> None:
    p = script("check", "qwen2.5-0.5b", "--seq-len", "512", "--on", "rtx-4090", "--format", "json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["target"]["verdict"] == "fits"
    assert doc["target"]["budget_bytes"] >= doc["device_bytes"]


def test_check_does_not_fit_exit_1() -> None:
    p = script("check", "llama-3.1-70b", "--method", "full", "--on", "rtx-4090", "--format", "json")
    assert p.returncode == 1
    assert json.loads(p.stdout)["target"]["verdict"] == "does_not_fit"


def test_check_trouble_exit_2() -> None:
    for args in (["check", "7B"], ["check", "7B", "--on", "rtx-9999"], ["check", "7Q", "--on", "24GB"]):
        p = script(*args)
        assert p.returncode == 2, args
        assert p.stdout == "" and "Traceback" not in p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


def _tight_args() -> list[str]:
    """A setup whose device bytes land between the budget and the usable memory of a 24GB target."""
    from fitcheck import api

    spec, target = api.resolve("qwen2.5-0.5b"), api.target("24GB")
    for seq in range(256, 16384, 64):
        est = api.check(spec, target, method="lora", seq_len=seq)
        assert est.target is not None
        if est.target.verdict == "tight":
            return ["check", "qwen2.5-0.5b", "--method", "lora", "--seq-len", str(seq), "--on", "24GB"]
    pytest.fail("no tight setup found")


def test_check_tight_strict(capsys: pytest.CaptureFixture[str]) -> None:
    args = _tight_args()
    assert main(args) == 0
    assert main([*args, "--strict"]) == 1


def test_matrix_thumb_reproduces_seeds_36gb_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["matrix", "--on", "36GB-unified", "--rule", "thumb", "--models", "1.5B,3B,7B,14B,32B",
               "--format", "json"])  # fmt: skip
    rows = {r["model"]: r for r in json.loads(capsys.readouterr().out)}
    assert rc == 0
    gib = 2**30
    assert rows["1.5B"]["usable_bytes"] == 27 * gib
    assert rows["1.5B"]["lora_bytes"] == 6 * gib and rows["1.5B"]["lora_verdict"] == "fits"
    assert rows["7B"]["lora_bytes"] == 17 * gib and rows["7B"]["lora_verdict"] == "fits"
    assert rows["14B"]["lora_bytes"] == 31 * gib and rows["14B"]["lora_verdict"] == "does_not_fit"
    assert (
        22 * gib <= rows["32B"]["qlora_bytes"] <= 26 * gib and rows["32B"]["qlora_verdict"] != "does_not_fit"
    )
    assert rows["1.5B"]["full_bytes"] == 22 * gib and rows["1.5B"]["full_verdict"] != "does_not_fit"
    assert rows["3B"]["full_bytes"] == 40 * gib and rows["3B"]["full_verdict"] == "does_not_fit"


def test_matrix_bad_methods(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["matrix", "--on", "24GB", "--methods", "dpo"]) == 2
    assert "not a method" in capsys.readouterr().err
