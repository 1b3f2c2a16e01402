"""litgpt fine-tuning config YAML (``litgpt finetune_lora --config FILE``; ``finetune``, ``finetune_full``).

Mapping, after litgpt's own code at Lightning-AI/litgpt @26857050 (v0.5.13; the config hub files at @00af8b0d
read the same): ``litgpt/finetune/lora.py`` and ``full.py`` ``setup(...)`` arguments, ``litgpt/args.py``
``TrainArgs``, ``litgpt/utils.py`` (``instantiate_bnb_optimizer``, ``get_default_supported_precision``,
``parse_devices``, ``auto_download_checkpoint``). ``litgpt finetune`` is ``finetune_lora``
(``litgpt/__main__.py`` PARSER_DATA).

- ``checkpoint_dir``: ``checkpoints/<org>/<name>`` is litgpt's download folder of the Hub model
  ``<org>/<name>`` (``auto_download_checkpoint``: a relative path outside ``checkpoints/`` is downloaded from
  the Hub into ``checkpoints/<path>``), handed on as that Hub id; another path is handed on as given.
- method: ``lora_*`` keys -> LoRA (``finetune_lora``); ``quantize: bnb.nf4`` / ``bnb.nf4-dq`` with LoRA ->
  QLoRA (``-dq``: double quantization); no ``lora_*`` key and no ``quantize`` -> full (``finetune_full`` has
  neither). ``bnb.fp4`` / ``bnb.fp4-dq`` store 4 bits a weight like NF4 (sized as QLoRA, noted);
  ``bnb.int8-training`` is refused, as are LLaMA-Adapter (``finetune_adapter``) files and LongLoRA keys.
- ``lora_r``, ``lora_alpha``, ``lora_dropout``; ``lora_query`` / ``lora_key`` / ``lora_value`` /
  ``lora_projection`` / ``lora_mlp`` / ``lora_head`` -> ``--lora-targets`` (`targets`).
- ``train.micro_batch_size``; ``train.global_batch_size`` -> accumulation ``global // (devices x num_nodes)
  // micro`` (``TrainArgs.gradient_accumulation_iters``); ``train.max_seq_length``.
- ``precision``: ``bf16-true`` / ``16-true`` / ``32-true``; ``bf16-mixed`` / ``16-mixed`` (and unset) are
  ``--master-weights`` (fp32 weights under autocast).
- ``optimizer`` (a name or ``class_path``); with ``quantize: bnb.*`` litgpt builds bitsandbytes' PagedAdamW.
- ``devices`` x ``num_nodes`` > 1: FSDP with every Block checkpointed (`_devices`).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from fitcheck.errors import InputError
from fitcheck.readers import names
from fitcheck.readers.base import (
    Doc,
    Keys,
    Reading,
    ReadResult,
    _short,
    as_bool,
    as_float,
    as_int,
    unpacked_note,
)

FORMAT = "litgpt"
TRAINER = "litgpt"
_LG = "Lightning-AI/litgpt @26857050"

#: ``setup`` defaults of litgpt/finetune/lora.py @26857050 (also @00af8b0d): lora_r 8, lora_alpha 16,
#: lora_dropout 0.05, lora_query True, lora_key False, lora_value True, lora_projection / lora_mlp /
#: lora_head False.
LORA_FLAGS: dict[str, bool] = {
    "lora_query": True,
    "lora_key": False,
    "lora_value": True,
    "lora_projection": False,
    "lora_mlp": False,
    "lora_head": False,
}
LORA_KEYS = ("lora_r", "lora_alpha", "lora_dropout", *LORA_FLAGS)
#: ``setup(train=TrainArgs(global_batch_size=16, micro_batch_size=1, ...))`` in finetune/lora.py, full.py
#: and adapter.py @26857050 (and @00af8b0d): a ``train`` block leaves the rest at these.
GLOBAL_BATCH, MICRO_BATCH = 16, 1
#: ``quantize`` -> double quantization, for the 4-bit modes (lightning ``BitsandbytesPrecision``
#: modes nf4, nf4-dq, fp4, fp4-dq: ``quantize[4:]`` in finetune/lora.py).
QUANT_4BIT: dict[str, bool] = {"bnb.nf4": False, "bnb.nf4-dq": True, "bnb.fp4": False, "bnb.fp4-dq": True}
#: Lightning precision names -> fitcheck precision for the ``-true`` ones (no autocast: the regime litgpt
#: runs, engine/regimes.py ``_litgpt``).
TRUE_PRECISION = {"bf16-true": "bf16", "16-true": "fp16", "32-true": "fp32", "32": "fp32"}
#: Lightning's mixed precisions: fp32 weights under autocast. The legacy ``16`` / ``bf16`` (and ``32``) are
#: Lightning Fabric's aliases of ``16-mixed`` / ``bf16-mixed`` (``32-true``), as Fabric converts them; litgpt
#: hands ``precision`` to ``L.Fabric`` unchanged (finetune/lora.py, full.py).
MIXED_PRECISION = ("bf16-mixed", "16-mixed", "bf16", "16")
#: Keys only litgpt's LongLoRA branch read (finetune/lora.py ``setup(longlora_n_groups=...,
#: longlora_context_length=..., longlora_trainable_params=...)`` @3c15ed14, 2024-04, not on main).
LONGLORA = ("longlora_n_groups", "longlora_context_length", "longlora_trainable_params")
#: ``TrainArgs`` fields finetune/lora.py and full.py ``validate_args`` refuse ("doesn't support the ...
#: argument") @26857050 and @00af8b0d: such a run does not start.
UNSUPPORTED_TRAIN = ("max_tokens", "max_norm", "tie_embeddings", "lr_warmup_fraction")


def read(data: Doc, path: str) -> ReadResult:
    """Read a litgpt ``finetune_lora`` / ``finetune_full`` config."""
    _refuse(data, path)
    k = Keys(data)
    r = Reading(FORMAT, TRAINER, k, path)
    r.model = _model(r, k)
    method = _method(r, k)
    train = k.sub("train")
    world = _devices(r, k, method)
    _train(r, train, world)
    _precision(r, k, method)
    _optimizer(r, k, method)
    k.touch("resume")  # finetune_full's resume point: no memory effect
    for table in ("data", "eval", "log"):  # listed entry by entry (readers/neutral.py NEUTRAL_TABLES)
        k.sub(table)
    unpacked_note(
        r, "sequence packing (litgpt pads each micro-batch: litgpt/data/base.py get_sft_collate_fn)", False
    )
    return r.result()


def _refuse(data: Doc, path: str) -> None:
    """What litgpt would not run, or fitcheck cannot pose: one line naming the key."""
    if "checkpoint_dir" not in data and ("model_name" in data or "initial_checkpoint_dir" in data):
        key = "model_name" if "model_name" in data else "initial_checkpoint_dir"
        raise InputError(
            f"{path}: {key} and no checkpoint_dir: a litgpt pretrain config (litgpt/pretrain.py setup: "
            "its own strategy, optimizer and data pipeline); the litgpt reader reads finetune_lora / "
            "finetune_full configs: give MODEL and the setup as flags"
        )
    out_dir = str(data.get("out_dir") or "")
    lora = any(key in data for key in LORA_KEYS)
    if not lora and "adapter" in out_dir.lower():
        raise InputError(
            f"{path}: out_dir {_short(out_dir)}: a finetune_adapter run (LLaMA-Adapter: adaption prompts "
            "and gates in the top layers, litgpt/adapter.py) has no fitcheck memory model; fitcheck will not "
            "size another run in its place"
        )
    longlora = next((key for key in LONGLORA if data.get(key) is not None), None)
    if longlora is not None:
        raise InputError(
            f"{path}: {longlora}: LongLoRA (shifted sparse attention over groups, embeddings and norms "
            "trained) has no fitcheck memory model; fitcheck will not size another run in its place"
        )
    train = data.get("train")
    if isinstance(train, dict):
        bad = next((key for key in UNSUPPORTED_TRAIN if train.get(key) is not None), None)
        if bad is not None:
            raise InputError(
                f"{path}: train.{bad}: {_short(train[bad])}: litgpt's finetune scripts refuse it "
                f'(validate_args: "doesn\'t support the {bad!r} argument", {_LG} finetune/lora.py, full.py)'
            )


def _model(r: Reading, k: Keys) -> str | None:
    """The Hub id litgpt downloads into ``checkpoints/<id>`` (utils.py ``auto_download_checkpoint``:
    ``download_from_hub(repo_id=model_name)`` then ``Path("checkpoints") / checkpoint_dir``)."""
    value = k.get("checkpoint_dir")
    if value is None:
        r.note("no checkpoint_dir: give MODEL")
        return None
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{r.path}: checkpoint_dir must be a path (got {_short(value)})")
    parts = PurePosixPath(value.strip()).parts
    if len(parts) == 3 and parts[0] == "checkpoints":
        hub = f"{parts[1]}/{parts[2]}"
        r.note(f"checkpoint_dir {value}: litgpt's download folder of the Hub model {hub}, read as {hub}")
        return hub
    if len(parts) == 2 and not value.startswith("/"):
        r.note(f"checkpoint_dir {value}: not a local folder, litgpt downloads the Hub model {value}")
        return value.strip()
    r.note(
        f"checkpoint_dir {value}: a litgpt checkpoint folder (model_config.yaml, lit_model.pth); give MODEL "
        "(the Hub id or a preset) when fitcheck cannot read it"
    )
    return value.strip()


def _method(r: Reading, k: Keys) -> str:
    """lora / qlora / full from the ``lora_*`` keys and ``quantize`` (finetune/lora.py ``setup``)."""
    p = r.path
    quantize = k.get("quantize")
    lora = any(key in k.data for key in LORA_KEYS)  # a finetune_lora file, even with a key left null
    if quantize is not None and not isinstance(quantize, str):
        raise InputError(
            f"{p}: quantize must be one of bnb.nf4, bnb.nf4-dq, bnb.fp4, bnb.fp4-dq (got {_short(quantize)})"
        )
    if quantize == "bnb.int8-training":
        raise InputError(
            f"{p}: quantize: bnb.int8-training: LLM.int8() layers (lightning BitsandbytesPrecision "
            "int8-training) have no fitcheck memory model; fitcheck will not size another run in its place"
        )
    if quantize is not None and quantize not in QUANT_4BIT:
        raise InputError(
            f"{p}: quantize {_short(quantize)} is not one litgpt takes "
            f"({', '.join(QUANT_4BIT)}, bnb.int8-training)"
        )
    if not lora and quantize is None:
        r.set("method", "full", "lora_* (none: finetune_full)")
        r.note(
            "no lora_* key and no quantize: read as finetune_full "
            "(give --method lora for finetune_lora's defaults)"
        )
        return "full"
    if not lora:
        r.note(f"quantize {quantize} without lora_* keys: finetune_lora with litgpt's LoRA defaults")
    method = "qlora" if quantize is not None else "lora"
    r.set("method", method, "quantize" if quantize is not None else "lora_*")
    if quantize is not None:
        r.set("double_quant", QUANT_4BIT[quantize], "quantize")
        if quantize.startswith("bnb.fp4"):
            r.note(
                f"quantize {quantize}: FP4 stores 4 bits a weight with a block absmax as NF4 does: "
                "sized as QLoRA"
            )
    # unset: the trainer-default rows (readers/defaults.py, finetune/lora.py setup @26857050)
    r.set("lora_rank", as_int(k.get("lora_r"), "lora_r", p), "lora_r")
    r.set("lora_alpha", as_float(k.get("lora_alpha"), "lora_alpha", p), "lora_alpha")
    r.set("lora_dropout", as_float(k.get("lora_dropout"), "lora_dropout", p), "lora_dropout")
    if any(k.has(key) for key in LORA_FLAGS):  # none: lora_query + lora_value, the default row
        flags = {key: as_bool(k.get(key, default), key, p) is True for key, default in LORA_FLAGS.items()}
        r.set("lora_targets", targets(r, flags), "lora_query/key/value/projection/mlp/head")
    return method


#: litgpt's q, k and v parts of its fused ``attn`` (``LoRAQKVLinear`` ``enable_lora``), which fitcheck poses
#: as q_proj / k_proj / v_proj for every model under ``--trainer litgpt`` (engine/regimes.py
#: ``QKV_PARTS_TRAINERS``).
QKV = {"lora_query": "q_proj", "lora_key": "k_proj", "lora_value": "v_proj"}
#: The attention output and the MLP projections by the Llama-family names (litgpt ``proj``, ``fc_1``,
#: ``fc_2``, ``mlp.proj``).
LLAMA_NAMES = {"lora_projection": ("o_proj",), "lora_mlp": ("gate_proj", "up_proj", "down_proj")}


def targets(r: Reading, flags: dict[str, bool]) -> str | None:
    """``--lora-targets`` for litgpt's flags, posed as the config-hub records are
    (tests/data/published/litgpt-config-hub.yaml): every flag on is ``all-linear`` (``linear-modules,lm_head``
    with ``lora_head``: ``all-linear`` cannot stand beside a name), q, k, v and the output projection is
    ``attn``, q / k / v alone are named; another mix names the output and MLP projections by their
    Llama-family names (noted: a GPT-NeoX-style model names them otherwise)."""
    qkv = [name for key, name in QKV.items() if flags[key]]
    head = flags["lora_head"]
    if len(qkv) == 3 and flags["lora_projection"] and flags["lora_mlp"]:
        return "linear-modules,lm_head" if head else "all-linear"
    if len(qkv) == 3 and flags["lora_projection"] and not head:
        return "attn"
    extra = [n for key, mods in LLAMA_NAMES.items() if flags[key] for n in mods]
    if extra:
        r.note(
            "lora_projection / lora_mlp without every other flag: read by the Llama-family names "
            f"({', '.join(extra)}); for Phi-2, Falcon or GPT-NeoX give --lora-targets with that model's names"
        )
    found = [*qkv, *extra, *(["lm_head"] if head else [])]
    if not found:
        raise InputError(
            f"{r.path}: every lora_query/key/value/projection/mlp/head is false: litgpt builds no "
            "adapter, so mark_only_lora_as_trainable leaves nothing to train (torch refuses an empty "
            "optimizer)"
        )
    return ",".join(found)


def _devices(r: Reading, k: Keys, method: str) -> int | None:
    """``devices`` x ``num_nodes`` (``parse_devices``: ``auto`` / -1 is every visible GPU). Several:
    finetune/full.py @26857050 runs lightning ``FSDPStrategy(auto_wrap_policy={Block},
    activation_checkpointing_policy={Block})`` (FSDP1, every Block checkpointed); finetune/lora.py runs
    ``ModelParallelStrategy(parallelize_fn)`` since 5ac69b06 (2025-08-13): ``fully_shard`` (FSDP2) after
    ``checkpoint_wrapper`` on every Block (``parallelize_fn(..., activation_checkpointing=True)``), where
    @00af8b0d it ran the same FSDPStrategy as full.py. Quantization on several devices raises
    NotImplementedError."""
    p = r.path
    raw = k.get("devices", 1)
    nodes = as_int(k.get("num_nodes", 1), "num_nodes", p) or 1
    gpus = None if raw in ("auto", -1, "-1") else as_int(raw, "devices", p)
    if (gpus is not None and gpus < 1) or nodes < 1:
        raise InputError(
            f"{p}: devices must be 'auto' or a positive integer and num_nodes positive (parse_devices)"
        )
    r.set("gpus", gpus, "devices")
    if nodes > 1:
        r.set("nodes", nodes, "num_nodes")
    if gpus is None:
        r.note("devices auto: every GPU litgpt sees (torch.cuda.device_count()); sized on the target's GPUs")
    world = gpus * nodes if gpus is not None else None
    if world == 1 or (world is None and nodes == 1):
        return world
    if method == "qlora":
        raise InputError(
            f"{p}: quantize with devices x num_nodes > 1: litgpt raises NotImplementedError "
            '("Quantization is currently not supported for multi-GPU training", finetune/lora.py)'
        )
    r.set("strategy", "fsdp", "devices")
    r.set("fsdp_version", 1 if method == "full" else 2, "devices")
    r.set("grad_ckpt", True, "devices")
    if method == "full":
        r.note("several devices: finetune_full shards with FSDP1 (FSDPStrategy) and checkpoints every Block")
    else:
        r.note(
            "several devices: finetune_lora shards with FSDP2 (ModelParallelStrategy, fully_shard) and "
            "checkpoints every Block, as litgpt does since 5ac69b06 (2025-08); releases before ran FSDP1: "
            "give --fsdp-version 1 for those"
        )
    return world


def _train(r: Reading, train: Keys | None, world: int | None) -> None:
    """``train.micro_batch_size``, the accumulation ``TrainArgs.gradient_accumulation_iters`` derives
    (``global_batch_size // (devices * num_nodes) // micro_batch_size``, asserted > 0), ``max_seq_length``."""
    p = r.path
    micro = as_int(train.get("micro_batch_size"), "train.micro_batch_size", p) if train else None
    glob = as_int(train.get("global_batch_size"), "train.global_batch_size", p) if train else None
    r.set("batch_size", micro, "train.micro_batch_size")
    if world is not None:
        per_rank = (glob or GLOBAL_BATCH) // world
        accum = per_rank // (micro or MICRO_BATCH)
        if per_rank < 1 or accum < 1 or (micro or MICRO_BATCH) < 1:
            raise InputError(
                f"{p}: train.global_batch_size {glob or GLOBAL_BATCH} over {world} device(s) and "
                f"micro_batch_size {micro or MICRO_BATCH} leaves no whole micro-batch: litgpt's "
                "TrainArgs.gradient_accumulation_iters asserts it is > 0"
            )
        unset = "" if glob is not None and micro is not None else " (unset: litgpt's global 16, micro 1)"
        r.set("grad_accum", accum, f"train.global_batch_size // devices // train.micro_batch_size{unset}")
    else:
        r.note(
            "devices auto: accumulation = global_batch_size // GPUs // micro_batch_size; give --grad-accum"
        )
    seq = as_int(train.get("max_seq_length"), "train.max_seq_length", p) if train else None
    r.set("seq_len", seq, "train.max_seq_length")
    if seq is None:
        r.note(
            "train.max_seq_length null: litgpt trains to the longest example of the data (fit: min(longest, "
            "max_seq_length), at most the model's block size); give --seq-len"
        )


def _precision(r: Reading, k: Keys, method: str) -> None:
    """``precision``: the ``-true`` ones are the litgpt regime (no autocast); unset is
    ``get_default_supported_precision(training=True)``: ``bf16-mixed`` (``16-mixed`` without bf16), utils.py
    @26857050. Mixed precision keeps fp32 weights under autocast: ``--master-weights`` under ``--trainer
    litgpt`` (engine/regimes.py ``_litgpt``). With ``quantize`` litgpt takes only the three ``-true``
    names (``Quantization and mixed precision is not supported``, finetune/lora.py)."""
    p = r.path
    value = k.get("precision")
    name = "bf16-mixed" if value is None else str(value)
    if method == "qlora" and name not in ("bf16-true", "16-true", "32-true"):
        raise InputError(
            f"{p}: precision {name}{' (unset: litgpt picks bf16-mixed)' if value is None else ''} with "
            'quantize: litgpt raises "Quantization and mixed precision is not supported" (finetune/lora.py)'
        )
    if name in TRUE_PRECISION:
        r.set("precision", TRUE_PRECISION[name], "precision")
        return
    if name not in MIXED_PRECISION:
        raise InputError(
            f"{p}: precision {_short(value)} has no fitcheck model under litgpt "
            "(bf16-true, 16-true, 32-true, bf16-mixed, 16-mixed)"
        )
    key = "precision" if value is not None else "precision (unset: litgpt's bf16-mixed)"
    r.set("precision", "fp16" if name.startswith("16") else "bf16", key)
    r.set("master_weights", True, key)
    r.note(
        f"precision {name}{' (unset: litgpt picks it on a GPU with bf16)' if value is None else ''}: "
        "fp32 weights, gradients and AdamW states under autocast (--master-weights with --trainer litgpt)"
    )


def _optimizer(r: Reading, k: Keys, method: str) -> None:
    """``optimizer``: a name (``AdamW`` is ``torch.optim.AdamW``) or ``class_path`` + ``init_args``
    (utils.py ``instantiate_torch_optimizer``). Under ``quantize: bnb.*`` ``instantiate_bnb_optimizer`` builds
    ``bitsandbytes.optim.PagedAdamW`` (32-bit states) from any AdamW name and refuses the others."""
    p = r.path
    value = k.get("optimizer") if not isinstance(k.data.get("optimizer"), dict) else None
    sub = k.sub("optimizer")
    name = str(sub.get("class_path", "")) if sub is not None else (str(value) if value is not None else None)
    init = sub.sub("init_args") if sub is not None else None
    key = "optimizer.class_path" if sub is not None else "optimizer"
    if method == "qlora":
        if name is not None and "AdamW" not in name:
            raise InputError(
                f"{p}: optimizer {_short(name)} with quantize: litgpt supports only AdamW there "
                '(instantiate_bnb_optimizer: "The chosen quantization format only supports the AdamW '
                'optimizer")'
            )
        r.set("optimizer", "paged-adamw", "quantize (instantiate_bnb_optimizer: bitsandbytes PagedAdamW)")
        if init is not None:
            init.touch("fused", "foreach")
        return
    if not name:
        return  # litgpt's "AdamW": the trainer-default row
    module, _, cls = name.rpartition(".")
    r.set("optimizer", names.optimizer(names.TORCH_OPTIM, cls, key, r.notes), key)
    if module in ("", "torch.optim") and cls in ("AdamW", "Adam"):
        fused = as_bool(init.get("fused"), "optimizer.init_args.fused", p) if init is not None else None
        r.set("optimizer_impl", "fused" if fused else "foreach", key)
