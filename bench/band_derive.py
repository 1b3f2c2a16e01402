"""The band's published fractions from scored records: the rule, held-out evidence and its stability.

Pure arithmetic on `Row`s (a record's measured figure, the estimate it was compared with and the bytes
of each band kind inside that estimate), so leaving a source out re-derives in milliseconds from the
estimates bench/published.py made once. docs/methodology.md ("The band") argues the rule; docs/accuracy.md
("The band", generated) shows its evidence.

The rule (`derive`), for each edge (up: the measurement above the estimate; down: below) separately:

0. ``fixed``, an absolute term in bytes added once per estimate (per process, per GPU), from the records
   where a fraction can explain least: no 4-bit bytes and transient bytes at most ``FIXED_SHARE`` of the
   estimate; the smallest multiple of ``FIXED_STEP`` that covers ``COVERAGE`` of their excess;
1. ``transient`` from the records whose estimate holds no 4-bit bytes: the smallest fraction, in 1%
   steps, that covers ``COVERAGE`` of them with the fixed term taken off;
2. ``quantized`` from the 4-bit records whose 4-bit bytes are more than ``QUANTIZED_SHARE`` of the
   estimate, with the fixed term and the transient fraction taken off: the smallest fraction, in 1%
   steps, that covers ``COVERAGE`` of them (zero when the earlier terms already do, or when there are none);

The one-fraction rules (`derive_one_fraction`, `derive_one_fraction_by_record`; fewer kinds, argued in
session 19 when the 4-bit fraction came to rest on one source) give the transient and the 4-bit bytes one
fraction, the smallest covering ``COVERAGE`` of the records that hold either.

``states`` is fixed beforehand (the traced calibration grid). Coverage is weighted by source: each
record weighs 1/n, n its source's records in that step, so every source is one voice however many rows
it printed. `derive_joint` is the rule it replaced (both kinds fitted together over every record),
kept to compare the two on the same evidence.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

#: The promise: the share of held-out records (a source's records against the band derived without that
#: source) the band's high edge must lie at or above; also the first level the rules are fitted at.
COVERAGE = 0.9
#: The in-sample levels a rule may be fitted at (each edge the smallest fraction beyond this share of its
#: records), tried in this order: `choose` takes the first at which a candidate keeps COVERAGE held out.
#: A band fitted at exactly 90% of the records it saw covers fewer of the records it did not see (a
#: source's own habits are not in the others'), so the level is set by the held-out evidence, as a
#: conformal bound inflates its quantile, not fixed beforehand (docs/methodology.md, "The band").
FIT_COVERAGES: tuple[float, ...] = (0.9, 0.925, 0.95, 0.975)
#: The largest move of either band edge, over every scored record, relative to its estimate, that
#: leaving any one source out may cause (docs/methodology.md, "The band": half the 10% median bar a source
#: is held to and below the corpus' median |error|, so which sources happen to be in the corpus moves a
#: verdict less than a source may miss by).
STABILITY_BOUND = 0.05
#: The fixed term's step: 0.25 GiB (docs/methodology.md, "The band").
FIXED_STEP = 2**28
#: The records the fixed term is read from: transient bytes at most this share of the estimate, so that a
#: fraction of them explains least of what the estimate misses (docs/methodology.md, "The band").
FIXED_SHARE = 0.2
#: The records the 4-bit fraction is read from: 4-bit bytes more than this share of the estimate, so that
#: a run's other misses are not charged to a few 4-bit bytes (docs/methodology.md, "The band").
QUANTIZED_SHARE = 0.1
KINDS = ("states", "quantized", "transient")
SIDES = ("down", "up")

Spread = dict[str, tuple[float, float]]


@dataclass(frozen=True)
class Row:
    """A scored record as the band sees it: bytes of each kind inside the estimate it was compared with."""

    source: str
    key: str
    known_gap: bool
    measured: int
    estimate: int
    kinds: Mapping[str, int]

    def excess(self, side: str, states: float) -> float:
        """Bytes the measurement lies beyond the estimate on ``side``, past the states' own spread."""
        out = self.measured - self.estimate if side == "up" else self.estimate - self.measured
        return out - states * self.kinds["states"]


Rule = Callable[[Sequence[Row], float], Spread]


