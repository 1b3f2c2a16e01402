"""The registry of component ids: every named line an estimate's phases can hold, with its rule's docs.

Both estimators (the decoder engine and the diffusion simulator) name components only through
`component`, so an id is stable, documented once (docs/json.md lists this table; a test keeps the two
in sync) and points to the section that gives its rule for that workload.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from fitcheck.models import Component
from fitcheck.vocab import Kind

METHODOLOGY = "docs/methodology.md#"
DIFFUSION = "docs/diffusion.md#"
DISTRIBUTED = "docs/distributed.md#"


#: What a memory line is, as a user reads a memory picture (the chart colours and groups by it).
Category = Literal["weights", "gradients", "optimizer states", "activations", "temporaries", "overhead"]


@dataclass(frozen=True)
class ComponentId:
    """A stable component id: what it counts, its category, and the docs section of its rule per workload."""

    id: str
    what: str
    llm: str | None = None  # anchor in docs/methodology.md
    diffusion: str | None = None  # anchor in docs/diffusion.md
    multi: str | None = None  # anchor in docs/distributed.md: a multi-GPU line, either workload
    category: Category = field(kw_only=True)
    #: Memory PyTorch's caching allocator never hands out (CUDA managed memory, NCCL's own cudaMalloc):
    #: in the phase totals and on the device, but not in ``torch.cuda.max_memory_allocated/reserved``.
    outside_allocator: bool = field(default=False, kw_only=True)

    def source(self, kind: Kind) -> str:
        if self.multi is not None:
            return DISTRIBUTED + self.multi
        anchor = self.llm if kind == "llm" else self.diffusion
        if anchor is None:
            raise KeyError(f"component {self.id!r} is not a {kind} component")
        return (METHODOLOGY if kind == "llm" else DIFFUSION) + anchor


# One row constructor per category, so every row states its category first.
_weights = partial(ComponentId, category="weights")
_grads = partial(ComponentId, category="gradients")
_states = partial(ComponentId, category="optimizer states")
_acts = partial(ComponentId, category="activations")
_temps = partial(ComponentId, category="temporaries")
_overhead = partial(ComponentId, category="overhead")

# fmt: off
_ROWS = (
    _weights("weights", "trainable weights (full fine-tuning)", "weights"),
    _weights("weights_frozen", "frozen base weights (LoRA)", "weights"),
    _weights("weights_4bit", "NF4 base weights with their quantization constants (QLoRA)", "weights"),
    _weights("weights_unquantized", "layers QLoRA leaves dense (embeddings, norms, lm_head)", "weights"),
    _weights("weights_quantized", "int8 / GPTQ / AWQ base weights with their scales", "quantized-bases"),
    _weights(
        "module_copies", "trained full copies of lm_head / embed_tokens (peft modules_to_save)",
        "lora-on-lm_head-and-embed_tokens",
    ),
    _weights("unet_weights", "the UNet's weights", diffusion="parts"),
    _weights("transformer_weights", "the DiT's weights", diffusion="parts"),
    _weights("text_encoder_weights", "the first text encoder's weights", diffusion="parts"),
    _weights("text_encoder_2_weights", "the second text encoder's weights", diffusion="parts"),
    _weights("text_encoder_3_weights", "the third text encoder's weights (T5)", diffusion="parts"),
    _weights("vae_weights", "the VAE's weights", diffusion="parts"),
    _weights("adapters", "LoRA (and DoRA) parameters, or the prefix encoder's", "weights", "lora"),
    _states("master_weights", "fp32 master copy of trainable weights", "master-copy"),
    _states("optimizer_states", "optimizer states kept between steps", "optimizer-states", "optimizer"),
    _states(
        "optimizer_states_paged", "a paged optimizer's states in CUDA managed memory (bitsandbytes)",
        "optimizer-states", outside_allocator=True,
    ),
    _grads("gradients", "parameter gradients", "gradients", "model-states"),
    _temps(
        "optimizer_transient", "temporaries inside optimizer.step()", "optimizer-step-transients", "optimizer"
    ),
    _acts(
        "inputs", "the batch's inputs (token ids and labels; latents, text states)", "activations", "the-step"
    ),
    _acts("activations", "tensors autograd saved for backward", "activations", "activations"),
    _acts("attention_scores", "eager attention's score tensors", "attention", "attention"),
    _acts("attention_mask", "eager attention's additive causal mask (b x s x s)", "attention"),
    _acts(
        "attention_mask_copies",
        "SDPA with an explicit mask (padded batch, prefix tuning): each layer's copy saved for backward",
        "attention-mask-copies",
    ),
    _temps(
        "attention_transient", "eager attention's scores, fp32 copies, gradients (one layer)", "attention"
    ),
    _temps(
        "layer_working_set",
        "encoders: the embedding output, residuals and feed-forward outputs alive inside the last layer",
        "encoder-working-set",
    ),
    _acts(
        "head_inputs", "inputs saved by a trained or LoRA-wrapped lm_head", "lora-on-lm_head-and-embed_tokens"
    ),
    _temps("load_transient", "a 16-bit tensor being quantized or upcast while loading", "load-phase"),
    _acts(
        "encoder_and_cross_attention",
        "encoder-decoder: the encoder stack on the source and the decoder's cross-attention",
        "tasks",
    ),
    _acts("conv_layer", "DeBERTa-v2's ConvLayer after the first layer (conv_kernel_size)", "deberta"),
    _acts(
        "checkpoints",
        "inputs kept by checkpointed layers or blocks",
        "checkpointing",
        "gradient-checkpointing",
    ),
    _acts(
        "held_4bit_inputs",
        "bitsandbytes < 0.43.2 with non-reentrant checkpointing: every layer's 4-bit matmul inputs",
        "bitsandbytes-kept-inputs",
    ),
    _acts(
        "held_int8_inputs",
        "bitsandbytes LLM.int8 with non-reentrant checkpointing: every layer's 8-bit matmul inputs",
        "bitsandbytes-kept-inputs",
    ),
    _acts(
        "kept_quant_inputs",
        "bitsandbytes 4-bit < 0.43.2 or LLM.int8: matmul inputs the graph's nodes keep after the layer's "
        "backward (to the graph's end; through the next forward when the loop holds the step's output)",
        "bitsandbytes-kept-inputs",
    ),
    _acts("final_norm", "the final norm's fp32 input, saved", "activations"),
    _acts("prefix_cache", "prefix tuning: the cache's concatenated keys/values (forward)", "prefix-tuning"),
    _temps(
        "autocast_weight_copies",
        "compute-dtype casts of fp32 weights saved for backward",
        "autocast-weight-copies",
    ),
    _temps(
        "weight_casts", "autocast copies of trained fp32 weights (cached per forward)", diffusion="autocast"
    ),
    _temps("merged_expert_weights", "MoE experts merged with their LoRA factors (peft)", "moe"),
    _temps("merged_expert_grads", "gradient of one layer's merged down-projection experts (peft)", "moe"),
    _acts("logits_loss", "logits, their fp32 upcast and the loss", "logits-and-loss"),
    _acts("held_logits", "the model's output logits, held by the loop (--keep-logits)", "logits-and-loss"),
    _temps("dequant_transient", "one quantized weight dequantized to the compute dtype", "weights"),
    _acts("layer_recompute", "one layer's activations recomputed from its checkpoint", "checkpointing"),
    _temps(
        "lora_transient", "a LoRA-wrapped MLP input's base output, scaled branch and sum (one layer)",
        "lora-projection-transient",
    ),
    _grads(
        "tied_embedding_grads", "lm_head and embedding gradients before they are summed", "gradients"
    ),
    _grads("activation_gradients", "gradients of activations alive in backward", diffusion="backward"),
    _temps("backward_temporaries", "scratch of backward ops (reductions)", diffusion="backward"),
    _acts("vae_encode", "the VAE encoder at full resolution (latents not cached)", diffusion="parts"),
    _acts("text_encoder_activations", "the text encoders' forward", diffusion="parts"),
    # several GPUs (docs/distributed.md): per-GPU lines of DDP, DeepSpeed ZeRO and FSDP, and host lines
    _grads("ddp_grad_buckets", "DDP's allreduce buckets (a copy of the gradients)", multi="ddp"),
    _weights("param_partitions", "ZeRO-3 parameter partitions (1/N)", multi="zero3-params"),
    _weights("persistent_params", "ZeRO-3 params under the persistence threshold", multi="zero3-params"),
    _weights(
        "zero3_unpartitioned",
        "ZeRO-3 on a quantized base (no zero.Init): the whole model on each GPU before partitioning",
        multi="zero3-no-init",
    ),
    _weights(
        "gathered_params",
        "ZeRO-3 params gathered: module + prefetch + layers kept to backward",
        multi="zero3-gather",
    ),
    _states("fp32_master_partition", "DeepSpeed's fp32 partition of trainables", multi="zero-optimizer"),
    _grads("fp32_grad_partition", "the partition's fp32 gradient at the step", multi="zero-optimizer"),
    _grads("gradient_partition", "ZeRO-2/3 gradient partition", multi="zero-grads"),
    _grads("reduce_buckets", "DeepSpeed's IPG reduce buckets", multi="buckets"),
    _weights("param_shards", "FSDP parameter shards (1/N)", multi="fsdp-shards"),
    _grads("gradient_shards", "FSDP gradient shards (1/N)", multi="fsdp-shards"),
    _weights("root_params", "FSDP root unit kept unsharded from forward to backward", multi="fsdp-units"),
    _weights("gathered_units", "FSDP layers all-gathered (current and prefetched)", multi="fsdp-units"),
    _grads("unit_grads", "FSDP unsharded gradients before their reduce-scatter", multi="fsdp-units"),
    _grads("no_sync_grads", "FSDP unsharded gradients held while accumulating", multi="fsdp-no-sync"),
    _grads(
        "offload_grad_shards", "FSDP1 CPU offload: gradient shards kept on the GPU until backward ends",
        multi="fsdp-offload-grads",
    ),
    _acts(
        "frozen_unit_graphs",
        "FSDP1 frozen units, reentrant checkpointing: each recomputed layer's input and its gradient kept "
        "until backward ends",
        multi="fsdp1-frozen-units-trace",
    ),
    _overhead("nccl_communicators", "NCCL communicator memory", multi="nccl", outside_allocator=True),
    _acts("output_copy", "device-map: the model's output copied back to the first GPU", multi="device-map"),
    _weights("model_load", "host: the model read into CPU RAM while loading", multi="loading"),
    _overhead(
        "allocator_history",
        "cached segments the allocator kept from shorter steps (--lengths varying) or beside DeepSpeed "
        "ZeRO's step copies (released on demand)",
        "allocator-history-over-varying-lengths",
    ),
    _overhead("offload_buffers", "host: DeepSpeed's pinned and staging buffers for offload", multi="host"),
)
# fmt: on

REGISTRY: dict[str, ComponentId] = {row.id: row for row in _ROWS}
#: Components torch.cuda's counters cannot see (`ComponentId.outside_allocator`).
OUTSIDE_ALLOCATOR: frozenset[str] = frozenset(row.id for row in _ROWS if row.outside_allocator)


def component(name: str, value: float, rule: str, kind: Kind) -> Component:
    """A named line of a phase: bytes (rounded, never negative), this instance's rule, the id's source.

    Raises:
        KeyError: ``name`` is not a registered id for ``kind`` (register it here and in docs/json.md).
    """
    return Component(name=name, bytes=max(0, round(value)), rule=rule, source=REGISTRY[name].source(kind))
