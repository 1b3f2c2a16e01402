"""LLaMA-Factory YAML (``llamafactory-cli train config.yaml``).

Mapping, after LLaMA-Factory's hparams (hiyouga/LLaMA-Factory src/llamafactory/hparams/*.py
@ff6d4d12, tests/data/trainer_keys/llamafactory_keys.txt): ``finetuning_type: lora|full`` (default
lora; ``freeze`` and ``oft`` are refused, `fitcheck.readers.unposed`); ``quantization_bit: 4`` with
bitsandbytes is QLoRA, ``8`` an int8 base, ``quantization_method: gptq|awq`` a pre-quantized base;
``lora_target: all`` (default) is LLaMA-Factory's own ``find_all_linear_modules`` (fitcheck's
``llamafactory-all``, `fitcheck.vocab.LMF_ALL`: linear leaf names by class name, the vision tower and
projector left out; ``freeze_vision_tower`` / ``freeze_multi_modal_projector`` false are refused);
``additional_target`` modules are trained in full;
``lora_alpha`` defaults to 2 x ``lora_rank`` (finetuning_args.py __post_init__); ``cutoff_len``
is the sequence length; ``disable_gradient_checkpointing`` turns off the checkpointing it does by
default (model/model_utils/checkpointing.py); ``flash_attn: auto|disabled|sdpa|fa2|fa3``;
``enable_liger_kernel``; ``pure_bf16`` keeps trainable weights in bf16 (no fp32 cast);
``image_max_pixels`` with a Qwen-VL ``template`` gives the image tokens per example (`mmtokens`). The
TrainingArguments keys are shared with TRL (`fitcheck.readers.hfargs`).
"""

from __future__ import annotations

from fitcheck.errors import InputError
from fitcheck.readers import mmtokens, names
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, _short, as_bool, as_float, as_int, ray_gpus
from fitcheck.readers.base import unpacked_note as note_unpacked
from fitcheck.readers.hfargs import training_args
from fitcheck.readers.unposed import refuse
from fitcheck.vocab import LMF_ALL

FORMAT = "llamafactory"
TRAINER = "llamafactory"

