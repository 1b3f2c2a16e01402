"""Build the model a regime trains: config -> transformers model -> dtype, attention, checkpointing, LoRA.

Shared by the tracer (under FakeTensorMode, so nothing is allocated) and the real runs. Every choice
follows what the trainer of the regime does (engine/regimes.py), so a measurement is the ground truth
for the same regime the engine estimates.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from fitcheck.errors import FitcheckError, ModelSourceError, OptionError
from fitcheck.models import LlmSetup, Regime
from fitcheck.terminal import printable
from fitcheck.vocab import LINEAR_MODULES, LMF_ALL, Task

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

#: Keys of a config.json that describe a checkpoint or a runtime, not the architecture.
_DROP_KEYS = ("architectures", "transformers_version", "torch_dtype", "dtype", "auto_map", "_name_or_path")

#: LoRA ``attn`` target names per family (peft matches a name against the end of a module path).
ATTN_TARGETS: dict[str, list[str]] = {
    "gpt2": ["c_attn", "attn.c_proj"],
    "phi3": ["qkv_proj", "o_proj"],
}
DEFAULT_ATTN_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]


@dataclass
class Built:
    """A model ready to train, and the facts about it the result reports."""

    model: Any  # a transformers PreTrainedModel or a peft PeftModel
    model_type: str
    notes: list[str]
    task: Task = "causal-lm"  # what the model is built for (engine/tasks.py): decides the batch's labels
    num_labels: int = 0  # classification: the classifier's width

    def batch(self, setup: LlmSetup, device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A random batch for this model's task (`fitcheck.measure.step.make_batch`)."""
        from fitcheck.measure.step import make_batch

        vocab = int(self.model.config.vocab_size)
        return make_batch(vocab, setup, device, task=self.task, num_labels=self.num_labels)


#: The transformers head class per task (engine/tasks.py): a causal LM, a sequence classifier (encoders'
#: own task; decoders as ``*ForSequenceClassification``), an encoder-decoder LM (T5).
AUTO_CLASSES: dict[str, str] = {
    "causal-lm": "AutoModelForCausalLM",
    "classification": "AutoModelForSequenceClassification",
    "seq2seq": "AutoModelForSeq2SeqLM",
}
#: peft's task type per task: SEQ_CLS adds the classifier to ``modules_to_save`` as a trainer's LoRA
#: classification run has it (peft ``PeftModelForSequenceClassification``).
PEFT_TASKS: dict[str, str] = {
    "causal-lm": "CAUSAL_LM",
    "classification": "SEQ_CLS",
    "seq2seq": "SEQ_2_SEQ_LM",
}


def hf_config_object(hf_config: Mapping[str, Any]) -> Any:
    """A transformers config from a ``config.json`` mapping, set up for training.

    ``use_cache`` is off because HF Trainer 5.x sets ``model.config.use_cache = args.use_cache``
    (False by default): a KV cache in training would keep every layer's keys and values alive.
    Multimodal Gemma 3 configs are reduced to their text decoder (the vision tower is not traced).
    """
    from transformers import AutoConfig

    cfg = {k: v for k, v in dict(hf_config).items() if k not in _DROP_KEYS}
    if "quantization_config" in cfg:
        raise OptionError("config.json carries a quantization_config; measure needs an unquantized config")
    model_type = str(cfg.pop("model_type"))
    if isinstance(cfg.get("text_config"), Mapping) and model_type == "gemma3":
        cfg = {k: v for k, v in cfg["text_config"].items() if k not in _DROP_KEYS}
        model_type = "gemma3_text"
        cfg.pop("model_type", None)
    config = transformers_call(model_type, lambda: AutoConfig.for_model(model_type, **cfg))
    config.use_cache = False
    return config


_T = TypeVar("_T")


