"""The band's derivation rule (bench/band_derive.py) on synthetic records: coverage, minimality, the
order of the three steps (fixed bytes, transient, quantized), and each source weighing as one voice."""

from __future__ import annotations

import math
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench_helpers import bench_module


def _bd() -> ModuleType:
    return bench_module("published").bd  # type: ignore[no-any-return]


bd = _bd()
STATES = 0.025
#: Synthetic byte counts are drawn in this unit so that a record's excess spans several FIXED_STEPs.
UNIT = 2**14


def _row(
    source: str, i: int, states: int, transient: int, quantized: int, err: float, gap: bool = False
) -> Any:
    est = states + transient + quantized
    kinds = {"states": states, "transient": transient, "quantized": quantized, "figure": est}
    return bd.Row(source, f"{source}/{i}", gap, round(est * (1 + err)), est, kinds)


_rows = st.lists(
    st.tuples(
        st.sampled_from("abcde"),
        st.integers(1, 10**6),
        st.integers(1, 10**6),
        st.one_of(st.just(0), st.integers(1, 10**6)),
        st.floats(-0.4, 0.4),
    ),
    min_size=2,
    max_size=40,
).filter(lambda xs: any(x[3] == 0 for x in xs) and any(x[3] for x in xs))


def _make(xs: list[tuple[str, int, int, int, float]]) -> list[Any]:
    return [_row(s, i, a * UNIT, b * UNIT, c * UNIT, e) for i, (s, a, b, c, e) in enumerate(xs)]


def _weighted_cover(rows: list[Any], covered: list[bool]) -> float:
    w = bd.source_weights(rows)
    return sum(x for x, c in zip(w, covered, strict=True) if c) / sum(w)


def test_weighted_quantile_equal_weights_is_the_order_statistic() -> None:
    vals = [5.0, 1.0, 3.0, 2.0, 4.0, 9.0, 7.0, 8.0, 6.0, 10.0]
    assert bd.weighted_quantile(vals, [1.0] * 10, 0.9) == 9.0
    assert bd.weighted_quantile(vals, [1.0] * 10, 0.95) == 10.0
    assert bd.weighted_quantile(vals, [1.0] * 10, 0.1) == 1.0


@given(st.lists(st.floats(-5, 5), min_size=1, max_size=30), st.floats(0.05, 1.0))
def test_weighted_quantile_is_the_smallest_value_reaching_the_share(vals: list[float], share: float) -> None:
    q = bd.weighted_quantile(vals, [1.0] * len(vals), share)
    assert q in vals
    assert sum(1 for v in vals if v <= q) >= share * len(vals) - 1e-9
    below = [v for v in vals if v < q]
    assert len(below) < share * len(vals) - 1e-9


@settings(max_examples=60, deadline=None)
@given(_rows)
def test_each_edge_covers_the_weighted_share_and_no_less_would(
    xs: list[tuple[str, int, int, int, float]],
) -> None:
    rows = _make(xs)
    sp = bd.derive(rows, STATES)
    plain = [r for r in rows if not r.kinds["quantized"]]
    fourbit = [r for r in rows if r.kinds["quantized"] > bd.QUANTIZED_SHARE * r.estimate]
    few = [r for r in plain if r.kinds["transient"] <= bd.FIXED_SHARE * r.estimate]
    for i, side in enumerate(("down", "up")):
        ft, fq, ff = sp["transient"][i], sp["quantized"][i], sp["fixed"][i]
        assert ff % bd.FIXED_STEP == 0 and ff >= 0
        if few:  # the fixed term covers the share of the records it is read from; one step less would not
            assert _weighted_cover(few, [r.excess(side, STATES) <= ff for r in few]) >= bd.COVERAGE - 1e-9
            if ff > 0:
                less = [r.excess(side, STATES) <= ff - bd.FIXED_STEP for r in few]
                assert _weighted_cover(few, less) < bd.COVERAGE - 1e-9
        else:
            assert ff == 0
        cover_t = [r.excess(side, STATES) <= ff + ft * r.kinds["transient"] + 1e-6 for r in plain]
        assert _weighted_cover(plain, cover_t) >= bd.COVERAGE - 1e-9
        cover_q = [
            r.excess(side, STATES) <= ff + ft * r.kinds["transient"] + fq * r.kinds["quantized"] + 1e-6
            for r in fourbit
        ]
        assert not fourbit or _weighted_cover(fourbit, cover_q) >= bd.COVERAGE - 1e-9
        assert fourbit or fq == 0
        if ft > 0:  # one percent less would not cover
            less = [r.excess(side, STATES) <= ff + (ft - 0.01) * r.kinds["transient"] for r in plain]
            assert _weighted_cover(plain, less) < bd.COVERAGE - 1e-9


