"""``hf.yaml``: one file for ``trl sft --config hf.yaml`` (TRL's ScriptArguments + SFTConfig + ModelConfig).

TRL's parser reads model loading (``dtype``, ``attn_implementation``), PEFT (``use_peft``, ``lora_*``),
4-bit quantization (``load_in_4bit``, ``bnb_4bit_quant_type``, ``use_bnb_nested_quant``) and every
``SFTConfig``/``TrainingArguments`` field from one flat YAML; an unknown key reaches ``accelerate
launch`` and stops the run (trainer_formats.md 2.3). Only keys every transformers 5.x and TRL 1.x
release accepts are written: ``gradient_checkpointing`` (not 5.23's ``activation_checkpointing``),
no ``warmup_ratio``/``logging_dir``/``overwrite_output_dir`` (removed in 5.x), both ``bf16`` and
``fp16`` explicitly (SFTConfig's ``bf16`` default follows ``fp16``), and ``gradient_checkpointing``
explicitly (SFTConfig turns it on by default).
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.emitters import multigpu
from fitcheck.emitters.common import (
    EmitContext,
    Item,
    chosen,
    comment_block,
    epochs,
    header,
    integer_alpha,
    learning_rate,
    lora_modules,
    model_ref,
    run_name,
    yaml_text,
)
from fitcheck.emitters.launch import TRL_SFT_ONE_PROCESS
from fitcheck.engine.regimes import kbit_base
from fitcheck.errors import OptionError
from fitcheck.facts.hf_optim import HF_OPTIM_WRITTEN, optim_written
from fitcheck.facts.loss_keys import LOSS_SWITCHES, LOSS_WORDS
from fitcheck.models import LlmSetup
from fitcheck.planner import kernels
from fitcheck.planner.models import Plan

NAME = "hf.yaml"
TRAINER = "hf"
DESCRIPTION = "TRL `trl sft --config` file (transformers Trainer, PEFT, bitsandbytes)"

#: fitcheck optimizer -> TrainingArguments.optim, from the one table of transformers' names.
OPTIM = HF_OPTIM_WRITTEN
#: fitcheck attention -> attn_implementation (transformers AttentionInterface names).
ATTN = {"flash": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"}
DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
#: A public chat dataset TRL's own examples use; replace it with yours.
DATASET = "trl-lib/Capybara"


#: Kernels a format runs without a key: hf.yaml is run by TRL 1.16's SFTTrainer, whose loss is its fused
#: LM head (engine/loss.py ``_trl``).
OWN_LOSS: dict[str, str] = {"hf": "trl"}


#: What each HF-Trainer-based format writes to run a cross-entropy kernel other than the trainer's own
#: (unset or ``standard``: nothing is written), derived from `fitcheck.facts.loss_keys.LOSS_SWITCHES`
#: (the readers map the same keys back); a kernel without a row is refused. A format with a loss of its
#: own (`OWN_LOSS`) writes none: its runner keeps that loss whatever the keys say.
LOSS_ITEMS: dict[str, dict[str, tuple[Item, ...]]] = {
    fmt: {
        loss: (
            *([Item("plugins", [plugin])] if plugin else []),
            Item(key, True, LOSS_WORDS[loss]),
        )
        for loss, (key, plugin) in switches.items()
    }
    for fmt, switches in LOSS_SWITCHES.items()
    if fmt not in OWN_LOSS
}


def loss_items(s: LlmSetup, trainer_name: str) -> list[Item]:
    """The keys that run the setup's cross-entropy kernel (`LOSS_ITEMS`; `check` refused the rest)."""
    if s.loss in (None, "standard") or trainer_name in OWN_LOSS:
        return []
    return list(LOSS_ITEMS[trainer_name][s.loss])


def _check_loss(s: LlmSetup, trainer_name: str, what: str) -> None:
    """A format with a loss of its own (`OWN_LOSS`: hf.yaml, whose ``trl sft`` scores every token through
    TRL's fused LM head, ``use_liger_kernel`` too) runs that loss only: a plan for it, or for the whole
    logits (``--trainer hf``'s own loss, more than the head holds), is written; the others run theirs and
    the kernels their keys switch on (`LOSS_ITEMS`)."""
    own = OWN_LOSS.get(trainer_name)
    if own is not None:
        # a plan for the whole logits (unset, standard) is written too: the head needs less than it counts
        if s.loss not in (None, "standard", own):
            raise OptionError(
                f"{what} is run by TRL 1.16's SFTTrainer, whose loss is its fused LM head (--loss {own}); "
                f"it cannot run --loss {s.loss}"
            )
        return
    losses = LOSS_ITEMS[trainer_name]
    if s.loss not in (None, "standard", *losses):
        offered = " or ".join(["standard", *losses])
        raise OptionError(f"{what} cannot select --loss {s.loss}; it offers {offered}")


