"""``fitcheck measure MODEL``: trace (or run) one training step and put it beside the estimate.

Thin command: resolve the model, build the setup exactly as ``estimate`` does, estimate, measure
(`fitcheck.measure.trace.trace_step` on fake tensors by default, `fitcheck.measure.real.real_step`
with ``--device cpu|cuda|mps``), render. torch, transformers and peft are imported only when the
command runs; without them it raises `MissingExtraError`.

No ``from __future__ import annotations`` here: the command is defined inside `register` with the
option types of `fitcheck.cli`, and typer must see those annotations as objects.
"""

import sys
from enum import StrEnum
from typing import Annotated, Any

import typer

from fitcheck.errors import MissingExtraError, OptionError
from fitcheck.terminal import printable

EXTRA_HINT = (
    "fitcheck measure needs the 'torch' extra (torch, transformers, peft, safetensors); from a checkout: "
    "pip install torch==2.13.0 && pip install -e '.[torch]'"
)


class DeviceOpt(StrEnum):
    """Where the step runs: traced on fake tensors, or for real."""

    fake = "fake"
    cpu = "cpu"
    cuda = "cuda"
    mps = "mps"


class MeasureFmt(StrEnum):
    table = "table"
    json = "json"


#: Options that size diffusion runs; `measure` traces LLMs only.
DIFFUSION_ONLY = (
    "resolution", "cache_latents", "cache_text_encoder_outputs", "train_text_encoder", "fp8_base",
    "full_bf16", "full_fp16",
)  # fmt: skip

#: Engine backend to estimate for, per measurement device (fake tensors follow CUDA semantics).
BACKEND = {"fake": "cuda", "cpu": "cpu", "cuda": "cuda", "mps": "mps"}


def require_torch() -> None:
    """Raise `MissingExtraError` unless torch, transformers and peft import."""
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise MissingExtraError(EXTRA_HINT) from None


#: Steps a measurement runs at most: every step after the second repeats it (a real run's steps take
#: seconds each, and ``--steps 100000000`` ran for years before this bound).
MAX_STEPS = 100

#: Samples kept of memory over the step for --timeline (the peak of each slice is kept).
TIMELINE_POINTS = 600


def run_measure(
    model: str, setup_kw: dict[str, Any], device: str, steps: int, timeline: bool = False
) -> tuple[Any, Any, Any]:
    """Resolve, estimate and measure; returns (spec, estimate or None, MeasuredStep)."""
    from fitcheck import api
    from fitcheck.models import LlmSetup, ModelSpec

    if setup_kw.get("strategy") is not None or int(setup_kw.get("nodes") or 1) > 1:
        raise OptionError(
            "measure traces or runs one process on one device; --strategy and --nodes describe several "
            "GPUs (FSDP2 ranks are traced with torch's FSDPMemTracker by bench/calibrate_fsdp.py)"
        )
    require_torch()
    if not 2 <= steps <= MAX_STEPS:
        raise OptionError(
            f"--steps must be from 2 to {MAX_STEPS}: phases are read once optimizer states exist, from the "
            "last step (the allocator is steady after the second; more steps only take longer)"
        )
    spec = api.resolve(model)
    if not isinstance(spec, ModelSpec):
        raise OptionError(
            f"measure traces LLM training steps; {spec.name} is a diffusion model (its traces: "
            "bench/calibrate_diffusion.py)"
        )
    if spec.hf_config is None:
        raise OptionError(
            f"'{model}' has no config.json to build the model from; measure a preset id, a folder, "
            "or a config.json"
        )
    setup = api.setup_for(spec, {**setup_kw, "backend": BACKEND[device]})
    assert isinstance(setup, LlmSetup)
    est = api.estimate_setup(spec, setup)
    if device == "cpu":
        _check_ram(spec.name, est.device_bytes)
    sys.stderr.write(
        f"fitcheck: {'tracing' if device == 'fake' else 'running'} {steps} training steps of "
        f"{printable(spec.name)}"
        f" on {device}{' (fake tensors, no memory used)' if device == 'fake' else ''}...\n"
    )
    if device == "fake":
        from fitcheck.measure.trace import trace_step

        measured = trace_step(
            spec.hf_config, setup, steps=steps, timeline_points=TIMELINE_POINTS if timeline else 0
        )
    else:
        from fitcheck.measure.real import real_step

        measured = real_step(spec.hf_config, setup, device=device, steps=steps)
    return spec, est, measured


