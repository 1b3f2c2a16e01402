"""Trace one rank of an FSDP2 run on fake tensors with PyTorch's own FSDPMemTracker.

The recipe is torchtitan's memory estimation (scripts/estimate/estimation.py): a fake process group
(``torch.testing._internal.distributed.fake_pg.FakeStore`` + ``init_process_group("fake")``) gives one
process the view of rank 0 of N; the device mesh is built outside fake mode; the model is built on
the meta device, turned into fake tensors, wrapped with ``fully_shard`` per decoder layer and at the
root with bf16 ``MixedPrecisionPolicy`` (what accelerate's FSDP2 path does, trainable parameters
upcast to fp32 first), and two training steps run under ``FSDPMemTracker``
(torch/distributed/_tools/fsdp2_mem_tracker.py). The tracker's peak is the tensor-level peak of one
rank: sharded and unsharded parameters, gradients, optimizer states, activations, temporaries,
all-gather and reduce-scatter buffers. It sees no NCCL memory, allocator rounding or CUDA context.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup


@dataclass(frozen=True)
class FsdpTrace:
    """One traced rank: the larger of the forward and backward peaks of the second step, by category.

    The optimizer step is left out: under fake tensors the tracker attributes to it several times the
    optimizer states (DTensor ops on the shards, seen with both foreach and fused AdamW, torch 2.13),
    which no real run shows; the engine's step phase (states + shards + gradients) is exact arithmetic.
    """

    world_size: int
    peak_bytes: int
    peak_phase: str
    breakdown: dict[str, int]
    wall_seconds: float
    phases: dict[str, int]


_GROUP: dict[str, int] = {}


def _process_group(world_size: int) -> Any:
    """A fake process group of ``world_size`` ranks (this process is rank 0); the mesh over it."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized() and _GROUP.get("world") != world_size:
        dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", rank=0, world_size=world_size, store=FakeStore())
        _GROUP["world"] = world_size
    return init_device_mesh("cpu", (world_size,))


def trace_fsdp(hf_config: Mapping[str, Any], setup: LlmSetup, world_size: int) -> FsdpTrace:
    """Trace two steps of ``setup`` under FSDP2 FULL_SHARD on ``world_size`` ranks; rank 0's peak."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker, _FSDPModState
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from fitcheck.measure._internals import fakeify
    from fitcheck.measure.build import build_model, trainable_parameters

    started = time.perf_counter()
    regime = regime_for(setup)
    mesh = _process_group(world_size)  # outside fake mode
    fake = FakeTensorMode()
    with torch.device("meta"):
        built = build_model(hf_config, setup, regime)
    model = built.model
    fakeify(model, fake)
    with fake:
        for p in model.parameters():
            if p.requires_grad and p.dtype != torch.float32:
                p.data = p.data.float()  # accelerate's FSDP upcast of trainable parameters
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
        reshard = setup.effective_strategy != "fsdp-grad-op"
        for layer in _layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        for unit in _embedding_units(model) if setup.fsdp_embedding_units else []:
            fully_shard(unit, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        params = trainable_parameters(model)
        opt = torch.optim.AdamW(params, lr=1e-4, fused=True)  # HF optim adamw_torch_fused
        ids, labels = built.batch(setup)
        loss = model(input_ids=ids, labels=labels).loss  # step 1 creates the optimizer states
        loss.backward()
        opt.step()
        opt.zero_grad()
        tracker = FSDPMemTracker(model, opt)
        tracker.track_inputs((ids, labels))
        with tracker:  # step 2: forward and backward (see FsdpTrace for the optimizer step)
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
        stats = tracker.memory_tracking[model]
        peaks = {}
        for phase, state in (("forward", _FSDPModState.PEAK_FW), ("backward", _FSDPModState.PEAK_BW)):
            peaks[phase] = next(iter(stats.snapshots[state][-1].values()))
        peaks["forward_backward"] = next(iter(tracker.get_tracker_snapshot("peak").values()))
    name, top = max(peaks.items(), key=lambda kv: kv[1]["Total"])
    breakdown = {str(getattr(k, "value", k)): int(v) for k, v in top.items() if k != "Total" and v}
    totals = {k: int(v["Total"]) for k, v in peaks.items()}
    return FsdpTrace(world_size, int(top["Total"]), name, breakdown, time.perf_counter() - started, totals)


def _layers(model: Any) -> list[Any]:
    """The decoder layers (the FSDP units accelerate's TRANSFORMER_BASED_WRAP picks)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(inner.model.layers)


def _embedding_units(model: Any) -> list[Any]:
    """The input embedding and the lm_head, sharded as their own units before the root, as torchtune's
    ``custom_sharded_layers: ['tok_embeddings', 'output']`` does (``--fsdp-embedding-units``)."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return [inner.model.embed_tokens, inner.lm_head]
