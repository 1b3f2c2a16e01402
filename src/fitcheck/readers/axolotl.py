"""axolotl YAML (``axolotl train config.yml``).

Mapping, after axolotl's schema and loaders (axolotl-ai-cloud/axolotl src/axolotl/utils/schemas/*.py
@067b021c, tests/data/trainer_keys/axolotl_keys.txt): ``adapter: lora|qlora`` (no adapter: full
fine-tuning); ``load_in_4bit`` under LoRA is QLoRA, ``load_in_8bit`` an int8 base, ``gptq: true`` a GPTQ
base; ``lora_target_linear: true`` is ``find_all_linear_names`` (the leaf names of every ``nn.Linear``,
fitcheck's ``linear-modules``, `fitcheck.vocab.LINEAR_MODULES`), joined by ``lora_target_modules``
(a string is a regex: peft ``re.fullmatch``, `names.regex_targets`) and ``lora_target_parameters`` (3-D
expert parameters); ``lora_modules_to_save`` are trained in full; ``sequence_len``, ``micro_batch_size``,
``gradient_accumulation_steps`` (or ``batch_size`` / ``micro_batch_size``, normalize_config);
``gradient_checkpointing: true|offload`` (``unsloth``, its 2024 name); ``bf16: true|auto`` / ``fp16``, and
the legacy ``float16`` / ``bfloat16`` load dtype (``resolve_dtype``); ``optimizer`` is a transformers optim
name; attention is ``attn_implementation`` (>= 0.17) or the legacy booleans ``flash_attention``,
``sdp_attention``, ``xformers_attention``, ``eager_attention`` (axolotl maps them to it); the Liger plugin's
``liger_fused_linear_cross_entropy`` and the Cut Cross Entropy plugin's ``cut_cross_entropy`` (on by
default once the plugin is loaded) replace the loss; ``deepspeed`` names a DeepSpeed JSON; ``fsdp_config``
FSDP. What fitcheck cannot pose is refused (`fitcheck.readers.unposed`).
"""

from __future__ import annotations

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
    as_word,
    ray_gpus,
)
from fitcheck.readers.base import unpacked_note as note_unpacked
from fitcheck.readers.hfargs import distributed, fsdp_get, use_reentrant
from fitcheck.readers.unposed import refuse
from fitcheck.vocab import LINEAR_MODULES

FORMAT = "axolotl"
TRAINER = "axolotl"

#: axolotl's legacy attention booleans (mapped to attn_implementation by axolotl >= 0.17).
LEGACY_ATTN = {
    "flash_attention": "flash",
    "sdp_attention": "sdpa",
    "xformers_attention": "xformers",
    "eager_attention": "eager",
}
#: The ``attention:`` shorthand some axolotl examples use (examples/llama-3/fft-8b-liger-fsdp.yaml).
SHORT_ATTN = {"flash": "flash", "sdpa": "sdpa", "eager": "eager", "xformers": "xformers"}


