"""Throughput model: exact FLOP counts for hand-computable shapes, and the directions that must hold."""

from __future__ import annotations

import math

import pytest

from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.planner.models import DevicePerf
from fitcheck.planner.throughput import (
    UTILISATION,
    attention_flops,
    flops_per_token,
    matmul_params,
    micro_step,
    round_sig,
    throughput,
)

ARCH = DecoderArch(
    model_type="llama",
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=100,
)
GPU = DevicePerf(
    id="gpu",
    name="test GPU",
    backend="cuda",
    bf16_tflops=100.0,
    fp16_tflops=100.0,
    fp32_tflops=25.0,
    bandwidth_gbps=1000.0,
    compute_capability="8.0",
    bf16_native=True,
)


def test_matmul_params_by_hand() -> None:
    # per layer: q 64x64, k 64x32, v 64x32, o 64x64, gate/up/down 3 x 64x128; lm_head 100x64
    per_layer = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128
    assert matmul_params(ARCH) == 2 * per_layer + 100 * 64


def test_full_training_is_six_n_plus_attention() -> None:
    n = matmul_params(ARCH)
    s = LlmSetup(method="full", seq_len=32, attn="flash")
    att = 4 * 2 * 4 * 16 * 32 * 0.5
    assert attention_flops(ARCH, 32, "flash") == att
    f = flops_per_token(ARCH, s)
    assert f.total == pytest.approx(6 * n + 3 * att)
    assert f.recompute == 0


def test_lora_needs_no_weight_gradients_for_frozen_weights() -> None:
    n = matmul_params(ARCH)
    s = LlmSetup(method="lora", seq_len=32, attn="flash", lora_rank=4, lora_targets="attn")
    adapters = 2 * 4 * (64 + 64) + 2 * 4 * (64 + 32)  # q, o: r(64+64); k, v: r(64+32)
    att = attention_flops(ARCH, 32, "flash")
    f = flops_per_token(ARCH, s)
    assert f.total == pytest.approx(4 * n + 6 * 2 * adapters + 3 * att)
    assert f.total < flops_per_token(ARCH, s.model_copy(update={"method": "full"})).total


def test_checkpointing_recomputes_the_forward() -> None:
    s = LlmSetup(method="full", seq_len=32)
    plain = flops_per_token(ARCH, s)
    ckpt = flops_per_token(ARCH, s.model_copy(update={"grad_ckpt": True}))
    assert ckpt.total == pytest.approx(plain.total + plain.forward)
    assert ckpt.model == plain.model  # MFU does not count recompute
    # about 25% slower for full training (8N vs 6N): the source documents' 20-30%
    assert 1 - plain.total / ckpt.total == pytest.approx(0.25, abs=0.02)


def test_eager_attention_computes_the_masked_half() -> None:
    assert attention_flops(ARCH, 64, "eager") == 2 * attention_flops(ARCH, 64, "sdpa")


def test_compute_bound_throughput_is_peak_times_utilisation_over_flops() -> None:
    s = LlmSetup(method="full", seq_len=4096, batch_size=64, grad_accum=1, attn="flash")
    f = flops_per_token(ARCH, s)
    ms = micro_step(ARCH, s, GPU, f)
    assert ms.compute_s > ms.memory_s
    util = UTILISATION["cuda"][0]
    assert ms.compute_s == pytest.approx(64 * 4096 * f.total / (100e12 * util))


def test_small_batches_are_memory_bound_and_larger_ones_faster() -> None:
    s = LlmSetup(method="full", seq_len=1, batch_size=1, grad_accum=16, attn="flash")
    one = throughput(ARCH, s, GPU, trainable=10_000)
    assert one.bound == "memory"
    big = s.model_copy(update={"batch_size": 16, "grad_accum": 1})
    sixteen = throughput(ARCH, big, GPU, trainable=10_000)
    assert sixteen.tokens_per_s > one.tokens_per_s


