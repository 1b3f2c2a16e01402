"""Run the same training step for real and read the allocator's own counters per phase.

- ``cuda``: ``torch.cuda.reset_peak_memory_stats()`` at each phase start, then
  ``max_memory_allocated`` / ``max_memory_reserved`` at its end (what the engine's allocated and
  reserved figures predict; the CUDA context is not included).
- ``mps``: ``torch.mps.current_allocated_memory`` sampled at phase boundaries (MPS has no peak
  counter in torch 2.13), so phase peaks are lower bounds; the note says so.
- ``cpu`` (tiny models): the CPU allocator's alloc/free events from
  ``torch.profiler.profile(profile_memory=True)``, summed in time order from before the model is
  built, and split at ``record_function`` phase marks. This is independent of the tracer (no
  dispatch mode, real kernels, real scratch buffers), which is why the tests use it as the reference.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Mapping
from typing import Any

from fitcheck.engine.regimes import regime_for
from fitcheck.errors import OptionError
from fitcheck.measure.result import MeasuredStep
from fitcheck.measure.summary import PhaseWindow, RunFacts, summarize
from fitcheck.models import LlmSetup

MARK = "fitcheck::"
SEMANTICS = {
    "cuda": "real CUDA run: caching-allocator counters (allocated and reserved), real kernels",
    "mps": "real MPS run: current allocated memory sampled at phase boundaries (lower bound of the peak)",
    "cpu": "real CPU run: CPU allocator events from torch.profiler (profile_memory=True), real CPU kernels "
    "and their scratch buffers, with the trace's CUDA rules applied (autocast op lists, fused dropout) "
    "except SDPA with attention dropout, which stays on the CPU math kernel (O(s^2))",
}


class _ProfilerProbe:
    """Opens one ``record_function`` range per phase so memory events can be split by time."""

    def __init__(self) -> None:
        self.current: Any = None

    def begin(self, phase: str, step: int) -> None:
        import torch

        self.close()
        self.current = torch.profiler.record_function(f"{MARK}{phase}@{step}")
        self.current.__enter__()

    def step_end(self, step: int, model: Any, optimizer: Any) -> None:
        return None

    def close(self) -> None:
        if self.current is not None:
            self.current.__exit__(None, None, None)
            self.current = None


class _AllocatorProbe:
    """Per-phase peaks from the CUDA caching allocator (or MPS current-allocation samples)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.windows: list[PhaseWindow] = []

    def _allocated(self) -> int:
        import torch

        if self.device == "cuda":
            return int(torch.cuda.memory_allocated())
        return int(torch.mps.current_allocated_memory())

    def _sync(self) -> None:
        import torch

        (torch.cuda if self.device == "cuda" else torch.mps).synchronize()

    def begin(self, phase: str, step: int) -> None:
        import torch

        self.close()
        now = self._allocated()
        if self.device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        self.windows.append(PhaseWindow(phase, step, now, now, now))

    def step_end(self, step: int, model: Any, optimizer: Any) -> None:
        return None

    def close(self) -> None:
        import torch

        if not self.windows:
            return
        self._sync()
        w = self.windows[-1]
        w.end_bytes = self._allocated()
        if self.device == "cuda":
            w.peak_bytes = int(torch.cuda.max_memory_allocated())
            w.reserved_peak_bytes = int(torch.cuda.max_memory_reserved())
        else:
            w.peak_bytes = max(w.start_bytes, w.end_bytes)


