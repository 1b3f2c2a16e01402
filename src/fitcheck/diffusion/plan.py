"""``plan_diffusion``: the fastest kohya setup that fits a target, and why each choice was made.

A pure function the planner (``fitcheck plan``, another branch) calls for diffusion models. It
searches micro-batch (powers of two up to 16, 1-2 on Apple silicon per the source documents),
gradient checkpointing, the optimizer (8-bit AdamW only on CUDA), caching (latents and text-encoder
outputs are cached whenever kohya allows: it costs no step time), fp8 base weights (LoRA) and
``full_bf16`` (full training), at the resolution asked (or stepping down to ``min_resolution``).

Speed is estimated, not measured: images/s from the denoiser's FLOPs per image (counted by the
simulator: 2 x multiply-adds of every matmul, convolution and attention), x3 for forward and
backward, x4 with checkpointing (one more forward), over the LLM planner's device model (the same
`DevicePerf` from the catalog, or the backend's labelled assumption, and the same sourced
utilisation per backend, `fitcheck.planner.throughput.UTILISATION`), plus memory-bound terms from
its bandwidth: the optimizer step over the trainable parameters, and with fp8 base the per-use cast
of every frozen weight (docs/diffusion.md, "Speed"); the ranking, not the absolute number, is what
the planner relies on.
"""

from __future__ import annotations

import itertools
import math

from pydantic import Field

from fitcheck.diffusion.estimate import estimate_diffusion
from fitcheck.diffusion.regime import check, plan_parts
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.diffusion.step import simulate
from fitcheck.engine.verdict import judge
from fitcheck.models import DiffusionSetup, Estimate, Frozen, Target
from fitcheck.planner.device import catalog_id, default_perf, perf_from_entry
from fitcheck.planner.models import DevicePerf
from fitcheck.planner.throughput import UTILISATION
from fitcheck.progress import Progress, current
from fitcheck.units import GB, GIB

#: Bytes read and written per trainable parameter by one optimizer step (param, grad, states).
STEP_BYTES = {"adamw": 28, "adamw8bit": 16, "paged-adamw8bit": 16, "adafactor": 16, "lion": 20}
STEP_BYTES |= {"lion8bit": 14, "prodigy": 44, "sgd": 20}
BATCHES = (1, 2, 4, 8, 16)
#: A departure from what was asked (another optimizer, fp8 base, full_bf16) must buy more than this
#: share of speed: estimated speed differences that small are within the model's noise.
DEPARTURE = 0.05


class DiffusionPlan(Frozen):
    """The chosen setup with its estimate, estimated speed and the reasons."""

    setup: DiffusionSetup
    estimate: Estimate
    target: Target
    fits: bool
    images_per_second: float = Field(description="estimated; see docs/diffusion.md#speed")
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()
    considered: int


def _device(target: Target) -> DevicePerf:
    """The target's speed figures: its catalog entry, else the backend's labelled assumption."""
    from fitcheck.hardware.catalog import find_entry

    entry = find_entry(catalog_id(target))
    return perf_from_entry(entry) if entry is not None else default_perf(target)


def images_per_second(
    spec: DiffusionSpec,
    setup: DiffusionSetup,
    tflops: float,
    bandwidth_gbps: float,
    utilisation: float = UTILISATION["cuda"][0],
) -> float:
    """Estimated training throughput of ``setup`` (see the module docstring)."""
    step = simulate(spec, setup.model_copy(update={"batch_size": 1, "grad_accum": 1}))
    passes = 4 if setup.grad_ckpt else 3
    compute = passes * step.flops_forward / (tflops * 1e12 * utilisation)
    per_image = compute
    if setup.fp8_base:
        frozen = sum(p.part.params for p in plan_parts(spec, setup) if p.on_device and p.dtype == "fp8")
        # each use reads fp8 and writes/reads a 16-bit copy: 5 B per weight, forward (+ recompute)
        per_image += (passes - 2) * 5 * frozen / (bandwidth_gbps * GB) / setup.batch_size
    trainable = sum(math.prod(s) for s in step.adapter_shapes)
    trainable += sum(math.prod(s) for shapes in step.trainable_shapes.values() for s in shapes)
    step_time = trainable * STEP_BYTES.get(setup.optimizer, 28) / (bandwidth_gbps * GB)
    images = setup.batch_size * setup.grad_accum
    return images / (images * per_image + step_time)


