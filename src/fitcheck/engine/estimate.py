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
from fitcheck.engine import compiled, litgpt, lora_transient, loss, nf4, offload, prefix, quant, states, tasks
from fitcheck.engine.load import largest_projection, load_transient_bytes
from fitcheck.engine.lora import (
    OWN_LORA_TRAINERS,
    adapter_params,
    adapter_params_per_layer,
    targeted,
    tower_adapter_params,
    tower_targets,
    unmatched_targets,
    validate_parameter_targets,
    validate_targets,
    validate_train_modules,
)
from fitcheck.engine.overhead import SMALL_REQUEST, regrown_loss_blocks, stranded_layer_blocks
from fitcheck.engine.params import Linear, inventory, layer_kinds, layer_linears
from fitcheck.engine.regimes import kbit_base, kbit_path, kbit_prep, model_as_trained, regime_for
from fitcheck.engine.thumb import thumb
from fitcheck.errors import OptionError
from fitcheck.facts import mlx
from fitcheck.facts.allocator import BACKENDS as ALLOCATOR_BACKENDS
from fitcheck.facts.dtypes import BYTES as DTYPE_BYTES
from fitcheck.facts.optimizers import BITSANDBYTES
from fitcheck.models import Component, DecoderArch, Estimate, LlmSetup, ModelSpec, ParamCounts, Phase, Regime
from fitcheck.units import gib


def _c(name: str, value: float, rule: str) -> Component:
    return component(name, value, rule, "llm")


def _check(spec: ModelSpec, setup: LlmSetup) -> None:
    if setup.keep_grads and (setup.distributed or setup.optimizer_in_bwd):
        raise OptionError(
            "--keep-grads is modelled on one GPU without --optimizer-in-backward (DeepSpeed and FSDP keep "
            "their own gradient buffers; the step in backward frees each gradient as it is made)"
        )
    if setup.device_map_version != 5 and setup.strategy != "device-map":
        raise OptionError("--device-map-version applies to --strategy device-map")
    from fitcheck.engine.distributed import STRATEGY_FACTS, check_embedding_units

    fsdp = setup.strategy is not None and STRATEGY_FACTS[setup.strategy].engine == "fsdp"
    if setup.fsdp_version != 2 and not fsdp:
        raise OptionError(
            "--fsdp-version applies to an FSDP strategy (--strategy fsdp, fsdp-grad-op, fsdp-hybrid or "
            f"fsdp-no-shard), not {setup.strategy or 'a run without one'}"
        )
    if setup.quant_storage is not None and setup.method != "qlora":
        raise OptionError("--quant-storage applies to --method qlora (bnb_4bit_quant_storage)")
    zero = {"--zero-bucket-size": setup.zero_bucket_size, "--zero-overlap-comm": setup.zero_overlap_comm}
    for flag, value in zero.items():
        if value is not None and setup.strategy not in ("zero1", "zero2", "zero3"):
            raise OptionError(
                f"{flag} is a DeepSpeed ZeRO setting: it applies to --strategy zero1|zero2|zero3"
                f", not {setup.strategy or 'a run without one'}"
            )
    check_embedding_units(spec, setup)
    prefix.check(setup)
    if prefix.is_prefix(setup) and tasks.model_task(spec.arch) != "causal-lm":
        raise OptionError(f"--method prefix-tuning is modelled for a causal LM; {spec.name} is not one")
    if setup.method != "full" and not prefix.is_prefix(setup):
        validate_targets(spec.arch, setup.lora_targets, every_name=setup.trainer in OWN_LORA_TRAINERS)
        validate_parameter_targets(spec.arch, setup)
    validate_train_modules(setup)
    if setup.base_quant != "none" and setup.method != "lora":
        raise OptionError(
            f"--base-quant {setup.base_quant} is a LoRA base: use it with --method lora "
            "(--method qlora is the NF4 base)"
        )
    if setup.base_quant != "none" and setup.backend in ("mps", "cpu"):
        raise OptionError(f"--base-quant {setup.base_quant} needs CUDA kernels (bitsandbytes, GPTQ/AWQ)")
    if setup.trainer in ("litgpt", "unsloth") and setup.base_quant != "none":
        raise OptionError(
            f"--trainer {setup.trainer} trains LoRA on a bitsandbytes 4-bit base; "
            "--base-quant is for the HF-Trainer family"
        )
    _check_in_backward(setup)
    _check_mlx_loss(setup)
    if setup.dora and setup.method == "full":
        raise OptionError("--dora applies to LoRA and QLoRA, not --method full")
    if setup.lora_fa and (setup.method == "full" or setup.dora):
        what = "--method full" if setup.method == "full" else "--dora (not modelled with LoRA-FA)"
        raise OptionError(f"--lora-fa freezes LoRA's A factors: it applies to LoRA and QLoRA, not {what}")
    _check_attention(spec, setup)
    if setup.optimizer in BITSANDBYTES and setup.backend == "mps":
        raise OptionError(
            f"--optimizer {setup.optimizer} needs bitsandbytes CUDA kernels; on Apple silicon use "
            "adamw, adafactor or lion"
        )


def _check_mlx_loss(setup: LlmSetup) -> None:
    """``--loss`` names PyTorch kernels; mlx-lm's own loss is what the mlx regime counts (engine/loss.py)."""
    if setup.trainer == "mlx" and setup.loss is not None:
        raise OptionError(
            f"--loss {setup.loss} names a PyTorch cross-entropy kernel; mlx-lm computes its own loss in MLX "
            "(nn.losses.cross_entropy on the model-dtype logits), which --trainer mlx counts: drop --loss"
        )


#: Where ``--attn flash`` runs (the start of each refusal elsewhere).
FLASH_GPUS = "--attn flash: FlashAttention-2 runs on NVIDIA (and ROCm) GPUs"
#: Why ``--attn flash`` with ``--precision fp32`` is refused (the planner's grid leaves the pair out too).
FLASH_FP32 = (
    "--attn flash: FlashAttention-2 computes in fp16 or bf16 only; use --precision bf16 or fp16, "
    "or --attn sdpa with --precision fp32"
)


def _check_attention(spec: ModelSpec, setup: LlmSetup) -> None:
    """The attention kernel against the backend (`_check_flash`, xformers), and padding-free rows."""
    if setup.attn == "xformers" and setup.backend == "mps":
        raise OptionError("xformers is CUDA-only and crashes on Apple silicon; use --attn sdpa")
    _check_flash(setup)
    _check_padding_free(spec, setup)


def _check_padding_free(spec: ModelSpec, setup: LlmSetup) -> None:
    """``--padding-free`` is TRL's flattening of a causal LM's micro-batch into one row: under SDPA its
    block-diagonal mask is counted (`activations.sdpa_mask_copy_bytes`, ``mask_keys``); attention that
    computes every score (eager, Apple's kernels, soft-capped or sink attention) would hold
    ``heads x (b s)^2`` of them, which is not modelled."""
    if not setup.padding_free:
        return
    if tasks.model_task(spec.arch) != "causal-lm" or setup.task not in (None, "causal-lm"):
        raise OptionError("--padding-free flattens a causal LM's batch (TRL's SFTTrainer); not this task")
    if prefix.is_prefix(setup):
        raise OptionError("--padding-free is not modelled with --method prefix-tuning")
    if act.uses_eager_scores(spec.arch, setup):
        raise OptionError(
            "--padding-free: this attention computes every score of the flattened row (heads x (batch x "
            "sequence)^2), which is not modelled; use --attn sdpa or flash"
        )


def _check_flash(setup: LlmSetup) -> None:
    """FlashAttention-2 runs on NVIDIA (and AMD ROCm) GPUs, in fp16 or bf16 only (Dao-AILab/flash-attention
    README, "Datatype fp16 and bf16"; transformers casts fp32 queries to the autocast dtype, else to the
    weights' dtype, so a run without 16-bit compute cannot call it)."""
    if setup.attn != "flash":
        return
    if setup.backend in ("mps", "cpu"):
        raise OptionError(f"{FLASH_GPUS}, not {setup.backend}; use --attn sdpa")
    if setup.precision == "fp32":
        raise OptionError(FLASH_FP32)


#: Trainers whose loop can run the optimizer in backward: torchtune's full fine-tuning recipes
#: (``optimizer_in_bwd``, training/memory.py register_optim_in_bwd_hooks @30b8519e) and a plain PyTorch loop
#: with ``register_post_accumulate_grad_hook`` (pytorch.org/tutorials/intermediate/
#: optimizer_step_in_backward_tutorial.html), which ``generic`` stands for.
IN_BACKWARD_TRAINERS = ("generic", "torchtune")


def _check_in_backward(setup: LlmSetup) -> None:
    if not setup.optimizer_in_bwd:
        return
    if setup.method != "full":
        raise OptionError(
            "--optimizer-in-backward applies to --method full (torchtune's full fine-tuning recipes)"
        )
    if setup.trainer not in IN_BACKWARD_TRAINERS:
        raise OptionError(
            f"--optimizer-in-backward: --trainer {setup.trainer} has no optimizer step in backward; "
            "use --trainer torchtune or generic"
        )
    if setup.grad_accum > 1:
        raise OptionError(
            "--optimizer-in-backward steps every parameter as its gradient is made, so it cannot "
            "accumulate gradients: use --grad-accum 1 (torchtune refuses the pair)"
        )
    if setup.distributed:
        raise OptionError("--optimizer-in-backward is modelled on one GPU only")


