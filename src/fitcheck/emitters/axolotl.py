"""``axolotl.yaml``: an axolotl config (``axolotl train axolotl.yaml``).

axolotl validates with pydantic (``AxolotlInputConfig``): wrong types are errors, unknown top-level
keys are silently dropped, so every key written here is checked against the schema's field list in
the tests (tests/data/trainer_keys/axolotl_keys.txt, axolotl @067b021c, cross-checked with 0.19.0).
Attention is ``attn_implementation`` (axolotl >= 0.17; the old booleans still map to it).
"""

from __future__ import annotations

from fitcheck.emitters import hf, multigpu
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
from fitcheck.engine.lora import CONV1D_TYPES
from fitcheck.models import DecoderArch
from fitcheck.planner.models import Plan
from fitcheck.vocab import LINEAR_MODULES

NAME = "axolotl.yaml"
TRAINER = "axolotl"
DESCRIPTION = "axolotl config (axolotl >= 0.17: attn_implementation)"

ATTN = {"flash": "flash_attention_2", "sdpa": "sdpa", "xformers": "xformers", "eager": "eager"}
#: A small public instruction set from axolotl's own examples; replace it with yours.
DATASET = {"path": "mhenrichsen/alpaca_2k_test", "type": "alpaca"}


def check(plan: Plan, ctx: EmitContext) -> None:
    """Refuse a plan axolotl cannot run as written (the HF Trainer checks, axolotl's attention table)."""
    hf.check(plan, ctx, TRAINER, NAME, attn=ATTN, attn_hint="")


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def _targets_item(a: DecoderArch, spec: str, targets: list[str] | None) -> Item:
    """``lora_target_linear: true`` is axolotl's ``find_all_linear_names`` (``linear-modules``), which on
    an MoE model is not peft's ``all-linear``: there the string goes to peft as it is (axolotl hands a
    string ``lora_target_modules`` to ``LoraConfig`` unchanged, loaders/adapter.py @067b021c)."""
    if spec == LINEAR_MODULES or (targets is None and not a.is_moe and a.model_type not in CONV1D_TYPES):
        return Item("lora_target_linear", True)
    if targets is None:
        # GPT-2's Conv1D projections are no nn.Linear: lora_target_linear lists none (`CONV1D_TYPES`)
        misses = "the Conv1D projections" if a.model_type in CONV1D_TYPES else "the experts"
        note = f"peft's all-linear (lora_target_linear misses {misses})"
        return Item("lora_target_modules", "all-linear", note)
    return Item("lora_target_modules", targets)


def text(plan: Plan, ctx: EmitContext) -> str:
    """The axolotl config text."""
    check(plan, ctx)
    c = chosen(plan)
    s = c.setup
    fsdp = multigpu.engine(plan) == "fsdp"
    items = [Item("base_model", model_ref(ctx, NAME))]
    if s.method == "qlora" and ctx.stored_4bit:
        # loaders/model.py _set_quantization_config (@067b021c lines 692-711) builds BitsAndBytesConfig
        # from the checkpoint's own quantization_config; adapter: qlora still asks load_in_4bit
        # (schemas/peft.py), which also turns on prepare_model_for_kbit_training (model.py 1015-1022)
        items.append(
            Item("load_in_4bit", True, "adapter: qlora asks it; the 4-bit settings are the checkpoint's")
        )
    elif s.method == "qlora":
        items.append(Item("load_in_4bit", True, "QLoRA: NF4 base weights"))
    if s.method != "full":
        targets = lora_modules(ctx.arch, s)
        items += [
            Item("adapter", s.method),
            Item("lora_r", s.lora_rank),
            Item("lora_alpha", integer_alpha(s, NAME)),
            Item("lora_dropout", float(s.lora_dropout)),
            _targets_item(ctx.arch, s.lora_targets, targets),
        ]
        if s.dora:
            items.append(Item("peft_use_dora", True))
    if s.method == "qlora" and not s.double_quant and not ctx.stored_4bit:
        items.append(
            Item("bnb_config_kwargs", {"bnb_4bit_use_double_quant": False}, "axolotl's default is on")
        )
    items += [
        Item("datasets", [DATASET], "replace with your dataset"),
        Item("val_set_size", 0.0),
        Item("output_dir", run_name(plan)),
        Item("sequence_len", s.seq_len, "tokens per example (memory grows with it)"),
        Item("micro_batch_size", s.batch_size),
        Item("gradient_accumulation_steps", s.grad_accum, f"effective batch {c.effective_batch}"),
        Item("num_epochs", epochs(plan)),
        Item("optimizer", hf.optim_name(s)),
        *hf.loss_items(s, TRAINER),
        Item("lr_scheduler", "cosine"),
        Item("learning_rate", learning_rate(s)),
        Item("bf16", s.precision == "bf16"),
        Item("fp16", s.precision == "fp16"),
        Item(
            "gradient_checkpointing",
            s.grad_ckpt and not fsdp,
            "FSDP checkpoints instead (fsdp_config)" if s.grad_ckpt and fsdp else "",
        ),
        Item("attn_implementation", ATTN[s.attn]),
        *hf.compile_items(s),
        Item("logging_steps", 10),
    ]
    items += multigpu.items(plan, ctx, "axolotl")
    head = header(plan, ctx, "axolotl config", f"axolotl train {NAME}")
    return comment_block(head) + yaml_text(items)