def _ceil_pct(x: float) -> float:
    """Rounded up to 1%, never below zero."""
    return max(0.0, math.ceil(x * 100 - 1e-9) / 100)


def weighted_quantile(values: Sequence[float], weights: Sequence[float], share: float) -> float:
    """The smallest of ``values`` at or below which ``share`` of the weight lies."""
    if not values:
        raise ValueError("no records to derive this edge from (none without 4-bit bytes, or none with)")
    total = sum(weights)
    acc = 0.0
    for v, w in sorted(zip(values, weights, strict=True)):
        acc += w
        if acc >= share * total - 1e-9:
            return v
    return max(values)


def source_weights(rows: Sequence[Row]) -> list[float]:
    """1/n for each row, n the rows of its source."""
    n = Counter(r.source for r in rows)
    return [1 / n[r.source] for r in rows]


def record_weights(rows: Sequence[Row]) -> list[float]:
    """1 for each row (every record one vote)."""
    return [1.0] * len(rows)


Weigh = Callable[[Sequence[Row]], list[float]]


def _fixed_edge(
    rows: Sequence[Row], side: str, states: float, weigh: Weigh, cover: float = COVERAGE
) -> float:
    """The fixed term of one edge, in bytes: from the rows without 4-bit bytes whose transient bytes are
    at most FIXED_SHARE of the estimate, the smallest multiple of FIXED_STEP covering ``cover`` of them
    (zero when there are none, or when they need none)."""
    few = [r for r in rows if not r.kinds["quantized"] and r.kinds["transient"] <= FIXED_SHARE * r.estimate]
    if not few:
        return 0.0
    need = weighted_quantile([r.excess(side, states) for r in few], weigh(few), cover)
    return float(max(0, math.ceil(need / FIXED_STEP - 1e-9)) * FIXED_STEP)


def _sequential_edge(
    rows: Sequence[Row], side: str, states: float, weigh: Weigh, fixed: bool = True, cover: float = COVERAGE
) -> tuple[float, float, float]:
    """(transient, quantized, fixed) of one edge: the fixed term (when ``fixed``), then transient from
    rows without 4-bit bytes, then quantized from the rows whose 4-bit bytes are more than
    QUANTIZED_SHARE of the estimate, each with the earlier ones taken off (transient from the rows that
    hold transient bytes)."""
    # a row whose estimate holds no transient bytes (a ZeRO-3 run peaking in its optimizer step) says
    # nothing about the transient fraction: it is left to the fixed term
    plain = [r for r in rows if not r.kinds["quantized"] and r.kinds["transient"]]
    fourbit = [r for r in rows if r.kinds["quantized"] > QUANTIZED_SHARE * r.estimate]
    ff = _fixed_edge(rows, side, states, weigh, cover) if fixed else 0.0
    need_t = [(r.excess(side, states) - ff) / r.kinds["transient"] for r in plain]
    ft = _ceil_pct(weighted_quantile(need_t, weigh(plain), cover))
    need_q = [
        (r.excess(side, states) - ff - ft * r.kinds["transient"]) / r.kinds["quantized"] for r in fourbit
    ]
    fq = _ceil_pct(weighted_quantile(need_q, weigh(fourbit), cover)) if fourbit else 0.0
    return ft, fq, ff


def _spread(down: tuple[float, ...], up: tuple[float, ...], states: float) -> Spread:
    """The tables of `fitcheck.engine.band` (SPREAD's fractions, and ``fixed``: FIXED's bytes) from each
    edge's (transient, quantized, fixed)."""
    return {
        "states": (states, states),
        "quantized": (round(down[1], 3), round(up[1], 3)),
        "transient": (round(down[0], 3), round(up[0], 3)),
        "fixed": (down[2], up[2]),
    }


def derive(rows: Sequence[Row], states: float, cover: float = COVERAGE) -> Spread:
    """(down, up) per kind: the sequential, source-weighted rule over the rows without a known gap."""
    clean = [r for r in rows if not r.known_gap]
    return _spread(
        *(_sequential_edge(clean, side, states, source_weights, cover=cover) for side in SIDES), states
    )


