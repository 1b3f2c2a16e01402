"""Published multi-GPU measurements (tests/data/published/multigpu_*.yaml) against the engine, per GPU.

The bar (issue 14): per source, the median error within 15%, and no record more than 25% under its
measured figure.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model

FILES = sorted((Path(__file__).parent / "data" / "published").glob("multigpu_*.yaml"))
UNITS = {"B": 1, "MB": 10**6, "GB": 10**9, "MiB": 2**20, "GiB": 2**30}
#: Setup keys of the records that are LlmSetup fields (the rest describe the run only).
SETUP_KEYS = set(LlmSetup.model_fields)


def records(path: Path) -> list[dict[str, Any]]:
    doc = yaml.safe_load(path.read_text())
    defaults = dict(doc.get("defaults", {}))
    out = []
    for rec in doc["records"]:
        merged = {**defaults, **rec}
        merged["setup"] = {
            **{k: v for k, v in defaults.items() if k in SETUP_KEYS},
            **rec.get("setup", {}),
        }
        out.append(merged)
    return out


def error(rec: dict[str, Any]) -> float:
    """(engine - measured) / measured, per GPU."""
    setup = LlmSetup(**{k: v for k, v in rec["setup"].items() if k in SETUP_KEYS})
    est = estimate(resolve_model(rec["model"]), setup)
    measured = rec["measured"]["value"] * UNITS[rec["measured"]["unit"]]
    return est.device_bytes / measured - 1


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_source_median_within_15_percent_none_25_under(path: Path) -> None:
    doc = yaml.safe_load(path.read_text())
    assert doc["source"]["id"] == path.stem and doc["source"]["url"].startswith("https://")
    errs = {r["id"]: error(r) for r in records(path)}
    assert abs(statistics.median(errs.values())) <= 0.15, errs
    assert min(errs.values()) >= -0.25, errs


def test_there_are_multigpu_sources() -> None:
    assert FILES