def optim_name(s: LlmSetup) -> str:
    """The optim name written for the setup's optimizer and AdamW step (fitcheck.facts.hf_optim says
    why fused AdamW when no step is asked)."""
    return optim_written(s.optimizer, s.optimizer_impl)


def check(
    plan: Plan,
    ctx: EmitContext,
    trainer_name: str = TRAINER,
    what: str = NAME,
    attn: Mapping[str, str] | None = None,
    attn_hint: str = "; transformers offers flash, sdpa or eager",
) -> None:
    """Refuse a plan this format cannot express.

    The HF-Trainer-based formats (axolotl, LLaMA-Factory) share these checks with their own regime
    name, attention table and hint.
    """
    s = chosen(plan).setup
    if s.trainer != trainer_name:
        raise OptionError(
            f"{what} runs the {trainer_name} regime; this plan was made for --trainer {s.trainer}"
        )
    if s.attn not in (ATTN if attn is None else attn):
        raise OptionError(f"{what} cannot select --attn {s.attn}{attn_hint}")
    why = kernels.refusal(ctx.arch, trainer_name, s.backend, None, s.attn)
    if why is not None:
        raise OptionError(f"{what}: {why}")
    why = kernels.precision_refusal(trainer_name, s.method, s.precision)
    if why is not None:
        raise OptionError(f"{what}: {why}")
    # (without autocast there is no GradScaler to refuse fp16 gradients: the model trains in fp16 as asked)
    amp = kernels.amp_fp32_weights(trainer_name, s.method, s.precision) and s.autocast is not False
    if amp and not s.master_weights:
        raise OptionError(f"{what}: a full fine-tune in fp16 needs fp32 weights (plan it with fitcheck plan)")
    if s.autocast is False and trainer_name != TRAINER:
        raise OptionError(f"{what} cannot express --no-autocast; emit hf.yaml (bf16/fp16 off) for it")
    if trainer_name == TRAINER and kbit_base(s) and (s.kbit_prep or s.kbit_path not in (None, "trl")):
        raise OptionError(
            f"{what} runs TRL's SFTTrainer (>= 0.26), which never calls prepare_model_for_kbit_training and "
            "casts the adapters to bf16; plan without --kbit-prep / --kbit-path to emit it"
        )
    if s.optimizer not in OPTIM:
        raise OptionError(f"{what} has no --optimizer {s.optimizer}; it offers {', '.join(OPTIM)}")
    _check_loss(s, trainer_name, what)
    if s.padding_free and trainer_name != TRAINER:
        raise OptionError(f"{what}: --padding-free is TRL's padding-free batch; emit hf.yaml for it")
    if s.method != "full":
        integer_alpha(s, what)
    model_ref(ctx, what)
    multigpu.check(plan, ctx, trainer_name, what)


def _ckpt_item(plan: Plan) -> Item:
    """Checkpointing; under FSDP it is FSDP's own (accelerate.yaml), since transformers refuses both."""
    s = chosen(plan).setup
    if s.grad_ckpt and multigpu.engine(plan) == "fsdp":
        return Item("gradient_checkpointing", False, "FSDP checkpoints instead (accelerate.yaml)")
    return Item(
        "gradient_checkpointing", s.grad_ckpt, "recompute activations in backward" if s.grad_ckpt else ""
    )


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def text(plan: Plan, ctx: EmitContext) -> str:
    """The TRL config text."""
    check(plan, ctx)
    s = chosen(plan).setup
    items = _model_items(plan, ctx) + _peft_items(plan, ctx) + _training_items(plan)
    if s.backend == "cpu":
        items.append(Item("use_cpu", True, "train on the CPU (bf16 needs it outside CUDA)"))
    items += multigpu.items(plan, ctx, "hf")
    # device-map: one process drives every GPU, started without a launcher (emitters/launch.py says why)
    run = f"{TRL_SFT_ONE_PROCESS} {NAME}" if s.strategy == "device-map" else f"trl sft --config {NAME}"
    head = header(plan, ctx, "TRL SFT config", run)
    return comment_block(head) + yaml_text(items)


