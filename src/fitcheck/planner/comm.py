"""Communication time of a multi-GPU step: bytes moved per rank over the node's links.

Ring collectives move (N-1)/N of the buffer per rank for an all-gather or a reduce-scatter and twice
that for an all-reduce (NCCL performance notes, "algbw"/"busbw": github.com/NVIDIA/nccl-tests
doc/PERFORMANCE.md). Per optimizer step:

* ddp, zero1, zero2: one all-reduce of the gradients (ZeRO-1/2: a reduce-scatter of gradients and an
  all-gather of the updated parameters, the same volume);
* zero3, fsdp: per micro-step an all-gather of the parameters in forward, another in backward (none
  with fsdp-grad-op, which keeps them) and a reduce-scatter of the gradients;
* offload: the gradient shard goes to the host and the updated parameter shard comes back over PCIe
  each optimizer step; with the parameters offloaded too (``--offload all`` under ZeRO-3 or FSDP), every
  all-gather first copies the rank's parameter shard from the host (DeepSpeed ZeRO-3 ``offload_param``
  fetches each partition to the GPU before gathering it; FSDP's ``CPUOffload(offload_params=True)`` /
  ``CPUOffloadPolicy`` copies the sharded parameter to the device before its all-gather), so the shard
  crosses PCIe once per gather, per micro-step. The shard is counted in the compute dtype: DeepSpeed keeps
  16-bit partitions on the host; FSDP's fp32 shards under mixed precision move twice that (a lower bound).

The link is the node's (hardware/nodes.py): NVLink or PCIe inside a node, InfiniBand between nodes
(the slowest link bounds a ring). Communication is counted as not overlapped with compute, an upper
bound on step time (DeepSpeed and FSDP overlap part of it).
"""

from __future__ import annotations

from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.hardware.nodes import NODES, PCIE4, node_for
from fitcheck.models import SetupBase
from fitcheck.units import GB

#: When a catalog node names no inter-node link: the DGX H100's ConnectX-7, 400 Gb/s per GPU (an assumption).
DEFAULT_INTER_GBPS = NODES["h100-sxm5-80gb"].inter_gbps or 50.0


def link_gbps(setup: SetupBase, gpu_id: str) -> float:
    """Per-GPU bandwidth of the slowest link the collectives cross, GB/s per direction."""
    node = node_for(gpu_id)
    if setup.nodes > 1 and not STRATEGY_FACTS[setup.effective_strategy].hybrid:
        return min(node.intra_gbps, node.inter_gbps or DEFAULT_INTER_GBPS)
    return node.intra_gbps


def comm_seconds(setup: SetupBase, gpu_id: str, param_bytes: int, grad_bytes: int) -> float:
    """Seconds of communication per optimizer step on one rank (0 on one GPU).

    Args:
        setup: the run.
        gpu_id: catalog id of the GPU (decides the node's links).
        param_bytes: the model's parameters in the compute dtype (what an all-gather moves).
        grad_bytes: the trainable parameters' gradients in the compute dtype.
    """
    n = setup.data_ranks  # device-map: one process, no collectives (peer copies of the hidden state only)
    if n == 1:
        return 0.0
    s = setup.effective_strategy
    facts = STRATEGY_FACTS[s]
    ring = (n - 1) / n
    gathers = 1 if not facts.reshard_after_forward else 2
    if facts.shards_params:
        per_micro = ring * (gathers * param_bytes + grad_bytes)
        volume = per_micro * setup.grad_accum
    else:
        volume = 2 * ring * grad_bytes
    t = volume / (link_gbps(setup, gpu_id) * GB)
    if setup.offload != "none":
        shard = grad_bytes / (n if facts.shards_grads else 1)
        t += 2 * shard / (PCIE4.intra_gbps * GB)
    if setup.offload == "all" and facts.shards_params:
        t += gathers * param_bytes / n * setup.grad_accum / (PCIE4.intra_gbps * GB)
    return t


def embedding_units_seconds(
    setup: SetupBase, gpu_id: str, head_bytes: int, embedding_bytes: int, head_calls: int, trains: bool
) -> float:
    """What ``--fsdp-embedding-units`` adds to `comm_seconds` per optimizer step on one rank.

    `comm_seconds` counts two all-gathers of every parameter per micro-step and one reduce-scatter of
    every gradient. As its own unit the lm_head is gathered once per call in forward and again per call in
    backward (torchtune's chunked output calls it once per chunk; each call registers its own post-backward,
    which reshards and reduce-scatters: ``fully_shard`` docstring, torch 2.13), and the embedding is
    gathered in backward only when it trains (docs/distributed.md#fsdp-embedding-units).
    """
    n = setup.data_ranks
    if n == 1:
        return 0.0
    head = (2 * head_calls - 2 + (head_calls - 1 if trains else 0)) * head_bytes
    embedding = 0 if trains else -embedding_bytes
    volume = (n - 1) / n * (head + embedding) * setup.grad_accum
    return volume / (link_gbps(setup, gpu_id) * GB)
