"""One simulated training step: build the parts, apply the regime, run the step through the simulator.

The step is kohya's ``process_batch``: (latents not cached) VAE encode under ``no_grad``; (outputs
not cached) the text encoders, with gradients when they train; the denoiser under
``accelerator.autocast()``; an fp32 MSE loss; backward. What the simulator returns is everything
beyond the model states (weights, gradients kept after the step, optimizer states), which
``fitcheck.diffusion.estimate`` adds from the regime.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any

from fitcheck.diffusion.arch import build
from fitcheck.diffusion.arch.common import Run
from fitcheck.diffusion.regime import PartPlan, compute_dtype, plan_parts, trainable_dtype
from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import BYTES, Sim, T, simulating
from fitcheck.diffusion.sim.line import Lin, Line, LineSim, NotLinear
from fitcheck.diffusion.sim.nn import Conv2d, Linear, Module, lora_targets
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.models import DiffusionSetup
from fitcheck.units import MIB

#: kohya's LoRA targets: the module classes each network module wraps (networks/lora.py,
#: lora_flux.py, lora_sd3.py ``*_TARGET_REPLACE_MODULE``); conv LoRA adds the 3x3 classes.
LORA_CLASSES: dict[str, tuple[str, ...]] = {
    "unet": ("Transformer2DModel",),
    "unet_conv": ("Transformer2DModel", "ResnetBlock2D", "Downsample2D", "Upsample2D"),
    "flux": ("DoubleStreamBlock", "SingleStreamBlock"),
    "sd3": ("SingleDiTBlock",),
    "clip": ("CLIPAttention", "CLIPMLP"),
}
#: The VAE's spatial reduction (8 for every supported family: 4 resolution levels).
VAE_FACTOR = 8


@dataclass
class StepResult:
    """Peaks of the step beyond model states, by category, plus what the states are sized from."""

    forward_peak: int
    forward_cats: dict[str, int]
    backward_peak: int
    backward_cats: dict[str, int]
    trainable_shapes: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    adapter_shapes: list[tuple[int, ...]] = field(default_factory=list)
    flops_forward: int = 0
    tensors: int = 0
    notes: list[str] = field(default_factory=list)


def attn_kernel(setup: DiffusionSetup) -> str:
    """The attention the memory follows: eager keeps scores; so does SDPA on MPS (math backend)."""
    if setup.attn == "eager" or (setup.backend == "mps" and setup.attn in ("sdpa", "flash")):
        return "eager"
    return "sdpa"


def latent_size(setup: DiffusionSetup, spec: DiffusionSpec) -> tuple[int, int]:
    res = setup.resolution or spec.native_resolution
    return res // VAE_FACTOR, res // VAE_FACTOR


def _apply(
    mod: Module, plan: PartPlan, setup: DiffusionSetup, classes: tuple[str, ...]
) -> list[tuple[int, ...]]:
    """Set dtypes and trainability; attach kohya LoRA modules. Returns the adapters' shapes.

    Every parameter's dtype and trainability and every layer's LoRA are (re)set, so a tree built
    once (`_tree`) serves every setup."""
    full = plan.train == "full"
    for _, m in mod.named_modules():
        if isinstance(m, Linear | Conv2d):
            m.lora = None
    for _, p in mod.named_params():
        p.dtype = plan.dtype
        p.trainable = full and p.kind != "buffer"
    shapes: list[tuple[int, ...]] = []
    if plan.train != "lora":
        return shapes
    lora_dtype = trainable_dtype(setup) if (setup.full_bf16 or setup.full_fp16) else "fp32"
    conv = setup.lora_targets == "conv"
    for _, m in lora_targets(mod, classes):
        # Linear and 1x1 conv layers get network_dim; 3x3 convs only with conv LoRA (conv_dim).
        if not (isinstance(m, Linear) or (isinstance(m, Conv2d) and (m.k == 1 or conv))):
            continue
        lora = m.attach(setup.lora_rank)
        for p in (lora.down, lora.up):
            p.dtype = lora_dtype
            p.trainable = True
            shapes.append(p.shape)
    return shapes


def _lora_classes(spec: DiffusionSpec, setup: DiffusionSetup) -> tuple[str, ...]:
    if spec.family == "flux":
        return LORA_CLASSES["flux"]
    if spec.family == "sd3":
        return LORA_CLASSES["sd3"]
    return LORA_CLASSES["unet_conv" if setup.lora_targets == "conv" else "unet"]


#: The setup fields the simulated step reads. Everything else (the optimizer, the number of
#: accumulation steps beyond "more than one", LoRA alpha, the trainer) acts outside the step, in the
#: model states, so setups that differ only there share one simulation. `_run` sees a setup rebuilt
#: from these fields alone (defaults elsewhere), so it cannot read a field the cache key lacks.
STEP_FIELDS = (
    "method",
    "precision",
    "fp8_base",
    "full_bf16",
    "full_fp16",
    "train_text_encoder",
    "cache_text_encoder_outputs",
    "cache_latents",
    "lora_rank",
    "lora_targets",
    "grad_ckpt",
    "batch_size",
)


def step_key(spec: DiffusionSpec, setup: DiffusionSetup) -> tuple[tuple[str, Any], ...]:
    """What the step depends on: `STEP_FIELDS`, the attention kernel, whether gradients accumulate
    (not how often), the resolution (the native one when unset)."""
    fields = [(k, getattr(setup, k)) for k in STEP_FIELDS]
    fields.append(("attn", attn_kernel(setup)))  # "eager" or "sdpa": what the memory follows
    fields.append(("grad_accum", min(setup.grad_accum, 2)))
    fields.append(("keep_grads", setup.keep_grads))
    fields.append(("resolution", setup.resolution or spec.native_resolution))
    return tuple(fields)


def simulate(spec: DiffusionSpec, setup: DiffusionSetup) -> StepResult:
    """Run the step in the simulator (cached: the planner asks for the same steps repeatedly).

    One symbolic simulation serves every micro-batch of a setup where the simulator proves the
    step linear in the batch (`fitcheck.diffusion.sim.line`); for ``b >= 2`` when only batch 1
    differs (eager attention's ``b == 1`` view), and a direct simulation where neither holds.
    """
    spec_json, key = _spec_json(spec), step_key(spec, setup)
    b = setup.batch_size
    family = tuple(kv for kv in key if kv[0] != "batch_size")
    for lo in (1, 2):
        if b >= lo and _line(spec_json, family, lo) is not None:
            return _line_at(spec_json, family, lo, b)
    return _simulate(spec_json, key)


_SPECS: dict[int, tuple[DiffusionSpec, str]] = {}


def clear_caches() -> None:
    """Forget every cached simulation and module tree (benchmarks time a fresh process's work)."""
    for f in (_simulate, _line, _line_at, _tree):
        f.cache_clear()
    _SPECS.clear()


def _spec_json(spec: DiffusionSpec) -> str:
    """The spec as a cache key (memoised per spec object: the planner passes the same one)."""
    hit = _SPECS.get(id(spec))
    if hit is None or hit[0] is not spec:
        if len(_SPECS) > 64:
            _SPECS.clear()
        hit = (spec, json.dumps(spec.model_dump(mode="json"), sort_keys=True))
        _SPECS[id(spec)] = hit  # holds the spec, so its id is not reused while cached
    return hit[1]


@functools.lru_cache(maxsize=512)
def _simulate(spec_json: str, key: tuple[tuple[str, Any], ...]) -> StepResult:
    spec = DiffusionSpec.model_validate_json(spec_json)
    setup = DiffusionSetup(**dict(key))
    return _run(spec, setup)


@dataclass
class _Prepared:
    """The parts of one setup: module trees with the regime applied, and what the states need."""

    plans: list[PartPlan]
    mods: dict[str, Module]
    trainable: dict[str, list[tuple[int, ...]]]
    adapters: list[tuple[int, ...]]
    tensors: int


@dataclass
class _StepLine:
    line: Line
    flops: int | Lin
    parts: _Prepared


@functools.lru_cache(maxsize=64)  # about 2 MiB each (packed arrays)
def _line(spec_json: str, family: tuple[tuple[str, Any], ...], lo: int) -> _StepLine | None:
    """The symbolic step for every batch ``b >= lo``, or None where it is not linear in ``b``."""
    spec = DiffusionSpec.model_validate_json(spec_json)
    setup = DiffusionSetup(**dict(family))
    parts = _prepare(spec, setup)
    s = LineSim()
    try:
        flops = _step(s, spec, setup, parts, Lin(0, 1, lo))
    except NotLinear:
        return None
    parts.mods = {}  # the trees are shared (`_tree`); the line keeps only numbers
    parts.plans = []
    return _StepLine(s.finish(), flops, parts)


@functools.lru_cache(maxsize=512)
def _line_at(spec_json: str, family: tuple[tuple[str, Any], ...], lo: int, b: int) -> StepResult:
    sl = _line(spec_json, family, lo)
    assert sl is not None
    fw_peak, fw_cats = sl.line.peak("forward", b)
    bw_peak, bw_cats = sl.line.peak("backward", b)
    flops = sl.flops.at(b) if isinstance(sl.flops, Lin) else sl.flops
    return StepResult(
        forward_peak=fw_peak,
        forward_cats=fw_cats,
        backward_peak=bw_peak,
        backward_cats=bw_cats,
        trainable_shapes=sl.parts.trainable,
        adapter_shapes=sl.parts.adapters,
        flops_forward=flops // max(1, b),
        tensors=sl.parts.tensors,
    )


def _prepare(spec: DiffusionSpec, setup: DiffusionSetup) -> _Prepared:
    plans = plan_parts(spec, setup)
    out = _Prepared(plans, {}, {}, [], 0)
    for pl in plans:
        if not pl.on_device:
            continue
        m = _tree(pl.part.class_name, json.dumps(pl.part.config, sort_keys=True))
        classes = _lora_classes(spec, setup) if pl.part.role == "denoiser" else LORA_CLASSES["clip"]
        out.adapters += _apply(m, pl, setup, classes)
        if pl.train == "full":
            out.trainable[pl.name] = [p.shape for _, p in m.named_params() if p.trainable]
        out.tensors += _large_tensors(m)
        out.mods[pl.name] = m
    return out


def _run(spec: DiffusionSpec, setup: DiffusionSetup) -> StepResult:
    """Simulate the step at ``setup.batch_size``."""
    parts = _prepare(spec, setup)
    b = setup.batch_size
    s = Sim()
    flops = _step(s, spec, setup, parts, b)
    fw, bw = s.phases["forward"], s.phases["backward"]
    return StepResult(
        forward_peak=fw.peak,
        forward_cats=dict(fw.cats),
        backward_peak=bw.peak,
        backward_cats=dict(bw.cats),
        trainable_shapes=parts.trainable,
        adapter_shapes=parts.adapters,
        flops_forward=flops // max(1, b),
        tensors=parts.tensors,
    )


def _step(s: Sim, spec: DiffusionSpec, setup: DiffusionSetup, parts: _Prepared, b: Any) -> Any:
    """kohya's ``process_batch`` in ``s`` at batch ``b`` (an int, or a `Lin` in a `LineSim`);
    returns the denoiser's forward FLOPs."""
    plans, mods = parts.plans, parts.mods
    c = compute_dtype(setup)
    autocast = c if c != "fp32" else None
    run = Run(attn=attn_kernel(setup), ckpt=setup.grad_ckpt)
    lat = latent_size(setup, spec)
    res = (lat[0] * VAE_FACTOR, lat[1] * VAE_FACTOR)
    with simulating(s):
        s.begin("forward")
        if setup.grads_between_steps:
            _preexisting_grads(s, mods)
        vae = next((pl for pl in plans if pl.part.role == "vae" and pl.on_device), None)
        if vae is not None:
            s.default_cat = "vae_encode"
            with s.no_grad():
                latents = mods[vae.name].encode(b, res, vae.dtype, Run("sdpa"))  # type: ignore[attr-defined]
            del latents
        linked = _text_encoders(s, plans, mods, run, b, autocast)
        s.default_cat = "activations"
        den = next(pl for pl in plans if pl.part.role == "denoiser")
        model: Any = mods[den.name]
        inp = model.inputs(b, lat, spec.text_tokens, c)
        _link(inp, linked)
        if setup.grad_ckpt:
            for t in inp.values():
                t.rg = True  # kohya: noisy_latents.requires_grad_(True) (and text conds) with checkpointing
        flops0 = s.flops
        with s.autocasting(autocast):
            pred = model(inp, run)
        flops = s.flops - flops0
        target = s.new(pred.shape, "fp32", "inputs")
        loss = ops.mean_all(ops.mse(ops.to(pred, "fp32"), target))
        del pred, inp, linked
        s.begin("backward")
        s.backward(loss)
        del loss, target
    return flops


@functools.lru_cache(maxsize=16)
def _tree(class_name: str, config_json: str) -> Module:
    """A part's module tree, built once per config (`_apply` resets what a setup changes)."""
    return build(class_name, json.loads(config_json))


def _large_tensors(m: Module) -> int:
    """Tensors the caching allocator rounds up (over 1 MiB): weights, and for trained ones their
    gradient and optimizer states (counted as two more)."""
    n = 0
    for _, p in m.named_params():
        if p.numel * BYTES[p.dtype] >= MIB:
            n += 3 if p.trainable else 1
    return n


def _preexisting_grads(s: Sim, mods: dict[str, Module]) -> None:
    """With gradient accumulation (or gradients kept between steps) the next micro-batch finds ``.grad``
    allocated (counted as a state)."""
    for m in mods.values():
        for _, p in m.named_params():
            if p.trainable:
                s.param_grads[id(p)] = None
        for _, sub in m.named_modules():
            lora = getattr(sub, "lora", None)
            if lora is not None:
                s.param_grads[id(lora.down)] = None
                s.param_grads[id(lora.up)] = None


def _text_encoders(
    s: Sim, plans: list[PartPlan], mods: dict[str, Module], run: Run, b: int, autocast: str | None
) -> list[T]:
    """Run the text encoders on the device; return the outputs of those that train (they link)."""
    linked: list[T] = []
    for pl in plans:
        if pl.part.role != "text_encoder" or not pl.on_device:
            continue
        enc: Any = mods[pl.name]
        if pl.train == "none":
            s.default_cat = "text_encoder_activations"
            with s.no_grad(), s.autocasting(autocast):
                out = enc.encode(b, Run(run.attn), pl.dtype)
            del out
        else:
            s.default_cat = "text_encoder_activations"
            with s.autocasting(autocast):
                out = enc.encode(b, run, pl.dtype)
            linked.append(out)
    return linked


def _link(inp: dict[str, T], outs: list[T]) -> None:
    """Make the denoiser's text input depend on trained encoders' outputs (so backward reaches them)."""
    if outs:
        key = "context" if "context" in inp else "txt"
        old = inp[key]
        inp[key] = ops.combine(outs, old.shape, old.dtype)
