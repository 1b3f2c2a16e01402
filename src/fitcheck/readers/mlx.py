"""mlx-lm LoRA/DoRA/full YAML (``mlx_lm.lora --config config.yaml``).

Mapping, after mlx-lm's own code (ml-explore/mlx-lm mlx_lm/lora.py CONFIG_DEFAULTS and main,
mlx_lm/tuner/utils.py linear_to_lora_layers, @d78bf58e; tests/data/trainer_keys/mlx_lm_lora_keys.txt):
``fine_tune_type: lora|dora|full``; ``lora_parameters`` has ``rank``, ``scale`` (the update's direct
multiplier, so alpha = scale x rank), ``dropout`` and ``keys`` (module paths inside a block; unset:
every linear layer); ``max_seq_length``; ``batch_size``; ``grad_accumulation_steps``;
``grad_checkpoint``; ``optimizer``. QLoRA in mlx-lm is LoRA on a model quantized ahead of time: the
YAML cannot say so except through the model it loads, so a local model whose config.json carries a
4-bit ``quantization`` block, or a model named ``...4bit...``, reads as QLoRA (with a note).
``num_layers`` other than -1 (default 16) adapts, or for ``full`` unfreezes, only the last blocks, which
fitcheck does not model: noted as an upper bound.
"""

from __future__ import annotations

import re

from fitcheck.readers import names
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, as_bool, as_float, as_int, as_word

FORMAT = "mlx"
TRAINER = "mlx"
_FOUR_BIT = re.compile(r"(?:^|[-_/.])(?:4bit|4-bit|q4|int4)(?:$|[-_/.])", re.IGNORECASE)


def read(data: Doc, path: str, quantized_bits: int | None = None) -> ReadResult:
    """Read an mlx-lm config; ``quantized_bits`` is what the model folder's config.json says, if known."""
    k = Keys(data)
    r = Reading(FORMAT, TRAINER, k, path)
    model = k.get("model")
    r.model = str(model) if model else None
    kind = k.get("fine_tune_type", "lora")
    if kind == "full":
        r.set("method", "full", "fine_tune_type")
        k.touch("lora_parameters")
    else:
        if kind not in ("lora", "dora"):
            r.note(f"fine_tune_type {kind!r} is not one mlx-lm knows (lora, dora, full)")
        four = quantized_bits == 4 or (quantized_bits is None and r.model and _FOUR_BIT.search(r.model))
        r.set("method", "qlora" if four else "lora", "model" if four else "fine_tune_type")
        if four and quantized_bits is None:
            r.note(f"model {r.model} reads as a 4-bit MLX model from its name: QLoRA")
        r.set("dora", kind == "dora", "fine_tune_type")
        _lora(r, k)
    r.set("batch_size", as_int(k.get("batch_size"), "batch_size", path), "batch_size")
    r.set(
        "grad_accum",
        as_int(k.get("grad_accumulation_steps"), "grad_accumulation_steps", path),
        "grad_accumulation_steps",
    )
    r.set("seq_len", as_int(k.get("max_seq_length"), "max_seq_length", path), "max_seq_length")
    r.set("grad_ckpt", as_bool(k.get("grad_checkpoint"), "grad_checkpoint", path), "grad_checkpoint")
    optim = as_word(k.get("optimizer"), "optimizer", path)
    if optim is not None:
        r.set("optimizer", names.optimizer(names.MLX_OPTIM, optim.lower(), "optimizer", r.notes), "optimizer")
    k.touch("optimizer_config")
    _layers(r, k, kind == "full")
    return r.result()


#: mlx-lm's default ``num_layers`` (lora.py CONFIG_DEFAULTS @d78bf58e): only the last 16 blocks train.
DEFAULT_LAYERS = 16


def _layers(r: Reading, k: Keys, full: bool) -> None:
    """``num_layers``: LoRA adapts, and full fine-tuning unfreezes (lora.py: ``model.layers[-num_layers:]``),
    only the last blocks; fitcheck sizes every block trained, an upper bound, said so. 0 or less is every
    block (``model.layers[-max(num_layers, 0):]``: -0 slices from the start), as -1 is documented to be."""
    # lora_layers: the same setting under its name in mlx-lm before num_layers (ml-explore/mlx-examples
    # llms/mlx_lm/examples/lora_config.yaml @39084e81)
    key = "lora_layers" if k.has("lora_layers") and not k.has("num_layers") else "num_layers"
    layers = as_int(k.get(key), key, r.path)
    given = layers is not None
    layers = DEFAULT_LAYERS if layers is None else layers
    if layers <= 0:
        return
    what = "unfreezes" if full else "adapts"
    where = key if given else "num_layers unset (mlx-lm's default)"
    r.note(
        f"{where} {layers}: mlx-lm {what} only the last {layers} blocks; "
        "sized as every block (an upper bound)"
    )


def _lora(r: Reading, k: Keys) -> None:
    params = k.sub("lora_parameters")
    if params is None:
        return
    p = r.path
    rank = as_int(params.get("rank"), "lora_parameters.rank", p)
    scale = as_float(params.get("scale"), "lora_parameters.scale", p)
    r.set("lora_rank", rank, "lora_parameters.rank")
    if scale is not None:
        r.set("lora_alpha", scale * (rank or 8), "lora_parameters.scale")
    r.set(
        "lora_dropout",
        as_float(params.get("dropout"), "lora_parameters.dropout", p),
        "lora_parameters.dropout",
    )
    keys = names.modules(params.get("keys"), "lora_parameters.keys", p)
    r.set("lora_targets", names.targets(keys), "lora_parameters.keys")
