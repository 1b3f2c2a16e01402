"""The planner loop, written once for every workload: search space -> cost model -> fit -> choice.

A workload (`fitcheck.planner.llm` for decoders, `fitcheck.diffusion.plan` for UNets and DiTs)
supplies a small protocol, `Workload`:

* a **search space**: candidate setups in preference order, as tiers of families. The loop stops
  after the first tier in which something fits, unless the workload is ``exhaustive`` (the LLM grid
  is one tier, searched whole for its runners-up and its least need); a family is ordered by
  growing memory, so the loop stops a family at its first setup that does not fit;
* a **cost model**: ``memory(setup)`` (the workload's own estimator: the closed form for decoders,
  the op-level simulator for diffusion) and ``speed(setup)`` (a throughput over the one device
  model, `fitcheck.planner.models.DevicePerf`, with the sourced utilisation per backend);
* a **ranking** (``rank_key``, best first) and the words: reasons, why a runner-up lost, the
  changes that would make something fit.

The loop owns what is the same for every workload: the fit test (the band's high edge against the
budget, and the host memory of a node), the choice (the best-ranked candidate that fits), the
tight fallback (when no candidate's band fits, the best-ranked one whose central estimate fits,
verdict ``tight``, as `check` would judge it), the runners-up (ranked just above and just below the
choice), the "nothing fits" answer (the least-memory candidate), the workload's changes that would make
a likely range fit (when nothing fits, and beside a tight choice) and the `Plan` itself. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar, cast

from fitcheck.engine.verdict import high_bytes, judge_bytes, paged_bytes
from fitcheck.models import DiffusionSetup, Estimate, LlmSetup, SetupKind, Target, VerdictName
from fitcheck.planner.models import (
    Candidate,
    Change,
    DevicePerf,
    DiffusionRequest,
    EnvVar,
    ImageThroughput,
    Plan,
    PlanRequest,
    Reason,
    RunnerUp,
    Throughput,
)
from fitcheck.planner.rules import reason_for
from fitcheck.units import GIB

S = TypeVar("S", LlmSetup, DiffusionSetup)
T = TypeVar("T", Throughput, ImageThroughput)

#: Runners-up listed on each side of the chosen plan.
RUNNERS_UP_ABOVE = 5
RUNNERS_UP_BELOW = 5


class Memory(NamedTuple):
    """What the cost model says a setup needs: per device, the band's high edge, per node on the host."""

    device_bytes: int
    high_bytes: int
    host_bytes: int | None = None
    #: Paged optimizer states counted in both figures: those over the budget may page to the host.
    paged_bytes: int = 0


@dataclass
class Tally:
    """Memory estimates a workload's changes ran (added to the plan's ``estimates_run``)."""

    estimates: int = 0


def memory_of(est: Estimate) -> Memory:
    """An estimate's figures for the fit test (`fit_verdict`)."""
    return Memory(est.device_bytes, high_bytes(est), est.host_bytes, paged_bytes(est))


