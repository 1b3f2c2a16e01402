"""The engine against every traced record of the calibration grid: within 3%, no skips.

Records (tests/data/calibration/*.yaml) were produced by `bench/calibrate.py` with the tracer
(`fitcheck.measure.trace`): the command, tool versions and device semantics are in each record. About a
third are marked ``split: holdout``: no rule was fitted on them; the tolerance is the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config

DATA = Path(__file__).parent / "data" / "calibration"
TOLERANCE = 0.03


def _records() -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for path in sorted(DATA.glob("*.yaml")):
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        out.extend(data["records"] if isinstance(data, dict) else data)
    return out


RECORDS = _records()


def test_grid_shape() -> None:
    families = {r["hf_config"]["model_type"] for r in RECORDS}
    assert len(RECORDS) >= 60
    assert len(families) >= 4
    assert {r["split"] for r in RECORDS} == {"fit", "holdout"}
    assert {r["setup"].get("trainer", "generic") for r in RECORDS} >= {"generic", "hf", "torchtune"}
    for r in RECORDS:
        assert r["command"] and r["measured"]["tool_versions"]


def _estimate(rec: dict[str, Any]) -> Any:
    spec = ModelSpec(
        id=rec["id"], name=rec["id"], source_kind="hf_config", arch=arch_from_hf_config(rec["hf_config"])
    )
    return estimate(spec, LlmSetup(**rec["setup"]))


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_engine_within_3_percent_of_trace(rec: dict[str, Any]) -> None:
    """The peak and every phase (forward, backward, optimizer step), not only the peak."""
    est = _estimate(rec)
    measured = rec["measured"]["peak_allocated_bytes"]
    error = (est.peak_allocated_bytes - measured) / measured
    assert abs(error) <= TOLERANCE, f"{rec['id']} ({rec['split']}): peak {error:+.2%}"
    phases = rec["measured"]["phases"]
    assert [p["name"] for p in phases] == ["forward", "backward", "optimizer_step"]
    for phase in phases:
        ours = est.phase(phase["name"]).total_bytes
        error = (ours - phase["peak_bytes"]) / phase["peak_bytes"]
        assert abs(error) <= TOLERANCE, f"{rec['id']} ({rec['split']}): {phase['name']} {error:+.2%}"


@pytest.mark.parametrize("optimizer", ["adafactor", "lion"])
def test_optimizer_step_of_a_full_fine_tune_matches_a_trace(optimizer: str) -> None:
    """Adafactor (four fp32 copies of the largest tensor) and Lion (lion-pytorch's two) step temporaries."""
    full = [r for r in RECORDS if r["setup"]["method"] == "full" and r["setup"].get("optimizer") == optimizer]
    assert full, f"no full fine-tune record traces {optimizer}"
    for rec in full:
        measured = next(p for p in rec["measured"]["phases"] if p["name"] == "optimizer_step")
        temporaries = measured["breakdown"]["optimizer_temporaries"]
        assert temporaries > 0.15 * measured["peak_bytes"], "the step temporaries must weigh in this record"
        ours = _estimate(rec).phase("optimizer_step")
        assert abs(ours.total_bytes / measured["peak_bytes"] - 1) <= TOLERANCE, rec["id"]
        transient = next(c.bytes for c in ours.components if c.name == "optimizer_transient")
        assert abs(transient / temporaries - 1) <= TOLERANCE, rec["id"]
