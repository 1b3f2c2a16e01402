"""The transformers ``TrainingArguments`` keys that TRL and LLaMA-Factory files share.

Both parse one flat mapping with ``HfArgumentParser`` (trainer_formats.md 2, 4), so the memory keys
of ``TrainingArguments`` mean the same in both: micro-batch, accumulation, checkpointing, mixed
precision, optimizer, liger kernels, and the distributed hooks (``deepspeed``, ``fsdp``).
Source: transformers src/transformers/training_args.py (5.x fields in trainer_keys).
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.errors import FitcheckError, InputError
from fitcheck.readers import names
from fitcheck.readers.base import Keys, Reading, _short, as_bool, as_int, as_word

#: transformers ``fsdp`` option words -> fitcheck strategy (FSDP's ShardingStrategy names).
FSDP_WORDS = {"full_shard": "fsdp", "shard_grad_op": "fsdp-grad-op", "hybrid_shard": "fsdp-hybrid"}
#: ``fsdp`` words read without a setting of their own: ``offload`` (``--offload all``) and ``auto_wrap``
#: (the wrap policy; fitcheck's FSDP units are the decoder layers either way). transformers' other
#: FSDPOption words (``no_shard``, ``hybrid_shard_zero2``; trainer_utils.py) are noted as not read.
FSDP_OTHER = frozenset({"offload", "auto_wrap"})


def training_args(r: Reading, k: Keys) -> None:
    """Read the TrainingArguments memory keys into ``r``."""
    p = r.path
    r.set(
        "batch_size",
        as_int(k.get("per_device_train_batch_size"), "per_device_train_batch_size", p),
        "per_device_train_batch_size",
    )
    r.set(
        "grad_accum",
        as_int(k.get("gradient_accumulation_steps"), "gradient_accumulation_steps", p),
        "gradient_accumulation_steps",
    )
    # 5.23 renamed both; the new name wins when both are set (TrainingArguments.__post_init__)
    for key in ("gradient_checkpointing", "activation_checkpointing"):
        if k.has(key):
            r.set("grad_ckpt", as_bool(k.get(key), key, p), key)
    kwargs = "activation_checkpointing_kwargs"
    if not k.has(kwargs):
        kwargs = "gradient_checkpointing_kwargs"
    else:
        k.touch("gradient_checkpointing_kwargs")  # ignored by transformers when the new name is set
    use_reentrant(r, k, kwargs)
    bf16, fp16 = as_bool(k.get("bf16"), "bf16", p), as_bool(k.get("fp16"), "fp16", p)
    if bf16:
        r.set("precision", "bf16", "bf16")
    elif fp16:
        r.set("precision", "fp16", "fp16")
    optim = as_word(k.get("optim"), "optim", p)
    if optim is not None:
        r.set("optimizer", names.optimizer(names.HF_OPTIM, optim, "optim", r.notes), "optim")
        r.set("optimizer_impl", names.HF_OPTIM_IMPL.get(optim), "optim")
    # torch_compile: Trainer hands accelerate a TorchDynamoPlugin, which compiles the whole prepared model
    # (transformers 5.24 trainer.py ``_build_accelerator_args``)
    r.set("compile", as_bool(k.get("torch_compile"), "torch_compile", p), "torch_compile")
    k.touch("torch_compile_backend", "torch_compile_mode")
    names.read_loss(r, k, "hf")
    distributed(r, k)


def use_reentrant(r: Reading, k: Keys, key: str) -> None:
    """``use_reentrant`` of a checkpointing kwargs mapping (``gradient_checkpointing_kwargs``: a mapping, or
    the JSON text TrainingArguments loads when it starts with ``{``) -> ``ckpt_reentrant``; its other keys
    stay listed as unread. The merge keeps it only for QLoRA with checkpointing (`fitcheck.readers.merge`),
    the one run whose estimate it can change (docs/methodology.md, "bitsandbytes kept inputs")."""
    sub = k.sub(key)
    raw = k.data.get(key)
    if sub is None and isinstance(raw, str) and raw.strip().startswith("{"):
        from fitcheck.fileio import loads

        k.touch(key)
        try:
            parsed = loads(raw, f"{r.path}: {key}")
        except FitcheckError as exc:
            raise InputError(str(exc)) from None
        if not isinstance(parsed, Mapping):
            raise InputError(f"{r.path}: {key} must be a mapping (got {_short(raw)})")
        sub = Keys(parsed, f"{key}.")
        k.children.append(sub)
    if sub is None:
        return
    name = f"{key}.use_reentrant"
    r.set("ckpt_reentrant", as_bool(sub.get("use_reentrant"), name, r.path), name)


def distributed(r: Reading, k: Keys, fsdp_config: bool = True) -> None:
    """``fsdp`` words and ``deepspeed`` (a path: read it with its own ``--from``); ``fsdp_config`` too unless
    the reader reads it its own way (axolotl)."""
    fsdp = k.get("fsdp")
    if isinstance(fsdp, str) and fsdp.strip().lower() in ("true", "false"):
        fsdp = fsdp.strip().lower() == "true"  # HfArgumentParser reads a bool-looking string as the bool
    if fsdp is True:
        # transformers 5.x: ``fsdp=True`` with everything in ``fsdp_config`` (the string and list forms are
        # deprecated, "removed in v5.20"; TrainingArguments._apply_legacy_fsdp_to_config): full sharding,
        # reshard_after_forward True, unless fsdp_config says otherwise
        r.set("strategy", "fsdp", "fsdp")
    words = [] if fsdp is None or isinstance(fsdp, bool) else names.modules(fsdp, "fsdp", r.path)
    words = [w for part in words for w in part.split()]  # "full_shard auto_wrap", as transformers splits it
    for word in words:
        if word in FSDP_WORDS:
            r.set("strategy", FSDP_WORDS[word], "fsdp")
        elif word not in FSDP_OTHER:
            r.note(
                f"fsdp: {_short(word)} is not read (fitcheck reads full_shard, shard_grad_op, hybrid_shard)"
            )
        if word == "offload":
            r.set("offload", "all", "fsdp")
    if fsdp_config and (fsdp is True or words):
        _fsdp_config(r, k)
    ds = k.get("deepspeed")
    if isinstance(ds, str) and ds:
        r.note(f"deepspeed: {ds} is a separate file; its ZeRO stage and offload are read with --from {ds}")
    elif isinstance(ds, dict):
        r.note("deepspeed: an inline DeepSpeed config; write it to a .json file to read it with --from")
    elif ds not in (None, "", False):
        raise InputError(f"{r.path}: deepspeed must be the path of a DeepSpeed JSON file (got {_short(ds)})")


def fsdp_get(cfg: Keys, name: str) -> object:
    """An ``fsdp_config`` entry with or without the ``fsdp_`` prefix: transformers strips it
    (``TrainingArguments``: ``self.fsdp_config[k[5:]] = self.fsdp_config.pop(k)``)."""
    value = cfg.get(name)
    prefixed = cfg.get(f"fsdp_{name}")
    return value if value is not None else prefixed


def _fsdp_config(r: Reading, k: Keys) -> None:
    """``fsdp_config`` under ``fsdp`` (TrainingArguments ``_process_fsdp_args``, transformers 5.x):
    ``version`` (FSDP1 / FSDP2), ``activation_checkpointing`` (the FSDP plugin checkpoints every wrapped
    layer), ``cpu_offload`` (what the ``offload`` word sets) and ``reshard_after_forward`` (false: parameters
    stay gathered between forward and backward, ``shard_grad_op``). A JSON file path is noted, not opened."""
    p = r.path
    raw = k.data.get("fsdp_config")
    if isinstance(raw, str) and raw:
        k.touch("fsdp_config")
        r.note(f"fsdp_config: {_short(raw)} is a separate JSON file; its settings are not read")
        return
    cfg = k.sub("fsdp_config")
    if cfg is None:
        return
    version = as_int(fsdp_get(cfg, "version"), "fsdp_config.version", p)
    if version is not None:
        r.set("fsdp_version", version, "fsdp_config.version")
    if as_bool(fsdp_get(cfg, "activation_checkpointing"), "fsdp_config.activation_checkpointing", p):
        r.set("grad_ckpt", True, "fsdp_config.activation_checkpointing")
    if as_bool(fsdp_get(cfg, "cpu_offload"), "fsdp_config.cpu_offload", p):
        r.set("offload", "all", "fsdp_config.cpu_offload")
    reshard = fsdp_get(cfg, "reshard_after_forward")
    if reshard is False or (isinstance(reshard, str) and reshard.lower() in ("false", "shard_grad_op")):
        r.set("strategy", "fsdp-grad-op", "fsdp_config.reshard_after_forward")
