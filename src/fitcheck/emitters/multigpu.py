"""Multi-GPU keys of the trainer files: how hf.yaml, axolotl.yaml and llamafactory.yaml point at the
DeepSpeed and accelerate files of the same plan, in each trainer's own vocabulary.

* TRL/HF: ``deepspeed: deepspeed.json`` (TrainingArguments.deepspeed); FSDP comes from accelerate.yaml
  (``--accelerate_config``); QLoRA: ``bnb_4bit_quant_storage`` (TRL ModelConfig); device-map:
  ``model_init_kwargs: {device_map: auto}`` (SFTConfig, passed to ``from_pretrained`` by TRL 1.16's
  ``SFTTrainer``), one process.
* axolotl: ``deepspeed:``; FSDP in its own ``fsdp_version`` + ``fsdp_config`` keys without the
  ``fsdp_`` prefix (axolotl docs/multi-gpu.qmd); QLoRA: ``bnb_config_kwargs.bnb_4bit_quant_storage``.
* LLaMA-Factory: ``deepspeed:`` (its arguments extend HF's Seq2SeqTrainingArguments); FSDP from an
  accelerate config (its examples/accelerate/fsdp_config.yaml); it sets the quant storage itself.
"""

from __future__ import annotations

from fitcheck.emitters.common import EmitContext, Item, chosen
from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.errors import OptionError
from fitcheck.planner import rules as R
from fitcheck.planner.models import Plan

#: Trainer files that can run a device-map plan (planner rule ``device-map``).
DEVICE_MAP_TRAINERS = R.DEVICE_MAP_TRAINERS
#: Why hf.yaml writes ``device_map: auto`` although TRL 1.16's ``create_model_from_path`` defaults to it on
#: a GPU: the file says what the plan assumes, and a MULTI_GPU/DEEPSPEED launch drops it (sft_trainer.py).
DEVICE_MAP_WHY = "layers split over the GPUs in one process (the placement the estimate assumes)"
TORCH_DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "uint8": "uint8"}


def engine(plan: Plan) -> str | None:
    s = chosen(plan).setup
    return STRATEGY_FACTS[s.effective_strategy].engine if s.distributed else None


def check(plan: Plan, ctx: EmitContext, trainer: str, what: str) -> None:
    """Refuse a multi-GPU plan whose trainer file would not find its engine config."""
    engine_ = engine(plan)
    if engine_ == "accelerate-device-map" and trainer not in DEVICE_MAP_TRAINERS:
        raise OptionError(
            f"{what} cannot express --strategy device-map: only TRL's trl sft (hf.yaml) is read to run a "
            "dispatched model in one process; emit hf.yaml, or plan another --strategy"
        )
    if engine_ == "deepspeed" and "deepspeed.json" not in ctx.files:
        raise OptionError(
            f"{what} for {chosen(plan).setup.effective_strategy} points at a DeepSpeed config: add "
            "--emit deepspeed.json"
        )
    if engine_ == "fsdp" and trainer != "axolotl" and "accelerate.yaml" not in ctx.files:
        raise OptionError(f"{what} runs FSDP through accelerate: add --emit accelerate.yaml")


def quant_storage(plan: Plan) -> str | None:
    """The bnb_4bit_quant_storage to write: the compute dtype when a sharding strategy runs QLoRA."""
    s = chosen(plan).setup
    if s.method != "qlora" or not s.distributed:
        return None
    if not STRATEGY_FACTS[s.effective_strategy].shards_params and s.quant_storage is None:
        return None
    return TORCH_DTYPE[s.quant_storage or s.precision]


def items(plan: Plan, ctx: EmitContext, trainer: str) -> list[Item]:
    """The keys to add to a trainer file (empty on one GPU)."""
    engine_ = engine(plan)
    s = chosen(plan).setup
    out: list[Item] = []
    if engine_ == "deepspeed":
        out.append(Item("deepspeed", ctx.files["deepspeed.json"], f"DeepSpeed {s.effective_strategy}"))
    if engine_ == "accelerate-device-map":
        out.append(Item("model_init_kwargs", {"device_map": "auto"}, DEVICE_MAP_WHY))
    qs = quant_storage(plan)
    if trainer == "hf" and qs:
        out.append(Item("bnb_4bit_quant_storage", qs, "4-bit weights shard only in the compute dtype"))
    if trainer == "axolotl":
        if qs:
            out.append(Item("bnb_config_kwargs", {"bnb_4bit_quant_storage": qs}, "shardable 4-bit storage"))
        if engine_ == "fsdp":
            facts = STRATEGY_FACTS[s.effective_strategy]
            cfg: dict[str, object] = {
                "offload_params": s.offload == "all",
                "cpu_ram_efficient_loading": True,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "state_dict_type": "SHARDED_STATE_DICT",
                "reshard_after_forward": facts.reshard_after_forward,
                "activation_checkpointing": s.grad_ckpt,
            }
            out += [Item("fsdp_version", s.fsdp_version), Item("fsdp_config", cfg)]
    return out
