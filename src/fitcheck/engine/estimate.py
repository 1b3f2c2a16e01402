"""Assemble an estimate: named components per phase, the peak phase, reserve and context.

The peak of a training step is the maximum over its phases of what is alive then (not a plain sum):

* forward: model states (+ gradients when accumulating), saved activations, the logits/loss hump;
* backward: the same plus the loss gradients at its start, or, with checkpointing, one layer's
  recomputed activations while the gradients fill in;
* optimizer_step: model states, all gradients and the optimizer's temporaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.assembly import assemble, phase
from fitcheck.components import component
from fitcheck.engine import activations as act
from fitcheck.engine import states
from fitcheck.engine.lora import validate_targets
from fitcheck.engine.params import inventory, layer_linears
from fitcheck.engine.regimes import regime_for
from fitcheck.engine.thumb import thumb
from fitcheck.errors import OptionError
from fitcheck.models import Component, Estimate, LlmSetup, ModelSpec, ParamCounts, Phase, Regime


def _c(name: str, value: float, rule: str) -> Component:
    return component(name, value, rule, "llm")


def _check(spec: ModelSpec, setup: LlmSetup) -> None:
    if setup.method != "full":
        validate_targets(spec.arch, setup.lora_targets)
    if setup.dora and setup.method == "full":
        raise OptionError("--dora applies to LoRA and QLoRA, not --method full")
    if setup.attn == "xformers" and setup.backend == "mps":
        raise OptionError("xformers is CUDA-only and crashes on Apple silicon; use --attn sdpa")
    if setup.optimizer in ("adamw8bit", "paged-adamw8bit", "lion8bit") and setup.backend == "mps":
        raise OptionError(
            f"--optimizer {setup.optimizer} needs bitsandbytes CUDA kernels; on Apple silicon use "
            "adamw, adafactor or lion"
        )


def _tensor_count(spec: ModelSpec, setup: LlmSetup) -> int:
    a = spec.arch
    per_layer = sum(1 + lin.bias for lin in layer_linears(a, a.is_moe)) + a.norms_per_layer
    base = a.num_layers * per_layer + 3
    if setup.method == "full":
        return base * 4  # weights, gradients, two optimizer states
    return base + len(states.trainable_shapes(a, setup)) * 4


def model_states(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> dict[str, Component]:
    """Weights, adapters, master copy, optimizer states, gradients and the step transient."""
    a = spec.arch
    c = states.counts(a, setup)
    out: dict[str, Component] = {}
    for name, value in states.weight_bytes(a, setup, regime, c).items():
        rules = {
            "weights": f"{c.trainable:,} params x {regime.trainable_dtype}",
            "weights_frozen": f"{c.total - c.adapter:,} frozen params x {regime.weight_dtype}",
            "weights_4bit": f"{c.quantized:,} params in NF4: 0.5 B + 64-block absmax"
            + (" (double-quantized)" if setup.double_quant else " (fp32)"),
            "weights_unquantized": f"{c.total - c.adapter - c.quantized:,} params (embeddings, norms, "
            f"lm_head) x {'fp32 (kbit upcast)' if regime.kbit_upcast else regime.weight_dtype}",
            "adapters": f"{c.adapter:,} LoRA params x {regime.adapter_dtype}",
        }
        out[name] = _c(name, value, rules[name])
    out["master_weights"] = _c(
        "master_weights", states.master_bytes(regime, c), "fp32 copy of trainable weights"
    )
    opt = states.optimizer_state_bytes(a, setup, regime)
    out["optimizer_states"] = _c("optimizer_states", opt, f"{setup.optimizer} states")
    grads = states.grad_bytes(setup, regime, c)
    out["gradients"] = _c("gradients", grads, f"{c.trainable:,} x {regime.grad_dtype}")
    trans = states.step_transient_bytes(a, setup, regime)
    out["optimizer_transient"] = _c(
        "optimizer_transient",
        trans,
        "fused step: none"
        if regime.fused_optimizer and trans == 0
        else "temporaries inside optimizer.step()",
    )
    return out


#: Model-state components alive through the whole step, in the order phases list them.
PERSISTENT: tuple[str, ...] = ("weights", "weights_frozen", "weights_4bit", "weights_unquantized")
PERSISTENT += ("adapters", "master_weights", "optimizer_states")


@dataclass(frozen=True)
class Saved:
    """What the forward pass keeps for backward, and the transients around it, by the moment they live."""

    inputs: Component
    saved: tuple[Component, ...]  # activations and scores, or checkpoints; the final norm's input
    logits_fwd: Component  # the loss hump at the end of the forward
    logits_bwd: Component  # ... and at the start of backward
    casts_fwd: Component  # autocast weight casts alive in forward / at backward's start / late
    casts_bwd: Component
    casts_layer: Component
    merged_fwd: Component  # MoE experts merged with their LoRA factors: all layers / one layer
    merged_layer: Component
    dequant: Component  # one 4-bit weight dequantized
    late: Component  # one layer's activations late in backward
    tied: Component  # tied embedding gradients at the very end of backward


def saved_activations(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Saved:
    """Activations saved for backward (all layers, or checkpoints), the loss hump and the transients."""
    a = spec.arch
    T, s, L = setup.tokens, setup.seq_len, a.num_layers
    moe_n = a.moe_layers if a.is_moe else 0
    dense = act.layer_activations(a, setup, regime, moe=False)
    sparse = act.layer_activations(a, setup, regime, moe=True) if moe_n else dense
    per_layer_tok = dense.total(s)
    ctx = act.context(setup, regime)
    final_norm = _c("final_norm", T * 4 * a.hidden_size, "final norm fp32 input")
    if setup.grad_ckpt:
        ckpt = T * L * ctx.rho * a.hidden_size
        ckpt_rule = "one layer input per layer (non-reentrant checkpoint)"
        saved: tuple[Component, ...] = (_c("checkpoints", ckpt, ckpt_rule), final_norm)
    else:
        all_layers = T * ((L - moe_n) * per_layer_tok + moe_n * sparse.total(s))
        scores = T * s * L * dense.scores
        per_tok = f"{L} layers x {per_layer_tok - s * dense.scores:,.0f} B/token"
        scores_rule = "eager: fp32 softmax + compute-dtype copy, b*heads*s^2 per layer"
        saved = (
            _c("activations", all_layers - scores, per_tok),
            _c("attention_scores", scores, scores_rule),
            final_norm,
        )
    lg = act.logits_bytes(a, setup, regime)
    # Late in backward nearly every gradient exists while the first layer's activations are still
    # alive (recomputed from its checkpoint when checkpointing; the other checkpoints are freed).
    late = _c(
        "layer_recompute" if setup.grad_ckpt else "activations",
        T * max(per_layer_tok, sparse.total(s)),
        "one layer's activations "
        + ("recomputed from its checkpoint" if setup.grad_ckpt else "(the first layer's, last to be freed)"),
    )
    casts_fwd, casts_bwd, casts_layer = _casts(spec, setup, regime)
    merged_fwd, merged_layer = _merged_experts(spec, setup, regime)
    return Saved(
        inputs=_c("inputs", 16 * T, "input_ids + labels, int64"),
        saved=saved,
        logits_fwd=_c("logits_loss", T * lg["forward"], "lm_head output + fp32 upcast + log-softmax"),
        logits_bwd=_c("logits_loss", T * lg["backward"], "saved log-softmax + fp32 grads at loss backward"),
        casts_fwd=casts_fwd,
        casts_bwd=casts_bwd,
        casts_layer=casts_layer,
        merged_fwd=merged_fwd,
        merged_layer=merged_layer,
        dequant=_dequant(spec, setup, regime),
        late=late,
        tied=_tied_grads(spec, setup, regime),
    )


def _dequant(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Component:
    dq = 0.0
    if setup.method == "qlora":
        a = spec.arch
        lins = (lin.d_in * lin.d_out for lin in layer_linears(a, a.is_moe) if lin.role != "router")
        dq = max(lins, default=0) * act.context(setup, regime).gamma
    return _c("dequant_transient", dq, "one 4-bit weight dequantized to the compute dtype")


def _casts(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> tuple[Component, Component, Component]:
    """Autocast weight casts alive in forward, at the start of backward, and late (one layer)."""
    copies_all, copies_head, copies_layer = autocast_copies(spec, setup, regime)
    if setup.grad_ckpt:
        # the autocast cache keeps trainable weights' casts until the forward ends; frozen weights'
        # casts live only where a matmul saved them (lm_head; the layer being recomputed)
        cast_fwd = copies_all if setup.method == "full" else copies_head
        cast_bwd = copies_head
    else:
        cast_fwd = cast_bwd = copies_all
    rule = "bf16 casts of fp32 weights made by autocast and saved for backward"
    return tuple(_c("autocast_weight_copies", n, rule) for n in (cast_fwd, cast_bwd, copies_layer))  # type: ignore[return-value]


def _merged_experts(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> tuple[Component, Component]:
    a = spec.arch
    moe_n = a.moe_layers if a.is_moe else 0
    merged = act.merged_expert_bytes(a, setup, regime)
    rule = "experts' weights merged with their LoRA factors (peft ParamWrapper), saved per layer"
    all_layers = _c("merged_expert_weights", merged * (1 if setup.grad_ckpt else moe_n), rule)
    return all_layers, _c("merged_expert_weights", merged, rule)


def _tied_grads(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Component:
    """Tied embeddings trained: at the very end the lm_head's weight gradient (held since the loss
    backward), the embedding's own and their sum coexist (traced on Gemma 2 9B)."""
    tied = 0
    if setup.method == "full" and spec.arch.tie_embeddings:
        tied = 2 * inventory(spec.arch).embedding * int(states.BYTES[regime.grad_dtype])
    return _c("tied_embedding_grads", tied, "lm_head and embedding gradients before they are summed")


