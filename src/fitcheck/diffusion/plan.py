"""The diffusion workload of the planner loop: kohya setups, their memory and speed, and why.

``plan_diffusion`` runs `fitcheck.planner.loop` over `DiffusionWorkload`. Its search space: tiers
by resolution (as asked, then 64 px lower down to ``min_resolution``; the loop stops at the first
resolution where something fits); in each, families by checkpointing, optimizer (8-bit AdamW only
on CUDA), fp8 base weights (LoRA) and ``full_bf16`` (full training), each family over micro-batches
(powers of two up to 16, 1-2 on Apple silicon per the source documents) so the loop stops a family
at its first micro-batch that does not fit. Latents and text-encoder outputs are cached whenever
kohya allows: it costs no step time.

Speed is estimated, not measured (`image_throughput`): images/s from the denoiser's FLOPs per image
(counted by the simulator: 2 x multiply-adds of every matmul, convolution and attention), x3 for
forward and backward, x4 with checkpointing (one more forward), over the planner's one device model
(`DevicePerf` from the catalog, or the backend's labelled assumption) and the sourced utilisation per
backend (`fitcheck.facts.speed.UTILISATION`), plus memory-bound terms over its bandwidth: the
optimizer step over the trainable parameters (`fitcheck.facts.speed.STEP_BYTES`), and with fp8 base
the per-use cast of every frozen weight (docs/diffusion.md, "Speed"); the ranking, not the absolute
number, is what the planner relies on. A departure from what was asked (another optimizer, fp8
base, full_bf16) must buy more than `DEPARTURE` of speed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence

from fitcheck.diffusion.estimate import estimate_diffusion
from fitcheck.diffusion.regime import check, plan_parts
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.diffusion.step import simulate
from fitcheck.engine.verdict import verdict
from fitcheck.errors import OptionError
from fitcheck.facts.speed import UTILISATION, step_bytes
from fitcheck.models import DiffusionSetup, Estimate, SetupKind, Target
from fitcheck.planner import loop
from fitcheck.planner.device import catalog_id, default_perf, perf_from_entry
from fitcheck.planner.models import (
    Change,
    DevicePerf,
    DiffusionCandidate,
    DiffusionRequest,
    EnvVar,
    ImageThroughput,
    Plan,
    Reason,
    change_of,
)
from fitcheck.planner.rules import reason_for
from fitcheck.progress import Progress, current
from fitcheck.units import GB, GIB

BATCHES = (1, 2, 4, 8, 16)
#: A departure from what was asked (another optimizer, fp8 base, full_bf16) must buy more than this
#: share of speed: estimated speed differences that small are within the model's noise.
DEPARTURE = 0.05
#: Resolution steps (kohya buckets in multiples of 64 px).
RES_STEP = 64
#: The lowest resolution suggested when nothing fits.
MIN_SUGGESTED_RES = 256


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
    return _speed(spec, setup, tflops, bandwidth_gbps, utilisation)[0]


def _speed(
    spec: DiffusionSpec, setup: DiffusionSetup, tflops: float, bandwidth_gbps: float, utilisation: float
) -> tuple[float, float, float]:
    """(images/s, FLOPs per image, seconds per optimizer step)."""
    step = simulate(spec, setup.model_copy(update={"batch_size": 1, "grad_accum": 1}))
    passes = 4 if setup.grad_ckpt else 3
    per_image = passes * step.flops_forward / (tflops * 1e12 * utilisation)
    if setup.fp8_base:
        frozen = sum(p.part.params for p in plan_parts(spec, setup) if p.on_device and p.dtype == "fp8")
        # each use reads fp8 and writes/reads a 16-bit copy: 5 B per weight, forward (+ recompute)
        per_image += (passes - 2) * 5 * frozen / (bandwidth_gbps * GB) / setup.batch_size
    trainable = sum(math.prod(s) for s in step.adapter_shapes)
    trainable += sum(math.prod(s) for shapes in step.trainable_shapes.values() for s in shapes)
    step_time = trainable * step_bytes(setup.optimizer) / (bandwidth_gbps * GB)
    images = setup.batch_size * setup.grad_accum
    seconds = images * per_image + step_time
    return images / seconds, passes * step.flops_forward, seconds


def image_throughput(spec: DiffusionSpec, setup: DiffusionSetup, device: DevicePerf) -> ImageThroughput:
    """The cost model's speed of ``setup`` on ``device`` (one device model for every workload)."""
    util = UTILISATION[device.backend][0]
    ips, flops, seconds = _speed(spec, setup, device.tflops(setup.precision), device.bandwidth_gbps, util)
    return ImageThroughput(images_per_s=ips, flops_per_image=flops, step_s=seconds)


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


