"""bench/swift_loss.py: what ms-swift's Qwen-1 loss region holds, what the allocator keeps (issue 10)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import swift_loss as sl

MIB = 1 << 20


def _peaks(seq: int, **kw: bool) -> tuple[float, float]:
    tracker, persistent = sl.trace_region(seq, **kw)
    base = sum(r.nbytes for r in tracker.log if r.alloc_seq in set(persistent))
    fwd, bwd = (w.peak_bytes - base for w in tracker.windows)
    return sl.per_entry(fwd, seq), sl.per_entry(bwd, seq)


def test_loss_region_holds_ten_bytes_forward_twelve_backward() -> None:
    # forward: bf16 logits (2; at batch 1 the shifted slice is already contiguous, no copy) + the fp32
    # cast (4) + log_softmax (4); backward: saved log_softmax + nll grad + log_softmax grad (3 x 4).
    fwd, bwd = _peaks(512)
    assert fwd == pytest.approx(10.0, abs=0.05)
    assert bwd == pytest.approx(12.0, abs=0.05)
    # accelerate's fp32 copy of the outputs is made after the loss's temporaries die: no higher peak
    assert _peaks(512, fp32_outputs=False) == pytest.approx((fwd, bwd), abs=0.05)


def test_allocator_reuses_best_fit_and_merges() -> None:
    alloc = sl.Allocator()
    a = alloc.malloc(100 * MIB)
    alloc.free(a)
    b = alloc.malloc(40 * MIB)  # split off the cached 100 MiB segment
    c = alloc.malloc(50 * MIB)
    assert alloc.reserved == 100 * MIB
    alloc.free(b)
    alloc.free(c)
    d = alloc.malloc(100 * MIB)  # the pieces merged back into one block
    assert alloc.reserved == 100 * MIB and d.size == 100 * MIB
    alloc.malloc(101 * MIB)  # nothing cached fits: a new 2 MiB-rounded segment
    assert alloc.reserved == 100 * MIB + 102 * MIB
    assert alloc.malloc(3 * MIB).size == 3 * MIB and alloc.reserved == 202 * MIB + 20 * MIB


def test_run_lengths_follow_the_scripts_truncation() -> None:
    import random

    pool = sl.dataset_lengths(random.Random(0))
    assert len(pool) == sl.DATASET_ROWS and min(pool) >= sl.LEN_MIN and max(pool) <= sl.LEN_MAX
    # 'delete' (swift's default, 2024-01-02 table): longer examples are dropped; the whole set up to 2048
    dele = sl.run_lengths(pool, 2048, "delete", random.Random(1))
    assert sorted(dele) == sorted(n for n in pool if n <= 2048)
    # above 2048 the script draws 1000 examples first
    assert len(sl.run_lengths(pool, 4096, "delete", random.Random(1))) < 1000
    # truncation_left (2023-12-14 table): 1000 drawn, longer ones cut to max_length
    trunc = sl.run_lengths(pool, 512, "truncation_left", random.Random(1))
    assert len(trunc) == 1000 and max(trunc) == 512 and trunc.count(512) > 900


def test_varying_lengths_keep_more_reserved_than_one_length() -> None:
    # a step of one vocabulary-sized buffer (grows with the length) held across a smaller per-token one:
    # a run whose lengths rise cuts a new segment for each new longest step and keeps the old ones cached
    model = sl.StepModel(
        base=[], sizes=[(0.0, 600_000.0), (0.0, 8_000.0)], order=[("a", 0), ("a", 1), ("f", 0), ("f", 1)]
    )
    fixed = model.replay([2048] * 5).peak_reserved
    rising = model.replay([512, 1024, 1536, 2048]).peak_reserved
    assert model.replay([2048, 512, 1024, 1536]).peak_reserved == fixed  # longest first: all reused
    assert rising > 1.5 * fixed


def test_device_map_split_puts_each_allocation_on_its_modules_gpu() -> None:
    # part 6: embed_tokens and layers 0-29 on GPU 0; layers 30-59, the norm, lm_head and the loss on GPU 1
    assert sl._gpu_of("base_model.model.model.embed_tokens") == 0
    assert sl._gpu_of("MmBackward0 base_model.model.model.layers.29.mlp.down_proj") == 0
    assert sl._gpu_of("base_model.model.model.layers.30.self_attn") == 1
    assert sl._gpu_of("base_model.model.model.norm") == 1
    assert sl._gpu_of("base_model.model.lm_head") == 1
    assert sl._gpu_of("NllLossBackward0") == 1
