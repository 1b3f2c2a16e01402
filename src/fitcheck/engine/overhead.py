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
#: c10/cuda/CUDACachingAllocator.cpp ``kSmallSize``: a request of at most 1 MiB is served from the small
#: pool (2 MiB segments shared by many blocks, 512-byte rounding).
SMALL_REQUEST = allocator.SMALL_SIZE
#: Short-lived blocks fragment the cache: measured reserved/allocated 1.07-1.49 (fitcheck-llm, T4);
#: Megatron adds 5%. Applied to activations and transients only (weights are allocated once).
FRAGMENTATION = 0.15


def context_bytes(backend: str, target_context: int | None = None) -> int:
    """Memory the runtime holds outside PyTorch's allocator (CUDA/ROCm context)."""
    if target_context is not None:
        return target_context
    return DEFAULT_CONTEXT_MIB[backend] * MIB


def rounding_slack(nbytes: float) -> int:
    """Bytes the caching allocator reserves beyond one long-lived tensor of ``nbytes`` when it is
    allocated alone (c10/cuda/CUDACachingAllocator.cpp at 001074d): every request is rounded up to 512 B
    (``round_size``, ``kMinBlockSize``); one over 1 MiB and under 10 MiB (``kMinLargeAlloc``) is cut from a
    20 MiB ``kLargeBuffer`` segment that the next such requests share (``get_allocation_size``), so it
    loses only the 512 B rounding, as does a small-pool request (2 MiB ``kSmallBuffer`` segments); one of
    10 MiB or more gets its own segment rounded up to 2 MiB (``kRoundLarge``), and what is left over stays
    reserved (split off as a free block when over 1 MiB, ``should_split``, else inside the block).
    Zero for the power-of-two shaped weights of most LLMs (4096 x 4096 x 2 B is 32 MiB)."""
    size = -(-int(nbytes) // allocator.MIN_BLOCK) * allocator.MIN_BLOCK
    if size < allocator.MIN_LARGE_ALLOC:
        return size - int(nbytes)
    segment = -(-size // allocator.ROUND_LARGE) * allocator.ROUND_LARGE
    return segment - int(nbytes)


def reserve_bytes(backend: str, rounding: int, transient_bytes: int) -> int:
    """What the caching allocator holds beyond the allocated peak: the rounding of the long-lived
    tensors (the sum of their `rounding_slack`) and the fragmentation of the short-lived ones."""
    if backend not in allocator.BACKENDS:
        return 0
    return rounding + int(FRAGMENTATION * transient_bytes)
