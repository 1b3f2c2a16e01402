"""What a chart shows, as plain data: built from fitcheck's models, drawn by `fitcheck.chart.draw`.

Pure functions (no plotting library, no I/O), so what a chart says is tested without drawing it and
the drawing code only places what these specs hold. Bytes stay integers; the drawing converts them
to GiB through `fitcheck.units`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from fitcheck.measure.result import MeasuredStep
from fitcheck.models import Estimate, SetupBase
from fitcheck.planner.models import AnyCandidate, ImageThroughput, Plan

PHASE_LABEL = {
    "load": "load",
    "forward": "forward",
    "backward": "backward",
    "optimizer_step": "optimizer step",
}


@dataclass(frozen=True)
class Bar:
    """One stacked bar: (component id, bytes) from the bottom up."""

    label: str
    segments: tuple[tuple[str, int], ...]
    marked: str = ""

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.segments)


@dataclass(frozen=True)
class Line:
    """A horizontal reference line (budget, usable memory)."""

    label: str
    bytes: int
    style: str = "solid"


@dataclass(frozen=True)
class Range:
    """A band drawn on one bar (likely low..high)."""

    bar: int
    low_bytes: int
    high_bytes: int
    label: str


@dataclass(frozen=True)
class BarChart:
    """Stacked bars of named components per phase, with reference lines and the band."""

    title: str
    subtitle: str
    bars: tuple[Bar, ...]
    lines: tuple[Line, ...] = ()
    band: Range | None = None
    note: str = ""

    @property
    def components(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for bar in self.bars:
            for name, _ in bar.segments:
                seen.setdefault(name, None)
        return tuple(seen)


@dataclass(frozen=True)
class PlanRow:
    """One configuration of a plan: its memory and speed, and whether it is the chosen one."""

    label: str
    device_bytes: int
    verdict: str
    speed: float
    chosen: bool
    reason: str = ""


@dataclass(frozen=True)
class PlanChart:
    title: str
    subtitle: str
    rows: tuple[PlanRow, ...]
    budget_bytes: int
    speed_unit: str
    lines: tuple[Line, ...] = ()


@dataclass(frozen=True)
class MatrixCell:
    bytes: int
    verdict: str


@dataclass(frozen=True)
class MatrixChart:
    title: str
    subtitle: str
    models: tuple[str, ...]
    methods: tuple[str, ...]
    cells: tuple[tuple[MatrixCell, ...], ...]
    budget_bytes: int
    usable_bytes: int


@dataclass(frozen=True)
class Timeline:
    """Memory over a traced step: samples of bytes per category, phases and the estimate's totals."""

    title: str
    subtitle: str
    x: tuple[int, ...]
    series: tuple[tuple[str, tuple[int, ...]], ...]
    phases: tuple[tuple[str, int, int], ...] = field(default=())
    estimate: tuple[tuple[str, int], ...] = field(default=())
    peak: tuple[int, int] | None = None


Chart = BarChart | PlanChart | MatrixChart | Timeline


def setup_words(setup: SetupBase) -> str:
    """The setup in a few words: method, sizes, checkpointing, precision, optimizer, attention."""

    def get(name: str) -> object:
        return getattr(setup, name, None)  # a field of one workload only reads as absent on the other

    parts: list[str] = []
    method = str(get("method") or "")
    if method:
        parts.append(method + (f" r{get('lora_rank')}" if method in ("lora", "qlora") else ""))
    if get("resolution"):
        parts.append(f"{get('resolution')}px")
    elif get("seq_len"):
        parts.append(f"seq {get('seq_len')}")
    if get("batch_size"):
        parts.append(f"batch {get('batch_size')}")
    parts.append("ckpt" if get("grad_ckpt") else "no ckpt")
    for key in ("precision", "optimizer", "attn"):
        if get(key):
            parts.append(str(get(key)))
    trainer = get("trainer")
    if trainer and trainer != "generic":
        parts.append(str(trainer))
    return ", ".join(parts)


def estimate_chart(est: Estimate) -> BarChart:
    """Stacked components per phase, the device total at the peak with its band, budget and usable."""
    bars = [
        Bar(
            PHASE_LABEL.get(p.name, p.name),
            tuple((c.name, c.bytes) for c in p.components),
            "peak" if p.name == est.peak_phase else "",
        )
        for p in est.phases
    ]
    peak = est.phase(est.peak_phase)
    device = (
        *((c.name, c.bytes) for c in peak.components),
        ("allocator_reserve", est.allocator_reserve_bytes),
        ("cuda_context", est.context_bytes),
    )
    bars.append(Bar("on the device", tuple(s for s in device if s[1] > 0), ""))
    lines: list[Line] = []
    target = est.target
    if target is not None:
        lines.append(Line(f"usable on {target.hardware}", target.usable_bytes, "dotted"))
        if target.budget_bytes != target.usable_bytes:
            lines.append(Line("budget (usable minus --headroom)", target.budget_bytes, "dashed"))
    band = getattr(est, "band", None)
    rng = None
    if band is not None:
        rng = Range(len(bars) - 1, band.low_bytes, band.high_bytes, "likely range")
    where = f" on {target.hardware}" if target is not None else ""
    verdict = f": {target.verdict.replace('_', ' ')}" if target is not None else ""
    return BarChart(
        title=f"{est.model_name}{where}{verdict}",
        subtitle=setup_words(est.setup),
        bars=tuple(bars),
        lines=tuple(lines),
        band=rng,
        note="each phase: what is alive at its peak; the last bar adds the allocator reserve and context",
    )


