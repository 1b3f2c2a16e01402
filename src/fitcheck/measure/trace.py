"""Trace a training step on fake tensors: the exact tensor-level peak per phase, no memory used.

The model is built from its config inside ``FakeTensorMode`` (a 70B model costs only metadata), the
regime's step runs for real on fake tensors, and `LiveStorageMode` counts every storage. See
docs/measure.md for what the trace sees and what it cannot (allocator rounding, CUDA context, kernel
scratch).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from fitcheck.engine.regimes import regime_for
from fitcheck.measure.result import TIMELINE_FOLD, LiveTensor, MeasuredStep, PhaseSpan, StepTimeline
from fitcheck.measure.summary import PhaseWindow, RunFacts, summarize
from fitcheck.models import LlmSetup

DEVICE_SEMANTICS = (
    "fake tensors on the CPU device with CUDA rules where they differ: SDPA runs CPU flash attention "
    "(saves out + fp32 logsumexp, like CUDA flash), CUDA autocast op lists, fused dropout (bool mask); "
    "exact storage bytes, no allocator rounding, no CUDA context or kernel workspaces"
)
TOP_TENSORS = 12


class _TraceProbe:
    """Marks phases on the tracker and tags gradients and optimizer states with their final role."""

    def __init__(self, tracker: Any) -> None:
        self.tracker = tracker

    def begin(self, phase: str, step: int) -> None:
        self.tracker.begin(phase, step)

    def step_end(self, step: int, model: Any, optimizer: Any) -> None:
        from fitcheck.measure.optim import state_tensors

        self.tracker.retag([p.grad for p in model.parameters() if p.grad is not None], "gradients")
        for key, t in state_tensors(optimizer):
            self.tracker.retag([t], "master_weights" if key == "master" else "optimizer_states")


def trace_step(
    hf_config: Mapping[str, Any],
    setup: LlmSetup,
    *,
    steps: int = 2,
    top: int = TOP_TENSORS,
    timeline_points: int = 0,
) -> MeasuredStep:
    """Trace ``steps`` training steps of the model ``hf_config`` describes under ``setup``'s regime.

    Args:
        hf_config: a ``config.json`` mapping (``model_type`` and the architecture fields).
        setup: method, batch, sequence, precision, optimizer, trainer...
        steps: optimizer steps to run; phases are reported for the last one (>= 2 so states exist).
        top: how many of the largest live storages to keep per phase peak.
        timeline_points: when > 0, also record memory over the last step in at most this many samples.

    Raises:
        OptionError: a setup the tracer cannot run (QLoRA, 8-bit optimizers).
    """
    import torch

    from fitcheck.measure._internals import FakeTensorMode, fakeify, param_bytes, unique_params
    from fitcheck.measure.build import build_model, trainable_parameters
    from fitcheck.measure.optim import make_optimizer
    from fitcheck.measure.step import device_semantics, run_steps
    from fitcheck.measure.tracker import LiveStorageMode, ModuleScope, Tracker

    regime = regime_for(setup)
    started = time.perf_counter()
    tracker = Tracker()
    fake = FakeTensorMode()
    with torch.device("meta"):
        built = build_model(hf_config, setup, regime)
    model = built.model
    fakeify(model, fake)
    with fake:
        params = trainable_parameters(model)
        optimizer = make_optimizer(params, setup, regime)
        batch = built.batch(setup)
        _register_existing(tracker, model, batch)
        names = {id(m): n for n, m in model.named_modules()}
        with device_semantics(regime, True, fake=True), ModuleScope(tracker, names), LiveStorageMode(tracker):
            run_steps(model, optimizer, batch, setup, regime, _TraceProbe(tracker), steps, "cpu")
        tracker.end()
        windows = [window(tracker, w, top) for w in tracker.windows]
        facts = RunFacts(
            mode="trace",
            device="fake",
            device_semantics=DEVICE_SEMANTICS,
            model_type=built.model_type,
            regime=regime.name,
            steps=steps,
            param_bytes=param_bytes(model),
            trainable_params=sum(p.numel() for p in params),
            total_params=sum(p.numel() for p in unique_params(model)),
            wall_seconds=time.perf_counter() - started,
            notes=built.notes,
        )
        line = _timeline(tracker, timeline_points) if timeline_points > 0 else None
        del optimizer, model, params, batch
    measured = summarize(windows, setup, facts)
    return measured.model_copy(update={"timeline": line}) if line is not None else measured


def _timeline(tracker: Any, points: int) -> StepTimeline:
    """Memory over the last step, folded into five categories, with the phase windows on its axis."""
    from fitcheck.measure.tracker import timeline

    last = max(w.step for w in tracker.windows)
    inside = [w for w in tracker.windows if w.step == last]
    start, end = inside[0].start_seq, inside[-1].end_seq
    x, series = timeline(tracker, start, end, points, TIMELINE_FOLD)
    return StepTimeline(
        x=tuple(x),
        series={k: tuple(v) for k, v in series.items()},
        phases=tuple(PhaseSpan(name=w.name, start=w.start_seq, end=w.end_seq) for w in inside),
    )


def _register_existing(tracker: Any, model: Any, batch: tuple[Any, Any]) -> None:
    """Count what exists before the step: weights (frozen / trainable), buffers, the batch."""
    from fitcheck.measure._internals import unique_params

    params = unique_params(model)
    tracker.register([p for p in params if not p.requires_grad], "parameters_frozen", "<parameter>")
    tracker.register([p for p in params if p.requires_grad], "parameters_trainable", "<parameter>")
    tracker.register(list(model.buffers()), "buffers", "<buffer>")
    tracker.register(list(batch), "inputs", "<batch>")


def window(tracker: Any, w: Any, top: int) -> PhaseWindow:
    """A tracker window with its breakdown and largest tensors at the peak."""
    alive = list(tracker.alive_at(w.peak_seq))
    breakdown: dict[str, int] = {}
    for rec in alive:
        breakdown[rec.category] = breakdown.get(rec.category, 0) + rec.nbytes
    biggest = sorted(alive, key=lambda r: r.nbytes, reverse=True)[:top]
    return PhaseWindow(
        name=w.name,
        step=w.step,
        start_bytes=w.start_bytes,
        peak_bytes=w.peak_bytes,
        end_bytes=w.end_bytes,
        breakdown=breakdown if sum(breakdown.values()) == w.peak_bytes else None,
        top_tensors=[
            LiveTensor(
                bytes=r.nbytes,
                category=r.category,
                op=r.op,
                shape=r.shape,
                dtype=r.dtype,
                module=r.module,
                created_in=r.created_in,
            )
            for r in biggest
        ],
    )
