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

The same rule holds within one step of any length (``step_segment_bytes``): DeepSpeed ZeRO's optimizer step
converts each gradient partition through new flat tensors (``fp32_grad_partition``), each one tensor larger
than every block the forward and backward cut; the allocator cuts segments for them beside the activations'
cached blocks, and a whole-run reading holds both (docs/methodology.md, "The optimizer step's segments").

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
from fitcheck.facts.dtypes import nbytes
from fitcheck.models import Component, Estimate, Phase

#: The phases whose peaks hold the length-dependent tensors (the optimizer step holds none).
STEP_PHASES = ("forward", "backward")
RULE = (
    "caching-allocator segments cut for shorter steps of a varying-length run (new maxima at seq_len/2, /4, "
    "...), kept until a cudaMalloc fails: in max_memory_reserved and nvidia-smi, released on demand, not "
    "counted toward the fit"
)
STEP_RULE = (
    "caching-allocator segments cut for the optimizer step's flat gradient copies (DeepSpeed ZeRO), larger "
    "than any block cut in forward or backward, kept beside those blocks until a cudaMalloc fails: in "
    "max_memory_reserved and nvidia-smi, released on demand, not counted toward the fit"
)
#: The step component whose tensors are DeepSpeed's flattened gradient conversion (engine/distributed.py
#: ``_step_grad``: ``(4 + src)`` bytes per element, ``src`` the 16-bit flatten, 0 in fp32).
STEP_FLAT = "fp32_grad_partition"  # its bytes per element: engine/distributed.py ``flat_source_bytes`` + 4


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


def step_flat_tensors(est: Estimate) -> list[int]:
    """Bytes of each flat tensor DeepSpeed's optimizer step allocates for one gradient partition (ZeRO-1/2)
    or sub_group (ZeRO-3): ``self.flatten(self.averaged_gradients[i]).to(fp32)`` (stage_1_and_2.py
    L1764-1769, stage3.py ``_prepare_fp32_grad_for_sub_group`` L1774, DeepSpeed v0.12.3 @6ea44d02; the same at
    v0.13.1 @1d35db76): the 16-bit concatenation, then its fp32 copy; in fp32 ``.to`` returns the
    concatenation itself, one tensor. Empty when the step has no such conversion."""
    flat = next((c for c in est.phase("optimizer_step").components if c.name == STEP_FLAT), None)
    if flat is None or flat.bytes <= 0:
        return []
    from fitcheck.engine.distributed import flat_source_bytes

    src = flat_source_bytes(nbytes(est.setup.precision))
    n = flat.bytes // (4 + src)
    return [src * n, 4 * n] if src else [4 * n]


def largest_block(est: Estimate, tokens: int, vocab: int, head_params: int) -> int:
    """An upper bound on the largest block the forward and backward cut on the compute stream: the batch's
    logits in fp32 (tokens x vocabulary x 4 B); in full fine-tuning the largest of the output layer and the
    embedding (``head_params``) as a whole gradient before DeepSpeed reduces it (ZeRO makes each gradient at
    full size first), at 4 B; a quantized weight's dequantization (``dequant_transient``, one projection).
    A step tensor at most this large is taken to fit a cached block and is not counted (so the rule
    under-counts rather than over-counts)."""
    full = est.setup.method == "full"
    dequant = max(
        (c.bytes for p in est.phases for c in p.components if c.name == "dequant_transient"), default=0
    )
    return max(4 * tokens * vocab, 4 * head_params if full else 0, dequant)


def step_segment_bytes(est: Estimate, largest: int) -> int:
    """The step's flat tensors (``step_flat_tensors``) that no block cut in forward or backward can hold:
    the caching allocator serves a request from a cached free block of the same stream at least as large
    (best fit) and cuts a new segment otherwise, and it keeps cached segments until a ``cudaMalloc`` fails
    (c10/cuda/CUDACachingAllocator.cpp at 001074d, ``malloc`` / ``get_free_block``), so the activations'
    blocks stay reserved beside the step's segments (and the next forward reuses both)."""
    return sum(t for t in step_flat_tensors(est) if t > largest)


def history_component(
    est: Estimate, step_at: Callable[[int], Estimate] | None, seq_len: int, step_segments: int = 0
) -> Component:
    """The ``allocator_history`` line of ``est``, a step at ``seq_len`` (``step_at(n)``: the step at n, or
    None for a fixed-length run, which has no rungs), with the optimizer step's segments."""
    rungs_bytes = history_bytes(step_at, seq_len) if step_at is not None else 0
    rule = RULE if step_at is not None else STEP_RULE
    if step_at is not None and step_segments:
        rule += "; with the optimizer step's flat gradient copies (DeepSpeed ZeRO)"
    return component("allocator_history", reading_excess(est, rungs_bytes + step_segments), rule, "llm")
