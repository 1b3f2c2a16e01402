"""Trainer names -> fitcheck names: optimizers, dtypes, attention kernels. One table per kind.

Only names whose memory fitcheck models are mapped; another name is reported, not guessed.
Sources: transformers ``OptimizerNames`` (src/transformers/training_args.py, the 5.x list in
docs/trainer_keys: hf_training_arguments.txt), sd-scripts ``train_util.get_optimizer`` @48d368f,
mlx-lm ``lora.py`` optimizer choices @d78bf58, torchtune/bitsandbytes/torchao optimizer classes.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from fitcheck.errors import InputError
from fitcheck.facts import hf_optim
from fitcheck.facts.loss_keys import LOSS_SWITCHES, ON_WITH_PLUGIN
from fitcheck.readers.base import Keys, Reading, _short, as_bool

#: transformers ``optim`` (and axolotl ``optimizer``) -> fitcheck optimizer: the one table the emitters
#: write from too (fitcheck.facts.hf_optim).
HF_OPTIM = hf_optim.HF_OPTIM
#: transformers ``optim`` -> the AdamW step it picks (``--optimizer-impl``), where it names one.
HF_OPTIM_IMPL = hf_optim.HF_OPTIM_IMPL

#: sd-scripts ``optimizer_type`` (matched case-insensitively, as get_optimizer does).
KOHYA_OPTIM: dict[str, str] = {
    "": "adamw",
    "adamw": "adamw",
    "adamw8bit": "adamw8bit",
    "pagedadamw": "paged-adamw",
    "pagedadamw32bit": "paged-adamw",
    "pagedadamw8bit": "paged-adamw8bit",
    "lion": "lion",
    "lion8bit": "lion8bit",
    "pagedlion8bit": "lion8bit",
    "adafactor": "adafactor",
    "prodigy": "prodigy",
    "sgdnesterov": "sgd",
}

#: mlx-lm ``optimizer`` (mlx_lm/lora.py choices). Adam and AdamW keep the same two states.
MLX_OPTIM: dict[str, str] = {"adam": "adamw", "adamw": "adamw", "adafactor": "adafactor", "sgd": "sgd"}

#: torchtune ``optimizer._component_`` class name (last dotted part) -> fitcheck optimizer.
TORCH_OPTIM: dict[str, str] = {
    "AdamW": "adamw",
    "Adam": "adamw",
    "AdamW8bit": "adamw8bit",
    "PagedAdamW8bit": "paged-adamw8bit",
    "PagedAdamW": "paged-adamw",
    "PagedAdamW32bit": "paged-adamw",
    "Lion": "lion",
    "Lion8bit": "lion8bit",
    "Adafactor": "adafactor",
    "SGD": "sgd",
}

#: torch dtype names as configs write them -> fitcheck precision.
DTYPES: dict[str, str] = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "torch.bfloat16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "torch.float16": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
    "torch.float32": "fp32",
}
#: ``bnb_4bit_quant_storage`` values (torch dtype names, as BitsAndBytesConfig takes them) -> fitcheck's.
QUANT_STORAGE: dict[str, str] = {**DTYPES, "uint8": "uint8", "torch.uint8": "uint8"}

#: transformers ``attn_implementation`` (and axolotl's) -> fitcheck attention kernel.
HF_ATTN: dict[str, str] = {
    "eager": "eager",
    "sdpa": "sdpa",
    "flash_attention_2": "flash",
    "flash_attention_3": "flash",
    "flash": "flash",
    "xformers": "xformers",
}


def hf_attn(value: str) -> str | None:
    """A transformers ``attn_implementation`` as a fitcheck kernel. A Hub kernel repo whose name is a
    FlashAttention build (``kernels-community/vllm-flash-attn3``, which LLaMA-Factory registers for
    gpt-oss: model/model_utils/attention.py @ff6d4d12, and axolotl examples name) is flash."""
    found = HF_ATTN.get(value)
    if found is None and "/" in value and "flash-attn" in value.rsplit("/", 1)[-1]:
        return "flash"
    return found


#: HF module names for torchtune's (torchtune/modules/peft: lora_attn_modules, MLP w1/w2/w3).
TORCHTUNE_MODULES: dict[str, str] = {
    "q_proj": "q_proj",
    "k_proj": "k_proj",
    "v_proj": "v_proj",
    "output_proj": "o_proj",
    "w1": "gate_proj",
    "w2": "down_proj",
    "w3": "up_proj",
}


def modules(value: object, key: str, path: str) -> list[str]:
    """Module names from a list or a comma-separated string (None: none); anything else is refused, not
    read as no names (``lora_target_modules: 5`` fell back to the default targets without a word)."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return [v.strip() for v in value if v.strip()]
    raise InputError(
        f"{path}: {key} must be a list of names or a comma-separated string (got {_short(value)})"
    )


