"""What each trainer turns on when its config says nothing: one table, each row cited.

Two scopes. ``trainer`` rows (gradient checkpointing, optimizer, precision) apply whenever the
trainer is named, by ``--trainer X`` or by a ``--from`` file: they are how that trainer runs unless
told otherwise. ``file`` rows apply only when reading that trainer's file (a batch size a file
leaves out is the trainer's, but ``--trainer hf`` alone should not change fitcheck's batch of 1).

Keys are reader formats (``trl`` is the TRL SFT config, whose defaults differ from the plain
transformers Trainer, ``hf``); `defaults_for` maps a ``--trainer`` name to its row set.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from fitcheck.readers.base import Value
from fitcheck.vocab import LMF_ALL

Scope = Literal["trainer", "file"]


@dataclass(frozen=True)
class Default:
    """One trainer default: the setup field, its value in fitcheck's vocabulary, scope and source."""

    field: str
    value: Value
    scope: Scope
    source: str


_TA = (
    "transformers src/transformers/training_args.py TrainingArguments "
    "(5.x; tests/data/trainer_keys/hf_training_arguments.txt)"
)
_TRL = "trl trl/trainer/sft_config.py SFTConfig, trl 1.16.0 (tests/data/trainer_keys/trl_sft_config.txt)"
_TRL_MC = (
    "trl trl/trainer/model_config.py ModelConfig, trl 1.16.0 (tests/data/trainer_keys/trl_model_config.txt)"
)
_AXO = (
    "axolotl src/axolotl/utils/schemas/config.py, training.py @067b021c "
    "(tests/data/trainer_keys/axolotl_keys.txt)"
)
_LMF = (
    "LLaMA-Factory src/llamafactory/hparams/*_args.py @ff6d4d12 "
    "(tests/data/trainer_keys/llamafactory_keys.txt)"
)
_MLX = "mlx-lm mlx_lm/lora.py CONFIG_DEFAULTS @d78bf58e (tests/data/trainer_keys/mlx_lm_lora_keys.txt)"
_TT = "pytorch/torchtune recipes/full_finetune_single_device.py, lora_finetune_single_device.py @bd2a0fc7"
_LIT = (
    "Lightning-AI/litgpt litgpt/finetune/lora.py, full.py setup() @26857050 (the same at @00af8b0d; "
    "tests/data/from/litgpt/README.md)"
)
_KOHYA = "kohya-ss/sd-scripts library/train_util.py add_training_arguments, add_optimizer_arguments @48d368f"

