"""ms-swift's Qwen-1 LoRA rows (issue 10): what the loss region holds, and what the caching allocator keeps.

The published rows (tests/data/published/ms-swift.yaml) grow 6.5-7 MB per token from 512 to 2048
tokens for Qwen-1 1.8B, 7B and 14B alike, about 45 B per entry of the 151,936-token vocabulary. This
script runs the code path of the table's runs on fake tensors at the real vocabulary and counts it:

* Qwen-1's ``QWenLMHeadModel.forward`` (modeling_qwen.py, Qwen/Qwen-7B @d4efd21 lines 1060-1070):
  ``lm_head`` output, ``lm_logits[..., :-1, :].contiguous()``, ``CrossEntropyLoss`` on it;
* under the Trainer's bf16 autocast: transformers 4.36's Trainer calls ``accelerator.prepare(model)``,
  and accelerate (0.25/0.26, accelerator.py ``prepare_model`` @403c0714 lines 1284-1293) wraps the
  forward in ``torch.autocast`` and then in ``convert_outputs_to_fp32``, so the returned logits are an
  fp32 copy (``ConvertOutputsToFp32``, utils/operations.py line 651); CUDA's autocast lists are applied
  on the CPU with ``fitcheck.measure.autocast.cuda_autocast_policy`` (log_softmax in fp32);
* swift's ``Seq2SeqTrainer.compute_loss`` (swift/trainers/trainers.py @97e4d198 lines 172-195): keeps
  ``outputs`` and takes ``outputs.logits.argmax(dim=2)`` for the token accuracy, then returns the loss;
  ``backward`` runs after it returns (Trainer.training_step).

Part 1 prints the live-storage peak of that region per vocabulary entry per token (forward and
backward). Part 2 replays the region's allocations and frees, step after step, through a model of
PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, read at 001074d: sizes rounded
to 512 B; requests up to 1 MiB from 2 MiB small segments; 1-10 MiB from 20 MiB segments; larger ones
rounded to 2 MiB; best fit among cached blocks of the pool; a block split when more than 1 MiB
(large pool) is left; freed blocks merged with free neighbours of the same segment; cached segments
released only when a cudaMalloc fails, which never happens here), and prints the reserved
high-water mark per vocabulary entry per token, for a run at one length and for runs whose
lengths vary up to ``max_length`` in a few orders.

    PYTHONPATH=src python bench/swift_loss.py            # parts 1-2, ~10 s, no GPU
    PYTHONPATH=src python bench/swift_loss.py --whole    # and part 3, ~1 min
    PYTHONPATH=src python bench/swift_loss.py --lengths  # part 4 alone, ~20 min
    PYTHONPATH=src:bench python bench/swift_loss.py --shapes  # part 5 alone, ~10 min
    PYTHONPATH=src python bench/swift_loss.py --device-map  # part 6 alone, ~5 min

Part 2 models the loss region alone. Part 3 traces the whole step (``fitcheck.measure.trace``) of a
model of Qwen-1.8B-Chat's shape posed as qwen2 (the nearest architecture transformers carries; its
loss path is the installed transformers', not Qwen-1's, with the same vocabulary-sized tensors give
or take one bf16 copy), LoRA r8 on q/k/v, checkpointing, flash attention, and replays step 2's
allocations and frees through the same allocator model, so the loss region's blocks are interleaved
with the checkpoints, recomputed layers and gradients of the rest of the step. Not modelled: CUDA
context, kernel workspaces (cuBLAS, flash-attn), and the allocator's behaviour across streams.

Part 4 replays whole runs, as the source's two tables ran them: the step of part 3 with its allocation sizes
as lines in the length (traced at 256 and 2048 tokens), over the lengths of a run drawn from a log-normal with
the dataset's stated mean and spread, under ``truncation_left`` (the 2023-12-14 table: 1000 examples, the
longer ones cut to max_length, so most steps run at max_length up to 2048 tokens) and under swift's default
``delete`` (the 2024-01-02 table, whose script no longer passes truncation_left: longer examples dropped, so
steps run at every length up to max_length). It prints how far the run's reserved high-water mark lies
above that of a run at max_length, over a few draws.

Part 5 replays part 4's ``delete`` runs through the whole step of the table's Llama- and Mistral-shaped
models (Yi-6B-Chat, OpenBuddy-Zephyr-7B: their config.json under tests/data/published/configs/, traced by
transformers' llama and mistral classes with flash attention) and prints the run's reserved high-water mark
beside the record's measured figure, at 2048, 4096 and 8192 tokens. The lengths are part 4's, in Qwen tokens
(the only statistics the source states); each model's own tokenizer is not applied (``--length-scale`` draws
them that many times longer).

Part 6 does the same for Yi-34B-Chat at 8192 tokens on two GPUs by device_map: one trace of the step, each
allocation put on the GPU that holds the module that made it (weights by their order), and each GPU's share
replayed through its own allocator model. Not modelled: the hidden states' copy across the GPU boundary.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from fitcheck.facts import allocator
from fitcheck.measure._internals import FakeTensorMode
from fitcheck.measure.autocast import cuda_autocast_policy
from fitcheck.measure.tracker import LiveStorageMode, Tracker

VOCAB = 151_936  # Qwen-1 vocab_size (config.json of Qwen/Qwen-7B and Qwen-1_8B)
HIDDEN = 2048  # Qwen-1_8B hidden_size; the loss region's vocab-sized tensors do not depend on it
GIB = 1024**3

# (kind, record id, bytes): kind "a" allocates, "f" frees.
Event = tuple[str, int, int]


def trace_region(seq: int, *, fp32_outputs: bool = True, accuracy: bool = True) -> tuple[Tracker, list[int]]:
    """Trace the loss region's step at ``seq`` tokens; return the tracker and its persistent records' ids."""
    tracker = Tracker()
    with FakeTensorMode():
        hidden = torch.empty(1, seq, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        weight = torch.empty(VOCAB, HIDDEN, dtype=torch.bfloat16)
        labels = torch.zeros(1, seq, dtype=torch.long)
        tracker.register([weight, hidden, labels], "inputs")
        persistent = [r.alloc_seq for r in tracker.log]
        with cuda_autocast_policy(), LiveStorageMode(tracker):
            tracker.begin("forward", 0)
            loss, logits = _forward(hidden, weight, labels, fp32_outputs)
            if accuracy:
                preds = logits.argmax(dim=2)[..., :-1]
                shifted = labels[..., 1:]
                # swift indexes with the mask (labels != -100); token-sized either way, and a boolean
                # index has no fake-tensor shape, so the comparison runs on all positions here
                (preds == shifted).float().mean()
                del preds, shifted
            del logits  # compute_loss returns the loss only
            tracker.begin("backward", 0)
            loss.backward()
            del loss
            hidden.grad = None
        tracker.end()
    return tracker, persistent


def _forward(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, fp32_outputs: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen-1's lm_head and loss under bf16 autocast, then accelerate's fp32 conversion of the outputs."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        lm_logits = F.linear(hidden, weight)
        shift_logits = lm_logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss = F.cross_entropy(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))
    del shift_logits, shift_labels
    return (loss.float(), lm_logits.float()) if fp32_outputs else (loss, lm_logits)


def events(tracker: Tracker, persistent: Iterable[int]) -> list[Event]:
    """The step's allocations and frees in order, persistent records left out."""
    keep = set(persistent)
    timed: list[tuple[int, Event]] = []
    for rec in tracker.log:
        if rec.alloc_seq in keep:
            continue
        timed.append((rec.alloc_seq, ("a", rec.alloc_seq, rec.nbytes)))
        if rec.free_seq is not None:
            timed.append((rec.free_seq, ("f", rec.alloc_seq, rec.nbytes)))
    return [e for _, e in sorted(timed)]


