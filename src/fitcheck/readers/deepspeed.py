"""DeepSpeed config JSON (``deepspeed --deepspeed_config ds.json``, or ``deepspeed: ds.json`` in a trainer).

Mapping, after DeepSpeed's config models (deepspeedai/DeepSpeed deepspeed/runtime/config.py,
runtime/zero/config.py, runtime/zero/offload_config.py, runtime/precision_config.py; 0.19.8;
trainer_keys/deepspeed_keys.txt): ``zero_optimization.stage`` 0-3 (0: plain data parallel),
``offload_optimizer.device`` cpu|nvme moves optimizer states (and the fp32 master copy) off the GPU,
``offload_param.device`` moves parameters too (stage 3 only); ``bf16.enabled`` / ``fp16.enabled``;
``train_micro_batch_size_per_gpu`` and ``gradient_accumulation_steps``. The HF Trainer fills
``"auto"`` values from its own arguments (trainer_formats.md section 6), so they read as unset.
A number in ``reduce_bucket_size`` at stages 1-3 is ``--zero-bucket-size`` and ``overlap_comm`` is
``--zero-overlap-comm`` (the IPG gradient buffers, docs/distributed.md#buckets); "auto" stays unset, filled
as the trainer fills it. ``allgather_bucket_size``
and ``stage3_prefetch_bucket_size`` are reported in a note (stage 1/2 gather into views of the flat
parameters, no bucket buffer; stage 3's prefetch bucket is HF's "auto" value or DeepSpeed's default).

Refused with one line naming the key (deepspeed/runtime/config.py, runtime/sequence_parallel,
runtime/tensor_parallel, runtime/precision_config.py; DeepSpeedExamples @45b4b715 uses each):
``sequence_parallel_size`` over 1 (Ulysses), ``tensor_parallel.autotp_size`` over 1 (AutoTP), and
``bf16.bf16_master_weights_and_grads`` / ``bf16_optimizer_states`` (no fp32 master or states under ZeRO,
a regime fitcheck does not model). Features
that change memory in ways not modelled (``zero_optimization.zenflow``, ``compile``, ``torch_autocast``,
``sparse_attention``, ``progressive_layer_drop``, ``data_efficiency``, ``compression_training``,
``quantize_training``) are noted, never listed as having no effect.
"""

from __future__ import annotations

from fitcheck.errors import InputError
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, as_bool, as_float, as_int
from fitcheck.terminal import clipped

FORMAT = "deepspeed"
TRAINER = "hf"
STAGES = {0: "ddp", 1: "zero1", 2: "zero2", 3: "zero3"}
BUCKETS = ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size")
#: DeepSpeed ``optimizer.type`` -> fitcheck optimizer (runtime/config.py optimizer names).
OPTIM = {"adam": "adamw", "adamw": "adamw", "cpuadam": "adamw", "fusedadam": "adamw", "lion": "lion"}


#: Top-level blocks whose memory effect fitcheck does not model: noted when present and enabled.
NOT_MODELLED = (
    "compile",
    "torch_autocast",
    "sparse_attention",
    "progressive_layer_drop",
    "data_efficiency",
    "compression_training",
    "quantize_training",
)


def refusal(data: Doc, path: str) -> str | None:
    """Why fitcheck cannot pose this DeepSpeed run, or None (the line names the key)."""
    sp = data.get("sequence_parallel_size")
    if isinstance(sp, int) and not isinstance(sp, bool) and sp > 1:
        return f"--from {path}: sequence_parallel_size {sp}: Ulysses sequence parallelism is not modelled"
    tp = data.get("tensor_parallel")
    size = tp.get("autotp_size") if isinstance(tp, dict) else None
    if isinstance(size, int) and not isinstance(size, bool) and size > 1:
        return f"--from {path}: tensor_parallel.autotp_size {size}: tensor parallelism is not modelled"
    bf16 = data.get("bf16")
    for key in ("bf16_master_weights_and_grads", "bf16_optimizer_states"):
        if isinstance(bf16, dict) and bf16.get(key) is True:
            return (
                f"--from {path}: bf16.{key}: DeepSpeed without fp32 master weights or states is not a "
                "regime fitcheck models"
            )
    return None


def _not_modelled(r: Reading, k: Keys) -> None:
    for key in NOT_MODELLED:
        block = k.data.get(key)
        if block is None or block is False or (isinstance(block, dict) and block.get("enabled") is False):
            continue
        k.touch(key)
        r.note(f"{key}: its memory effect is not modelled (sized without it)")


