"""Which trainer wrote a config: from the file's syntax and the keys only that trainer uses.

Each rule names keys a trainer's parser owns (trainer_keys lists); the first rule that matches wins,
in an order where a more specific trainer comes before a more general one (LLaMA-Factory and TRL
both take ``model_name_or_path``; LLaMA-Factory's own keys decide). ``--from-format`` overrides.
"""

from __future__ import annotations

from collections.abc import Callable

from fitcheck.readers.base import Doc


def _any(*keys: str) -> Callable[[Doc], bool]:
    return lambda d: any(k in d for k in keys)


def _component(d: Doc) -> bool:
    return any(isinstance(v, dict) and "_component_" in v for v in d.values())


def _kohya_table(d: Doc) -> bool:
    flat = dict(d)
    for v in d.values():
        if isinstance(v, dict):
            flat.update(v)
    return any(
        k in flat
        for k in (
            "network_module",
            "pretrained_model_name_or_path",
            "train_batch_size",
            "mixed_precision",
            "dataset_config",
            "network_dim",
        )
    )


def _mlx(d: Doc) -> bool:
    """mlx-lm's own keys; ``max_seq_length`` only beside mlx-lm's ``model`` (TRL before 0.20 and the
    alignment-handbook recipes also write ``max_seq_length``, beside ``model_name_or_path``)."""
    if any(k in d for k in ("fine_tune_type", "lora_parameters", "grad_checkpoint", "iters")):
        return True
    return "max_seq_length" in d and "model" in d and "model_name_or_path" not in d


def _accelerate(d: Doc) -> bool:
    """accelerate's own keys; ``num_processes`` only without a model: a ``trl <command> --config`` file may
    carry it (and ``accelerate_config``) for the ``accelerate launch`` TRL starts (huggingface/trl
    docs/source/clis.md, trl/cli/commands/training.py @f2cd5771)."""
    if any(k in d for k in ("distributed_type", "compute_environment")):
        return True
    return "num_processes" in d and "model_name_or_path" not in d


#: litgpt ``setup`` arguments (finetune/lora.py, full.py @26857050) beside ``checkpoint_dir``; ``train`` is
#: litgpt's ``TrainArgs`` block (torchtune's ``checkpoint_dir`` sits inside ``checkpointer``, and torchtune
#: files are matched first by their ``_component_`` nodes).
LITGPT_KEYS = (
    "lora_r",
    "lora_query",
    "lora_value",
    "quantize",
    "precision",
    "devices",
    "num_nodes",
    "out_dir",
)


def _litgpt(d: Doc) -> bool:
    """litgpt: a top-level ``checkpoint_dir`` with its ``train`` block (``micro_batch_size`` /
    ``global_batch_size``) or one of its ``setup`` arguments; or ``litgpt pretrain``'s ``train`` block beside
    its ``model_name`` / ``initial_checkpoint_dir`` (pretrain.py ``setup``), which the reader refuses."""
    train = d.get("train")
    batch = isinstance(train, dict) and any(k in train for k in ("micro_batch_size", "global_batch_size"))
    if "checkpoint_dir" not in d:  # litgpt pretrain's setup (model_name, initial_checkpoint_dir): refused
        return batch and any(k in d for k in ("model_name", "initial_checkpoint_dir"))
    return batch or any(k in d for k in LITGPT_KEYS)


#: (syntax, keys that only that layout has, the line that refuses it): configs of a trainer layout no
#: reader reads, told apart before the rules so they are not read as another trainer's. LLaMA-Factory v1
#: (``llamafactory/v1/config/*.py`` @ff6d4d12: ``model``, ``peft_config``, ``dist_config`` plugin blocks)
#: shares ``micro_batch_size`` with axolotl.
UNREAD: tuple[tuple[str, tuple[str, ...], str], ...] = (
    (
        "yaml",
        ("peft_config", "dist_config", "kernel_config", "model_class", "train_dataset", "optim_config"),
        "a LLaMA-Factory v1 config (peft_config / dist_config / kernel_config plugin blocks); fitcheck reads "
        "the llamafactory-cli train layout only: give MODEL and the setup as flags",
    ),
)


def unread(data: Doc, syntax: str) -> str | None:
    """Why a config of a layout no reader reads is refused, or None."""
    for rule_syntax, keys, why in UNREAD:
        if rule_syntax == syntax and any(k in data for k in keys):
            return why
    return None


#: (syntax, format, test) in the order they are tried.
RULES: tuple[tuple[str, str, Callable[[Doc], bool]], ...] = (
    ("toml", "kohya", _kohya_table),
    ("json", "kohya_ss", _any("LoRA_type", "max_resolution", "network_dim", "sdxl")),
    # HF TrainingArguments / TRL SFTConfig as JSON (HfArgumentParser.parse_json_file): before DeepSpeed,
    # whose JSON shares bf16 / fp16 but never names a model or a per-device batch
    ("json", "trl", _any("model_name_or_path", "per_device_train_batch_size", "use_peft")),
    (
        "json",
        "deepspeed",
        _any(
            "zero_optimization",
            "train_micro_batch_size_per_gpu",
            "train_batch_size",
            "bf16",
            "fp16",
            "zero_allow_untested_optimizer",
        ),
    ),
    # accelerate's config as JSON (commands/config/config_args.py load_config_from_file: a .json file is
    # read with json.load), after DeepSpeed's, which never names a distributed_type
    ("json", "accelerate", _any("distributed_type", "compute_environment")),
    ("yaml", "axolotl", _any("base_model", "micro_batch_size", "sequence_len", "adapter")),
    ("yaml", "accelerate", _accelerate),
    ("yaml", "torchtune", _component),
    ("yaml", "litgpt", _litgpt),
    ("yaml", "mlx", _mlx),
    (
        "yaml",
        "llamafactory",
        _any(
            "finetuning_type",
            "stage",
            "cutoff_len",
            "lora_target",
            "quantization_bit",
            "template",
            "flash_attn",
            "disable_gradient_checkpointing",
        ),
    ),
    ("yaml", "trl", _any("model_name_or_path", "use_peft", "max_length", "dataset_name", "lora_r")),
)


def detect(data: Doc, syntax: str) -> str | None:
    """The format of a parsed config, or None when no rule matches."""
    for rule_syntax, fmt, test in RULES:
        if rule_syntax == syntax and test(data):
            return fmt
    return None