def transformers_call(model_type: str, call: Callable[[], _T]) -> _T:
    """``call()``, with transformers refusing the user's config.json as one `ModelSourceError` line.

    transformers checks a config while it builds it or the model (an unknown ``hidden_act`` is a
    KeyError in ACT2FN, an unknown rope type a KeyError in the rope table, ``tie_word_embeddings: "yes"``
    its strict-dataclass error): the values came from the user's file, so it is bad input, not a crash.
    """
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its warnings about the same values would be a second line
    try:
        return call()
    except FitcheckError:
        raise
    except Exception as exc:
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        if isinstance(exc, MemoryError) or any(w in text.lower() for w in OUT_OF_MEMORY):
            raise ModelSourceError(
                f"out of memory building the {printable(model_type)} model on the device ({text}); "
                "fitcheck measure without --device traces it on fake tensors"
            ) from None
        raise ModelSourceError(
            f"config.json: transformers cannot build a {printable(model_type)} model from it "
            f"({type(exc).__name__}: {text})"
        ) from None
    finally:
        transformers_logging.set_verbosity(verbosity)


#: What torch's allocators say when they cannot allocate (CPU: "DefaultCPUAllocator: can't allocate
#: memory"; CUDA: "CUDA out of memory"; MPS: "MPS backend out of memory").
OUT_OF_MEMORY = ("can't allocate memory", "out of memory")


def attn_implementation(setup: LlmSetup) -> str:
    """transformers attention implementation: eager, or sdpa for sdpa/flash/xformers.

    FlashAttention-2 and xformers keep the same O(s) tensors as SDPA's flash kernel (q, k, v, out,
    an fp32 logsumexp), so their memory is traced with SDPA.
    """
    return "eager" if setup.attn == "eager" else "sdpa"


def _from_config(config: Any, kwargs: dict[str, Any], notes: list[str], task: Task = "causal-lm") -> Any:
    """The model with random weights, with the task's head; eager attention where transformers has no
    SDPA path."""
    import transformers

    auto = getattr(transformers, AUTO_CLASSES[task])
    try:
        return auto.from_config(config, **kwargs)
    except ValueError as exc:
        if kwargs["attn_implementation"] != "sdpa" or "scaled_dot_product_attention" not in str(exc):
            raise
    # Gemma 2 (attention logit softcapping) has no SDPA path in transformers 5; users get eager
    # or FlashAttention-2 (which keeps O(s) like SDPA flash). Trace what transformers can run.
    notes.append(
        f"{config.model_type} has no SDPA attention in transformers: traced with eager "
        "(O(s^2) scores); FlashAttention-2 with softcapping would keep O(s)"
    )
    return auto.from_config(config, **{**kwargs, "attn_implementation": "eager"})


def run_task(hf_config: Mapping[str, Any], setup: LlmSetup, config: Any) -> tuple[Task, int]:
    """The task the run trains (``--task``, else the model's own, as the engine reads it) and, for
    classification, the classifier's width; sets what transformers' heads need on ``config``."""
    from fitcheck.engine.estimate import usable_positions
    from fitcheck.engine.tasks import DEFAULT_LABELS, check_task
    from fitcheck.sources.hf_config import arch_from_hf_config

    arch = arch_from_hf_config(dict(hf_config))
    task = check_task(arch, setup)
    usable = usable_positions(arch)
    if usable is not None and setup.seq_len > usable:
        raise OptionError(
            f"--seq-len {setup.seq_len:,}: {printable(arch.model_type)} has {usable:,} learned positions, "
            f"so a longer sequence cannot run; give --seq-len {usable:,} or less"
        )
    labels = 0
    if task == "classification":
        labels = setup.num_labels or int(getattr(config, "num_labels", 0) or 0) or DEFAULT_LABELS
        config.num_labels = labels
        if getattr(config, "pad_token_id", None) is None:
            config.pad_token_id = 0  # *ForSequenceClassification pools the last non-pad token of a batch
        if getattr(config, "problem_type", None) is None:
            # what transformers infers from the labels (one label: regression on floats; else integer
            # classes); DeBERTa's own inference takes a nonzero() over the labels first, a value-dependent
            # shape fake tensors cannot trace (the loss is the same over b x num_labels logits)
            config.problem_type = "regression" if labels == 1 else "single_label_classification"
    elif task == "seq2seq":
        for key in ("decoder_start_token_id", "pad_token_id"):
            if getattr(config, key, None) is None:
                setattr(config, key, 0)  # T5's own ids; labels are shifted right from them
    return task, labels