def _candidate_label(c: AnyCandidate) -> str:
    s = c.setup
    accum = max(1, c.effective_batch // max(1, s.batch_size))
    size = f"{s.resolution}px" if s.kind == "diffusion" else f"seq {s.seq_len}"
    words = [s.method, f"{s.batch_size}x{accum}", size]
    words += ["ckpt" if s.grad_ckpt else "no ckpt", s.optimizer]
    return " ".join(words)


def plan_chart(plan: Plan) -> PlanChart:
    """The chosen configuration against its runners-up: memory against the budget, and speed."""
    rows: list[PlanRow] = []
    if plan.chosen is not None:
        c = plan.chosen
        rows.append(PlanRow(_candidate_label(c), c.device_bytes, c.verdict, _per_s(c), True))
    for ru in plan.runners_up:
        c = ru.candidate
        rows.append(PlanRow(_candidate_label(c), c.device_bytes, c.verdict, _per_s(c), False, ru.reason))
    if not rows:  # nothing fits: what each smallest change would need against the budget
        for ch in plan.changes:
            verdict = "fits" if ch.device_bytes <= ch.budget_bytes else "does_not_fit"
            rows.append(PlanRow(ch.change, ch.device_bytes, verdict, 0.0, False, ch.flag))
    return PlanChart(
        title=f"{plan.model_name} on {plan.target.name}: "
        + {"fits": "plan", "tight": "plan (tight)", "does_not_fit": "nothing fits"}[plan.verdict],
        subtitle=(setup_words(plan.chosen.setup) if plan.chosen is not None else "no configuration fits"),
        rows=tuple(rows),
        budget_bytes=plan.target.budget_bytes,
        speed_unit="images/s" if plan.kind == "diffusion" else "tokens/s",
        lines=(Line("budget", plan.target.budget_bytes, "dashed"),),
    )


def _per_s(c: AnyCandidate) -> float:
    """A candidate's estimated speed in its workload's unit (tokens/s, images/s)."""
    tp = c.throughput
    return tp.images_per_s if isinstance(tp, ImageThroughput) else tp.tokens_per_s


def matrix_chart(
    rows: Sequence[Mapping[str, object]], methods: Sequence[str], target: str, assumptions: str
) -> MatrixChart:
    """Models x methods, each cell its GiB and verdict (rows as `fitcheck matrix` builds them)."""
    models: list[str] = []
    cells: list[tuple[MatrixCell, ...]] = []
    budget = usable = 0
    for row in rows:
        models.append(str(row["model"]))
        cells.append(
            tuple(MatrixCell(int(str(row[f"{m}_bytes"])), str(row[f"{m}_verdict"])) for m in methods)
        )
        budget, usable = int(str(row["budget_bytes"])), int(str(row["usable_bytes"]))
    return MatrixChart(
        title=f"What fits on {target}",
        subtitle=assumptions,
        models=tuple(models),
        methods=tuple(methods),
        cells=tuple(cells),
        budget_bytes=budget,
        usable_bytes=usable,
    )


def timeline_chart(measured: MeasuredStep, est: Estimate | None, model_name: str) -> Timeline:
    """Memory over the traced (or real) step, with the estimate's phase totals over each phase."""
    line = measured.timeline
    if line is None:
        raise ValueError("this measurement has no timeline (trace it with timeline_points > 0)")
    totals = line.totals()
    i = max(range(len(totals)), key=totals.__getitem__)
    estimate = tuple((p.name, p.total_bytes) for p in est.phases) if est is not None else ()
    how = "traced on fake tensors" if measured.mode == "trace" else f"measured on {measured.device}"
    zero = line.x[0]  # events counted from the start of the measured step
    return Timeline(
        title=f"{model_name}: memory over one training step ({how})",
        subtitle=setup_words(measured.setup),
        x=tuple(x - zero for x in line.x),
        series=tuple(line.series.items()),
        phases=tuple((p.name, p.start - zero, p.end - zero) for p in line.phases),
        estimate=estimate,
        peak=(line.x[i] - zero, totals[i]),
    )