class Workload(Protocol[S, T]):
    """What a kind of model gives the planner loop (see the module docstring)."""

    kind: SetupKind
    #: The candidate model of this workload (``Candidate[LlmSetup, Throughput]``, ...).
    candidate_model: type[Candidate[S, T]]
    #: Search every tier (True), or stop after the first tier in which something fits.
    exhaustive: bool
    effective_batch: int
    #: Memory estimates the cost model ran (memoised ones counted once).
    estimates_run: int

    def tiers(self) -> Iterable[Iterable[Sequence[S]]]:
        """Tiers in preference order; each a list of families ordered by growing memory."""
        ...

    def memory(self, setup: S) -> Memory | None:
        """The setup's memory; None when the estimator refuses it (ends its family)."""
        ...

    def speed(self, setup: S) -> T: ...

    def rank_key(self, c: Candidate[S, T]) -> tuple[object, ...]:
        """Sort key, best first (ascending); it must place a better tier before a worse one."""
        ...

    def speed_key(self, c: Candidate[S, T]) -> tuple[object, ...]:
        """The head of `rank_key` that says how good a plan is (preference, length or resolution, speed);
        the rest only breaks ties."""
        ...

    def goal_key(self, c: Candidate[S, T]) -> tuple[object, ...]:
        """The head of `speed_key` that says what is trained (method preference and length, or
        resolution), not how fast. Among tight candidates of the best goal, the lower band edge wins."""
        ...

    def signature(self, c: Candidate[S, T]) -> tuple[object, ...]:
        """Runners-up that share a signature would read the same: only the best-ranked is listed."""
        ...

    def why_not(self, c: Candidate[S, T], chosen: Candidate[S, T]) -> str:
        """Why a fitting candidate ranked below the choice lost."""
        ...

    def reasons(self, chosen: Candidate[S, T], ranked: Sequence[Candidate[S, T]]) -> list[Reason]: ...

    def env(self, chosen: Candidate[S, T]) -> tuple[EnvVar, ...]: ...

    def changes(self, ranked: Sequence[Candidate[S, T]]) -> list[Change]:
        """When nothing fits, or only tight candidates do: changes that would make some candidate's
        likely range (the band's high edge) fit, smallest first, each checked by estimating it; their
        estimates count in ``estimates_run``."""
        ...

    def estimate(self, setup: S) -> Estimate:
        """The full estimate of a setup, with its verdict on the target."""
        ...

    def notes(self, chosen: Candidate[S, T] | None) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class Searched(Generic[S, T]):
    """The evaluated candidates, best first, the choice that fits and, when none does, the tight one."""

    ranked: list[Candidate[S, T]]
    chosen: Candidate[S, T] | None
    #: When no candidate fits: the best tight one (`tight_choice`); None otherwise.
    tight: Candidate[S, T] | None = None

    @property
    def smallest(self) -> Candidate[S, T]:
        """The least-memory candidate (the best-ranked of equals)."""
        return min(self.ranked, key=lambda c: c.device_bytes)

    @property
    def choice(self) -> Candidate[S, T] | None:
        """What the plan chooses: the best fit, else the best tight candidate, else nothing."""
        return self.chosen if self.chosen is not None else self.tight


def fit_verdict(mem: Memory, target: Target) -> VerdictName:
    """The fit test of every plan: the band's high edge against the budget (paged optimizer states over it
    page to the host: engine/verdict.py `judge_bytes`), the node's host memory."""
    verdict = cast(
        VerdictName, judge_bytes(mem.device_bytes, mem.high_bytes, target.budget_bytes, mem.paged_bytes)
    )
    host = target.host_memory_bytes
    if mem.host_bytes is not None and host is not None and mem.host_bytes > host:
        return "does_not_fit"  # the node's CPU RAM cannot hold the offload or the loading
    return verdict


def _candidate(w: Workload[S, T], target: Target, setup: S) -> Candidate[S, T] | None:
    """A setup's memory, verdict and speed; None when the estimator refuses it."""
    mem = w.memory(setup)
    return _built(w, target, setup, mem, fit_verdict(mem, target)) if mem is not None else None


def _built(w: Workload[S, T], target: Target, setup: S, mem: Memory, verdict: VerdictName) -> Candidate[S, T]:
    return w.candidate_model(
        setup=setup,
        effective_batch=w.effective_batch,
        device_bytes=mem.device_bytes,
        high_bytes=mem.high_bytes,
        budget_bytes=target.budget_bytes,
        verdict=verdict,
        host_bytes=mem.host_bytes,
        paged_bytes=mem.paged_bytes,
        throughput=w.speed(setup),
    )


def _walk(w: Workload[S, T], target: Target) -> list[Candidate[S, T]]:
    """The candidates the search reaches.

    A family grows in memory, so it ends at its first candidate whose likely range does not fit (the
    least-reaching tight one of the family, which `tight_choice` may take); the walk ends after the first
    tier in which something fits unless the workload is exhaustive.
    """
    cands: list[Candidate[S, T]] = []
    for tier in w.tiers():
        for family in tier:
            for setup in family:
                c = _candidate(w, target, setup)
                if c is None:
                    break  # the estimator refuses it; larger micro-batches too
                cands.append(c)
                if not c.fits:
                    break  # a family grows in memory: the rest of it does not fit either
        if not w.exhaustive and any(c.fits for c in cands):
            break
    return cands


