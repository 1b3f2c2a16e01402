"""Keys that change a run's memory in a way fitcheck has no model for: a file that sets one is refused.

A trainer file that turns on a preference or RL trainer, a parallelism fitcheck does not shard by, a
low-rank or layer-wise optimizer, or quantization-aware training runs a different step than the one
fitcheck sizes. Sizing it anyway would print a number for another run (usually one that needs less
memory: a DPO step also holds a reference model and chosen + rejected rows), so the reader stops with one
line naming the key. Each row cites the trainer code that gives the key its meaning; found by running
every example config of axolotl, LLaMA-Factory and the alignment-handbook through ``--from``
(tests/data/from/SOURCES.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fitcheck.errors import InputError
from fitcheck.readers.base import Keys, _short


def _on(value: object) -> bool:
    """Set to anything but off: ``true``, a name, a non-empty mapping or list."""
    if isinstance(value, str):
        return value.strip().lower() not in ("", "false", "no", "none", "null", "0")
    return value not in (None, False, 0) and not (isinstance(value, (list, dict)) and not value)


def _over_one(value: object) -> bool:
    """A parallel degree above 1 (1, unset and ``auto`` split nothing)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 1


def _present(value: object) -> bool:
    """Any value: the key belongs to a layout fitcheck does not read."""
    return True


def _off(value: object) -> bool:
    """Set to off: ``false`` (a YAML boolean or its string)."""
    return value is False or (isinstance(value, str) and value.strip().lower() in ("false", "no", "0"))


def _not_sft(value: object) -> bool:
    """A LLaMA-Factory stage other than supervised fine-tuning and pre-training."""
    return value not in (None, "sft", "pt")


@dataclass(frozen=True)
class Unposed:
    """One key fitcheck cannot pose, the values that switch it on, what it does, and whose code says so."""

    key: str
    on: Callable[[object], bool]
    what: str
    source: str


_RL = "a preference/RL trainer (a reference model, chosen + rejected rows or sampled generations per step)"
_MEGATRON = (
    "a Megatron config (LLaMA-Factory runs it on Megatron with USE_MCA=1 or USE_MEGATRON_BRIDGE=1, its own "
    "parallelism, optimizer and kernels)"
)
_AX = "axolotl-ai-cloud/axolotl @067b021c"
_LF = "hiyouga/LLaMA-Factory @ff6d4d12"
_TRL = "huggingface/trl @f2cd5771"

