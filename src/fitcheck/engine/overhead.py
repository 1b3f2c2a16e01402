"""Process overhead: CUDA context and the caching allocator's reserve.

The context is data per GPU generation in the hardware catalog; without a target the default is the
most recent public measurement (docs/methodology.md, "Overhead"). The allocator reserve model is
provisional: no GPU measurement has been made by this project yet (see docs/accuracy.md).
"""

from __future__ import annotations

from fitcheck.facts import allocator
from fitcheck.facts.context import DEFAULT_CONTEXT_MIB
from fitcheck.units import MIB

# Context per process when the GPU is not in the catalog (the catalog holds one per generation):
# the one table of defaults is fitcheck.facts.context.
#: The caching allocator rounds large blocks up to 2 MiB (``kRoundLarge``, facts/allocator.py): on average
#: half of it, 1 MiB, lost per large live tensor.
ROUNDING_PER_TENSOR = allocator.ROUND_LARGE // 2
#: c10/cuda/CUDACachingAllocator.cpp ``kSmallSize``: a request of at most 1 MiB is served from the small
#: pool (2 MiB segments shared by many blocks, 512-byte rounding), so only larger tensors count for the
#: rounding above (the engine's tensor count, engine/estimate.py ``_tensor_count``).
SMALL_REQUEST = allocator.SMALL_SIZE
#: Short-lived blocks fragment the cache: measured reserved/allocated 1.07-1.49 (fitcheck-llm, T4);
#: Megatron adds 5%. Applied to activations and transients only (weights are allocated once).
FRAGMENTATION = 0.15


def context_bytes(backend: str, target_context: int | None = None) -> int:
    """Memory the runtime holds outside PyTorch's allocator (CUDA/ROCm context)."""
    if target_context is not None:
        return target_context
    return DEFAULT_CONTEXT_MIB[backend] * MIB


def reserve_bytes(backend: str, live_tensors: int, transient_bytes: int) -> int:
    """What the caching allocator holds beyond the allocated peak."""
    if backend not in allocator.BACKENDS:
        return 0
    return live_tensors * ROUNDING_PER_TENSOR + int(FRAGMENTATION * transient_bytes)
