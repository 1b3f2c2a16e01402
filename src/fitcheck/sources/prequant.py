"""Pre-quantized checkpoints: a config.json's ``quantization_config`` read the way transformers loads it.

transformers builds the quantized model a repo's config names (``AutoHfQuantizer`` from
``config.quantization_config``), whatever the user meant to train, so ``unsloth/llama-3-8b-bnb-4bit``
under LoRA is QLoRA in memory terms. What fitcheck does per ``quant_method`` (docs/methodology.md,
"Pre-quantized checkpoints"; transformers ``src/transformers/quantizers/``, commits named beside each
fact):

==================  ==========================================================================================
bitsandbytes 4-bit  ``load_in_4bit`` / ``_load_in_4bit``: the base is ``Params4bit`` in the stated
                    ``bnb_4bit_quant_type`` (nf4 or fp4: the same packed bytes and absmax blocks),
                    ``bnb_4bit_use_double_quant`` and ``bnb_4bit_quant_storage`` (``BitsAndBytesConfig``
                    defaults fp4, no double quantization, uint8). LoRA on it is the engine's QLoRA path.
bitsandbytes 8-bit  ``load_in_8bit``: ``Linear8bitLt``, the engine's ``--base-quant int8``.
gptq                ``bits`` 4 or 8 at any ``group_size`` (-1: per-channel; the engine's ``gptq`` /
                    ``gptq-int8`` layouts, `fitcheck.engine.quant`); other widths are refused, not guessed.
awq                 ``bits`` 4, any ``group_size``, ``version`` gemm with zero points (AutoAWQ's
                    ``WQLinear_GEMM``, the layer peft wraps: peft tuners/lora/awq.py); others refused.
mxfp4, fp8          not trainable as stored (quantizer_mxfp4.py and quantizer_finegrained_fp8.py
                    ``is_trainable`` False); transformers trains them dequantized to bf16
                    (``Mxfp4Config(dequantize=True)``, ``FineGrainedFP8Config(dequantize=True)``), so the
                    weights are sized at the training precision, with a note.
compressed-tensors  trainable once decompressed (quantizer_compressed_tensors.py: ``is_qat_trainable`` when
                    ``run_compressed`` is off, the model then decompressed after loading): sized at the
                    training precision, with a note; a run that keeps it compressed is not modelled.
fbgemm_fp8          refused: transformers cannot train it (``is_trainable`` False, no dequantized load).
anything else       refused with one line (hqq, quanto, torchao, eetq, ...): their layouts are not modelled.
==================  ==========================================================================================

Full fine-tuning of a checkpoint kept quantized (bitsandbytes, GPTQ, AWQ) is refused: transformers'
``Trainer`` raises "You cannot perform fine-tuning on purely quantized models" when no adapters are
attached (trainer.py ``Trainer.__init__``; transformers 5: trainer_utils
``validate_quantization_for_training``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from fitcheck.engine.quant import GROUP  # the group size the engine's GPTQ / AWQ layouts hold
from fitcheck.errors import ModelSourceError, OptionError
from fitcheck.terminal import clipped
from fitcheck.vocab import BaseQuant, QuantStorage

Scheme = Literal["bnb-4bit", "bnb-8bit", "gptq", "awq", "mxfp4", "fp8", "compressed-tensors"]

#: ``bnb_4bit_quant_storage`` (a torch dtype name) -> fitcheck's ``--quant-storage`` word.
_STORAGE: dict[str, QuantStorage] = {
    "uint8": "uint8", "bfloat16": "bf16", "float16": "fp16", "float32": "fp32",
}  # fmt: skip


@dataclass(frozen=True)
class PreQuant:
    """What a checkpoint's ``quantization_config`` makes of its base under training."""

    scheme: Scheme
    #: The engine's base under LoRA: ``none`` for the NF4 path (``method qlora``) and the dequantized ones.
    base_quant: BaseQuant
    #: Sized at the training precision (transformers dequantizes it to train).
    dequantized: bool
    #: bitsandbytes 4-bit only: double quantization and storage dtype as the checkpoint states them.
    double_quant: bool = False
    quant_storage: QuantStorage | None = None
    #: Modules the checkpoint keeps unquantized (``llm_int8_skip_modules`` / ``modules_to_not_convert``).
    skip: tuple[str, ...] = ()
    #: What was read, in words (the note).
    read: str = ""
    #: compressed-tensors: bits per packed weight value (``config_groups.*.weights.num_bits``, one for all
    #: groups), 0 when the groups differ or do not say.
    bits: int = 0
    #: GPTQ / AWQ ``group_size`` (-1: per-channel).
    group: int = GROUP

    @property
    def method(self) -> Literal["qlora", "lora"]:
        """The engine's method for LoRA on this base."""
        return "qlora" if self.scheme == "bnb-4bit" else "lora"