def read(data: Doc, path: str) -> ReadResult:
    """Read a DeepSpeed JSON."""
    from fitcheck.errors import InputError

    why = refusal(data, path)
    if why is not None:
        raise InputError(why)
    k = Keys(data)
    r = Reading(FORMAT, TRAINER, k, path)
    p = path
    r.set(
        "batch_size",
        as_int(k.get("train_micro_batch_size_per_gpu"), "train_micro_batch_size_per_gpu", p),
        "train_micro_batch_size_per_gpu",
    )
    r.set(
        "grad_accum",
        as_int(k.get("gradient_accumulation_steps"), "gradient_accumulation_steps", p),
        "gradient_accumulation_steps",
    )
    k.touch("train_batch_size", "gradient_clipping")
    total = as_int(k.data.get("train_batch_size"), "train_batch_size", p)
    if total is not None and "batch_size" not in r.values:
        # runtime/config.py _set_batch_related_parameters: micro = train_batch // (accumulation x world size)
        r.note(
            f"train_batch_size {total} without train_micro_batch_size_per_gpu: DeepSpeed divides it by "
            "gradient_accumulation_steps x GPUs; give --batch-size (the per-GPU micro-batch)"
        )
    on = []
    for key, prec in (("bf16", "bf16"), ("fp16", "fp16")):
        block = k.sub(key)
        if block is not None and as_bool(block.get("enabled"), f"{key}.enabled", p):
            r.set("precision", prec, f"{key}.enabled")
            on.append(key)
    if len(on) == 2:  # runtime/config.py: assert not (fp16_enabled and bf16_enabled)
        raise InputError(f"--from {p}: bf16.enabled and fp16.enabled are both true, which DeepSpeed refuses")
    zero = k.sub("zero_optimization")
    if zero is not None:
        _zero(r, zero)
    elif isinstance(k.data.get("zero_optimization"), bool):
        _zero_bool(r, k)
    opt = k.sub("optimizer")
    if opt is not None:
        kind = str(opt.get("type", "")).lower()
        r.set("optimizer", OPTIM.get(kind), "optimizer.type")
        if kind and kind not in OPTIM:
            r.note(f"optimizer.type {kind!r} has no fitcheck memory model")
        opt.touch("params")
    act = k.sub("activation_checkpointing")
    if act is not None:
        act.touch(*act.data.keys())
        r.note(
            "activation_checkpointing: applies only to models using deepspeed.checkpointing; "
            "the trainer's own flag decides"
        )
    _not_modelled(r, k)
    k.touch("sequence_parallel_size", "tensor_parallel")
    return r.result()


def _zero_bool(r: Reading, k: Keys) -> None:
    """The deprecated bool form ``"zero_optimization": true``: DeepSpeed reads true as stage 1, false as
    stage 0 (deepspeed/runtime/zero/config.py ``get_zero_config`` / ``read_zero_config_deprecated``,
    deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641)."""
    stage = 1 if k.data["zero_optimization"] else 0
    k.touch("zero_optimization", "allgather_size")
    r.set("strategy", STAGES[stage], "zero_optimization")
    given = "true" if stage else "false"
    r.note(f"zero_optimization {given}: DeepSpeed's deprecated form, read as stage {stage}")


def _zero(r: Reading, z: Keys) -> None:
    p = r.path
    stage = as_int(z.get("stage"), "zero_optimization.stage", p)
    if stage is not None:
        if stage not in STAGES:
            from fitcheck.errors import InputError

            raise InputError(f"--from {p}: zero_optimization.stage must be 0, 1, 2 or 3 (got {stage})")
        r.set("strategy", STAGES[stage], "zero_optimization.stage")
    off_opt = _device(z.sub("offload_optimizer"), p)
    off_par = _device(z.sub("offload_param"), p)
    if off_par and stage == 3:
        r.set("offload", "all", "zero_optimization.offload_param")
    elif off_opt:
        r.set("offload", "optimizer", "zero_optimization.offload_optimizer")
    elif off_opt is False or off_par is False:
        r.set("offload", "none", "zero_optimization.offload_optimizer")
    if off_par and stage != 3:
        r.note("offload_param takes effect at stage 3 only (DeepSpeed ignores it here)")
    if z.has("zenflow"):
        z.touch("zenflow")
        r.note(
            "zero_optimization.zenflow: sized as plain optimizer offload "
            "(ZenFlow's on-GPU top-k is not modelled)"
        )
    if "nvme" in (off_opt, off_par):
        r.note("nvme offload: sized as CPU offload for the GPU; the NVMe space is not modelled")
    sizes = {key: as_float(z.get(key), f"zero_optimization.{key}", p) for key in BUCKETS}
    reduce = sizes.pop("reduce_bucket_size")
    if stage in (1, 2, 3):
        if reduce is not None:
            r.set("zero_bucket_size", int(reduce), "zero_optimization.reduce_bucket_size")
        overlap = as_bool(z.get("overlap_comm"), "zero_optimization.overlap_comm", p)
        r.set("zero_overlap_comm", overlap, "zero_optimization.overlap_comm")
    given = {key: v for key, v in sizes.items() if v is not None}
    if given:
        what = "noted (allgather: no buffer; stage-3 prefetch: sized as the trainer fills it)"
        r.note(f"buckets {what}: " + ", ".join(f"{key}={int(v):d}" for key, v in given.items()))
    z.touch(
        "overlap_comm",  # read above at stages 1-3
        "contiguous_gradients",
        "sub_group_size",
        "stage3_param_persistence_threshold",
        "stage3_max_live_parameters",
        "stage3_max_reuse_distance",
        "max_live_parameters",
        "max_reuse_distance",
        "stage3_gather_16bit_weights_on_model_save",
        "gather_16bit_weights_on_model_save",
        "round_robin_gradients",
    )


#: DeepSpeed's offload devices (runtime/zero/offload_config.py OffloadDeviceEnum: none, cpu, nvme).
OFFLOAD_DEVICES = ("none", "cpu", "nvme")


def offload_device(raw: object, key: str, path: str) -> str:
    """An offload device as DeepSpeed takes it (`OFFLOAD_DEVICES`, any case), lower-cased; anything else
    (a number, an unknown word) is refused, naming ``key``. accelerate's DeepSpeedPlugin passes its
    ``offload_*_device`` to the same enum."""
    device = str(raw).lower()
    if not isinstance(raw, str) or device not in OFFLOAD_DEVICES:
        raise InputError(
            f"--from {path}: {key} is one of {', '.join(OFFLOAD_DEVICES)} (got {clipped(repr(raw))})"
        )
    return device


def _device(block: Keys | None, path: str) -> str | bool | None:
    """``cpu``/``nvme`` when offloading, False for ``none``, None when absent."""
    if block is None:
        return None
    device = offload_device(block.get("device", "none"), "an offload device", path)
    block.touch("pin_memory", "nvme_path", "buffer_count", "ratio", "fast_init")
    return device if device in ("cpu", "nvme") else False
