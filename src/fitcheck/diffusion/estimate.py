"""``estimate_diffusion``: named components per phase for a diffusion model, the same contract as LLMs.

Model states come from the regime (``fitcheck.diffusion.regime``) and the optimizer rules
(``fitcheck.diffusion.states``); everything a step allocates beyond them (saved activations,
attention scores, checkpoints, activation gradients, backward temporaries, the VAE encode and text
encoder transients, autocast weight casts) comes from the simulated step
(``fitcheck.diffusion.step``), split by category at each phase's peak. Sources: docs/diffusion.md.
"""

from __future__ import annotations

from fitcheck.assembly import assemble
from fitcheck.assembly import phase as _phase
from fitcheck.components import component
from fitcheck.diffusion import regime as rg
from fitcheck.diffusion import states
from fitcheck.diffusion.sim.core import BYTES
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.diffusion.step import StepResult, attn_kernel, simulate
from fitcheck.models import Component, DiffusionSetup, Estimate, ParamCounts

#: Simulator categories -> (component id, rule); ids and docs anchors: `fitcheck.components`.
CATEGORIES: dict[str, tuple[str, str]] = {
    "inputs": ("inputs", "noisy latents, text states, target (fp32 loss inputs)"),
    "activations": ("activations", "tensors autograd saved for backward (simulated op by op)"),
    "attention_scores": ("attention_scores", "eager attention: fp32 softmax + compute-dtype copy"),
    "checkpoints": ("checkpoints", "inputs kept by each checkpointed block"),
    "weight_casts": ("weight_casts", "autocast copies of trained fp32 weights (cached per forward)"),
    "activation_grads": ("activation_gradients", "gradients of activations alive in backward"),
    "backward_temporaries": ("backward_temporaries", "scratch of backward ops (reductions)"),
    "gradients": ("gradients", "parameter gradients produced so far"),
    "vae_encode": ("vae_encode", "VAE encoder at full resolution under no_grad (latents not cached)"),
    "text_encoder_activations": ("text_encoder_activations", "text encoder forward"),
}


def _c(name: str, value: int, rule: str) -> Component:
    return component(name, int(value), rule, "diffusion")


def model_states(spec: DiffusionSpec, setup: DiffusionSetup, step: StepResult) -> dict[str, Component]:
    """Weights per part on the device, adapters, gradients, optimizer states, step transient."""
    out: dict[str, Component] = {}
    for pl in rg.plan_parts(spec, setup):
        if not pl.on_device:
            continue
        n = pl.part.params + pl.part.buffers
        out[f"{pl.name}_weights"] = _c(
            f"{pl.name}_weights",
            n * BYTES[pl.dtype],
            f"{n:,} x {pl.dtype}" + (" (trained)" if pl.train == "full" else ""),
        )
    td = rg.trainable_dtype(setup)
    lora_b = BYTES[td] if (setup.full_bf16 or setup.full_fp16) else 4
    n_adapter = sum(_numel(s) for s in step.adapter_shapes)
    if n_adapter:
        out["adapters"] = _c(
            "adapters",
            n_adapter * lora_b,
            f"{n_adapter:,} LoRA params x {'fp32' if lora_b == 4 else td}",
        )
    full_shapes = [s for shapes in step.trainable_shapes.values() for s in shapes]
    n_full = sum(_numel(s) for s in full_shapes)
    grads = n_adapter * lora_b + n_full * BYTES[td]
    out["gradients"] = _c("gradients", grads, f"{n_adapter + n_full:,} trainable params, in their dtype")
    opt = states.state_bytes(setup.optimizer, step.adapter_shapes, lora_b)
    opt += states.state_bytes(setup.optimizer, full_shapes, BYTES[td])
    out["optimizer_states"] = _c("optimizer_states", opt, f"{setup.optimizer} states per trainable tensor")
    trans = max(
        states.step_transient_bytes(setup.optimizer, step.adapter_shapes, lora_b),
        states.step_transient_bytes(setup.optimizer, full_shapes, BYTES[td]),
    )
    out["optimizer_transient"] = _c("optimizer_transient", trans, "temporaries inside optimizer.step()")
    return out


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _sim_components(cats: dict[str, int], skip_grads: bool) -> list[Component]:
    out = []
    for cat, value in cats.items():
        if cat == "gradients" and skip_grads:
            continue
        name, rule = CATEGORIES[cat]
        out.append(_c(name, value, rule))
    return out