def _check_ram(name: str, need: int) -> None:
    """``--device cpu`` allocates the step for real: refused before it starts when the estimate is over
    this machine's available RAM (MemAvailable within the cgroup's room), which would end in the
    allocator's failure or the OOM killer, not in a measurement."""
    from fitcheck.hardware.env import ProbeEnv
    from fitcheck.hardware.probes import probe_cpu
    from fitcheck.units import GIB

    mem, _ = probe_cpu(ProbeEnv.real())
    if mem is not None and need > mem.usable_bytes:
        raise OptionError(
            f"measure --device cpu runs the step for real: {printable(name)} needs about "
            f"{need / GIB:.1f} GiB and this machine has {mem.usable_bytes / GIB:.1f} GiB available; drop "
            "--device to trace it on fake tensors (no memory used)"
        )


#: Training options measure does not take: the tracer steps the optimizer after backward
#: (--optimizer-in-backward would compare two different runs), and traces an unflattened batch (fake
#: tensors cannot take transformers' packed-sequence test: --padding-free is held by a real CPU step,
#: tests/test_padding_free.py).
NOT_MEASURED = (
    *DIFFUSION_ONLY,
    "gpus",
    "double_quant",
    "optimizer_in_bwd",
    "bnb_keeps_input",
    "ckpt_reentrant",
    "padding_free",
)


def register(app: typer.Typer) -> None:
    """Add ``fitcheck measure`` to the CLI, with the same setup options as ``estimate``."""
    from fitcheck import cli as c

    DeviceO = Annotated[
        DeviceOpt,
        typer.Option(
            "--device", help="fake: trace on fake tensors (no memory, CUDA semantics); or a real run"
        ),
    ]
    StepsO = Annotated[int, typer.Option("--steps", help="training steps to run (phases read from the last)")]
    MFmtO = Annotated[MeasureFmt, typer.Option("--format", "-f", help="table or json")]
    TopO = Annotated[int, typer.Option("--top", min=0, help="largest tensors at the peak to list (table)")]
    TimelineO = Annotated[
        str | None,
        typer.Option(
            "--timeline",
            help="draw memory over the traced step into FILE (.svg, .png, .html; needs the chart extra)",
        ),
    ]
    TimelineForceO = Annotated[bool, typer.Option("--force", help="overwrite an existing --timeline file")]

    @app.command()
    @c.training_options(exclude=NOT_MEASURED)
    def measure(
        model: c.ModelArg,
        device: DeviceO = DeviceOpt.fake,
        steps: StepsO = 2,
        top: TopO = 6,
        fmt: MFmtO = MeasureFmt.table,
        timeline: TimelineO = None,
        force: TimelineForceO = False,
        *,
        training: dict[str, Any],
    ) -> None:
        """Trace one training step (or run it with --device) and show it beside the estimate, per phase."""
        kw = training
        if timeline:
            _check_timeline(timeline, device.value, force)
        spec, est, measured = run_measure(model, kw, device.value, steps, timeline=bool(timeline))
        if timeline:
            from fitcheck.chart.spec import timeline_chart

            c.write_chart(timeline, force, lambda: timeline_chart(measured, est, spec.name))
        from fitcheck.measure.compare import measure_doc, measure_text

        if fmt is MeasureFmt.json:
            import json

            sys.stdout.write(json.dumps(measure_doc(spec.id, est, measured), indent=2) + "\n")
        else:
            sys.stdout.write(measure_text(spec.name, est, measured, top=top))


def _check_timeline(path: str, device: str, force: bool) -> None:
    """Refuse a --timeline that cannot be drawn before the (long) trace starts."""

    from fitcheck.chart import chart_path
    from fitcheck.chart.draw import require_chart
    from fitcheck.emitters.writer import check_destinations

    if device != "fake":
        raise OptionError(
            "--timeline draws a traced step (it needs every allocation's role); drop --device to trace it"
        )
    target = chart_path(path, "--timeline")
    require_chart()
    check_destinations([target], force)
