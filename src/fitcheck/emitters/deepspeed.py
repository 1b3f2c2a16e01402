"""``deepspeed.json``: the DeepSpeed config of a ZeRO plan (stage, offload, buckets).

Keys and defaults: deepspeed/runtime/zero/config.py and offload_config.py (v0.19.8). Values the HF
integration fills from the model and the TrainingArguments are ``"auto"`` (transformers
integrations/deepspeed.py: batch sizes, accumulation, clipping, bf16/fp16, and the three buckets
derived from the hidden size); the engine models exactly those values (docs/distributed.md#buckets).
No ``optimizer`` block: the Trainer builds its own torch AdamW, which ZeRO accepts.
"""

from __future__ import annotations

import json

from fitcheck.emitters.common import EmitContext, chosen, header
from fitcheck.emitters.launch import launch_line
from fitcheck.engine.distributed import ZERO_EMITTED
from fitcheck.errors import OptionError
from fitcheck.facts.deepspeed import ZERO_DEFAULTS
from fitcheck.planner.models import Plan

NAME = "deepspeed.json"
TRAINER: str | None = None
DESCRIPTION = "DeepSpeed ZeRO config (stage, offload, buckets; HF 'auto' values)"


def check(plan: Plan, ctx: EmitContext) -> None:
    s = chosen(plan).setup
    if s.strategy == "device-map":
        raise OptionError(
            f"{NAME} configures DeepSpeed ZeRO; device-map runs one process without it (emit hf.yaml)"
        )
    if not s.effective_strategy.startswith("zero"):
        raise OptionError(
            f"{NAME} configures DeepSpeed ZeRO; this plan uses {s.effective_strategy} "
            "(emit accelerate.yaml, or plan with --strategy zero1|zero2|zero3)"
        )


def config(plan: Plan) -> dict[str, object]:
    """The DeepSpeed config as a mapping (what json.dumps writes)."""
    s = chosen(plan).setup
    stage = int(s.effective_strategy[-1])
    zero: dict[str, object] = {
        "stage": stage,
        "overlap_comm": ZERO_EMITTED["overlap_comm"] if s.zero_overlap_comm is None else s.zero_overlap_comm,
        "contiguous_gradients": ZERO_EMITTED["contiguous_gradients"],
        # --zero-bucket-size: the size the plan was sized with; else HF fills hidden_size^2
        "reduce_bucket_size": "auto" if s.zero_bucket_size is None else s.zero_bucket_size,
        "allgather_bucket_size": ZERO_EMITTED["allgather_bucket_size"],
    }
    if s.offload in ("optimizer", "all"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if stage == 3:
        zero.update(
            {
                "stage3_prefetch_bucket_size": "auto",
                "stage3_param_persistence_threshold": "auto",
                "stage3_max_live_parameters": ZERO_DEFAULTS["stage3_max_live_parameters"],
                "stage3_max_reuse_distance": 1_000_000_000,
                "sub_group_size": ZERO_DEFAULTS["sub_group_size"],
                "stage3_gather_16bit_weights_on_model_save": True,
            }
        )
        if s.offload == "all":
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "train_batch_size": "auto",
        "gradient_clipping": "auto",
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
    }


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def text(plan: Plan, ctx: EmitContext) -> str:
    """The JSON text. JSON has no comments, so the header goes under ``_fitcheck`` (DeepSpeed and the
    HF integration ignore top-level keys they do not know)."""
    check(plan, ctx)
    launch = launch_line(chosen(plan).setup, ctx.files) or ""
    doc: dict[str, object] = {"_fitcheck": header(plan, ctx, "DeepSpeed config", launch)}
    doc.update(config(plan))
    return json.dumps(doc, indent=2) + "\n"