#: ``flash_attn`` -> fitcheck kernel (model/model_utils/attention.py; auto leaves transformers' sdpa).
ATTN = {"auto": "sdpa", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash", "disabled": "eager"}
#: bitsandbytes method names LLaMA-Factory accepts (QuantizationMethod: bnb; older files: bitsandbytes).
BNB = ("bnb", "bitsandbytes")


def read(data: Doc, path: str) -> ReadResult:
    """Read a LLaMA-Factory config."""
    k = Keys(data)
    refuse(k, FORMAT, path)
    r = Reading(FORMAT, TRAINER, k, path)
    model = k.get("model_name_or_path")
    r.model = str(model) if model else None
    k.touch("do_train", "stage")
    # true is the rule llamafactory-all follows (false is refused, fitcheck.readers.unposed)
    # (and false is freeze_language_model's default: the language model trains, as fitcheck sizes it)
    k.touch("freeze_vision_tower", "freeze_multi_modal_projector", "freeze_language_model")
    _training_run(r, k)
    ray_gpus(r, k, True)  # LLaMA-Factory runs Ray under USE_RAY=1, which a config cannot say: its workers
    training_args(r, k)
    if as_bool(k.get("pure_bf16"), "pure_bf16", path):
        r.set("precision", "bf16", "pure_bf16")
        r.note("pure_bf16: trainable weights stay bf16 (no fp32 cast); sized with the llamafactory regime")
    _method(r, k)
    r.set("seq_len", as_int(k.get("cutoff_len"), "cutoff_len", path), "cutoff_len")
    disable = as_bool(k.get("disable_gradient_checkpointing"), "disable_gradient_checkpointing", path)
    if disable is not None:
        r.set("grad_ckpt", not disable, "disable_gradient_checkpointing")
    # its own checkpointing passes {"use_reentrant": use_reentrant_gc} (default true; FSDP2 sets it false:
    # model/model_utils/checkpointing.py _get_gradient_checkpointing_kwargs, prepare_model_for_training)
    reentrant = as_bool(k.get("use_reentrant_gc"), "use_reentrant_gc", path)
    r.set("ckpt_reentrant", reentrant, "use_reentrant_gc")
    attn = k.get("flash_attn")
    if attn is not None:
        # AttentionFunction (extras/constants.py): LLaMA-Factory's parser refuses another value
        if not isinstance(attn, str) or attn not in ATTN:
            raise InputError(f"{path}: flash_attn {_short(attn)} is not one of {', '.join(ATTN)}")
        r.set("attn", ATTN[attn], "flash_attn")
    names.read_loss(r, k, "llamafactory")
    if as_bool(k.get("use_unsloth_gc"), "use_unsloth_gc", path):
        r.set("offload_activations", True, "use_unsloth_gc")
    packed = k.get("stage") == "pt"  # data_args.py: packing "will automatically enable in pre-training"
    for key in ("packing", "neat_packing"):
        flag = as_bool(k.get(key), key, path)
        if flag is not None:
            packed = flag or (key == "neat_packing" and packed)
        if flag:
            r.note(f"{key}: rows are filled to cutoff_len tokens, as the estimate already assumes")
        if flag and key == "neat_packing" and r.values.get("attn") != "flash":
            # data/collator.py @ff6d4d12 SFTDataCollatorWith4DAttentionMask: prepare_4d_attention_mask unless
            # the model runs flash_attention_2; transformers passes a 4D mask through untouched
            r.note(
                "neat_packing without FlashAttention-2: the collator builds a b x 1 x s x s block-diagonal "
                "mask in the compute dtype, moved to the GPU each step and shared by every layer, and SDPA "
                "expands grouped K/V under it: not counted, the rows are sized unmasked"
            )
    if not packed:
        note_unpacked(r, "packing")
    _images(r, k)
    return r.result()


def _training_run(r: Reading, k: Keys) -> None:
    """Each LLaMA-Factory workflow trains only under ``do_train`` (``if training_args.do_train:
    trainer.train()``, src/llamafactory/train/sft/workflow.py @ff6d4d12; TrainingArguments' default is
    false). An evaluation config (``llamafactory-cli eval``: EvaluationArguments ``task``, ``n_shot``,
    hparams/evaluation_args.py) or a prediction run is refused; any other file without ``do_train: true``
    (a chat config such as examples/inference/llama3.yaml before ``infer_backend`` was written out) is
    sized as the run it would be with it, and said so."""
    path = r.path
    if as_bool(k.get("do_train"), "do_train", path):
        return
    if as_bool(k.get("do_predict"), "do_predict", path):
        raise InputError(f"{path}: do_predict without do_train is a prediction run, not training")
    if k.get("task") is not None:
        raise InputError(
            f"{path}: task {_short(k.get('task'))} without do_train is an evaluation config "
            "(llamafactory-cli eval), not a training run"
        )
    r.note(
        "do_train is not true: llamafactory-cli train would not train with this file (a chat or "
        "preprocessing config?); sized as the run it sets up with do_train: true"
    )


def _images(r: Reading, k: Keys) -> None:
    """``image_max_pixels`` -> image tokens per example, for the Qwen-VL templates (`mmtokens`)."""
    pixels = as_int(k.get("image_max_pixels"), "image_max_pixels", r.path)
    k.touch("image_min_pixels")  # only enlarges images below it: the cap decides the largest
    if k.get("video_max_pixels") is not None:
        k.touch("video_max_pixels", "video_min_pixels", "video_fps", "video_maxlen")
        r.note(
            "video_max_pixels: video frames are not counted (frames per example follow video_fps, "
            "video_maxlen and each clip's length); give --image-tokens for video data"
        )
    if pixels is None:
        return
    if pixels < 1:
        raise InputError(f"{r.path}: image_max_pixels must be a positive number of pixels (got {pixels})")
    template = k.get("template")
    grid = mmtokens.TEMPLATES.get(template) if isinstance(template, str) else None
    if grid is None:
        r.note(
            f"image_max_pixels {pixels}: image tokens are computed for the Qwen-VL templates "
            f"({', '.join(mmtokens.TEMPLATES)}), not template {_short(template)}; give --image-tokens"
        )
        return
    n = mmtokens.image_tokens(pixels, grid)
    r.set("image_tokens", n, "image_max_pixels")
    r.note(
        f"image_max_pixels {pixels} with template {template}: {n} image tokens per example (one square "
        f"image at the cap, {grid.patch}-pixel patches merged {grid.merge}x{grid.merge}); the dataset "
        "decides how many images an example holds: give --image-tokens for more"
    )


def _method(r: Reading, k: Keys) -> None:
    p = r.path
    kind = k.get("finetuning_type", "lora")
    lora_keys = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target", "use_dora", "additional_target")
    if kind == "full":
        r.set("method", "full", "finetuning_type")
        k.touch(*lora_keys)
        return
    if kind != "lora":  # freeze and oft are refused (fitcheck.readers.unposed)
        raise InputError(f"{p}: finetuning_type {_short(kind)} is not one of lora, full")
    bits = as_int(k.get("quantization_bit"), "quantization_bit", p)
    method = k.get("quantization_method", "bnb")
    k.touch("quantization_type")
    if bits == 4 and method in BNB:
        r.set("method", "qlora", "quantization_bit")
        r.set(
            "double_quant",
            as_bool(k.get("double_quantization"), "double_quantization", p),
            "double_quantization",
        )
    else:
        r.set("method", "lora", "finetuning_type")
        if bits == 8 and method in BNB:
            r.set("base_quant", "int8", "quantization_bit")
        elif bits is not None and method in ("gptq", "awq"):
            r.set("base_quant", str(method), "quantization_method")
        elif bits is not None:
            r.note(f"quantization_method {method} with {bits} bits has no fitcheck memory model")
        k.touch("double_quantization")
    r.set("lora_rank", as_int(k.get("lora_rank"), "lora_rank", p), "lora_rank")
    r.set("lora_alpha", as_float(k.get("lora_alpha"), "lora_alpha", p), "lora_alpha")
    r.set("lora_dropout", as_float(k.get("lora_dropout"), "lora_dropout", p), "lora_dropout")
    r.set("lora_targets", _targets(names.modules(k.get("lora_target"), "lora_target", p)), "lora_target")
    r.set("dora", as_bool(k.get("use_dora"), "use_dora", p), "use_dora")
    extra = names.modules(k.get("additional_target"), "additional_target", p)
    r.set("train_modules", ",".join(extra) or None, "additional_target")
    k.touch("pissa_iter", "pissa_convert")  # FSVD steps at load; conversion when saving
    if as_bool(k.get("pissa_init"), "pissa_init", p):
        # model/adapter.py @ff6d4d12: init_lora_weights="pissa" / "pissa_niter_{pissa_iter}"
        r.note(
            "pissa_init: PiSSA initialises the adapters from an SVD of each target weight when the model "
            "loads; the step is LoRA's, sized as such (the one-off SVD is not)"
        )


def _targets(modules: list[str]) -> str | None:
    """``lora_target``: the single name ``all`` is LLaMA-Factory's own rule (model/adapter.py
    @ff6d4d12 ``_setup_lora_tuning``: ``len(lora_target) == 1 and lora_target[0] == "all"``), not
    peft's all-linear; other names go through as names."""
    if modules == ["all"]:
        return LMF_ALL
    return names.targets(modules)