@settings(max_examples=60, deadline=None)
@given(_rows, st.sampled_from(["source", "record"]))
def test_one_fraction_covers_the_share_of_both_kinds_and_no_less_would(
    xs: list[tuple[str, int, int, int, float]], vote: str
) -> None:
    """Fewer kinds (session 19): the transient and the 4-bit bytes share one fraction, the smallest in 1%
    steps whose edge lies beyond the fit level's share of the records (by source or by record)."""
    rows = _make(xs)
    rule = bd.derive_one_fraction if vote == "source" else bd.derive_one_fraction_by_record
    sp = rule(rows, STATES)
    weights = bd.source_weights(rows) if vote == "source" else bd.record_weights(rows)

    def cover(f: float, side: str) -> float:
        held = [r.kinds["transient"] + r.kinds["quantized"] for r in rows]
        hit = [r.excess(side, STATES) <= f * h + 1e-6 for r, h in zip(rows, held, strict=True)]
        return sum(w for w, h in zip(weights, hit, strict=True) if h) / sum(weights)

    for i, side in enumerate(("down", "up")):
        f = sp["transient"][i]
        assert sp["quantized"][i] == f and sp["fixed"][i] == 0
        assert cover(f, side) >= bd.COVERAGE - 1e-9
        if f > 0:
            assert cover(f - 0.01, side) < bd.COVERAGE - 1e-9


