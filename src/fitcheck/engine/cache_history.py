"""Allocator history over varying lengths: what the caching allocator keeps from a run's shorter steps.

A run on unpacked data padded to the longest of each batch (``--lengths varying``) runs its steps at many
lengths up to ``seq_len``. PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp at 001074d,
the reading of docs/methodology.md "The reserve line against published reserved figures") serves a request
only from a cached free block at least as large (best fit within the pool), cuts a new segment otherwise,
and gives cached segments back to the driver only when a ``cudaMalloc`` fails (``malloc`` then calls
``release_cached_blocks`` and retries) or on ``empty_cache``. So a step longer than every step before it
cannot reuse the blocks cut for their shorter tensors and cuts its own; those stay cached, and a
``max_memory_reserved`` or nvidia-smi reading over the run sits above one step at ``seq_len``.

The schedule is stated, not drawn: the run reaches ``seq_len`` through new maxima at ``seq_len / 2``,
``seq_len / 4``, ... (each new maximum's length-dependent tensors twice its predecessor's, so none fits a
block cut for the same tensor before); each rung's length-dependent bytes are taken from the engine's own
step at that length (at its forward or its backward peak, whichever holds more of them), with the engine's
fragmentation share (engine/overhead.py ``FRAGMENTATION``). The ladder stops where a rung's
length-dependent bytes fit one 20 MiB segment (``kLargeBuffer``, which the allocator shares between 1-10 MiB
requests). The rule ignores what a longer step's smaller tensors reuse
of the cached blocks (it over-counts there) and the finer records of a shuffled run (it under-counts
there); docs/methodology.md, "Allocator history over varying lengths", says where each wins.

The bytes are releasable cache: a reading shows them on a card with room, but a run that needs the
memory gets it back when its ``cudaMalloc`` fails. They are therefore not in ``device_bytes`` (the verdict
and the planner never count them) and sit in ``Estimate.cache_history``.
"""

from __future__ import annotations

from collections.abc import Callable

from fitcheck.components import component
from fitcheck.engine.band import kind_of
from fitcheck.engine.overhead import FRAGMENTATION
from fitcheck.facts.allocator import LARGE_BUFFER
from fitcheck.models import Component, Estimate, Phase

#: The phases whose peaks hold the length-dependent tensors (the optimizer step holds none).
STEP_PHASES = ("forward", "backward")
RULE = (
    "caching-allocator segments cut for shorter steps of a varying-length run (new maxima at seq_len/2, /4, "
    "...), kept until a cudaMalloc fails: in max_memory_reserved and nvidia-smi, released on demand, not "
    "counted toward the fit"
)


def rungs(seq_len: int) -> list[int]:
    """The shorter new maxima the stated schedule runs before ``seq_len``: ``seq_len // 2**k``, k >= 1."""
    out: list[int] = []
    n = seq_len // 2
    while n >= 1:
        out.append(n)
        n //= 2
    return out


def activation_peak(est: Estimate) -> Phase:
    """The larger of the forward and backward peaks (the phases that hold length-dependent tensors)."""
    return max((p for p in est.phases if p.name in STEP_PHASES), key=lambda p: p.total_bytes)


def length_bytes(at_len: Estimate, one_token: Estimate) -> int:
    """Bytes of ``at_len``'s forward or backward peak (the larger) that grow with the length: each transient
    line less the same line of the same phase in a one-token step (a line that does not grow, such as an
    optimizer or dequant temporary, reuses its block every step)."""
    return max(_grown(at_len.phase(name), one_token.phase(name)) for name in STEP_PHASES)


def _grown(phase: Phase, base_phase: Phase) -> int:
    """Transient bytes of ``phase`` beyond the same lines of ``base_phase``."""
    base = {c.name: c.bytes for c in base_phase.components}
    grown = (c.bytes - base.get(c.name, 0) for c in phase.components if kind_of(c.name) == "transient")
    return sum(max(0, g) for g in grown)


def history_bytes(step_at: Callable[[int], Estimate], seq_len: int) -> int:
    """Cached bytes the schedule's shorter rungs leave behind: each rung's length-dependent bytes with the
    fragmentation share, until a rung fits one shared 20 MiB segment."""
    one = step_at(1)
    total = 0
    for n in rungs(seq_len):
        cut = length_bytes(step_at(n), one)
        if cut <= LARGE_BUFFER:
            break
        total += round(cut * (1 + FRAGMENTATION))
    return total


def reading_excess(est: Estimate, history: int) -> int:
    """What a whole-run reading holds above the step's own peak: the history sits beside the activation
    peak of the longest step; a peak in the optimizer step (after the activations are freed) may hide it."""
    return max(0, activation_peak(est).total_bytes + history - est.peak_allocated_bytes)


def history_component(est: Estimate, step_at: Callable[[int], Estimate], seq_len: int) -> Component:
    """The ``allocator_history`` line of ``est``, a step at ``seq_len`` (``step_at(n)``: the step at n)."""
    return component("allocator_history", reading_excess(est, history_bytes(step_at, seq_len)), RULE, "llm")
