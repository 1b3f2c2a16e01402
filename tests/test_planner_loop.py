"""The planner loop (fitcheck.planner.loop) on a fake workload: the search, the fit test, the choice,
the runners-up and the nothing-fits answer, written once for every workload."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fitcheck.api import device_for
from fitcheck.engine.estimate import estimate
from fitcheck.hardware.budget import resolve_target
from fitcheck.models import Estimate, LlmSetup, SetupKind, Target
from fitcheck.planner import loop
from fitcheck.planner.models import Change, EnvVar, LlmCandidate, Plan, PlanRequest, Reason, Throughput
from fitcheck.sources.size import spec_from_size

TARGET = resolve_target("24GB", None)
BUDGET = TARGET.budget_bytes
TINY = spec_from_size("0.5B")


def setup(b: int) -> LlmSetup:
    """A setup named by its micro-batch: the fake cost model reads nothing else."""
    return LlmSetup(batch_size=b, seq_len=128)


class Fake:
    """A workload whose memory and speed are tables keyed by micro-batch."""

    kind: SetupKind = "llm"
    candidate_model = LlmCandidate
    effective_batch = 16

    def __init__(
        self,
        tiers: list[list[list[int]]],
        need: dict[int, int],
        speed: dict[int, float],
        exhaustive: bool = True,
        high: float = 1.0,
        host: dict[int, int] | None = None,
        highs: dict[int, int] | None = None,
    ) -> None:
        self._tiers, self.need, self._speed, self.exhaustive = tiers, need, speed, exhaustive
        self.high, self.host, self.highs = high, host or {}, highs or {}
        self.asked: list[int] = []
        self.estimates_run = 0

    def tiers(self) -> list[list[list[LlmSetup]]]:
        return [[[setup(b) for b in family] for family in tier] for tier in self._tiers]

    def memory(self, s: LlmSetup) -> loop.Memory | None:
        self.asked.append(s.batch_size)
        if s.batch_size not in self.need:
            return None
        self.estimates_run += 1
        n = self.need[s.batch_size]
        high = self.highs.get(s.batch_size, int(n * self.high))
        return loop.Memory(n, high, self.host.get(s.batch_size))

    def speed(self, s: LlmSetup) -> Throughput:
        tps = self._speed[s.batch_size]
        return Throughput(
            flops_per_token=1.0, tokens_per_s=tps, micro_step_s=1.0, step_s=1.0, bound="compute", mfu=0.1
        )

    def rank_key(self, c: LlmCandidate) -> tuple[object, ...]:
        return (-c.throughput.tokens_per_s, c.device_bytes)

    def speed_key(self, c: LlmCandidate) -> tuple[object, ...]:
        return (-c.throughput.tokens_per_s,)

    def goal_key(self, c: LlmCandidate) -> tuple[object, ...]:
        return ()

    def signature(self, c: LlmCandidate) -> tuple[object, ...]:
        return (c.setup.batch_size,)

    def why_not(self, c: LlmCandidate, chosen: LlmCandidate) -> str:
        return f"slower: {c.throughput.tokens_per_s}"

    def reasons(self, chosen: LlmCandidate, ranked: Sequence[LlmCandidate]) -> list[Reason]:
        return [
            Reason(rule="throughput", choice="micro-batch", text=f"b{chosen.setup.batch_size}", source="x")
        ]

    def env(self, chosen: LlmCandidate) -> tuple[EnvVar, ...]:
        return ()

    def changes(self, ranked: Sequence[LlmCandidate]) -> list[Change]:
        least = min(c.device_bytes for c in ranked)
        return [Change(change="a bigger card", flag="--on big", device_bytes=least, budget_bytes=2 * least)]

    def estimate(self, s: LlmSetup) -> Estimate:
        return estimate(TINY, s)

    def notes(self, chosen: LlmCandidate | None) -> tuple[str, ...]:
        return ("a note",)


def make(w: Fake, target: Target = TARGET) -> Plan:
    req = PlanRequest(base=setup(1))
    return loop.make(w, loop.Asked("tiny", "Tiny", target, device_for(target), req))


GIB = 2**30


def test_the_fastest_that_fits_is_chosen_and_explained() -> None:
    w = Fake([[[1], [2], [4]]], {1: GIB, 2: 2 * GIB, 4: 2 * BUDGET}, {1: 10.0, 2: 20.0, 4: 40.0})
    plan = make(w)
    assert plan.fits and plan.chosen is not None and plan.chosen.setup.batch_size == 2
    assert plan.estimate is not None and plan.estimate.setup.batch_size == 2
    assert [r.text for r in plan.reasons] == ["b2"] and plan.notes == ("a note",)
    assert plan.grid_points == 3 and plan.estimates_run == 3 and plan.min_device_bytes == GIB
    assert plan.smallest is None and plan.changes == ()
    # runners-up: the faster one that does not fit (worded by the loop), the slower one that fits
    reasons = {r.candidate.setup.batch_size: r.reason for r in plan.runners_up}
    assert reasons[4].startswith("does not fit: needs") and reasons[1] == "slower: 10.0"


def test_the_plan_fits_the_bands_high_edge_not_the_central_estimate() -> None:
    w = Fake([[[1], [2]]], {1: BUDGET // 2, 2: BUDGET - 1}, {1: 1.0, 2: 2.0}, high=1.3)
    plan = make(w)
    assert plan.chosen is not None and plan.chosen.setup.batch_size == 1
    tight = next(r for r in plan.runners_up if r.candidate.setup.batch_size == 2)
    assert tight.candidate.verdict == "tight" and tight.reason.startswith("tight: needs")


def test_only_tight_falls_back_to_the_tight_one_that_reaches_least() -> None:
    """No band fits: of the setups whose central estimate fits, the one whose likely range reaches least
    is chosen (verdict tight), not the fastest; the family stops at its first tight setup (the larger
    ones reach further), and the faster tight setups are runners-up."""
    need = {1: BUDGET // 2, 2: BUDGET - GIB, 4: BUDGET + 1}
    w = Fake([[[1, 2, 4], [2], [4]]], need, {1: 1.0, 2: 2.0, 4: 4.0}, high=3.0, exhaustive=False)
    plan = make(w)
    assert plan.verdict == "tight" and not plan.fits and plan.chosen is not None
    assert plan.chosen.setup.batch_size == 1 and plan.chosen.verdict == "tight"
    assert w.asked == [1, 2, 4] and plan.estimates_run == 3 and plan.grid_points == 3
    assert plan.smallest is None and plan.reasons[0].rule == "tight-fallback"
    assert [c.flag for c in plan.changes] == ["--on big"]  # the workload's changes, beside a tight choice
    reasons = {r.candidate.setup.batch_size: r.reason for r in plan.runners_up}
    assert reasons[4].startswith("does not fit")
    assert reasons[2].startswith("tight too, likely up to")  # faster, but reaches further


def test_a_fit_beats_a_faster_tight_one_in_a_later_tier() -> None:
    w = Fake([[[4]], [[1]]], {4: BUDGET - 1, 1: GIB}, {4: 4.0, 1: 1.0}, high=1.5, exhaustive=False)
    plan = make(w)
    assert plan.verdict == "fits" and plan.chosen is not None and plan.chosen.setup.batch_size == 1


def test_among_tight_ones_the_lower_band_edge_wins() -> None:
    """b1 ranks first (less central memory), b2 reaches less far: the tight choice is b2, and b1 is
    listed above it with the band edge that decided."""
    need, highs = {1: BUDGET - 2 * GIB, 2: BUDGET - GIB}, {1: BUDGET + 3 * GIB, 2: BUDGET + GIB}
    plan = make(Fake([[[1], [2]]], need, {1: 1.0, 2: 1.0}, highs=highs))
    assert plan.verdict == "tight" and plan.chosen is not None and plan.chosen.setup.batch_size == 2
    (above,) = plan.runners_up
    assert above.candidate.setup.batch_size == 1 and above.reason.startswith("tight too, likely up to")


def test_a_family_stops_at_its_first_setup_that_does_not_fit() -> None:
    w = Fake(
        [[[1, 2, 4, 8]]],
        {1: GIB, 2: 2 * BUDGET, 4: 3 * BUDGET, 8: 4 * BUDGET},
        dict.fromkeys((1, 2, 4, 8), 1.0),
    )
    make(w)
    assert w.asked == [1, 2]


def test_a_refused_setup_ends_its_family_without_a_candidate() -> None:
    w = Fake([[[1, 2, 4], [8]]], {1: GIB, 4: GIB, 8: GIB}, dict.fromkeys((1, 2, 4, 8), 1.0))
    plan = make(w)
    assert w.asked == [1, 2, 8] and plan.grid_points == 2


def test_tiers_stop_at_the_first_that_fits_unless_exhaustive() -> None:
    tiers = [[[1]], [[2]], [[4]]]
    need = {1: 2 * BUDGET, 2: GIB, 4: GIB}
    speed = {1: 1.0, 2: 1.0, 4: 9.0}
    lazy = Fake(tiers, need, speed, exhaustive=False)
    assert make(lazy).chosen.setup.batch_size == 2  # type: ignore[union-attr]
    assert lazy.asked == [1, 2]
    whole = Fake(tiers, need, speed, exhaustive=True)
    assert make(whole).chosen.setup.batch_size == 4  # type: ignore[union-attr]
    assert whole.asked == [1, 2, 4]


def test_host_memory_over_the_node_does_not_fit() -> None:
    target = TARGET.model_copy(update={"host_memory_bytes": 8 * GIB})
    w = Fake([[[1], [2]]], {1: GIB, 2: GIB}, {1: 1.0, 2: 2.0}, host={2: 16 * GIB})
    plan = make(w, target)
    assert plan.chosen is not None and plan.chosen.setup.batch_size == 1
    assert (
        next(r for r in plan.runners_up if r.candidate.setup.batch_size == 2).candidate.verdict
        == "does_not_fit"
    )


def test_nothing_fits_gives_the_least_need_and_the_workloads_changes() -> None:
    w = Fake([[[1], [2]]], {1: 3 * BUDGET, 2: 2 * BUDGET}, {1: 1.0, 2: 2.0})
    plan = make(w)
    assert not plan.fits and plan.chosen is None and plan.estimate is None
    assert plan.reasons == () and plan.runners_up == ()
    assert plan.smallest is not None and plan.smallest.setup.batch_size == 2
    assert plan.min_device_bytes == 2 * BUDGET
    assert [c.flag for c in plan.changes] == ["--on big"]


def test_runners_up_are_five_on_each_side_without_repeats() -> None:
    bs = list(range(1, 21))
    need = {b: (GIB if b <= 10 else 2 * BUDGET) for b in bs}
    w = Fake([[[b] for b in bs]], need, {b: float(b) for b in bs})
    plan = make(w)
    assert plan.chosen is not None and plan.chosen.setup.batch_size == 10
    above = [r.candidate.setup.batch_size for r in plan.runners_up if not r.candidate.fits]
    below = [r.candidate.setup.batch_size for r in plan.runners_up if r.candidate.fits]
    assert above == [15, 14, 13, 12, 11] and below == [9, 8, 7, 6, 5]


def test_an_empty_search_space_is_an_error() -> None:
    with pytest.raises(ValueError, match="empty"):
        make(Fake([[[1]]], {}, {1: 1.0}))
