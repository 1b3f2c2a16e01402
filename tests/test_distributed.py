"""Several GPUs: ZeRO/FSDP/DDP per GPU, host memory per node, the order users expect and where it flips."""

from __future__ import annotations

import json

import pytest

from fitcheck.cli import main
from fitcheck.engine.distributed import STRATEGY_FACTS, hf_auto, zero_config
from fitcheck.engine.estimate import estimate
from fitcheck.engine.params import inventory, layer_linears
from fitcheck.errors import OptionError
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def spec7b() -> ModelSpec:
    return resolve_model("7B")


def est(spec: ModelSpec, **kw: object) -> Estimate:
    base: dict[str, object] = {"method": "full", "gpus": 8, "grad_ckpt": True}
    base.update(kw)
    return estimate(spec, LlmSetup(**base))  # type: ignore[arg-type]


def parts(e: Estimate, phase: str = "optimizer_step") -> dict[str, int]:
    return {c.name: c.bytes for c in e.phase(phase).components}


def test_zero_model_states_follow_the_paper(spec7b: ModelSpec) -> None:
    """ZeRO paper (arXiv:1910.02054) Table 1, mixed-precision Adam: 4+12/N, 2+14/N, 16/N bytes per param."""
    n = 8
    for stage, (rep, shard) in {"zero1": (4, 12), "zero2": (2, 14), "zero3": (0, 16)}.items():
        e = est(spec7b, strategy=stage)
        p = e.params.total
        states = parts(e)
        names = ("weights", "gradients", "gradient_partition", "param_partitions", "persistent_params")
        names += ("fp32_master_partition", "optimizer_states")
        got = sum(states.get(k, 0) for k in names)
        # ZeRO-3 keeps parameters under stage3_param_persistence_threshold (the norms) whole
        persistent = states.get("persistent_params", 0) * (1 - 1 / n)
        assert got == pytest.approx(rep * p + shard * p / n + persistent, rel=1e-6), stage


def test_per_gpu_memory_falls_ddp_zero1_zero2_zero3_then_offload(spec7b: ModelSpec) -> None:
    order = [
        est(spec7b, strategy="ddp"),
        est(spec7b, strategy="zero1"),
        est(spec7b, strategy="zero2"),
        est(spec7b, strategy="zero3"),
        est(spec7b, strategy="zero3", offload="optimizer"),
        est(spec7b, strategy="zero3", offload="all"),
    ]
    device = [e.device_bytes for e in order]
    assert device == sorted(device, reverse=True) and len(set(device)) == len(device)
    host = [e.host_bytes or 0 for e in order[3:]]
    assert host == sorted(host) and len(set(host)) == 3
    for e in order:
        assert e.world_size == 8 and e.distributed is not None


def test_offload_raises_host_and_lowers_device_for_each_stage(spec7b: ModelSpec) -> None:
    for s in ("zero1", "zero2", "zero3"):
        a, b = est(spec7b, strategy=s), est(spec7b, strategy=s, offload="optimizer")
        assert b.device_bytes < a.device_bytes and (b.host_bytes or 0) > (a.host_bytes or 0), s
        assert "optimizer_states" in {c.name for h in b.host_phases for c in h.components}


def test_fsdp_shards_and_grad_op_keeps_layers(spec7b: ModelSpec) -> None:
    full, grad_op, ddp = est(spec7b, strategy="fsdp"), est(spec7b, strategy="fsdp-grad-op"), est(spec7b)
    assert full.device_bytes < grad_op.device_bytes < ddp.device_bytes
    # accelerate upcasts trainable params to fp32 under mixed precision: 4 B/param sharded over 8
    assert parts(full)["param_shards"] == pytest.approx(4 * full.params.total / 8, rel=1e-6)
    off = est(spec7b, strategy="fsdp", offload="all")
    assert off.device_bytes < full.device_bytes and "param_shards" not in parts(off)


