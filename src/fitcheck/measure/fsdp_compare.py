"""Compare the engine with a traced FSDP record (no torch: the record is data)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config


def engine_bytes(hf_config: Mapping[str, Any], setup: LlmSetup) -> int:
    """The engine's per-GPU peak over forward and backward, as the tracker sees it: tensors only.

    NCCL communicators are outside the tracker's view (and outside PyTorch's allocator), so they
    are left out of the comparison; the optimizer step is compared by arithmetic, not traced.
    """
    spec = ModelSpec(id="record", name="record", source_kind="hf_config", arch=arch_from_hf_config(hf_config))
    est = estimate(spec, setup)
    nccl = max(
        (c.bytes for p in est.phases for c in p.components if c.name == "nccl_communicators"), default=0
    )
    return max(est.phase("forward").total_bytes, est.phase("backward").total_bytes) - nccl


def compare(record: Mapping[str, Any]) -> tuple[int, int]:
    """(engine bytes, traced bytes) of one record."""
    setup = LlmSetup(**record["setup"])
    return engine_bytes(record["hf_config"], setup), int(record["traced_peak_bytes"])
