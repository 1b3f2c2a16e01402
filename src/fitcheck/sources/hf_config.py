"""Hugging Face ``config.json`` -> `DecoderArch`.

One converter serves local folders, bare ``config.json`` files and the presets (which store the
published config fields verbatim). Defaults for absent keys are the ones each transformers
configuration class uses (cited per family in docs/methodology.md, "Architectures").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import ValidationError

from fitcheck.errors import ModelSourceError
from fitcheck.models import DecoderArch

Config = Mapping[str, Any]


def _need(cfg: Config, *keys: str) -> Any:
    """First present key among ``keys`` (aliases), or a clear error naming the first."""
    for k in keys:
        if k in cfg and cfg[k] is not None:
            return cfg[k]
    raise ModelSourceError(f"config.json lacks '{keys[0]}', which fitcheck needs to size the model")


def _opt(cfg: Config, key: str, default: Any) -> Any:
    value = cfg.get(key)
    return default if value is None else value


def _common(cfg: Config) -> dict[str, Any]:
    h = int(_need(cfg, "hidden_size", "n_embd"))
    a = int(_need(cfg, "num_attention_heads", "n_head"))
    return {
        "model_type": str(cfg["model_type"]),
        "hidden_size": h,
        "num_layers": int(_need(cfg, "num_hidden_layers", "n_layer")),
        "num_heads": a,
        "num_kv_heads": int(_opt(cfg, "num_key_value_heads", a)),
        "head_dim": int(_opt(cfg, "head_dim", h // a)),
        "intermediate_size": int(_need(cfg, "intermediate_size")),
        "vocab_size": int(_need(cfg, "vocab_size")),
        "activation": str(_opt(cfg, "hidden_act", _opt(cfg, "hidden_activation", "silu"))),
        "sliding_window": cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None,
        "attn_dropout": float(_opt(cfg, "attention_dropout", 0.0)),
    }


def _llama(cfg: Config) -> dict[str, Any]:
    d = _common(cfg)
    bias = bool(_opt(cfg, "attention_bias", False))
    d.update(
        tie_embeddings=bool(_opt(cfg, "tie_word_embeddings", False)),
        qkv_bias=bias,
        o_bias=bias,
        mlp_bias=bool(_opt(cfg, "mlp_bias", False)),
    )
    return d


def _qwen2(cfg: Config) -> dict[str, Any]:
    # Qwen2Attention: q/k/v projections always carry a bias, o_proj never (modeling_qwen2.py).
    d = _common(cfg)
    d.update(tie_embeddings=bool(_opt(cfg, "tie_word_embeddings", False)), qkv_bias=True)
    return d


def _qwen3(cfg: Config) -> dict[str, Any]:
    d = _common(cfg)
    bias = bool(_opt(cfg, "attention_bias", False))
    d.update(
        tie_embeddings=bool(_opt(cfg, "tie_word_embeddings", False)),
        qkv_bias=bias,
        o_bias=bias,
        qk_norm=True,
    )
    return d


def _gemma(cfg: Config) -> dict[str, Any]:
    d = _common(cfg)
    d["activation"] = str(_opt(cfg, "hidden_activation", _opt(cfg, "hidden_act", "gelu_pytorch_tanh")))
    bias = bool(_opt(cfg, "attention_bias", False))
    d.update(tie_embeddings=bool(_opt(cfg, "tie_word_embeddings", True)), qkv_bias=bias, o_bias=bias)
    return d


def _gemma2(cfg: Config) -> dict[str, Any]:
    d = _gemma(cfg)
    d.update(
        norms_per_layer=4,
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
    )
    return d


#: `Gemma3TextConfig` defaults (transformers ``configuration_gemma3.py``) for the shape keys a published
#: config may leave out: google/gemma-3-4b-pt's ``text_config`` lists only hidden_size,
#: intermediate_size, num_hidden_layers, rope_scaling and sliding_window, and the 4B and 27B
#: ``text_config`` leave vocab_size to the default (262,208 rows; gemma-3-1b states 262,144).
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
}


def _gemma3(cfg: Config) -> dict[str, Any]:
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        # Gemma 3 4B and larger: a vision tower beside the text decoder; size the decoder and
        # count the tower as frozen extra parameters only when the config says how big it is.
        merged = {"model_type": "gemma3_text", **text}
        d = _gemma3(merged)
        d["model_type"] = "gemma3"
        return d
    cfg = {**_GEMMA3_TEXT_DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    d = _gemma(cfg)
    d.update(
        norms_per_layer=4,
        qk_norm=True,
        final_logit_softcapping=cfg.get("final_logit_softcapping"),
        attn_logit_softcapping=cfg.get("attn_logit_softcapping"),
    )
    return d


def _phi3(cfg: Config) -> dict[str, Any]:
    d = _common(cfg)
    d.update(
        tie_embeddings=bool(_opt(cfg, "tie_word_embeddings", False)),
        fused_qkv=True,
        fused_gate_up=True,
    )
    return d


def _mixtral(cfg: Config) -> dict[str, Any]:
    d = _llama(cfg)
    d.update(
        num_experts=int(_need(cfg, "num_local_experts")),
        experts_per_token=int(_opt(cfg, "num_experts_per_tok", 2)),
        moe_intermediate_size=int(cfg["intermediate_size"]),
        moe_layers=d["num_layers"],
    )
    return d


def _moe_layers(cfg: Config, n_layers: int) -> int:
    step = int(_opt(cfg, "decoder_sparse_step", 1))
    dense_only = set(_opt(cfg, "mlp_only_layers", []))
    return sum(1 for i in range(n_layers) if i not in dense_only and step > 0 and (i + 1) % step == 0)


def _qwen2_moe(cfg: Config) -> dict[str, Any]:
    d = _qwen2(cfg)
    d.update(
        num_experts=int(_need(cfg, "num_experts")),
        experts_per_token=int(_opt(cfg, "num_experts_per_tok", 4)),
        moe_intermediate_size=int(_need(cfg, "moe_intermediate_size")),
        shared_expert_intermediate_size=int(_opt(cfg, "shared_expert_intermediate_size", 0)),
        moe_layers=_moe_layers(cfg, d["num_layers"]),
    )
    return d


def _qwen3_moe(cfg: Config) -> dict[str, Any]:
    d = _qwen3(cfg)
    d.update(
        num_experts=int(_need(cfg, "num_experts")),
        experts_per_token=int(_opt(cfg, "num_experts_per_tok", 8)),
        moe_intermediate_size=int(_need(cfg, "moe_intermediate_size")),
        moe_layers=_moe_layers(cfg, d["num_layers"]),
    )
    return d


def _gpt2(cfg: Config) -> dict[str, Any]:
    h = int(_need(cfg, "n_embd", "hidden_size"))
    a = int(_need(cfg, "n_head", "num_attention_heads"))
    inner = cfg.get("n_inner")
    return {
        "model_type": "gpt2",
        "hidden_size": h,
        "num_layers": int(_need(cfg, "n_layer", "num_hidden_layers")),
        "num_heads": a,
        "num_kv_heads": a,
        "head_dim": h // a,
        "intermediate_size": int(inner) if inner else 4 * h,
        "vocab_size": int(_need(cfg, "vocab_size")),
        "tie_embeddings": bool(_opt(cfg, "tie_word_embeddings", True)),
        "mlp": "plain",
        "activation": str(_opt(cfg, "activation_function", "gelu_new")),
        "norm": "layer",
        "qkv_bias": True,
        "o_bias": True,
        "mlp_bias": True,
        "fused_qkv": True,
        "learned_positions": int(_opt(cfg, "n_positions", 1024)),
        # GPT2Config defaults: 0.1 each (configuration_gpt2.py); HF trains with them on.
        "attn_dropout": float(_opt(cfg, "attn_pdrop", 0.1)),
        "resid_dropout": float(_opt(cfg, "resid_pdrop", 0.1)),
        "embd_dropout": float(_opt(cfg, "embd_pdrop", 0.1)),
    }


CONVERTERS: dict[str, Callable[[Config], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _llama,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "gemma3": _gemma3,
    "gemma3_text": _gemma3,
    "phi3": _phi3,
    "mixtral": _mixtral,
    "qwen2_moe": _qwen2_moe,
    "qwen3_moe": _qwen3_moe,
    "gpt2": _gpt2,
}


def arch_from_hf_config(cfg: Config) -> DecoderArch:
    """Build a `DecoderArch` from a parsed ``config.json``.

    Raises:
        ModelSourceError: unknown ``model_type``, missing or inconsistent fields.
    """
    if not isinstance(cfg, Mapping):
        raise ModelSourceError("config.json must hold a JSON object")
    model_type = cfg.get("model_type")
    if model_type not in CONVERTERS:
        known = ", ".join(sorted(CONVERTERS))
        raise ModelSourceError(f"model_type '{model_type}' is not supported; supported: {known}")
    try:
        fields = CONVERTERS[str(model_type)](cfg)
        return DecoderArch(**fields)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ModelSourceError(f"config.json: {where}: {first['msg']}") from None
        raise ModelSourceError(f"config.json has a field of the wrong type: {exc}") from None
