"""accelerate config YAML (``accelerate launch --config_file cfg.yaml``).

Mapping, after accelerate's launcher (huggingface/accelerate src/accelerate/commands/config/
config_args.py ClusterConfig, commands/launch.py; 1.15.0; trainer_keys/accelerate_config_keys.txt):
``distributed_type`` (MULTI_GPU: DDP, DEEPSPEED, FSDP), ``num_processes`` (GPUs in all, over
``num_machines`` nodes), ``mixed_precision``; ``deepspeed_config`` (``zero_stage``,
``offload_optimizer_device``, ``offload_param_device``, ``gradient_accumulation_steps``, or
``deepspeed_config_file``: a DeepSpeed JSON read with its own ``--from``); ``fsdp_config``
(``fsdp_version``, ``fsdp_sharding_strategy`` or, for FSDP2, ``fsdp_reshard_after_forward``,
``fsdp_offload_params``, ``fsdp_activation_checkpointing``); ``parallelism_config`` (parallelism_config.py
@16cb6eb8: ``dp_replicate_size > 1`` with ``dp_shard_size > 1`` is HSDP, read as ``fsdp-hybrid``; a
``tp_size``, ``cp_size`` or ``sp_size`` over 1 shards the model or the sequence in ways fitcheck does not
model, refused naming the key). A ``deepspeed_config_file`` found beside the YAML (or in the working
folder, where the launcher opens it) is read with the DeepSpeed reader and its values fill what the YAML
leaves unset. Without a file, accelerate's ``DeepSpeedPlugin`` builds ``zero_optimization`` from the stage
and offload devices only (src/accelerate/utils/dataclasses.py @v0.28.0 lines 785-803, unchanged in 1.x),
so DeepSpeed's own defaults apply (runtime/zero/config.py): ``reduce_bucket_size`` 5e8, read as
``--zero-bucket-size 500000000``, and at stages 1/2 ``overlap_comm`` off (``overlap_comm_valid``: on at
stage 3 only), read as ``--no-zero-overlap-comm``.
"""

from __future__ import annotations

from fitcheck.errors import InputError
from fitcheck.facts.deepspeed import ZERO_DEFAULTS
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, as_bool, as_int, as_word
from fitcheck.readers.deepspeed import STAGES, offload_device
from fitcheck.terminal import clipped

FORMAT = "accelerate"
TRAINER = "hf"
SHARDING = {
    "FULL_SHARD": "fsdp",
    "SHARD_GRAD_OP": "fsdp-grad-op",
    "HYBRID_SHARD": "fsdp-hybrid",
    "NO_SHARD": "ddp",
    "1": "fsdp",
    "2": "fsdp-grad-op",
    "3": "ddp",
    "4": "fsdp-hybrid",
}
PRECISION = {"fp16": "fp16", "bf16": "bf16"}
#: accelerate's ``DistributedType`` values that launch data-parallel processes on another device than an
#: NVIDIA/AMD GPU (utils/dataclasses.py, 1.16.0): read as DDP, with a note.
OTHER_DEVICE_DP = frozenset(
    {
        "MULTI_CPU",
        "MULTI_NPU",
        "MULTI_MLU",
        "MULTI_SDAA",
        "MULTI_MUSA",
        "MULTI_XPU",
        "MULTI_HPU",
        "MULTI_NEURON",
    }
)
#: ``DistributedType`` values whose runs fitcheck cannot pose, and why.
UNPOSED_TYPES = {
    "MEGATRON_LM": "Megatron-LM tensor / pipeline parallelism",
    "XLA": "TPU training through XLA",
    "MODEL_PARALLEL": "SageMaker model parallelism",
}
#: SageMaker's ``DATA_PARALLEL`` (compute_environment AMAZON_SAGEMAKER; SageMakerDistributedType) is DDP.
KNOWN_TYPES = (
    "NO",
    "MULTI_GPU",
    "DATA_PARALLEL",
    "DEEPSPEED",
    "FSDP",
    *sorted(OTHER_DEVICE_DP),
    *UNPOSED_TYPES,
)


