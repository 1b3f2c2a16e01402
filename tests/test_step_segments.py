"""DeepSpeed ZeRO's optimizer-step segments: the allocator history of a fixed-length run.

The step converts each gradient partition (ZeRO-3: sub_group) through new flat tensors
(``fp32_grad_partition``: the 16-bit concatenation and its fp32 copy, one tensor in fp32). A tensor larger
than every block the forward and backward cut cannot reuse them: the caching allocator cuts a segment for it
and keeps both, so a whole-run reading holds the activations' blocks beside it (engine/cache_history.py
``step_segment_bytes``).
Like the varying-length history it is releasable cache: in ``Estimate.cache_history``, never in
``device_bytes``, the band or the verdict.
"""

from __future__ import annotations

import pytest

from fitcheck import api
from fitcheck.engine import cache_history as ch
from fitcheck.engine.estimate import _step_estimate, estimate
from fitcheck.models import LlmSetup
from fitcheck.units import GIB

SPEC = api.resolve("llama-3-8b")


def _zero(**kw: object) -> LlmSetup:
    base: dict[str, object] = {
        "method": "full",
        "seq_len": 512,
        "backend": "cuda",
        "strategy": "zero3",
        "gpus": 4,
    }
    return LlmSetup(**{**base, **kw})


def _flat(est: object) -> int:
    return next(c.bytes for c in est.phase("optimizer_step").components if c.name == "fp32_grad_partition")  # type: ignore[attr-defined]


def test_flat_tensors_are_the_16_bit_concatenation_and_its_fp32_copy() -> None:
    bf16 = _step_estimate(SPEC, _zero())
    n = _flat(bf16) // 6
    assert ch.step_flat_tensors(bf16) == [2 * n, 4 * n]
    fp32 = _step_estimate(SPEC, _zero(precision="fp32"))
    assert ch.step_flat_tensors(fp32) == [_flat(fp32)]  # ``.to(fp32)`` of an fp32 tensor is the tensor


def test_segments_are_releasable_cache_beside_the_step() -> None:
    """The history is a side line: the phases, the need, the band and the verdict are the step's own."""
    setup = _zero()
    est = estimate(SPEC, setup)
    own = _step_estimate(SPEC, setup)
    assert est.cache_history is not None and est.cache_history.name == "allocator_history"
    assert est.model_copy(update={"cache_history": None}) == own
    heads = max(own.params.lm_head, own.params.embedding)
    largest = ch.largest_block(own, setup.tokens, SPEC.arch.vocab_size, heads)
    segments = ch.step_segment_bytes(own, largest)
    assert segments > 0
    assert est.cache_history.bytes == ch.reading_excess(own, segments)


def test_fp32_run_with_its_peak_in_forward_shows_the_whole_copy() -> None:
    """Without checkpointing an fp32 ZeRO-3 run peaks in forward (as ChatGLM3's demo ran, 4 GPUs): the
    reading holds that peak and the step's one fp32 sub_group copy beside it."""
    est = estimate(SPEC, _zero(precision="fp32", grad_ckpt=False, seq_len=385))
    assert est.peak_phase in ("forward", "backward")
    assert est.cache_history is not None
    assert est.cache_history.bytes == _flat(est)


@pytest.mark.parametrize(
    "setup",
    [
        LlmSetup(method="full", seq_len=512, backend="cuda"),
        LlmSetup(method="full", seq_len=512, backend="cuda", strategy="ddp", gpus=4),
        LlmSetup(method="full", seq_len=512, backend="cuda", strategy="zero3", gpus=4, offload="optimizer"),
        LlmSetup(method="lora", seq_len=512, backend="cuda", strategy="zero2", gpus=4),
    ],
    ids=["one-gpu", "ddp", "zero3-offload", "zero2-lora"],
)
def test_no_segments_without_a_large_flat_copy_on_the_gpu(setup: LlmSetup) -> None:
    """No DeepSpeed step, a step on the host, or copies no larger than the logits' block: no line."""
    assert estimate(SPEC, setup).cache_history is None


def test_a_copy_the_logits_block_can_hold_is_not_counted() -> None:
    """At 16k tokens the batch's fp32 logits (16384 x 128256 x 4 B, 7.8 GiB) exceed both copies."""
    est = _step_estimate(SPEC, _zero(seq_len=16384, grad_ckpt=True))
    assert max(ch.step_flat_tensors(est)) < 8 * GIB
    largest = ch.largest_block(est, 16384, SPEC.arch.vocab_size, 0)
    assert ch.step_segment_bytes(est, largest) == 0


def test_the_planner_and_the_verdict_ignore_the_segments() -> None:
    on = api.check("llama-3-8b", "a100-80gb", method="full", seq_len=512, strategy="zero3", gpus=4)
    assert on.cache_history is not None and on.target is not None
    assert on.target.verdict == "fits"
    assert on.device_bytes == _step_estimate(SPEC, _zero()).device_bytes