# --- the caching allocator -------------------------------------------------------------------------

K_MIN_BLOCK = allocator.MIN_BLOCK
K_SMALL_SIZE = allocator.SMALL_SIZE
K_SMALL_BUFFER = allocator.SMALL_BUFFER
K_MIN_LARGE_ALLOC = allocator.MIN_LARGE_ALLOC
K_LARGE_BUFFER = allocator.LARGE_BUFFER
K_ROUND_LARGE = allocator.ROUND_LARGE


@dataclass
class Block:
    addr: int
    size: int
    segment: int
    small: bool
    free: bool = True
    prev: Block | None = None
    next: Block | None = None


@dataclass
class Allocator:
    """Best-fit, split and merge within segments; no release (no cudaMalloc fails)."""

    reserved: int = 0
    allocated: int = 0
    peak_reserved: int = 0
    peak_allocated: int = 0
    pools: dict[bool, list[tuple[int, int, int]]] = field(default_factory=lambda: {True: [], False: []})
    blocks: dict[int, Block] = field(default_factory=dict)
    segments: int = 0

    def malloc(self, nbytes: int) -> Block:
        size = max(K_MIN_BLOCK, -(-nbytes // K_MIN_BLOCK) * K_MIN_BLOCK)
        small = size <= K_SMALL_SIZE
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1, -1))
        if i < len(pool):
            _, addr, _ = pool.pop(i)
            block = self.blocks[addr]
        else:
            block = self._segment(size, small)
        remaining = block.size - size
        if (small and remaining >= K_MIN_BLOCK) or (not small and remaining > K_SMALL_SIZE):
            rest = Block(block.addr + size, remaining, block.segment, small, True, block, block.next)
            if block.next is not None:
                block.next.prev = rest
            block.next, block.size = rest, size
            self.blocks[rest.addr] = rest
            bisect.insort(pool, (rest.size, rest.addr, rest.segment))
        block.free = False
        self.allocated += block.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return block

    def _segment(self, size: int, small: bool) -> Block:
        if small:
            alloc = K_SMALL_BUFFER
        elif size < K_MIN_LARGE_ALLOC:
            alloc = K_LARGE_BUFFER
        else:
            alloc = -(-size // K_ROUND_LARGE) * K_ROUND_LARGE
        self.segments += 1
        addr = self.reserved + self.segments * (1 << 40)  # distinct address range per segment
        self.reserved += alloc
        self.peak_reserved = max(self.peak_reserved, self.reserved)
        block = Block(addr, alloc, self.segments, small, False)
        self.blocks[addr] = block
        return block

    def free(self, block: Block) -> None:
        self.allocated -= block.size
        block.free = True
        pool = self.pools[block.small]
        for other in (block.prev, block.next):
            if other is not None and other.free:
                pool.remove((other.size, other.addr, other.segment))
                del self.blocks[other.addr]
                if other is block.prev:
                    block.addr, block.prev = other.addr, other.prev
                    if other.prev is not None:
                        other.prev.next = block
                else:
                    block.next = other.next
                    if other.next is not None:
                        other.next.prev = block
                block.size += other.size
        self.blocks[block.addr] = block
        bisect.insort(pool, (block.size, block.addr, block.segment))


def replay(steps: list[list[Event]]) -> Allocator:
    alloc = Allocator()
    for step in steps:
        live: dict[int, Block] = {}
        for kind, rid, nbytes in step:
            if kind == "a":
                live[rid] = alloc.malloc(nbytes)
            else:
                alloc.free(live.pop(rid))
    return alloc


# --- report ----------------------------------------------------------------------------------------


def per_entry(nbytes: int, seq: int) -> float:
    return nbytes / (seq * VOCAB)


def part1(lengths: list[int]) -> dict[int, list[Event]]:
    print("Part 1: live storages of the loss region (fake tensors, vocab 151936), B/vocab entry/token")
    print(f"{'tokens':>7} {'variant':<34} {'fwd peak':>9} {'bwd peak':>9}")
    out: dict[int, list[Event]] = {}
    variants = (
        ("as run (fp32 outputs, accuracy)", True, True),
        ("without accelerate's fp32 outputs", False, True),
    )
    for seq in lengths:
        for name, fp32_outputs, accuracy in variants:
            tracker, persistent = trace_region(seq, fp32_outputs=fp32_outputs, accuracy=accuracy)
            base = sum(r.nbytes for r in tracker.log if r.alloc_seq in set(persistent))
            fwd, bwd = (w.peak_bytes - base for w in tracker.windows)
            print(f"{seq:>7} {name:<34} {per_entry(fwd, seq):>9.2f} {per_entry(bwd, seq):>9.2f}")
            if fp32_outputs:
                out[seq] = events(tracker, persistent)
    return out


def part2(max_length: int, templates: dict[int, list[Event]], n_steps: int, seed: int) -> None:
    print(f"\nPart 2: caching-allocator replay of the loss region, max_length {max_length}, {n_steps} steps")
    rng = random.Random(seed)
    short = [s for s in sorted(templates) if s <= max_length]
    orders = {
        "all steps at max_length": [max_length] * n_steps,
        "lengths rising to max_length": sorted(rng.choice(short) for _ in range(n_steps)),
        "lengths in random order": [rng.choice(short) for _ in range(n_steps)],
        "max_length first, then shorter": [max_length] + [rng.choice(short) for _ in range(n_steps - 1)],
    }
    print(f"{'order':<34} {'peak alloc':>10} {'reserved':>9} {'B/entry/token':>14}")
    for name, seq_order in orders.items():
        alloc = replay([templates[s] for s in seq_order])
        print(
            f"{name:<34} {alloc.peak_allocated / GIB:>8.2f}Gi {alloc.peak_reserved / GIB:>7.2f}Gi"
            f" {per_entry(alloc.peak_reserved, max_length):>14.2f}"
        )


# --- part 3: the whole step, interleaved -------------------------------------------------------------

#: Qwen-1_8B-Chat's shape (config.json: hidden_size 2048, num_hidden_layers 24, num_attention_heads 16,
#: intermediate_size 11008 halved by QWenMLP to 5504, vocab_size 151936) posed as a qwen2 config, the
#: nearest architecture transformers carries (fused c_attn -> q/k/v with bias, SwiGLU, RMSNorm, untied).
QWEN_1_8B = {
    "model_type": "qwen2", "hidden_size": 2048, "num_hidden_layers": 24, "num_attention_heads": 16,
    "num_key_value_heads": 16, "intermediate_size": 5504, "vocab_size": VOCAB, "tie_word_embeddings": False,
    "max_position_embeddings": 8192, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16",
}  # fmt: skip


def _traced_step2(seq: int, config: dict[str, object]) -> tuple[Tracker, int, int]:
    """Two whole-model steps of ``config`` traced on fake tensors (LoRA q/k/v r8, checkpointing, flash): the
    tracker and the sequence numbers where step 2 starts and ends."""
    import fitcheck.measure.tracker as tracker_mod
    from fitcheck.measure.trace import trace_step
    from fitcheck.models import LlmSetup

    made: list[Tracker] = []

    @dataclass
    class Recording(Tracker):
        def __post_init__(self) -> None:
            made.append(self)

    setup = LlmSetup(
        method="lora", lora_rank=8, lora_targets="q_proj,k_proj,v_proj", seq_len=seq, batch_size=1,
        precision="bf16", optimizer="adamw", grad_ckpt=True, attn="flash", trainer="hf",
    )  # fmt: skip
    original = tracker_mod.Tracker
    tracker_mod.Tracker = Recording  # type: ignore[misc]
    try:
        trace_step(config, setup, steps=2)
    finally:
        tracker_mod.Tracker = original  # type: ignore[misc]
    tracker = made[-1]
    step2 = [w for w in tracker.windows if w.step == max(x.step for x in tracker.windows)]
    return tracker, step2[0].start_seq, step2[-1].end_seq


def whole_step_events(seq: int, config: dict[str, object] | None = None) -> tuple[list[int], list[Event]]:
    """Trace two whole-model steps (fake tensors) of ``config`` (Qwen-1.8B's shape unless given); return what
    is alive as step 2 starts, and its events."""
    tracker, start, end = _traced_step2(seq, QWEN_1_8B if config is None else config)
    base = [
        r.nbytes for r in tracker.log if r.alloc_seq <= start and (r.free_seq is None or r.free_seq > start)
    ]
    timed: list[tuple[int, Event]] = []
    for rec in tracker.log:
        if start < rec.alloc_seq <= end:
            timed.append((rec.alloc_seq, ("a", rec.alloc_seq, rec.nbytes)))
            free = rec.free_seq if rec.free_seq is not None and rec.free_seq <= end else end + 1
            timed.append((free, ("f", rec.alloc_seq, rec.nbytes)))
    return base, [e for _, e in sorted(timed)]


def part3(lengths: list[int], n_steps: int, seed: int) -> None:
    print("\nPart 3: the whole step (Qwen-1.8B shape as qwen2, LoRA q/k/v r8, checkpointing, flash)")
    print(f"{'order':<40} {'peak alloc':>10} {'reserved':>9} {'reserved-alloc B/entry/token':>29}")
    steps = {seq: whole_step_events(seq) for seq in lengths}
    rng = random.Random(seed)
    top = max(lengths)
    orders = {
        f"all steps at {top}": [top] * n_steps,
        f"lengths {lengths} in random order": [rng.choice(lengths) for _ in range(n_steps)],
        f"lengths {lengths} rising": sorted(rng.choice(lengths) for _ in range(n_steps)),
    }
    for name, seq_order in list(orders.items())[: 1 if len(lengths) == 1 else None]:
        alloc = Allocator()
        for nbytes in steps[top][0]:
            alloc.malloc(nbytes)
        for seq in seq_order:
            live: dict[int, Block] = {}
            for kind, rid, nbytes in steps[seq][1]:
                if kind == "a":
                    live[rid] = alloc.malloc(nbytes)
                else:
                    alloc.free(live.pop(rid))
        gap = alloc.peak_reserved - alloc.peak_allocated
        print(
            f"{name:<40} {alloc.peak_allocated / GIB:>8.2f}Gi {alloc.peak_reserved / GIB:>7.2f}Gi"
            f" {per_entry(gap, top):>29.2f}"
        )


# --- part 4: runs whose lengths vary, as the source's two tables ran ------------------------------------

#: cls-fudan-news-zh as ms-swift's dataset table states it (docs/source_en/LLM/Supported-models-datasets.md at
#: cdb169b: 4959 rows, 3234.4 +- 2547.5 tokens by Qwen's tokenizer, min 91, max 19548). The lengths
#: themselves are not published; a log-normal with that mean and spread, clipped to [min, max], stands in.
DATASET_ROWS, LEN_MEAN, LEN_SD, LEN_MIN, LEN_MAX = 4959, 3234.4, 2547.5, 91, 19548


def dataset_lengths(rng: random.Random) -> list[int]:
    sigma2 = math.log(1 + (LEN_SD / LEN_MEAN) ** 2)
    mu, sigma = math.log(LEN_MEAN) - sigma2 / 2, math.sqrt(sigma2)
    out: list[int] = []
    while len(out) < DATASET_ROWS:
        n = round(math.exp(rng.gauss(mu, sigma)))
        if LEN_MIN <= n <= LEN_MAX:
            out.append(n)
    return out


def run_lengths(pool: list[int], max_length: int, strategy: str, rng: random.Random) -> list[int]:
    """The steps of one run, batch 1, in random order (train_sampler_random true unless test_oom_error).

    ``truncation_left`` (the 2023-12-14 table: run_single.py @cfcb672) draws 1000 examples and keeps the last
    max_length tokens of the longer ones; ``delete`` (swift's default, the 2024-01-02 table: run_single.py
    @97e4d198 no longer passes truncation_left) takes the whole set up to 2048 tokens and 1000 drawn above,
    then drops the examples longer than max_length (template.py ``_encode`` returns None; dataset_map drops
    it).
    """
    if strategy == "truncation_left":
        steps = [min(n, max_length) for n in rng.sample(pool, 1000)]
    else:
        rows = list(pool) if max_length <= 2048 else rng.sample(pool, 1000)
        steps = [n for n in rows if n <= max_length]
    rng.shuffle(steps)
    return steps


@dataclass
class StepModel:
    """A whole step's allocations as lines in the length (traced at two lengths: the op sequence of a batch-1
    flash-attention step does not depend on it), with its free order and the bytes alive before it."""

    base: list[int]
    sizes: list[tuple[float, float]]
    order: list[tuple[str, int]]

    @classmethod
    def traced(cls, lo: int, hi: int, config: dict[str, object] | None = None) -> StepModel:
        base, ev_hi = whole_step_events(hi, config)
        _, ev_lo = whole_step_events(lo, config)
        index: dict[int, int] = {}
        sizes: list[tuple[float, float]] = []
        for (kind, rid, n_hi), (kind_lo, _, n_lo) in zip(ev_hi, ev_lo, strict=True):
            assert kind == kind_lo, "the step's op sequence depends on the length"
            if kind == "a":
                index[rid] = len(sizes)
                slope = (n_hi - n_lo) / (hi - lo)
                sizes.append((n_hi - slope * hi, slope))
        return cls(base, sizes, [(kind, index[rid]) for kind, rid, _ in ev_hi])

    def replay(self, lengths: Iterable[int]) -> Allocator:
        alloc = Allocator()
        for nbytes in self.base:
            alloc.malloc(nbytes)
        for seq in lengths:
            live: dict[int, Block] = {}
            for kind, i in self.order:
                if kind == "a":
                    a, b = self.sizes[i]
                    live[i] = alloc.malloc(max(1, round(a + b * seq)))
                else:
                    alloc.free(live.pop(i))
        return alloc


def part4(max_lengths: list[int], orders: int) -> None:
    print("\nPart 4: runs of varying length (Qwen-1.8B shape as qwen2, LoRA q/k/v r8, checkpointing, flash):")
    print("the allocator model's reserved high-water mark over a run, less its mark over 20 steps at")
    print("max_length,", end=" ")
    print(f"for {orders} draws of the run's examples and order (GiB: least, median, most)")
    model = StepModel.traced(256, 2048)
    pool = dataset_lengths(random.Random(0))
    head = ("max_length", "at max_length", "strategy", "steps", "over: least", "median", "most")
    print("{:>10} {:>14} {:<16} {:>6} {:>12} {:>7} {:>7}".format(*head))
    for max_length in max_lengths:
        fixed = model.replay([max_length] * 20).peak_reserved
        for strategy in ("truncation_left", "delete"):
            over, n = [], 0
            for seed in range(orders):
                steps = run_lengths(pool, max_length, strategy, random.Random(seed))
                over.append((model.replay(steps).peak_reserved - fixed) / GIB)
                n = len(steps)
            print(
                f"{max_length:>10} {fixed / GIB:>12.2f}Gi {strategy:<16} {n:>6} {min(over):>+12.2f}"
                f" {statistics.median(over):>+7.2f} {max(over):>+7.2f}"
            )


# --- part 5: part 4's runs for the other shapes of the max-length table -----------------------------------

#: (record id prefix, config.json under tests/data/published/configs/): the table's Llama- and Mistral-shaped
#: models, traced by transformers' own llama / mistral classes at their config's shape.
OTHER_SHAPES = (
    ("yi-6b-chat-lora", "01-ai/Yi-6B-Chat"),
    ("openbuddy-zephyr-7b-chat-lora", "OpenBuddy/openbuddy-zephyr-7b-v14.1"),
)


def part5(max_lengths: list[int], orders: int, scale: float = 1.0) -> None:
    """Part 4's ``delete`` runs (lengths drawn from the stated spread, in Qwen tokens, times ``scale``)
    replayed through the whole step of each other shape, printed beside the record's measured figure."""
    import json
    from pathlib import Path

    import published

    root = Path(__file__).resolve().parent.parent / "tests/data/published"
    _, records = published.load_source(root / "ms-swift.yaml")
    measured = {r.id: r.measured_bytes / GIB for r in records}
    pool = [round(n * scale) for n in dataset_lengths(random.Random(0))]
    print("\nPart 5: part 4's delete runs through the whole step of the table's other shapes (LoRA q/k/v r8,")
    print(f"checkpointing, flash): reserved high-water mark, GiB, over {orders} draws of the run")
    head = ("record", "at max_length", "run: least", "median", "most", "measured")
    print("{:<40} {:>13} {:>10} {:>7} {:>7} {:>9}".format(*head))
    for prefix, config_dir in OTHER_SHAPES:
        config = json.loads((root / "configs" / config_dir / "config.json").read_text())
        model = StepModel.traced(256, 2048, config)
        for max_length in max_lengths:
            fixed = model.replay([max_length] * 20).peak_reserved / GIB
            runs = [
                model.replay(run_lengths(pool, max_length, "delete", random.Random(seed))).peak_reserved / GIB
                for seed in range(orders)
            ]
            rid = f"{prefix}-s{max_length}"
            least, median, most = min(runs), statistics.median(runs), max(runs)
            print(
                f"{rid:<40} {fixed:>13.2f} {least:>10.2f} {median:>7.2f} {most:>7.2f}"
                f" {measured.get(rid, float('nan')):>9.2f}"
            )


# --- part 6: Yi-34B-Chat at 8192 tokens split over two GPUs by device_map -------------------------------

#: fitcheck's device-map split of Yi-34B-Chat over two A100s (its devmap estimate: embed_tokens and layers
#: 0-29 on GPU 0; layers 30-59, norm and lm_head on GPU 1), as accelerate's balanced map places whole layers.
YI_34B_SPLIT = 30
#: frozen / trainable parameters per Llama layer, in named_parameters order (q/k/v/o, gate/up/down and the two
#: RMSNorm weights; LoRA A and B on q, k and v).
LAYER_FROZEN, LAYER_LORA = 9, 6


def _gpu_of(module: str) -> int:
    found = re.search(r"layers\.(\d+)", module)
    if found:
        return int(int(found.group(1)) >= YI_34B_SPLIT)
    return 0 if "embed_tokens" in module else 1  # the final norm, lm_head, the loss and their backward


def split_step_events(seq: int, config: dict[str, object]) -> dict[int, tuple[list[int], list[Event]]]:
    """``whole_step_events`` with each allocation put on the GPU its module is mapped to: activations by the
    module that made them, weights by their order (the embedding and the first layers on GPU 0)."""
    tracker, start, end = _traced_step2(seq, config)
    out: dict[int, tuple[list[int], list[tuple[int, Event]]]] = {0: ([], []), 1: ([], [])}
    seen = {"parameters_frozen": 0, "parameters_trainable": 0}
    on_gpu0 = {
        "parameters_frozen": 1 + LAYER_FROZEN * YI_34B_SPLIT,
        "parameters_trainable": LAYER_LORA * YI_34B_SPLIT,
    }
    for rec in tracker.log:
        if rec.alloc_seq <= start and (rec.free_seq is None or rec.free_seq > start):
            if rec.category in seen:
                gpu = int(seen[rec.category] >= on_gpu0[rec.category])
                seen[rec.category] += 1
            else:
                gpu = 1 if rec.module else 0  # the batch on GPU 0; optimizer states (LoRA-sized) on GPU 1
            out[gpu][0].append(rec.nbytes)
        elif start < rec.alloc_seq <= end:
            timed = out[_gpu_of(rec.module)][1]
            timed.append((rec.alloc_seq, ("a", rec.alloc_seq, rec.nbytes)))
            free = rec.free_seq if rec.free_seq is not None and rec.free_seq <= end else end + 1
            timed.append((free, ("f", rec.alloc_seq, rec.nbytes)))
    return {gpu: (base, [e for _, e in sorted(timed)]) for gpu, (base, timed) in out.items()}


def part6(orders: int) -> None:
    """Part 4's 8192-token ``delete`` runs through each GPU's share of Yi-34B-Chat's step."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "tests/data/published"
    config = json.loads((root / "configs/01-ai/Yi-34B/config.json").read_text())
    hi, lo = split_step_events(2048, config), split_step_events(256, config)
    pool = dataset_lengths(random.Random(0))
    print(
        "\nPart 6: Yi-34B-Chat LoRA at 8192 tokens over two GPUs by device_map (layers 0-29 | 30-59, head),"
    )
    print(f"each GPU's share of the step replayed over {orders} delete runs: reserved high-water mark, GiB")
    measured = (47.01, 65.03)  # the record's per_gpu (yi-34b-chat-lora-s8192-2gpu)
    for gpu in (0, 1):
        index: dict[int, int] = {}
        sizes: list[tuple[float, float]] = []
        for (kind, rid, n_hi), (kind_lo, _, n_lo) in zip(hi[gpu][1], lo[gpu][1], strict=True):
            assert kind == kind_lo, "the step's op sequence depends on the length"
            if kind == "a":
                index[rid] = len(sizes)
                slope = (n_hi - n_lo) / (2048 - 256)
                sizes.append((n_hi - slope * 2048, slope))
        model = StepModel(hi[gpu][0], sizes, [(kind, index[rid]) for kind, rid, _ in hi[gpu][1]])
        fixed = model.replay([8192] * 20).peak_reserved / GIB
        runs = [
            model.replay(run_lengths(pool, 8192, "delete", random.Random(seed))).peak_reserved / GIB
            for seed in range(orders)
        ]
        median = statistics.median(runs)
        print(
            f"GPU {gpu}: weights and states {sum(hi[gpu][0]) / GIB:.2f}, at 8192 tokens {fixed:.2f}, runs"
            f" {min(runs):.2f}-{max(runs):.2f} (median {median:.2f}), measured {measured[gpu]:.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--whole", action="store_true", help="also trace and replay the whole step (minutes)")
    parser.add_argument("--lengths", action="store_true", help="part 4: runs of varying length (minutes)")
    parser.add_argument("--orders", type=int, default=5, help="parts 4-5: draws of each run")
    parser.add_argument("--shapes", action="store_true", help="part 5: other shapes (minutes)")
    parser.add_argument("--length-scale", type=float, default=1.0, help="part 5: lengths times this")
    parser.add_argument("--device-map", action="store_true", help="part 6: Yi-34B over two GPUs (minutes)")
    args = parser.parse_args()
    if args.device_map:
        part6(args.orders)
        return
    if args.shapes:
        part5([2048, 4096, 8192], args.orders, args.length_scale)
        return
    if args.lengths:
        part4([512, 1024, 2048, 4096, 8192], args.orders)
        return
    lengths = [128, 256, 384, 512, 768, 1024, 1536, 2048]
    templates = part1([512, 2048])
    for seq in lengths:
        if seq not in templates:
            tracker, persistent = trace_region(seq)
            templates[seq] = events(tracker, persistent)
    for max_length in (512, 2048):
        part2(max_length, templates, args.steps, args.seed)
    if args.whole:
        part3([512], 20, args.seed)
        part3([256, 512, 1024, 2048], 40, args.seed)


if __name__ == "__main__":
    main()