class DiffusionWorkload:
    """kohya setups for `fitcheck.planner.loop`: search space, cost model, ranking and words."""

    kind: SetupKind = "diffusion"
    candidate_model = DiffusionCandidate
    exhaustive = False  # a lower resolution only when nothing fits at a higher one

    def __init__(
        self,
        spec: DiffusionSpec,
        asked: DiffusionSetup,
        target: Target,
        device: DevicePerf,
        resolutions: Sequence[int],
        progress: Progress | None = None,
        others: Sequence[Target] = (),
    ) -> None:
        self.spec, self.asked, self.target, self.device = spec, asked, target, device
        self.resolutions, self.progress, self.others = tuple(resolutions), progress, tuple(others)
        self.effective_batch = asked.batch_size * asked.grad_accum
        self.estimates_run = 0

    def tiers(self) -> Iterator[list[list[DiffusionSetup]]]:
        return (_families(self.spec, self.asked, res) for res in self.resolutions)

    def memory(self, setup: DiffusionSetup) -> loop.Memory | None:
        try:
            est = estimate_diffusion(self.spec, setup, self.target.context_bytes or None)
        except OptionError:
            return None  # kohya refuses it (and every larger micro-batch of the family)
        self.estimates_run += 1
        if self.progress is not None:
            where = f"{setup.resolution} px, micro-batch {setup.batch_size}"
            self.progress(f"{self.estimates_run} setups estimated ({where})")
        return loop.memory_of(est)

    def speed(self, setup: DiffusionSetup) -> ImageThroughput:
        return image_throughput(self.spec, setup, self.device)

    def rank_key(self, c: DiffusionCandidate) -> tuple[object, ...]:
        """The highest resolution, then the highest speed after departures, then the least memory."""
        return (*self.speed_key(c), c.device_bytes)

    def speed_key(self, c: DiffusionCandidate) -> tuple[object, ...]:
        """The highest resolution, then the highest speed after departures."""
        adjusted = c.throughput.images_per_s * (1 - DEPARTURE * _risk(c.setup, self.asked))
        return (*self.goal_key(c), -adjusted)

    def goal_key(self, c: DiffusionCandidate) -> tuple[object, ...]:
        """The highest resolution."""
        return (-(c.setup.resolution or self.spec.native_resolution),)

    def signature(self, c: DiffusionCandidate) -> tuple[object, ...]:
        s = c.setup
        return (s.resolution, s.batch_size, s.grad_ckpt, s.optimizer, s.fp8_base, s.full_bf16)

    def why_not(self, c: DiffusionCandidate, chosen: DiffusionCandidate) -> str:
        return _why_not(c, chosen, self.asked)

    def reasons(self, chosen: DiffusionCandidate, ranked: Sequence[DiffusionCandidate]) -> list[Reason]:
        return _reasons(self.spec, self.asked, chosen, self.target)

    def env(self, chosen: DiffusionCandidate) -> tuple[EnvVar, ...]:
        return ()

    def changes(self, ranked: Sequence[DiffusionCandidate]) -> list[Change]:
        frugal = min(ranked, key=lambda c: c.device_bytes).setup
        tight = loop.tight_choice(self, ranked)  # beside a tight plan: its own settings on a bigger device
        tally = loop.Tally()
        current = tight.setup if tight is not None else frugal
        out = _changes(self.spec, frugal, self.target, self.others, tally, current)
        self.estimates_run += tally.estimates  # the plan says what the changes cost too
        if self.progress is not None and tally.estimates:
            self.progress(f"{self.estimates_run} setups estimated (what would fit the likely range)")
        return out

    def estimate(self, setup: DiffusionSetup) -> Estimate:
        est = estimate_diffusion(self.spec, setup, self.target.context_bytes or None)
        return est.model_copy(update={"target": verdict(est, self.target)})

    def notes(self, chosen: DiffusionCandidate | None) -> tuple[str, ...]:
        return (
            "bucketing: kohya keeps about resolution^2 pixels per bucket (enable_bucket), so other aspect "
            "ratios need about the same memory as the square resolution estimated here",
        )


