"""torchtune recipe YAML (``tune run <recipe> --config config.yaml``).

Mapping, after torchtune's recipes and builders (pytorch/torchtune recipes/lora_finetune_single_device.py,
full_finetune_single_device.py, the *_distributed recipes, torchtune/models/*/_model_builders.py;
0.6.1; tests/data/trainer_keys/torchtune_keys.txt): the ``model._component_`` builder names the
method (``lora_*`` LoRA, ``qlora_*`` QLoRA with an NF4 base, otherwise full) and the model
(``llama3_2_1b`` is Llama 3.2 1B); ``lora_attn_modules`` (torchtune names q_proj, k_proj, v_proj,
output_proj), ``apply_lora_to_mlp`` (w1, w2, w3), ``apply_lora_to_output`` (the output projection);
``tokenizer.max_seq_len``; ``batch_size``; ``gradient_accumulation_steps``;
``enable_activation_checkpointing`` / ``enable_activation_offloading``; ``dtype``;
``optimizer._component_``; ``optimizer_in_bwd`` (full fine-tuning); ``loss._component_`` (chunked or linear
cross-entropy; ``torch.nn.CrossEntropyLoss`` on the whole fp32 logits); ``compile`` (torch.compile on each
layer and the loss); ``fsdp_cpu_offload`` and
``custom_sharded_layers`` (``['tok_embeddings', 'output']``: ``--fsdp-embedding-units``) in the
distributed recipes.

What fitcheck cannot pose is refused with one line naming the key (``refusal``): a file without an
``optimizer`` (the generate, eleuther_eval and quantize recipes), knowledge distillation, PPO, GRPO, DPO,
quantization-aware training, tensor parallelism and the multimodal builders (Llama 3.2 Vision, Llama 4).
The recipe a config runs is named in its header comment (``# Config for ... in
lora_finetune_distributed.py``);
a ``*_distributed`` / ``*fsdp*`` recipe shards with FSDP2 ``fully_shard`` (training/_distributed.py
shard_model, ``reshard_after_forward=cfg.get("fsdp_reshard_after_forward", True)``,
recipes/full_finetune_distributed.py @bd2a0fc7), read as ``--strategy fsdp`` (``fsdp-grad-op`` when it
does not reshard).
"""

from __future__ import annotations

import re

from fitcheck.errors import InputError
from fitcheck.readers import names
from fitcheck.readers.base import (
    Doc,
    Keys,
    Reading,
    ReadResult,
    _short,
    as_bool,
    as_float,
    as_int,
    as_word,
    several_examples,
)

FORMAT = "torchtune"
TRAINER = "torchtune"

#: torchtune model family (module name) -> fitcheck preset id prefix.
FAMILIES = {
    "llama3_3": "llama-3.3-",
    "llama3_2": "llama-3.2-",
    "llama3_1": "llama-3.1-",
    "llama3": "llama-3-",
    "llama2": "llama-2-",
    "qwen2_5": "qwen2.5-",
    "qwen2": "qwen2-",
    "qwen3": "qwen3-",
    "gemma2": "gemma-2-",
    "gemma": "gemma-",
}
#: Builders whose preset id is not family + size (torchtune/models/{mistral,phi3,phi4}/_model_builders.py
#: @bd2a0fc7: mistral_7b is Mistral 7B v0.1's shape, vocab 32,000; phi3_mini is Phi-3-mini-4k, vocab
#: 32,064; phi4_14b is Phi-4, vocab 100,352).
BUILDER_PRESETS = {"mistral_7b": "mistral-7b-v0.1", "phi3_mini": "phi-3-mini", "phi4_14b": "phi-4"}
#: Model families fitcheck cannot pose: a vision encoder and fusion layers beside the decoder
#: (torchtune/models/llama3_2_vision, llama4: early-fusion multimodal MoE).
MULTIMODAL = ("llama3_2_vision", "llama4")
#: ``<family>_<size>[_base|_instruct]`` after the builder's module name (``qwen3.qwen3_0_6b_instruct``).
_SIZE = re.compile(r"^(?P<size>\d+(?:_\d+)?[bm])(?:_base|_instruct)?$")
#: Loss components -> fitcheck's loss kernel (torchtune/modules/loss). ``torch.nn.CrossEntropyLoss`` (every
#: 2024 config, e.g. llama2/7B_qlora_single_device.yaml @c51bafc7) leaves the model unchunked: the recipes
#: call ``set_num_output_chunks`` only for ``CEWithChunkedOutputLoss``, so the decoder returns the whole
#: ``self.output(h).float()`` (modules/transformer.py ``unembed`` @bd2a0fc7, ``forward`` @c51bafc7) and
#: cross-entropy runs over those fp32 logits: the lm_head output, its fp32 copy and the fp32 log-softmax,
#: fitcheck's ``standard`` hump, not the chunked one the recipes default to.
LOSSES = {
    "CEWithChunkedOutputLoss": "chunked",
    "LinearCrossEntropyLoss": "chunked",
    "CrossEntropyLoss": "standard",
}


