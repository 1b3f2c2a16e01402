"""FSDP2 records traced with PyTorch's FSDPMemTracker (tests/data/calibration/fsdp): the engine within 5%
per GPU on every record (world sizes 2-8, full and LoRA), and one record re-traced here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.measure.fsdp_compare import compare
from fitcheck.models import LlmSetup

RECORDS = Path(__file__).parent / "data" / "calibration" / "fsdp" / "records.yaml"
TOLERANCE = 0.05


def records() -> list[dict[str, Any]]:
    return list(yaml.safe_load(RECORDS.read_text())["records"])


def test_the_records_cover_the_issue() -> None:
    recs = records()
    assert len(recs) >= 12
    assert {r["world_size"] for r in recs} >= {2, 4, 8}
    assert {r["setup"]["method"] for r in recs} == {"full", "lora"}
    for r in recs:
        assert r["command"].startswith("PYTHONPATH=src python bench/calibrate_fsdp.py")
        assert set(r["versions"]) == {"torch", "transformers", "peft"}


@pytest.mark.parametrize("rec", records(), ids=lambda r: r["id"])
def test_engine_within_5_percent_per_gpu(rec: dict[str, Any]) -> None:
    est, traced = compare(rec)
    assert abs(est / traced - 1) <= TOLERANCE, f"{rec['id']}: engine {est} vs traced {traced}"


@pytest.mark.slow
def test_one_record_retraces_to_its_figure() -> None:
    pytest.importorskip("torch")
    from fitcheck.measure.fsdp_trace import trace_fsdp

    rec = next(r for r in records() if r["id"] == "fsdp-02")
    t = trace_fsdp(rec["hf_config"], LlmSetup(**rec["setup"]), rec["world_size"])
    assert t.peak_bytes == rec["traced_peak_bytes"]
