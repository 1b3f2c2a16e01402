"""``accelerate.yaml``: the accelerate config of a multi-GPU plan (DDP, the DeepSpeed plugin, FSDP1/FSDP2).

Keys: accelerate commands/config/config_args.py (``ClusterConfig``) and commands/launch.py (v1.15.0);
the layout follows TRL's shipped configs (trl/accelerate_configs/zero3.yaml, fsdp2.yaml). With a
``deepspeed.json`` beside it, only ``deepspeed_config_file`` (+ ``zero3_init_flag``) is written and
``mixed_precision`` is left to that file: accelerate refuses both ("When using `deepspeed_config_file`,
the following accelerate config variables will be ignored", utils/dataclasses.py). FSDP wraps each
decoder layer (TRANSFORMER_BASED_WRAP without a class list uses the model's ``_no_split_modules``)
and loads on rank 0 only (``fsdp_cpu_ram_efficient_loading``, which the host estimate assumes).
"""

from __future__ import annotations

from fitcheck.emitters.common import EmitContext, Item, chosen, comment_block, header, yaml_text
from fitcheck.emitters.launch import launch_line
from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.errors import OptionError
from fitcheck.planner.models import Plan

NAME = "accelerate.yaml"
TRAINER: str | None = None
DESCRIPTION = "accelerate config (multi-GPU, DeepSpeed plugin, FSDP1/FSDP2)"

MIXED = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
#: FSDP1 sharding strategy names (torch ShardingStrategy, accelerate FSDP_SHARDING_STRATEGY).
FSDP1_STRATEGY = {"fsdp": "FULL_SHARD", "fsdp-grad-op": "SHARD_GRAD_OP", "fsdp-hybrid": "HYBRID_SHARD"}


def check(plan: Plan, ctx: EmitContext) -> None:
    s = chosen(plan).setup
    if s.world_size == 1 and s.strategy is None:
        raise OptionError(
            f"{NAME} is for several GPUs; this plan runs on one (plan with --on 2x... or --gpus)"
        )
    if s.backend not in ("cuda", "rocm"):
        raise OptionError(f"{NAME}: multi-GPU runs need CUDA or ROCm, not {s.backend}")
    if s.strategy == "device-map":
        raise OptionError(
            f"{NAME}: device-map runs one process with no distributed engine to configure; emit hf.yaml, "
            "whose launch line starts it (python -m trl.scripts.sft --config hf.yaml)"
        )


def _deepspeed(plan: Plan, ctx: EmitContext) -> list[Item]:
    s = chosen(plan).setup
    stage = int(s.effective_strategy[-1])
    if "deepspeed.json" in ctx.files:
        cfg: dict[str, object] = {
            "deepspeed_config_file": ctx.files["deepspeed.json"],
            "zero3_init_flag": stage == 3,
            "deepspeed_multinode_launcher": "standard",
        }
        return [
            Item("distributed_type", "DEEPSPEED"),
            Item("deepspeed_config", cfg, "stage, offload, buckets"),
        ]
    cfg = {
        "zero_stage": stage,
        "offload_optimizer_device": "cpu" if s.offload != "none" else "none",
        "offload_param_device": "cpu" if s.offload == "all" else "none",
        "zero3_init_flag": stage == 3,
        "zero3_save_16bit_model": stage == 3,
        "deepspeed_multinode_launcher": "standard",
    }
    return [
        Item("distributed_type", "DEEPSPEED"),
        Item("deepspeed_config", cfg),
        Item("mixed_precision", MIXED[s.precision]),
    ]


def _fsdp(plan: Plan) -> list[Item]:
    s = chosen(plan).setup
    facts = STRATEGY_FACTS[s.effective_strategy]
    cfg: dict[str, object] = {
        "fsdp_version": s.fsdp_version,
        "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
    }
    if s.fsdp_version == 2:
        cfg["fsdp_reshard_after_forward"] = facts.reshard_after_forward
    else:
        cfg["fsdp_sharding_strategy"] = FSDP1_STRATEGY[s.effective_strategy]
        cfg["fsdp_backward_prefetch"] = "BACKWARD_PRE"
        cfg["fsdp_forward_prefetch"] = False
        cfg["fsdp_use_orig_params"] = s.method == "full"
        cfg["fsdp_sync_module_states"] = True
    cfg.update(
        {
            "fsdp_cpu_ram_efficient_loading": True,
            "fsdp_offload_params": s.offload == "all",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            # the HF Trainer refuses its own checkpointing beside FSDP's (trainer.py); hf.yaml leaves it off
            "fsdp_activation_checkpointing": s.grad_ckpt and s.trainer == "hf",
        }
    )
    items = [
        Item("distributed_type", "FSDP"),
        Item("fsdp_config", cfg),
        Item("mixed_precision", MIXED[s.precision]),
    ]
    if facts.hybrid and s.fsdp_version == 2:
        items.append(
            Item(
                "parallelism_config",
                {"parallelism_config_dp_replicate_size": s.nodes, "parallelism_config_dp_shard_size": s.gpus},
                "HSDP: shard within a node, replicate across nodes",
            )
        )
    return items


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def text(plan: Plan, ctx: EmitContext) -> str:
    check(plan, ctx)
    s = chosen(plan).setup
    engine = STRATEGY_FACTS[s.effective_strategy].engine
    items = [Item("compute_environment", "LOCAL_MACHINE"), Item("debug", False)]
    if engine == "deepspeed":
        items += _deepspeed(plan, ctx)
    elif engine == "fsdp":
        items += _fsdp(plan)
    else:
        items += [Item("distributed_type", "MULTI_GPU"), Item("mixed_precision", MIXED[s.precision])]
    items += [
        Item("machine_rank", 0, "set per node"),
        Item("num_machines", s.nodes),
        Item("num_processes", s.world_size, "all ranks, all nodes"),
        Item("main_training_function", "main"),
        Item("rdzv_backend", "static"),
        Item("same_network", True),
        Item("use_cpu", False),
    ]
    launch = launch_line(s, ctx.files) or f"accelerate launch --config_file {NAME} train.py"
    return comment_block(header(plan, ctx, "accelerate config", launch)) + yaml_text(items)