@pytest.mark.parametrize("version", [1, 2])
def test_litgpt_fsdp_shards_keep_the_load_dtype(spec7b: ModelSpec, version: int) -> None:
    """Lightning Fabric's FSDPStrategy builds litgpt's model under FSDPPrecision.module_init_context (bf16
    for bf16-true) and shards it as built: no accelerate upcast, so shards, their gradients and AdamW's
    states are bf16 (lightning 2.4.0 plugins/precision/fsdp.py; docs/distributed.md#fsdp-shards)."""
    n = 8
    lit = est(spec7b, strategy="fsdp", trainer="litgpt", fsdp_version=version)
    hf = est(spec7b, strategy="fsdp", trainer="hf", fsdp_version=version)
    p = lit.params.total
    assert parts(lit)["param_shards"] == pytest.approx(2 * p / n, rel=1e-6)
    assert parts(lit)["gradient_shards"] == pytest.approx(2 * p / n, rel=1e-6)
    assert parts(lit)["optimizer_states"] == pytest.approx(4 * p / n, rel=1e-6)
    assert parts(hf)["param_shards"] == pytest.approx(4 * p / n, rel=1e-6)
    fp32 = est(spec7b, strategy="fsdp", trainer="litgpt", fsdp_version=version, precision="fp32")
    assert parts(fp32)["param_shards"] == pytest.approx(4 * p / n, rel=1e-6)  # 32-true: fp32 as built


def test_hybrid_shards_within_a_node(spec7b: ModelSpec) -> None:
    e = est(spec7b, strategy="fsdp-hybrid", nodes=2)
    assert e.distributed is not None and e.distributed.shard_group == 8 and e.world_size == 16
    one = est(spec7b, strategy="fsdp", nodes=2)
    assert one.distributed is not None and one.distributed.shard_group == 16
    assert parts(e)["nccl_communicators"] == 2 * parts(one)["nccl_communicators"]


def test_small_lora_zero_costs_more_than_ddp_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        ["estimate", "1B", "--method", "lora", "--on", "8xh100-80gb", "--strategy", "zero1", "-f", "json"]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    note = next(w for w in doc["warnings"] if "more than ddp" in w)
    assert "reduce_buckets" in note