def best_fit(w: Workload[S, T], target: Target) -> Candidate[S, T] | None:
    """What `search` would choose (``search(w, target).chosen``: the best-ranked candidate whose likely
    range fits), walking the same setups, but with the speed computed only for the fitting ones: a
    candidate that does not fit cannot be chosen, so its rank does not matter. For the changes' searches,
    which need only the choice (docs/planner.md#tight-changes)."""
    fitting: list[Candidate[S, T]] = []
    reached = 0
    for tier in w.tiers():
        for family in tier:
            for setup in family:
                mem = w.memory(setup)
                if mem is None:
                    break  # as `_walk`: the estimator refuses it; larger micro-batches too
                reached += 1
                verdict = fit_verdict(mem, target)
                if verdict != "fits":
                    break  # as `_walk`: a family grows in memory
                fitting.append(_built(w, target, setup, mem, verdict))
        if not w.exhaustive and fitting:
            break
    if not reached:
        raise ValueError("the search space is empty: no setup could be estimated")
    return min(fitting, key=w.rank_key, default=None)  # min keeps the first of equals, as a stable sort


def tight_choice(w: Workload[S, T], cands: Sequence[Candidate[S, T]]) -> Candidate[S, T] | None:
    """When nothing fits: among the tight candidates of the best goal (`Workload.goal_key`: method and
    length, or resolution), the one whose likely range reaches least, the ranking breaking ties. Speed
    is not worth a likelier out-of-memory error: a faster setup that reaches further is a runner-up.
    None when no central estimate fits either."""
    tight = [c for c in cands if c.verdict == "tight"]
    return min(tight, key=lambda c: (w.goal_key(c), c.reach_bytes, w.rank_key(c)), default=None)


def search(w: Workload[S, T], target: Target) -> Searched[S, T]:
    """Every candidate of the search space the loop reaches, ranked, the best one that fits and, when
    none does, the tight one `tight_choice` takes."""
    cands = _walk(w, target)
    if not cands:
        raise ValueError("the search space is empty: no setup could be estimated")
    cands.sort(key=w.rank_key)
    chosen = next((c for c in cands if c.fits), None)
    return Searched(ranked=cands, chosen=chosen, tight=tight_choice(w, cands) if chosen is None else None)


def runners_up(
    w: Workload[S, T], chosen: Candidate[S, T], ranked: Sequence[Candidate[S, T]]
) -> list[RunnerUp]:
    """Up to 5 better-ranked candidates that lost (they do not meet the choice's verdict, or, tight like
    it, reach further) and 5 ranked below that meet its verdict, with reasons.

    Candidates with the signature of one already listed (a memory-neutral difference: bf16/fp16,
    flash/sdpa) are skipped: they would repeat the same line. A tight choice has no fitting runner-up:
    the choice is tight only when nothing fits.
    """
    i = next(k for k, c in enumerate(ranked) if c is chosen)
    seen = {w.signature(chosen)}
    unique_above: list[Candidate[S, T]] = []
    for c in ranked[:i]:  # the first of a signature is its best-ranked variant
        if w.signature(c) not in seen:
            seen.add(w.signature(c))
            unique_above.append(c)
    above: list[Candidate[S, T]] = unique_above[-RUNNERS_UP_ABOVE:]
    below: list[Candidate[S, T]] = []
    for c in ranked[i + 1 :]:
        if len(below) == RUNNERS_UP_BELOW:
            break
        if c.meets(chosen.verdict) and w.signature(c) not in seen:
            seen.add(w.signature(c))
            below.append(c)
    return [
        *(RunnerUp(candidate=c, reason=why_not_fit(c, chosen)) for c in above),  # type: ignore[arg-type]
        *(RunnerUp(candidate=c, reason=_why_below(w, c, chosen)) for c in below),  # type: ignore[arg-type]
    ]


