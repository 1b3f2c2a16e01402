"""Fold per-step phase windows into a `MeasuredStep` (torch-free, shared by trace and real runs)."""

from __future__ import annotations

import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata

from fitcheck.measure.result import LiveTensor, MeasuredStep, Mode, PhasePeak
from fitcheck.models import AnySetup

PHASES = ("forward", "backward", "optimizer_step")


@dataclass
class PhaseWindow:
    """What a probe saw in one phase of one step (micro-batches give several windows per phase)."""

    name: str
    step: int
    start_bytes: int
    peak_bytes: int
    end_bytes: int
    reserved_peak_bytes: int | None = None
    breakdown: dict[str, int] | None = None
    top_tensors: list[LiveTensor] = field(default_factory=list)


@dataclass
class RunFacts:
    """Facts about the measured run that are not per phase."""

    mode: Mode
    device: str
    device_semantics: str
    model_type: str
    regime: str
    steps: int
    param_bytes: int
    trainable_params: int
    total_params: int
    wall_seconds: float
    notes: list[str]
    peak_reserved_bytes: int | None = None


def tool_versions() -> dict[str, str]:
    """Versions of what decides the numbers: torch, transformers, peft, python, fitcheck."""
    out = {"python": platform.python_version()}
    for dist in ("torch", "transformers", "peft", "fitcheck-train"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    try:
        import torch

        out["torch"] = torch.__version__
    except ImportError:  # pragma: no cover - callers of measure always have torch
        pass
    return out


def summarize(windows: Sequence[PhaseWindow], setup: AnySetup, facts: RunFacts) -> MeasuredStep:
    """Per-phase peaks of the last step (optimizer states exist from step 2 on)."""
    last = max(w.step for w in windows)
    phases: list[PhasePeak] = []
    for name in PHASES:
        inside = [w for w in windows if w.name == name and w.step == last]
        if not inside:
            continue
        top = max(inside, key=lambda w: w.peak_bytes)
        phases.append(
            PhasePeak(
                name=name,  # type: ignore[arg-type]
                peak_bytes=top.peak_bytes,
                start_bytes=inside[0].start_bytes,
                end_bytes=inside[-1].end_bytes,
                reserved_peak_bytes=top.reserved_peak_bytes,
                breakdown=top.breakdown,
                top_tensors=tuple(top.top_tensors),
            )
        )
    peak = max(phases, key=lambda p: p.peak_bytes)
    first = [w.peak_bytes for w in windows if w.step == 1]
    return MeasuredStep(
        mode=facts.mode,
        device=facts.device,
        device_semantics=facts.device_semantics,
        model_type=facts.model_type,
        setup=setup,
        regime=facts.regime,
        steps=facts.steps,
        measured_step=last,
        phases=tuple(phases),
        peak_phase=peak.name,
        peak_allocated_bytes=peak.peak_bytes,
        peak_reserved_bytes=facts.peak_reserved_bytes,
        first_step_peak_bytes=max(first) if first and last > 1 else None,
        param_bytes=facts.param_bytes,
        trainable_params=facts.trainable_params,
        total_params=facts.total_params,
        tool_versions=tool_versions(),
        wall_seconds=round(facts.wall_seconds, 3),
        notes=tuple(facts.notes),
    )
