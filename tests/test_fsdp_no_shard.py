"""--strategy fsdp-no-shard: FSDP1 NO_SHARD, a whole replica per GPU (docs/distributed.md#fsdp-no-shard)."""

from __future__ import annotations

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.errors import OptionError
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def spec7b() -> ModelSpec:
    return resolve_model("7B")


def run(spec: ModelSpec, **kw: object) -> Estimate:
    base: dict[str, object] = {"method": "lora", "gpus": 2, "grad_ckpt": True, "fsdp_version": 1}
    base.update(kw)
    return estimate(spec, LlmSetup(**base))  # type: ignore[arg-type]


def names(e: Estimate) -> dict[str, int]:
    return {c.name: c.bytes for p in e.phases for c in p.components}


def test_no_shard_keeps_whole_flat_params_without_gathered_copies(spec7b: ModelSpec) -> None:
    ns = run(spec7b, strategy="fsdp-no-shard")
    full = run(spec7b, strategy="fsdp")
    assert ns.distributed is not None and ns.distributed.shard_group == 1
    n = names(ns)
    # the flat parameter is the parameter: no unsharded copies, no gradient before its (in-place) reduction
    assert not {"root_params", "gathered_units", "unit_grads"} & set(n)
    assert {"param_shards", "gradient_shards", "nccl_communicators"} <= set(n)
    # FULL_SHARD over 2 ranks holds half the shards of NO_SHARD
    assert names(full)["param_shards"] * 2 == pytest.approx(n["param_shards"], rel=1e-6)


def test_no_shard_per_gpu_is_the_replica_plus_nccl(spec7b: ModelSpec) -> None:
    ns = run(spec7b, strategy="fsdp-no-shard")
    ddp = run(spec7b, strategy="ddp", fsdp_version=2)
    # like DDP's replica but without DDP's bucket copy of the gradients
    assert "ddp_grad_buckets" in names(ddp) and "ddp_grad_buckets" not in names(ns)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [({"fsdp_version": 2}, "--fsdp-version 1"), ({"offload": "all"}, "not modelled")],
)
def test_refused(spec7b: ModelSpec, kw: dict[str, object], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        run(spec7b, strategy="fsdp-no-shard", **kw)
