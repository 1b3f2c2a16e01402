"""TRL ``trl sft --config`` YAML (ScriptArguments + SFTConfig + ModelConfig in one flat mapping).

Mapping, after TRL's own code: ``use_peft`` makes a LoRA run (``get_peft_config``), ``load_in_4bit``
under it QLoRA and ``load_in_8bit`` an int8 base (``get_quantization_config``); ``dtype`` is what
``from_pretrained`` loads (ModelConfig, default ``float32``), so float32 weights with bf16/fp16 on
are AMP (``--master-weights``); ``max_length`` is the sequence length (``max_seq_length`` before
TRL 0.20); ``lora_modules_to_save`` are trained in full. Sources: huggingface/trl
trl/trainer/model_config.py, trl/trainer/utils.py (get_peft_config, get_quantization_config),
trl/trainer/sft_config.py, trl 1.16.0 (tests/data/trainer_keys/trl_*.txt).
"""

from __future__ import annotations

from fitcheck.errors import InputError
from fitcheck.readers import names
from fitcheck.readers.accelerate import plugin_defaults
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, _short, as_bool, as_float, as_int, as_word
from fitcheck.readers.base import unpacked_note as note_unpacked
from fitcheck.readers.hfargs import training_args
from fitcheck.readers.unposed import refuse
from fitcheck.terminal import clipped

FORMAT = "trl"
TRAINER = "hf"


def read(data: Doc, path: str) -> ReadResult:
    """Read a TRL SFT config."""
    k = Keys(data)
    refuse(k, FORMAT, path)
    r = Reading(FORMAT, TRAINER, k, path)
    model = k.get("model_name_or_path")
    r.model = str(model) if model else None
    training_args(r, k)
    _precision(r, k)
    for key in ("max_length", "max_seq_length"):
        if k.has(key):
            r.set("seq_len", as_int(k.get(key), key, path), key)
    _loss(r, k)
    _peft(r, k)
    attn = as_word(k.get("attn_implementation"), "attn_implementation", path)
    if attn is not None:
        found = names.hf_attn(attn)
        r.set("attn", found, "attn_implementation")
        if found is None:
            r.note(f"attn_implementation {attn!r} has no fitcheck model; sdpa is assumed")
    if as_bool(k.get("activation_offloading"), "activation_offloading", path):
        r.set("offload_activations", True, "activation_offloading")
    _device_map(r, k)
    _launch(r, k)
    _packing(r, k)
    return r.result()


#: TRL's packing strategies that flatten the batch (SFTTrainer.__init__: ``self.padding_free =
#: args.padding_free or (args.packing and args.packing_strategy in {"bfd", "bfd_split"})``, trl 1.16.0;
#: ``packing_strategy`` defaults to ``bfd``).
PADDING_FREE_STRATEGIES = ("bfd", "bfd_split")


def _packing(r: Reading, k: Keys) -> None:
    """``packing`` fills rows to max_length; ``padding_free`` (or packing with a best-fit strategy) also
    flattens the micro-batch into one row, whose SDPA mask spans the row (``--padding-free``)."""
    path = r.path
    packing = as_bool(k.get("packing"), "packing", path)
    strategy = as_word(k.get("packing_strategy"), "packing_strategy", path) or "bfd"
    free = as_bool(k.get("padding_free"), "padding_free", path)
    if packing:
        r.note("packing: rows are filled to the sequence length, as the estimate already assumes")
    if free or (packing and strategy in PADDING_FREE_STRATEGIES):
        r.set("padding_free", True, "padding_free" if free else "packing_strategy")
        r.note(
            "padding-free: each micro-batch flattened into one row (under SDPA its block-diagonal mask "
            "is counted; FlashAttention-2 attends per example)"
        )
    elif not packing:
        note_unpacked(r, "packing or padding_free")


def _loss(r: Reading, k: Keys) -> None:
    """TRL 1.16's SFTTrainer scores every ``loss_type`` (``nll``, ``dft``; ``chunked_nll`` an alias) through
    its fused LM head (`fitcheck.readers.defaults`, ``loss: trl``), ``use_liger_kernel`` included: it
    switches Liger's fused cross-entropy off. Two runs make the whole logits instead: a
    ``label_smoothing_factor`` (the ``LabelSmoother`` takes them), and a TRL before 0.20, which a file
    naming ``max_seq_length`` was written for (SFTConfig renamed it ``max_length`` in 0.20)."""
    k.touch("loss_type")
    smoothing = as_float(k.get("label_smoothing_factor"), "label_smoothing_factor", r.path)
    if k.has("max_seq_length") and not k.has("max_length"):
        if r.values.get("loss") != "liger":  # Liger's fused cross-entropy did run under those releases
            r.set("loss", "standard", "max_seq_length")
            r.note(
                "max_seq_length: a file for TRL before 0.20, whose SFTTrainer made the whole logits (sized "
                "as --loss standard; TRL 1.16 scores them through its fused LM head, --loss trl)"
            )
        return
    if r.values.get("loss") == "liger":
        r.set("loss", "trl", "use_liger_kernel")
        r.note(
            "use_liger_kernel: TRL 1.16 keeps its own fused LM head and turns Liger's fused cross-entropy "
            "off (sized as --loss trl)"
        )
    if smoothing:
        r.set("loss", "standard", "label_smoothing_factor")
        r.note(
            "label_smoothing_factor: TRL's LabelSmoother takes the whole logits (sized as --loss standard)"
        )