def build_model(
    hf_config: Mapping[str, Any], setup: LlmSetup, regime: Regime, *, quantize: bool = False
) -> Built:
    """Instantiate the model with random weights in the regime's dtype, then apply checkpointing and LoRA.

    Call it under FakeTensorMode to trace, under ``torch.device(...)`` for a real run. ``quantize``
    (a real CUDA run only): QLoRA's base becomes bitsandbytes 4-bit layers (`quantize_4bit`).
    """
    if setup.method == "qlora" and not quantize:
        raise OptionError(
            "QLoRA is measured on a CUDA device only (measure --device cuda, with bitsandbytes): "
            "bitsandbytes' Params4bit cannot wrap a fake tensor (checked with bitsandbytes 0.50.2), so 4-bit "
            "layers do not trace; measure --method lora for the same adapters"
        )
    config = hf_config_object(hf_config)
    notes: list[str] = []
    kwargs: dict[str, Any] = {
        "dtype": DTYPES[regime.weight_dtype],
        "attn_implementation": attn_implementation(setup),
    }
    if getattr(config, "num_local_experts", 0) or getattr(config, "num_experts", 0):
        # transformers 5 default; buffers are sized tokens x top_k whatever the routing, so the
        # memory does not depend on which experts the (random) router picks.
        kwargs["experts_implementation"] = "grouped_mm"
        notes.append("MoE experts run transformers' grouped_mm path: memory is independent of routing")
    if setup.padded_batches and setup.attn == "sdpa":
        notes.append(
            "the traced batch is unpadded (fake tensors cannot take transformers' mask.all() test), so SDPA "
            "gets no explicit mask: the estimate's attention_mask_copies (a padded batch's) are not traced"
        )
    task, labels = run_task(hf_config, setup, config)
    model = transformers_call(str(config.model_type), lambda: _from_config(config, kwargs, notes, task))
    if setup.method == "qlora":
        quantize_4bit(model, setup, regime, notes)
    model.train()
    if setup.grad_ckpt:
        enable_checkpointing(model)
    if setup.method in ("lora", "qlora"):
        model = apply_lora(model, setup, regime, config.model_type, task)
    elif setup.method == "prefix-tuning":
        model = apply_prefix(model, setup)
    else:
        for p in model.parameters():
            p.requires_grad_(True)
    return Built(model=model, model_type=str(config.model_type), notes=notes, task=task, num_labels=labels)


def quantize_4bit(model: Any, setup: LlmSetup, regime: Regime, notes: list[str]) -> None:
    """QLoRA's base as ``from_pretrained(..., quantization_config=BitsAndBytesConfig(load_in_4bit=True))``
    leaves it: every ``nn.Linear`` but the output head becomes bitsandbytes' ``Linear4bit`` (NF4, double
    quantization per ``setup.double_quant``, compute dtype the load dtype, uint8 storage), then peft's
    ``prepare_model_for_kbit_training`` when the regime runs it (non-4-bit parameters to fp32).

    The random weights are quantized on the device, and the allocator's cache is emptied afterwards, so
    the load-time copies are not in the step's reserved figure (a real load streams its shards).

    Raises:
        OptionError: bitsandbytes is not installed.
    """
    try:
        import bitsandbytes as bnb
    except ImportError:
        raise OptionError("--method qlora on a GPU needs bitsandbytes: pip install bitsandbytes") from None

    head = model.get_output_embeddings()
    compute = DTYPES[regime.weight_dtype]
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear or child is head:
                continue
            layer = bnb.nn.Linear4bit(
                child.in_features, child.out_features, bias=child.bias is not None, compute_dtype=compute,
                compress_statistics=setup.double_quant, quant_type="nf4", device="meta",
            )  # fmt: skip
            layer.weight = bnb.nn.Params4bit(
                child.weight.data,
                requires_grad=False,
                compress_statistics=setup.double_quant,
                quant_type="nf4",
            ).to(child.weight.device)
            if child.bias is not None:
                layer.bias = child.bias
            setattr(parent, name, layer)
    model.is_loaded_in_4bit = True  # what peft reads to place its bitsandbytes LoRA layers
    if regime.kbit_upcast:
        from peft import prepare_model_for_kbit_training

        prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)
    torch.cuda.empty_cache()
    notes.append(
        f"QLoRA base: random weights quantized to NF4 by bitsandbytes {bnb.__version__} on the device"
        + ("; prepare_model_for_kbit_training ran" if regime.kbit_upcast else "")
    )