def optimizer(table: dict[str, str], name: str, key: str, notes: list[str]) -> str | None:
    """The fitcheck optimizer for a trainer's name, or None with a note when fitcheck has no model."""
    found = table.get(name) if table is not KOHYA_OPTIM else table.get(name.lower())
    if found is None:
        notes.append(f"{key} {name!r} has no fitcheck memory model; the optimizer default is used")
    return found


def targets(modules: list[str]) -> str | None:
    """fitcheck ``--lora-targets`` for a list of module names: ``all-linear`` only when the file says
    ``all-linear`` / ``all``. A list naming every Llama projection stays a list: peft matches named modules
    by name, which on a MoE model leaves the 3-D experts and on a multimodal one the vision tower alone,
    where its ``all-linear`` takes every linear layer."""
    short = [m.split(".")[-1] for m in modules]
    if not short:
        return None
    if "all-linear" in short or "all" in short:
        return "all-linear"
    return ",".join(dict.fromkeys(short))


def read_loss(r: Reading, k: Keys, fmt: str, plugins: Sequence[str] = ()) -> None:
    """``--loss`` from the key that switches the format to another cross-entropy kernel (the first set
    wins; fitcheck.facts.loss_keys, the table the emitters write from). A key left unset is on when its
    plugin is loaded and defaults it on (`ON_WITH_PLUGIN`)."""
    for loss, (key, plugin) in LOSS_SWITCHES[fmt].items():
        on = as_bool(k.get(key), key, r.path)
        if on is None and key in ON_WITH_PLUGIN and plugin in plugins:
            r.set("loss", loss, f"plugins ({key} defaults to true)")
            return
        if on:
            r.set("loss", loss, key)
            return


#: Where a decoder projection sits in the module names regex targets are matched against: the model
#: prefixes of text and multimodal checkpoints, and each projection's parent module.
REGEX_PREFIXES = ("model.", "model.language_model.", "language_model.model.", "model.text_model.", "")
REGEX_PARENTS: dict[str, tuple[str, ...]] = {
    "q_proj": ("self_attn", "attn", "cross_attn"),
    "k_proj": ("self_attn", "attn", "cross_attn"),
    "v_proj": ("self_attn", "attn", "cross_attn"),
    "o_proj": ("self_attn", "attn", "cross_attn"),
    "q_a_proj": ("self_attn",),
    "q_b_proj": ("self_attn",),
    "kv_a_proj_with_mqa": ("self_attn",),
    "kv_b_proj": ("self_attn",),
    "gate_proj": ("mlp", "feed_forward", "mlp.shared_experts"),
    "up_proj": ("mlp", "feed_forward", "mlp.shared_experts"),
    "down_proj": ("mlp", "feed_forward", "mlp.shared_experts"),
}
#: Layer indices tried: a pattern that names only some layers (``layers\.(3|7)\.``) is found partial.
REGEX_LAYERS = 128


def regex_targets(pattern: str) -> tuple[list[str], bool]:
    """The decoder projections a peft regex target reaches, and whether it skips some layers.

    peft matches a string ``target_modules`` with ``re.fullmatch`` against every module name
    (peft src/peft/tuners/tuners_utils.py ``check_target_module_exists``); axolotl hands a string
    ``lora_target_modules`` to ``LoraConfig`` as it is (src/axolotl/loaders/adapter.py
    ``_build_peft_lora_config`` @067b021c). The names tried are the usual decoder layouts.
    """
    try:
        rx = re.compile(pattern)
    except re.error:
        return [], False
    found: list[str] = []
    partial = False
    for leaf, parents in REGEX_PARENTS.items():
        hits = sum(_layer_hit(rx, i, parents, leaf) for i in range(REGEX_LAYERS))
        if hits:
            found.append(leaf)
            partial = partial or hits < REGEX_LAYERS
    return found, partial


def _layer_hit(rx: re.Pattern[str], i: int, parents: tuple[str, ...], leaf: str) -> bool:
    return any(
        rx.fullmatch(f"{pre}layers.{i}.{parent}.{leaf}") for pre in REGEX_PREFIXES for parent in parents
    )


def read_quant_storage(r: Reading, value: object, key: str) -> None:
    """A QLoRA ``bnb_4bit_quant_storage`` -> ``quant_storage`` (the dtype the packed 4-bit weights are stored
    in: FSDP / ZeRO-3 shard them only in the compute dtype); another value is noted, not read."""
    if value is None:
        return
    found = QUANT_STORAGE.get(value) if isinstance(value, str) else None
    if found is None:
        r.note(f"{key} {_short(value)} is not a storage dtype fitcheck knows; not read")
        return
    r.set("quant_storage", found, key)
