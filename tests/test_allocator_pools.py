"""The allocator's rounding line counts only the tensors its large pool serves (c10
CUDACachingAllocator ``kSmallSize``: requests of at most 1 MiB come from the small pool)."""

from __future__ import annotations

from fitcheck.engine.estimate import _tensor_count, estimate
from fitcheck.engine.overhead import ROUNDING_PER_TENSOR, SMALL_REQUEST
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model

MIB = 2**20


def count(model: str, **kw: object) -> int:
    setup = LlmSetup(**kw)  # type: ignore[arg-type]
    return _tensor_count(resolve_model(model), setup, regime_for(setup))


def test_the_small_pool_boundary_is_one_mib() -> None:
    assert SMALL_REQUEST == MIB and ROUNDING_PER_TENSOR == MIB


def test_full_fine_tuning_counts_each_large_weight_four_times() -> None:
    # Llama 3.1 8B: 7 projections per layer (all over 1 MiB in bf16), embedding and head; norms are small
    assert count("llama-3.1-8b", method="full") == 4 * (32 * 7 + 2)


def test_small_lora_adapters_are_not_counted() -> None:
    # rank 16 factors of a 4096-wide model are 256 KiB in fp32: small pool, nothing added to the base
    base = 32 * 7 + 2
    assert count("llama-3.1-8b", method="lora", lora_rank=16, lora_targets="all-linear") == base


def test_large_lora_factors_count_once_per_layer() -> None:
    # rank 128: B of gate/up (14336 x 128) and A of down (128 x 14336) are over 1 MiB in any dtype, so
    # they, their gradients and their two states count in every one of the 32 layers (the factor, its
    # gradient and each state decide apart: a 16-bit factor of 1 MiB is small, its fp32 states are not)
    small = count("llama-3.1-8b", method="lora", lora_rank=16, lora_targets="all-linear")
    large = count("llama-3.1-8b", method="lora", lora_rank=128, lora_targets="all-linear")
    assert (large - small) % 32 == 0 and large - small >= 32 * 3 * 4


def test_small_tensors_round_nothing() -> None:
    # GPT-2: c_attn (768 x 2304), c_fc, c_proj (768 x 3072) and attn.c_proj (768 x 768: 1.125 MiB in bf16)
    # per layer, embedding and head; rank-8 factors, norms and biases are small
    assert count("gpt2", method="lora", lora_rank=8) == 12 * 4 + 2


def test_the_reserve_holds_the_rounding_of_the_counted_tensors() -> None:
    spec = resolve_model("llama-3.1-8b")
    est = estimate(spec, LlmSetup(method="full", grad_ckpt=True, seq_len=1024))
    rounding = count("llama-3.1-8b", method="full", grad_ckpt=True, seq_len=1024) * ROUNDING_PER_TENSOR
    assert rounding <= est.allocator_reserve_bytes


def test_a_quantized_base_decides_by_its_packed_bytes() -> None:
    # Qwen2.5-0.5B's q_proj (896 x 896) is 1.53 MiB in bf16 (large) but 0.38 MiB packed at 4 bits (GPTQ,
    # small) and 0.77 MiB at 8 (small): the quantized bases round fewer of its projections
    bf16 = count("qwen2.5-0.5b", method="lora", lora_rank=8)
    gptq = count("qwen2.5-0.5b", method="lora", lora_rank=8, base_quant="gptq")
    int8 = count("qwen2.5-0.5b", method="lora", lora_rank=8, base_quant="int8")
    assert gptq < bf16 and int8 < bf16 and gptq <= int8