#: Keys only a recipe fitcheck cannot pose reads -> that recipe (pytorch/torchtune recipes/ @bd2a0fc7).
_KD = "knowledge distillation (knowledge_distillation_*.py: a teacher model beside the student)"
UNPOSED: tuple[tuple[str, str], ...] = (
    ("teacher_model", _KD),
    ("kd_loss", _KD),
    ("policy_model", "PPO (ppo_full_finetune_single_device.py: policy, reference, reward and value models)"),
    ("reward_and_value_model", "PPO (ppo_full_finetune_single_device.py: reward and value models)"),
    ("grpo_samples", "GRPO (dev/grpo_full_finetune_distributed.py: a reference model and generated groups)"),
    ("ref_checkpointer", "preference training with a reference model (full_dpo_distributed.py, GRPO)"),
    ("quantizer", "quantization-aware training (qat_*.py: fake-quantized weights and activations)"),
)
#: Keys of the recipes that do not train (generate.py, dev/generate_v2*.py, eleuther_eval.py, quantize.py,
#: dev/async_grpo's inference block): with no ``optimizer`` they mark a config fitcheck cannot size.
NOT_TRAINING = ("prompt", "max_new_tokens", "tasks", "quantizer", "enable_kv_cache", "inference")
#: The header comment names the recipe: ``# Config for ... in lora_finetune_distributed.py``.
_RECIPE = re.compile(r"^#.*?\b(?P<recipe>[a-z0-9_]+)\.py\b", re.MULTILINE)


def recipe_of(text: str) -> str | None:
    """The recipe a torchtune config's leading comment names (its own convention), if any."""
    head = []
    for line in text.splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            break
        head.append(line)
    m = _RECIPE.search("\n".join(head))
    return m.group("recipe") if m else None


def refusal(data: Doc, path: str) -> str | None:
    """Why fitcheck cannot pose this config's run, or None (the line names the key that says so)."""
    used = next((key for key in NOT_TRAINING if data.get(key) is not None), None)
    if data.get("optimizer") is None and used is not None:
        return (
            f"--from {path}: {used} and no optimizer: a generation, evaluation or quantization config "
            "(torchtune's generate, eleuther_eval, quantize recipes), not a training run fitcheck sizes"
        )
    for key, what in UNPOSED:
        if data.get(key) is not None:
            return f"--from {path}: {key}: {what} is not a run fitcheck models"
    loss = data.get("loss")
    comp = str(loss.get("_component_", "")) if isinstance(loss, dict) else ""
    if ".rlhf." in comp:
        return (
            f"--from {path}: loss._component_ {comp.rsplit('.', 1)[-1]}: preference training (lora_dpo_*.py: "
            "chosen and rejected sequences in one forward, and a reference pass) is not a run fitcheck models"
        )
    tp = data.get("tensor_parallel_dim")
    if isinstance(tp, int) and not isinstance(tp, bool) and tp > 1:
        return f"--from {path}: tensor_parallel_dim {tp}: tensor parallelism is not modelled by fitcheck"
    return None