def read(data: Doc, path: str, ds: ReadResult | None = None) -> ReadResult:
    """Read an accelerate config; ``ds`` is its ``deepspeed_config_file`` read, when found."""
    k = Keys(data)
    r = Reading(FORMAT, TRAINER, k, path)
    p = path
    kind = _distributed_type(k, p)
    procs = as_int(k.get("num_processes"), "num_processes", p)
    nodes = as_int(k.get("num_machines"), "num_machines", p)
    if nodes is not None and nodes < 1:
        raise InputError(f"--from {p}: num_machines must be 1 or more (got {nodes})")
    procs = _process_count(r, procs)
    if kind == "NO" and k.has("distributed_type") and procs is not None and procs > 1:
        r.set("gpus", _one_process(r, procs), "distributed_type")
    elif procs:
        per_node = max(1, procs // (nodes or 1))  # accelerate counts processes over all machines
        r.set("gpus", per_node, "num_processes")
    if nodes and nodes > 1:
        r.set("nodes", nodes, "num_machines")
    _precision(r, k)
    if kind in ("MULTI_GPU", "DATA_PARALLEL"):
        r.set("strategy", "ddp", "distributed_type")
    elif kind in OTHER_DEVICE_DP:
        r.set("strategy", "ddp", "distributed_type")
        r.note(
            f"distributed_type {kind}: data parallel on {kind.removeprefix('MULTI_').lower()} devices, read "
            "as DDP; judge it against that device's memory with --on (a size, e.g. 64GB)"
        )
    elif kind == "DEEPSPEED":
        _deepspeed(r, k, ds is not None)
    elif kind == "FSDP":
        _fsdp(r, k)
    _parallelism(r, k)
    if ds is not None:
        _from_deepspeed(r, ds)
    k.touch(
        "compute_environment",
        "machine_rank",
        "main_training_function",
        "rdzv_backend",
        "same_network",
        "use_cpu",
        "debug",
        "downcast_bf16",
        "enable_cpu_affinity",
        "tpu_env",
        "tpu_use_cluster",
        "tpu_use_sudo",
        "gpu_ids",
        "main_process_ip",
        "main_process_port",
    )
    return r.result()


def _distributed_type(k: Keys, p: str) -> str:
    """``distributed_type`` as accelerate reads it, upper case; the types fitcheck cannot pose refused."""
    raw = k.get("distributed_type")
    # an unquoted NO is YAML's false, which the launcher matches to no distributed type: one process
    kind = "NO" if raw is False else (as_word(raw, "distributed_type", p) or "NO").upper()
    if kind in UNPOSED_TYPES:
        raise InputError(
            f"--from {p}: distributed_type {kind}: {UNPOSED_TYPES[kind]} is not modelled by fitcheck"
        )
    if kind not in KNOWN_TYPES:
        raise InputError(
            f"--from {p}: distributed_type {k.get('distributed_type')!r:.60} is not one of accelerate's "
            f"({', '.join(KNOWN_TYPES)})"
        )
    return kind


def _process_count(r: Reading, procs: int | None) -> int | None:
    """``num_processes`` as accelerate takes it: -1 is its dataclass default, "not set here" (ClusterConfig
    ``num_processes: int = -1``, shared/reference/trainer_keys/accelerate_config_keys.txt), so the GPU
    count comes from elsewhere; 0 or below -1 starts no process and is refused."""
    if procs == -1:
        r.note("num_processes -1: accelerate's unset default, no GPU count read")
        return None
    if procs is not None and procs < 1:
        raise InputError(f"--from {r.path}: num_processes must be 1 or more, or -1 (got {procs})")
    return procs


def _one_process(r: Reading, procs: int) -> int:
    """``distributed_type: NO`` starts one process whatever ``num_processes`` says: ``accelerate launch``
    sets none of multi_gpu / use_deepspeed / use_fsdp from such a file and runs ``simple_launcher``,
    which passes no process count on (commands/launch.py ``_validate_launch_command`` and
    ``launch_command``, utils/launch.py ``prepare_simple_launcher_cmd_env``; accelerate 1.16.0)."""
    r.note(
        f"distributed_type NO with num_processes {procs}: accelerate launches one process (simple_launcher); "
        "read as 1 GPU. With more GPUs visible the HF Trainer wraps the model in nn.DataParallel (GPU 0 "
        "holds the optimizer and the gathered outputs), which fitcheck does not model"
    )
    return 1


#: ``parallelism_config`` sizes fitcheck cannot pose (tensor, context and sequence parallelism).
UNPOSED_SIZES = {
    "parallelism_config_tp_size": "tensor parallelism",
    "parallelism_config_cp_size": "context parallelism",
    "parallelism_config_sp_size": "sequence parallelism",
}


def _parallelism(r: Reading, k: Keys) -> None:
    """accelerate's ParallelismConfig: HSDP read, TP/CP/SP over 1 refused with the key."""
    par = k.sub("parallelism_config")
    if par is None:
        return
    p = r.path
    for key, what in UNPOSED_SIZES.items():
        size = as_int(par.get(key), f"parallelism_config.{key}", p)
        if size is not None and size > 1:
            raise InputError(
                f"--from {p}: parallelism_config.{key} {size}: {what} is not modelled by fitcheck"
            )
    rep = as_int(par.get("parallelism_config_dp_replicate_size"), "parallelism_config_dp_replicate_size", p)
    shard = as_int(par.get("parallelism_config_dp_shard_size"), "parallelism_config_dp_shard_size", p)
    if rep is not None and rep > 1 and shard is not None and shard > 1:
        r.set("strategy", "fsdp-hybrid", "parallelism_config.parallelism_config_dp_replicate_size")
    par.touch(*par.data.keys())


def _from_deepspeed(r: Reading, ds: ReadResult) -> None:
    """The DeepSpeed JSON's values where the YAML said nothing (the launcher hands DeepSpeed that file)."""
    for name, value in ds.values.items():
        if name not in r.values:
            r.set(name, value, f"deepspeed_config_file {ds.keys.get(name, name)}")
    r.notes.extend(f"{ds.path}: {n}" for n in ds.notes)


def _precision(r: Reading, k: Keys) -> None:
    """``mixed_precision``: bf16 / fp16 autocast; ``no`` turns autocast off and names no dtype (the weights
    train in what the script loads); fp8 is refused."""
    p = r.path
    mp = as_word(k.get("mixed_precision"), "mixed_precision", p)
    if mp == "no":
        r.set("autocast", False, "mixed_precision")
        r.note(
            "mixed_precision 'no': no autocast; the weights train in the dtype the script loads (sized "
            "as the trainer's default, a bf16 checkpoint kept in bf16; --precision fp32 for an fp32 load)"
        )
    elif mp is not None:
        r.set("precision", PRECISION.get(mp), "mixed_precision")
        if mp == "fp8":  # TransformerEngine / torchao / MS-AMP recipes (utils/dataclasses.py FP8RecipeKwargs)
            raise InputError(f"--from {p}: mixed_precision fp8: FP8 training is not modelled by fitcheck")
        if mp not in PRECISION:
            r.note(f"mixed_precision {mp!r} has no fitcheck model")


def _deepspeed(r: Reading, k: Keys, found: bool) -> None:
    ds = k.sub("deepspeed_config")
    if ds is None:
        return
    p = r.path
    config_file = ds.get("deepspeed_config_file")
    if config_file and not found:
        r.note(
            f"deepspeed_config_file {config_file} is not beside this file nor in this folder: "
            f"read its ZeRO stage and offload with --from {config_file}"
        )
    stage = as_int(ds.get("zero_stage"), "deepspeed_config.zero_stage", p)
    if stage is not None:
        if stage not in STAGES:
            raise InputError(f"--from {p}: deepspeed_config.zero_stage must be 0, 1, 2 or 3 (got {stage})")
        r.set("strategy", STAGES[stage], "deepspeed_config.zero_stage")
    if stage in (1, 2, 3) and not config_file:
        plugin_defaults(r, stage)
    opt, par = (
        offload_device(ds.get(key, "none"), f"deepspeed_config.{key}", p)
        for key in ("offload_optimizer_device", "offload_param_device")
    )
    if par in ("cpu", "nvme") and stage == 3:
        r.set("offload", "all", "deepspeed_config.offload_param_device")
    elif opt in ("cpu", "nvme"):
        r.set("offload", "optimizer", "deepspeed_config.offload_optimizer_device")
    elif ds.has("offload_optimizer_device") or ds.has("offload_param_device"):
        r.set("offload", "none", "deepspeed_config.offload_optimizer_device")
    r.set(
        "grad_accum",
        as_int(ds.get("gradient_accumulation_steps"), "gradient_accumulation_steps", p),
        "deepspeed_config.gradient_accumulation_steps",
    )
    ds.touch("zero3_init_flag", "zero3_save_16bit_model", "gradient_clipping", "deepspeed_multinode_launcher")


def plugin_defaults(r: Reading, stage: int) -> None:
    """What DeepSpeed gets from accelerate's inline plugin: no bucket key and no overlap_comm, so its own
    defaults (5e8 elements; overlap_comm on at stage 3 only)."""
    r.set("zero_bucket_size", ZERO_DEFAULTS["reduce_bucket_size"], "deepspeed_config (no bucket key)")
    if stage < 3:
        r.set("zero_overlap_comm", False, "deepspeed_config (no overlap_comm key)")
    r.note(
        "deepspeed_config names no reduce_bucket_size or overlap_comm: accelerate passes neither, so "
        f"DeepSpeed's defaults size the gradient bucket(s) (--zero-bucket-size 500000000"
        f"{', --no-zero-overlap-comm: one buffer' if stage < 3 else ''})"
    )


def _fsdp(r: Reading, k: Keys) -> None:
    fs = k.sub("fsdp_config")
    if fs is None:
        r.set("strategy", "fsdp", "distributed_type")
        return
    p = r.path
    given = as_int(fs.get("fsdp_version"), "fsdp_config.fsdp_version", p)
    version = given or 1
    if given is not None:
        r.set("fsdp_version", given, "fsdp_config.fsdp_version")
    if version == 2:
        reshard = as_bool(fs.get("fsdp_reshard_after_forward"), "fsdp_reshard_after_forward", p)
        strategy = "fsdp-grad-op" if reshard is False else "fsdp"
        r.set("strategy", strategy, "fsdp_config.fsdp_reshard_after_forward")
    else:
        # FSDP1 takes the ShardingStrategy from fsdp_sharding_strategy, else from fsdp_reshard_after_forward
        # (a strategy name under FSDP1; accelerate utils/dataclasses.py FullyShardedDataParallelPlugin
        # __post_init__ @16cb6eb8)
        key = "fsdp_sharding_strategy" if fs.has("fsdp_sharding_strategy") else "fsdp_reshard_after_forward"
        strategy = str(fs.get(key, "FULL_SHARD")).upper()
        if strategy not in SHARDING:
            raise InputError(
                f"--from {p}: fsdp_config.{key} {clipped(repr(fs.get(key)))} is not a sharding strategy "
                f"fitcheck sizes ({', '.join(k for k in SHARDING if not k.isdigit())} or 1-4)"
            )
        r.set("strategy", SHARDING[strategy], f"fsdp_config.{key}")
        if given is None:  # FullyShardedDataParallelPlugin: FSDP_VERSION defaults to 1 (utils/dataclasses.py)
            r.set("fsdp_version", 1, "fsdp_config (fsdp_version unset: accelerate's default)")
            r.note("fsdp_version unset: accelerate's default, 1 (the legacy FSDP wrapper)")
    if as_bool(fs.get("fsdp_offload_params"), "fsdp_offload_params", p):
        r.set("offload", "all", "fsdp_config.fsdp_offload_params")
    act = as_bool(fs.get("fsdp_activation_checkpointing"), "fsdp_activation_checkpointing", p)
    r.set("grad_ckpt", True if act else None, "fsdp_config.fsdp_activation_checkpointing")
    fs.touch(
        "fsdp_auto_wrap_policy",
        "fsdp_backward_prefetch",
        "fsdp_cpu_ram_efficient_loading",
        "fsdp_forward_prefetch",
        "fsdp_state_dict_type",
        "fsdp_sync_module_states",
        "fsdp_use_orig_params",
        "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_min_num_params",
    )
