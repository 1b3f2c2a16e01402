"""Size a ``model_type`` without a table row from transformers itself, on the meta device.

transformers builds the model from the config with no weights (``torch.device("meta")``), which gives
the exact parameter inventory. The shape fields the engine needs (width, depth, heads, MLP width,
vocabulary) come from the shared config keys, so activations follow the generic decoder rule; the
parameters the generic shape does not account for are carried as ``misc_params`` so the total is the
model's own. Both facts are returned as a warning for the estimate. Only types transformers ships are
built (no ``trust_remote_code``: fitcheck never runs a repository's code).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.engine.params import count_params
from fitcheck.errors import ModelSourceError
from fitcheck.models import DecoderArch
from fitcheck.sources.hf_config import FAMILIES, KEYS, UnsupportedTypeError, _fields


def meta_parameter_count(cfg: Mapping[str, Any]) -> int:
    """``sum(p.numel() for p in model.parameters())`` of the model transformers builds from ``cfg``."""
    import torch
    import transformers as tf

    model_type = str(cfg["model_type"])
    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    try:
        config = tf.AutoConfig.for_model(model_type, **kw)
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelSourceError(f"transformers cannot read this {model_type} config: {exc}") from None
    with torch.device("meta"):
        for auto in (tf.AutoModelForCausalLM, tf.AutoModel):
            try:
                model = auto.from_config(config)
                break
            except (ValueError, KeyError):
                continue
            except ImportError as exc:  # a tower needing a package transformers lacks here (Gemma 3n: timm)
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0].split(". ")[0]
                raise ModelSourceError(
                    f"transformers cannot build model_type '{model_type}' here to count it: {first}"
                ) from None
        else:
            raise ModelSourceError(f"transformers has no model class for model_type '{model_type}'")
    return sum(p.numel() for p in model.parameters())


#: Where a multimodal or encoder-decoder wrapper keeps its language model's keys (transformers
#: ``text_config`` for GLM-4.1V / 4.5V, SmolVLM, Idefics3, Gemma 3n; ``llm_config`` / ``language_config``
#: in InternVL-style remote configs; ``decoder`` for T5Gemma).
_NESTED_TEXT = ("text_config", "llm_config", "language_config", "decoder")


def _flat_width(value: Any) -> Any:
    """A per-layer list of MLP widths (Gemma 3n) as its widest layer: the activation rule takes one width,
    and the widest layer bounds what any layer saves."""
    return max(value) if isinstance(value, list) and value else value


def shape_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the generic decoder shape reads: the top level, or, when the top level names no width, the
    language model's nested config (a wrapper's own keys stay out)."""
    top = dict(cfg)
    if not any(top.get(k) is not None for k in KEYS["hidden_size"]):
        for sub in _NESTED_TEXT:
            inner = cfg.get(sub)
            if isinstance(inner, Mapping) and any(inner.get(k) is not None for k in KEYS["hidden_size"]):
                top = {**inner, "model_type": cfg.get("model_type")}
                break
    return {k: _flat_width(v) if k in KEYS["intermediate_size"] else v for k, v in top.items()}


def _closest(base: DecoderArch, exact: int) -> DecoderArch:
    """Of the generic variants (gated or plain MLP, RMS or LayerNorm, with or without biases), the one
    whose count is closest below the exact total (else the smallest overcount)."""
    variants = [
        base.model_copy(update={"mlp": mlp, "norm": norm, "qkv_bias": b, "o_bias": b, "mlp_bias": b})
        for mlp in ("gated", "plain")
        for norm in ("rms", "layer")
        for b in (False, True)
    ]
    below = [v for v in variants if count_params(v) <= exact]
    if below:
        return min(below, key=lambda v: exact - count_params(v))
    return min(variants, key=lambda v: count_params(v) - exact)


def arch_from_meta(cfg: Mapping[str, Any], why: UnsupportedTypeError) -> tuple[DecoderArch, tuple[str, ...]]:
    """A generic decoder shape for ``cfg`` whose total is transformers' exact count, and the warning.

    Raises:
        UnsupportedTypeError: the torch extra is not installed (its message names the supported types
            and the extra), or transformers does not know the type either.
    """
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        raise why from None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = str(cfg.get("model_type"))
    if model_type not in CONFIG_MAPPING_NAMES:
        raise UnsupportedTypeError(why.model_type, transformers.__version__) from None
    exact = meta_parameter_count(cfg)
    try:
        fields = _fields(shape_config(cfg), FAMILIES["llama"], model_type)
        arch = DecoderArch(**fields)
    except (ModelSourceError, ValueError, TypeError) as exc:
        raise ModelSourceError(
            f"model_type '{model_type}': transformers counts {exact:,} parameters but its config lacks the "
            f"shape keys fitcheck needs for activations ({exc})"
        ) from None
    arch = _closest(arch, exact)
    generic = count_params(arch)
    note = (
        f"model_type '{model_type}' is not modelled natively: parameters are transformers' own count "
        f"({exact:,}, built on the meta device with transformers {transformers.__version__}); activations "
        f"follow the generic decoder rule ({arch.mlp} MLP, {arch.norm} norm)"
    )
    if exact >= generic:
        arch = arch.model_copy(update={"misc_params": exact - generic})
    else:
        note += f"; the generic shape counts {generic - exact:,} more parameters than the model has"
    return arch, (note,)