def read(data: Doc, path: str, recipe: str | None = None) -> ReadResult:
    """Read a torchtune recipe config; ``recipe`` is what its header comment names (`recipe_of`)."""
    why = refusal(data, path)
    if why is not None:
        raise InputError(why)
    k = Keys(data)
    r = Reading(FORMAT, TRAINER, k, path)
    _model(r, k)
    _sharding(r, k, recipe)
    tok = k.sub("tokenizer")
    if tok is not None:
        r.set(
            "seq_len", as_int(tok.get("max_seq_len"), "tokenizer.max_seq_len", path), "tokenizer.max_seq_len"
        )
        tok.touch("_component_", "path")
        if tok.data.get("max_seq_len") is None:
            r.note("tokenizer.max_seq_len is null: examples keep their own length; give --seq-len")
    r.set("batch_size", as_int(k.get("batch_size"), "batch_size", path), "batch_size")
    r.set(
        "grad_accum",
        as_int(k.get("gradient_accumulation_steps"), "gradient_accumulation_steps", path),
        "gradient_accumulation_steps",
    )
    r.set(
        "grad_ckpt",
        as_bool(k.get("enable_activation_checkpointing"), "enable_activation_checkpointing", path),
        "enable_activation_checkpointing",
    )
    _selective_ac(r, k, recipe)
    if as_bool(k.get("enable_activation_offloading"), "enable_activation_offloading", path):
        r.set("offload_activations", True, "enable_activation_offloading")
    # the recipes read ``cfg.compile`` and compile each layer and the loss (training/_compile.py @30b8519e)
    r.set("compile", as_bool(k.get("compile"), "compile", path), "compile")
    dtype = as_word(k.get("dtype"), "dtype", path)
    if dtype is not None:
        r.set("precision", names.DTYPES.get(dtype), "dtype")
        if dtype not in names.DTYPES:
            r.note(f"dtype {_short(dtype)} is not a dtype fitcheck knows")
    _optimizer(r, k)
    _loss(r, k)
    _sharded_layers(r, k.get("custom_sharded_layers"))
    if as_bool(k.get("memory_efficient_fsdp_wrap"), "memory_efficient_fsdp_wrap", path):
        # torchtune 0.2's FSDP1 recipe wrapped the embedding and output in their own units with it
        # (torchtune/utils/_distributed.py @288ff443); no recipe reads it at @bd2a0fc7
        r.note(
            "memory_efficient_fsdp_wrap: read only by torchtune 0.2's FSDP1 recipe (embedding and output in "
            "their own units); today's recipes ignore it (custom_sharded_layers does that): not applied"
        )
    _dataset(r, k)
    _device(r, k)
    return r.result()


def _dataset(r: Reading, k: Keys) -> None:
    """``dataset.packed`` fills each row to max_seq_len; without it a micro-batch of several examples is
    padded to its longest (``padded_collate_sft``, torchtune/data/_collate.py) and carries no padding mask
    (torchtune's own attention runs causal), so only the steps' lengths vary."""
    ds = k.sub("dataset")
    packed = as_bool(ds.get("packed"), "dataset.packed", r.path) if ds is not None else None
    if packed:
        # torchtune/utils/_import_guard.py: FlexAttention (a BlockMask) on CUDA compute capability 7.5+;
        # elsewhere the packed rows' block-causal mask is a dense b x s x s tensor handed to SDPA
        r.note(
            "dataset.packed: rows are filled to max_seq_len tokens, as the estimate already assumes; "
            "torchtune attends over them with FlexAttention on an NVIDIA GPU of compute capability 7.5 or "
            "newer (sized as the posed attention kernel), elsewhere with SDPA and a dense block-causal "
            "b x s x s mask, which is not counted"
        )
        return
    batch = several_examples(r)
    if batch is not None:
        r.note(
            f"dataset not packed: each micro-batch of {batch} is padded to its longest example (no padding "
            "mask in torchtune's attention), so steps vary in length; the estimate fills every row to "
            "max_seq_len (the peak step), and --lengths varying adds the caching allocator's history over "
            "the run's lengths"
        )