def test_a_constant_shortfall_goes_to_the_fixed_term_not_the_fraction() -> None:
    """Sources whose runs all measured the estimate plus the same 1 GiB, at short and long sequences: the
    fixed term takes the 1 GiB and the transient fraction needs nothing beyond it; without the fixed term
    the fraction would have to be 1 GiB over the shortest run's transient bytes (and widen every long one)."""
    gib = 2**30
    rows = [
        bd.Row(
            s,
            f"{s}/{t}",
            False,
            8 * gib + t * gib // 4 + gib,
            8 * gib + t * gib // 4,
            {"states": 8 * gib, "transient": t * gib // 4, "quantized": 0, "figure": 8 * gib + t * gib // 4},
        )
        for s in "abc"
        for t in (1, 2, 4, 16, 32)
    ]
    rows += [_row(s, 99, 8 * gib, gib, gib, 0.0) for s in "abc"]  # one 4-bit record each
    sp = bd.derive(rows, STATES)
    assert sp["fixed"][1] == gib
    assert sp["transient"][1] == 0.0
    assert bd.derive_fractions_only(rows, STATES)["transient"][1] > 1.0


@settings(max_examples=40, deadline=None)
@given(_rows, st.floats(-0.4, 0.4))
def test_four_bit_records_do_not_move_the_transient_fraction(
    xs: list[tuple[str, int, int, int, float]], err: float
) -> None:
    rows = _make(xs)
    moved = [
        bd.Row(r.source, r.key, r.known_gap, round(r.estimate * (1 + err)), r.estimate, r.kinds)
        if r.kinds["quantized"]
        else r
        for r in rows
    ]
    assert bd.derive(rows, STATES)["transient"] == bd.derive(moved, STATES)["transient"]


@settings(max_examples=40, deadline=None)
@given(_rows, st.integers(2, 6))
def test_a_source_printing_more_rows_gets_no_more_say(
    xs: list[tuple[str, int, int, int, float]], k: int
) -> None:
    """Repeating every row of one source k times leaves the band as it was (each source one voice);
    counting records instead, it may move."""
    rows = _make(xs)
    src = rows[0].source
    repeated = rows + [r for r in rows if r.source == src] * (k - 1)
    assert bd.derive(repeated, STATES) == bd.derive(rows, STATES)


def test_a_few_four_bit_bytes_are_not_charged_with_a_runs_other_misses() -> None:
    """A 4-bit record whose 4-bit bytes are a sliver of its estimate (QUANTIZED_SHARE or less) and that
    measured far above it does not set the 4-bit fraction: its miss is not the 4-bit bytes'."""
    rows = [_row(s, i, 100 * UNIT, 100 * UNIT, 0, 0.01) for s in "abc" for i in range(3)]
    rows += [_row(s, 9, 100 * UNIT, 100 * UNIT, 100 * UNIT, 0.02) for s in "abc"]
    sliver = [_row(s, 8, 100 * UNIT, 100 * UNIT, 5 * UNIT, 0.5) for s in "abc"]
    assert bd.derive(rows + sliver, STATES)["quantized"] == bd.derive(rows, STATES)["quantized"]


def test_known_gap_records_are_not_fitted() -> None:
    rows = [_row("a", i, 100, 100, 50 * (i % 2), 0.01 * i) for i in range(10)]
    gap = [_row("b", 99, 100, 100, 0, 3.0, gap=True), _row("b", 98, 100, 100, 50, 3.0, gap=True)]
    assert bd.derive(rows + gap, STATES) == bd.derive(rows, STATES)


def test_held_out_counts_and_stability_on_a_small_corpus() -> None:
    """Two sources that agree, one that runs 30% over its estimate: held out, the third one's records are
    above the band the other two give; with it in, the band covers them."""
    rows = [_row(s, i, 100, 100, 0, e) for s, e in (("a", 0.02), ("b", 0.03), ("c", 0.30)) for i in range(4)]
    rows += [_row(s, 9, 100, 100, 100, 0.0) for s in "abc"]  # one 4-bit record each, on its estimate
    loo = bd.leave_one_out(rows, STATES)
    ho = bd.held_out(loo)
    assert ho["c"].n == 5 and ho["c"].above == 4
    assert ho["a"].above == 0 and ho["a"].above_full == 0
    mv = bd.stability(loo)
    assert mv["high"].left_out == "c"
    # without c the transient up edge is 4% (b's 3% + states 2.5% of 100 over 100 transient -> 3.5%)
    assert math.isclose(loo.without["c"]["transient"][1], 0.04)
    assert loo.full["fixed"] == (0.0, 0.0)  # transient is half of every estimate: no record to read it from


def _spread_corpus(shift: float) -> list[Any]:
    """Five sources, each with plain and 4-bit rows; source "e" sits ``shift`` above the others."""
    out = []
    for j, src in enumerate("abcde"):
        for i in range(8):
            err = ((i * 7 + j * 3) % 11 - 5) / 50 + (shift if src == "e" else 0.0)
            out.append(_row(src, i, 100 * UNIT, (200 + 37 * i) * UNIT, (0 if i % 2 else 150) * UNIT, err))
    return out


@pytest.mark.parametrize("shift", [0.0, 0.15, 0.6])
def test_choose_takes_the_lowest_level_that_keeps_the_held_out_promise(shift: float) -> None:
    """`choose`: a candidate is eligible when its held-out misses are within the promise (1 - COVERAGE of
    the records) and leaving any source out moves neither edge by more than STABILITY_BOUND; at the level it
    picks, its rule has the fewest misses among the eligible, and no lower level had an eligible one; when no
    level has one, it keeps the promise and moves least among those that keep it (no level and candidate
    misses fewer when none keeps it)."""
    rows = _spread_corpus(shift)
    c = bd.choose(rows, STATES)
    allowed = (1 - bd.COVERAGE) * len(rows) + 1e-9
    table = {}
    for cov in bd.FIT_COVERAGES:
        for n, r in bd.CANDIDATES:
            loo = bd.leave_one_out(rows, STATES, bd.at(r, cov))
            move = max(m.share for m in bd.stability(loo).values())
            misses = bd.held_out_misses(rows, STATES, bd.at(r, cov))
            table[(cov, n)] = (misses, move <= bd.STABILITY_BOUND, move)
    assert {k: (v.misses, v.steady, v.move) for k, v in c.trials.items()} == table
    ok = {k: m for k, (m, steady, _) in table.items() if m <= allowed and steady}
    kept = {k: mv for k, (m, _, mv) in table.items() if m <= allowed}
    if ok:
        assert all(cov >= c.cover for cov, _ in ok)
        assert c.misses == ok[(c.cover, c.name)] == min(m for (cov, _), m in ok.items() if cov == c.cover)
    elif kept:
        assert kept[(c.cover, c.name)] == min(kept.values())
    else:
        assert c.misses == min(m for m, _, _ in table.values())


def test_an_unstable_rule_is_not_chosen() -> None:
    """A rule that keeps the promise with the fewest misses but that one source moves by more than
    STABILITY_BOUND is passed over for a stable one at the same level, and a level with no stable rule
    within the promise for a higher one."""
    rows = _spread_corpus(0.0)  # 40 records: the promise allows 4 held-out misses
    names = [n for n, _ in bd.CANDIDATES]
    trials = {(cov, n): bd.Trial(9, 0.1, 0.0) for cov in bd.FIT_COVERAGES for n in names}
    trials[(0.9, names[0])] = bd.Trial(1, 0.1, 0.5)  # fewest misses, unstable
    trials[(0.9, names[1])] = bd.Trial(3, 0.2, 0.0)  # eligible
    c = bd.choose(rows, STATES, trials)
    assert (c.cover, c.name, c.misses) == (0.9, names[1], 3)
    trials[(0.9, names[1])] = bd.Trial(3, 0.2, 0.5)  # no stable rule within the promise at 90%
    trials[(0.95, names[2])] = bd.Trial(4, 0.3, 0.0)
    c = bd.choose(rows, STATES, trials)
    assert (c.cover, c.name) == (0.95, names[2])


def test_without_a_stable_rule_the_promise_comes_first() -> None:
    """No candidate at any level both keeps the promise and is stable: the one that keeps the promise and
    moves least is chosen, not the one with the fewest misses (which a wide, unstable fit at the highest
    level would win); with none keeping the promise, the fewest misses."""
    rows = _spread_corpus(0.0)  # 40 records: the promise allows 4 held-out misses
    names = [n for n, _ in bd.CANDIDATES]
    trials = {(cov, n): bd.Trial(9, 0.1, 0.5) for cov in bd.FIT_COVERAGES for n in names}
    trials[(0.975, names[0])] = bd.Trial(0, 0.6, 0.4)  # fewest misses, wide, moves most of these
    trials[(0.9, names[1])] = bd.Trial(4, 0.1, 0.08)  # within the promise, moves 8%
    trials[(0.95, names[2])] = bd.Trial(3, 0.2, 0.06)  # within the promise, moves least
    c = bd.choose(rows, STATES, trials)
    assert (c.cover, c.name, c.misses) == (0.95, names[2], 3)
    for k in ((0.9, names[1]), (0.95, names[2])):
        trials[k] = bd.Trial(6, 0.1, 0.01)  # none within the promise now
    trials[(0.975, names[0])] = bd.Trial(5, 0.6, 0.4)
    c = bd.choose(rows, STATES, trials)
    assert (c.cover, c.name, c.misses) == (0.975, names[0], 5)


def test_a_source_far_above_the_others_raises_the_fit_level() -> None:
    """A source the others do not foresee breaks the 90% fit held out; `choose` answers with a higher
    level (a wider band), never by dropping the promise while a level keeps it."""
    calm, odd = bd.choose(_spread_corpus(0.0), STATES), bd.choose(_spread_corpus(0.15), STATES)
    assert calm.cover == bd.FIT_COVERAGES[0] < odd.cover