def _shown(value: object) -> str:
    """A value from the file, quoted for a one-line error: its repr (control characters escaped), cut."""
    return clipped(repr(value))


def _q(cfg: Mapping[str, Any]) -> Mapping[str, Any] | None:
    q = cfg.get("quantization_config")
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise ModelSourceError(f"quantization_config must be a JSON object, not {type(q).__name__}")
    return q


def _flag(q: Mapping[str, Any], *keys: str) -> bool:
    for key in keys:
        value = q.get(key)
        if value is not None and not isinstance(value, bool):
            raise ModelSourceError(f"quantization_config.{key} must be true or false (got {_shown(value)})")
        if value:
            return True
    return False


def _int(q: Mapping[str, Any], keys: tuple[str, ...], default: int | None) -> int | None:
    for key in keys:
        value = q.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise ModelSourceError(f"quantization_config.{key} must be an integer (got {_shown(value)})")
        return value
    return default


def _text(q: Mapping[str, Any], key: str, default: str) -> str:
    value = q.get(key)
    if value is None:
        return default
    if not isinstance(value, str):
        raise ModelSourceError(f"quantization_config.{key} must be a string (got {_shown(value)})")
    return value.lower()


#: Bounds on a skip list (real ones name a few modules; transformers' own adds lm_head): entries and length.
MAX_SKIP, MAX_SKIP_NAME = 4096, 512


