"""`MeasuredStep`: what a traced or real training step used, per phase, in the engine's vocabulary.

The result mirrors `fitcheck.models.Estimate` (phases named ``forward``, ``backward``,
``optimizer_step``; ``peak_allocated_bytes`` is the largest phase peak) so a measurement and an
estimate can be compared line by line. It is a plain pydantic model: no torch import here, so the
calibration records can be read back without the torch extra.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from fitcheck.models import AnySetup, Frozen, PhaseName

MEASURE_SCHEMA_VERSION = 1

#: Categories a storage is attributed to (by the role it ends up playing, see docs/measure.md).
Category = Literal[
    "parameters_frozen",
    "parameters_trainable",
    "buffers",
    "inputs",
    "gradients",
    "optimizer_states",
    "master_weights",
    "activations",
    "backward_temporaries",
    "optimizer_temporaries",
]
CATEGORIES: tuple[str, ...] = Category.__args__  # type: ignore[attr-defined]

#: How the coarse categories of the issue map onto the tracer's finer ones.
COARSE: dict[str, str] = {
    "parameters_frozen": "parameters",
    "parameters_trainable": "parameters",
    "buffers": "parameters",
    "inputs": "activations_temporaries",
    "gradients": "gradients",
    "optimizer_states": "optimizer_states",
    "master_weights": "optimizer_states",
    "activations": "activations_temporaries",
    "backward_temporaries": "activations_temporaries",
    "optimizer_temporaries": "activations_temporaries",
}

Mode = Literal["trace", "real"]

#: How the tracer's categories fold into the five a timeline is drawn in (docs/measure.md).
TIMELINE_FOLD: dict[str, str] = {
    "parameters_frozen": "weights",
    "parameters_trainable": "weights",
    "buffers": "weights",
    "gradients": "gradients",
    "optimizer_states": "optimizer states",
    "master_weights": "optimizer states",
    "inputs": "activations",
    "activations": "activations",
    "backward_temporaries": "temporaries",
    "optimizer_temporaries": "temporaries",
}


class PhaseSpan(Frozen):
    """Where one phase window lies on the timeline's event axis."""

    name: str
    start: int
    end: int


class StepTimeline(Frozen):
    """Live bytes per category over the measured step, thinned to a few hundred samples.

    ``x`` are allocator event numbers (each allocation or free is one event); ``series`` maps a
    category to its bytes at each sample. The peak of every slice is kept, so the largest total of
    the samples is the step's peak.
    """

    x: tuple[int, ...]
    series: dict[str, tuple[int, ...]]
    phases: tuple[PhaseSpan, ...]

    @model_validator(mode="after")
    def _lengths(self) -> StepTimeline:
        if any(len(v) != len(self.x) for v in self.series.values()):
            raise ValueError("every series needs one value per sample")
        return self

    def totals(self) -> tuple[int, ...]:
        """Total live bytes at each sample."""
        return tuple(sum(v[i] for v in self.series.values()) for i in range(len(self.x)))


class LiveTensor(Frozen):
    """One storage alive at a phase peak (the largest ones are kept, for reading where memory goes)."""

    bytes: int = Field(ge=0)
    category: Category
    op: str = Field(description="the aten op that allocated it")
    shape: tuple[int, ...]
    dtype: str
    module: str = Field(default="", description="innermost module running when it was allocated")
    created_in: str = Field(description="phase and step it was allocated in, e.g. forward@2")


class PhasePeak(Frozen):
    """The running peak inside one phase of the measured step."""

    name: PhaseName
    peak_bytes: int = Field(ge=0, description="largest live tensor bytes seen inside the phase")
    start_bytes: int = Field(ge=0, description="live bytes when the phase began")
    end_bytes: int = Field(ge=0, description="live bytes when the phase ended")
    reserved_peak_bytes: int | None = Field(default=None, description="allocator reserve (real CUDA runs)")
    breakdown: dict[str, int] | None = Field(
        default=None, description="bytes by category at this phase's peak (trace mode); sums to peak_bytes"
    )
    top_tensors: tuple[LiveTensor, ...] = ()

    @model_validator(mode="after")
    def _sum(self) -> PhasePeak:
        if self.breakdown is not None and sum(self.breakdown.values()) != self.peak_bytes:
            raise ValueError(f"phase {self.name}: breakdown does not sum to peak_bytes")
        return self


class MeasuredStep(Frozen):
    """One measured training step: peaks per phase, breakdown at the peak, and how it was measured."""

    schema_version: int = MEASURE_SCHEMA_VERSION
    mode: Mode
    device: str = Field(description="fake (traced), cpu, cuda or mps")
    device_semantics: str = Field(description="which kernels and rules the numbers reflect")
    model_type: str
    setup: AnySetup
    regime: str
    steps: int = Field(ge=1)
    measured_step: int = Field(
        ge=1, description="the step the phases are taken from (optimizer states exist)"
    )
    phases: tuple[PhasePeak, ...]
    peak_phase: PhaseName
    peak_allocated_bytes: int = Field(ge=0)
    peak_reserved_bytes: int | None = None
    first_step_peak_bytes: int | None = Field(default=None, description="peak of step 1 (no states yet)")
    param_bytes: int = Field(ge=0, description="all parameter storages (frozen + trainable)")
    trainable_params: int = Field(ge=0)
    total_params: int = Field(ge=0)
    tool_versions: dict[str, str]
    wall_seconds: float = Field(ge=0)
    notes: tuple[str, ...] = ()
    timeline: StepTimeline | None = Field(default=None, description="memory over the step (--timeline)")

    @model_validator(mode="after")
    def _peak(self) -> MeasuredStep:
        top = max(self.phases, key=lambda p: p.peak_bytes)
        if top.peak_bytes != self.peak_allocated_bytes or top.name != self.peak_phase:
            raise ValueError("peak_allocated_bytes must be the largest phase peak, in peak_phase")
        return self

    def phase(self, name: str) -> PhasePeak:
        """The phase called ``name``."""
        return next(p for p in self.phases if p.name == name)

    def coarse_breakdown(self, name: str) -> dict[str, int] | None:
        """Breakdown of one phase folded into parameters / gradients / optimizer states / activations."""
        fine = self.phase(name).breakdown
        if fine is None:
            return None
        out: dict[str, int] = {}
        for cat, nbytes in fine.items():
            out[COARSE[cat]] = out.get(COARSE[cat], 0) + nbytes
        return out