def _device(r: Reading, k: Keys) -> None:
    """The recipe's ``device`` (``cuda`` by default in the configs); another names the machine to size."""
    device = k.get("device")
    if device is None:
        return
    word = str(device).split(":", 1)[0].strip().lower()
    if word != "cuda":
        r.note(f"device {_short(device)}: the recipe runs there; name that machine with --on (e.g. --on cpu)")


def _loss(r: Reading, k: Keys) -> None:
    """``loss._component_`` -> the loss kernel (`LOSSES`); another component is noted."""
    loss = k.sub("loss")
    if loss is None:
        return
    comp = str(loss.get("_component_", "")).rsplit(".", 1)[-1]
    r.set("loss", LOSSES.get(comp), "loss._component_")
    if comp == "CrossEntropyLoss":
        r.note(
            "loss._component_ CrossEntropyLoss: the model returns its whole logits in fp32 (no output "
            "chunks) and cross-entropy runs over them: sized as the unchunked loss (--loss standard)"
        )
    elif comp and comp not in LOSSES:
        r.note(
            f"loss._component_ {_short(comp)} has no fitcheck model; sized as the recipes' chunked "
            "cross-entropy (give --loss for another)"
        )


#: The recipes that read ``ac_mode`` / ``ac_option`` (``cfg.get("ac_mode", None)``; pytorch/torchtune
#: @bd2a0fc7).
AC_RECIPES = ("full_finetune_distributed", "qat_distributed", "early_exit_finetune_distributed")


def _selective_ac(r: Reading, k: Keys, recipe: str | None) -> None:
    """``ac_mode`` / ``ac_option``: recipes/full_finetune_distributed.py @bd2a0fc7 calls
    ``apply_selective_activation_checkpointing`` when ``ac_mode`` is set and
    ``enable_activation_checkpointing`` is not, and the full-layer wrapping only when ``ac_mode`` is unset:
    with both set, no layer is checkpointed. torchtune/training/activations.py ``checkpoint_wrapper``:
    ``full`` wraps every layer; ``selective`` wraps every ``ac_option``-th (0 or 1: every layer); any
    other mode wraps none."""
    mode = k.get("ac_mode")
    option = k.get("ac_option")
    k.touch("ac_mode", "ac_option")
    if mode is None:
        return
    name = (recipe or "").removesuffix(".py")
    if recipe is not None and name not in AC_RECIPES:
        r.note(f"ac_mode {_short(mode)}: recipe {recipe} does not read it (only {', '.join(AC_RECIPES)} do)")
        return
    if r.values.get("grad_ckpt"):
        r.set("grad_ckpt", False, "ac_mode")
        r.note(
            f"ac_mode {_short(mode)} with enable_activation_checkpointing True: the recipe applies neither "
            "(selective AC only without the flag, full AC only without ac_mode): no layer is checkpointed"
        )
        return
    every = option if isinstance(option, int) and not isinstance(option, bool) else None
    if mode == "full" or (mode == "selective" and every in (0, 1)):
        r.set("grad_ckpt", True, "ac_mode")
    elif mode == "selective" and every is not None and every > 1:
        r.set("grad_ckpt", False, "ac_mode")
        r.note(
            f"ac_mode selective, ac_option {every}: one layer in {every} is checkpointed; sized with no "
            "layer checkpointed (an upper bound on activations; --grad-ckpt gives the lower bound)"
        )
    elif mode == "selective":
        r.note(f"ac_mode selective with ac_option {_short(option)}: not a layer count; not modelled")
    else:
        r.set("grad_ckpt", False, "ac_mode")


#: Keys only the FSDP recipes read (recipes/full_finetune_distributed.py, lora_finetune_distributed.py
#: @bd2a0fc7).
FSDP_KEYS = (
    "fsdp_cpu_offload",
    "fsdp_reshard_after_forward",
    "custom_sharded_layers",
    "data_parallel_shard_dim",
)


