"""Bytes a real forward saves for backward (saved-tensor hooks on a CPU step): what the backward will read."""

from __future__ import annotations

from typing import Any


def saved_bytes(model: Any, **inputs: Any) -> int:
    """Bytes of every storage autograd saves in one real forward of ``model(**inputs)``, each once."""
    import torch

    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(**inputs)
    return sum(seen.values())


def forward_lines(spec: Any, setup: Any) -> int:
    """The engine's saved activations and SDPA mask copies at the forward's peak: what a real step's saved
    tensors are compared with."""
    from fitcheck.engine.estimate import estimate

    est = estimate(spec, setup)
    keep = ("activations", "attention_mask_copies")
    return sum(c.bytes for c in est.phase("forward").components if c.name in keep)