def _model_items(plan: Plan, ctx: EmitContext) -> list[Item]:
    """Model loading: checkpoint, load dtype (fp32 under --master-weights) and attention kernel."""
    s = chosen(plan).setup
    amp = s.master_weights and s.precision != "fp32"
    if not amp:
        dtype_why = "weights as loaded"
    elif s.precision == "fp16" and s.method == "full":
        dtype_why = "fp32 weights, fp16 autocast: the GradScaler cannot unscale fp16 gradients"
    else:
        dtype_why = "load fp32 weights, autocast to the compute dtype (--master-weights)"
    if s.attn != "eager":
        attn_why = "O(s) attention memory"
    else:
        attn_why = "the soft-capped attention needs eager" if ctx.arch.attn_logit_softcapping else ""
    return [
        Item("model_name_or_path", model_ref(ctx, NAME)),
        Item("dtype", "float32" if amp else DTYPE[s.precision], dtype_why),
        Item("attn_implementation", ATTN[s.attn], attn_why),
    ]


#: The note on ``use_peft`` for a checkpoint stored in bitsandbytes 4-bit (`EmitContext.stored_4bit`).
STORED_4BIT = "the checkpoint is stored in 4-bit: its own quantization_config loads it (no load_in_4bit here)"


def _peft_items(plan: Plan, ctx: EmitContext) -> list[Item]:
    """PEFT (LoRA / DoRA) and, for QLoRA, the bitsandbytes 4-bit loading keys; none for a full fine-tune."""
    s = chosen(plan).setup
    # TRL builds a BitsAndBytesConfig only from load_in_4bit (trl/trainer/utils.py get_quantization_config)
    # and takes QLoRA from the loaded model (sft_trainer.py: is_loaded_in_4bit)
    stored = s.method == "qlora" and ctx.stored_4bit
    items: list[Item] = []
    if s.method != "full":
        targets = lora_modules(ctx.arch, s)
        items += [
            Item("use_peft", True, STORED_4BIT if stored else ""),
            Item("lora_r", s.lora_rank),
            Item("lora_alpha", integer_alpha(s, NAME)),
            Item("lora_dropout", float(s.lora_dropout)),
            Item("lora_target_modules", targets or ["all-linear"]),
        ]
        if s.dora:
            items.append(Item("use_dora", True))
    if s.method == "qlora" and not stored:
        items += [
            Item("load_in_4bit", True, "QLoRA: NF4 base weights, about 0.5 B/param"),
            Item("bnb_4bit_quant_type", "nf4"),
            Item("use_bnb_nested_quant", s.double_quant, "double quantization of the NF4 constants"),
        ]
    return items


def compile_items(setup: LlmSetup) -> list[Item]:
    """``torch_compile: true`` when the plan's setup is compiled (TrainingArguments, axolotl and
    LLaMA-Factory spell it alike); nothing otherwise, so uncompiled configs stay as they were."""
    if setup.compile is not True:
        return []
    return [Item("torch_compile", True, "torch.compile the model (smaller saved activations and loss)")]


def _training_items(plan: Plan) -> list[Item]:
    """SFTConfig / TrainingArguments: data, batch, checkpointing, precision, optimizer, schedule."""
    c = chosen(plan)
    s = c.setup
    return [
        Item("dataset_name", DATASET, "replace with your dataset"),
        Item("output_dir", run_name(plan)),
        Item("max_length", s.seq_len, "tokens per example (memory grows with it)"),
        Item("per_device_train_batch_size", s.batch_size, "micro-batch"),
        *([Item("padding_free", True, "each micro-batch flattened into one row")] if s.padding_free else []),
        Item("gradient_accumulation_steps", s.grad_accum, f"effective batch {c.effective_batch}"),
        _ckpt_item(plan),
        *compile_items(s),
        Item("bf16", s.precision == "bf16" and s.autocast is not False),
        Item(
            "fp16",
            s.precision == "fp16" and s.autocast is not False,
            "both off: the model trains in its load dtype without autocast" if s.autocast is False else "",
        ),
        Item("optim", optim_name(s)),
        *loss_items(s, TRAINER),
        Item("learning_rate", learning_rate(s)),
        Item("num_train_epochs", epochs(plan)),
        Item("logging_steps", 10),
        Item("report_to", "none"),
    ]