def test_qlora_shards_only_with_matching_quant_storage() -> None:
    spec = resolve_model("8B")
    base = {"method": "qlora", "gpus": 4, "strategy": "zero3", "grad_ckpt": True}
    shared = estimate(spec, LlmSetup(**base))  # type: ignore[arg-type]
    kept = estimate(spec, LlmSetup(**base, quant_storage="uint8"))  # type: ignore[arg-type]
    # sharded, only the constants stay whole (test_zero3_keeps_bitsandbytes_quant_state_whole)
    assert parts(shared)["weights_4bit"] < parts(kept)["weights_4bit"] // 30
    assert kept.device_bytes > shared.device_bytes
    assert any("not sharded" in w for w in kept.warnings)
    assert any("bnb_4bit_quant_storage=bf16" in w for w in shared.warnings)


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"strategy": "ddp", "offload": "optimizer"}, "sharded strategy"),
        ({"strategy": "zero2", "offload": "all"}, "ZeRO-3"),
        ({"strategy": "fsdp", "offload": "optimizer"}, "--offload all"),
        ({"strategy": "zero3", "quant_storage": "bf16"}, "--method qlora"),
    ],
)
def test_refused_combinations(spec7b: ModelSpec, kw: dict[str, str], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        est(spec7b, **kw)


def test_cli_refuses_offload_with_ddp_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["estimate", "7B", "--method", "full", "--on", "8xh100-80gb", "--offload", "optimizer"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("fitcheck: error: --offload") and err.count("\n") == 1


def test_acceptance_70b_zero3_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3.1-70b", "--method", "full", "--on", "8xh100-80gb", "--strategy", "zero3"]
    rc = main([*args, "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["world_size"] == 8
    assert doc["distributed"]["strategy"] == "zero3" and doc["distributed"]["shard_group"] == 8
    names = {c["name"] for p in doc["phases"] for c in p["components"]}
    assert {"param_partitions", "gathered_params", "fp32_master_partition", "nccl_communicators"} <= names
    assert doc["host_bytes"] == max(h["total_bytes"] for h in doc["host_phases"]) > 0
    # the catalog's DGX H100 node: 2 TB of host RAM
    assert doc["target"]["host_budget_bytes"] == 2048 * 2**30 and doc["target"]["host_verdict"] == "fits"


def test_host_memory_option_judges_the_node(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3.1-70b", "--method", "full", "--on", "8xh100-80gb", "--strategy", "zero3"]
    rc = main([*args, "--offload", "optimizer", "--host-memory", "512GB", "-f", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["target"]["host_verdict"] == "does_not_fit"
    assert any("host memory" in n for n in doc["target"]["notes"])


def test_hf_auto_values_follow_transformers(spec7b: ModelSpec) -> None:
    h = spec7b.arch.hidden_size
    assert hf_auto(h) == {
        "reduce_bucket_size": h * h,
        "stage3_prefetch_bucket_size": int(0.9 * h * h),
        "stage3_param_persistence_threshold": 10 * h,
    }
    hf = zero_config(spec7b, LlmSetup(trainer="hf", strategy="zero2"))
    plain = zero_config(spec7b, LlmSetup(strategy="zero2"))
    assert hf["reduce_bucket_size"] == h * h and plain["reduce_bucket_size"] == 500_000_000
    assert plain["overlap_comm"] is False and hf["overlap_comm"] is True


def test_every_strategy_has_facts() -> None:
    from fitcheck.models import STRATEGIES

    assert set(STRATEGY_FACTS) == set(STRATEGIES)
    ranks = [STRATEGY_FACTS[s].comm_rank for s in ("ddp", "zero1", "zero2", "zero3")]
    assert ranks == sorted(ranks)


def test_diffusion_across_gpus_is_data_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    """kohya runs several GPUs through accelerate DDP: per GPU the single step + buckets + NCCL."""
    rc = main(["estimate", "sdxl", "--method", "lora", "--on", "24GB", "-f", "json"])
    one = json.loads(capsys.readouterr().out)
    rc2 = main(["estimate", "sdxl", "--method", "lora", "--on", "2x4090", "-f", "json"])
    two = json.loads(capsys.readouterr().out)
    assert rc == rc2 == 0 and two["world_size"] == 2 and one["world_size"] == 1
    step = {c["name"]: c["bytes"] for c in two["phases"][2]["components"]}
    assert step["ddp_grad_buckets"] == step["gradients"] and step["nccl_communicators"] == 544 * 2**20
    assert two["host_bytes"] > 0 and two["device_bytes"] > one["device_bytes"]
    rc3 = main(["estimate", "sdxl", "--method", "lora", "--on", "2x4090", "--strategy", "zero2"])
    assert rc3 == 2 and "data-parallel" in capsys.readouterr().err


def test_fsdp1_no_sync_holds_every_units_unsharded_grads(spec7b: ModelSpec) -> None:
    """lit-gpt accumulates under FSDP1's no_sync(): each rank keeps every layer unit's whole unsharded
    gradient (frozen weights of the unit included under use_orig_params=True) through forward and backward;
    the last micro-batch reduce-scatters and frees them, so the optimizer step holds gradient shards; FSDP2
    (not lit-gpt's) and one micro-batch keep gradient shards (docs/distributed.md#fsdp-no-sync)."""
    kw: dict[str, object] = {"method": "lora", "lora_targets": "q_proj,v_proj", "gpus": 2, "strategy": "fsdp"}
    held = est(spec7b, trainer="litgpt", fsdp_version=1, grad_accum=32, **kw)
    a = spec7b.arch
    per_layer = (
        sum(lin.numel for lin in layer_linears(a, False))
        + (inventory(a).per_layer_norms + inventory(a).other_layer) // a.num_layers
    )
    lora = held.params.adapter // a.num_layers
    expected = a.num_layers * (per_layer + lora) * 2  # bf16: the layers, not the root's embeddings/lm_head
    for phase in ("forward", "backward"):
        got = parts(held, phase)
        assert got["no_sync_grads"] == expected, phase
        assert "gradient_shards" not in got
    step = parts(held)  # litgpt's shards keep bf16: the adapters' gradient, halved over 2 ranks
    assert "no_sync_grads" not in step and step["gradient_shards"] == held.params.adapter * 2 // 2
    for other in (
        est(spec7b, trainer="litgpt", fsdp_version=2, grad_accum=32, **kw),
        est(spec7b, trainer="litgpt", fsdp_version=1, grad_accum=1, **kw),
    ):
        assert "no_sync_grads" not in parts(other)
        assert held.device_bytes - other.device_bytes > 0.9 * expected
    full = est(spec7b, trainer="litgpt", fsdp_version=1, grad_accum=4, method="full", gpus=2, strategy="fsdp")
    assert parts(full, "forward")["no_sync_grads"] == full.params.total * 2  # the root trains: all of it


def test_hf_trainer_fsdp_accumulates_unsharded_grads(spec7b: ModelSpec) -> None:
    """The HF Trainer runs every micro-batch but the last under ``accelerator.no_sync(model)`` (transformers
    5.24.0 trainer.py): FSDP1's ``no_sync()``, FSDP2's ``set_requires_gradient_sync(False)``. Either way the
    unsharded gradients of the trainable parameters stay until the last micro-batch: LoRA's adapters (peft's
    wrap policy: each LoRA Linear its own FSDP1 unit, no gradient for the frozen layer units), the whole
    model for full fine-tuning. Not with DeepSpeed, one micro-batch, or (not applied yet) CPU offload
    (docs/distributed.md#fsdp-no-sync)."""
    kw: dict[str, object] = {"trainer": "hf", "gpus": 8, "strategy": "fsdp"}
    for version in (1, 2):
        lora = est(spec7b, method="lora", grad_accum=4, fsdp_version=version, **kw)
        for phase in ("forward", "backward"):
            got = parts(lora, phase)
            assert got["no_sync_grads"] == lora.params.adapter * 2, (version, phase)  # bf16, frozen excluded
            assert "gradient_shards" not in got
        # the last micro-batch reduce-scatters the accumulated gradients and drops them (FSDP2:
        # FSDPParamGroup.post_backward, torch 2.13.0): the optimizer step holds the shards
        assert "no_sync_grads" not in parts(lora) and "gradient_shards" in parts(lora), version
        full = est(spec7b, method="full", grad_accum=4, fsdp_version=version, **kw)
        assert parts(full, "forward")["no_sync_grads"] == full.params.total * 2
        off = est(spec7b, method="full", grad_accum=4, fsdp_version=version, offload="all", **kw)
        assert "no_sync_grads" not in parts(off)  # not applied with CPU offload (docs/distributed.md)
    synced = [
        est(spec7b, method="full", grad_accum=1, fsdp_version=2, **kw),
        est(spec7b, method="full", grad_accum=4, fsdp_version=2, **{**kw, "trainer": "torchtune"}),
        est(spec7b, method="full", grad_accum=4, trainer="hf", gpus=8, strategy="zero3"),
    ]
    for other in synced:
        assert "no_sync_grads" not in parts(other)
    # one micro-batch holds no gradient in forward; accumulating, the whole bf16 gradient is there
    held = full.params.total * 2
    assert full.phase("forward").total_bytes - synced[0].phase("forward").total_bytes > 0.99 * held


def test_sharded_qlora_under_hf_keeps_the_load_dtype(spec7b: ModelSpec) -> None:
    """TRL skips (0.8-0.25) or never runs (0.26+) prepare_model_for_kbit_training when transformers left
    the Params4bit on the CPU, which it does under FSDP and ZeRO-3: no fp32 residual stream, adapters in
    bf16 (engine/regimes.py SRC_SHARDED_QLORA). One GPU, DDP and ZeRO-2 keep the k-bit upcast when the
    script runs peft's preparation (--kbit-prep); TRL's own default there is no preparation either."""
    from fitcheck.engine.regimes import regime_for

    kw: dict[str, object] = {"method": "qlora", "trainer": "hf", "grad_ckpt": True}
    sharded = {s: LlmSetup(**kw, gpus=2, strategy=s) for s in ("fsdp", "zero3")}  # type: ignore[arg-type]
    prepared = [
        LlmSetup(**kw, kbit_prep=True),  # type: ignore[arg-type]
        LlmSetup(**kw, gpus=2, strategy="zero2", kbit_prep=True),  # type: ignore[arg-type]
        LlmSetup(**kw, gpus=2, kbit_prep=True),  # type: ignore[arg-type]
    ]
    trl = regime_for(LlmSetup(**kw))  # type: ignore[arg-type]
    assert (trl.kbit_upcast, trl.adapter_dtype) == (False, "bf16") and "SFTTrainer" in trl.source
    for setup in sharded.values():
        r = regime_for(setup)
        assert (r.kbit_upcast, r.adapter_dtype) == (False, "bf16") and "SFTTrainer" in r.source
    for setup in prepared:
        r = regime_for(setup)
        assert (r.kbit_upcast, r.adapter_dtype) == (True, "fp32")
    a = spec7b.arch
    bf16 = parts(estimate(spec7b, sharded["fsdp"]), "backward")["checkpoints"]
    fp32 = parts(estimate(spec7b, prepared[2]), "backward")["checkpoints"]
    assert bf16 == a.num_layers * 2048 * a.hidden_size * 2 and fp32 == 2 * bf16


def test_fsdp_keeps_bitsandbytes_quant_state_whole_on_every_gpu() -> None:
    """FSDP shards parameters only; bitsandbytes keeps NF4's absmax and code tables in ``quant_state``,
    so every rank holds all of them on its GPU, also under CPU offload; torchao's NF4Tensor shards its
    scalers with the tensor (docs/distributed.md#qlora)."""
    spec = resolve_model("8B")
    kw: dict[str, object] = {"method": "qlora", "strategy": "fsdp", "quant_storage": "bf16"}
    one = estimate(spec, LlmSetup(method="qlora", grad_ckpt=True))
    consts = parts(one)["weights_4bit"] - one.params.quantized // 2
    assert consts > 0
    for gpus, offload, version in ((2, "none", 1), (8, "none", 2), (2, "all", 1), (4, "all", 2)):
        e = est(spec, gpus=gpus, offload=offload, fsdp_version=version, **kw)
        assert parts(e)["weights_4bit"] == consts, (gpus, offload)
    two, eight = (est(spec, gpus=g, fsdp_version=1, **kw) for g in (2, 8))
    # the shards hold the packed weights, the 16-bit frozen rest and the fp32 trainables, not the constants
    p1 = parts(one)
    frozen = p1["weights_4bit"] + p1.get("weights_unquantized", 0) - consts
    whole = one.params.trainable * 4 + frozen
    assert parts(two)["param_shards"] == pytest.approx(whole / 2, abs=1)
    assert parts(eight)["param_shards"] == pytest.approx(whole / 8, abs=1)
    tt = est(spec, gpus=2, trainer="torchtune", **kw)
    assert tt.regime.nf4_format == "torchao" and "weights_4bit" not in parts(tt)


def test_zero3_keeps_bitsandbytes_quant_state_whole_on_every_gpu() -> None:
    """ZeRO-3 partitions each parameter's data; bitsandbytes keeps NF4's constants in ``quant_state``, an
    attribute, so every rank holds all of them, offloaded or not (docs/distributed.md#zero3-no-init)."""
    spec = resolve_model("8B")
    one = estimate(spec, LlmSetup(method="qlora", grad_ckpt=True))
    consts = parts(one)["weights_4bit"] - one.params.quantized // 2
    kw: dict[str, object] = {"method": "qlora", "strategy": "zero3", "quant_storage": "bf16"}
    for gpus, offload in ((2, "none"), (8, "none"), (4, "all")):
        e = est(spec, gpus=gpus, offload=offload, **kw)
        assert parts(e)["weights_4bit"] == consts, (gpus, offload)
    two, eight = (parts(est(spec, gpus=g, **kw)) for g in (2, 8))
    # the partitions hold the rest: 6/8 of it more per GPU on two than on eight
    moved = two["param_partitions"] - eight["param_partitions"]
    whole = 2 * two["param_partitions"] + two["persistent_params"]
    assert moved == pytest.approx((whole - two["persistent_params"]) * (1 / 2 - 1 / 8), rel=1e-3)


def test_zero3_on_a_quantized_base_loads_the_whole_model_on_every_gpu() -> None:
    """transformers builds a quantized model without zero.Init, so DeepSpeedEngine moves all of it to each
    GPU before ZeRO-3 partitions it: the load phase holds every parameter as stored, whatever the GPU
    count; a model built under zero.Init (unquantized) never does (docs/distributed.md#zero3-no-init)."""
    spec = resolve_model("70B")
    kw: dict[str, object] = {"method": "qlora", "strategy": "zero3", "quant_storage": "bf16", "trainer": "hf"}
    one = estimate(spec, LlmSetup(method="qlora", grad_ckpt=True, trainer="hf"))
    stored = sum(parts(one).get(k, 0) for k in ("weights_4bit", "weights_unquantized", "adapters"))
    for gpus, offload in ((2, "none"), (8, "none"), (4, "all")):
        e = est(spec, gpus=gpus, offload=offload, **kw)
        load = parts(e, "load")
        assert load["zero3_unpartitioned"] == pytest.approx(stored, rel=1e-3), (gpus, offload)
        assert "param_partitions" not in load
    two = est(spec, gpus=2, **kw)
    assert two.peak_phase == "load"
    assert two.peak_allocated_bytes > 2 * parts(two, "backward")["param_partitions"]
    for method in ("lora", "full"):
        assert "zero3_unpartitioned" not in parts(est(spec, gpus=8, method=method, strategy="zero3"), "load")
    for strategy in ("zero2", "fsdp"):
        assert "zero3_unpartitioned" not in parts(est(spec, gpus=2, **{**kw, "strategy": strategy}), "load")


def test_fsdp1_param_offload_copies_the_shard_to_the_gpu_to_gather(spec7b: ModelSpec) -> None:
    """FSDP1 CPUOffload(offload_params=True): pre_unshard copies the host shard to the GPU for the
    all-gather, one unit's shard (1/N of a layer) beside the gathered layers; not without offload, not
    under FSDP2 (docs/distributed.md#fsdp-units)."""
    kw: dict[str, object] = {"method": "lora", "gpus": 2, "strategy": "fsdp"}

    def units(e: Estimate, phase: str) -> int:
        return parts(e, phase)["gathered_units"]

    off, on = (est(spec7b, fsdp_version=1, offload=o, **kw) for o in ("all", "none"))
    layer = units(on, "forward")  # FSDP1: one unsharded layer in forward
    for phase in ("forward", "backward"):
        assert units(off, phase) - units(on, phase) == pytest.approx(layer / 2, abs=1)
    two_off, two_on = (est(spec7b, fsdp_version=2, offload=o, **kw) for o in ("all", "none"))
    assert units(two_off, "backward") == units(two_on, "backward")


def test_fsdp1_cpu_offload_keeps_grad_shards_on_the_gpu_until_backward_ends(spec7b: ModelSpec) -> None:
    """FSDP1 CPUOffload(offload_params=True): ``_saved_grad_shard`` keeps each unit's reduce-scattered
    gradient on the GPU after its copy to the host until the post-backward callback, so the end of
    backward holds every trainable shard (shard dtype, 1/N); their blocks stay cached in the
    post-backward stream's pool through the next forward, not at load. FSDP2 and FSDP1 without
    offload keep none of it; with offload the optimizer step runs on the CPU
    (docs/distributed.md#fsdp-offload-grads)."""
    kw: dict[str, object] = {"gpus": 2, "strategy": "fsdp", "offload": "all"}
    off = est(spec7b, fsdp_version=1, **kw)
    trainable = off.params.trainable
    for phase in ("forward", "backward", "optimizer_step"):
        assert parts(off, phase)["offload_grad_shards"] == pytest.approx(4 * trainable / 2, abs=1), phase
    assert "offload_grad_shards" not in parts(off, "load")
    # no accelerate mixed precision (--no-autocast): the shards, and so their gradients, keep bf16
    plain = est(spec7b, fsdp_version=1, autocast=False, **kw)
    assert parts(plain, "backward")["offload_grad_shards"] == pytest.approx(2 * trainable / 2, abs=1)
    for other in (est(spec7b, fsdp_version=2, **kw), est(spec7b, fsdp_version=1, gpus=2, strategy="fsdp")):
        assert all("offload_grad_shards" not in parts(other, p.name) for p in other.phases)
    lora = est(spec7b, fsdp_version=1, method="lora", **kw)
    assert parts(lora, "backward")["offload_grad_shards"] == pytest.approx(
        4 * lora.params.trainable / 2, abs=1
    )
    for e in (off, est(spec7b, fsdp_version=2, **kw)):
        assert "optimizer_transient" not in parts(e, "optimizer_step")
        host = {c.name for h in e.host_phases for c in h.components}
        assert "optimizer_transient" in host


def test_fsdp1_offload_changes_only_what_its_code_moves() -> None:
    """FSDP1 ``CPUOffload(offload_params=True)`` read for what stays on the GPU (issue 10,
    docs/distributed.md#fsdp-offload-checked): the parameter shards and the optimizer step go to the host,
    the host shard's GPU copy joins the gathered units, the reduce-scattered gradient shards stay to the end
    of backward, and no_sync() is not used. Every other line (activations, root unit, NF4 constants,
    NCCL) is the same with and without offload, for QLoRA, LoRA and full fine-tuning."""
    spec = resolve_model("8B")
    moved = {"param_shards", "optimizer_states", "no_sync_grads"}
    for method in ("qlora", "lora", "full"):
        kw: dict[str, object] = {"method": method, "gpus": 2, "strategy": "fsdp", "fsdp_version": 1}
        kw.update({"grad_accum": 2, "trainer": "hf", "quant_storage": "bf16" if method == "qlora" else None})
        on, off = (est(spec, offload=o, **kw) for o in ("none", "all"))
        for phase in ("load", "forward", "backward", "optimizer_step"):
            a, b = parts(on, phase), parts(off, phase)
            assert moved <= set(a) | {"no_sync_grads"} and not moved & set(b), (method, phase)
            same = set(a) & set(b) - {"gathered_units"}
            assert {k: a[k] for k in same} == {k: b[k] for k in same}, (method, phase)
            assert set(b) - set(a) <= {"offload_grad_shards"}, (method, phase)
            if phase in ("forward", "backward"):
                layer = parts(on, "forward")["gathered_units"]  # FSDP1: one unsharded layer in forward
                assert b["gathered_units"] - a["gathered_units"] == pytest.approx(layer / 2, abs=1)
        host = {c.name for h in off.host_phases for c in h.components}
        assert {"param_shards", "optimizer_states"} <= host, method


@pytest.mark.parametrize("strategy", ["zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "fsdp-no-shard"])
def test_master_weights_under_sharding_are_not_an_amp_model(spec7b: ModelSpec, strategy: str) -> None:
    """HF Trainer, --master-weights: DeepSpeed ZeRO casts the module to 16 bits and keeps the fp32 master in
    its optimizer partition, FSDP gathers 16-bit units from fp32 shards: no fp32 model under autocast, so no
    autocast weight copies (they were the whole model in 16 bits, unsharded) and the same peak as without the
    flag. Under DDP the HF Trainer's AMP runs an fp32 model and autocast casts every weight."""
    kw: dict[str, object] = {"strategy": strategy, "trainer": "hf", "precision": "bf16", "grad_ckpt": False}
    if strategy == "fsdp-no-shard":
        kw["fsdp_version"] = 1
    master, plain = est(spec7b, master_weights=True, **kw), est(spec7b, master_weights=False, **kw)
    copies = [c.bytes for ph in master.phases for c in ph.components if c.name == "autocast_weight_copies"]
    assert not any(copies)
    assert master.device_bytes == plain.device_bytes
    ddp = est(spec7b, master_weights=True, strategy="ddp", trainer="hf", precision="bf16", grad_ckpt=False)
    assert parts(ddp, "forward")["autocast_weight_copies"] > 0


def test_fsdp1_frozen_units_keep_recomputed_layers_until_backward_ends(spec7b: ModelSpec) -> None:
    """FSDP1 with frozen units (LoRA: the base weights need no gradient) under reentrant checkpointing:
    each frozen unit's reshard-only multi-grad hook, registered in the recompute and removed only when
    backward ends, keeps that layer's recomputed graph, its detached checkpoint input and the gradient
    accumulated into it; late in backward the peak holds (L - 1) / L of the checkpoints more than its first
    layer's moment (traced: bench/fsdp1_frozen_trace.py; docs/distributed.md#fsdp1-frozen-units-trace).
    Not under full fine-tuning (no frozen unit), FSDP2 or non-reentrant checkpointing (transformers 5.x's
    default, so not when unset)."""
    kw: dict[str, object] = {
        "gpus": 2,
        "strategy": "fsdp",
        "seq_len": 8192,
        "trainer": "hf",
        "grad_ckpt": True,
    }
    lora = est(spec7b, fsdp_version=1, method="lora", ckpt_reentrant=True, **kw)
    bwd = parts(lora, "backward")
    layers = spec7b.arch.num_layers
    assert bwd["frozen_unit_graphs"] == pytest.approx(bwd["checkpoints"] * (layers - 1) / layers, abs=1)
    assert all("frozen_unit_graphs" not in parts(lora, p) for p in ("load", "forward", "optimizer_step"))
    assert lora.peak_allocated_bytes >= bwd["frozen_unit_graphs"] + bwd["checkpoints"]
    qlora = est(spec7b, fsdp_version=1, method="qlora", ckpt_reentrant=True, **kw)
    assert "frozen_unit_graphs" in parts(qlora, "backward")
    for other in (
        est(spec7b, fsdp_version=1, method="full", ckpt_reentrant=True, **kw),
        est(spec7b, fsdp_version=2, method="lora", ckpt_reentrant=True, **kw),
        est(spec7b, fsdp_version=1, method="lora", ckpt_reentrant=False, **kw),
        est(spec7b, fsdp_version=1, method="lora", **kw),  # unset: today's HF default is non-reentrant
    ):
        assert all("frozen_unit_graphs" not in parts(other, p.name) for p in other.phases)


def test_fsdp1_end_of_backward_holds_the_root_gradient_twice() -> None:
    """FSDP1's flat parameter: autograd holds each view's gradient until the root unit's last one (the
    embedding's) arrives, then concatenates them into the flat gradient, at the end of backward: the
    root's parameters and twice its gradient beside every accumulated gradient (traced:
    bench/fsdp1_root_grads_trace.py; docs/distributed.md#fsdp-units). FSDP2 has no flat parameter; LoRA's
    root does not train."""
    spec = resolve_model("google/gemma-2b")  # a 256k vocabulary: the root outweighs a layer tenfold
    kw: dict[str, object] = {"gpus": 4, "strategy": "fsdp", "trainer": "litgpt", "grad_accum": 4}
    kw["seq_len"] = 256
    e = est(spec, batch_size=1, fsdp_version=1, **kw)
    got = parts(e, "backward")
    assert got["unit_grads"] == 2 * got["root_params"]  # the root trains whole: a gradient per parameter
    assert "logits_loss" not in got and "checkpoints" not in got  # after every layer's backward
    assert got["no_sync_grads"] == e.params.total * 2
    fsdp2 = est(spec, batch_size=1, fsdp_version=2, **kw)
    lora = est(spec, batch_size=1, method="lora", fsdp_version=1, **kw)
    for other in (fsdp2, lora):
        assert all("concatenation" not in c.rule for c in other.phase("backward").components)
    hump = est(spec, batch_size=1, fsdp_version=1, **{**kw, "seq_len": 4096})  # the logits outweigh it
    assert "logits_loss" in parts(hump, "backward")