def _precision(r: Reading, k: Keys) -> None:
    """``dtype`` (loading) with the bf16/fp16 flags (autocast): AMP over fp32 weights is master weights; a
    16-bit model with both flags off trains in its own dtype without autocast (``--no-autocast``)."""
    key = "dtype" if k.has("dtype") else "torch_dtype"
    dtype = k.get(key)
    if not isinstance(dtype, str) or dtype == "auto":
        if dtype == "auto":
            r.set("master_weights", False, key)
        return
    loaded = names.DTYPES.get(dtype)
    if loaded is None:
        r.note(f"{key} {dtype!r} is not a dtype fitcheck knows")
        return
    autocast = r.values.get("precision")
    flags_off = k.data.get("bf16") is False and k.data.get("fp16") is not True
    if loaded == "fp32":
        if flags_off:
            r.set("precision", "fp32", key)
        r.set("master_weights", not flags_off, key)
    else:
        r.set("master_weights", False, key)
        if autocast is None and flags_off:
            r.set("precision", loaded, key)
            r.set("autocast", False, "bf16")


#: Adapter switches of other HF-style trainers whose configs this reader picks up (``model_name_or_path``,
#: ``per_device_train_batch_size``, ``max_seq_length``) but TRL does not read: allenai/open-instruct
#: ``open_instruct/finetune.py`` FlatArguments ``use_lora`` / ``use_qlora`` (LoraConfig(r=lora_rank) on
#: q/k/v/o/gate/up/down, a 4-bit NF4 base under use_qlora; its own accelerate loop) @e6c3044a. Without
#: ``use_peft`` the file would read as full fine-tuning: refused, naming the key (most specific first).
FOREIGN_ADAPTER = (("use_qlora", "qlora"), ("use_lora", "lora"))


def _peft(r: Reading, k: Keys) -> None:
    p = r.path
    peft = as_bool(k.get("use_peft"), "use_peft", p)
    four = as_bool(k.get("load_in_4bit"), "load_in_4bit", p)
    eight = as_bool(k.get("load_in_8bit"), "load_in_8bit", p)
    lora_keys = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save")
    for key, method in FOREIGN_ADAPTER:
        if not peft and as_bool(k.data.get(key), key, p):
            raise InputError(
                f"{p}: {key}: true is no TRL key (open-instruct's finetune.py switches {method} adapters on "
                "with it; TRL's is use_peft), so this file would read as full fine-tuning: give MODEL and "
                f"the setup as flags (--method {method} --lora-rank N ...)"
            )
    if not peft:
        r.set("method", "full", "use_peft")
        k.touch(*lora_keys, "use_dora", "bnb_4bit_quant_type", "use_bnb_nested_quant")
        if four or eight:
            r.note("load_in_4bit/8bit without use_peft: TRL refuses to train a quantized model in full")
        return
    r.set("method", "qlora" if four else "lora", "load_in_4bit" if four else "use_peft")
    if eight and not four:
        r.set("base_quant", "int8", "load_in_8bit")
    if four or eight:
        r.note(
            "kbit_prep: a TRL/HF config cannot say whether a script calls peft's "
            "prepare_model_for_kbit_training; sized as TRL's SFTTrainer (>= 0.26: none, adapters bf16); "
            "give --kbit-prep if yours calls it, --kbit-path trl-legacy for TRL 0.9-0.25's SFTTrainer"
        )
    r.set("lora_rank", as_int(k.get("lora_r"), "lora_r", p), "lora_r")
    r.set("lora_alpha", as_float(k.get("lora_alpha"), "lora_alpha", p), "lora_alpha")
    r.set("lora_dropout", as_float(k.get("lora_dropout"), "lora_dropout", p), "lora_dropout")
    r.set(
        "lora_targets",
        names.targets(names.modules(k.get("lora_target_modules"), "lora_target_modules", r.path)),
        "lora_target_modules",
    )
    r.set("dora", as_bool(k.get("use_dora"), "use_dora", p), "use_dora")
    save = names.modules(k.get("lora_modules_to_save"), "lora_modules_to_save", r.path)
    r.set("train_modules", ",".join(save) or None, "lora_modules_to_save")
    if four:
        quant = k.get("bnb_4bit_quant_type")
        if quant not in (None, "nf4"):
            r.note(f"bnb_4bit_quant_type {quant!r}: sized as NF4 (same 4-bit storage)")
        r.set(
            "double_quant",
            as_bool(k.get("use_bnb_nested_quant"), "use_bnb_nested_quant", p),
            "use_bnb_nested_quant",
        )
        # ModelConfig; trl/trainer/utils.py get_quantization_config passes it to BitsAndBytesConfig
        names.read_quant_storage(r, k.get("bnb_4bit_quant_storage"), "bnb_4bit_quant_storage")