def derive_by_record(rows: Sequence[Row], states: float, cover: float = COVERAGE) -> Spread:
    """The same rule (fixed bytes, then the fractions) with every record one vote (shown beside `derive`
    in the docs)."""
    clean = [r for r in rows if not r.known_gap]
    return _spread(
        *(_sequential_edge(clean, side, states, record_weights, cover=cover) for side in SIDES), states
    )


def derive_fractions_only(rows: Sequence[Row], states: float, cover: float = COVERAGE) -> Spread:
    """The sequential, source-weighted rule without the fixed term (the rule before this one)."""
    clean = [r for r in rows if not r.known_gap]
    return _spread(
        *(_sequential_edge(clean, side, states, source_weights, False, cover) for side in SIDES), states
    )


def _joint_edge(
    rows: Sequence[Row], side: str, states: float, cover: float = COVERAGE
) -> tuple[float, float, float]:
    """The narrowest (transient, quantized) pair (by mean added bytes relative to each estimate) that
    covers ``cover`` of the rows, counted per record: the transient in 1% steps, for each the smallest
    quantized fraction reaching the coverage."""
    need = math.ceil(cover * len(rows) - 1e-9)
    best: tuple[float, tuple[float, float]] | None = None
    for ti in range(301):
        ft = ti / 100
        left = [r.excess(side, states) - ft * r.kinds["transient"] for r in rows]
        short = need - sum(1 for x in left if x <= 0)
        want = sorted(
            x / r.kinds["quantized"]
            for x, r in zip(left, rows, strict=True)
            if x > 0 and r.kinds["quantized"]
        )
        if short > len(want):
            continue
        fq = 0.0 if short <= 0 else _ceil_pct(want[short - 1])
        width = sum(
            (states * r.kinds["states"] + ft * r.kinds["transient"] + fq * r.kinds["quantized"]) / r.estimate
            for r in rows
        )
        if best is None or width < best[0]:
            best = (width, (ft, fq))
        if short <= 0:
            break  # the transient alone covers: a larger one only widens the band
    if best is None:
        raise ValueError("no band up to 300% covers the records")
    return (*best[1], 0.0)


def derive_joint(rows: Sequence[Row], states: float, cover: float = COVERAGE) -> Spread:
    """(down, up) per kind: the former rule, both kinds fitted together, every record one vote."""
    clean = [r for r in rows if not r.known_gap]
    return _spread(*(_joint_edge(clean, side, states, cover) for side in SIDES), states)


def _one_fraction_edge(
    rows: Sequence[Row], side: str, states: float, weigh: Weigh, cover: float = COVERAGE
) -> tuple[float, float, float]:
    """(f, f, 0) of one edge: one fraction for the transient and the 4-bit bytes together, the smallest
    (1% steps) covering ``cover`` of the rows that hold either (a ZeRO-3 run peaking with neither says
    nothing about it)."""
    held = [r for r in rows if r.kinds["transient"] + r.kinds["quantized"]]
    need = [r.excess(side, states) / (r.kinds["transient"] + r.kinds["quantized"]) for r in held]
    f = _ceil_pct(weighted_quantile(need, weigh(held), cover))
    return f, f, 0.0


def derive_one_fraction(rows: Sequence[Row], states: float, cover: float = COVERAGE) -> Spread:
    """Fewer kinds: one fraction for the transient and the 4-bit bytes, each source one voice (session
    19, when the 4-bit fraction came to rest on one source: docs/methodology.md, "The band")."""
    clean = [r for r in rows if not r.known_gap]
    return _spread(
        *(_one_fraction_edge(clean, side, states, source_weights, cover) for side in SIDES), states
    )


def derive_one_fraction_by_record(rows: Sequence[Row], states: float, cover: float = COVERAGE) -> Spread:
    """The one-fraction rule with every record one vote."""
    clean = [r for r in rows if not r.known_gap]
    return _spread(
        *(_one_fraction_edge(clean, side, states, record_weights, cover) for side in SIDES), states
    )


def edges(row: Row, spread: Spread) -> tuple[float, float]:
    """(low, high) of the band around the row's estimate (the fixed term, when the spread has one, once)."""
    fixed = spread.get("fixed", (0.0, 0.0))
    down = sum(row.kinds[k] * spread[k][0] for k in KINDS) + fixed[0]
    up = sum(row.kinds[k] * spread[k][1] for k in KINDS) + fixed[1]
    return row.estimate - down, row.estimate + up


