"""``llamafactory.yaml``: a LLaMA-Factory SFT config (``llamafactory-cli train llamafactory.yaml``).

LLaMA-Factory parses one flat mapping with ``HfArgumentParser``: an unknown key is an error
(unless ``ALLOW_EXTRA_ARGS=1``), so every key is checked in the tests against its own fields
(tests/data/trainer_keys/llamafactory_keys.txt, @ff6d4d12) and the TrainingArguments fields of the
transformers it pins (<= 5.8.0). Gradient checkpointing is on by default there, so the file says
``disable_gradient_checkpointing`` explicitly.
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
from fitcheck.engine.lora import CONV1D_TYPES, tower_targets
from fitcheck.engine.params import layer_linears
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.planner.models import Plan
from fitcheck.vocab import LMF_ALL

NAME = "llamafactory.yaml"
TRAINER = "llamafactory"
DESCRIPTION = "LLaMA-Factory SFT config"

ATTN = {"flash": "fa2", "sdpa": "sdpa", "eager": "disabled"}
#: The demo set shipped in LLaMA-Factory's data/ folder (data/dataset_info.json); replace it with yours.
DATASET = "alpaca_en_demo"
#: Chat template per Hugging Face id, from LLaMA-Factory's model registry (src/llamafactory/extras/
#: constants.py @ff6d4d12, register_model_group(..., template=...), line of the template argument).
#: The registry, not the model type, decides: Gemma 3 1B shares Gemma 2's template, Phi-4 has its own.
LMF_CONSTANTS = "hiyouga/LLaMA-Factory src/llamafactory/extras/constants.py @ff6d4d12"
TEMPLATES_BY_ID: dict[str, str] = {
    "google/gemma-2-2b": "gemma2",  # :812 (Gemma-2-2B, -9B, -27B, their -it, Gemma-3-1B/270M)
    "google/gemma-2-9b": "gemma2",
    "google/gemma-2-27b": "gemma2",
    "google/gemma-3-1b": "gemma2",
    "google/gemma-3-4b": "gemma3",  # :855 (Gemma-3-4B, -12B, -27B and their -it)
    "google/gemma-3-12b": "gemma3",
    "google/gemma-3-27b": "gemma3",
    "meta-llama/llama-2-7b": "llama2",  # :1606
    "meta-llama/llama-2-13b": "llama2",
    "meta-llama/llama-2-70b": "llama2",
    "mistralai/mistral-7b-v0.1": "mistral",  # :2062
    "mistralai/mistral-nemo-base-2407": "ministral",  # :2031
    "mistralai/mistral-small-24b-base-2501": "mistral_small",  # :2108
    "mistralai/mixtral-8x7b-v0.1": "mistral",  # :2151
    "microsoft/phi-3-mini-4k": "phi",  # :2397
    "microsoft/phi-3.5-mini": "phi",
    "microsoft/phi-4": "phi4",  # :2423
    "huggingfacetb/smollm2-135m": "smollm2",  # :3333
    "huggingfacetb/smollm2-360m": "smollm2",
    "huggingfacetb/smollm2-1.7b": "smollm2",
}
#: Suffixes the registry lists beside the base id with the same template.
_ID_SUFFIXES = ("-it", "-pt", "-instruct", "-chat-hf", "-hf")
#: Fallback per model type (register_template names in src/llamafactory/data/template.py @ff6d4d12:
#: gemma2 at :1029 has stop words <eos> and <end_of_turn>, gemma at :1013 only <end_of_turn>).
TEMPLATES = {
    "qwen2": "qwen",
    "qwen2_moe": "qwen",
    "qwen3": "qwen3",
    "qwen3_moe": "qwen3",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gemma3_text": "gemma3",
    "mistral": "mistral",
    "mixtral": "mistral",
    "phi3": "phi",
}


def template_for(arch: DecoderArch, hf_id: str | None) -> str:
    """The chat template LLaMA-Factory's registry gives this model, else its model type's."""
    if hf_id:
        key = hf_id.lower()
        for suffix in _ID_SUFFIXES:
            key = key.removesuffix(suffix)
        if key in TEMPLATES_BY_ID:
            return TEMPLATES_BY_ID[key]
    return template(arch)


def template(a: DecoderArch) -> str:
    """The chat template by model type; Llama 3 has a 128k vocabulary, Llama 2 32k."""
    if a.model_type == "llama":
        return "llama3" if a.vocab_size >= 128_000 else "llama2"
    return TEMPLATES.get(a.model_type, "default")


def check(plan: Plan, ctx: EmitContext) -> None:
    """Refuse a plan LLaMA-Factory cannot run as written (the HF Trainer checks, its attention names,
    LoRA targets it cannot pass on)."""
    hf.check(plan, ctx, TRAINER, NAME, attn=ATTN, attn_hint="; LLaMA-Factory offers fa2, sdpa or disabled")
    s = chosen(plan).setup
    if s.method != "full":
        lora_target(ctx.arch, s)


def lora_target(a: DecoderArch, s: LlmSetup) -> str:
    """``lora_target``: ``all`` is LLaMA-Factory's own ``find_all_linear_modules`` (`LMF_ALL`), written
    for ``llamafactory-all`` and for peft's ``all-linear`` where both take the same modules (a dense
    model without a vision tower); other targets as the names they stand for. LLaMA-Factory hands
    ``lora_target`` to peft as a list (model/adapter.py @ff6d4d12), so peft's ``all-linear`` cannot be
    written, and on a composite model it keeps every name out of the vision tower and projector
    (model_utils/visual.py ``patch_target_modules``), so tower adapters cannot be either."""
    if s.lora_targets == "all-linear" and a.model_type in CONV1D_TYPES:  # all would find no module
        return ",".join(sorted({lin.name.split(".")[-1] for lin in layer_linears(a, False) if lin.is_module}))
    if s.lora_targets == LMF_ALL or (s.lora_targets == "all-linear" and not a.is_moe and not a.tower_linears):
        return "all"
    if s.lora_targets == "all-linear" or tower_targets(a, s.lora_targets):
        where = "the vision tower" if tower_targets(a, s.lora_targets) else "past the linear modules"
        raise OptionError(
            f"{NAME}: --lora-targets {s.lora_targets} on {a.model_type} reaches {where}, which LLaMA-Factory "
            "cannot target (lora_target all is its own rule and keeps the vision tower out): plan with "
            f"--lora-targets {LMF_ALL} or named projections"
        )
    return ",".join(lora_modules(a, s) or ())


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def _method_items(s: LlmSetup, ctx: EmitContext) -> list[Item]:
    """The quantization keys (none for a checkpoint stored in 4-bit: its own quantization_config loads
    it; quantization_bit "will not affect on the PTQ-quantized models", model/model_utils/quantization.py
    configure_quantization @ff6d4d12), the stage and the fine-tuning type."""
    items: list[Item] = []
    if s.method == "qlora" and not ctx.stored_4bit:
        items += [
            Item("quantization_bit", 4, "QLoRA: NF4 base weights"),
            Item("quantization_method", "bnb"),
            Item("quantization_type", "nf4"),
            Item("double_quantization", s.double_quant),
        ]
    stored = "the checkpoint is stored in 4-bit: its own quantization_config loads it"
    return [
        *items,
        Item("stage", "sft"),
        Item("do_train", True),
        Item(
            "finetuning_type",
            "full" if s.method == "full" else "lora",
            stored if s.method == "qlora" and ctx.stored_4bit else "",
        ),
    ]


def text(plan: Plan, ctx: EmitContext) -> str:
    """The LLaMA-Factory config text."""
    check(plan, ctx)
    c = chosen(plan)
    s = c.setup
    items = [Item("model_name_or_path", model_ref(ctx, NAME)), *_method_items(s, ctx)]
    if s.method != "full":
        items += [
            Item("lora_rank", s.lora_rank),
            Item("lora_alpha", integer_alpha(s, NAME)),
            Item("lora_dropout", float(s.lora_dropout)),
            Item("lora_target", lora_target(ctx.arch, s)),
        ]
        if s.dora:
            items.append(Item("use_dora", True))
    items += [
        Item("dataset", DATASET, "replace with your dataset (data/dataset_info.json)"),
        Item(
            "template",
            template_for(ctx.arch, ctx.spec.hf_id),
            "chat template from LLaMA-Factory's model registry",
        ),
        Item("cutoff_len", s.seq_len, "tokens per example (memory grows with it)"),
        Item("output_dir", run_name(plan)),
        Item("per_device_train_batch_size", s.batch_size, "micro-batch"),
        Item("gradient_accumulation_steps", s.grad_accum, f"effective batch {c.effective_batch}"),
        Item("learning_rate", learning_rate(s)),
        Item("num_train_epochs", epochs(plan)),
        Item("lr_scheduler_type", "cosine"),
        Item("bf16", s.precision == "bf16"),
        Item("fp16", s.precision == "fp16"),
        Item("flash_attn", ATTN[s.attn]),
        *hf.compile_items(s),
        Item(
            "disable_gradient_checkpointing",
            not s.grad_ckpt,
            "LLaMA-Factory checkpoints by default" if not s.grad_ckpt else "",
        ),
        Item("optim", hf.optim_name(s)),
        *hf.loss_items(s, TRAINER),
        Item("logging_steps", 10),
        Item("report_to", "none"),
    ]
    if s.backend == "cpu":
        items.append(Item("use_cpu", True))
    items += multigpu.items(plan, ctx, "llamafactory")
    head = header(plan, ctx, "LLaMA-Factory config", f"llamafactory-cli train {NAME}")
    return comment_block(head) + yaml_text(items)
