"""MeasuredStep, the comparison table and the measure command's contract, without torch."""

from __future__ import annotations

import builtins
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.errors import MissingExtraError
from fitcheck.measure.compare import comparison_rows, measure_text
from fitcheck.measure.result import MeasuredStep, PhasePeak
from fitcheck.models import LlmSetup

CALIBRATION = Path(__file__).parent / "data" / "calibration"


def measured(**over: Any) -> MeasuredStep:
    phases = (
        PhasePeak(
            name="forward", peak_bytes=100, start_bytes=10, end_bytes=50, breakdown={"activations": 100}
        ),
        PhasePeak(name="backward", peak_bytes=120, start_bytes=50, end_bytes=30),
        PhasePeak(name="optimizer_step", peak_bytes=60, start_bytes=30, end_bytes=20),
    )
    data: dict[str, Any] = {
        "mode": "trace",
        "device": "fake",
        "device_semantics": "test",
        "model_type": "llama",
        "setup": LlmSetup(),
        "regime": "generic",
        "steps": 2,
        "measured_step": 2,
        "phases": phases,
        "peak_phase": "backward",
        "peak_allocated_bytes": 120,
        "param_bytes": 10,
        "trainable_params": 1,
        "total_params": 5,
        "tool_versions": {"torch": "x"},
        "wall_seconds": 0.1,
    }
    data.update(over)
    return MeasuredStep(**data)


def test_peak_must_be_largest_phase() -> None:
    assert measured().peak_allocated_bytes == 120
    with pytest.raises(ValueError, match="largest phase"):
        measured(peak_allocated_bytes=100, peak_phase="forward")


def test_breakdown_must_sum_to_peak() -> None:
    with pytest.raises(ValueError, match="breakdown"):
        PhasePeak(name="forward", peak_bytes=10, start_bytes=0, end_bytes=0, breakdown={"activations": 9})


def test_comparison_without_estimate() -> None:
    rows = comparison_rows(None, measured())
    assert rows[-1]["phase"] == "peak" and rows[-1]["measured_bytes"] == 120
    assert all(r["error_pct"] is None for r in rows)
    assert "peak (backward)" in measure_text("tiny", None, measured())


def test_measure_needs_the_torch_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from fitcheck.commands import measure as cmd

    real_import = builtins.__import__

    def no_torch(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.split(".")[0] in ("torch", "transformers", "peft"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    with pytest.raises(MissingExtraError, match=r"pip install torch==2\.13\.0"):
        cmd.require_torch()


def test_cli_import_stays_light() -> None:
    """Registering `measure` must not import torch, transformers or peft."""
    code = (
        "import sys, fitcheck.cli; heavy = {'torch', 'transformers', 'peft'}; "
        "print(sorted(heavy & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(CALIBRATION.glob("*.yaml")):
        out.extend(yaml.safe_load(path.read_text())["records"])
    return out


@pytest.mark.skipif(not any(CALIBRATION.glob("*.yaml")), reason="no LLM calibration records")
def test_calibration_records_are_consistent() -> None:
    """Every record parses as a MeasuredStep, carries its config and command, and the split is set."""
    records = _records()
    assert len(records) >= 60
    archs = {r["hf_config"]["model_type"] for r in records}
    assert len(archs) >= 4
    splits = [r["split"] for r in records]
    assert set(splits) == {"fit", "holdout"}
    assert 0.2 < splits.count("holdout") / len(splits) < 0.45
    for r in records:
        m = MeasuredStep(**r["measured"])
        assert m.setup == LlmSetup(**r["setup"])
        assert "bench/calibrate.py" in r["command"]
