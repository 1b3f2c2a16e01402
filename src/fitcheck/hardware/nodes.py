"""Facts about the nodes GPUs come in: host RAM and interconnect bandwidth, one row per GPU.

A catalog GPU (presets/hardware/) describes one device; multi-GPU estimates also need what the
node around it has: the CPU RAM that offload and model loading use, and the links that carry
all-gathers and reduce-scatters (inside the node: NVLink or PCIe; between nodes: InfiniBand).
Bandwidths are per GPU and per direction, in GB/s (10^9 bytes). A figure without a public source is
left out (None), never guessed. Rules: docs/distributed.md#nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.units import GIB


@dataclass(frozen=True)
class NodeFacts:
    """The usual node of one GPU model."""

    node: str
    gpus_per_node: int
    host_ram_gib: float | None
    intra: str  # "nvlink" or "pcie"
    intra_gbps: float  # per GPU, per direction
    inter_gbps: float | None  # per GPU, per direction, between nodes
    source: str


_BASEPOD = "https://docs.nvidia.com/dgx-basepod/reference-architecture-infrastructure-foundation-enterprise-ai/latest/core-components.html"
_H200_MLPERF = "https://raw.githubusercontent.com/mlcommons/inference_results_v4.1/main/closed/NVIDIA/systems/H200-SXM-141GBx8_TRT_MaxQ.json"
_P4D = "https://gist.github.com/askainet/forked (AWS instance table: p4d.24xlarge, NVLink gen 3 600 GB/s)"
_PCIE = "PCIe 4.0 x16: 16 GT/s x 16 lanes, 128b/130b = 31.5 GB/s per direction; PCIe 5.0 twice that (PCI-SIG)"

#: NVLink 4 (H100/H200 SXM): 900 GB/s per GPU, both directions together -> 450 per direction.
#: ConnectX-7: 400 Gb/s per GPU = 50 GB/s per direction.
NODES: dict[str, NodeFacts] = {
    "h100-sxm5-80gb": NodeFacts("DGX H100", 8, 2048, "nvlink", 450, 50, _BASEPOD + "; " + _H200_MLPERF),
    "h200": NodeFacts("DGX H200", 8, 2048, "nvlink", 450, 50, _BASEPOD + "; " + _H200_MLPERF),
    "a100-sxm4-80gb": NodeFacts("HGX A100 (p4d)", 8, None, "nvlink", 300, None, _P4D),
    "a100-sxm4-40gb": NodeFacts("HGX A100 (p4d)", 8, None, "nvlink", 300, None, _P4D),
    "h100-pcie-80gb": NodeFacts("PCIe 5.0 server", 8, None, "pcie", 63, None, _PCIE),
}
#: Any other GPU: PCIe 4.0 x16 between cards (consumer boards, A100 PCIe).
PCIE4 = NodeFacts("PCIe 4.0 server", 8, None, "pcie", 31.5, None, _PCIE)


def node_for(gpu_id: str) -> NodeFacts:
    """The node facts of a catalog GPU id (PCIe 4.0 when the catalog names no node)."""
    return NODES.get(gpu_id, PCIE4)


def host_ram_bytes(gpu_id: str) -> int | None:
    """CPU RAM of the usual node of this GPU, when a public source gives it."""
    facts = NODES.get(gpu_id)
    if facts is None or facts.host_ram_gib is None:
        return None
    return int(facts.host_ram_gib * GIB)
