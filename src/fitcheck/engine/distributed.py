"""Several GPUs: DDP, DeepSpeed ZeRO 1/2/3 and FSDP, per GPU and per node.

The single-GPU estimate (engine/estimate.py) gives the activations, the logits hump and the model
states of a whole replica. This module re-deals the model states the way each engine really holds
them on one rank (DeepSpeed: compute-dtype parameters and fp32 flat partitions; FSDP: fp32 shards
under mixed precision, unsharded compute-dtype units while they are used), adds the buffers the
engine allocates (gradient buckets, gather buffers, NCCL communicators) and computes the host (CPU)
memory of one node: offloaded states, pinned buffers and model loading.

Every rule and its source (file and release of the engine that implements it): docs/distributed.md.
Numbers in, bytes out: no I/O, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fitcheck.assembly import phase, reassemble
from fitcheck.engine.fsdp_embedding import Held, UnitSizes, embedding_units
from fitcheck.engine.params import inventory, layer_linears
from fitcheck.engine.states import quantized_base
from fitcheck.errors import OptionError
from fitcheck.facts.deepspeed import ZERO_DEFAULTS
from fitcheck.facts.dtypes import nbytes
from fitcheck.models import (
    Component,
    Distributed,
    Estimate,
    HostPhase,
    LlmSetup,
    ModelSpec,
    Phase,
    PhaseName,
    SetupBase,
    Strategy,
)
from fitcheck.units import MIB

D = "docs/distributed.md#"
Engine = Literal["torch-ddp", "deepspeed", "fsdp", "accelerate-device-map"]


@dataclass(frozen=True)
class StrategyFacts:
    """What one strategy shards, and how much it communicates (planner preference: lower first)."""

    engine: Engine
    shards_optimizer: bool
    shards_grads: bool
    shards_params: bool
    reshard_after_forward: bool
    hybrid: bool
    comm_rank: int
    source: str


#: One row per strategy (docs/distributed.md, "Strategies").
STRATEGY_FACTS: dict[Strategy, StrategyFacts] = {
    "ddp": StrategyFacts(
        "torch-ddp", False, False, False, False, False, 0, "torch/nn/parallel/distributed.py"
    ),
    "zero1": StrategyFacts(
        "deepspeed", True, False, False, False, False, 1, "deepspeed/runtime/zero/stage_1_and_2.py"
    ),
    "zero2": StrategyFacts(
        "deepspeed", True, True, False, False, False, 2, "deepspeed/runtime/zero/stage_1_and_2.py"
    ),
    "fsdp-grad-op": StrategyFacts(
        "fsdp", True, True, True, False, False, 3, "torch/distributed/fsdp/_fully_shard"
    ),
    "fsdp-hybrid": StrategyFacts(
        "fsdp", True, True, True, True, True, 4, "torch/distributed/fsdp/_fully_shard"
    ),
    "fsdp": StrategyFacts("fsdp", True, True, True, True, False, 5, "torch/distributed/fsdp/_fully_shard"),
    "zero3": StrategyFacts("deepspeed", True, True, True, True, False, 5, "deepspeed/runtime/zero/stage3.py"),
    # FSDP1 ShardingStrategy.NO_SHARD: every rank keeps whole flat parameters, all-reduces their grads
    "fsdp-no-shard": StrategyFacts(
        "fsdp", False, False, False, False, False, 0, "torch/distributed/fsdp/_runtime_utils.py"
    ),
    # one process, layers split over the GPUs (engine/devmap.py); only hidden states cross GPUs
    "device-map": StrategyFacts(
        "accelerate-device-map", False, False, False, False, False, 0, "accelerate/utils/modeling.py"
    ),
}

#: The emitted deepspeed.json fixes these (the HF/DeepSpeed example configs do the same).
ZERO_EMITTED: dict[str, int | bool] = {
    "allgather_bucket_size": 200_000_000,
    "overlap_comm": True,
    "contiguous_gradients": True,
}
#: Trainers that run DeepSpeed through transformers' integration, which fills "auto" values.
HF_FAMILY = frozenset({"hf", "axolotl", "llamafactory"})
#: NCCL memory per communicator on 4 x A100: 544 MB with 2 ranks, 688 MB with more (NVIDIA/nccl#964).
NCCL_COMM_MIB: dict[str, int] = {"two_ranks": 544, "more_ranks": 688}
#: DeepSpeed's own estimators multiply host memory by ``additional_buffer_factor=1.5``
#: (estimate_zero2/zero3_model_states_mem_needs_all_live, stage_1_and_2.py / stage3.py).
DS_HOST_BUFFER_FACTOR = 1.5
#: Trainers that accumulate gradients without reduce-scattering them on every micro-batch but the last:
#: lit-gpt/litgpt (``fabric.no_backward_sync(model, enabled=is_accumulating)``, finetune/lora.py at
#: lit-gpt 8641822), which Lightning Fabric's FSDPStrategy runs as ``FullyShardedDataParallel.no_sync()``;
#: the HF Trainer and the trainers built on it (transformers 5.24.0 trainer.py, the inner loop: every
#: micro-batch but the last under ``accelerator.no_sync(model)`` unless ``sync_each_batch`` or DeepSpeed;
#: accelerate 1.15.0 ``Accelerator.no_sync`` enters the FSDP1 module's ``no_sync`` and calls FSDP2's
#: ``set_requires_gradient_sync(False)``, after which torch 2.13's ``FSDPParamGroup.post_backward`` keeps each
#: parameter's unsharded gradient instead of reduce-scattering it). HF_FAMILY below.
NO_SYNC_TRAINERS = frozenset({"litgpt", "hf", "axolotl", "llamafactory"})
#: transformers' default ``max_shard_size`` for hub checkpoints saved before 5.x was "5GB"; most large
#: hub models ship 5 GB shards (Llama 3.1 70B: 30 files of about 4.7 GB). ZeRO-3's zero.Init loads one
#: shard at a time per rank.
CHECKPOINT_SHARD_BYTES = 5 * 10**9


def hf_auto(hidden: int) -> dict[str, int]:
    """What transformers fills for "auto" ZeRO keys (integrations/deepspeed.py, trainer_config_finalize)."""
    return {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }


def zero_config(spec: ModelSpec, setup: LlmSetup) -> dict[str, int | float | bool]:
    """The ZeRO settings the run uses.

    HF-family trainers: the config fitcheck emits ("auto" buckets resolved from the hidden size,
    overlap_comm on). Other trainers: DeepSpeed's own defaults, where overlap_comm is on only for
    ZeRO-3 (zero/config.py, overlap_comm_valid) and the buckets are 5e8 elements.
    ``--zero-bucket-size`` / ``--zero-overlap-comm`` (a config's explicit values) replace the filled ones.
    """
    stage = int(setup.effective_strategy[-1]) if setup.effective_strategy.startswith("zero") else 3
    out: dict[str, int | float | bool]
    if setup.trainer in HF_FAMILY:
        out = {**ZERO_DEFAULTS, **ZERO_EMITTED}
        out.update(hf_auto(spec.arch.hidden_size))
    else:
        out = {**ZERO_DEFAULTS, "overlap_comm": stage == 3, "contiguous_gradients": True}
    if setup.zero_bucket_size is not None:
        out["reduce_bucket_size"] = setup.zero_bucket_size
    if setup.zero_overlap_comm is not None:
        out["overlap_comm"] = setup.zero_overlap_comm
    return out


def check(setup: LlmSetup) -> None:
    """Refuse combinations no engine runs, with the flag that works instead."""
    s = setup.effective_strategy
    if setup.backend in ("mps", "cpu") and (setup.strategy is not None or setup.world_size > 1):
        raise OptionError(f"--strategy {s}: several GPUs need NCCL/RCCL (CUDA or ROCm), not {setup.backend}")
    if setup.trainer == "mlx" and setup.distributed:
        raise OptionError("--trainer mlx runs on one Mac; --strategy, --offload and --nodes do not apply")
    if setup.offload != "none" and s == "ddp":
        raise OptionError("--offload needs a sharded strategy: --strategy zero1|zero2|zero3|fsdp")
    if setup.offload == "all" and s in ("zero1", "zero2"):
        raise OptionError(
            f"--offload all: DeepSpeed offloads parameters only with ZeRO-3 (offload_param); "
            f"use --strategy zero3, or --offload optimizer with {s}"
        )
    if setup.offload == "optimizer" and STRATEGY_FACTS[s].engine == "fsdp":
        raise OptionError(
            "--offload optimizer: FSDP's CPUOffload moves parameters, gradients and the optimizer step "
            "together; use --offload all, or --strategy zero3 --offload optimizer"
        )
    if s == "fsdp-no-shard" and setup.fsdp_version != 1:
        raise OptionError("--strategy fsdp-no-shard is FSDP1's NO_SHARD: add --fsdp-version 1")
    if s == "fsdp-no-shard" and setup.offload != "none":
        raise OptionError("--strategy fsdp-no-shard with --offload is not modelled")
    if setup.fsdp_version == 1 and s == "fsdp-hybrid" and setup.nodes == 1:
        pass  # HYBRID_SHARD on one node is FULL_SHARD; allowed


def check_embedding_units(spec: ModelSpec, setup: LlmSetup) -> None:
    """--fsdp-embedding-units is modelled for FSDP2 units resharded after forward (torchtune's
    ``custom_sharded_layers`` with ``fsdp_reshard_after_forward`` True, its default), on a decoder whose
    lm_head is its own matrix (docs/distributed.md#fsdp-embedding-units)."""
    if not setup.fsdp_embedding_units:
        return
    s = setup.effective_strategy if setup.distributed else "one GPU"
    if s not in ("fsdp", "fsdp-hybrid"):
        raise OptionError(
            "--fsdp-embedding-units gives FSDP's embedding and lm_head their own units: it needs "
            f"--strategy fsdp or fsdp-hybrid (FSDP2 fully_shard, reshard after forward), not {s}"
        )
    if setup.fsdp_version != 2:
        raise OptionError(
            "--fsdp-embedding-units is modelled for FSDP2 (fully_shard); FSDP1 wrap policies that give the "
            "embedding its own unit are not: drop --fsdp-version 1 or the flag"
        )
    a = spec.arch
    if a.tie_embeddings or a.structure != "decoder" or a.num_labels:
        raise OptionError(
            f"--fsdp-embedding-units: {spec.id} "
            + (
                "ties its lm_head to the embedding (one parameter), which FSDP2 cannot put in two units "
                "(fully_shard refuses a parameter shared with another group); one grouped unit of both "
                "is not modelled, so it stays in the root"
                if a.tie_embeddings
                else "is not a decoder with an lm_head; the flag is modelled for decoder language models"
            )
        )


@dataclass(frozen=True)
class Shares:
    """Bytes of one whole replica by kind, and the sizes that decide buffers."""

    trainable: int  # trainable parameters (elements)
    total: int  # all parameters (elements)
    compute_b: int  # bytes per element of the compute dtype
    frozen_bytes: int  # frozen weights as stored (dense or 4-bit)
    quant_bytes: int  # the 4-bit part of frozen_bytes
    quant_consts: int  # bitsandbytes: the quantization constants within quant_bytes (quant_state)
    grads_single: int
    optimizer_single: int
    transient_single: int
    unit_params: int  # parameters of the largest decoder layer (one FSDP unit)
    unit_trainable: int
    unit_bytes: int  # the unit gathered in the compute dtype (4-bit packed where quantized)
    root_params: int  # embeddings, lm_head, final norm: FSDP's root unit
    root_trainable: int
    embedding_params: int  # the input embedding (its own FSDP unit under fsdp_embedding_units)
    lm_head_params: int  # the untied lm_head (idem); 0 when tied
    head_params: int  # the largest single module ZeRO-3 gathers outside the layers (lm_head/embedding)
    persistent_params: int  # ZeRO-3: parameters under the persistence threshold, never partitioned
    layers: int


def _comp(est: Estimate, name: str) -> int:
    """A persistent component of the single-GPU estimate (the same in every phase it appears in)."""
    return max((c.bytes for p in est.phases for c in p.components if c.name == name), default=0)


def shares(spec: ModelSpec, setup: LlmSetup, est: Estimate, threshold: int) -> Shares:
    a = spec.arch
    inv = inventory(a)
    cb = 4 if setup.precision == "fp32" else 2
    moe = (False, True) if a.is_moe else (False,)
    layer = max(sum(lin.numel for lin in layer_linears(a, m)) for m in moe)
    norms_layer = inv.per_layer_norms // a.num_layers + inv.other_layer // a.num_layers
    unit = layer + norms_layer
    lora_layer = est.params.adapter // a.num_layers if setup.method != "full" else 0
    if setup.method == "qlora":
        unit_bytes = layer // 2 + (norms_layer + lora_layer) * cb
    else:
        unit_bytes = (unit + lora_layer) * cb
    root = inv.embedding + inv.positions + inv.lm_head + inv.final_norm
    full = setup.method == "full"
    frozen = sum(_comp(est, n) for n in ("weights_frozen", "weights_4bit", "weights_unquantized"))
    persistent = (inv.per_layer_norms + inv.other_layer + inv.final_norm) if threshold >= a.hidden_size else 0
    return Shares(
        trainable=est.params.trainable,
        total=est.params.total,
        compute_b=cb,
        frozen_bytes=frozen,
        quant_bytes=_comp(est, "weights_4bit"),
        quant_consts=_quant_consts(est),
        grads_single=_comp(est, "gradients"),
        optimizer_single=_comp(est, "optimizer_states"),
        transient_single=_comp(est, "optimizer_transient"),
        unit_params=unit + lora_layer,
        unit_trainable=unit if full else lora_layer,
        unit_bytes=unit_bytes,
        root_params=root,
        root_trainable=root if full else 0,
        embedding_params=inv.embedding,
        lm_head_params=inv.lm_head,
        head_params=max(inv.embedding, inv.lm_head),
        persistent_params=persistent,
        layers=a.num_layers,
    )


def _quant_consts(est: Estimate) -> int:
    """bitsandbytes NF4: the bytes of ``weights_4bit`` beyond the packed weights (absmax and code
    tables), which ``Params4bit`` keeps in its ``quant_state``, not in the parameter's data; torchao's
    ``NF4Tensor`` carries its scalers inside the tensor (0 here)."""
    if est.setup.method != "qlora" or est.regime.nf4_format != "bitsandbytes":
        return 0
    return max(0, _comp(est, "weights_4bit") - est.params.quantized // 2)


FROZEN_NAMES = frozenset({"weights_frozen", "weights_4bit", "weights_unquantized"})
#: The single-GPU model-state components this module re-deals.
STATE_NAMES = frozenset(
    {
        "weights",
        "weights_frozen",
        "weights_4bit",
        "weights_unquantized",
        "adapters",
        "master_weights",
        "optimizer_states",
        "gradients",
        "optimizer_transient",
    }
)


@dataclass(frozen=True)
class Plan:
    """Per-GPU state components by phase, and host components, for one strategy."""

    always: list[Component]
    fwd: list[Component]
    bwd: list[Component]
    step: list[Component]
    grads: list[Component]  # alive late in backward and at the step; earlier only when accumulating
    host: list[Component]
    bwd_start: list[Component] | None = None  # backward at its start (loss hump), when it differs
    trained: list[Component] | None = None  # every phase from the first backward on (not at load)
    load: list[Component] | None = None  # the load phase's GPU lines, when not the persistent ones
    bwd_end: list[Component] | None = None  # backward at its end, when that moment can be the larger
    step_grads: list[Component] | None = None  # gradients at the optimizer step, when not ``grads``


def _c(name: str, value: float, rule: str, anchor: str) -> Component:
    """A line through the one component registry; ids shared with one GPU keep their registry source
    (the rule text names the engine's own dtype; docs/distributed.md ``anchor`` gives its rule)."""
    from fitcheck.components import REGISTRY

    row = REGISTRY[name]
    source = row.source("llm") if row.multi is not None or row.llm else D + anchor
    return Component(name=name, bytes=max(0, round(value)), rule=rule, source=source)


def _nccl(setup: SetupBase, facts: StrategyFacts) -> Component:
    ws = setup.world_size
    if ws == 1:
        return _c("nccl_communicators", 0, "", "nccl")
    per = NCCL_COMM_MIB["two_ranks" if ws == 2 else "more_ranks"] * MIB
    comms = 2 if facts.hybrid and setup.nodes > 1 else 1
    return _c(
        "nccl_communicators", comms * per, f"{comms} communicator(s) x {per // MIB} MiB (nccl#964)", "nccl"
    )


def _ddp(setup: LlmSetup, est: Estimate, sh: Shares) -> Plan:
    keep = [
        c for c in est.phases[-1].components if c.name in STATE_NAMES - {"gradients", "optimizer_transient"}
    ]
    buckets = _c(
        "ddp_grad_buckets",
        sh.grads_single,
        "allreduce buckets, one copy of the gradients (gradient_as_bucket_view=False)",
        "ddp",
    )
    grads = [_c("gradients", sh.grads_single, "replicated gradients", "ddp")]
    step = [_c("optimizer_transient", sh.transient_single, "optimizer.step() temporaries", "ddp")]
    return Plan([*keep, buckets], [], [], step, grads, [])


def _zero(
    setup: LlmSetup, est: Estimate, sh: Shares, n: int, stage: int, z: dict[str, int | float | bool]
) -> Plan:
    """DeepSpeed ZeRO-1/2/3 on one rank: parameters, the fp32 optimizer partition, gradients, buffers."""
    always, host = _zero_params(setup, est, sh, n, stage)
    kept, offloaded, step = _zero_optimizer(setup, est, sh, n, stage, z)
    more, fwd, bwd, grads = _zero_grads(setup, sh, n, stage, z)
    load = _zero3_unpartitioned(setup, sh) if stage == 3 else None
    return Plan([*always, *kept, *more], fwd, bwd, step, grads, [*host, *offloaded], load=load)


def _zero3_unpartitioned(setup: LlmSetup, sh: Shares) -> list[Component] | None:
    """ZeRO-3 on a quantized base: the whole model on every GPU while DeepSpeed starts, or None.

    transformers builds a quantized model without ``deepspeed.zero.Init`` (``from_pretrained``: zero.Init
    only ``if is_deepspeed_zero3_enabled() and not is_quantized``; transformers#29587), so its parameters
    carry no ``ds_id`` when ``deepspeed.initialize`` wraps it, and
    ``DeepSpeedEngine._configure_distributed_model`` casts the module and moves all of it to the GPU
    (``self.module.to(self.device)`` unless ``dont_change_device``, which ``deepspeed.initialize`` never
    sets; engine.py @v0.14.0 L1110-1112, unchanged at 38327e07) before the stage-3 optimizer's
    ``Init(module=...)`` partitions it one parameter at a time (parameter_offload.py
    ``_convert_to_zero_parameters``). So loading peaks at every parameter as stored, adapters in the
    compute dtype, on each GPU (docs/distributed.md#zero3-no-init)."""
    if not quantized_base(setup):
        return None
    whole = sh.trainable * sh.compute_b + sh.frozen_bytes
    rule = "quantized base without zero.Init: the whole model on each GPU before ZeRO-3 partitions it"
    return [_c("zero3_unpartitioned", whole, rule, "zero3-no-init")]


def _zero_params(
    setup: LlmSetup, est: Estimate, sh: Shares, n: int, stage: int
) -> tuple[list[Component], list[Component]]:
    """(on the GPU, on the host): compute-dtype parameters; ZeRO-3 partitions them, 1/n per rank."""
    cb = sh.compute_b
    always: list[Component] = []
    host: list[Component] = []
    train_b = sh.trainable * cb
    if stage < 3:
        name = "weights" if setup.method == "full" else "adapters"
        rule = f"{sh.trainable:,} trainable params in the compute dtype (the engine casts the module)"
        always.append(_c(name, train_b, rule, "zero-params"))
        always += [c for c in est.phases[-1].components if c.name in FROZEN_NAMES]
        return always, host
    persist = sh.persistent_params * cb
    replicated_q = sh.quant_bytes if setup.method == "qlora" and _storage(setup) != setup.precision else 0
    if replicated_q:
        rule = "4-bit weights not partitioned: quant_storage differs from the compute dtype"
        always.append(_c("weights_4bit", replicated_q, rule, "qlora"))
    elif sh.quant_consts:
        # ZeRO-3 partitions each parameter's data; Params4bit's quant_state is an attribute, not data
        replicated_q = sh.quant_consts
        always.append(_quant_state(sh))
    part = _c(
        "param_partitions",
        (train_b + sh.frozen_bytes - persist - replicated_q) / n,
        f"compute-dtype partitions, 1/{n} of the model",
        "zero3-params",
    )
    (host if setup.offload == "all" else always).append(part)
    always.append(
        _c("persistent_params", persist, "params under stage3_param_persistence_threshold", "zero3-params")
    )
    return always, host


def _zero_optimizer(
    setup: LlmSetup, est: Estimate, sh: Shares, n: int, stage: int, z: dict[str, int | float | bool]
) -> tuple[list[Component], list[Component], list[Component]]:
    """(on the GPU, on the host, at the step): the fp32 master partition, its optimizer states and
    the fp32 gradient of the partition (one sub_group under ZeRO-3), or all on the host when offloaded."""
    master = _c(
        "fp32_master_partition", 4 * sh.trainable / n, f"fp32 flat partition, 1/{n}", "zero-optimizer"
    )
    opt_fp32 = sh.optimizer_single * (4 / max(1, _opt_state_b(est)))
    opt = _c(
        "optimizer_states", opt_fp32 / n, f"optimizer states on the fp32 partition, 1/{n}", "zero-optimizer"
    )
    grad32 = _c(
        "fp32_grad_partition",
        4 * sh.trainable / n,
        "fp32 gradient of the partition at step",
        "zero-optimizer",
    )
    if setup.offload in ("optimizer", "all"):
        buf = (master.bytes + opt.bytes + grad32.bytes) * (DS_HOST_BUFFER_FACTOR - 1)
        extra = _c("offload_buffers", buf, "DeepSpeed estimator's additional_buffer_factor 1.5", "host")
        return [], [master, opt, grad32, extra], []
    return [master, opt], [], [_step_grad(sh, n, stage, z)]


def flat_source_bytes(compute_b: int) -> int:
    """Bytes per element of the flattened 16-bit gradient DeepSpeed's step converts to fp32 (`_step_grad`):
    the compute dtype's, or none when the gradients already are fp32 (``.to`` returns the tensor itself)."""
    return compute_b if compute_b != 4 else 0


def _step_grad(sh: Shares, n: int, stage: int, z: dict[str, int | float | bool]) -> Component:
    """The fp32 gradient the step makes of the partition (ZeRO-3: of one sub_group), and the flattened
    16-bit copy it is made from: ``self.flatten(self.averaged_gradients[i]).to(fp32)`` concatenates the
    gradient views into a new tensor in the gradients' dtype, then converts it, so both are alive at
    the conversion; fp32 gradients convert to themselves (docs/distributed.md#zero-optimizer)."""
    src = flat_source_bytes(sh.compute_b)
    also = f" + its flattened {src}-byte source" if src else ""
    if stage < 3:
        rule = f"fp32 gradient of the partition at step{also}"
        return _c("fp32_grad_partition", (4 + src) * sh.trainable / n, rule, "zero-optimizer")
    sub = min(int(z["sub_group_size"]), sh.trainable // n)
    rule = f"fp32 gradient of one sub_group at step{also}"
    return _c("fp32_grad_partition", (4 + src) * sub, rule, "zero3-params")


def _zero_grads(
    setup: LlmSetup, sh: Shares, n: int, stage: int, z: dict[str, int | float | bool]
) -> tuple[list[Component], list[Component], list[Component], list[Component]]:
    """(always, forward, backward, gradients phase): gradients or their partition, the reduce
    buckets, and ZeRO-3's gathered parameters."""
    cb = sh.compute_b
    train_b = sh.trainable * cb
    off_opt = setup.offload in ("optimizer", "all")
    rb = int(z["reduce_bucket_size"])
    overlap = bool(z["overlap_comm"])
    always: list[Component] = []
    grads: list[Component] = []
    if stage == 1:
        rule = "full gradients in the compute dtype (ZeRO-1 does not partition them)"
        grads.append(_c("gradients", train_b, rule, "zero-grads"))
    elif stage == 2 and not off_opt:
        # allocated when the first backward starts and kept: alive in every phase from then on
        rule = "grads_in_partition, allocated at backward start"
        always.append(_c("gradient_partition", train_b / n, rule, "zero-grads"))
    if stage < 3:
        ipg = rb * cb * (2 if overlap else 1)
        rule = f"ipg buffer(s): reduce_bucket_size {rb:,} x {1 + overlap}"
        return always, [], [_c("reduce_buckets", ipg, rule, "buckets")], grads
    if not off_opt:
        always.append(_c("gradient_partition", train_b / n, "grad_partitions_flat_buffer, 1/n", "zero-grads"))
    always.append(_c("reduce_buckets", rb * cb, f"ipg bucket: reduce_bucket_size {rb:,}", "buckets"))
    if n == 1 and setup.offload != "all":
        # one rank, partition on the GPU: the "gather" is a view of it, nothing is allocated; with the
        # parameters offloaded, NoGatherHandle's ``.to(device)`` copies each fetched module to the GPU
        # like a gather (zero3-gather)
        return always, [], [], grads
    window, kept = gather_window(sh, setup.grad_ckpt, z)
    rule = "largest gathered module + stage3_prefetch_bucket_size, capped by max_live_parameters"
    if kept:
        rule += f", + {kept} last layer(s) kept to backward (stage3_max_reuse_distance)"
    window *= cb
    fill = prefetch_fill_bytes(setup, sh, z)
    if fill > window:
        rule = (
            f"the prefetcher keeps stage3_max_live_parameters ({int(z['stage3_max_live_parameters']):,}) "
            "gathered, + one fetch beyond it (the largest single parameter), at most the partitioned model"
        )
    gathered = _c("gathered_params", max(window, fill), rule, "zero3-gather")
    return always, [gathered], [gathered], grads


def gather_window(sh: Shares, grad_ckpt: bool, z: dict[str, int | float | bool]) -> tuple[int, int]:
    """(elements, layers kept): the largest module fetched (whole, even beyond max_live_parameters) with
    ``stage3_prefetch_bucket_size`` prefetched, capped by ``stage3_max_live_parameters``, and the last
    layers the reuse distance keeps to backward (`reuse_kept_layers`). What one fetch and its prefetch
    hold; the prefetcher's fill (`prefetch_fill_bytes`) is the larger once the trace is recorded unless
    the kept layers alone pass the cap."""
    largest = max(sh.unit_params, sh.head_params)
    live = max(
        largest, min(int(z["stage3_max_live_parameters"]), largest + int(z["stage3_prefetch_bucket_size"]))
    )
    kept = reuse_kept_layers(sh, grad_ckpt, int(z["stage3_max_reuse_distance"]))
    return live + kept * sh.unit_params, kept


def partitioned_bytes(setup: LlmSetup, sh: Shares) -> int:
    """Bytes of one whole replica that ZeRO-3 partitions (what `param_partitions` deals out, before 1/N):
    every parameter in the compute dtype or its 4-bit storage, less the persistent ones and the 4-bit
    weights or quantization constants kept whole on every rank."""
    persist = sh.persistent_params * sh.compute_b
    replicated_q = sh.quant_bytes if setup.method == "qlora" and _storage(setup) != setup.precision else 0
    replicated_q = replicated_q or sh.quant_consts
    return max(0, sh.trainable * sh.compute_b + sh.frozen_bytes - persist - replicated_q)


def prefetch_fill_bytes(setup: LlmSetup, sh: Shares, z: dict[str, int | float | bool]) -> int:
    """The gathered parameters ZeRO-3's prefetcher holds once the trace is recorded.

    ``PartitionedParameterCoordinator.fetch_sub_module`` runs for every module the hooks see, parameter-less
    containers and dropouts included, and after fetching the module's own parameters pops the recorded
    parameter queue until it has started gathers of ``min(max_live_parameters - n_available_params,
    prefetch_bucket_size)`` elements (partitioned_param_coordinator.py @v0.7.7 L319-349, @v0.12.3
    L347-379, unchanged at edaa7221 L452-457). ``n_available_params`` grows with each gather and falls
    only when a module's parameters are released (L395, L420), so a bucket per module call outruns the
    layers' use (a decoder layer runs some 15-25 module calls) and the gathered total rises to
    ``stage3_max_live_parameters``; the loop's last parameter, or a module fetched with nothing prefetched,
    may cross it by one parameter (bounded here by the largest, the embedding or lm_head). The layers kept
    to backward by the reuse distance are within that count. An emulation of the v0.7.7 coordinator on
    T0_3B + LoRA (session 15) held 1.02e9-1.06e9 elements through forward and backward.
    The queue holds only the partitioned parameters, so a model smaller than the cap is gathered whole."""
    cap = int(z["stage3_max_live_parameters"]) + sh.head_params
    return min(partitioned_bytes(setup, sh), cap * sh.compute_b)


def reuse_kept_layers(sh: Shares, grad_ckpt: bool, max_reuse: int) -> int:
    """Decoder layers ZeRO-3 keeps gathered from their forward to their backward.

    ``PartitionedParameterCoordinator.__params_to_release`` (partitioned_param_coordinator.py, v0.12.3
    @6ea44d02 L472-501) keeps a module's parameters when they occur again in the recorded module order
    before ``stage3_max_reuse_distance`` elements have been walked (every module's parameters counted
    each time it occurs). After the forward of the layer with ``k`` layers behind it the order walks
    those ``k`` layers, the lm_head twice (forward, then its backward fetch), then, with checkpointing,
    each later layer's recomputed forward and its backward (else its backward) before the layer's own
    parameters come back: ``(3k + 1) L + 2 H`` (``(2k + 2) L + 2 H`` without checkpointing) at most,
    with ``L`` a layer's and ``H`` the lm_head's elements. Counted: the layers below the limit whole
    (a layer partly within it, some of its modules kept, is not counted)."""
    head = sh.lm_head_params or sh.embedding_params
    per, extra = (3, 1) if grad_ckpt else (2, 2)
    kept = 0
    while kept < sh.layers and (per * kept + extra) * sh.unit_params + 2 * head < max_reuse:
        kept += 1
    return kept


def _fsdp(setup: LlmSetup, est: Estimate, sh: Shares, n: int, facts: StrategyFacts) -> Plan:
    """FSDP on one rank: the shards and their optimizer states, and the units unsharded while used."""
    always, grads, trans, host = _fsdp_shards(setup, est, sh, n)
    if not facts.shards_params:
        # NO_SHARD: the flat parameter is the whole parameter (``needs_unshard`` is False, so ``unshard``
        # uses ``self.flat_param`` itself) and ``_reduce_grad_no_shard`` all-reduces ``flat_param.grad``
        # in place: no gathered copy, no gradient before its reduction (docs/distributed.md#fsdp-no-shard)
        return Plan(always, [], [], [trans], grads, host, [])
    fwd, bwd, start = _fsdp_units(setup, sh, facts)
    held = _no_sync_grads(setup, sh)
    # the last micro-batch reduce-scatters the accumulated gradients and frees them: the step sees shards
    step_grads = grads if held is not None else None
    if held is not None:
        grads = [held]
    kept = _offload_grad_shards(setup, est, sh, n)
    trained = [kept] if kept is not None else None
    end = _flat_root_grads(setup, sh)
    return Plan(always, fwd, bwd, [trans], grads, host, start, trained, bwd_end=end, step_grads=step_grads)


def _flat_root_grads(setup: LlmSetup, sh: Shares) -> list[Component] | None:
    """FSDP1 at the end of backward, when the root unit trains: its unsharded parameters and its gradient
    twice. FSDP1 exposes a unit's parameters as views of one flat parameter (``torch.split`` of it,
    ``FlatParamHandle._get_unflat_views_unaligned`` / ``_aligned``, torch/distributed/fsdp/_flat_param.py
    L1876-1930 at 2.13.0), so autograd holds each view's gradient until the last of the unit's parameters
    has one, then concatenates them into the flat gradient (the backward of ``split``), both alive while it
    does. For the root (embeddings, lm_head, final norm) the lm_head's gradient comes first and the
    embedding's last, so that moment is the end of backward, after every layer's activations are gone;
    under ``no_sync()`` the new flat gradient then adds into the accumulated one in place, and
    ``_reduce_grad`` (_runtime_utils.py L831-847) drops the unsharded one once it is reduced. Traced on CPU
    (bench/fsdp1_root_grads_trace.py): an accumulating micro-batch peaks at the accumulated gradients, the
    root's parameters and twice its gradient (docs/distributed.md#fsdp-units)."""
    if setup.fsdp_version != 1 or not sh.root_trainable:
        return None
    cb = sh.compute_b
    root = _c("root_params", sh.root_params * cb, "root unit: unsharded to the end of backward", "fsdp-units")
    rule = (
        "end of backward: the root unit's gradient twice, each parameter's view gradient and their "
        "concatenation into FSDP1's flat gradient"
    )
    return [root, _c("unit_grads", 2 * sh.root_trainable * cb, rule, "fsdp-units")]


#: Trainers whose FSDP wraps a model built in the compute dtype and never upcasts its shards: torchtune
#: (loads bf16), and litgpt, whose Lightning Fabric ``FSDPStrategy`` builds the model under
#: ``FSDPPrecision.module_init_context`` (``mixed_precision_config.param_dtype``: bf16 for ``bf16-true``)
#: and wraps it in ``FullyShardedDataParallel`` as it is (lightning 2.4.0 src/lightning/fabric/plugins/
#: precision/fsdp.py L77-108, strategies/fsdp.py ``module_init_context`` L343-352, ``setup_module``
#: L286-318; the ``init_context`` of 71aed751, lit-gpt 8641822's pin, the same).
LOAD_DTYPE_SHARD_TRAINERS = ("torchtune", "litgpt")


def shard_bytes(setup: LlmSetup) -> int:
    """Bytes per element of FSDP's trainable shards (the master copy): accelerate upcasts them to fp32
    when its mixed precision is on (the switch that also turns autocast on); torchtune and litgpt
    (`LOAD_DTYPE_SHARD_TRAINERS`), and a run without autocast (a plain ``FullyShardedDataParallel`` over a
    16-bit model, FSDP's own ``MixedPrecision`` at most), keep the load dtype; litgpt's ``-mixed``
    precisions (``--master-weights``) build the model in fp32 (docs/distributed.md#fsdp-shards)."""
    cb = 4 if setup.precision == "fp32" else 2
    if setup.trainer == "litgpt" and setup.master_weights:  # Fabric's FSDPPrecision: -mixed inits in fp32
        return 4
    return cb if setup.trainer in LOAD_DTYPE_SHARD_TRAINERS or setup.autocast is False else 4


def _offload_grad_shards(setup: LlmSetup, est: Estimate, sh: Shares, n: int) -> Component | None:
    """FSDP1 ``CPUOffload(offload_params=True)``: each unit's reduce-scattered gradient shard is copied
    to the host but stays referenced on the GPU by ``flat_param._saved_grad_shard`` until the
    post-backward callback deletes it (``prepare_gradient_for_optim``), so the end of backward holds
    every trainable shard on the GPU, in the shard dtype. Those blocks were allocated in FSDP's
    post-backward stream, and the caching allocator gives a freed block back only to its own stream,
    so they stay reserved through the next forward (docs/distributed.md#fsdp-offload-grads)."""
    if setup.fsdp_version != 1 or setup.offload != "all" or not sh.trainable:
        return None
    rule = (
        f"1/{n} of the trainable params in the shard dtype: _saved_grad_shard holds each unit's sharded "
        "gradient on the GPU until backward ends; then cached in the post-backward stream's pool"
    )
    return _c("offload_grad_shards", sh.trainable * shard_bytes(setup) / n, rule, "fsdp-offload-grads")


def accumulates_unsharded(setup: LlmSetup) -> bool:
    """Gradient accumulation without the reduce-scatter on the micro-batches before the last one
    (docs/distributed.md#fsdp-no-sync): the HF Trainer under FSDP1 (``no_sync()``) and FSDP2
    (``set_requires_gradient_sync(False)``), lit-gpt under FSDP1; without CPU offload (with it the HF
    Trainer's code does the same, but corpus records of other loops are posed as ``hf``: not applied yet)."""
    if setup.grad_accum <= 1 or setup.trainer not in NO_SYNC_TRAINERS or setup.offload != "none":
        return False
    return setup.trainer in HF_FAMILY or setup.fsdp_version == 1


def _no_sync_grads(setup: LlmSetup, sh: Shares) -> Component | None:
    """The unsharded gradients FSDP keeps while it accumulates, in the compute dtype: under lit-gpt every
    FSDP1 unit that holds a trainable parameter, at the size of its whole flat parameter (frozen weights
    included under ``use_orig_params=True``); under the HF Trainer the trainable parameters only (peft's
    wrap policy gives each LoRA Linear its own FSDP1 unit; FSDP2 keeps a gradient per parameter). The
    root only when it trains."""
    if not accumulates_unsharded(setup):
        return None
    root = sh.root_params * sh.compute_b if sh.root_trainable else 0
    how = "no_sync()" if setup.fsdp_version == 1 else "set_requires_gradient_sync(False)"
    if setup.trainer in HF_FAMILY:
        trained = sh.layers * (sh.unit_bytes if setup.method == "full" else sh.unit_trainable * sh.compute_b)
        what = "the whole model" if setup.method == "full" else "every LoRA parameter"
        rule = f"{how}: unsharded grads of {what} until the last micro-batch"
        return _c("no_sync_grads", trained + root, rule, "fsdp-no-sync")
    layers = sh.layers * sh.unit_bytes if sh.unit_trainable else 0
    rule = (
        f"{how}: unsharded grads of {sh.layers if layers else 0} layer unit(s)"
        f"{' and the root' if root else ''}, frozen weights of each unit included, kept until the "
        "last micro-batch"
    )
    return _c("no_sync_grads", layers + root, rule, "fsdp-no-sync")


def _fsdp_shards(
    setup: LlmSetup, est: Estimate, sh: Shares, n: int
) -> tuple[list[Component], list[Component], Component, list[Component]]:
    """(always, gradients, step temporaries, host): parameter, gradient and optimizer shards, 1/n each
    (on the host under offload "all"), and 4-bit weights FSDP cannot shard."""
    cb = sh.compute_b
    shard_b = shard_bytes(setup)
    shard_frozen = sh.frozen_bytes
    replicated_q = 0
    if setup.method == "qlora" and _storage(setup) != setup.precision:
        replicated_q = sh.quant_bytes
        shard_frozen -= replicated_q
    always: list[Component] = []
    if not replicated_q and sh.quant_consts:
        shard_frozen -= sh.quant_consts
        always.append(_quant_state(sh))
    rule_sh = (
        f"1/{n} of each parameter (DTensor dim-0 shards)" if setup.fsdp_version == 2 else f"1/{n} flat shard"
    )
    params = [
        _c(
            "param_shards",
            (sh.trainable * shard_b + shard_frozen) / n,
            f"{rule_sh}; trainable in {4 if shard_b == 4 else cb}-byte dtype",
            "fsdp-shards",
        ),
    ]
    if replicated_q:
        rule = "4-bit weights not sharded: quant_storage differs from the compute dtype"
        always.append(_c("weights_4bit", replicated_q, rule, "qlora"))
    opt_b = sh.optimizer_single * shard_b / max(1, _opt_state_b(est)) / n
    opt = _c("optimizer_states", opt_b, f"on the shards, 1/{n}", "fsdp-shards")
    rule = f"optimizer.step() temporaries on the shards, 1/{n}"
    trans = _c("optimizer_transient", sh.transient_single / n, rule, "fsdp-shards")
    grads = [_c("gradient_shards", sh.trainable * shard_b / n, f"sharded gradients, 1/{n}", "fsdp-shards")]
    host: list[Component] = []
    if setup.offload == "all":
        # CPUOffload / CPUOffloadPolicy: "the optimizer step runs on CPU" (torch/distributed/fsdp/api.py,
        # _fully_shard/_fsdp_api.py), so its temporaries are host memory too
        host += [*params, opt, *grads, trans]
        grads, params, opt = [], [], _c("optimizer_states", 0, "", "fsdp-shards")
        trans = _c("optimizer_transient", 0, "", "fsdp-shards")
    return [*always, *params, opt], grads, trans, host


def _quant_state(sh: Shares) -> Component:
    """bitsandbytes' NF4 quantization constants under FSDP and ZeRO-3: FSDP flattens and shards parameters
    only, ZeRO-3 partitions each parameter's ``data``, and ``Params4bit`` keeps absmax and code tables in
    ``quant_state`` (also set on its ``Linear4bit`` module), so every rank holds all of them on its GPU,
    with or without CPU offload (docs/distributed.md#qlora)."""
    rule = "NF4 quant_state (absmax, code tables): not a parameter, so neither sharded nor offloaded"
    return _c("weights_4bit", sh.quant_consts, rule, "qlora")


#: Decoder layers unsharded at once in forward, by FSDP version: FSDP2 all-gathers the next unit while the
#: current one runs (implicit forward prefetch); FSDP1 without forward_prefetch gathers one at a time
#: (docs/distributed.md#fsdp-units).
FORWARD_UNITS: dict[int, int] = {1: 1, 2: 2}


def _fsdp_units(
    setup: LlmSetup, sh: Shares, facts: StrategyFacts
) -> tuple[list[Component], list[Component], list[Component]]:
    """(forward, backward, backward start): the root unit, the unsharded layers (current and
    prefetched, or all of them without reshard-after-forward) and the unsharded gradients."""
    if setup.fsdp_embedding_units:
        return _embedding_units(sh)
    cb = sh.compute_b
    root = _c(
        "root_params",
        sh.root_params * cb,
        "root unit (embeddings, lm_head, norm): not resharded after forward",
        "fsdp-units",
    )
    k_fwd = FORWARD_UNITS[setup.fsdp_version]
    fwd: list[Component] = [root]
    bwd: list[Component] = [root]
    if facts.reshard_after_forward:
        copy, why = _offload_shard_copy(setup, sh)
        rule = f"{k_fwd} unsharded layer(s): current + prefetch{why}"
        fwd.append(_c("gathered_units", k_fwd * sh.unit_bytes + copy, rule, "fsdp-units"))
        rule = f"2 unsharded layers: current + backward prefetch{why}"
        bwd.append(_c("gathered_units", 2 * sh.unit_bytes + copy, rule, "fsdp-units"))
    else:
        rule = "every layer unsharded from forward to backward (no reshard after forward)"
        allp = _c("gathered_units", sh.layers * sh.unit_bytes, rule, "fsdp-units")
        fwd.append(allp)
        bwd.append(allp)
    # at the loss hump no gradient exists yet, not even the lm_head's (traced: fsdp-09/10 in
    # tests/data/calibration/fsdp, where a 128k-vocabulary lm_head grad would show)
    start = [*bwd]
    bwd.append(
        _c(
            "unit_grads",
            (sh.unit_trainable + sh.root_trainable) * cb,
            "unsharded grads of the current layer and the root before reduce-scatter",
            "fsdp-units",
        )
    )
    return fwd, bwd, start


def _embedding_units(sh: Shares) -> tuple[list[Component], list[Component], list[Component]]:
    """(forward, backward, backward start) of FSDP2 with the embedding and the lm_head as their own
    units (engine/fsdp_embedding.py): the root keeps only the final norm (and learned positions)."""
    cb = sh.compute_b
    rest = sh.root_params - sh.embedding_params - sh.lm_head_params
    full = bool(sh.root_trainable)
    u = UnitSizes(
        layer=sh.unit_bytes,
        layer_grads=sh.unit_trainable * cb,
        embedding=sh.embedding_params * cb,
        embedding_grads=sh.embedding_params * cb if full else 0,
        head=sh.lm_head_params * cb,
        head_grads=sh.lm_head_params * cb if full else 0,
        prefetch=FORWARD_UNITS[2],  # --fsdp-embedding-units is FSDP2 only (check_embedding_units)
    )
    held = embedding_units(u)
    rule = "root unit (final norm): not resharded after forward; embedding and lm_head are their own units"
    root = _c("root_params", rest * cb, rule, "fsdp-embedding-units")

    def phase(h: Held, grads: bool) -> list[Component]:
        out = [root, _c("gathered_units", h.gathered, f"unsharded: {h.moment}", "fsdp-embedding-units")]
        if grads:
            rule = f"unsharded grads before their reduce-scatter: {h.moment}{' and the root' if full else ''}"
            out.append(_c("unit_grads", h.grads + (rest * cb if full else 0), rule, "fsdp-embedding-units"))
        return out

    return phase(held.forward, False), phase(held.backward, True), phase(held.backward_start, False)


def _offload_shard_copy(setup: LlmSetup, sh: Shares) -> tuple[float, str]:
    """FSDP1 ``CPUOffload(offload_params=True)``: the sharded flat parameter lives on the host, and
    ``FlatParamHandle.pre_unshard`` copies it to the GPU (``flat_param_to(self.device)``) to all-gather
    from; that copy is handed to the unshard stream (``_no_dispatch_record_stream``) and freed after the
    all-gather (torch/distributed/fsdp/_flat_param.py, torch 2.x): one unit's shard in flight
    (docs/distributed.md#fsdp-units). (bytes, rule suffix)"""
    if setup.fsdp_version != 1 or setup.offload != "all":
        return 0.0, ""
    n = shard_group(setup)
    return sh.unit_bytes / n, f" + the host shard copied to the GPU for the all-gather (1/{n} unit)"


def _opt_state_b(est: Estimate) -> int:
    if est.regime.optimizer_state_dtype == "fp32":
        return 4
    dt = est.regime.trainable_dtype if est.setup.method == "full" else est.regime.adapter_dtype
    return nbytes(dt)


def _storage(setup: LlmSetup) -> str:
    """bnb_4bit_quant_storage: the compute dtype by default when the strategy shards (PEFT's rule)."""
    if setup.quant_storage is not None:
        return setup.quant_storage
    return setup.precision if STRATEGY_FACTS[setup.effective_strategy].shards_params else "uint8"


def shard_group(setup: LlmSetup) -> int:
    facts = STRATEGY_FACTS[setup.effective_strategy]
    if facts.engine == "torch-ddp" or (facts.engine == "fsdp" and not facts.shards_params):
        return 1
    return setup.gpus if facts.hybrid else setup.world_size


def _loading(spec: ModelSpec, setup: LlmSetup, sh: Shares) -> list[Component]:
    """Host memory while the model loads, per node (docs/distributed.md#loading)."""
    facts = STRATEGY_FACTS[setup.effective_strategy]
    model_b = sh.total * sh.compute_b
    g = setup.gpus
    if facts.engine == "fsdp":
        rule = "rank 0 loads the checkpoint, the others start on the meta device (cpu_ram_efficient_loading)"
        return [_c("model_load", model_b, rule, "loading")]
    if setup.effective_strategy == "zero3":
        per = min(model_b, CHECKPOINT_SHARD_BYTES)
        rule = f"zero.Init: each of {g} ranks reads one checkpoint shard at a time (~5 GB)"
        return [_c("model_load", g * per, rule, "loading")]
    rule = f"each of {g} ranks loads the whole model on the CPU before moving it to its GPU"
    return [_c("model_load", g * model_b, rule, "loading")]


def _phases(est: Estimate, plan: Plan, extra: list[Component]) -> tuple[Phase, ...]:
    accum = est.setup.grad_accum > 1
    out: list[Phase] = []
    by: dict[PhaseName, list[Component]] = {
        "forward": plan.fwd,
        "backward": plan.bwd,
        "optimizer_step": plan.step,
    }
    for p in est.phases:
        rest = [c for c in p.components if c.name not in STATE_NAMES]
        # the single-GPU backward peak at its start (the loss hump) precedes every gradient
        start = p.name == "backward" and any(c.name == "logits_loss" for c in p.components)
        grads = (
            plan.grads
            if p.name != "load"
            and (p.name == "optimizer_step" or (p.name == "backward" and not start) or accum)
            else []
        )
        if p.name == "optimizer_step" and plan.step_grads is not None:
            grads = plan.step_grads
        # loading holds this rank's persistent share and the load transient, no step buffers
        own = plan.bwd_start if start and plan.bwd_start is not None else by.get(p.name, [])
        trained = plan.trained if plan.trained is not None and p.name != "load" else []
        if p.name == "load" and plan.load is not None:
            # the strategy's own loading peak, after the single-GPU load (which held less)
            out.append(phase(p.name, [*plan.load, *extra]))
            continue
        here = phase(p.name, [*plan.always, *grads, *trained, *own, *rest, *extra])
        if p.name == "backward" and plan.bwd_end is not None:
            # the end of backward: every gradient there, no activation but the inputs
            inputs = [c for c in rest if c.name == "inputs"]
            end = phase(p.name, [*plan.always, *plan.grads, *trained, *plan.bwd_end, *inputs, *extra])
            here = end if end.total_bytes > here.total_bytes else here
        out.append(here)
    return tuple(out)


def _reassemble(
    est: Estimate, phases: tuple[Phase, ...], steady: int, tensors: int, stranded: int = 0, **extra: object
) -> Estimate:
    """The per-GPU estimate through the one assembly (peak, reserve, context, device), then the
    multi-GPU fields."""
    out = reassemble(est, phases, steady, tensors, stranded)
    return out.model_copy(update=extra)


def distribute(spec: ModelSpec, setup: LlmSetup, est: Estimate, tensors: int, stranded: int = 0) -> Estimate:
    """Turn the single-GPU estimate into the per-GPU one of ``setup``'s strategy, with host memory.

    Args:
        spec: the model.
        setup: the run, with its strategy, offload, GPUs per node and nodes.
        est: the single-GPU estimate of the same setup (activations, states of one replica).
        tensors: live tensors per rank, for the allocator reserve (engine/overhead.py).
        stranded: the single-GPU step's reserve floor at the loss (engine/estimate.py `stranded_margin`),
            kept on every rank: a rank runs the whole step and shards the states it holds at the loss
            and at its peak alike.
    """
    check(setup)
    s = setup.effective_strategy
    facts = STRATEGY_FACTS[s]
    n = shard_group(setup)
    z = zero_config(spec, setup)
    threshold = int(z["stage3_param_persistence_threshold"]) if s == "zero3" else 0
    sh = shares(spec, setup, est, threshold)
    if facts.engine == "torch-ddp":
        plan = _ddp(setup, est, sh)
    elif facts.engine == "deepspeed":
        plan = _zero(setup, est, sh, n, int(s[-1]), z)
    else:
        plan = _fsdp(setup, est, sh, n, facts)
    phases = _phases(est, plan, [_nccl(setup, facts)])
    persistent = sum(c.bytes for c in [*plan.always, *plan.grads, *(plan.trained or [])])
    if plan.load is not None and max(phases, key=lambda p: p.total_bytes).name == "load":
        # a loading peak is weights placed once: nothing there fragments the cache (engine/overhead.py)
        persistent = sum(c.bytes for c in plan.load)
    load_c = tuple(_loading(spec, setup, sh))
    load = HostPhase(name="loading", components=load_c, total_bytes=sum(c.bytes for c in load_c))
    host_train = tuple(
        _c(c.name, c.bytes * setup.gpus, f"{c.rule}; x {setup.gpus} ranks", c.source.split("#")[-1])
        for c in plan.host
        if c.bytes > 0
    )
    train = HostPhase(name="training", components=host_train, total_bytes=sum(c.bytes for c in host_train))
    dist = Distributed(
        strategy=s,
        engine=facts.engine,
        offload=setup.offload,
        nodes=setup.nodes,
        gpus_per_node=setup.gpus,
        world_size=setup.world_size,
        shard_group=n,
        fsdp_version=setup.fsdp_version if facts.engine == "fsdp" else None,
        quant_storage=_storage(setup) if setup.method == "qlora" else None,  # type: ignore[arg-type]
        zero_config=z if facts.engine == "deepspeed" else {},
    )
    return _reassemble(
        est,
        phases,
        persistent,
        tensors,
        stranded,
        world_size=setup.world_size,
        distributed=dist,
        host_phases=(load, train),
        host_bytes=max(load.total_bytes, train.total_bytes),
        warnings=(*est.warnings, *_notes(setup, sh)),
    )


def _notes(setup: LlmSetup, sh: Shares) -> list[str]:
    out: list[str] = []
    s = setup.effective_strategy
    if setup.method == "qlora" and STRATEGY_FACTS[s].shards_params:
        st = _storage(setup)
        if st == setup.precision:
            out.append(
                f"QLoRA with {s}: 4-bit weights are sharded because bnb_4bit_quant_storage={st} matches the "
                "compute dtype (PEFT's requirement); the emitted configs set it"
            )
        else:
            out.append(
                f"QLoRA with {s}: bnb_4bit_quant_storage={st} differs from the compute dtype "
                f"{setup.precision}, so the 4-bit weights are not sharded (every GPU holds them); "
                f"--quant-storage {setup.precision} shards them"
            )
    if s == "fsdp-hybrid" and setup.nodes == 1:
        out.append("fsdp-hybrid on one node shards over its GPUs and replicates nothing: the same as fsdp")
    return out


def data_parallel_only(est: Estimate, setup: SetupBase, tensors: int, what: str) -> Estimate:
    """Per GPU of a plain data-parallel run of an estimate this module cannot re-deal (diffusion).

    kohya sd-scripts runs several GPUs through ``accelerate launch`` with DDP: every rank keeps the
    whole single-GPU step, plus DDP's gradient buckets (one copy of the gradients) and the NCCL
    communicator; every rank loads the model on the CPU first (docs/distributed.md#ddp).
    """
    s = setup.effective_strategy
    if s != "ddp" or setup.offload != "none":
        raise OptionError(
            f"{what} runs several GPUs data-parallel (accelerate DDP); --strategy {s}"
            f"{'' if setup.offload == 'none' else ' --offload ' + setup.offload} is not modelled for it"
        )
    grads = _comp(est, "gradients")
    rule = "allreduce buckets, one copy of the gradients (gradient_as_bucket_view=False)"
    extra = [_c("ddp_grad_buckets", grads, rule, "ddp"), _nccl(setup, STRATEGY_FACTS["ddp"])]
    phases = tuple(phase(p.name, [*p.components, *extra]) for p in est.phases)
    persistent = min(p.total_bytes for p in phases)
    weights = sum(
        c.bytes for c in est.phases[-1].components if c.name.endswith("weights") or c.name == "adapters"
    )
    load = (_c("model_load", setup.gpus * weights, f"each of {setup.gpus} ranks loads the model", "loading"),)
    host = (
        HostPhase(name="loading", components=load, total_bytes=load[0].bytes),
        HostPhase(name="training", components=(), total_bytes=0),
    )
    dist = Distributed(
        strategy="ddp",
        engine="torch-ddp",
        offload="none",
        nodes=setup.nodes,
        gpus_per_node=setup.gpus,
        world_size=setup.world_size,
        shard_group=1,
    )
    return _reassemble(
        est,
        phases,
        persistent,
        tensors,
        world_size=setup.world_size,
        distributed=dist,
        host_phases=host,
        host_bytes=load[0].bytes,
    )