#: format -> the keys its reader refuses, first match wins.
TABLE: dict[str, tuple[Unposed, ...]] = {
    "axolotl": (
        Unposed("rl", _on, _RL, f"{_AX} src/axolotl/utils/schemas/enums.py RLType, core/builders/rl.py"),
        Unposed(
            "reward_model",
            _on,
            "a reward model (sequence classification over chosen + rejected pairs)",
            f"{_AX} src/axolotl/core/builders/causal.py (AxolotlRewardTrainer)",
        ),
        Unposed(
            "process_reward_model",
            _on,
            "a process reward model (token classification, PRMTrainer)",
            f"{_AX} src/axolotl/core/builders/causal.py (PRMTrainer)",
        ),
        Unposed(
            "context_parallel_size",
            _over_one,
            "context parallelism (each GPU holds a slice of every sequence)",
            f"{_AX} src/axolotl/utils/schemas/config.py",
        ),
        Unposed(
            "tensor_parallel_size",
            _over_one,
            "tensor parallelism (each GPU holds a slice of every weight)",
            f"{_AX} src/axolotl/utils/schemas/config.py",
        ),
        Unposed(
            "sequence_parallel_degree",
            _over_one,
            "context parallelism (the old name of context_parallel_size)",
            f"{_AX} src/axolotl/utils/schemas/config.py",
        ),
        Unposed(
            "expert_parallel_size",
            _over_one,
            "expert parallelism (each GPU holds some of the experts)",
            f"{_AX} src/axolotl/integrations/expert_parallel",
        ),
        Unposed(
            "qat",
            _on,
            "quantization-aware training (fake-quantized layers)",
            f"{_AX} src/axolotl/utils/schemas/config.py",
        ),
        Unposed(
            "fp8",
            _on,
            "FP8 training (torchao float8 linear layers)",
            f"{_AX} src/axolotl/utils/schemas/config.py",
        ),
        Unposed(
            "unfrozen_parameters",
            _on,
            "training only the parameters these patterns match (the rest frozen)",
            f"{_AX} src/axolotl/utils/freeze.py",
        ),
        Unposed(
            "relora",
            _on,
            "ReLoRA (periodic merge and restart of the adapters)",
            f"{_AX} src/axolotl/monkeypatch/relora.py",
        ),
        Unposed(
            "lisa_n_layers",
            _on,
            "LISA (a few layers trained at a time)",
            f"{_AX} src/axolotl/utils/callbacks/lisa.py",
        ),
        Unposed(
            "use_eaft",
            _on,
            "the EAFT loss (its own function over the logits, temporaries fitcheck does not model)",
            f"{_AX} src/axolotl/core/builders/causal.py",
        ),
        Unposed(
            "diffusion",
            _on,
            "the diffusion language-model plugin (masked-denoising loss)",
            f"{_AX} src/axolotl/integrations/diffusion",
        ),
    ),
    "llamafactory": (
        Unposed(
            "stage",
            _not_sft,
            "a preference, reward-model or PPO stage (a reference model or a value head, chosen + rejected "
            "rows or sampled generations per step)",
            f"{_LF} src/llamafactory/hparams/finetuning_args.py stage, train/{{dpo,kto,rm,ppo}}",
        ),
        Unposed(
            "finetuning_type",
            lambda v: v == "freeze",
            "freeze tuning (the last layers trained in full, the rest frozen)",
            f"{_LF} src/llamafactory/model/adapter.py _setup_freeze_tuning",
        ),
        Unposed(
            "finetuning_type",
            lambda v: v == "oft",
            "OFT adapters (orthogonal fine-tuning)",
            f"{_LF} src/llamafactory/model/adapter.py _setup_lora_tuning (OFTConfig)",
        ),
        Unposed(
            "freeze_vision_tower",
            _off,
            "a trained vision tower (in full under finetuning_type full; with LoRA, lora_target all then "
            "takes the tower's linears too, projector and patch embedding left out)",
            f"{_LF} src/llamafactory/model/model_utils/misc.py find_all_linear_modules, visual.py "
            "get_forbidden_modules / patch_target_modules",
        ),
        Unposed(
            "freeze_multi_modal_projector",
            _off,
            "a trained multimodal projector (in full, or with LoRA on its linears)",
            f"{_LF} src/llamafactory/model/model_utils/visual.py get_forbidden_modules, patch_target_modules",
        ),
        Unposed(
            "freeze_language_model",
            _on,
            "a frozen language model (only the vision tower or projector trains, or with LoRA no adapter in "
            "the language model)",
            f"{_LF} src/llamafactory/hparams/finetuning_args.py (default False), model/model_utils/visual.py "
            "get_forbidden_modules / patch_target_modules",
        ),
        Unposed(
            "export_dir",
            _on,
            "an export (merge) config, not a training run",
            f"{_LF} src/llamafactory/hparams/model_args.py ExportArguments",
        ),
        Unposed(
            "infer_backend",
            _on,
            "an inference config, not a training run",
            f"{_LF} src/llamafactory/hparams/model_args.py",
        ),
        Unposed(
            "use_asft_loss",
            _on,
            "ASFT (a reference model's logits beside the policy's every step)",
            f"{_LF} src/llamafactory/train/sft/workflow.py create_ref_model, sft/trainer.py compute_loss",
        ),
        Unposed(
            "use_dft_loss",
            _on,
            "the DFT loss (its own function over the logits, temporaries fitcheck does not model)",
            f"{_LF} src/llamafactory/train/sft/trainer.py, train/trainer_utils.py dft_loss_func",
        ),
        Unposed(
            "use_eaft_loss",
            _on,
            "the EAFT loss (its own function over the logits, temporaries fitcheck does not model)",
            f"{_LF} src/llamafactory/train/sft/trainer.py, train/trainer_utils.py eaft_loss_func",
        ),
        Unposed(
            "use_galore",
            _on,
            "the GaLore optimizer (low-rank projected states)",
            f"{_LF} src/llamafactory/train/trainer_utils.py",
        ),
        Unposed(
            "use_apollo",
            _on,
            "the APOLLO optimizer (low-rank projected states)",
            f"{_LF} src/llamafactory/train/trainer_utils.py",
        ),
        Unposed(
            "use_badam",
            _on,
            "BAdam (one block of layers trained at a time)",
            f"{_LF} src/llamafactory/train/trainer_utils.py",
        ),
        Unposed(
            "use_adam_mini",
            _on,
            "the Adam-mini optimizer (one second moment per block)",
            f"{_LF} src/llamafactory/train/trainer_utils.py",
        ),
        Unposed("use_muon", _on, "the Muon optimizer", f"{_LF} src/llamafactory/train/trainer_utils.py"),
        Unposed(
            "use_llama_pro",
            _on,
            "LLaMA Pro (expanded blocks, the rest frozen)",
            f"{_LF} src/llamafactory/model/adapter.py",
        ),
        Unposed("mixture_of_depths", _on, "mixture of depths", f"{_LF} src/llamafactory/model/loader.py"),
        Unposed(
            "use_kt",
            _on,
            "KTransformers (experts kept on the CPU)",
            f"{_LF} src/llamafactory/model/loader.py",
        ),
        Unposed("fp8", _on, "FP8 training", f"{_LF} src/llamafactory/hparams/training_args.py"),
        Unposed(
            "tensor_model_parallel_size",
            _present,
            _MEGATRON,
            f"{_LF} src/llamafactory/hparams/parser.py get_train_args, hparams/megatron_bridge_args.py",
        ),
        Unposed(
            "pipeline_model_parallel_size",
            _present,
            _MEGATRON,
            f"{_LF} src/llamafactory/hparams/parser.py get_train_args, hparams/megatron_bridge_args.py",
        ),
        Unposed(
            "use_distributed_optimizer",
            _present,
            _MEGATRON,
            f"{_LF} src/llamafactory/hparams/parser.py get_train_args, hparams/megatron_bridge_args.py",
        ),
    ),
    # accelerate's parallelism_config: readers/accelerate.py `_parallelism` refuses TP/CP/SP naming the size
    "trl": (
        Unposed(
            "beta", _on, f"a DPO/ORPO/KTO config: {_RL}", f"{_TRL} trl/trainer/dpo_config.py, orpo_config.py"
        ),
        Unposed("max_prompt_length", _on, f"a preference config: {_RL}", f"{_TRL} trl/trainer/dpo_config.py"),
        Unposed("num_generations", _on, f"a GRPO/RLOO config: {_RL}", f"{_TRL} trl/trainer/grpo_config.py"),
        Unposed(
            "reward_funcs",
            _on,
            f"a GRPO/RLOO config (its reward functions): {_RL}",
            f"{_TRL} trl/scripts/grpo.py, rloo.py GRPOScriptArguments / RLOOScriptArguments",
        ),
        Unposed("desirable_weight", _on, f"a KTO config: {_RL}", f"{_TRL} trl/trainer/kto_config.py"),
        Unposed(
            "center_rewards_coefficient",
            _on,
            "a reward model config (sequence classification over chosen + rejected pairs)",
            f"{_TRL} trl/trainer/reward_config.py",
        ),
    ),
}


def refuse(k: Keys, fmt: str, path: str) -> None:
    """Raise `InputError` naming the first key of ``fmt``'s table the file switches on."""
    for row in TABLE.get(fmt, ()):
        if row.key in k.data and row.on(k.data[row.key]):
            raise InputError(
                f"{path}: {row.key}: {_short(k.data[row.key])} means {row.what}; fitcheck has no memory "
                "model for it and will not size another run in its place"
            )