def _why_below(w: Workload[S, T], c: Candidate[S, T], chosen: Candidate[S, T]) -> str:
    """Why a runner-up ranked below the choice lost: the workload's words, or, when both are tight and
    as good, the band edge that decided it (`tight_choice`)."""
    if (
        chosen.verdict == "tight"
        and w.goal_key(c) == w.goal_key(chosen)
        and c.reach_bytes > chosen.reach_bytes
    ):
        return why_not_fit(c, chosen)
    return w.why_not(c, chosen)


def why_not_fit(c: Candidate[S, T], chosen: Candidate[S, T]) -> str:
    """Why a candidate ranked above the choice lost: it does not fit, or only its central estimate does
    (or, when the choice is tight too, its likely range reaches further)."""
    if c.verdict == "tight" and chosen.verdict == "tight":
        return (
            f"tight too, likely up to {_gib(c.high_bytes)}, the choice up to "
            f"{_gib(chosen.high_bytes)} (among tight ones, the lower likely range wins)"
        )
    if c.verdict == "tight":
        return (
            f"tight: needs {_gib(c.device_bytes)}, likely up to {_gib(c.high_bytes)}, budget "
            f"{_gib(c.budget_bytes)} (a plan must fit the likely range)"
        )
    return f"does not fit: needs {_gib(c.device_bytes)}, budget {_gib(c.budget_bytes)}"


def tight_reason(chosen: Candidate[S, T]) -> Reason:
    """The first reason of a tight plan: nothing fits the likely range, so the best configuration whose
    central estimate fits is chosen, as `check` would judge it."""
    rid, choice, text, source = reason_for(
        "tight-fallback",
        "verdict",
        f"tight: no configuration's likely range fits the {_gib(chosen.budget_bytes)} budget; this is the "
        f"best whose central estimate fits ({_gib(chosen.device_bytes)}), likely up to "
        f"{_gib(chosen.high_bytes)}: it may run out of memory",
    )
    return Reason(rule=rid, choice=choice, text=text, source=source)


def _reasons(w: Workload[S, T], chosen: Candidate[S, T], ranked: Sequence[Candidate[S, T]]) -> list[Reason]:
    """The workload's reasons, after the tight fallback's own when the choice is tight."""
    return [*([tight_reason(chosen)] if chosen.verdict == "tight" else []), *w.reasons(chosen, ranked)]


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


@dataclass(frozen=True)
class Asked:
    """What the plan is about: the model, the machine, its speed and the request (echoed in the Plan)."""

    model: str
    model_name: str
    target: Target
    device: DevicePerf
    request: PlanRequest | DiffusionRequest


def make(w: Workload[S, T], asked: Asked) -> Plan:
    """Search, choose and explain: the `Plan` of every workload (a tight choice when nothing fits)."""
    found = search(w, asked.target)
    chosen = found.choice
    est: Estimate | None = w.estimate(chosen.setup) if chosen is not None else None
    # nothing fits, or only tight: what would make a likely range fit (run before estimates_run is read)
    changes = tuple(w.changes(found.ranked)) if chosen is None or not chosen.fits else ()
    assumed = asked.device.assumed
    warnings: list[str] = [f"speed figures assumed: {'; '.join(assumed)}"] if assumed else []
    return Plan(
        kind=w.kind,
        model=asked.model,
        model_name=asked.model_name,
        target=asked.target,
        device=asked.device,
        request=asked.request,
        fits=chosen is not None and chosen.fits,
        verdict=chosen.verdict if chosen is not None else "does_not_fit",
        chosen=chosen,  # type: ignore[arg-type]  # Candidate[S, T] is one of AnyCandidate's members
        estimate=est,
        reasons=tuple(_reasons(w, chosen, found.ranked)) if chosen is not None else (),
        runners_up=tuple(runners_up(w, chosen, found.ranked)) if chosen is not None else (),
        env=w.env(chosen) if chosen is not None else (),
        min_device_bytes=found.smallest.device_bytes,
        changes=changes,
        grid_points=len(found.ranked),
        estimates_run=w.estimates_run,
        warnings=(*warnings, *(est.warnings if est is not None else ())),
        smallest=found.smallest if chosen is None else None,  # type: ignore[arg-type]
        notes=w.notes(chosen),
    )