def estimate_diffusion(
    spec: DiffusionSpec, setup: DiffusionSetup, target_context: int | None = None
) -> Estimate:
    """Estimate one training step of ``spec`` under ``setup`` (kohya sd-scripts' regime).

    Args:
        spec: the pipeline (preset, diffusers folder or single-file checkpoint).
        setup: method, batch, resolution, precision, optimizer, caching and fp8 flags...
        target_context: CUDA context bytes of the target GPU, when one is known.

    Raises:
        OptionError: a combination kohya refuses or fitcheck does not model.
    """
    rg.check(spec, setup)
    if setup.resolution is None:
        setup = setup.model_copy(update={"resolution": spec.native_resolution})
    step = simulate(spec, setup)
    ms = model_states(spec, setup, step)
    persistent = [c for k, c in ms.items() if k.endswith("_weights") or k in ("adapters", "optimizer_states")]
    grads = ms["gradients"]
    accum = setup.grads_between_steps
    forward = _phase(
        "forward", [*persistent, *([grads] if accum else []), *_sim_components(step.forward_cats, accum)]
    )
    backward = _phase(
        "backward", [*persistent, *([grads] if accum else []), *_sim_components(step.backward_cats, accum)]
    )
    opt_step = _phase("optimizer_step", [*persistent, grads, ms["optimizer_transient"]])
    steady = sum(c.bytes for c in persistent) + grads.bytes
    n_adapter = sum(_numel(s) for s in step.adapter_shapes)
    n_full = sum(_numel(s) for shapes in step.trainable_shapes.values() for s in shapes)
    total = spec.total_params + n_adapter
    params = ParamCounts(
        total=total,
        trainable=n_adapter + n_full,
        adapter=n_adapter,
        frozen=total - n_adapter - n_full,
        quantized=0,
        embedding=0,
        lm_head=0,
    )
    est = assemble(
        model=spec.id,
        model_name=spec.name,
        model_source=spec.source_kind,
        setup=setup,
        regime=rg.regime(spec, setup),
        params=params,
        phases=(forward, backward, opt_step),
        steady_bytes=steady,
        live_tensors=step.tensors,
        target_context=target_context,
        warnings=_warnings(spec, setup),
    )
    if setup.distributed:
        from fitcheck.engine.distributed import data_parallel_only

        est = data_parallel_only(est, setup, step.tensors, f"kohya sd-scripts ({spec.name})")
    return est


def _warnings(spec: DiffusionSpec, setup: DiffusionSetup) -> tuple[str, ...]:
    w: list[str] = []
    res = setup.resolution or spec.native_resolution
    if attn_kernel(setup) == "eager" and setup.attn != "eager":
        w.append(
            "SDPA on MPS uses the math kernel in training (b x heads x N^2 fp32 scores); counted as eager"
        )
    elif setup.attn == "eager":
        w.append("eager attention keeps b x heads x N^2 score tensors per layer; use --attn sdpa or xformers")
    if res % 64:
        w.append(f"resolution {res} is not a multiple of 64: kohya buckets round it (bucket_reso_steps 64)")
    if setup.fp8_base:
        w.append(
            "fp8 base: each frozen layer's weight is cast to the compute dtype when it runs, and the casts "
            "backward needs are kept (counted); use gradient checkpointing to keep few of them alive"
        )
    if spec.family == "sdxl" and setup.precision == "fp16" and not setup.cache_latents:
        w.append("the SDXL VAE overflows in fp16: kohya users add --no_half_vae (fp32 VAE, not counted)")
    return tuple(w)