def step_phases(ms: dict[str, Component], sv: Saved, accumulating: bool) -> tuple[Phase, Phase, Phase]:
    """What is alive at the peak of forward, backward (its start, late, or end) and the optimizer step."""
    persistent = [ms[k] for k in PERSISTENT if k in ms]
    grads = ms["gradients"]
    grads_fwd = grads if accumulating else _c("gradients", 0, "")
    held = [*persistent, grads_fwd, sv.inputs, *sv.saved]
    forward = phase("forward", [*held, sv.casts_fwd, sv.merged_fwd, sv.logits_fwd, sv.dequant])
    bwd_start = [*held, sv.casts_bwd, sv.merged_fwd, sv.logits_bwd]
    bwd_late = [*persistent, grads, sv.inputs, sv.late, sv.dequant, sv.casts_layer, sv.merged_layer]
    bwd_end = [*persistent, grads, sv.inputs, sv.tied]
    candidates = (phase("backward", c) for c in (bwd_start, bwd_late, bwd_end))
    backward = max(candidates, key=lambda p: p.total_bytes)
    step = phase("optimizer_step", [*persistent, grads, ms["optimizer_transient"]])
    return forward, backward, step


def estimate(spec: ModelSpec, setup: LlmSetup, target_context: int | None = None) -> Estimate:
    """Estimate the memory of one training step of ``spec`` under ``setup``.

    Named steps: the regime (dtypes), model states, saved activations, the three phases, then the
    one assembly shared with the diffusion estimator (`fitcheck.assembly.assemble`).

    Args:
        spec: the model.
        setup: method, batch, sequence, precision, optimizer, ... and the trainer regime.
        target_context: CUDA context bytes of the target GPU, when one is known.
    """
    _check(spec, setup)
    regime = regime_for(setup)
    ms = model_states(spec, setup, regime)
    sv = saved_activations(spec, setup, regime)
    phases = step_phases(ms, sv, setup.grad_accum > 1)
    c = states.counts(spec.arch, setup)
    inv = inventory(spec.arch)
    params = ParamCounts(
        total=c.total,
        trainable=c.trainable,
        adapter=c.adapter,
        frozen=c.total - c.trainable,
        quantized=c.quantized,
        embedding=inv.embedding,
        lm_head=inv.lm_head,
    )
    est = assemble(
        model=spec.id,
        model_name=spec.name,
        model_source=spec.source_kind,
        setup=setup,
        regime=regime,
        params=params,
        phases=phases,
        steady_bytes=sum(ms[k].bytes for k in (*PERSISTENT, "gradients") if k in ms),
        live_tensors=_tensor_count(spec, setup),
        target_context=target_context,
        thumb=thumb(c.total - c.adapter, setup),
        warnings=_warnings(spec, setup, c.total - c.adapter),
    )
    if setup.distributed:
        from fitcheck.engine.distributed import distribute

        est = distribute(spec, setup, est, _tensor_count(spec, setup))
    return est