def _names(q: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = q.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ModelSourceError(f"quantization_config.{key} must be a list of module names")
    if len(value) > MAX_SKIP or any(len(v) > MAX_SKIP_NAME or "," in v or not v.strip() for v in value):
        raise ModelSourceError(
            f"quantization_config.{key}: at most {MAX_SKIP} module names of at most {MAX_SKIP_NAME} "
            "characters, none empty or holding a comma"
        )
    return tuple(dict.fromkeys(v.strip() for v in value))


def _group(q: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    """``group_size``: rows per quantization group, or -1 for one group per column (per-channel)."""
    group = _int(q, keys, GROUP)
    if group is None or (group < 1 and group != -1) or group > 10**7:
        key = next((k for k in keys if q.get(k) is not None), keys[0])
        raise ModelSourceError(
            f"quantization_config.{key} must be a positive number of rows or -1 (got {_shown(group)})"
        )
    return group


def scheme_of(cfg: Mapping[str, Any]) -> str | None:
    """The ``quant_method`` word of a config (bitsandbytes configs written before ``quant_method``
    existed name ``load_in_4bit`` / ``load_in_8bit`` only: transformers' ``AutoQuantizationConfig``
    reads them as bitsandbytes); None when the config carries no ``quantization_config``."""
    q = _q(cfg)
    if q is None:
        return None
    method = q.get("quant_method")
    if method is not None and not isinstance(method, str):
        raise ModelSourceError(f"quantization_config.quant_method must be a string (got {_shown(method)})")
    if method is None and any(
        k in q for k in ("load_in_4bit", "load_in_8bit", "_load_in_4bit", "_load_in_8bit")
    ):
        return "bitsandbytes"
    if not isinstance(method, str) or not method:
        raise ModelSourceError(
            "quantization_config has no quant_method (transformers refuses such a config: 'has no "
            "`quant_method` attribute')"
        )
    return method.lower()


def _bnb(q: Mapping[str, Any]) -> PreQuant:
    four, eight = _flag(q, "load_in_4bit", "_load_in_4bit"), _flag(q, "load_in_8bit", "_load_in_8bit")
    if four == eight:
        raise ModelSourceError(
            "quantization_config (bitsandbytes) must set exactly one of load_in_4bit and load_in_8bit"
        )
    skip = _names(q, "llm_int8_skip_modules")
    if eight:
        if _flag(q, "llm_int8_has_fp16_weight"):
            raise ModelSourceError(
                "quantization_config: llm_int8_has_fp16_weight keeps 16-bit weights beside the int8 ones; "
                "that layout is not modelled"
            )
        return PreQuant("bnb-8bit", "int8", False, skip=skip, read="bitsandbytes 8-bit (LLM.int8)")
    kind = _text(q, "bnb_4bit_quant_type", "fp4")
    if kind not in ("nf4", "fp4"):
        raise ModelSourceError(
            f"quantization_config.bnb_4bit_quant_type must be nf4 or fp4 (got {_shown(kind)})"
        )
    storage_name = _text(q, "bnb_4bit_quant_storage", "uint8").removeprefix("torch.")
    storage = _STORAGE.get(storage_name)
    if storage is None:
        raise ModelSourceError(
            f"quantization_config.bnb_4bit_quant_storage {_shown(storage_name)} is not one of "
            f"{', '.join(_STORAGE)}"
        )
    dq = _flag(q, "bnb_4bit_use_double_quant")
    dq_word = "on" if dq else "off"
    read = f"bitsandbytes 4-bit {kind.upper()}, double quantization {dq_word}, storage {storage_name}"
    return PreQuant("bnb-4bit", "none", False, dq, storage, skip, read)


def _gptq(q: Mapping[str, Any]) -> PreQuant:
    bits = _int(q, ("bits",), None)
    group = _group(q, ("group_size",))
    if q.get("is_marlin_format") or _text(q, "checkpoint_format", "gptq") not in ("gptq", "gptq_v2"):
        raise ModelSourceError(
            "quantization_config: a GPTQ checkpoint in Marlin or another repacked format is not modelled "
            "(fitcheck sizes the AutoGPTQ layout: checkpoint_format gptq)"
        )
    if bits not in (4, 8):
        raise ModelSourceError(
            f"quantization_config: GPTQ at {bits} bits is not modelled (fitcheck holds the 4- and 8-bit "
            "layouts)"
        )
    base: BaseQuant = "gptq" if bits == 4 else "gptq-int8"
    return PreQuant(
        "gptq",
        base,
        False,
        skip=_names(q, "modules_to_not_convert"),
        read=f"GPTQ {bits}-bit, {_group_words(group)}",
        group=group,
    )


def _group_words(group: int) -> str:
    return "per-channel (group_size -1)" if group == -1 else f"group {group}"


def _awq(q: Mapping[str, Any]) -> PreQuant:
    bits = _int(q, ("bits", "w_bit"), 4)
    group = _group(q, ("group_size", "q_group_size"))
    version = _text(q, "version", "gemm")
    zero = q.get("zero_point", True)
    if bits != 4 or version != "gemm" or zero is not True:
        raise ModelSourceError(
            f"quantization_config: AWQ {_shown(version)} at {bits} bits, zero_point {_shown(zero)} is "
            "not modelled (fitcheck holds AutoAWQ's WQLinear_GEMM at 4 bits with zero points; peft wraps "
            "only that layer)"
        )
    return PreQuant(
        "awq",
        "awq",
        False,
        skip=_names(q, "modules_to_not_convert"),
        read=f"AWQ 4-bit GEMM, {_group_words(group)}",
        group=group,
    )


#: quant_method words transformers knows whose layouts fitcheck does not model (quantizers/auto.py).
NOT_MODELLED = (
    "its layout is not modelled; size the unquantized release (its config.json without quantization_config)"
)


def read_prequant(cfg: Mapping[str, Any]) -> PreQuant | None:
    """The checkpoint's quantization as the engine sizes it; None for a 16-bit checkpoint.

    Raises:
        ModelSourceError: a malformed ``quantization_config``, or a scheme or variant not modelled.
    """
    method = scheme_of(cfg)
    if method is None:
        return None
    q = _q(cfg) or {}
    if method == "bitsandbytes":
        return _bnb(q)
    if method == "gptq":
        return _gptq(q)
    if method == "awq":
        return _awq(q)
    if method == "mxfp4":
        return PreQuant("mxfp4", "none", True, read="MXFP4")
    if method == "fp8":
        return PreQuant(
            "fp8", "none", True, skip=_names(q, "modules_to_not_convert"), read="fine-grained FP8"
        )
    if method == "compressed-tensors":
        return PreQuant("compressed-tensors", "none", True, read="compressed-tensors", bits=_ct_bits(q))
    why = UNTRAINABLE.get(method, NOT_MODELLED)
    raise ModelSourceError(f"quantization_config quant_method {_shown(method)}: {why}")


#: Schemes transformers cannot fine-tune at all (``is_trainable`` False and no dequantized load), so no
#: estimate is an answer: Llama 4's FP8 uploads (quantizers/quantizer_fbgemm_fp8.py @03904cb3).
UNTRAINABLE = {
    "fbgemm_fp8": "transformers cannot fine-tune it (FbgemmFp8HfQuantizer.is_trainable is False, and it has "
    "no dequantized load); size the bf16 release (its config.json without quantization_config)",
}


def _ct_bits(q: Mapping[str, Any]) -> int:
    """The one ``num_bits`` of a compressed-tensors config's weight groups, else 0 (bounded reading: a
    malformed block is no error here, it only leaves packed weights uncounted in the header check)."""
    groups = q.get("config_groups")
    found: set[object] = set()
    if isinstance(groups, Mapping):
        for group in list(groups.values())[:64]:
            weights = group.get("weights") if isinstance(group, Mapping) else None
            found.add(weights.get("num_bits") if isinstance(weights, Mapping) else None)
    bits = found.pop() if len(found) == 1 else 0
    return bits if isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 8 else 0


def note(pq: PreQuant) -> str:
    """The line an estimate carries for a pre-quantized checkpoint (what was read, what it means)."""
    if pq.dequantized:
        return ""  # the MXFP4 / FP8 notes (sources.resolve) say it
    how = (
        "LoRA on it is QLoRA in memory terms (sized as --method qlora with the checkpoint's settings)"
        if pq.scheme == "bnb-4bit"
        else f"LoRA on it is sized as --base-quant {pq.base_quant}"
    )
    shown = ", ".join(pq.skip[:4]) + (f" and {len(pq.skip) - 4} more" if len(pq.skip) > 4 else "")
    skipped = (
        f"; it keeps {clipped(shown, 120)} unquantized: the layer projections these name are sized at the "
        "unquantized dtype (modules outside the layers, such as lm_head, are unquantized anyway)"
        if pq.skip
        else ""
    )
    return f"pre-quantized checkpoint ({pq.read}, from config.json's quantization_config): {how}{skipped}"


#: Trainers that load a transformers checkpoint's quantized layers as they are (the others convert the
#: weights into their own model: torchtune's and litgpt's checkpointers, MLX), per scheme: Unsloth's
#: ``FastLanguageModel`` loads bitsandbytes 4-bit repos (its own ``-bnb-4bit`` uploads), not GPTQ or AWQ.
_RUNNERS: dict[str, tuple[str, ...]] = {
    "bnb-4bit": ("generic", "hf", "axolotl", "llamafactory", "unsloth"),
    "bnb-8bit": ("generic", "hf", "axolotl", "llamafactory"),
    "gptq": ("generic", "hf", "axolotl", "llamafactory"),
    "awq": ("generic", "hf", "axolotl", "llamafactory"),
}


def _check_runner(what: str, pq: PreQuant, values: Mapping[str, object]) -> None:
    """The trainer and backend must run the checkpoint's quantized layers."""
    trainer = str(values.get("trainer") or "generic")
    if trainer not in _RUNNERS[pq.scheme]:
        raise OptionError(
            f"{what}: --trainer {trainer} does not load its quantized layers; use --trainer "
            f"{' or '.join(_RUNNERS[pq.scheme][1:])}"
        )
    backend = values.get("backend", "cuda")
    if pq.scheme != "bnb-4bit" and backend in ("mps", "cpu"):
        raise OptionError(f"{what}: its kernels need CUDA; size it on a CUDA GPU (--on rtx-4090, --on 24GB)")


def apply(name: str, cfg: Mapping[str, Any] | None, values: dict[str, object]) -> dict[str, object]:
    """The setup values with the checkpoint's quantization in force: LoRA becomes LoRA on the stored
    base; full fine-tuning and a conflicting ``--method qlora`` / ``--base-quant`` are refused."""
    pq = read_prequant(cfg) if cfg else None
    if pq is None or pq.dequantized:
        return values
    method = values.get("method", "lora")
    what = f"{name} is a pre-quantized checkpoint ({pq.read})"
    if method == "full":
        raise OptionError(
            f"{what}: transformers' Trainer refuses to fine-tune a quantized model without adapters; use "
            "--method lora, or size the unquantized release"
        )
    if method not in ("lora", "qlora"):
        raise OptionError(f"{what}: --method {method} on a quantized base is not modelled; use --method lora")
    if method == "qlora" and pq.method != "qlora":
        raise OptionError(f"{what}: --method qlora quantizes a 16-bit base to NF4; use --method lora on it")
    _check_runner(what, pq, values)
    given = values.get("base_quant", "none")
    if given not in (None, "none", pq.base_quant):
        raise OptionError(f"{what}: --base-quant {given} contradicts it; drop --base-quant")
    out = {**values, "method": pq.method, "quant_skip": ",".join(pq.skip)}
    if pq.scheme != "bnb-4bit":
        return {**out, "base_quant": pq.base_quant, "quant_group": pq.group}
    storage = values.get("quant_storage")
    if storage is not None and storage != pq.quant_storage:
        raise OptionError(f"{what}: --quant-storage {storage} contradicts it; drop --quant-storage")
    if values.get("double_quant") is False and pq.double_quant:  # off is never the default: asked for
        raise OptionError(f"{what}: --no-double-quant contradicts it; drop --no-double-quant")
    return {**out, "base_quant": "none", "double_quant": pq.double_quant, "quant_storage": pq.quant_storage}


#: Tensors a quantized checkpoint stores beside its weights that are no parameter of the model, by the
#: last part of their name: bitsandbytes 4-bit ``QuantState`` (``absmax``, ``quant_map``, ``nested_*``,
#: ``quant_state.bitsandbytes__nf4``; bitsandbytes functional.py ``QuantState.as_dict``), 8-bit ``SCB`` and
#: ``weight_format`` (bitsandbytes nn/modules.py ``Linear8bitLt._save_to_state_dict``), GPTQ / AWQ
#: ``qzeros``, ``scales``, ``g_idx`` (AutoGPTQ ``QuantLinear``, AutoAWQ ``WQLinear_GEMM`` buffers), FP8
#: ``weight_scale_inv`` (transformers integrations/finegrained_fp8.py ``FP8Linear``) and the
#: ``weight_scale`` / ``input_scale`` of other FP8 writers, MXFP4 ``*_scales`` (integrations/mxfp4.py).
_STATE: dict[str, tuple[str, ...]] = {
    "bnb-4bit": ("absmax", "quant_map", "nested_absmax", "nested_quant_map", "bitsandbytes__nf4",
                 "bitsandbytes__fp4"),
    "bnb-8bit": ("SCB", "weight_format"),
    "gptq": ("qzeros", "scales", "g_idx"),
    "awq": ("qzeros", "scales"),
    "fp8": ("weight_scale_inv", "weight_scale", "input_scale"),
    "mxfp4": (),
    "compressed-tensors": ("weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx", "input_scale",
                           "weight_global_scale", "input_global_scale"),
}  # fmt: skip


def _itemsize(dtype: str) -> int:
    from fitcheck.sources.safetensors_header import DTYPES, ITEMSIZE

    return next((ITEMSIZE[k] for k, v in DTYPES.items() if v == dtype), 1)


def unpacked(pq: PreQuant, name: str, dtype: str, numel: int, names: frozenset[str]) -> tuple[int, str]:
    """Parameters of the unquantized model one stored tensor holds, and its group's dtype label: quantization
    state counts none; a packed weight counts the values it packs (bitsandbytes 4-bit: two per byte of its
    storage dtype, ``Params4bit``; GPTQ / AWQ ``qweight``: ``32 // bits`` per int32); others as stored."""
    last = name.rsplit(".", 1)[-1]
    if last in _STATE[pq.scheme] or (pq.scheme == "mxfp4" and dtype == "uint8" and name.endswith("_scales")):
        return 0, pq.scheme
    if pq.scheme == "bnb-4bit" and f"{name}.absmax" in names:
        return numel * _itemsize(dtype) * 2, pq.scheme
    if pq.scheme in ("gptq", "awq") and last == "qweight":
        return numel * 32 // (8 if pq.base_quant == "gptq-int8" else 4), pq.scheme
    if pq.scheme == "compressed-tensors" and last == "weight_packed" and pq.bits:
        return numel * _itemsize(dtype) * 8 // pq.bits, pq.scheme
    if pq.scheme == "mxfp4" and dtype == "uint8" and name.endswith("_blocks"):
        return 2 * numel, pq.scheme
    return numel, dtype
