"""FSDP2 with the input embedding and the lm_head as their own ``fully_shard`` units.

torchtune's ``custom_sharded_layers: ['tok_embeddings', 'output']`` (recipes/full_finetune_distributed.py
and lora_finetune_distributed.py at 30b8519e add ``lambda n, m: n in custom_sharded_layers`` to the shard
conditions that ``training.shard_model`` (torchtune/training/_distributed.py) applies bottom-up before
sharding the root) makes those two modules units of their own, with the recipe's
``reshard_after_forward=True``. Without it they belong to the root unit, which FSDP2 never reshards
after forward ("For the root, do not reshard after forward since for training, the parameters would be
freed and all-gathered immediately": ``FSDPState._lazy_init``, torch/distributed/_composable/fsdp/
_fsdp_state.py at 005da465; fsdp/_fully_shard/_fsdp_state.py in torch 2.13), so the root holds both
matrices unsharded from the start of forward to the end of backward, and the lm_head's unsharded
gradient from its backward (the first) to the root's reduce-scatter (the last).

As their own units (``FSDPParamGroup.pre_forward`` / ``post_forward`` / ``pre_backward`` /
``post_backward``, _fsdp_param_group.py, same commits): each is all-gathered when its module runs and
resharded after it (``reshard``: ``_reshard_after_forward`` is True for a non-root unit); it is gathered
again in backward by the pre-backward hook on its output, only when that output needs a gradient (the
frozen embedding of a LoRA run is never gathered in backward); its unsharded gradient lives until its
own reduce-scatter, right after its backward (a module called once per chunk, as torchtune's chunked
``output`` is, registers one post-backward per call: "N chunk calls produce N reduce-scatters",
``fully_shard`` docstring, torch 2.13). The root keeps the final norm (and learned positions).

This module says what is unsharded at each moment of a step, for the per-phase sums of
engine/distributed.py (docs/distributed.md#fsdp-embedding-units). Numbers in, bytes out.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Held:
    """Unsharded parameters and unsharded gradients at one moment, and what the moment is."""

    gathered: int
    grads: int
    moment: str

    @property
    def total(self) -> int:
        return self.gathered + self.grads


@dataclass(frozen=True)
class UnitSizes:
    """Bytes of each unit gathered in the compute dtype, and of its unsharded gradient."""

    layer: int
    layer_grads: int
    embedding: int
    embedding_grads: int  # 0 when the embedding is frozen
    head: int
    head_grads: int  # 0 when the lm_head is frozen
    prefetch: int  # units unsharded at once in forward: FSDP2's current + the implicitly prefetched next


@dataclass(frozen=True)
class EmbeddingUnits:
    """The largest moment of each phase (forward, backward at its start, backward)."""

    forward: Held
    backward_start: Held
    backward: Held


def _forward(u: UnitSizes) -> Held:
    """Forward runs embedding, layers, lm_head, each gathered in turn while the next is prefetched;
    torchtune's chunked output gathers the lm_head again for every chunk (one unit, resharded after)."""
    extra = (u.prefetch - 1) * u.layer
    moments = [
        Held(u.embedding + extra, 0, "the embedding, the first layer prefetched"),
        Held(u.prefetch * u.layer, 0, f"{u.prefetch} layer(s): current + prefetch"),
        Held(u.head + extra, 0, "the lm_head, after the last layer"),
    ]
    # a tie goes to the later moment: the phase's activations (checkpoints, logits) are there
    return max(reversed(moments), key=lambda h: h.total)


def _backward(u: UnitSizes) -> list[Held]:
    """Backward, in its order: the lm_head (gathered again by its pre-backward hook, the last layer
    prefetched), every layer (current + the next prefetched), then the embedding, which is gathered
    again only when it trains (a frozen embedding's output needs no gradient, so no hook fires)."""
    out = [
        Held(u.head + u.layer, u.head_grads, "the lm_head's backward, the last layer prefetched"),
        Held(2 * u.layer, u.layer_grads, "a layer's backward, the next prefetched"),
    ]
    if u.embedding_grads:
        out.append(
            Held(u.layer + u.embedding, u.layer_grads, "the first layer's backward, the embedding prefetched")
        )
        out.append(Held(u.embedding, u.embedding_grads, "the embedding's backward"))
    return out


def embedding_units(u: UnitSizes) -> EmbeddingUnits:
    """What FSDP2 holds unsharded per phase when the embedding and lm_head are their own units.

    At the start of backward (the loss hump) no gradient exists yet; the lm_head is gathered again
    there by the pre-backward hook of its output and the last layer prefetched after it.
    """
    start = Held(u.head + u.layer, 0, "the lm_head gathered again for backward, the last layer prefetched")
    return EmbeddingUnits(_forward(u), start, max(_backward(u), key=lambda h: h.total))