def _sharding(r: Reading, k: Keys, recipe: str | None) -> None:
    """FSDP2 for the distributed recipes (the header's recipe, or a key only they read); CPU offload."""
    p = r.path
    fsdp = k.sub("fsdp")  # lora_finetune_fsdp2's older block: ``fsdp: {cpu_offload: ...}``
    offload = as_bool(k.get("fsdp_cpu_offload"), "fsdp_cpu_offload", p)
    if fsdp is not None:
        offload = offload or as_bool(fsdp.get("cpu_offload"), "fsdp.cpu_offload", p)
    if offload:
        r.set("offload", "all", "fsdp_cpu_offload")
    distributed = recipe is not None and ("distributed" in recipe or "fsdp" in recipe)
    keyed = [key for key in FSDP_KEYS if k.has(key)] + (["fsdp"] if fsdp is not None else [])
    if not (distributed or keyed):
        return
    where = f"recipe {recipe}" if distributed else keyed[0]
    reshard = as_bool(k.get("fsdp_reshard_after_forward"), "fsdp_reshard_after_forward", p)
    r.set("strategy", "fsdp-grad-op" if reshard is False else "fsdp", where)
    r.set("fsdp_version", 2, where)
    replicate = as_int(k.get("data_parallel_replicate_dim"), "data_parallel_replicate_dim", p)
    if replicate is not None and replicate > 1:
        r.set("strategy", "fsdp-hybrid", "data_parallel_replicate_dim")
    k.touch("data_parallel_shard_dim", "tensor_parallel_dim", "tensor_parallel_plan")
    if distributed:
        r.note(f"the header names recipe {recipe}: FSDP2 (fully_shard) over the target's GPUs")


#: ``custom_sharded_layers`` names the modules the distributed recipes give their own FSDP2 unit
#: (``lambda n, m: n in custom_sharded_layers``, recipes/full_finetune_distributed.py @30b8519e).
EMBEDDING_UNITS = ("tok_embeddings", "output")


def _sharded_layers(r: Reading, value: object) -> None:
    """``['tok_embeddings', 'output']`` -> ``--fsdp-embedding-units``; other lists are noted."""
    if value is None:
        return
    named = [str(v) for v in value] if isinstance(value, list) else [str(value)]
    if not named:
        return
    if set(named) == set(EMBEDDING_UNITS):
        r.set("fsdp_embedding_units", True, "custom_sharded_layers")
        return
    r.note(
        f"custom_sharded_layers {named}: only ['tok_embeddings', 'output'] together is modelled "
        "(--fsdp-embedding-units); the estimate keeps the modules named in the root unit (an upper bound)"
    )


def _model(r: Reading, k: Keys) -> None:
    model = k.sub("model")
    if model is None:
        r.note("no model: node; give MODEL")
        return
    p = r.path
    builder = str(model.get("_component_", ""))
    leaf = builder.rsplit(".", 1)[-1]
    family = builder.rsplit(".", 2)[-2] if builder.count(".") >= 2 else ""
    if family in MULTIMODAL:
        raise InputError(
            f"--from {p}: model._component_ {leaf}: a multimodal model ({family}: a vision encoder and "
            "fusion layers beside the decoder) is not one fitcheck models"
        )
    kind = next((pre for pre in ("lora_", "qlora_") if leaf.startswith(pre)), None)
    preset = _preset(family, leaf.removeprefix(kind or ""))
    where = "model._component_"
    if kind == "lora_" and as_bool(model.get("quantize_base"), "model.quantize_base", p):
        kind, where = "qlora_", "model.quantize_base"  # qlora_* = partial(lora_*, quantize_base=True)
    r.set("method", {"lora_": "lora", "qlora_": "qlora", None: "full"}[kind], where)
    r.model = preset or _checkpoint_dir(k)
    if preset is None:
        r.note(f"model builder {builder}: no fitcheck preset for it; MODEL is the checkpoint folder")
    if kind is None:
        return
    mods = [
        names.TORCHTUNE_MODULES.get(n, n)
        for n in names.modules(model.get("lora_attn_modules"), "lora_attn_modules", p)
    ]
    if as_bool(model.get("apply_lora_to_mlp"), "apply_lora_to_mlp", p):
        mods += ["gate_proj", "down_proj", "up_proj"]
    if as_bool(model.get("apply_lora_to_output"), "apply_lora_to_output", p):
        r.note("apply_lora_to_output: LoRA on the output projection is not modelled (a small adapter)")
    elif not mods and model.has("lora_attn_modules"):
        raise InputError(
            f"--from {p}: lora_attn_modules is empty and apply_lora_to_mlp is off: the LoRA model would "
            "have no adapter to train"
        )
    r.set("lora_targets", names.targets(mods), "model.lora_attn_modules")
    r.set("lora_rank", as_int(model.get("lora_rank"), "model.lora_rank", p), "model.lora_rank")
    r.set("lora_alpha", as_float(model.get("lora_alpha"), "model.lora_alpha", p), "model.lora_alpha")
    r.set("lora_dropout", as_float(model.get("lora_dropout"), "model.lora_dropout", p), "model.lora_dropout")
    r.set("dora", as_bool(model.get("use_dora"), "model.use_dora", p), "model.use_dora")
    model.touch("quantize_base")