def real_step(
    hf_config: Mapping[str, Any], setup: LlmSetup, *, device: str = "cpu", steps: int = 2
) -> MeasuredStep:
    """Run ``steps`` real training steps on ``device`` and report per-phase peaks.

    Raises:
        OptionError: the device is not available, or a setup that cannot run (QLoRA, 8-bit optimizers).
    """
    import torch

    _check_device(device)
    regime = regime_for(setup)
    started = time.perf_counter()
    gc.collect()
    if device == "cpu":
        from torch.profiler import ProfilerActivity, profile

        probe: Any = _ProfilerProbe()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            built, facts_bits = _run(hf_config, setup, regime, device, steps, probe)
            probe.close()
        windows = _profiler_windows(prof)
    else:
        probe = _AllocatorProbe(device)
        built, facts_bits = _run(hf_config, setup, regime, device, steps, probe)
        probe.close()
        windows = probe.windows
    facts = RunFacts(
        mode="real",
        device=device,
        device_semantics=SEMANTICS[device],
        model_type=built.model_type,
        regime=regime.name,
        steps=steps,
        wall_seconds=time.perf_counter() - started,
        notes=built.notes,
        peak_reserved_bytes=max((w.reserved_peak_bytes or 0) for w in windows) or None,
        **facts_bits,
    )
    del built
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return summarize(windows, setup, facts)


def _run(
    hf_config: Mapping[str, Any], setup: LlmSetup, regime: Any, device: str, steps: int, probe: Any
) -> tuple[Any, dict[str, int]]:
    """Build, train ``steps`` steps under ``probe``, and return the build and the parameter facts."""
    import torch

    from fitcheck.measure.build import build_model, trainable_parameters
    from fitcheck.measure.optim import make_optimizer
    from fitcheck.measure.step import device_semantics, run_steps

    torch.manual_seed(0)
    with torch.device(device):
        built = build_model(hf_config, setup, regime, quantize=device == "cuda")
    model = built.model
    params = trainable_parameters(model)
    optimizer = make_optimizer(params, setup, regime)
    batch = built.batch(setup, device=device)
    with device_semantics(regime, emulate_cuda=device == "cpu"):
        run_steps(model, optimizer, batch, setup, regime, probe, steps, device)
    seen: dict[int, Any] = {p.untyped_storage().data_ptr(): p for p in model.parameters()}
    bits = {
        "param_bytes": sum(p.untyped_storage().nbytes() for p in seen.values()),
        "trainable_params": sum(p.numel() for p in params),
        "total_params": sum(p.numel() for p in seen.values()),
    }
    del optimizer, params, batch, model
    return built, bits


def _check_device(device: str) -> None:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise OptionError("--device cuda: no CUDA device is visible to torch")
    if device == "mps" and not torch.backends.mps.is_available():
        raise OptionError("--device mps: the MPS backend is not available")
    if device not in SEMANTICS:
        raise OptionError(f"--device {device}: use fake, cpu, cuda or mps")


def _profiler_windows(prof: Any) -> list[PhaseWindow]:
    """Split the profiler's memory events at the phase marks and take the running peak in each.

    Reads the raw Kineto events (``prof.profiler.kineto_results``): torch 2.13's ``prof.events()``
    folds allocation records into the ops that made them and drops the frees that happen outside
    any op (a Python ``del``), which a running sum needs.
    """
    marks = []
    mem = []
    for i, e in enumerate(prof.profiler.kineto_results.events()):
        name = e.name()
        if name.startswith(MARK):
            phase, step = name[len(MARK) :].split("@")
            marks.append((e.start_ns(), e.start_ns() + e.duration_ns(), phase, int(step)))
        elif name == "[memory]" and e.device_type().name == "CPU":
            mem.append((e.start_ns(), i, int(e.nbytes())))
    mem.sort()
    marks.sort()
    windows: list[PhaseWindow] = []
    live = 0
    k = 0
    for start, end, phase, step in marks:
        while k < len(mem) and mem[k][0] < start:
            live += mem[k][2]
            k += 1
        w = PhaseWindow(phase, step, live, live, live)
        while k < len(mem) and mem[k][0] < end:
            live += mem[k][2]
            w.peak_bytes = max(w.peak_bytes, live)
            k += 1
        w.end_bytes = live
        windows.append(w)
    return windows