def enable_checkpointing(model: Any) -> None:
    """Non-reentrant activation checkpointing per decoder layer, as HF Trainer turns it on.

    transformers 5 also registers a hook making the embedding output require grad
    (``enable_input_require_grads``), which PEFT needs and HF does for every text model.
    """
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.2
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def lora_targets(setup: LlmSetup, model_type: str) -> str | list[str]:
    """peft ``target_modules`` for ``--lora-targets`` (attn, all-linear, or comma-separated names)."""
    text = setup.lora_targets.strip()
    if text == "all-linear":
        return "all-linear"
    if text == "attn":
        return ATTN_TARGETS.get(model_type) or _named_attn_targets(model_type)
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise OptionError("--lora-targets is empty: use attn, all-linear or comma-separated module names")
    return names


def _named_attn_targets(model_type: str) -> list[str]:
    """The q, k, v, o module names the engine knows for this family (engine/params.py ``NAMES``: BERT's
    ``query`` ... ``attention.output.dense``, T5's ``q`` ... ``o``), else Llama's."""
    from fitcheck.engine.params import NAMES

    names = NAMES.get(model_type, {})
    if not all(k in names for k in ("q", "k", "v", "o")):
        return DEFAULT_ATTN_TARGETS
    return [names[k] for k in ("q", "k", "v", "o")]


def linear_module_names(model: Any) -> list[str]:
    """axolotl's ``find_all_linear_names`` on a built model (``--lora-targets linear-modules``,
    src/axolotl/loaders/adapter.py @067b021c): the last name component of every ``nn.Linear`` (bitsandbytes'
    layers are subclasses) or module whose class name holds ``Linear``, less ``lm_head``."""
    names = set()
    for name, module in model.named_modules():
        cls = type(module).__name__
        if isinstance(module, torch.nn.Linear) or (
            "Linear" in cls and cls != "LlamaLinearScalingRotaryEmbedding"
        ):
            names.add(name.split(".")[-1])
    names.discard("lm_head")
    return sorted(names)


#: LLaMA-Factory's ``COMPOSITE_MODELS`` (src/llamafactory/model/model_utils/visual.py @ff6d4d12) for the
#: multimodal types fitcheck reads: (projector keys, vision tower keys, LoRA conflict keys); a module
#: whose full name holds a key is skipped (a substring test, as LLaMA-Factory's).
LMF_COMPOSITE: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "llava": (("multi_modal_projector",), ("vision_tower",), ()),
    "gemma3": (("multi_modal_projector",), ("vision_tower",), ()),
    "llama4": (("multi_modal_projector",), ("vision_model",), ()),
    "mistral3": (("model.multi_modal_projector",), ("vision_tower",), ()),
    "qwen2_vl": (("visual.merger",), ("visual.patch_embed", "visual.blocks"), ("patch_embed",)),
    "qwen2_5_vl": (("visual.merger",), ("visual.patch_embed", "visual.blocks"), ("patch_embed",)),
    **dict.fromkeys(
        ("qwen3_vl", "qwen3_vl_moe"),
        (
            ("visual.merger",),
            ("visual.pos_embed", "visual.patch_embed", "visual.blocks", "visual.deepstack_merger_list"),
            ("patch_embed",),
        ),
    ),
}


def llamafactory_module_names(model: Any, model_type: str) -> list[str]:
    """LLaMA-Factory's ``lora_target: all`` on a built model (``--lora-targets llamafactory-all``):
    ``find_all_linear_modules`` (model_utils/misc.py @ff6d4d12: leaf names of the modules whose class
    name holds ``Linear`` and not ``Embedding``, outside ``lm_head``, the projector and, with
    ``freeze_vision_tower`` at its default, the tower), then on a composite model ``patch_target_modules``
    (model_utils/visual.py: the full names of the modules holding one of them, tower, projector and
    conflict keys left out)."""
    projector, vision, conflict = LMF_COMPOSITE.get(model_type, ((), (), ()))
    skip = ("lm_head", *projector, *vision)
    leaves = set()
    for name, module in model.named_modules():
        cls = type(module).__name__
        if "Linear" in cls and "Embedding" not in cls and not any(k in name for k in skip):
            leaves.add(name.split(".")[-1])
    if model_type not in LMF_COMPOSITE:
        return sorted(leaves)
    out = (*projector, *vision, *conflict)
    return [
        n for n, _ in model.named_modules() if any(t in n for t in leaves) and not any(k in n for k in out)
    ]


