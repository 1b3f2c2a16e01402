"""The registry of component ids: every named line an estimate's phases can hold, with its rule's docs.

Both estimators (the decoder engine and the diffusion simulator) name components only through
`component`, so an id is stable, documented once (docs/json.md lists this table; a test keeps the two
in sync) and points to the section that gives its rule for that workload.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.models import Component
from fitcheck.vocab import Kind

METHODOLOGY = "docs/methodology.md#"
DIFFUSION = "docs/diffusion.md#"
DISTRIBUTED = "docs/distributed.md#"


@dataclass(frozen=True)
class ComponentId:
    """A stable component id: what it counts, and the docs section of its rule per workload."""

    id: str
    what: str
    llm: str | None = None  # anchor in docs/methodology.md
    diffusion: str | None = None  # anchor in docs/diffusion.md
    multi: str | None = None  # anchor in docs/distributed.md: a multi-GPU line, either workload

    def source(self, kind: Kind) -> str:
        if self.multi is not None:
            return DISTRIBUTED + self.multi
        anchor = self.llm if kind == "llm" else self.diffusion
        if anchor is None:
            raise KeyError(f"component {self.id!r} is not a {kind} component")
        return (METHODOLOGY if kind == "llm" else DIFFUSION) + anchor


# fmt: off
_ROWS = (
    ComponentId("weights", "trainable weights (full fine-tuning)", "weights"),
    ComponentId("weights_frozen", "frozen base weights (LoRA)", "weights"),
    ComponentId("weights_4bit", "NF4 base weights with their quantization constants (QLoRA)", "weights"),
    ComponentId("weights_unquantized", "layers QLoRA leaves dense (embeddings, norms, lm_head)", "weights"),
    ComponentId("weights_quantized", "int8 / GPTQ / AWQ base weights with their scales", "quantized-bases"),
    ComponentId(
        "module_copies", "trained full copies of lm_head / embed_tokens (peft modules_to_save)",
        "lora-on-lm_head-and-embed_tokens",
    ),
    ComponentId("unet_weights", "the UNet's weights", diffusion="parts"),
    ComponentId("transformer_weights", "the DiT's weights", diffusion="parts"),
    ComponentId("text_encoder_weights", "the first text encoder's weights", diffusion="parts"),
    ComponentId("text_encoder_2_weights", "the second text encoder's weights", diffusion="parts"),
    ComponentId("text_encoder_3_weights", "the third text encoder's weights (T5)", diffusion="parts"),
    ComponentId("vae_weights", "the VAE's weights", diffusion="parts"),
    ComponentId("adapters", "LoRA (and DoRA) parameters", "weights", "lora"),
    ComponentId("master_weights", "fp32 master copy of trainable weights", "master-copy"),
    ComponentId("optimizer_states", "optimizer states kept between steps", "optimizer-states", "optimizer"),
    ComponentId("gradients", "parameter gradients", "gradients", "model-states"),
    ComponentId(
        "optimizer_transient", "temporaries inside optimizer.step()", "optimizer-step-transients", "optimizer"
    ),
    ComponentId(
        "inputs", "the batch's inputs (token ids and labels; latents, text states)", "activations", "the-step"
    ),
    ComponentId("activations", "tensors autograd saved for backward", "activations", "activations"),
    ComponentId("attention_scores", "eager attention's score tensors", "attention", "attention"),
    ComponentId("attention_mask", "eager attention's additive causal mask (b x s x s)", "attention"),
    ComponentId(
        "attention_transient", "eager attention's scores, fp32 copies, gradients (one layer)", "attention"
    ),
    ComponentId(
        "head_inputs", "inputs saved by a trained or LoRA-wrapped lm_head", "lora-on-lm_head-and-embed_tokens"
    ),
    ComponentId("load_transient", "a 16-bit tensor being quantized or upcast while loading", "load-phase"),
    ComponentId(
        "encoder_and_cross_attention",
        "encoder-decoder: the encoder stack on the source and the decoder's cross-attention",
        "tasks",
    ),
    ComponentId(
        "checkpoints",
        "inputs kept by checkpointed layers or blocks",
        "checkpointing",
        "gradient-checkpointing",
    ),
    ComponentId("final_norm", "the final norm's fp32 input, saved", "activations"),
    ComponentId(
        "autocast_weight_copies",
        "compute-dtype casts of fp32 weights saved for backward",
        "autocast-weight-copies",
    ),
    ComponentId(
        "weight_casts", "autocast copies of trained fp32 weights (cached per forward)", diffusion="autocast"
    ),
    ComponentId("merged_expert_weights", "MoE experts merged with their LoRA factors (peft)", "moe"),
    ComponentId("logits_loss", "logits, their fp32 upcast and the loss", "logits-and-loss"),
    ComponentId(
        "held_logits", "the model's output logits, held by the loop (--keep-logits)", "logits-and-loss"
    ),
    ComponentId("dequant_transient", "one quantized weight dequantized to the compute dtype", "weights"),
    ComponentId("layer_recompute", "one layer's activations recomputed from its checkpoint", "checkpointing"),
    ComponentId(
        "lora_transient", "a LoRA-wrapped MLP input's base output, scaled branch and sum (one layer)",
        "lora-projection-transient",
    ),
    ComponentId(
        "tied_embedding_grads", "lm_head and embedding gradients before they are summed", "gradients"
    ),
    ComponentId("activation_gradients", "gradients of activations alive in backward", diffusion="backward"),
    ComponentId("backward_temporaries", "scratch of backward ops (reductions)", diffusion="backward"),
    ComponentId("vae_encode", "the VAE encoder at full resolution (latents not cached)", diffusion="parts"),
    ComponentId("text_encoder_activations", "the text encoders' forward", diffusion="parts"),
    # several GPUs (docs/distributed.md): per-GPU lines of DDP, DeepSpeed ZeRO and FSDP, and host lines
    ComponentId("ddp_grad_buckets", "DDP's allreduce buckets (a copy of the gradients)", multi="ddp"),
    ComponentId("param_partitions", "ZeRO-3 parameter partitions (1/N)", multi="zero3-params"),
    ComponentId("persistent_params", "ZeRO-3 params under the persistence threshold", multi="zero3-params"),
    ComponentId("gathered_params", "ZeRO-3 params gathered: module + prefetch", multi="zero3-gather"),
    ComponentId("fp32_master_partition", "DeepSpeed's fp32 partition of trainables", multi="zero-optimizer"),
    ComponentId("fp32_grad_partition", "the partition's fp32 gradient at the step", multi="zero-optimizer"),
    ComponentId("gradient_partition", "ZeRO-2/3 gradient partition", multi="zero-grads"),
    ComponentId("reduce_buckets", "DeepSpeed's IPG reduce buckets", multi="buckets"),
    ComponentId("param_shards", "FSDP parameter shards (1/N)", multi="fsdp-shards"),
    ComponentId("gradient_shards", "FSDP gradient shards (1/N)", multi="fsdp-shards"),
    ComponentId("root_params", "FSDP root unit kept unsharded from forward to backward", multi="fsdp-units"),
    ComponentId("gathered_units", "FSDP layers all-gathered (current and prefetched)", multi="fsdp-units"),
    ComponentId("unit_grads", "FSDP unsharded gradients before their reduce-scatter", multi="fsdp-units"),
    ComponentId("nccl_communicators", "NCCL communicator memory", multi="nccl"),
    ComponentId("model_load", "host: the model read into CPU RAM while loading", multi="loading"),
    ComponentId("offload_buffers", "host: DeepSpeed's pinned and staging buffers for offload", multi="host"),
)
# fmt: on

REGISTRY: dict[str, ComponentId] = {row.id: row for row in _ROWS}


def component(name: str, value: float, rule: str, kind: Kind) -> Component:
    """A named line of a phase: bytes (rounded, never negative), this instance's rule, the id's source.

    Raises:
        KeyError: ``name`` is not a registered id for ``kind`` (register it here and in docs/json.md).
    """
    return Component(name=name, bytes=max(0, round(value)), rule=rule, source=REGISTRY[name].source(kind))