def _preset(family: str, name: str) -> str | None:
    """The fitcheck preset a builder (``qwen3_0_6b_instruct`` of module ``qwen3``) stands for, when fitcheck
    has it (base and instruct builders differ only in ``max_seq_len``, qwen2_5/_model_builders.py,
    qwen3/_model_builders.py @bd2a0fc7)."""
    m = _SIZE.match(name.removeprefix(f"{family}_")) if name.startswith(f"{family}_") else None
    pid = BUILDER_PRESETS.get(name)
    if pid is None and m is not None and family in FAMILIES:
        pid = FAMILIES[family] + m.group("size").replace("_", ".")
    from fitcheck.presets import preset_ids

    return pid if pid in preset_ids("models") else None


def _checkpoint_dir(k: Keys) -> str | None:
    """``checkpointer.checkpoint_dir``, with a top-level ``${key}`` interpolation resolved (OmegaConf)."""
    ckpt = k.sub("checkpointer")
    where = ckpt.get("checkpoint_dir") if ckpt is not None else None
    if isinstance(where, str):
        ref = re.fullmatch(r"\$\{(\w+)\}", where)
        if ref and isinstance(k.data.get(ref.group(1)), str):
            k.touch(ref.group(1))
            return str(k.data[ref.group(1)])
    return str(where) if where else None


#: torch.optim classes whose step ``--optimizer-impl`` picks (Adam keeps AdamW's states and step).
TORCH_ADAMW = ("AdamW", "Adam")


def _optimizer(r: Reading, k: Keys) -> None:
    opt = k.sub("optimizer")
    if opt is not None:
        comp = str(opt.get("_component_", "")).rsplit(".", 1)[-1]
        if comp:
            r.set(
                "optimizer",
                names.optimizer(names.TORCH_OPTIM, comp, "optimizer._component_", r.notes),
                "optimizer._component_",
            )
        if comp in TORCH_ADAMW and str(opt.get("_component_", "")).startswith("torch.optim."):
            # torch.optim.AdamW(fused=...): unset, torch picks foreach on CUDA (optim/adamw.py)
            fused = as_bool(opt.get("fused"), "optimizer.fused", r.path)
            r.set("optimizer_impl", "fused" if fused else "foreach", "optimizer.fused")
            if not fused and as_bool(opt.get("foreach"), "optimizer.foreach", r.path) is False:
                # foreach=False: torch's single-tensor loop, one parameter's temporaries at a time
                r.note(
                    "optimizer.foreach False: torch's single-tensor AdamW step; sized with the foreach "
                    "step's temporaries (an upper bound; fitcheck has no single-tensor step)"
                )
        opt.touch("fused", "foreach", "lr", "weight_decay", "betas", "eps")
    if as_bool(k.get("optimizer_in_bwd"), "optimizer_in_bwd", r.path):
        # read by the full fine-tuning recipes only (full_finetune_*, ppo, qat @30b8519e and later)
        if r.values.get("method") == "full":
            r.set("optimizer_in_bwd", True, "optimizer_in_bwd")
        else:
            r.note("optimizer_in_bwd: only the full fine-tuning recipes read it; the LoRA recipes ignore it")