@dataclass(frozen=True)
class HeldOut:
    """One source's records against the band derived without it, and against the full-corpus band.

    ``n``: its records without a known gap; ``inside`` / ``above`` of those, inside the band / measured
    above its high edge, with the held-out band; ``*_full`` the same with the full-corpus band;
    ``gaps`` its known-gap records and ``gaps_above`` / ``gaps_above_full`` those above the high edge."""

    n: int
    inside: int
    above: int
    inside_full: int
    above_full: int
    gaps: int
    gaps_above: int
    gaps_above_full: int


def _counts(rows: Sequence[Row], spread: Spread) -> tuple[int, int]:
    """(inside the band, above its high edge)."""
    inside = above = 0
    for r in rows:
        lo, hi = edges(r, spread)
        inside += lo <= r.measured <= hi
        above += r.measured > hi
    return inside, above


@dataclass(frozen=True)
class LeaveOneOut:
    """A rule's band from every record (``full``) and from all but each source's (``without``)."""

    rows: Sequence[Row]
    full: Spread
    without: dict[str, Spread]


def leave_one_out(rows: Sequence[Row], states: float, rule: Rule = derive) -> LeaveOneOut:
    """The rule applied to the whole corpus and to the corpus without each source in turn."""
    sids = sorted({r.source for r in rows})
    return LeaveOneOut(
        rows=rows,
        full=rule(rows, states),
        without={sid: rule([r for r in rows if r.source != sid], states) for sid in sids},
    )


def held_out(loo: LeaveOneOut) -> dict[str, HeldOut]:
    """Each source's records against the band derived from the others, and against the full band."""
    out = {}
    for sid, band in loo.without.items():
        mine = [r for r in loo.rows if r.source == sid and not r.known_gap]
        gaps = [r for r in loo.rows if r.source == sid and r.known_gap]
        inside, above = _counts(mine, band)
        inside_full, above_full = _counts(mine, loo.full)
        out[sid] = HeldOut(
            n=len(mine),
            inside=inside,
            above=above,
            inside_full=inside_full,
            above_full=above_full,
            gaps=len(gaps),
            gaps_above=_counts(gaps, band)[1],
            gaps_above_full=_counts(gaps, loo.full)[1],
        )
    return out


@dataclass(frozen=True)
class Move:
    """The largest move of one band edge, relative to the estimate, when one source is left out."""

    share: float
    left_out: str
    record: str


def stability(loo: LeaveOneOut) -> dict[str, Move]:
    """Per edge (``low``, ``high``): its largest move relative to the estimate, over every scored record
    (known-gap ones too), when one source is left out of the derivation."""
    worst = {"low": Move(0.0, "", ""), "high": Move(0.0, "", "")}
    for sid, band in loo.without.items():
        for r in loo.rows:
            for side, now, full in zip(("low", "high"), edges(r, band), edges(r, loo.full), strict=True):
                share = abs(now - full) / r.estimate
                if share > worst[side].share:
                    worst[side] = Move(share, sid, r.key)
    return worst


def held_out_misses(rows: Sequence[Row], states: float, rule: Rule) -> int:
    """Records (no known gap) measured above the high edge of the band the rule derives without their
    source: the held-out count the coverage promise (COVERAGE) is checked on."""
    return sum(h.above for h in held_out(leave_one_out(rows, states, rule)).values())


def mean_high(rows: Sequence[Row], spread: Spread) -> float:
    """The mean distance of the high edge above the estimate, relative to it, over the records without a
    known gap (how wide the band makes a user's answer)."""
    clean = [r for r in rows if not r.known_gap]
    return sum((edges(r, spread)[1] - r.estimate) / r.estimate for r in clean) / max(1, len(clean))


class FitRule(Protocol):
    """A candidate rule: the band's spread from rows and the states' fraction, fitted at ``cover``."""

    def __call__(self, rows: Sequence[Row], states: float, cover: float = ...) -> Spread: ...