def _families(spec: DiffusionSpec, setup: DiffusionSetup, res: int) -> list[list[DiffusionSetup]]:
    """Candidate setups grouped by everything but the micro-batch (ascending within a group), so
    the search can stop a group at the first batch that does not fit."""
    eff = setup.batch_size * setup.grad_accum
    batches = (1, 2) if setup.backend == "mps" else BATCHES
    if setup.backend in ("cuda", "rocm"):
        opts = [setup.optimizer, "adamw8bit", "adafactor"]
    else:
        opts = [setup.optimizer, "adafactor", "lion"]
    optimizers = list(dict.fromkeys(o for o in opts if not (setup.backend == "mps" and "8bit" in o)))
    fp8 = [setup.fp8_base]
    if setup.method == "lora" and setup.precision != "fp32" and setup.backend in ("cuda", "rocm"):
        fp8 = list(dict.fromkeys([setup.fp8_base, True]))
    fullbf16 = [setup.full_bf16]
    if setup.method == "full" and setup.precision == "bf16" and not setup.full_bf16:
        fullbf16.append(True)
    cache_te = setup.cache_text_encoder_outputs or (
        not setup.train_text_encoder and spec.family not in ("sd1", "sd2")
    )
    groups = []
    for ckpt, opt, f8, fb in itertools.product((False, True), optimizers, fp8, fullbf16):
        common = {
            "grad_ckpt": ckpt,
            "optimizer": opt,
            "fp8_base": f8,
            "full_bf16": fb,
            "resolution": res,
            "cache_latents": True,
            "cache_text_encoder_outputs": cache_te,
        }
        groups.append(
            [
                setup.model_copy(update={**common, "batch_size": b, "grad_accum": max(1, math.ceil(eff / b))})
                for b in batches
            ]
        )
    return groups


