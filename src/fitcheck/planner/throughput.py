"""Throughput model: FLOPs per token, a roofline per micro-step, tokens per second.

A planning model, not a benchmark (docs/planner.md, "Throughput model"):

* FLOPs per token: a matmul with a weight of ``n`` parameters costs ``2n`` forward; backward costs
  ``2n`` for the input gradient and ``2n`` for the weight gradient, so full training is about ``6N``
  (Kaplan et al. 2020, section 2.1). A frozen weight (LoRA, QLoRA) needs no weight gradient: ``4N``
  plus ``6`` per adapter parameter. Causal attention adds ``4 L s d_attn / 2`` forward (fused kernels
  skip the masked half; eager computes it all) and twice that backward. Checkpointing recomputes the
  forward once more.
* Compute time: FLOPs / (dense TFLOPS of the compute dtype x a utilisation per backend).
* Memory time: the weights are read once per pass (forward, backward, recompute), full fine-tuning
  writes its gradients, eager attention moves its score tensors; the micro-step takes the larger of
  compute and memory time (a roofline, like torch.distributed._tools.RuntimeEstimator's cost model).
* QLoRA dequantizes every 4-bit weight on each pass, a separate memory-bound kernel: added, not
  overlapped.
* The optimizer update reads weights and gradients and writes weights once per optimizer step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.engine.lora import adapter_params
from fitcheck.engine.params import count_params, layer_kinds
from fitcheck.engine.regimes import regime_for
from fitcheck.engine.states import quantizable_tensors
from fitcheck.facts.dtypes import nbytes
from fitcheck.facts.speed import UTILISATION
from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.planner.models import DevicePerf, Throughput
from fitcheck.units import GB

#: Causal attention: fused kernels (flash, SDPA, xformers) skip the masked upper triangle.
CAUSAL_FRACTION = {"eager": 1.0, "sdpa": 0.5, "flash": 0.5, "xformers": 0.5}
#: bitsandbytes dequantization reads the packed 4-bit weight (0.5 B + constants) and writes a 16-bit copy.
DEQUANT_BYTES_PER_PARAM = 0.5 + 2.0
SIGNIFICANT = 6


@dataclass(frozen=True)
class Flops:
    """FLOPs per token of one setup, by part."""

    forward: float
    backward: float
    recompute: float

    @property
    def total(self) -> float:
        return self.forward + self.backward + self.recompute

    @property
    def model(self) -> float:
        """Without recompute: what MFU counts (PaLM appendix B)."""
        return self.forward + self.backward


def matmul_params(a: DecoderArch) -> int:
    """Weights one token multiplies through: active layer projections (top-k experts) and the lm_head."""
    total = 0
    for kind in layer_kinds(a):  # an encoder-decoder's encoder layers too
        total += kind.count * sum(lin.copies * lin.d_in * lin.d_out for lin in kind.linears(a, active=True))
    return total + a.vocab_size * a.hidden_size


def attention_flops(a: DecoderArch, seq_len: int, attn: str) -> float:
    """Forward attention FLOPs per token: QK^T and AV over the keys, causal half for fused kernels."""
    return 4.0 * a.num_layers * a.num_heads * a.head_dim * seq_len * CAUSAL_FRACTION[attn]


def flops_per_token(a: DecoderArch, setup: LlmSetup) -> Flops:
    """Training FLOPs per token (forward, backward, recompute)."""
    n = matmul_params(a)
    adapters = adapter_params(a, setup) if setup.method != "full" else 0
    att = attention_flops(a, setup.seq_len, setup.attn)
    fwd = 2.0 * n + 2.0 * adapters + att
    weight_grads = 2.0 * n if setup.method == "full" else 2.0 * adapters
    bwd = 2.0 * n + 2.0 * adapters + weight_grads + 2.0 * att
    return Flops(forward=fwd, backward=bwd, recompute=fwd if setup.grad_ckpt else 0.0)


def round_sig(x: float, digits: int = SIGNIFICANT) -> float:
    """Round to significant digits, so that equal estimates compare equal."""
    return float(f"{x:.{digits}g}")


@dataclass(frozen=True)
class MicroStep:
    """Seconds of one micro-step by part."""

    compute_s: float
    memory_s: float
    dequant_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.dequant_s


def micro_step(a: DecoderArch, setup: LlmSetup, device: DevicePerf, flops: Flops) -> MicroStep:
    """Roofline time of one micro-step on one device."""
    util = UTILISATION[device.backend][0]
    tokens = setup.batch_size * setup.seq_len
    compute = tokens * flops.total / (device.tflops(setup.precision) * 1e12 * util)
    bw = device.bandwidth_gbps * GB
    wbytes = 4 if setup.precision == "fp32" else 2
    passes = 3 if setup.grad_ckpt else 2
    n = matmul_params(a)
    traffic = float(n * wbytes * passes)
    if setup.method == "full":
        gbytes = nbytes(regime_for(setup).grad_dtype)
        traffic += n * gbytes * (2 if setup.grad_accum > 1 else 1)
    if setup.attn == "eager":
        gamma = 4 if setup.precision == "fp32" else 2
        traffic += 3.0 * tokens * a.num_layers * a.num_heads * setup.seq_len * (4 + gamma)
    dequant = 0.0
    if setup.method == "qlora":
        dequant = passes * quantizable_tensors(a, setup)[0] * DEQUANT_BYTES_PER_PARAM / bw
    return MicroStep(compute_s=compute, memory_s=traffic / bw, dequant_s=dequant)


def update_seconds(a: DecoderArch, setup: LlmSetup, device: DevicePerf, trainable: int) -> float:
    """The optimizer update: read weights and gradients, write weights (state traffic not modelled)."""
    regime = regime_for(setup)
    pdt = regime.trainable_dtype if setup.method == "full" else regime.adapter_dtype
    return trainable * (2 * nbytes(pdt) + nbytes(regime.grad_dtype)) / (device.bandwidth_gbps * GB)


def _embedding_units(a: DecoderArch, setup: LlmSetup, device: DevicePerf, width: int) -> float:
    """The extra gathers (and, when they train, reduce-scatters) of the embedding and lm_head units."""
    if not setup.fsdp_embedding_units:
        return 0.0
    from fitcheck.engine.loss import TORCHTUNE_CHUNKS, kernel_for
    from fitcheck.engine.params import inventory
    from fitcheck.planner.comm import embedding_units_seconds

    regime = regime_for(setup)
    chunked = kernel_for(setup, regime) == "chunked"
    calls = (regime.loss_chunks if regime.loss_chunks > 1 else TORCHTUNE_CHUNKS) if chunked else 1
    inv = inventory(a)
    trains = setup.method == "full"
    return embedding_units_seconds(
        setup, device.id, inv.lm_head * width, inv.embedding * width, calls, trains
    )


def throughput(
    a: DecoderArch,
    setup: LlmSetup,
    device: DevicePerf,
    trainable: int,
    dataset_tokens: int | None = None,
    epochs: float | None = None,
) -> Throughput:
    """Tokens per second, step time and (with a dataset size) the time for the whole run."""
    flops = flops_per_token(a, setup)
    ms = micro_step(a, setup, device, flops)
    comm = 0.0
    if setup.distributed:
        from fitcheck.planner.comm import comm_seconds

        width = 4 if setup.precision == "fp32" else 2
        comm = comm_seconds(setup, device.id, count_params(a) * width, trainable * width)
        comm += _embedding_units(a, setup, device, width)
    update = update_seconds(a, setup, device, trainable)
    if setup.distributed and STRATEGY_FACTS[setup.effective_strategy].shards_optimizer:
        update /= setup.world_size  # each rank updates its partition
    step = setup.grad_accum * ms.total_s + update + comm
    # device-map: one process, one micro-batch through the GPUs in turn (setup.data_ranks == 1)
    tokens_per_step = setup.batch_size * setup.grad_accum * setup.data_ranks * setup.seq_len
    tps = tokens_per_step / step
    peak = device.tflops(setup.precision) * 1e12 * setup.world_size  # every GPU held, working or not
    steps: int | None = None
    total: float | None = None
    if dataset_tokens is not None:
        steps = max(1, math.ceil(dataset_tokens * (epochs or 1.0) / tokens_per_step))
        total = round_sig(steps * step)
    return Throughput(
        flops_per_token=round_sig(flops.total),
        tokens_per_s=round_sig(tps),
        micro_step_s=round_sig(ms.total_s),
        step_s=round_sig(step),
        bound="compute" if ms.compute_s >= ms.memory_s else "memory",
        mfu=round(flops.model * tps / peak, 4),
        optimizer_steps=steps,
        dataset_s=total,
    )