TABLE: dict[str, tuple[Default, ...]] = {
    "hf": (
        Default("grad_ckpt", False, "trainer", f"gradient_checkpointing defaults to off: {_TA}"),
        Default(
            "optimizer", "adamw", "trainer", f"optim defaults to adamw_torch_fused (torch >= 2.8): {_TA}"
        ),
        Default(
            "precision",
            "bf16",
            "trainer",
            "bf16/fp16 default off, and transformers 5 from_pretrained(dtype='auto') keeps a bf16 "
            f"checkpoint in bf16: {_TA}",
        ),
        Default("batch_size", 8, "file", f"per_device_train_batch_size defaults to 8: {_TA}"),
        Default("grad_accum", 1, "file", f"gradient_accumulation_steps defaults to 1: {_TA}"),
    ),
    "trl": (
        Default("grad_ckpt", True, "trainer", f"SFTConfig turns gradient_checkpointing on: {_TRL}"),
        Default("optimizer", "adamw", "trainer", f"optim adamw_torch_fused (TrainingArguments): {_TA}"),
        Default("precision", "bf16", "trainer", f"SFTConfig sets bf16 = not fp16 when bf16 is unset: {_TRL}"),
        Default(
            "master_weights",
            True,
            "file",
            "ModelConfig dtype defaults to float32 and trl/scripts/sft.py passes it to from_pretrained, "
            f"so bf16 runs as AMP over fp32 weights (checked in trl 1.16.0): {_TRL_MC}",
        ),
        Default("batch_size", 8, "file", f"per_device_train_batch_size defaults to 8: {_TA}"),
        Default("seq_len", 1024, "file", f"max_length defaults to 1024: {_TRL}"),
        Default(
            "loss",
            "trl",
            "file",
            "SFTTrainer.compute_loss calls model(..., fused_lm_head=True), installed by add_fused_lm_head "
            "(log-probabilities from lm_head tiles, no logits; with use_liger_kernel too, whose fused "
            "cross-entropy it switches off): trl 1.16.0 trl/trainer/sft_trainer.py, trl/trainer/utils.py",
        ),
        Default("lora_rank", 16, "file", f"lora_r defaults to 16: {_TRL_MC}"),
        Default("lora_alpha", 32.0, "file", f"lora_alpha defaults to 32: {_TRL_MC}"),
        Default("lora_dropout", 0.05, "file", f"lora_dropout defaults to 0.05: {_TRL_MC}"),
        Default(
            "lora_targets",
            "q_proj,v_proj",
            "file",
            "lora_target_modules unset: peft's per-model default, q_proj and v_proj for Llama, "
            "Mistral, Qwen2 and Gemma (peft utils/constants.py "
            "TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)",
        ),
        Default(
            "double_quant",
            False,
            "file",
            f"use_bnb_nested_quant defaults to false: {_TRL_MC}",
        ),
    ),
    "axolotl": (
        Default("grad_ckpt", False, "trainer", f"gradient_checkpointing defaults to false: {_AXO}"),
        Default("optimizer", "adamw", "trainer", f"optimizer defaults to adamw_torch_fused: {_AXO}"),
        Default(
            "precision", "bf16", "trainer", f"bf16 defaults to 'auto' (bf16 where the GPU has it): {_AXO}"
        ),
        Default("batch_size", 1, "file", f"micro_batch_size defaults to 1: {_AXO}"),
        Default("seq_len", 512, "file", f"sequence_len defaults to 512: {_AXO}"),
        Default("lora_dropout", 0.0, "file", f"lora_dropout defaults to 0.0: {_AXO}"),
    ),
    "llamafactory": (
        Default(
            "grad_ckpt",
            True,
            "trainer",
            f"disable_gradient_checkpointing defaults to false, so checkpointing is on "
            f"(model/model_utils/checkpointing.py): {_LMF}",
        ),
        Default(
            "optimizer",
            "adamw",
            "trainer",
            f"optim: the TrainingArguments default (adamw_torch_fused): {_TA}",
        ),
        Default(
            "precision",
            "bf16",
            "trainer",
            "without bf16/fp16 the compute dtype is inferred, bf16 first (extras/misc.py infer_optim_dtype, "
            f"model/patcher.py): {_LMF}",
        ),
        Default("batch_size", 8, "file", f"per_device_train_batch_size defaults to 8: {_TA}"),
        Default("seq_len", 2048, "file", f"cutoff_len defaults to 2048: {_LMF}"),
        Default("lora_rank", 8, "file", f"lora_rank defaults to 8 (lora_alpha then 2 x rank): {_LMF}"),
        Default(
            "lora_targets",
            LMF_ALL,
            "file",
            f"lora_target defaults to all, its find_all_linear_modules (llamafactory-all): {_LMF}",
        ),
        Default("double_quant", True, "file", f"double_quantization defaults to true: {_LMF}"),
    ),
    "torchtune": (
        Default(
            "grad_ckpt",
            False,
            "trainer",
            f"enable_activation_checkpointing is read with cfg.get(..., False): {_TT}",
        ),
    ),
    "mlx": (
        Default("grad_ckpt", False, "trainer", f"grad_checkpoint defaults to false: {_MLX}"),
        Default(
            "optimizer", "adamw", "trainer", f"optimizer defaults to adam (same two states as AdamW): {_MLX}"
        ),
        Default(
            "double_quant",
            False,
            "trainer",
            "MLX's 4-bit format keeps a scale and a bias per group, with no second quantization "
            "(ml-explore/mlx python/mlx/nn/layers/quantized.py QuantizedLinear)",
        ),
        Default("batch_size", 4, "file", f"batch_size defaults to 4: {_MLX}"),
        Default("seq_len", 2048, "file", f"max_seq_length defaults to 2048: {_MLX}"),
        Default("lora_rank", 8, "file", f"lora_parameters.rank defaults to 8: {_MLX}"),
        Default(
            "lora_alpha", 160.0, "file", f"lora_parameters.scale defaults to 20 (alpha = 20 x rank 8): {_MLX}"
        ),
        Default(
            "lora_targets", "all-linear", "file", f"lora_parameters.keys unset: every linear layer: {_MLX}"
        ),
    ),
    "litgpt": (
        Default("batch_size", 1, "file", f"train=TrainArgs(micro_batch_size=1, ...): {_LIT}"),
        Default("lora_rank", 8, "file", f"lora_r defaults to 8: {_LIT}"),
        Default("lora_alpha", 16.0, "file", f"lora_alpha defaults to 16: {_LIT}"),
        Default("lora_dropout", 0.05, "file", f"lora_dropout defaults to 0.05: {_LIT}"),
        Default(
            "lora_targets",
            "q_proj,v_proj",
            "file",
            f"lora_query and lora_value default to true, lora_key/projection/mlp/head to false: {_LIT}",
        ),
    ),
    "kohya": (
        Default("grad_ckpt", False, "trainer", f"gradient_checkpointing is a store_true flag: {_KOHYA}"),
        Default("optimizer", "adamw", "trainer", f"optimizer_type '' means AdamW (get_optimizer): {_KOHYA}"),
        Default("precision", "fp32", "trainer", f"mixed_precision defaults to 'no': {_KOHYA}"),
        Default("batch_size", 1, "file", f"train_batch_size defaults to 1: {_KOHYA}"),
        Default("lora_alpha", 1.0, "file", f"network_alpha defaults to 1: {_KOHYA}"),
        Default(
            "attn",
            "eager",
            "file",
            f"no sdpa, xformers or mem_eff_attn flag: the plain attention (replace_unet_modules): {_KOHYA}",
        ),
    ),
}

#: ``--trainer`` name -> the row set its defaults come from (TRL's file is fitcheck's ``hf`` format,
#: but ``--trainer hf`` names the transformers Trainer itself).
TRAINER_ROWS: dict[str, str] = {
    "hf": "hf",
    "axolotl": "axolotl",
    "llamafactory": "llamafactory",
    "torchtune": "torchtune",
    "mlx": "mlx",
    "kohya": "kohya",
}


def defaults_for(row: str | None, scopes: tuple[Scope, ...] = ("trainer",)) -> dict[str, Default]:
    """The defaults of a row set (a reader format or a ``--trainer`` name) in the given scopes."""
    if row is None:
        return {}
    rows = TABLE.get(row) or TABLE.get(TRAINER_ROWS.get(row, ""), ())
    return {d.field: d for d in rows if d.scope in scopes}