def _tensor_count(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> int:
    """Live tensors the caching allocator serves from its large pool at the peak (each loses about
    1 MiB to its 2 MiB rounding; engine/overhead.py ``SMALL_REQUEST``: a request of at most 1 MiB comes
    from the small pool and loses next to nothing). The base weights (embedding, head, every layer's
    projections); for full fine-tuning each with its gradient and two optimizer states, else every
    trainable tensor of every layer with its gradient and two states."""
    a = spec.arch
    per_layer = sum(_large(_frozen_bytes(a, setup, regime, lin)) for lin in layer_linears(a, a.is_moe))
    base = a.num_layers * per_layer + 2 * _large(
        a.vocab_size * a.hidden_size * DTYPE_BYTES[regime.weight_dtype]
    )
    if setup.method == "full":
        return base * 4  # weights, gradients, two optimizer states
    out = base
    grad, state = DTYPE_BYTES[regime.adapter_dtype], _state_bytes(regime, regime.adapter_dtype)
    for rows, cols, k in states.trainable_shapes(a, setup):
        n = rows * cols
        out += k * (_large(n * grad) * 2 + 2 * _large(n * state))
    return out


def _large(nbytes: float) -> int:
    """1 when a tensor of ``nbytes`` comes from the allocator's large pool."""
    return int(nbytes > SMALL_REQUEST)


def _frozen_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, lin: Linear) -> float:
    """Bytes of one projection's weight tensor as the base stores it: NF4 packs two weights a byte,
    a ``--base-quant`` format its own way (engine/quant.py), else (and for the fused MoE experts
    bitsandbytes leaves alone, `quant.quantized_linear`) the weight dtype."""
    if states.quantized_base(setup) and not quant.quantized_linear(a, setup, lin):
        return lin.d_in * lin.d_out * DTYPE_BYTES[regime.weight_dtype]
    if setup.method == "qlora":
        return lin.d_in * lin.d_out / 2
    if setup.base_quant != "none":
        return quant.packed_weight_bytes(setup.base_quant, lin.d_in, lin.d_out)
    return lin.d_in * lin.d_out * DTYPE_BYTES[regime.weight_dtype]


def _four_bit_rule(regime: Regime, setup: LlmSetup, n: int) -> str:
    """The 4-bit base's line: how many parameters, in which format (`fitcheck.engine.nf4`)."""
    if regime.nf4_format == "mlx":
        return f"{n:,} params in MLX affine 4-bit: 0.5 B + a 16-bit scale and bias per 64 (embedding too)"
    kind = (
        " (torchao NF4Tensor: int8 scalers, always double-quantized)"
        if regime.nf4_format == "torchao"
        else " (double-quantized)"
        if setup.double_quant
        else " (fp32)"
    )
    return f"{n:,} params in NF4: 0.5 B + 64-block absmax{kind}"


def _state_bytes(regime: Regime, param_dtype: str) -> float:
    """Bytes per element of one optimizer state (fp32, or the parameter's dtype)."""
    return DTYPE_BYTES["fp32" if regime.optimizer_state_dtype == "fp32" else param_dtype]