#: ``device_map`` values that split the layers over every visible GPU in one process with the balanced
#: placement the engine models (transformers ``from_pretrained``; docs/distributed.md#device-map).
SPLITTING = ("auto", "balanced")


def _device_map(r: Reading, k: Keys) -> None:
    """``model_init_kwargs.device_map``: a note, not a strategy. The file cannot say how many GPUs the
    process sees, nor whether it is launched once (a MULTI_GPU/DEEPSPEED launch drops the map: TRL 1.16.0
    sft_trainer.py), and on one GPU ``auto`` only places the model there."""
    sub = k.sub("model_init_kwargs")
    dm = sub.get("device_map") if sub is not None else None
    if isinstance(dm, str) and dm in SPLITTING:
        r.note(
            f"model_init_kwargs.device_map {dm!r}: one process splits the layers over every GPU it sees; "
            "on several GPUs give --gpus N --strategy device-map (the file does not say how many)"
        )


#: The accelerate configs TRL ships, by the name ``accelerate_config`` takes (trl/accelerate_configs/*.yaml
#: @f2cd5771, resolved by trl/cli/accelerate_config.py): strategy and FSDP version; none offloads, all
#: launch 8 processes. ``single_gpu`` is ``distributed_type: "NO"``: one process.
TRL_LAUNCH: dict[str, tuple[str | None, int | None]] = {
    "single_gpu": (None, None),
    "multi_gpu": ("ddp", None),
    "zero1": ("zero1", None),
    "zero2": ("zero2", None),
    "zero3": ("zero3", None),
    "fsdp1": ("fsdp", 1),
    "fsdp2": ("fsdp", 2),
}


def _launch(r: Reading, k: Keys) -> None:
    """``num_processes`` and ``accelerate_config``: ``trl <command> --config`` hands the keys its parser does
    not know to ``accelerate launch`` (trl/cli/commands/training.py @f2cd5771, the CLI docs'
    ``num_processes: 4`` and ``accelerate_config: zero2``). With no config file, ``accelerate launch``
    turns on multi-GPU (DDP) for more than one process on a machine with several GPUs (commands/launch.py
    ``_validate_launch_command``)."""
    p = r.path
    procs = as_int(k.get("num_processes"), "num_processes", p)
    if procs is not None and procs < 1:
        raise InputError(f"{p}: num_processes must be 1 or more (got {procs})")
    name = k.get("accelerate_config")
    if isinstance(name, str) and name in TRL_LAUNCH:
        strategy, version = TRL_LAUNCH[name]
        r.set("strategy", strategy, "accelerate_config")
        r.set("fsdp_version", version, "accelerate_config")
        stage = {"zero1": 1, "zero2": 2, "zero3": 3}.get(name)
        if stage is not None:
            plugin_defaults(r, stage)
        if name == "single_gpu":
            r.set("gpus", 1, "accelerate_config")
            r.note("accelerate_config single_gpu: distributed_type NO, one process")
            return
        r.note(f"accelerate_config {name}: TRL's trl/accelerate_configs/{name}.yaml (no offload)")
    elif isinstance(name, str) and name:
        shown = clipped(name, 80)
        r.note(
            f"accelerate_config {shown} is an accelerate config file: read its strategy with --from {shown}"
        )
    elif name is not None:
        r.note(f"accelerate_config {_short(name)} is neither a TRL config name nor a path")
    if procs is not None:
        r.set("gpus", procs, "num_processes")
        if procs > 1 and name is None:
            r.set("strategy", "ddp", "num_processes")
            r.note(
                f"num_processes {procs}: accelerate launch starts {procs} processes, DDP over the GPUs "
                "(with no accelerate config on the machine)"
            )
