"""The published diffusion measurements (tests/data/published/diffusion/, scored by
bench/published_diffusion.py): every record without a known gap within 10% of fitcheck's device figure and
at or below its likely range's high edge, inside it but for the named ones (`BELOW_LOW`); docs/diffusion.md's
section regenerated, never edited."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

import published_diffusion as pub

RECORDS = pub.records()


def test_corpus_shape() -> None:
    assert len(RECORDS) >= 10
    for path in sorted(pub.DATA.glob("*.yaml")):
        import yaml

        source = yaml.safe_load(path.read_text(encoding="utf-8"))["source"]
        assert source["url"] and source["commit"] and source["date"] and source["how_measured"]


@pytest.fixture(scope="module")
def scores() -> list[pub.Score]:
    return [pub.score(r) for r in RECORDS]


def test_records_without_a_gap_within_10_percent(scores: list[pub.Score]) -> None:
    bad = {s.record.id: round(s.error, 3) for s in scores if not s.record.known_gap and abs(s.error) > 0.10}
    assert not bad, bad


def test_records_without_a_gap_at_or_below_their_high_edge(scores: list[pub.Score]) -> None:
    """The promise the verdict relies on: no record without a known gap above its band's high edge."""
    out = [s.record.id for s in scores if not s.record.known_gap and s.record.measured_bytes > s.high_bytes]
    assert not out, out


#: Records without a known gap below their band's low edge (over-estimates the low edge does not reach;
#: docs/methodology.md, "The band"): session 19's band (-12%) left ShivamShrirao's fp16-b1-ga2-ckpt-8bit
#: run (6.0% over) 0.05 GB below it; session 20's (-18%) holds it. None today.
BELOW_LOW: dict[str, str] = {}


def test_records_without_a_gap_inside_their_band(scores: list[pub.Score]) -> None:
    out = {
        s.record.id
        for s in scores
        if not s.record.known_gap and not s.low_bytes <= s.record.measured_bytes <= s.high_bytes
    }
    assert out == set(BELOW_LOW), out


def test_docs_section_is_generated(scores: list[pub.Score]) -> None:
    assert pub.section(scores) in pub.DOC.read_text(encoding="utf-8"), (
        "docs/diffusion.md is stale: PYTHONPATH=src python bench/published_diffusion.py --write"
    )


def test_band_rows_are_the_scores(scores: list[pub.Score]) -> None:
    """The rows the band is derived from (bench/published.py ``band_rows`` takes them beside the LLM
    records) are the scored records: the same figure and measurement, the same gap, and the estimate's
    kinds summing to the figure compared (the reserve and context out where the source read allocated)."""
    rows = {r.key: r for r in pub.band_rows(scores)}
    assert len(rows) == len(scores)
    for s in scores:
        row = rows[f"{s.record.source}/{s.record.id}"]
        assert row.estimate == s.device_bytes and row.measured == round(s.record.measured_bytes)
        assert row.known_gap == bool(s.record.known_gap)
        assert sum(row.kinds.values()) == row.estimate, s.record.id
