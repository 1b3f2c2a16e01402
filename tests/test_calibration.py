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


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_engine_within_3_percent_of_trace(rec: dict[str, Any]) -> None:
    spec = ModelSpec(
        id=rec["id"], name=rec["id"], source_kind="hf_config", arch=arch_from_hf_config(rec["hf_config"])
    )
    est = estimate(spec, LlmSetup(**rec["setup"]))
    measured = rec["measured"]["peak_allocated_bytes"]
    error = (est.peak_allocated_bytes - measured) / measured
    assert abs(error) <= TOLERANCE, f"{rec['id']} ({rec['split']}): {error:+.2%}"