def autocast_copies(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> tuple[int, int, int]:
    """Bytes of compute-dtype weight casts autocast makes from fp32 weights: (all, lm_head, one layer).

    Under autocast an fp32 weight is cast for every matmul; a matmul whose input needs a gradient
    saves the cast copy (traced: ``_to_copy`` of the lm_head weight alive at the backward peak).
    4-bit weights are dequantized instead (``dequant_transient``).
    """
    if not regime.autocast:
        return 0, 0, 0
    a = spec.arch
    ctx = act.context(setup, regime)
    full = setup.method == "full"
    layer_dtype = regime.trainable_dtype if full else regime.weight_dtype
    head_dtype = "fp32" if regime.kbit_upcast else layer_dtype
    inv = inventory(a)
    head = (inv.lm_head or inv.embedding) * ctx.gamma if states.BYTES[head_dtype] != ctx.gamma else 0
    if setup.method == "qlora" or states.BYTES[layer_dtype] == ctx.gamma:
        return head, head, 0
    moe_n = a.moe_layers if a.is_moe else 0
    per_dense = sum(lin.d_in * lin.d_out * lin.copies for lin in layer_linears(a, False))
    per_moe = sum(lin.d_in * lin.d_out * lin.copies for lin in layer_linears(a, True)) if moe_n else 0
    layers = (a.num_layers - moe_n) * per_dense + moe_n * per_moe
    return layers * ctx.gamma + head, head, max(per_dense, per_moe) * ctx.gamma


def _warnings(spec: ModelSpec, setup: LlmSetup, derived: int) -> tuple[str, ...]:
    w: list[str] = []
    declared = spec.declared_params
    if spec.source_kind == "safetensors" and declared and abs(declared - derived) > 0.01 * declared:
        w.append(
            f"the safetensors headers hold {declared:,} parameters but the config describes {derived:,}; "
            "the estimate follows the config (extra tensors such as a vision tower are not modelled)"
        )
    if setup.method == "qlora" and setup.trainer == "hf" and not setup.grad_ckpt:
        w.append(
            "peft's prepare_model_for_kbit_training turns gradient checkpointing on by default "
            "(use_gradient_checkpointing=True); add --grad-ckpt to estimate that run"
        )
    if setup.method == "qlora" and setup.backend == "mps":
        w.append(
            "bitsandbytes 4-bit weights work on MPS only in recent releases; MLX with a 4-bit model "
            "is the native path on Apple silicon (--trainer mlx)"
        )
    if setup.backend == "mps" and setup.attn != "eager":
        w.append(
            "MPS: SDPA has no memory-efficient backward, so attention keeps b x heads x s^2 scores per "
            "layer in training (counted in attention_scores)"
        )
    if spec.arch.attn_logit_softcapping and setup.attn in ("sdpa", "xformers") and setup.backend != "mps":
        w.append(
            "attention soft-capping (Gemma 2) has no SDPA path in transformers: it runs eager attention "
            "with s^2 scores; --attn flash (FlashAttention-2 soft-caps) keeps O(s)"
        )
    if setup.attn == "eager" and setup.seq_len >= 4096:
        w.append("eager attention keeps b x heads x s^2 score tensors per layer; use --attn sdpa or flash")
    if setup.method != "full" and act.merged_expert_bytes(spec.arch, setup, regime_for(setup)):
        w.append(
            "LoRA on MoE experts (all-linear reaches them with transformers 5 + peft): peft merges each "
            "layer's experts with their factors and keeps that copy for backward; --lora-targets attn "
            "avoids it, --grad-ckpt keeps one layer's copy"
        )
    if setup.method == "qlora" and spec.arch.is_moe:
        w.append(
            "QLoRA on MoE: experts assumed quantized to 4 bits (transformers 4.x layout); transformers 5 "
            "stores experts as 3-D parameters that bitsandbytes may leave in 16 bits"
        )
    return tuple(w)