def plan_diffusion(
    spec: DiffusionSpec,
    setup: DiffusionSetup,
    target: Target,
    min_resolution: int | None = None,
    progress: Progress | None = None,
) -> DiffusionPlan:
    """The fastest setup that fits ``target`` (or, when none does, the smallest), with reasons.

    Args:
        spec: the pipeline.
        setup: what the user asked for: method, rank, precision, resolution, optimizer, effective
            batch (``batch_size x grad_accum`` is kept as a minimum).
        target: the machine (``fitcheck.hardware.budget.resolve_target``).
        min_resolution: lowest resolution to step down to (multiples of 64) when nothing fits.
        progress: called with a short message after each setup estimated (default: the reporter
            `fitcheck.progress.reporting` installed, if any).
    """
    progress = progress or current()
    setup = setup.model_copy(update={"backend": target.backend})
    if setup.attn == "xformers" and setup.backend == "mps":
        setup = setup.model_copy(update={"attn": "sdpa"})  # never xformers on Apple silicon
    check(spec, setup)
    device = _device(target)
    tflops, bandwidth = device.tflops(setup.precision), device.bandwidth_gbps
    util = UTILISATION[device.backend][0]
    res0 = setup.resolution or spec.native_resolution
    if min_resolution is not None and min_resolution > res0:
        from fitcheck.errors import OptionError

        raise OptionError(
            f"--min-resolution {min_resolution} is above the resolution planned ({res0}): it is the lowest "
            "to step down to"
        )
    floor = min_resolution or res0
    resolutions = [res0, *range((res0 - 64) // 64 * 64, floor - 1, -64)]
    considered = 0
    best: tuple[float, int, DiffusionSetup, Estimate] | None = None
    smallest: tuple[int, DiffusionSetup, Estimate] | None = None
    for res in resolutions:
        for group in _families(spec, setup, res):
            for cand in group:
                try:
                    est = estimate_diffusion(spec, cand, target.context_bytes or None)
                except OptionError:
                    break
                considered += 1
                if progress is not None:
                    progress(f"{considered} setups estimated ({res} px, micro-batch {cand.batch_size})")
                if smallest is None or est.device_bytes < smallest[0]:
                    smallest = (est.device_bytes, cand, est)
                if judge(est, target)[0] != "fits":
                    break  # a larger micro-batch needs more memory
                speed = images_per_second(spec, cand, tflops, bandwidth, util)
                key = (speed * (1 - DEPARTURE * _risk(cand, setup)), -est.device_bytes)
                if best is None or key > (best[0], best[1]):
                    best = (key[0], key[1], cand, est)
        if best is not None:
            break
    if best is None:
        assert smallest is not None, "no setup could be estimated"
        _, cand, est = smallest
        why = _reasons(spec, setup, cand, est, target)
        reasons = ("nothing fits: this is the smallest setup found", *why)
        speed = images_per_second(spec, cand, tflops, bandwidth, util)
        return DiffusionPlan(
            setup=cand,
            estimate=est,
            target=target,
            fits=False,
            images_per_second=round(speed, 4),
            reasons=reasons,
            notes=_notes(cand, device),
            considered=considered,
        )
    _, _, cand, est = best
    return DiffusionPlan(
        setup=cand,
        estimate=est,
        target=target,
        fits=True,
        images_per_second=round(images_per_second(spec, cand, tflops, bandwidth, util), 4),
        reasons=_reasons(spec, setup, cand, est, target),
        notes=_notes(cand, device),
        considered=considered,
    )


def _risk(cand: DiffusionSetup, asked: DiffusionSetup) -> int:
    """Departures from what was asked (fp8, full_bf16, another optimizer), each worth `DEPARTURE`."""
    return (
        int(cand.fp8_base and not asked.fp8_base)
        + int(cand.full_bf16 and not asked.full_bf16)
        + int(cand.optimizer != asked.optimizer)
    )


def _reasons(
    spec: DiffusionSpec, asked: DiffusionSetup, cand: DiffusionSetup, est: Estimate, target: Target
) -> tuple[str, ...]:
    fits = judge(est, target)[0] == "fits"
    tc = " (Tensor Cores prefer 4, 8, 16: source documents)" if cand.batch_size in (4, 8, 16) else ""
    out = [
        f"micro-batch {cand.batch_size} x accumulation {cand.grad_accum}: "
        + (f"the fastest that fits{tc}" if fits else "the smallest")
        + f"; {est.device_bytes / GIB:.1f} GiB of a {target.budget_bytes / GIB:.1f} GiB budget"
        + f" on {target.id}",
        "latents cached: the VAE encodes once and leaves the GPU (color_aug and random_crop stay off)",
    ]
    if cand.cache_text_encoder_outputs:
        out.append("text-encoder outputs cached: the encoders leave the GPU (no caption shuffle or dropout)")
    out.append(
        "gradient checkpointing on: needed to fit (one more forward per step, about 30% slower)"
        if cand.grad_ckpt
        else "gradient checkpointing off: it fits without it, and it would cost a forward pass per step"
    )
    if cand.optimizer != asked.optimizer:
        out.append(f"optimizer {cand.optimizer} instead of {asked.optimizer}: smaller optimizer states")
    if cand.fp8_base and not asked.fp8_base:
        out.append("fp8 base weights: halves the frozen weights; each layer is cast when used (slower)")
    if cand.full_bf16 and not asked.full_bf16:
        out.append("full_bf16: bf16 weights and gradients (no fp32 copy), as kohya's 24 GB SDXL recipe")
    attn = "sdpa" if cand.attn in ("sdpa", "flash") else cand.attn
    out.append(
        f"attention: {attn}"
        + (" (never xformers on Apple silicon: CUDA-only)" if target.backend == "mps" else " (O(N) memory)")
    )
    res = cand.resolution or spec.native_resolution
    if res != (asked.resolution or spec.native_resolution):
        out.append(f"resolution lowered to {res}px: the asked resolution did not fit")
    return tuple(out)


def _notes(cand: DiffusionSetup, device: DevicePerf) -> tuple[str, ...]:
    notes = [
        "bucketing: kohya keeps about resolution^2 pixels per bucket (enable_bucket), so other aspect "
        "ratios need about the same memory as the square resolution estimated here",
    ]
    if device.assumed:
        notes.append(f"speed figures assumed (images/s for ranking only): {'; '.join(device.assumed)}")
    return tuple(notes)
