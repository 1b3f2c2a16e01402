"""bench/reserve_evidence.py: the evidence table covers the corpus and reads the figures right."""

from __future__ import annotations

from functools import cache
from types import ModuleType
from typing import Any

import pytest

from bench_helpers import bench_module


def _bench() -> ModuleType:
    return bench_module("reserve_evidence")


@cache
def _rows() -> list[Any]:
    return _bench().rows()  # type: ignore[no-any-return]


def test_rows_cover_every_reserved_record() -> None:
    pub = _bench().pub
    scored, _ = pub.score_all()
    want = {s.record.key for ss in scored.values() for s in ss if s.record.metric == "max_memory_reserved"}
    assert {r.key for r in _rows()} == want
    assert len(want) > 50


def test_implied_reserve_is_measured_less_allocated() -> None:
    rasbt = next(r for r in _rows() if r.key == "rasbt-llm-training-speed/step7-flash-attn")
    assert rasbt.implied == rasbt.measured - rasbt.allocated
    assert rasbt.exact == "yes" and not rasbt.autocast and rasbt.streams == "one GPU"
    # the run's implied reserve is below the line fitcheck draws (why rasbt is over)
    assert 0 < rasbt.implied < rasbt.reserve


def test_sharded_records_are_grouped_apart() -> None:
    groups = {r.key: r.group for r in _rows()}
    assert groups["answerai-fsdp-qlora/llama-2-7b-lora-s512-2x3090"].startswith("sharded")
    assert groups["rasbt-llm-training-speed/ddp-4gpu-batch32"].startswith("ddp")


@pytest.mark.parametrize(
    ("run", "ratio"),
    [("SmolLM2-360M", 7304 / 4909), ("512 tokens", 10.24 / 8.28), ("2048 tokens", 10.22 / 9.16)],
)
def test_pairs_ratio_as_printed(run: str, ratio: float) -> None:
    pair = next(p for p in _bench().PAIRS if run in p.run)
    assert pair.ratio == pytest.approx(ratio)
    assert pair.reserved > pair.allocated


def test_tables_render() -> None:
    b = _bench()
    groups = b.render_groups(_rows())
    assert groups[0].startswith("| group |") and len(groups) > 3
    assert len(b.render_rows(_rows())) == len(_rows()) + 2
    assert len(b.render_pairs()) == len(b.PAIRS) + 2


def test_step_events_orders_allocations_and_frees() -> None:
    from types import SimpleNamespace as R

    log = [
        R(alloc_seq=1, free_seq=None, nbytes=10),
        R(alloc_seq=2, free_seq=4, nbytes=20),
        R(alloc_seq=3, free_seq=5, nbytes=30),
    ]
    assert _bench().step_events(log) == [
        ("a", 1, 10),
        ("a", 2, 20),
        ("a", 3, 30),
        ("f", 2, 20),
        ("f", 3, 30),
    ]