def read(data: Doc, path: str) -> ReadResult:
    """Read an axolotl config."""
    k = Keys(data)
    refuse(k, FORMAT, path)
    r = Reading(FORMAT, TRAINER, k, path)
    model = k.get("base_model")
    r.model = str(model) if model else None
    _method(r, k)
    r.set("seq_len", as_int(k.get("sequence_len"), "sequence_len", path), "sequence_len")
    ray_gpus(r, k, bool(as_bool(k.get("use_ray"), "use_ray", path)))
    micro = as_int(k.get("micro_batch_size"), "micro_batch_size", path)
    r.set("batch_size", micro, "micro_batch_size")
    accum = as_int(k.get("gradient_accumulation_steps"), "gradient_accumulation_steps", path)
    total = as_int(k.get("batch_size"), "batch_size", path)
    if accum is None and total is not None:
        accum = max(1, total // (micro or 1))  # normalize_config: batch_size // micro_batch_size
        r.set("grad_accum", accum, "batch_size")
    else:
        r.set("grad_accum", accum, "gradient_accumulation_steps")
    _checkpointing(r, k)
    _precision(r, k)
    optim = as_word(k.get("optimizer"), "optimizer", path)
    if optim is not None:
        r.set("optimizer", names.optimizer(names.HF_OPTIM, optim, "optimizer", r.notes), "optimizer")
        r.set("optimizer_impl", names.HF_OPTIM_IMPL.get(optim), "optimizer")
    _attention(r, k)
    _loss(r, k)
    packed = as_int(k.get("max_packed_sequence_len"), "max_packed_sequence_len", path)
    if packed is not None:
        _packed_len(r, packed)
    elif as_bool(k.get("sample_packing"), "sample_packing", path):
        r.note("sample_packing: rows are filled to sequence_len tokens, as the estimate already assumes")
        asked = str(k.get("attn_implementation") or k.get("attention") or "")
        flex = "flex" in asked or k.get("flex_attention")
        if r.values.get("attn") in (None, "sdpa", "eager") and not flex:
            r.note(PACKED_MASK_NOTE)
    else:
        note_unpacked(r, "sample_packing")
    k.touch("pad_to_sequence_len")
    if as_bool(k.get("quantize_moe_experts"), "quantize_moe_experts", path):
        # schemas/config.py: "Quantize MoE expert weights on load" (with load_in_4bit / load_in_8bit)
        r.note(
            "quantize_moe_experts: axolotl also quantizes the 3-D expert weights; fitcheck keeps them in the "
            "compute dtype (an upper bound on the weights)"
        )
    _load_quant(r, k)
    _peft_init(r, k)
    distributed(r, k, fsdp_config=False)
    _fsdp(r, k)
    _mesh(r, k)
    return r.result()


def _method(r: Reading, k: Keys) -> None:
    p = r.path
    adapter = k.get("adapter")
    four = as_bool(k.get("load_in_4bit"), "load_in_4bit", p)
    eight = as_bool(k.get("load_in_8bit"), "load_in_8bit", p)
    lora_keys = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_linear", "lora_target_modules")
    if adapter is None:
        r.set("method", "full", "adapter")
        k.touch(*lora_keys, "lora_modules_to_save", "peft_use_dora", "gptq")
        if four or eight or as_bool(k.get("gptq"), "gptq", p):
            r.note("a quantized base without an adapter: axolotl refuses to train a quantized model in full")
        return
    if adapter not in ("lora", "qlora"):  # llama-adapter or a plugin's (loaders/adapter.py load_adapter)
        raise InputError(
            f"{p}: adapter: {_short(adapter)} has no fitcheck memory model (lora and qlora have); "
            "fitcheck will not size another run in its place"
        )
    qlora = adapter == "qlora" or bool(four)
    r.set("method", "qlora" if qlora else "lora", "adapter")
    if eight and not qlora:
        r.set("base_quant", "int8", "load_in_8bit")
    if as_bool(k.get("gptq"), "gptq", p):
        r.set("base_quant", "gptq", "gptq")
    r.set("lora_rank", as_int(k.get("lora_r"), "lora_r", p), "lora_r")
    r.set("lora_alpha", as_float(k.get("lora_alpha"), "lora_alpha", p), "lora_alpha")
    r.set("lora_dropout", as_float(k.get("lora_dropout"), "lora_dropout", p), "lora_dropout")
    if as_bool(k.get("lora_target_linear"), "lora_target_linear", p):
        # _build_peft_lora_config: find_all_linear_names(model) joins lora_target_modules (as a list)
        extra = _targets(r, k)
        r.set("lora_targets", ",".join(x for x in (LINEAR_MODULES, extra) if x), "lora_target_linear")
    else:
        r.set("lora_targets", _targets(r, k), "lora_target_modules")
    r.set("dora", as_bool(k.get("peft_use_dora"), "peft_use_dora", p), "peft_use_dora")
    layers = k.get("peft_layers_to_transform")
    k.touch("peft_layers_pattern")
    if layers is not None:
        # schemas/peft.py @067b021c: "The layer indices to transform, otherwise, apply to all layers"
        # (peft LoraConfig layers_to_transform)
        r.note(
            f"peft_layers_to_transform {_short(layers)}: adapters in those layers only; sized in every "
            "layer (an upper bound on the adapters and their states)"
        )
    save = names.modules(k.get("lora_modules_to_save"), "lora_modules_to_save", r.path)
    r.set("train_modules", ",".join(save) or None, "lora_modules_to_save")
    bnb = k.sub("bnb_config_kwargs")
    if bnb is not None and qlora:
        r.set(
            "double_quant",
            as_bool(bnb.get("bnb_4bit_use_double_quant"), "bnb_4bit_use_double_quant", p),
            "bnb_config_kwargs.bnb_4bit_use_double_quant",
        )
        # loaders/model.py @067b021c: bnb_config.update(cfg.bnb_config_kwargs) over its bf16 storage default
        key = "bnb_config_kwargs.bnb_4bit_quant_storage"
        names.read_quant_storage(r, bnb.get("bnb_4bit_quant_storage"), key)


#: Characters that make a string ``lora_target_modules`` a pattern rather than a list of names.
REGEX_CHARS = frozenset("[]()|*+?\\^$")


def _targets(r: Reading, k: Keys) -> str | None:
    """``lora_target_modules`` (names, or one string peft matches as a regex, `names.regex_targets`) and
    ``lora_target_parameters`` (3-D expert parameters peft adapts through ``ParamWrapper``)."""
    value = k.get("lora_target_modules")
    if isinstance(value, str) and REGEX_CHARS & set(value):
        mods, partial = names.regex_targets(value)
        if not mods:
            raise InputError(
                f"{r.path}: lora_target_modules {_short(value)} matches no decoder projection fitcheck "
                "knows (peft matches it as a regex); give --lora-targets"
            )
        r.note(
            "lora_target_modules is a regex (peft re.fullmatch): read as "
            + ",".join(mods)
            + (" in every layer (it names only some layers: an upper bound)" if partial else "")
            + "; modules outside the decoder layers it names (a vision tower) are not counted"
        )
    else:
        mods = names.modules(value, "lora_target_modules", r.path)
    # target parameters keep their dotted names (``experts.down_proj`` is not the dense ``down_proj``); peft
    # matches them as a suffix of the parameter's name, so ``mlp.experts.x`` is fitcheck's ``experts.x``
    params = [
        p[p.rindex("experts.") :] if "experts." in p else p
        for p in names.modules(k.get("lora_target_parameters"), "lora_target_parameters", r.path)
    ]
    named = names.targets(mods)
    return ",".join(x for x in (named, *params) if x) or None


def _packed_len(r: Reading, packed: int) -> None:
    """``max_packed_sequence_len``: axolotl's 2023 packing, before ``sample_packing``
    (src/axolotl/utils/data.py @b1f4f7a3: ``ConstantLengthDataset(seq_length=min(max_packed_sequence_len,
    sequence_len))`` concatenates the examples and cuts rows of exactly that length). Releases since refuse
    the key (utils/schemas/deprecated.py @067b021c: "no longer supported"); the file is read as its run."""
    seq = r.values.get("seq_len")
    if not isinstance(seq, int) or packed < seq:
        r.set("seq_len", packed, "max_packed_sequence_len")
    shown = r.values.get("seq_len")
    r.note(
        f"max_packed_sequence_len: examples packed into rows of {shown} tokens (axolotl's 2023 packing), as "
        "the estimate assumes; axolotl releases since refuse the key (sample_packing replaced it)"
    )


def _checkpointing(r: Reading, k: Keys) -> None:
    value = k.get("gradient_checkpointing")
    if value in ("offload", "offload_disk", "unsloth"):
        r.set("grad_ckpt", True, "gradient_checkpointing")
        r.set("offload_activations", True, "gradient_checkpointing")
        if value == "unsloth":
            # axolotl 6319da1f (2024-04) added it; until c0a0c753 (2025-05) "unsloth" and "offload" set the
            # same CPU-offloading checkpoint wrapper (utils/models.py: ``in ["unsloth", "offload"]``)
            r.note(
                "gradient_checkpointing: unsloth: axolotl's earlier name for offload (checkpoints kept on "
                "the CPU), read as such; axolotl releases since May 2025 reject it (write offload)"
            )
    elif value is not None:
        r.set("grad_ckpt", as_bool(value, "gradient_checkpointing", r.path), "gradient_checkpointing")
    # normalize_config sets {"use_reentrant": True} when checkpointing and the key is unset (SFT without
    # unfrozen_parameters; src/axolotl/utils/config/__init__.py:377-383 @067b021c): unset is reentrant
    use_reentrant(r, k, "gradient_checkpointing_kwargs")
    # torch_compile: true|false|auto (schema default null); ``auto`` is decided at run time: not read
    if k.get("torch_compile") == "auto":
        r.note("torch_compile: auto is decided when axolotl runs; give --compile or --no-compile")
    else:
        r.set("compile", as_bool(k.get("torch_compile"), "torch_compile", r.path), "torch_compile")
    k.touch("torch_compile_backend", "torch_compile_mode")
    if k.get("activation_offloading") not in (None, False):
        r.set("offload_activations", True, "activation_offloading")


def _precision(r: Reading, k: Keys) -> None:
    """``bf16`` / ``fp16`` are autocast (the Trainer's flags); the legacy ``bfloat16`` / ``float16`` set
    the dtype the model loads in (``resolve_dtype``: ``bf16 or bfloat16`` -> bfloat16, ``fp16 or
    float16`` -> float16, else float32; src/axolotl/utils/config/__init__.py @067b021c). With both flags
    off, a 16-bit load trains in that dtype without autocast (``--no-autocast``)."""
    p = r.path
    # as_bool refuses what is no flag (``bf16: maybe`` fell through to the default without a word)
    bf16, fp16 = as_bool(k.get("bf16"), "bf16", p), as_bool(k.get("fp16"), "fp16", p)
    loaded = "bf16" if as_bool(k.get("bfloat16"), "bfloat16", p) else None
    loaded = loaded or ("fp16" if as_bool(k.get("float16"), "float16", p) else None)
    if bf16 is True or (k.get("bf16") == "auto" and fp16 is not True):
        r.set("precision", "bf16", "bf16")
    elif fp16:
        r.set("precision", "fp16", "fp16")
    elif bf16 is False and k.get("fp16") in (False, None) and loaded is not None:
        r.set("precision", loaded, "float16" if loaded == "fp16" else "bfloat16")
        r.set("autocast", False, "bf16")
    elif bf16 is False and fp16 is False:
        r.set("precision", "fp32", "bf16")
    k.touch("tf32")


#: sample_packing without FlashAttention/flex (axolotl @067b021c: core/trainers/base.py drops the attention
#: mask when the backend decontaminates packing; transformers 5.x masking_utils find_packed_sequence_indices
#: then builds a block-diagonal bool mask from the restarting position ids, shared by the layers; axolotl's
#: sdpa_varlen patch replaces it under torch >= 2.10 for head dim <= 256 without sliding windows).
PACKED_MASK_NOTE = (
    "sample_packing under SDPA or eager attention: transformers builds one block-diagonal b x 1 x s x s mask "
    "per step from the restarting position ids (SDPA then makes a float copy of it in each layer and expands "
    "grouped K/V; axolotl's varlen SDPA replaces it under torch 2.10+ for head dim <= 256 without sliding "
    "windows): not counted, the rows are sized unmasked"
)


def _attention(r: Reading, k: Keys) -> None:
    impl = as_word(k.get("attn_implementation"), "attn_implementation", r.path)
    if impl is not None:
        found = names.hf_attn(impl)
        r.set("attn", found, "attn_implementation")
        if found is None:
            r.note(f"attn_implementation {impl!r} has no fitcheck model; sdpa is assumed")
    short = k.get("attention")
    if short is not None and (not isinstance(short, str) or short not in SHORT_ATTN):
        r.note(f"attention {_short(short)} has no fitcheck model; sdpa is assumed")
    elif isinstance(short, str) and "attn" not in r.values:
        r.set("attn", SHORT_ATTN[short], "attention")
    for key, kernel in LEGACY_ATTN.items():
        if as_bool(k.get(key), key, r.path) and "attn" not in r.values:
            r.set("attn", kernel, key)


def _loss(r: Reading, k: Keys) -> None:
    plugins = names.modules(k.get("plugins"), "plugins", r.path)
    names.read_loss(r, k, "axolotl", plugins)
    liger = [
        key
        for key in ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm")
        if k.has(key)
    ]
    k.touch(*liger)
    if liger:
        r.note(f"{', '.join(liger)}: Liger's fused kernels change activation memory little; not modelled")
    if plugins and "loss" not in r.values:
        r.note(f"plugins {', '.join(plugins)}: no loss kernel switched on")


def _load_quant(r: Reading, k: Keys) -> None:
    """``model_quantization_config`` (schemas/model.py: ``Mxfp4Config`` or ``FineGrainedFP8Config``, passed
    to ``from_pretrained`` by loaders/model.py ``_set_quantization_config`` @067b021c). An MXFP4 checkpoint
    trains only dequantized (transformers quantizer_mxfp4.py ``is_trainable``), which is how fitcheck sizes
    it (sources/resolve.py ``MXFP4_NOTE``); FP8 weights are not modelled."""
    kind = k.get("model_quantization_config")
    kwargs = k.sub("model_quantization_config_kwargs")
    if kind is None:
        return
    k.touch("model_quantization_config_kwargs")
    dequantize = kwargs is not None and as_bool(kwargs.get("dequantize"), "dequantize", r.path)
    if kind == "Mxfp4Config" and dequantize:
        r.note("model_quantization_config Mxfp4Config (dequantize): the weights load in bf16, as sized")
    elif kind == "Mxfp4Config":
        r.note(
            "model_quantization_config Mxfp4Config without dequantize: true: transformers does not train "
            "MXFP4 layers; sized dequantized to the training precision"
        )
    else:
        r.note(
            f"model_quantization_config {_short(kind)}: quantized weights are not modelled; sized at the "
            "training precision (an upper bound on the weights)"
        )


def _peft_init(r: Reading, k: Keys) -> None:
    """``peft.loftq_config.loftq_bits``: LoftQ initialisation (loaders/adapter.py @067b021c:
    ``LoraConfig(init_lora_weights="loftq", loftq_config=LoftQConfig(loftq_bits=...))``). The base stays
    in the load dtype, replaced by its quantize-dequantize residual: the step is plain LoRA's."""
    peft = k.sub("peft")
    if peft is None:
        return
    loftq = peft.sub("loftq_config")
    if loftq is not None:
        bits = loftq.get("loftq_bits")
        r.note(
            f"peft.loftq_config (loftq_bits {_short(bits)}): LoftQ initialises the adapters from a "
            f"{_short(bits)}-bit quantization of the base, which stays in the load dtype: sized as "
            "the LoRA step (the one-off initialisation is not)"
        )


def _mesh(r: Reading, k: Keys) -> None:
    """``dp_shard_size`` ("Number of devices to shard across. If not set, will use all available
    devices") and ``dp_replicate_size`` (schemas/config.py @067b021c), the device mesh of axolotl's FSDP2:
    replicas over sharding groups is HSDP. A shard group other than the target's GPUs is noted: fitcheck
    shards over the GPUs of ``--on`` (and ``--nodes``). Tensor and context parallel sizes above 1 are refused
    (`fitcheck.readers.unposed`); 1 splits nothing."""
    p = r.path
    shard = as_int(k.get("dp_shard_size"), "dp_shard_size", p)
    replicate = as_int(k.get("dp_replicate_size"), "dp_replicate_size", p)
    k.touch("tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree")
    if replicate is not None and replicate > 1 and "strategy" in r.values:
        r.set("strategy", "fsdp-hybrid", "dp_replicate_size")
    if shard is not None:
        r.note(
            f"dp_shard_size {shard}: FSDP shards each parameter over {shard} GPU(s); fitcheck shards over "
            "the GPUs --on names (and --nodes): give a target of that many"
        )


def _fsdp(r: Reading, k: Keys) -> None:
    # entries with or without the fsdp_ prefix (`hfargs.fsdp_get`): axolotl hands fsdp_config to
    # TrainingArguments unchanged (src/axolotl/core/builders/base.py)
    cfg = k.sub("fsdp_config")
    version = as_int(k.get("fsdp_version"), "fsdp_version", r.path)
    if cfg is None:
        return
    version = version or as_int(fsdp_get(cfg, "version"), "fsdp_version", r.path)
    strategy = fsdp_get(cfg, "sharding_strategy")
    reshard = fsdp_get(cfg, "reshard_after_forward")
    if strategy == "SHARD_GRAD_OP" or reshard is False:
        r.set("strategy", "fsdp-grad-op", "fsdp_config")
    elif strategy == "HYBRID_SHARD":
        r.set("strategy", "fsdp-hybrid", "fsdp_config")
    elif "strategy" not in r.values:
        r.set("strategy", "fsdp", "fsdp_config")
    if as_bool(fsdp_get(cfg, "offload_params"), "offload_params", r.path):
        r.set("offload", "all", "fsdp_config.offload_params")
    if as_bool(fsdp_get(cfg, "activation_checkpointing"), "activation_checkpointing", r.path):
        r.set("grad_ckpt", True, "fsdp_config.activation_checkpointing")
    if version is not None:
        r.set("fsdp_version", version, "fsdp_version")
        return
    # axolotl pins an unversioned fsdp_config to 1 (schemas/validation.py check_fsdp_version_in_fsdp_config,
    # lines 1105-1124 @067b021c: "transformers >= 5.10 defaults a missing version to FSDP2; pin axolotl's
    # FSDP1 default"), and hands it to TrainingArguments and accelerate's FSDP_VERSION as such
    r.set("fsdp_version", 1, "fsdp_config (fsdp_version unset: axolotl pins 1)")
    r.note(
        "fsdp_version unset: axolotl pins FSDP1 (the legacy wrapper; it warns FSDP1 is deprecated), so it is "
        "sized as FSDP1; transformers >= 5.10 alone would run FSDP2: set fsdp_version: 2 for that"
    )