#: The candidate rules, each named as the docs name it (docs/methodology.md, "The band"): the band holds
#: the one `choose` picks on the corpus of the day, at the fit level it picks.
CANDIDATES: tuple[tuple[str, FitRule], ...] = (
    ("fixed bytes, then sequential, each source one voice", derive),
    ("sequential fractions only, each source one voice", derive_fractions_only),
    ("fixed bytes, then sequential, each record one vote", derive_by_record),
    ("joint, each record one vote", derive_joint),
    ("one fraction for transient and 4-bit bytes, each source one voice", derive_one_fraction),
    ("one fraction for transient and 4-bit bytes, each record one vote", derive_one_fraction_by_record),
)


def at(rule: FitRule, cover: float) -> Rule:
    """The rule fitted at ``cover`` (each edge beyond that share of its records)."""
    return functools.partial(rule, cover=cover)


@dataclass(frozen=True)
class Choice:
    """The rule the held-out evidence picks: its name, the level it is fitted at, and the fitted rule."""

    name: str
    cover: float
    rule: Rule
    misses: int
    #: every candidate at every level, as the choice saw them (`assess`)
    trials: Mapping[tuple[float, str], Trial]


@dataclass(frozen=True)
class Trial:
    """One candidate at one fit level: its held-out misses, whether it is stable (`stability` within
    STABILITY_BOUND on both edges), its width (`mean_high` of its whole-corpus band) and its largest edge
    move (`stability`, the larger edge's share)."""

    misses: int
    width: float
    move: float

    @property
    def steady(self) -> bool:
        """Leaving any one source out moves neither edge by more than STABILITY_BOUND."""
        return self.move <= STABILITY_BOUND


def assess(rows: Sequence[Row], states: float) -> dict[tuple[float, str], Trial]:
    """Every candidate at every fit level, each derived once per source left out."""
    out = {}
    for cover in FIT_COVERAGES:
        for name, rule in CANDIDATES:
            loo = leave_one_out(rows, states, at(rule, cover))
            misses = sum(h.above for h in held_out(loo).values())
            move = max(m.share for m in stability(loo).values())
            out[(cover, name)] = Trial(misses, mean_high(rows, loo.full), move)
    return out


def choose(
    rows: Sequence[Row], states: float, trials: Mapping[tuple[float, str], Trial] | None = None
) -> Choice:
    """The candidate rule, and the in-sample level it is fitted at, that keep the promise held out and
    are stable.

    For each level of FIT_COVERAGES in turn (lowest first: the narrowest band that can keep it), each
    candidate's band is derived without each source and that source's records counted above its high
    edge; a candidate is eligible when those misses are at most ``1 - COVERAGE`` of the records in the
    derivation and leaving any one source out moves neither edge of any record by more than
    STABILITY_BOUND of its estimate (no source decides the band). At the first level with an eligible
    candidate, the eligible one with the fewest misses is chosen (the narrowest, `mean_high` of its
    whole-corpus band, among equals, then the earlier in CANDIDATES). If no level has one, the promise is
    kept before the stability: among the candidates, at any level, that keep the promise, the one whose
    largest edge move is smallest (fewer misses, then narrower, among equals), reported with its move
    (docs/methodology.md, "The band"); if none keeps it, the fewest misses over every level (narrowest
    among equals). Chosen again whenever the corpus changes, so the
    rule and its level are the evidence's, not a session's. ``trials``: `assess` of these rows, when made
    already."""
    allowed = (1 - COVERAGE) * sum(1 for r in rows if not r.known_gap) + 1e-9
    table = assess(rows, states) if trials is None else trials
    order = {name: i for i, (name, _) in enumerate(CANDIDATES)}

    def key(k: tuple[float, str]) -> tuple[int, float, float, int]:
        return (table[k].misses, table[k].width, k[0], order[k[1]])

    for cover in FIT_COVERAGES:
        ok = [k for k in table if k[0] == cover and table[k].misses <= allowed and table[k].steady]
        if ok:
            best = min(ok, key=key)
            break
    else:
        kept = [k for k in table if table[k].misses <= allowed]
        best = min(kept, key=lambda k: (table[k].move, *key(k))) if kept else min(table, key=key)
    cover, name = best
    return Choice(name, cover, at(dict(CANDIDATES)[name], cover), table[best].misses, table)
