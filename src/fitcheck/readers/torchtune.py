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
cross-entropy); ``compile`` (torch.compile on each layer and the loss); ``fsdp_cpu_offload`` and
``custom_sharded_layers`` (``['tok_embeddings', 'output']``: ``--fsdp-embedding-units``) in the
distributed recipes.
"""

from __future__ import annotations

import re

from fitcheck.readers import names
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, as_bool, as_float, as_int

FORMAT = "torchtune"
TRAINER = "torchtune"

#: torchtune model family (module name) -> fitcheck preset id prefix.
FAMILIES = {
    "llama3_3": "llama-3.3-",
    "llama3_2": "llama-3.2-",
    "llama3_1": "llama-3.1-",
    "llama2": "llama-2-",
    "qwen2_5": "qwen2.5-",
    "qwen3": "qwen3-",
    "gemma2": "gemma-2-",
}
_BUILDER = re.compile(r"^(?P<kind>lora_|qlora_)?(?P<family>[a-z0-9]+?(?:_\d)?)_(?P<size>\d+(?:_\d+)?[bm])$")
#: Loss components whose logits memory differs from the plain cross-entropy (torchtune/modules/loss).
LOSSES = {"CEWithChunkedOutputLoss": "chunked", "LinearCrossEntropyLoss": "chunked"}


def read(data: Doc, path: str) -> ReadResult:
    """Read a torchtune recipe config."""
    k = Keys(data)
    r = Reading(FORMAT, TRAINER, k, path)
    _model(r, k)
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
    if as_bool(k.get("enable_activation_offloading"), "enable_activation_offloading", path):
        r.set("offload_activations", True, "enable_activation_offloading")
    # the recipes read ``cfg.compile`` and compile each layer and the loss (training/_compile.py @30b8519e)
    r.set("compile", as_bool(k.get("compile"), "compile", path), "compile")
    dtype = k.get("dtype")
    if isinstance(dtype, str):
        r.set("precision", names.DTYPES.get(dtype), "dtype")
    _optimizer(r, k)
    loss = k.sub("loss")
    if loss is not None:
        comp = str(loss.get("_component_", "")).rsplit(".", 1)[-1]
        r.set("loss", LOSSES.get(comp), "loss._component_")
    if as_bool(k.get("fsdp_cpu_offload"), "fsdp_cpu_offload", path):
        r.set("offload", "all", "fsdp_cpu_offload")
    _sharded_layers(r, k.get("custom_sharded_layers"))
    ds = k.sub("dataset")
    if ds is not None and as_bool(ds.get("packed"), "dataset.packed", path):
        r.note("dataset.packed: rows are filled to max_seq_len tokens, as the estimate already assumes")
    return r.result()


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
    m = _BUILDER.match(leaf)
    kind = m.group("kind") if m else None
    if kind is None and leaf.startswith(("lora_", "qlora_")):
        kind = leaf.split("_", 1)[0] + "_"
    r.set("method", {"lora_": "lora", "qlora_": "qlora", None: "full"}[kind], "model._component_")
    if m and m.group("family") in FAMILIES:
        r.model = FAMILIES[m.group("family")] + m.group("size").replace("_", ".")
    else:
        ckpt = k.sub("checkpointer")
        where = ckpt.get("checkpoint_dir") if ckpt is not None else None
        r.model = str(where) if where else None
        r.note(f"model builder {builder}: no fitcheck preset for it; MODEL is the checkpoint folder")
    if kind is None:
        return
    mods = [names.TORCHTUNE_MODULES.get(n, n) for n in names.modules(model.get("lora_attn_modules"))]
    if as_bool(model.get("apply_lora_to_mlp"), "apply_lora_to_mlp", p):
        mods += ["gate_proj", "down_proj", "up_proj"]
    if as_bool(model.get("apply_lora_to_output"), "apply_lora_to_output", p):
        r.note("apply_lora_to_output: LoRA on the output projection is not modelled (a small adapter)")
    r.set("lora_targets", names.targets(mods), "model.lora_attn_modules")
    r.set("lora_rank", as_int(model.get("lora_rank"), "model.lora_rank", p), "model.lora_rank")
    r.set("lora_alpha", as_float(model.get("lora_alpha"), "model.lora_alpha", p), "model.lora_alpha")
    r.set("lora_dropout", as_float(model.get("lora_dropout"), "model.lora_dropout", p), "model.lora_dropout")
    r.set("dora", as_bool(model.get("use_dora"), "model.use_dora", p), "model.use_dora")
    model.touch("quantize_base")


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
        opt.touch("fused", "lr", "weight_decay", "betas", "eps")
    if as_bool(k.get("optimizer_in_bwd"), "optimizer_in_bwd", r.path):
        # read by the full fine-tuning recipes only (full_finetune_*, ppo, qat @30b8519e and later)
        if r.values.get("method") == "full":
            r.set("optimizer_in_bwd", True, "optimizer_in_bwd")
        else:
            r.note("optimizer_in_bwd: only the full fine-tuning recipes read it; the LoRA recipes ignore it")