def plan_diffusion(
    spec: DiffusionSpec,
    setup: DiffusionSetup,
    target: Target,
    min_resolution: int | None = None,
    progress: Progress | None = None,
    others: Sequence[Target] = (),
) -> Plan:
    """The fastest setup that fits ``target`` (or, when none does, the least need and what would fit).

    Args:
        spec: the pipeline.
        setup: what the user asked for: method, rank, precision, resolution, optimizer, effective
            batch (``batch_size x grad_accum`` is kept as a minimum).
        target: the machine (``fitcheck.hardware.budget.resolve_target``).
        min_resolution: lowest resolution to step down to (multiples of 64) when nothing fits.
        progress: called with a short message after each setup estimated (default: the reporter
            `fitcheck.progress.reporting` installed, if any).
        others: catalog devices of the same backend, for "a bigger device" when nothing fits.
    """
    asked = _as_asked(spec, setup, target)
    res0 = asked.resolution or spec.native_resolution
    if min_resolution is not None and min_resolution > res0:
        raise OptionError(
            f"--min-resolution {min_resolution} is above the resolution planned ({res0}): it is the lowest "
            "to step down to"
        )
    floor = min_resolution or res0
    resolutions = [res0, *range((res0 - RES_STEP) // RES_STEP * RES_STEP, floor - 1, -RES_STEP)]
    device = _device(target)
    w = DiffusionWorkload(spec, asked, target, device, resolutions, progress or current(), others)
    req = DiffusionRequest(
        base=asked, effective_batch=asked.batch_size * asked.grad_accum, min_resolution=min_resolution
    )
    return loop.make(w, loop.Asked(spec.id, spec.name, target, device, req))


def _as_asked(spec: DiffusionSpec, setup: DiffusionSetup, target: Target) -> DiffusionSetup:
    """The setup as asked, on the target's backend (never xformers on Apple silicon), checked."""
    setup = setup.model_copy(update={"backend": target.backend})
    if setup.attn == "xformers" and setup.backend == "mps":
        setup = setup.model_copy(update={"attn": "sdpa"})  # never xformers on Apple silicon
    check(spec, setup)
    return setup


def _risk(cand: DiffusionSetup, asked: DiffusionSetup) -> int:
    """Departures from what was asked (fp8, full_bf16, another optimizer), each worth `DEPARTURE`."""
    return len(_departures(cand, asked))


def _departures(cand: DiffusionSetup, asked: DiffusionSetup) -> list[str]:
    out = ["fp8 base weights"] if cand.fp8_base and not asked.fp8_base else []
    out += ["full_bf16"] if cand.full_bf16 and not asked.full_bf16 else []
    out += [f"optimizer {cand.optimizer}"] if cand.optimizer != asked.optimizer else []
    return out


def _why_not(c: DiffusionCandidate, chosen: DiffusionCandidate, asked: DiffusionSetup) -> str:
    """Why a runner-up that meets the choice's verdict lost (the loop words the ones that do not): "fits",
    or "tight too" when the choice is tight."""
    mine, best = c.throughput.images_per_s, chosen.throughput.images_per_s
    fits = "fits" if c.fits else "tight too"
    if c.setup.resolution != chosen.setup.resolution:  # a tight choice keeps the higher resolution
        return f"{fits}, but at {c.setup.resolution} px instead of {chosen.setup.resolution} px"
    if mine < best:
        return f"{fits}, {_pct(1 - mine / best)} slower ({mine:.3g} vs {best:.3g} images/s)"
    extra = [d for d in _departures(c.setup, asked) if d not in _departures(chosen.setup, asked)]
    if extra:
        return (
            f"{fits} and {_pct(mine / best - 1)} faster, but {', '.join(extra)} departs from what was asked "
            f"and must buy more than {100 * DEPARTURE:.0f}% of speed"
        )
    return f"{fits} at the same estimated speed with more memory ({c.device_bytes / GIB:.2f} GiB)"


def _pct(share: float) -> str:
    return f"{100 * share:.1f}%" if share >= 0.001 else "under 0.1%"


def _r(rule: str, choice: str, text: str) -> Reason:
    rid, ch, txt, src = reason_for(rule, choice, text)
    return Reason(rule=rid, choice=ch, text=txt, source=src)


def _reasons(
    spec: DiffusionSpec, asked: DiffusionSetup, chosen: DiffusionCandidate, target: Target
) -> list[Reason]:
    """One reason per decided setting, each with its rule (`fitcheck.planner.rules`) and source."""
    cand = chosen.setup
    tc = " (Tensor Cores prefer 4, 8, 16: source documents)" if cand.batch_size in (4, 8, 16) else ""
    fits = "fits" if chosen.fits else "fits at its central estimate (tight)"
    why = (
        "the fastest that fits"
        if chosen.fits
        else "of the tight ones, the one whose likely range reaches least"
    )
    out = [
        _r(
            "throughput",
            "micro-batch",
            f"micro-batch {cand.batch_size} x accumulation {cand.grad_accum}: {why}{tc}; "
            f"{chosen.device_bytes / GIB:.1f} GiB of a {target.budget_bytes / GIB:.1f} GiB budget"
            f" on {target.id}",
        ),
        _r(
            "diffusion-cache",
            "caching",
            "latents cached: the VAE encodes once and leaves the GPU (color_aug and random_crop stay off)",
        ),
    ]
    if cand.cache_text_encoder_outputs:
        text = "text-encoder outputs cached: the encoders leave the GPU (no caption shuffle or dropout)"
        out.append(_r("diffusion-cache", "caching", text))
    out.append(
        _r(
            "grad-ckpt",
            "checkpointing",
            "gradient checkpointing on: needed to fit (one more forward per step, about 30% slower)"
            if cand.grad_ckpt
            else f"gradient checkpointing off: it {fits} without it, and it would cost a forward pass "
            "per step",
        )
    )
    out += _departure_reasons(cand, asked)
    attn = "sdpa" if cand.attn in ("sdpa", "flash") else cand.attn
    mac = " (never xformers on Apple silicon: CUDA-only)" if target.backend == "mps" else " (O(N) memory)"
    out.append(_r("diffusion-attention", "attention", f"attention: {attn}{mac}"))
    res = cand.resolution or spec.native_resolution
    if res != (asked.resolution or spec.native_resolution):
        text = f"resolution lowered to {res}px: the asked resolution did not fit"
        out.append(_r("diffusion-resolution", "resolution", text))
    return out


def _departure_reasons(cand: DiffusionSetup, asked: DiffusionSetup) -> list[Reason]:
    out = []
    if cand.optimizer != asked.optimizer:
        text = f"optimizer {cand.optimizer} instead of {asked.optimizer}: smaller optimizer states"
        out.append(_r("diffusion-departure", "optimizer", text))
    if cand.fp8_base and not asked.fp8_base:
        text = "fp8 base weights: halves the frozen weights; each layer is cast when used (slower)"
        out.append(_r("diffusion-departure", "fp8 base", text))
    if cand.full_bf16 and not asked.full_bf16:
        text = "full_bf16: bf16 weights and gradients (no fp32 copy), as kohya's 24 GB SDXL recipe"
        out.append(_r("diffusion-departure", "full_bf16", text))
    return out


def _fits_on(
    spec: DiffusionSpec, setup: DiffusionSetup, target: Target, tally: loop.Tally
) -> loop.Memory | None:
    """The setup's memory when its band's high edge fits the target's budget, else None (one estimate)."""
    try:
        est = estimate_diffusion(spec, setup, target.context_bytes or None)
    except OptionError:
        return None
    tally.estimates += 1
    mem = loop.memory_of(est)._replace(host_bytes=None)
    return mem if loop.fit_verdict(mem, target) == "fits" else None


def _change(change: str, flag: str, mem: loop.Memory, target: Target) -> Change:
    return change_of(change, flag, mem.device_bytes, target.budget_bytes, mem.high_bytes)


def _changes(
    spec: DiffusionSpec,
    frugal: DiffusionSetup,
    target: Target,
    others: Sequence[Target],
    tally: loop.Tally,
    current: DiffusionSetup | None = None,
) -> list[Change]:
    """When nothing fits, or the plan is only tight: a lower resolution for the least-memory setup found;
    a bigger device, the smallest whose budget holds ``current``'s likely range (beside a tight plan its
    chosen setup, as the user would run it; when nothing fits the least-memory one). Each is checked
    against the band's high edge (one estimate per resolution step or device tried, counted in
    ``tally``)."""
    current = current if current is not None else frugal
    out: list[Change] = []
    res = (frugal.resolution or spec.native_resolution) - RES_STEP
    while res >= MIN_SUGGESTED_RES:
        mem = _fits_on(spec, frugal.model_copy(update={"resolution": res}), target, tally)
        if mem is not None:
            change = f"a resolution of {res}px (bucketing keeps about res^2 pixels)"
            out.append(_change(change, f"--min-resolution {res}", mem, target))
            break
        res -= RES_STEP
    pool = sorted(
        (t for t in others if t.backend == target.backend and t.budget_bytes > target.budget_bytes),
        key=lambda t: (t.budget_bytes, t.id),
    )
    for t in (t for t in pool if t.bf16 or current.precision != "bf16"):  # bf16 only where the device has it
        mem = _fits_on(spec, current.model_copy(update={"backend": t.backend}), t, tally)
        if mem is not None:
            change = f"a bigger device: {t.name} ({t.budget_bytes / GIB:.1f} GiB budget)"
            out.append(_change(change, f"--on {t.id}", mem, t))
            break
    return out