def model_states(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> dict[str, Component]:
    """Weights, adapters, master copy, optimizer states, gradients and the step transient."""
    a = spec.arch
    c = states.counts(a, setup)
    out: dict[str, Component] = {}
    head = states.quantized_head_params(a, setup, regime)
    for name, value in states.weight_bytes(a, setup, regime, c).items():
        rules = {
            "weights": f"{c.trainable:,} params x {regime.trainable_dtype}",
            "weights_frozen": f"{c.base:,} frozen params x {regime.weight_dtype}",
            "weights_quantized": f"{c.quantized:,} params as {setup.base_quant} (packed + scales"
            + (f", group {setup.quant_group})" if setup.quant_group != quant.GROUP else ")"),
            "module_copies": f"{c.module_copies:,} params: trained copies of {setup.train_modules} "
            f"(peft modules_to_save) x {states.copy_dtype(regime)}",
            "weights_4bit": _four_bit_rule(regime, setup, c.quantized + head),
            "weights_unquantized": f"{c.base - c.quantized - head:,} params ("
            + ("norms" if regime.quantized_embedding else "embeddings, norms")
            + ("" if head else ", lm_head")
            + (", the fused MoE experts bitsandbytes leaves" if quant.experts_unquantized(a, setup) else "")
            + (", the checkpoint's unquantized projections)" if setup.quant_skip else ")")
            + f" x {_unquantized_dtype(regime)}",
            "adapters": f"{c.adapter:,} {'prefix encoder' if prefix.is_prefix(setup) else 'LoRA'} params"
            f" x {regime.adapter_dtype}",
        }
        out[name] = _c(name, value, rules[name])
    out["master_weights"] = _c(
        "master_weights", states.master_bytes(regime, c), "fp32 copy of trainable weights"
    )
    out.update(_step_lines(spec, setup, regime, c))
    return out


def _step_lines(spec: ModelSpec, setup: LlmSetup, regime: Regime, c: states.Counts) -> dict[str, Component]:
    """Optimizer states (paged ones on their own line), gradients and the step's temporaries."""
    a = spec.arch
    out: dict[str, Component] = {}
    opt = states.optimizer_state_bytes(a, setup, regime)
    paged = states.paged_optimizer_bytes(a, setup)
    small = " (small tensors, absmax)" if paged else ""
    out["optimizer_states"] = _c("optimizer_states", opt - paged, f"{setup.optimizer} states{small}")
    out["optimizer_states_paged"] = _c(
        "optimizer_states_paged",
        paged,
        "bitsandbytes paged states (tensors of 1e5+ elements): CUDA managed memory, outside torch's counters",
    )
    grads = states.grad_bytes(setup, regime, c, a)
    grad_rule = f"{c.trainable:,} x {regime.grad_dtype}"
    if setup.optimizer_in_bwd:
        grad_rule = (
            f"optimizer in backward: one gradient at a time (the largest parameter) x {regime.grad_dtype}"
        )
    out["gradients"] = _c("gradients", grads, grad_rule)
    trans = states.step_transient_bytes(a, setup, regime)
    out["optimizer_transient"] = _c(
        "optimizer_transient",
        trans,
        "fused step: none"
        if regime.fused_optimizer and trans == 0
        else "temporaries of one parameter's step, inside backward"
        if setup.optimizer_in_bwd
        else "temporaries inside optimizer.step()",
    )
    return out


#: Model-state components alive through the whole step, in the order phases list them.
PERSISTENT: tuple[str, ...] = ("weights", "weights_frozen", "weights_4bit", "weights_quantized")
PERSISTENT += ("weights_unquantized", "adapters", "module_copies", "master_weights", "optimizer_states")
PERSISTENT += ("optimizer_states_paged",)
#: Model-state lines alive through the whole step (what the allocator reserve counts as steady).
STEADY: tuple[str, ...] = (*PERSISTENT, "gradients")


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
    merged_grad: Component  # the gradient of one layer's merged down-projection experts, in its backward
    merged_inside: Component  # inside the last MoE layer's experts in forward (checkpointed)
    dequant: Component  # one 4-bit weight dequantized
    logits_head: Component  # the loss hump when the output layer's own backward runs
    head_dequant: Component  # a 4-bit output layer dequantized again by its backward
    late: Component  # one layer's activations late in backward
    tied: Component  # tied embedding gradients at the very end of backward
    mask: Component  # eager attention's causal mask, alive from the forward to the first layer's backward
    head_grads: Component  # the output layer's gradient once the loss backward made it
    held: Component  # the model's output logits when the loop keeps them (--keep-logits)
    # the previous micro-batch's output, held into this forward with accumulation (none before a
    # longest-first run's first, longest micro-batch)
    held_prev: Component
    # the quantized matmuls' kept inputs (`act.held_inputs`) that outlive the layer's backward (the graph's
    # nodes keep them): the other layers' late in backward, every layer's at its end, through the optimizer
    # step and, the previous step's, through the next forward while the loop holds the graph
    kept_late: Component
    kept_end: Component
    kept_step: Component
    kept_prev: Component
    layer: LayerPeaks  # inside the last layer: its attention's transients over what earlier layers hold
    prefix_cache: Component  # prefix tuning: the cache's concatenated keys/values, through the forward only
    # encoder-decoder: the encoder's saved tensors when the decoder's backward ends (its embedding's too),
    # and the bytes of the encoder layers' gradients, not made yet then
    encoder_saved: Component | None = None
    encoder_grads: float = 0.0
    # the checkpointed forward's layer blocks the caching allocator keeps cached beside the loss's larger
    # tensors (`stranded_layer_blocks`), bytes; 0 where the rule does not hold
    stranded: float = 0.0


def saved_activations(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Saved:
    """Activations saved for backward (all layers, or checkpoints), the loss hump and the transients."""
    a = spec.arch
    shape = tasks.task_shape(a, setup)  # tokens per stack and output rows follow --task
    T, s = shape.tokens, shape.seq_len
    dense = act.layer_activations(a, setup, regime, moe=False)
    sparse = act.layer_activations(a, setup, regime, moe=True) if a.is_moe and a.moe_layers else dense
    ctx = act.context(setup, regime)
    win = _windowed(a, setup, regime, dense)  # a sliding-window layer past its window (else ``dense``)
    saved = _stored(spec, setup, regime, shape, dense, sparse, win)
    # the output layer's rows and width follow --task (every token x vocabulary, or one row x labels)
    lg = loss.hump(a, setup, regime, ctx.gamma, rows=shape.logit_rows, width=shape.logit_width)
    one_layer = T * (max(dense.total(s), sparse.total(s)) + _window_extra(a, setup, dense, win))
    if a.structure == "encoder_decoder":
        # the last layer to run its backward is the encoder's first, on the source tokens
        one_layer = max(one_layer, shape.encoder_tokens * dense.total(shape.encoder_seq))
    layer = _layer_peaks(spec, setup, regime, list(saved), one_layer)
    # Late in backward nearly every gradient exists while the first layer's activations are still
    # alive (recomputed from its checkpoint when checkpointing; the other checkpoints are freed).
    late = _c(
        "layer_recompute" if setup.grad_ckpt else "activations",
        max(one_layer, layer.layer_backward),
        "one layer's activations "
        + ("recomputed from its checkpoint" if setup.grad_ckpt else "(the first layer's, last to be freed)"),
    )
    accum = setup.grads_between_steps  # the head's gradient is added into a gradient already there
    head = states.head_grad_bytes(a, setup, regime) if not accum else 0
    casts_fwd, casts_bwd, casts_layer = _casts(spec, setup, regime)
    merged_fwd, merged_layer, merged_grad, merged_inside = _merged_experts(spec, setup, regime)
    held = _held_logits(setup, regime, shape.logit_rows, shape.logit_width, ctx.gamma)
    return Saved(
        inputs=_c("inputs", 16 * T, "input_ids + labels, int64"),
        saved=saved,
        logits_fwd=_c("logits_loss", lg.forward, lg.rule),
        logits_bwd=_c("logits_loss", lg.backward, lg.rule + ", at the loss backward"),
        held=held,
        held_prev=_held_prev(setup, regime, held),
        **_kept_quant_inputs(spec, setup, regime, T),
        casts_fwd=casts_fwd,
        casts_bwd=casts_bwd,
        casts_layer=casts_layer,
        merged_fwd=merged_fwd,
        merged_layer=merged_layer,
        merged_grad=merged_grad,
        merged_inside=merged_inside,
        dequant=_dequant(spec, setup, regime),
        logits_head=_c("logits_loss", lg.at_head, lg.rule + ", at the output layer's backward"),
        head_dequant=_head_dequant(spec, setup, regime),
        late=late,
        tied=_tied_grads(spec, setup, regime),
        mask=_c("attention_mask", act.eager_mask_bytes(a, setup, regime), "eager causal mask, b x s^2"),
        head_grads=_c("gradients", head, "the output layer's gradient, made by the loss backward"),
        layer=layer,
        prefix_cache=_c(
            "prefix_cache",
            act.prefix_cache_bytes(a, setup, ctx.gamma),
            "prefix tuning: the cache's concatenated keys/values, b x (s + p) x L x 2 x kv width (forward)",
        ),
        encoder_saved=_encoder_saved(spec, setup, regime, shape),
        encoder_grads=_encoder_grads(spec, setup, regime),
        stranded=_stranded(spec, setup, regime, max(dense, sparse, win, key=_parts_bytes)),
    )


def _windowed(a: DecoderArch, setup: LlmSetup, regime: Regime, dense: act.LayerActs) -> act.LayerActs:
    """What a windowed layer saves (`act.windowed_layers`; ``dense`` where no layer is windowed)."""
    if not act.windowed_layers(a, setup):
        return dense
    return act.layer_activations(a, setup, regime, moe=False, windowed=True)


def _window_extra(a: DecoderArch, setup: LlmSetup, dense: act.LayerActs, win: act.LayerActs) -> float:
    """Bytes per token the largest layer saves beyond a full-attention layer's because of its window: a
    windowed layer's attention (``win``: expanded K/V, its mask copy; no math-kernel scores) less a full
    one's, where it is more, or where every layer is windowed. The same for a dense and a MoE layer
    (attention only)."""
    w = act.windowed_layers(a, setup)
    if not w:
        return 0.0
    delta = win.total(setup.seq_len) - dense.total(setup.seq_len)
    return delta if w >= a.num_layers else max(0.0, delta)


def _parts_bytes(layer: act.LayerActs) -> float:
    """A layer's saved bytes per token, its s^2 scores aside."""
    return sum(layer.parts.values())


def _stranded(spec: ModelSpec, setup: LlmSetup, regime: Regime, largest: act.LayerActs) -> float:
    """The checkpointed forward's layer blocks cached beside the loss (`stranded_layer_blocks`): one
    layer's activations as counted here (``largest``: the dense, MoE or windowed layer that saves most),
    eager scores aside, against the output layer's rows x width."""
    shape = tasks.task_shape(spec.arch, setup)
    kernel = loss.kernel_for(setup, regime, spec.arch)
    return stranded_layer_blocks(
        spec.arch,
        setup,
        kernel,
        shape.tokens * _parts_bytes(largest),
        shape.logit_rows * shape.logit_width,
    )


#: What keeps its inputs, by `act.HeldInputs`, in the components' rules.
_QUANT_KIND = {"": "", "cast": "4-bit < 0.43.2", "as-is": "LLM.int8"}


def _kept_quant_inputs(spec: ModelSpec, setup: LlmSetup, regime: Regime, tokens: int) -> dict[str, Component]:
    """Quantized matmuls' kept inputs where they outlive the layer's own backward (the ``kept_*`` fields of
    `Saved`): bitsandbytes < 0.43.2's 4-bit ``MatMul4Bit`` and every release's LLM.int8 ``MatMul8bitLt``.

    Each keeps its input as ``ctx.tensors``, which the backward's ``release_variables`` does not
    free (it frees ``save_for_backward`` tensors only): each layer's inputs stay until the graph itself
    dies (`act.graph_keeps_quant_inputs`). So late in backward the other layers' are alive, at its end every
    layer's; a loop that holds the step's output (`act.loop_keeps_graph`: litgpt's ``logits``) keeps them
    through the optimizer step and into the next step's forward, beside that step's own (counted at the
    step's length: a varying-length run's previous step may be shorter; none before a longest-first run's
    first, longest step). Reentrant checkpointing leaves no node behind, so nothing is counted there."""
    a = spec.arch
    layers = a.num_layers - (a.moe_layers if a.is_moe else 0)
    per = act.kept_quant_input_bytes(a, setup, regime) if act.graph_keeps_quant_inputs(setup) else 0.0
    kept = tokens * layers * per
    looped = kept if act.loop_keeps_graph(setup) else 0.0
    # the run's longest step runs first (--lengths longest-first): no earlier step's graph is held then
    prev = 0.0 if setup.lengths == "longest-first" else looped
    name = "kept_quant_inputs"
    kind = _QUANT_KIND[act.held_inputs(setup)]
    base = f"bitsandbytes {kind}: every layer's matmul inputs, kept by the graph (ctx.tensors)"
    others = kept * (layers - 1) / layers if layers else 0.0
    return {
        "kept_late": _c(name, others, base + ", the other layers' late in backward"),
        "kept_end": _c(name, kept, base + ", at the end of backward"),
        "kept_step": _c(name, looped, base + ", while the loop holds the step's output"),
        "kept_prev": _c(name, prev, base + ", the previous step's: the loop holds its graph to here"),
    }


def _encoder_saved(
    spec: ModelSpec, setup: LlmSetup, regime: Regime, shape: tasks.TaskShape
) -> Component | None:
    """Encoder-decoder (T5): backward runs the decoder's layers and its embedding (the tied lm_head's
    gradient summed with it) while the whole encoder stack still holds what it saved; its gradients
    come after (`_encoder_grads`). Traced (`fitcheck measure` on a T5 config, tests/test_task_trace.py):
    full fine-tuning's backward peaks there."""
    if spec.arch.structure != "encoder_decoder":
        return None
    saved = tasks.encoder_saved_bytes(spec.arch, setup, regime, shape)
    rule = "encoder stack on the source, its backward not yet run (the decoder's has ended)"
    return _c("encoder_and_cross_attention", saved, rule)


def _encoder_grads(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> float:
    """Bytes of the encoder layers' gradients, not made yet when the decoder's backward ends."""
    if setup.method != "full":
        return 0.0
    return float(tasks.encoder_layer_params(spec.arch) * int(states.BYTES[regime.grad_dtype]))


#: The rule of the ``attention_mask_copies`` line (engine/activations.py `sdpa_mask_copy_bytes`).
MASK_COPIES_RULE = "SDPA mask copy per layer (padding, prefix, window): b x s x kv"


def _stored(
    spec: ModelSpec,
    setup: LlmSetup,
    regime: Regime,
    shape: tasks.TaskShape,
    dense: act.LayerActs,
    sparse: act.LayerActs,
    win: act.LayerActs,
) -> tuple[Component, ...]:
    """What stays saved through the forward: every layer's activations (and eager scores) or one
    checkpoint per layer, the final norm's input, the lm_head's inputs, and an encoder stack."""
    a = spec.arch
    T, s, L = shape.tokens, shape.seq_len, a.num_layers
    moe_n = a.moe_layers if a.is_moe else 0
    per_layer_tok = dense.total(s)
    final_norm = _c("final_norm", T * act.final_norm_bytes(a, setup, regime), "final norm fp32 input")
    on_device = offload.device_share(setup, regime, L)
    where = offload.rule(setup, regime, L)
    head_in = _c(
        "head_inputs",
        T * act.head_input_bytes(a, setup, regime),
        "inputs saved by a trained or LoRA-wrapped lm_head (any lm_head under ZeRO-3's F.linear, LoRA)",
    )
    if setup.grad_ckpt:
        ckpt = T * L * act.context(setup, regime).rho * a.hidden_size * on_device
        ckpt_rule = "one layer input per layer (non-reentrant checkpoint)" + where
        saved: tuple[Component, ...] = (_c("checkpoints", ckpt, ckpt_rule), final_norm, head_in)
        held = T * (L - moe_n) * act.held_4bit_input_bytes(a, setup, regime)
        if held:
            kind = act.held_inputs(setup)
            held_rule = f"bitsandbytes {_QUANT_KIND[kind]}: every layer's matmul inputs (non-reentrant ckpt)"
            name = "held_int8_inputs" if kind == "as-is" else "held_4bit_inputs"
            saved = (*saved, _c(name, held, held_rule))
    else:
        # windowed layers (`act.windowed_layers`) save their own attention: a full layer's, less what
        # differs, counted in each line (K/V at every head, their mask copy, no math-kernel scores)
        w = act.windowed_layers(a, setup)
        windows = w * (win.total(s) - per_layer_tok)
        all_layers = T * ((L - moe_n) * per_layer_tok + moe_n * sparse.total(s) + windows)
        scores = T * s * ((L - w) * dense.scores + w * win.scores)
        mask_tok = dense.parts.get(act.MASK_COPY, 0.0)
        win_mask = win.parts.get(act.MASK_COPY, 0.0)
        masks = T * ((L - w) * mask_tok + w * win_mask)
        per_tok = f"{L} layers x {per_layer_tok - s * dense.scores - mask_tok:,.0f} B/token" + where
        more = (win.total(s) - s * win.scores - win_mask) - (per_layer_tok - s * dense.scores - mask_tok)
        if w and more:
            per_tok += f", {w} windowed {more:+,.0f} (K/V all heads)"  # SDPA's mask: repeat_kv
        scores_rule = (
            "T5 under SDPA: each layer's position-bias mask, heads*s^2 (x b when padded)"
            if act.sdpa_position_bias(a, setup)
            else "SDPA's math kernel (fp32, grouped K/V): fp32 probabilities, b*heads*s^2 per layer"
            if act.sdpa_math(a, setup, regime)
            else "eager: fp32 softmax + compute-dtype copy, b*heads*s^2 per layer"
        )
        kept = scores
        if regime.evaluation == "mlx" and scores:
            kept = L * mlx.SAVED_SCORE_TENSORS * _score_tensor(a, setup, regime)
            scores_rule = f"MLX: {mlx.SAVED_SCORE_TENSORS:g} score tensors per layer kept for the backward"
        saved = (
            _c("activations", (all_layers - scores - masks) * on_device, per_tok),
            _c("attention_scores", kept * on_device, scores_rule),
            _c("attention_mask_copies", masks * on_device, MASK_COPIES_RULE),
            final_norm,
            head_in,
        )
    enc = tasks.encoder_stack_bytes(a, setup, regime, shape)
    conv = _c("conv_layer", T * act.conv_layer_bytes(a, setup, regime), act.CONV_LAYER_RULE)
    enc_rule = "encoder stack on the source + cross-attention"
    return (*saved, conv, _c("encoder_and_cross_attention", enc, enc_rule))


def _dequant(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Component:
    dq = 0
    rule = "one quantized weight dequantized to the compute dtype"
    if states.quantized_base(setup):
        n = largest_projection(spec.arch, regime.quantized_lm_head, setup)
        gamma = int(act.context(setup, regime).gamma)
        fmt = regime.nf4_format if setup.method == "qlora" else "bitsandbytes"
        if fmt == "torchao" and setup.compile and not compiled.untraced(spec.arch, setup, regime):
            dq = compiled.nf4_dequant_bytes(n, gamma)
            rule = "torchao NF4 dequantized by one fused kernel in a compiled layer (traced)"
        elif fmt == "mlx":
            rule = "MLX quantized_matmul: no weight dequantized whole"
        elif fmt == "torchao":
            dq = nf4.dequant_bytes(fmt, n, gamma)
            rule = (
                "torchao get_original_weight: int64 indices, halves and the stacked weight of one projection"
            )
        elif setup.base_quant in quant.DEQUANT_BYTES:
            dq = n * quant.DEQUANT_BYTES[setup.base_quant]
            rule = "AutoGPTQ 8-bit QuantLinear torch path: int32/int16 unpacking and the fp16 weight"
        else:
            dq = n * litgpt.dequant_bytes_per_weight(setup, gamma)
    return _c("dequant_transient", dq, rule)


def _head_dequant(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Component:
    """A 4-bit lm_head is dequantized again by ``MatMul4Bit.backward`` (``grad_A = grad_output @
    dequantize_4bit(B)``, bitsandbytes autograd/_functions.py @0.42.0) right after the loss backward,
    while every layer's activations are still saved."""
    dq = 0
    if setup.method == "qlora" and regime.quantized_lm_head and regime.nf4_format != "mlx":
        per = litgpt.dequant_bytes_per_weight(setup, act.context(setup, regime).gamma)
        dq = spec.arch.vocab_size * spec.arch.hidden_size * per
    return _c("dequant_transient", dq, "the 4-bit lm_head dequantized by its backward")


def _casts(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> tuple[Component, Component, Component]:
    """Autocast weight casts alive in forward, at the start of backward, and late (one layer)."""
    copies_all, copies_head, copies_layer = autocast_copies(spec, setup, regime)
    ad_all, ad_layer = adapter_casts(spec, setup, regime)
    copies_layer += ad_layer
    if setup.grad_ckpt:
        # the autocast cache keeps trainable weights' casts until the forward ends; frozen weights'
        # casts live only where a matmul saved them (lm_head; the layer being recomputed)
        cast_fwd = copies_all if setup.method == "full" else copies_head + ad_all
        cast_bwd = copies_head
    else:
        cast_fwd = cast_bwd = copies_all + ad_all
    rule = "bf16 casts of fp32 weights made by autocast and saved for backward"
    return tuple(_c("autocast_weight_copies", n, rule) for n in (cast_fwd, cast_bwd, copies_layer))  # type: ignore[return-value]


def _held_logits(setup: LlmSetup, regime: Regime, rows: int, width: int, gamma: int) -> Component:
    """The output logits a loop keeps alive (``out = model(**batch); out.loss.backward();
    optimizer.step()``) through backward and the step; HF Trainer's ``training_step`` keeps only the
    loss (``compute_loss`` returns ``outputs`` only when asked), so they die with the forward there. A loss
    that keeps them itself (MLX's graph: `loss.loss_holds_logits`) keeps them through backward whatever the
    loop does."""
    if loss.loss_holds_logits(setup, regime):
        held = loss.output_logits_bytes(setup, regime, rows, width, gamma)
        return _c("held_logits", held, "the model's output logits, kept alive by the loss value (MLX)")
    held = loss.output_logits_bytes(setup, regime, rows, width, gamma) if setup.keep_logits else 0
    return _c("held_logits", held, "the model's output logits, held by the loop until after the step")


def _held_prev(setup: LlmSetup, regime: Regime, held: Component) -> Component:
    """The previous micro-batch's logits, alive into this forward under accumulation: the loop's own held
    output (``--keep-logits``), none before a longest-first run's first, longest micro-batch. Logits kept
    only by the loss value (MLX's graph) go when that step's graph is evaluated."""
    graph_only = loss.loss_holds_logits(setup, regime) and not setup.keep_logits
    if setup.lengths == "longest-first" or graph_only:
        return _c("held_logits", 0, "")
    return held


def _merged_experts(
    spec: ModelSpec, setup: LlmSetup, regime: Regime
) -> tuple[Component, Component, Component, Component]:
    """peft's merged expert copies (`act.merged_expert_copies`) at three moments: through the end of the
    forward (every MoE layer's, saved for backward; none under checkpointing, where each is a saved tensor
    of its layer's checkpointed forward, dropped as the layer ends), inside one layer (its own copies,
    alive together in the forward of its experts and again when its backward recomputes them), and in that
    layer's backward the gradient of the first merged tensor it meets, the down projection's (traced on a
    2-layer Mixtral of the real shape: the down copy's gradient beside both copies)."""
    a = spec.arch
    moe_n = a.moe_layers if a.is_moe else 0
    up, down = act.merged_expert_copies(a, setup, regime)
    merged = up + down
    rule = "experts' weights merged with their LoRA factors (peft ParamWrapper), saved per layer"
    all_layers = _c("merged_expert_weights", merged * (0 if setup.grad_ckpt else moe_n), rule)
    grad_rule = "the gradient of one layer's merged down-projection experts, in its backward"
    inside = act.expert_forward_bytes(a, setup, regime, setup.tokens)
    inside_rule = "inside the last MoE layer's experts: its merged copies, or the up copy and routed tensors"
    return (
        all_layers,
        _c("merged_expert_weights", merged, rule),
        _c("merged_expert_grads", down, grad_rule),
        _c("merged_expert_weights", inside, inside_rule),
    )


def _tied_grads(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Component:
    """Tied embeddings trained: at the very end the lm_head's weight gradient (held since the loss
    backward), the embedding's own and their sum coexist (traced on Gemma 2 9B). The sum is the
    gradient itself on a step that starts without one; where the gradients are already there
    (``LlmSetup.grads_between_steps``) it is a third tensor beside them, added into ``.grad`` in place
    afterwards (traced on Llama 3.2 1B with accumulation and with ``--keep-grads``)."""
    tied = 0
    if setup.method == "full" and spec.arch.tie_embeddings:
        copies = 3 if setup.grads_between_steps else 2
        tied = copies * inventory(spec.arch).embedding * int(states.BYTES[regime.grad_dtype])
    return _c("tied_embedding_grads", tied, "lm_head and embedding gradients before they are summed")


def load_phase(spec: ModelSpec, setup: LlmSetup, regime: Regime, ms: dict[str, Component]) -> Phase:
    """Loading: the weights as they end up plus what loading holds beside them (`engine/load.py`)."""
    quantized = states.quantized_base(setup)
    transient = _c(
        "load_transient",
        load_transient_bytes(spec.arch, setup, regime, quantized),
        "16-bit tensor being quantized or upcast while the model loads",
    )
    weights = [ms[k] for k in PERSISTENT if k in ms and k.startswith("weights")]
    return phase("load", [*weights, transient])


def loss_moments(
    ms: dict[str, Component], sv: Saved, accumulating: bool, grads_kept: bool = False
) -> tuple[list[Component], list[Component], list[Component]]:
    """What is alive at the loss: the forward's end, the backward's start, the output layer's backward."""
    persistent = [ms[k] for k in PERSISTENT if k in ms]
    grads_fwd = ms["gradients"] if accumulating or grads_kept else _c("gradients", 0, "")
    held = [*persistent, grads_fwd, sv.inputs, *sv.saved]
    # with accumulation a loop's previous output lives until this forward returns and rebinds it
    prev_out = sv.held_prev if accumulating else _c("held_logits", 0, "")
    fwd_main = [*held, prev_out, sv.kept_prev, sv.casts_fwd, sv.merged_fwd, sv.logits_fwd, sv.dequant]
    fwd_main += [sv.mask, sv.prefix_cache]
    bwd_start = [*held, sv.held, sv.casts_bwd, sv.merged_fwd, sv.logits_bwd, sv.mask]
    bwd_head = [*held, sv.held, sv.casts_bwd, sv.merged_fwd, sv.logits_head, sv.mask, sv.head_dequant]
    return fwd_main, bwd_start, bwd_head


def _loss_logits(sv: Saved) -> float:
    """The loss's logits tensors at their largest moment (forward's end, backward's start, the head's)."""
    return max(sv.logits_fwd.bytes, sv.logits_bwd.bytes, sv.logits_head.bytes)


def loss_margins(
    ms: dict[str, Component], sv: Saved, setup: LlmSetup, kernel: str, grad_tensor: int, peak_bytes: int,
    grads_kept: bool,
) -> tuple[int, int]:  # fmt: skip
    """The reserve beyond the flat share that the loss decides, from one GPU's lines: (`stranded_margin`,
    the loss's blocks its gradients regrow, engine/overhead.py `regrown_loss_blocks`; ``grad_tensor``: the
    gradient tensor that decides it, states.py `largest_regrowing_grad_bytes`)."""
    stranded = stranded_margin(ms, sv, setup.grad_accum > 1, grads_kept, peak_bytes)
    regrown = regrown_loss_blocks(setup, kernel, ms["gradients"].bytes, _loss_logits(sv), grad_tensor)
    return stranded, round(regrown)


def stranded_margin(
    ms: dict[str, Component], sv: Saved, accumulating: bool, grads_kept: bool, peak_bytes: int
) -> int:
    """How far the reading at the loss (what is alive there plus the layer blocks cached beside it,
    `stranded_layer_blocks`) stands above the allocated peak; 0 when it does not."""
    if not sv.stranded:
        return 0
    at_loss = max(sum(c.bytes for c in m) for m in loss_moments(ms, sv, accumulating, grads_kept))
    return max(0, round(at_loss + sv.stranded) - peak_bytes)


def step_phases(
    ms: dict[str, Component],
    sv: Saved,
    accumulating: bool,
    step_in_backward: bool = False,
    grads_kept: bool = False,
) -> tuple[Phase, Phase, Phase]:
    """What is alive at the peak of forward, backward (its start, late, or end) and the optimizer step.

    ``step_in_backward``: each parameter's step runs inside backward (``optimizer_in_bwd``), so its
    temporaries join backward's late and final moments beside the one live gradient. ``grads_kept``:
    the gradients outlive the step (``keep_grads``) without accumulation.
    """
    persistent = [ms[k] for k in PERSISTENT if k in ms]
    grads = ms["gradients"]
    grads_fwd = grads if accumulating or grads_kept else _c("gradients", 0, "")
    held = [*persistent, grads_fwd, sv.inputs, *sv.saved]
    fwd_main, bwd_start, bwd_head = loss_moments(ms, sv, accumulating, grads_kept)
    fwd_layer = [*persistent, grads_fwd, sv.inputs, sv.mask, sv.casts_fwd, sv.kept_prev, *sv.layer.forward]
    # inside the last MoE layer's experts: its merged copies beside what the earlier layers hold
    merged_in = sv.merged_fwd if sv.merged_fwd.bytes else sv.merged_inside
    fwd_experts = [*held, sv.casts_fwd, merged_in, sv.mask, sv.kept_prev]
    candidates_fwd = [fwd_main]
    if sv.layer.forward:
        candidates_fwd.append(fwd_layer)
    if sv.merged_inside.bytes:
        candidates_fwd.append(fwd_experts)
    forward = max((phase("forward", c) for c in candidates_fwd), key=lambda p: p.total_bytes)
    bwd_late = [*persistent, grads, sv.inputs, sv.held, sv.late, sv.mask, sv.dequant, sv.casts_layer]
    bwd_late += [sv.merged_layer, sv.merged_grad, sv.kept_late]
    bwd_end = [*persistent, grads, sv.inputs, sv.held, sv.tied, sv.kept_end]
    if step_in_backward:
        bwd_late.append(ms["optimizer_transient"])
        bwd_end.append(ms["optimizer_transient"])
    # The first layer to run its backward (the last one) while every earlier checkpoint (or every
    # earlier layer's saved activations) is still held: with long sequences this is the peak.
    bwd_first = [*persistent, grads_fwd, sv.head_grads, sv.inputs, sv.held, sv.mask, sv.casts_bwd]
    bwd_first += [sv.merged_layer, sv.merged_grad]
    bwd_first += sv.layer.backward
    moments = [bwd_start, bwd_head, bwd_late, bwd_end, bwd_first]
    if sv.merged_fwd.bytes and sv.merged_grad.bytes:
        # the last MoE layer's backward without checkpointing: every layer's merged copies still saved,
        # the loss freed, the gradient of its merged down projection made (traced)
        moments.append([*held, sv.head_grads, sv.held, sv.casts_bwd, sv.mask, sv.merged_fwd, sv.merged_grad])
    if sv.encoder_saved is not None:
        # the decoder's backward has ended: its gradients (and the output layer's) exist, the encoder's not
        dec = (
            grads
            if accumulating or grads_kept
            else _c(
                "gradients", max(0.0, grads.bytes - sv.encoder_grads), "the decoder's and the output layer's"
            )
        )
        moments.append([*persistent, dec, sv.inputs, sv.held, sv.encoder_saved, sv.tied])
    candidates = (phase("backward", c) for c in moments)
    backward = max(candidates, key=lambda p: p.total_bytes)
    step = phase("optimizer_step", [*persistent, grads, sv.held, sv.kept_step, ms["optimizer_transient"]])
    return forward, backward, step


def estimate(
    spec: ModelSpec, setup: LlmSetup, target_context: int | None = None, history: bool = True
) -> Estimate:
    """Estimate the memory of one training step of ``spec`` under ``setup``; under ``lengths: varying``
    with the allocator's history over the run's shorter steps beside it, and under DeepSpeed ZeRO with the
    segments its optimizer step cuts beside the activations' cached blocks (`engine/cache_history.py`).
    ``history`` False skips that releasable cache (outside ``device_bytes`` and the band): what the planner
    and the suggestions compare, without the rungs' estimates, and with the step's padded batch kept.
    """
    est = _step_estimate(spec, setup, target_context)
    if not history or setup.backend not in ALLOCATOR_BACKENDS:
        return est  # the history is the CUDA caching allocator's (facts/allocator.py)
    from fitcheck.engine import cache_history as ch

    a = spec.arch
    largest = ch.largest_block(est, setup.tokens, a.vocab_size, max(est.params.lm_head, est.params.embedding))
    segments = ch.step_segment_bytes(est, largest)
    if setup.lengths != "varying":  # longest-first: every later step fits the first one's segments
        if not segments:
            return est
        line = ch.history_component(est, None, setup.seq_len, segments)
        return est.model_copy(update={"cache_history": line}) if line.bytes else est
    fixed = setup.model_copy(update={"lengths": "fixed"})

    def step_at(n: int) -> Estimate:
        return _step_estimate(spec, fixed.model_copy(update={"seq_len": n}), target_context)

    line = ch.history_component(est, step_at, setup.seq_len, segments)
    return est.model_copy(update={"cache_history": line})


def _step_estimate(spec: ModelSpec, setup: LlmSetup, target_context: int | None = None) -> Estimate:
    """The memory of one training step of ``spec`` under ``setup``, at ``setup.seq_len``.

    Named steps: the regime (dtypes), model states, saved activations, the three phases, then the
    one assembly shared with the diffusion estimator (`fitcheck.assembly.assemble`).

    Args:
        spec: the model.
        setup: method, batch, sequence, precision, optimizer, ... and the trainer regime.
        target_context: CUDA context bytes of the target GPU, when one is known.
    """
    spec = model_as_trained(tasks.with_task_head(spec, setup), setup)
    _check(spec, setup)
    regime = regime_for(setup)
    ms = model_states(spec, setup, regime)
    sv = saved_activations(spec, setup, regime)
    phases = (
        load_phase(spec, setup, regime, ms),
        *step_phases(ms, sv, setup.grad_accum > 1, setup.optimizer_in_bwd, setup.keep_grads),
    )
    c = states.counts(spec.arch, setup)
    inv = inventory(spec.arch)
    tensors = _tensor_count(spec, setup, regime)
    params = ParamCounts(
        total=c.total,
        trainable=c.trainable,
        adapter=c.adapter,
        frozen=c.total - c.trainable,
        quantized=c.quantized + states.quantized_head_params(spec.arch, setup, regime),
        embedding=inv.embedding,
        lm_head=inv.lm_head,
    )
    kernel = loss.kernel_for(setup, regime, spec.arch)
    peak = max(p.total_bytes for p in phases)
    grad_tensor = states.largest_regrowing_grad_bytes(spec.arch, setup, regime)
    stranded, regrown = loss_margins(ms, sv, setup, kernel, grad_tensor, peak, setup.keep_grads)
    est = assemble(
        model=spec.id,
        model_name=spec.name,
        model_source=spec.source_kind,
        setup=setup,
        regime=regime,
        params=params,
        phases=phases,
        steady_bytes=sum(ms[k].bytes for k in STEADY if k in ms),
        live_tensors=tensors,
        target_context=target_context,
        stranded_bytes=stranded + regrown,
        thumb=thumb(c.base, setup),
        warnings=_warnings(spec, setup, c.base),
    )
    if setup.strategy == "device-map":
        from fitcheck.engine import devmap

        shape = tasks.task_shape(spec.arch, setup)
        gamma = act.context(setup, regime).gamma
        out = loss.output_logits_bytes(setup, regime, shape.logit_rows, shape.logit_width, gamma)
        return devmap.split(spec, setup, regime, ms, sv, est, tensors, out, grad_tensor)
    if setup.distributed:
        from fitcheck.engine.distributed import distribute

        est = distribute(spec, setup, est, tensors, stranded)
    return est


@dataclass(frozen=True)
class LayerPeaks:
    """Components alive while the last layer runs (forward) or starts its backward, beyond model states."""

    forward: list[Component]
    backward: list[Component]
    layer_backward: float  # one layer's peak in its own backward (eager attention), bytes


def _layer_peaks(
    spec: ModelSpec, setup: LlmSetup, regime: Regime, saved: list[Component], one_layer: float
) -> LayerPeaks:
    """What is alive inside the last decoder layer: its attention's short-lived tensors on top of
    what earlier layers keep (every checkpoint when checkpointing, every layer's saved activations
    otherwise). Eager attention makes this the peak at long sequences (traced at 4k and 8k tokens:
    up to half the peak was missing without it); other kernels keep O(s) and add nothing here.
    """
    a = spec.arch
    ep = act.eager_peaks(a, setup, regime)
    kind = "SDPA math kernel" if act.sdpa_math(a, setup, regime) else "eager"
    dense = act.layer_activations(a, setup, regime, moe=False)
    T, s = setup.tokens, setup.seq_len
    pairs = setup.batch_size * s * s  # query-key pairs of the batch, per head
    held = [c for c in saved if c.name != "final_norm"]
    if regime.evaluation == "mlx" and ep.backward:
        return _mlx_layer_peaks(spec, setup, regime, held, one_layer)
    layer_bwd = T * act.attention_part(dense) + pairs * ep.backward if ep.backward else 0.0
    if setup.grad_ckpt:
        qkv = _unsaved_qkv(a, setup, regime)
        fwd = _c(
            "attention_transient",
            pairs * ep.forward_transient + qkv if ep.forward_transient else 0,
            f"{kind}: masked scores, their fp32 copy and fp32 softmax in a checkpointed forward",
        )
        bwd = _c(
            "layer_recompute",
            max(one_layer, layer_bwd),
            "the last layer recomputed from its checkpoint while every checkpoint is held",
        )
        fwd, bwd = _with_lora_transient(spec, setup, regime, fwd, bwd)
        kept = _frozen_unit_graphs(spec, setup, held)
        return LayerPeaks([*held, fwd] if fwd.bytes else [], [*held, bwd, *kept], layer_bwd)
    if not ep.backward:
        working = _encoder_working_set(spec, setup, regime)
        return LayerPeaks([*held, working] if working.bytes else [], [], 0.0)
    mlp_last = T * (dense.total(s) - act.attention_part(dense) - s * dense.scores)
    fwd = _c(
        "attention_transient",
        pairs * ep.forward_extra - mlp_last,
        f"{kind}: fp32 copy of the scores at the last layer's softmax (its MLP not yet run)",
    )
    working = _encoder_working_set(spec, setup, regime)  # the same layer's later moment, whichever is larger
    fwd = working if working.bytes > fwd.bytes else fwd
    bwd = _c(
        "attention_transient",
        pairs * (ep.backward - dense.scores) - mlp_last,
        f"{kind}: the last layer's softmax backward (its MLP already freed)",
    )
    return LayerPeaks([*held, fwd] if fwd.bytes else [], [*held, bwd] if bwd.bytes else [], layer_bwd)


def _unsaved_qkv(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """q, k and v (repeated to every head) alive in a checkpointed, unsaved forward of one layer."""
    return setup.tokens * act.context(setup, regime).gamma * 3 * a.num_heads * a.head_dim


def _score_tensor(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """U: one score tensor of the batch, b x heads x s^2 in the compute dtype (`facts.mlx`)."""
    return setup.batch_size * setup.seq_len**2 * a.num_heads * act.context(setup, regime).gamma


def _mlx_layer_peaks(
    spec: ModelSpec, setup: LlmSetup, regime: Regime, held: list[Component], one_layer: float
) -> LayerPeaks:
    """Inside the last layer of mlx-lm's step as MLX's own evaluation holds it (`facts.mlx`), beside what
    every layer keeps (its checkpoint, or its activations and ``SAVED_SCORE_TENSORS`` U). Checkpointed: in
    the forward, the unsaved attention's q, k, v and ``FORWARD_SCORE_TENSORS`` U; in the backward,
    ``LAYERS_HELD`` layers' activations a token (scores aside: the layers MLX's evaluation order has in
    flight) and ``SCORE_TENSORS`` U, at least one layer as the regime counts it. Without checkpointing: in
    the forward ``FORWARD_SCORE_TENSORS`` U less the saved ones (taken from the checkpointed forward, not
    measured without checkpointing: the forward was never the probes' peak), in the backward
    ``BACKWARD_SCORE_TENSORS`` U. U: one score tensor (`_score_tensor`)."""
    a = spec.arch
    T = setup.tokens
    u = _score_tensor(a, setup, regime)
    if not setup.grad_ckpt:
        fwd = _c(
            "attention_transient",
            max(0.0, mlx.FORWARD_SCORE_TENSORS - mlx.SAVED_SCORE_TENSORS) * u,
            f"MLX: the last layer's attention forward, {mlx.FORWARD_SCORE_TENSORS:g} score tensors",
        )
        bwd = _c(
            "attention_transient",
            mlx.BACKWARD_SCORE_TENSORS * u,
            f"MLX's attention backward: {mlx.BACKWARD_SCORE_TENSORS:g} score tensors in flight",
        )
        return LayerPeaks([*held, fwd], [*held, bwd], one_layer)
    dense = act.layer_activations(a, setup, regime, moe=False)
    fwd = _c(
        "attention_transient",
        mlx.FORWARD_SCORE_TENSORS * u + _unsaved_qkv(a, setup, regime),
        f"MLX: q, k, v and {mlx.FORWARD_SCORE_TENSORS:g} score tensors in a checkpointed forward",
    )
    s = setup.seq_len
    in_flight = mlx.LAYERS_HELD * T * (dense.total(s) - s * dense.scores) + mlx.SCORE_TENSORS * u
    layer_bwd = max(one_layer, in_flight)
    bwd = _c(
        "layer_recompute",
        layer_bwd,
        f"MLX's evaluation order: {mlx.LAYERS_HELD:g} layers' activations and {mlx.SCORE_TENSORS:g} score "
        "tensors in flight while every checkpoint is held",
    )
    fwd, bwd = _with_lora_transient(spec, setup, regime, fwd, bwd)
    return LayerPeaks([*held, fwd], [*held, bwd], layer_bwd)


def _encoder_working_set(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> Component:
    """An encoder (BERT-style, post-norm) has no vocabulary-wide logits at the end of its forward, so its
    forward peaks inside the last layer, at its feed-forward output: beside what every layer saved, the
    model's embedding output (held by the base model's forward until it returns), the layer's input and
    its attention's LayerNorm output (the residuals; fp32 under autocast, `normed_bytes`), the activation's
    output when the down projection saves no input (frozen), and the projection's output and its dropout's
    (traced: `fitcheck measure` on BERT under the HF Trainer, 12 layers, LoRA: 6.5% under without it)."""
    a = spec.arch
    if a.structure != "encoder" or setup.grad_ckpt:
        return _c("layer_working_set", 0, "")
    c = act.context(setup, regime)
    h, width = a.hidden_size, a.intermediate_size
    normed = act.normed_bytes(a, c)
    lins = layer_linears(a, False)
    down = [x for x in lins if x.role == "mlp" and x.d_out == h]
    up = [x for x in lins if x.role == "mlp" and x.d_in == h]
    qkv = [x for x in lins if x.role == "attn"][:-1]
    frozen_down = not c.full and not any(targeted(a, setup.lora_targets, x) for x in down)
    # a residual that a projection saves as it is (not a cast copy of it) is counted already
    residuals = 2 * (0 if act.saves_input_itself(c, setup, a, qkv, normed) else 1)  # embedding output, input
    residuals += 0 if act.saves_input_itself(c, setup, a, up, normed) else 1  # the attention's LayerNorm out
    per_token = residuals * normed * h + 2 * c.gamma * h + (c.gamma * width if frozen_down else 0)
    rule = "inside the last layer: embedding output, residuals, feed-forward outputs (encoder, no logits)"
    return _c("layer_working_set", setup.tokens * per_token, rule)


def _frozen_unit_graphs(spec: ModelSpec, setup: LlmSetup, held: list[Component]) -> list[Component]:
    """FSDP1 with frozen units (LoRA / QLoRA: the base weights' flat parameters need no gradient) under
    reentrant checkpointing: a frozen unit reshards through a multi-grad hook on its inputs
    (torch/distributed/fsdp/_runtime_utils.py ``_register_post_backward_reshard_only_hook``), which in a
    checkpointed layer is registered in the recompute, on the recomputed tensors, and removed only by
    ``_finalize_params`` when backward ends. Until then it keeps that layer's recomputed graph, and with it
    the detached checkpoint input (its storage) and the gradient accumulated into it: two layer inputs per
    layer already backpropagated. When the last layer recomputes, that is ``(L - 1) x 2`` layer inputs and
    its own checkpoint where the first layer's moment holds ``L`` checkpoints: ``(L - 1) / L`` of the
    checkpoints more. Traced on CPU (bench/fsdp1_frozen_trace.py): removing each hook as it fires takes the
    step back to the run without FSDP; full fine-tuning (no frozen unit) adds nothing
    (docs/distributed.md#fsdp1-frozen-units-trace). Only with ``ckpt_reentrant`` true: non-reentrant
    checkpointing registers the hook in the first forward, on tensors its graph keeps anyway, and today's
    trainers default to it (transformers 5.24 ``_activation_checkpointing_enable``: ``use_reentrant``
    False; 4.35-4.x defaulted to True, so runs of that time say so in their records)."""
    from fitcheck.engine.distributed import STRATEGY_FACTS

    # the hook is registered for every frozen flat parameter, whatever the sharding strategy
    fsdp = setup.strategy is not None and STRATEGY_FACTS[setup.strategy].engine == "fsdp"
    lora = setup.method in ("lora", "qlora")
    if not (fsdp and setup.fsdp_version == 1 and lora and setup.ckpt_reentrant is True):
        return []
    ckpt = sum(c.bytes for c in held if c.name == "checkpoints")
    layers = spec.arch.num_layers
    rule = (
        f"({layers} - 1) / {layers} of the checkpoints: recomputed layers' inputs and their gradients, "
        "kept by FSDP1's reshard-only hooks on frozen units until backward ends"
    )
    return [_c("frozen_unit_graphs", ckpt * (layers - 1) / layers, rule)]


def _with_lora_transient(
    spec: ModelSpec, setup: LlmSetup, regime: Regime, fwd: Component, bwd: Component
) -> tuple[Component, Component]:
    """The last layer's forward and recompute moments, or the LoRA projection transient's where it is
    larger (`engine.lora_transient`; checkpointing only: without it every layer's saved activations
    are held to the forward's end, which the logits moment already counts)."""
    lt = lora_transient.mlp_lora_transient(spec.arch, setup, regime)
    if lt is None:
        return fwd, bwd
    T = setup.tokens
    if T * lt.forward > fwd.bytes:
        fwd = _c("lora_transient", T * lt.forward, lt.rule + ", in the last layer's forward")
    if T * lt.recompute > bwd.bytes:
        bwd = _c("lora_transient", T * lt.recompute, lt.rule + ", in the last layer's recompute")
    return fwd, bwd


def adapter_casts(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> tuple[int, int]:
    """Compute-dtype casts of fp32 LoRA factors under autocast: (all layers, one layer).

    peft keeps adapters in fp32; autocast casts each factor for its matmul and the matmul saves the
    cast (its input needs a gradient), and the autocast cache keeps casts of leaf tensors that need a
    gradient until the forward ends, checkpointing or not (traced: -1.2% at rank 256 without them).
    """
    ctx = act.context(setup, regime)
    if not regime.autocast or setup.method == "full" or states.BYTES[regime.adapter_dtype] == ctx.gamma:
        return 0, 0
    a = spec.arch
    if prefix.is_prefix(setup):  # one encoder before the layers: only its Linear weights are cast
        return prefix.matmul_params(a, setup) * ctx.gamma, 0
    per_layer = max((adapter_params_per_layer(a, setup, k) for k in layer_kinds(a)), default=0)
    return adapter_params(a, setup) * ctx.gamma, per_layer * ctx.gamma


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
    per = [(k.count, sum(x.d_in * x.d_out * x.copies for x in k.linears(a))) for k in layer_kinds(a)]
    layers = sum(n * p for n, p in per)
    return layers * ctx.gamma + head, head, max(p for _, p in per) * ctx.gamma


def _warnings(spec: ModelSpec, setup: LlmSetup, derived: int) -> tuple[str, ...]:
    """What the user should know beside the figures: the model's notes, then the setup's caveats."""
    regime = regime_for(setup)
    compiled_note = compiled.warning(spec.arch, setup, regime)
    return (
        *spec.notes,
        *_state_warnings(spec, setup, derived),
        *_setup_warnings(spec, setup, regime),
        *_kbit_warnings(setup),
        *_length_warnings(spec, setup),
        *_tower_warnings(spec, setup),
        *_target_warnings(spec, setup),
        *([compiled_note] if compiled_note else []),
    )


def _target_warnings(spec: ModelSpec, setup: LlmSetup) -> list[str]:
    """Named LoRA targets this model lacks, beside names it has: peft ignores them (`unmatched_targets`)."""
    if setup.method == "full":
        return []
    missing = unmatched_targets(spec.arch, setup.lora_targets)
    if not missing:
        return []
    return [
        f"--lora-targets: this model has no module {', '.join(repr(w) for w in missing)}; peft ignores "
        "a target that matches nothing when another one matches, and so does this estimate"
    ]


def _tower_warnings(spec: ModelSpec, setup: LlmSetup) -> list[str]:
    """LoRA in a multimodal model's vision tower (docs/methodology.md#peft-reach)."""
    if setup.method == "full" or not tower_targets(spec.arch, setup.lora_targets):
        return []
    n = sum(k for _, _, k in spec.arch.tower_linears)
    tower = f"the vision tower's and projector's {n} linear layers"
    if setup.lora_targets == "all-linear":
        what = f"all-linear also wraps {tower} (peft takes every nn.Linear but the output layer)"
    else:  # linear-modules: the leaf names reach the tower, and a convolution sharing one (tower_convs)
        convs = sum(k for _, _, k in spec.arch.tower_convs)
        conv = f" and {convs} patch convolution" if convs else ""
        what = f"--lora-targets {setup.lora_targets} also wraps {tower}{conv} (their leaf names match there)"
    return [
        f"{what}: {tower_adapter_params(spec.arch, setup):,} adapter parameters, "
        "counted with their gradients and optimizer states; the tower's own activations are not modelled. "
        "--lora-targets attn or named projections keep LoRA in the language model"
    ]


def _unquantized_dtype(regime: Regime) -> str:
    """The words for the non-quantized parameters' dtype after the regime's k-bit path."""
    if regime.kbit_upcast:
        return "fp32 (kbit upcast)"
    if regime.kbit_norms_fp32:
        return f"fp32 norms, {regime.weight_dtype} embeddings / lm_head (TRL 0.9-0.25 cast-back)"
    return regime.weight_dtype


def _kbit_warnings(setup: LlmSetup) -> list[str]:
    """peft's k-bit preparation under the HF Trainer: which path the estimate took, and its checkpointing."""
    if setup.trainer != "hf" or not kbit_base(setup):
        return []
    if kbit_prep(setup):
        # TRL 0.9-0.25 hands prepare_model_for_kbit_training args.gradient_checkpointing (SRC_TRL_LEGACY)
        if setup.grad_ckpt or kbit_path(setup) == "trl-legacy":
            return []
        return [
            "peft's prepare_model_for_kbit_training turns gradient checkpointing on by default "
            "(use_gradient_checkpointing=True); add --grad-ckpt to estimate that run"
        ]
    if setup.kbit_prep is not None or setup.kbit_path is not None or setup.distributed:
        return []
    return [
        "--trainer hf with a k-bit base follows TRL's SFTTrainer (1.16: no prepare_model_for_kbit_training, "
        "adapters cast to bf16); a script that calls peft's prepare_model_for_kbit_training itself holds "
        "embeddings, norms, lm_head and the residual stream in fp32: add --kbit-prep to estimate that run "
        "(--kbit-path trl-legacy for TRL 0.9-0.25, none for a plain HF Trainer script)"
    ]


def _state_warnings(spec: ModelSpec, setup: LlmSetup, derived: int) -> list[str]:
    """Where the counted states may differ from what the device shows: checkpoint vs config, paging."""
    w: list[str] = []
    declared = spec.declared_params
    if spec.source_kind == "safetensors" and declared and abs(declared - derived) > 0.01 * declared:
        w.append(
            f"the safetensors headers hold {declared:,} parameters but the config describes {derived:,}; "
            "the estimate follows the config (extra tensors such as a vision tower are not modelled)"
        )
    paged = states.paged_optimizer_bytes(spec.arch, setup)
    if paged:
        w.append(
            f"{setup.optimizer} keeps {gib(paged):.1f} GiB of optimizer states in CUDA managed memory "
            "(bitsandbytes get_paged): counted in device_bytes, but torch.cuda's peak counters do not "
            "show them, and when the device runs short the driver pages them to the CPU (slower steps) "
            "instead of failing; the verdict lets the ones over the budget page"
        )
    return w


#: Position rows a model reserves before its first token's: OPT's ``OPTLearnedPositionalEmbedding``
#: (``offset = 2``, modeling_opt.py) and RoBERTa-style embeddings, whose positions start after
#: ``padding_idx`` (1: ``create_position_ids_from_input_ids``, modeling_roberta.py).
POSITION_OFFSET: dict[str, int] = {"opt": 2, "roberta": 2, "xlm-roberta": 2, "camembert": 2}


def usable_positions(a: DecoderArch) -> int | None:
    """Tokens a learned position table can place (`POSITION_OFFSET` rows reserved); None without one."""
    if not a.learned_positions:
        return None
    return a.learned_positions - POSITION_OFFSET.get(a.model_type, 0)


def _length_warnings(spec: ModelSpec, setup: LlmSetup) -> list[str]:
    """A padding-free row's mask under SDPA (its size); a sequence longer than a learned position table
    (GPT-2's ``n_positions``, BERT's and OPT's ``max_position_embeddings``, less the rows OPT and RoBERTa
    reserve) cannot run: the position lookup indexes past the table (``nn.Embedding``: index out of range).
    Sized as asked, with the warning."""
    out: list[str] = []
    if setup.padding_free and act.sdpa_takes_masks(spec.arch, setup):
        n = setup.mask_keys
        out.append(
            f"padding-free under SDPA: the flattened row of {setup.batch_size} x {setup.seq_len:,} tokens "
            f"gets one block-diagonal mask, which every layer copies ({n:,} x {n:,}, attention_mask_copies) "
            "beside K/V at every head; --attn flash attends per example without it"
        )
    usable = usable_positions(spec.arch)
    if usable is None or setup.seq_len <= usable:
        return out
    return [
        *out,
        f"{spec.name} has {usable:,} learned positions: a sequence of {setup.seq_len:,} tokens cannot run "
        f"(the position lookup goes past its table); give --seq-len {usable:,} or less",
    ]


def _setup_warnings(spec: ModelSpec, setup: LlmSetup, regime: Regime) -> list[str]:
    """Trainer defaults the setup leaves out, and kernels or layouts that cost more than one may think."""
    w: list[str] = []
    if setup.trainer == "unsloth" and not setup.grad_ckpt:
        w.append(
            "Unsloth turns its offloaded gradient checkpointing on by default "
            "(use_gradient_checkpointing='unsloth'); add --grad-ckpt to estimate that run"
        )
    if setup.trainer == "litgpt" and setup.method == "qlora" and setup.optimizer != "adamw":
        w.append("litgpt's finetune scripts use bitsandbytes PagedAdamW (32-bit) whenever they quantize")
    if setup.trainer == "litgpt":
        w.append(
            "litgpt runs its own model code (litgpt/model.py): what it saves beyond transformers' layout is "
            "modelled from that code, but litgpt's published QLoRA peaks still sit up to 15% above this"
        )
    if setup.method == "qlora" and setup.backend == "mps" and setup.trainer != "mlx":
        w.append(
            "bitsandbytes 4-bit weights work on MPS only in recent releases; MLX with a 4-bit model "
            "is the native path on Apple silicon (--trainer mlx)"
        )
    if setup.backend == "mps" and setup.attn != "eager":
        w.append(
            "MLX: mx.fast.scaled_dot_product_attention runs unfused whenever gradients are traced on "
            "Metal (mlx 0.32 use_fallback), so attention keeps b x heads x s^2 scores in training (counted)"
            if setup.trainer == "mlx"
            else "MPS: SDPA has no memory-efficient backward, so attention keeps b x heads x s^2 scores per "
            "layer in training (counted in attention_scores)"
        )
    if act.sdpa_math(spec.arch, setup, regime):
        w.append(
            "fp32 attention on a grouped-query model: transformers hands SDPA the K/V unexpanded, which "
            "neither PyTorch's flash kernel (fp16/bf16 only) nor, before pytorch#191085, its memory-"
            "efficient kernel takes, so SDPA runs its math kernel and keeps b x heads x s^2 fp32 "
            "probabilities per layer (counted in attention_scores); train in bf16 or fp16 to keep it O(s)"
        )
    windowed = act.windowed_layers(spec.arch, setup)
    if windowed:
        w.append(
            f"past its {spec.arch.sliding_window:,}-token sliding window, SDPA gets a mask in {windowed} of "
            f"{spec.arch.num_layers} layers: each keeps its own b x s x s copy of it and, on a grouped-query "
            "model, K/V at every head (counted); --attn flash applies the window without a mask"
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
    w += moe_layout_warnings(spec.arch, setup)
    return w


def moe_layout_warnings(a: DecoderArch, setup: LlmSetup) -> list[str]:
    """What the MoE experts' layout (``--moe-layout``) and the trainer make of a quantized base
    (docs/methodology.md#moe-experts-layout)."""
    if not a.is_moe:
        return []
    out = []
    if setup.moe_layout == "per-expert" and a.model_type in quant.FUSED_IN_V4:
        out.append(
            f"--moe-layout per-expert: {a.model_type} held its experts as 3-D parameters in transformers 4.x "
            "too; sized as fused"
        )
    v4_placement = setup.strategy == "device-map" and setup.device_map_version == 4
    if v4_placement and setup.moe_layout == "fused" and a.model_type not in quant.FUSED_IN_V4:
        out.append(
            "--device-map-version 4 poses transformers 4.x's placement only: its experts were per-expert "
            "nn.Linear modules, which --moe-layout per-expert poses"
        )
    return out + _quantized_experts_warnings(a, setup)


def _quantized_experts_warnings(a: DecoderArch, setup: LlmSetup) -> list[str]:
    if not states.quantized_base(setup):
        return []
    if quant.experts_unquantized(a, setup):
        what = "QLoRA" if setup.method == "qlora" else "--base-quant int8"
        return [
            f"{what} on MoE with transformers 5 (--moe-layout fused): the experts are fused 3-D parameters "
            "and bitsandbytes quantizes nn.Linear only, so they stay unquantized (16-bit, fp32 after k-bit "
            "preparation; counted in weights_unquantized; bitsandbytes issue #1849, no released fix); a "
            "transformers 4.x run "
            "(--moe-layout per-expert), --trainer unsloth or a GPTQ / AWQ base quantizes them"
        ]
    if setup.trainer == "unsloth":
        return [
            "QLoRA on MoE under Unsloth: experts taken as 4-bit (unsloth-zoo packs the fused experts as one "
            "Params4bit each, PRs #527 / #809, and dequantizes a whole stack per forward) with no merged "
            "copy (Split LoRA); unclear beyond that: its forward covers listed families only (unsloth-zoo "
            "issue #850) and its Qwen3.5 guide still advises bf16 LoRA for MoE; --trainer hf sizes 16-bit "
            "experts"
        ]
    return []