def test_qlora_is_slower_than_lora_by_its_dequantization() -> None:
    s = LlmSetup(method="lora", seq_len=256, batch_size=1, grad_accum=16)
    lora = throughput(ARCH, s, GPU, trainable=1000)
    qlora = throughput(ARCH, s.model_copy(update={"method": "qlora"}), GPU, trainable=1000)
    assert qlora.tokens_per_s < lora.tokens_per_s


def test_fp32_runs_at_the_fp32_rate() -> None:
    s = LlmSetup(method="full", seq_len=4096, batch_size=64)
    bf16 = throughput(ARCH, s, GPU, trainable=1)
    fp32 = throughput(ARCH, s.model_copy(update={"precision": "fp32"}), GPU, trainable=1)
    assert bf16.tokens_per_s / fp32.tokens_per_s == pytest.approx(4.0, rel=0.01)


def test_dataset_time_is_steps_times_step_time() -> None:
    s = LlmSetup(method="full", seq_len=512, batch_size=4, grad_accum=4)
    t = throughput(ARCH, s, GPU, trainable=1000, dataset_tokens=10_000_000, epochs=2)
    steps = math.ceil(10_000_000 * 2 / (16 * 512))
    assert t.optimizer_steps == steps
    assert t.dataset_s == pytest.approx(steps * t.step_s, rel=1e-5)
    assert t.tokens_per_s == pytest.approx(16 * 512 / t.step_s, rel=1e-5)


def test_data_parallel_gpus_multiply_tokens_per_step_less_the_allreduce() -> None:
    from fitcheck.engine.params import count_params
    from fitcheck.planner.comm import comm_seconds

    s = LlmSetup(method="full", seq_len=512, batch_size=4, grad_accum=4)
    one = throughput(ARCH, s, GPU, trainable=1000)
    s2 = s.model_copy(update={"gpus": 2})
    two = throughput(ARCH, s2, GPU, trainable=1000)
    comm = comm_seconds(s2, GPU.id, count_params(ARCH) * 2, 1000 * 2)
    assert comm > 0 and two.step_s == pytest.approx(one.step_s + comm, rel=1e-4)
    assert two.tokens_per_s == pytest.approx(2 * one.tokens_per_s * one.step_s / two.step_s, rel=1e-4)


def test_round_sig_makes_equal_estimates_ties() -> None:
    assert round_sig(1234.56789) == 1234.57
    assert round_sig(0.1 + 0.2) == round_sig(0.3)


def test_parameter_offload_brings_each_shard_over_pcie_per_gather() -> None:
    """--offload all under ZeRO-3 / FSDP: every all-gather copies the rank's shard from the host first
    (planner/comm.py), per micro-step; optimizer offload moves only the gradient and update shards."""
    from fitcheck.hardware.nodes import PCIE4
    from fitcheck.planner.comm import comm_seconds
    from fitcheck.units import GB

    params, grads = 8 * 10**9, 10**9
    base = LlmSetup(method="full", gpus=4, strategy="zero3", grad_accum=3)
    opt = comm_seconds(base.model_copy(update={"offload": "optimizer"}), GPU.id, params, grads)
    every = comm_seconds(base.model_copy(update={"offload": "all"}), GPU.id, params, grads)
    assert every - opt == pytest.approx(2 * params / 4 * 3 / (PCIE4.intra_gbps * GB), rel=1e-9)
    grad_op = base.model_copy(update={"strategy": "fsdp-grad-op", "offload": "all"})
    plain = grad_op.model_copy(update={"offload": "none"})
    # FSDP's SHARD_GRAD_OP keeps the gathered parameters between forward and backward: one copy per micro-step
    extra = comm_seconds(grad_op, GPU.id, params, grads) - comm_seconds(plain, GPU.id, params, grads)
    assert extra == pytest.approx((2 * grads / 4 + params / 4 * 3) / (PCIE4.intra_gbps * GB), rel=1e-9)
