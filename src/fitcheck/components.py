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


@dataclass(frozen=True)
class ComponentId:
    """A stable component id: what it counts, and the docs section of its rule per workload."""

    id: str
    what: str
    llm: str | None = None  # anchor in docs/methodology.md
    diffusion: str | None = None  # anchor in docs/diffusion.md

    def source(self, kind: Kind) -> str:
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
    ComponentId("dequant_transient", "one quantized weight dequantized to the compute dtype", "weights"),
    ComponentId("layer_recompute", "one layer's activations recomputed from its checkpoint", "checkpointing"),
    ComponentId(
        "tied_embedding_grads", "lm_head and embedding gradients before they are summed", "gradients"
    ),
    ComponentId("activation_gradients", "gradients of activations alive in backward", diffusion="backward"),
    ComponentId("backward_temporaries", "scratch of backward ops (reductions)", diffusion="backward"),
    ComponentId("vae_encode", "the VAE encoder at full resolution (latents not cached)", diffusion="parts"),
    ComponentId("text_encoder_activations", "the text encoders' forward", diffusion="parts"),
)
# fmt: on

REGISTRY: dict[str, ComponentId] = {row.id: row for row in _ROWS}


def component(name: str, value: float, rule: str, kind: Kind) -> Component:
    """A named line of a phase: bytes (rounded, never negative), this instance's rule, the id's source.

    Raises:
        KeyError: ``name`` is not a registered id for ``kind`` (register it here and in docs/json.md).
    """
    return Component(name=name, bytes=max(0, round(value)), rule=rule, source=REGISTRY[name].source(kind))