def _with_linear_modules(targets: str | list[str], model: Any, model_type: str = "") -> str | list[str]:
    """The `LINEAR_MODULES` / `LMF_ALL` tokens replaced by the model's names under that rule."""
    if isinstance(targets, str) or not {LINEAR_MODULES, LMF_ALL} & set(targets):
        return targets
    rest = [t for t in targets if t not in (LINEAR_MODULES, LMF_ALL)]
    names = linear_module_names(model) if LINEAR_MODULES in targets else []
    if LMF_ALL in targets:
        names += llamafactory_module_names(model, model_type)
    return sorted({*names, *rest})


def apply_lora(model: Any, setup: LlmSetup, regime: Regime, model_type: str, task: Task = "causal-lm") -> Any:
    """Wrap with peft LoRA (or DoRA); adapters fp32 unless the regime keeps them in the model dtype.

    peft's ``autocast_adapter_dtype=True`` (its default) upcasts bf16/fp16 adapters to fp32; torchtune
    builds its LoRA modules in the model dtype, which ``autocast_adapter_dtype=False`` reproduces.
    ``--train-modules`` become peft's ``modules_to_save`` (trained copies of the embedding / output layer
    in the module's own dtype).
    """
    from peft import LoraConfig, get_peft_model

    from fitcheck.engine.lora import trained_modules

    cfg = LoraConfig(
        r=setup.lora_rank,
        lora_alpha=setup.alpha,  # type: ignore[arg-type]  # typed int in peft, used as a number
        lora_dropout=setup.lora_dropout,
        target_modules=_with_linear_modules(lora_targets(setup, model_type), model, model_type),
        use_dora=setup.dora,
        bias="none",
        task_type=PEFT_TASKS[task],
        modules_to_save=list(trained_modules(setup)) or None,
    )
    upcast = regime.adapter_dtype == "fp32"
    try:
        with warnings.catch_warnings():
            # peft 0.21 still calls transformers' deprecated `is_gradient_checkpointing`
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            peft_model = get_peft_model(model, cfg, autocast_adapter_dtype=upcast)
    except ValueError as exc:
        raise OptionError(f"peft could not place the adapters: {exc}") from None
    want = DTYPES[regime.adapter_dtype]
    for name, p in peft_model.named_parameters():
        # e.g. fp16 adapters on an fp32 base: follow the regime (the adapters only: a modules_to_save copy
        # keeps its module's dtype, as peft makes it)
        if p.requires_grad and p.dtype != want and "lora_" in name:
            p.data = p.data.to(want)
    if setup.lora_fa:  # LoRA-FA: peft's create_lorafa_optimizer freezes every "lora_A" parameter
        for name, p in peft_model.named_parameters():
            if "lora_A" in name:
                p.requires_grad_(False)
    return peft_model


def apply_prefix(model: Any, setup: LlmSetup) -> Any:
    """Wrap with peft PREFIX_TUNING (engine/prefix.py): peft sizes the prefix from the model's config
    (key/value width) and builds its encoder in fp32. peft refuses it beside gradient checkpointing
    ("does not work with gradient checkpointing", peft_model.py _setup_prompt_encoder)."""
    from peft import PrefixTuningConfig, get_peft_model

    if setup.prefix_tokens is None:
        raise OptionError("--method prefix-tuning needs --prefix-tokens N (peft's num_virtual_tokens)")
    cfg = PrefixTuningConfig(
        task_type="CAUSAL_LM",
        num_virtual_tokens=setup.prefix_tokens,
        prefix_projection=setup.prefix_projection,
        encoder_hidden_size=setup.prefix_hidden,  # type: ignore[arg-type]  # None: peft's own (token_dim)
    )
    try:
        return get_peft_model(model, cfg)
    except ValueError as exc:
        raise OptionError(f"peft could not build the prefix: {exc}") from None


def trainable_parameters(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """Parameters the optimizer updates."""
    return [p for p in model.parameters() if p.requires_grad]
