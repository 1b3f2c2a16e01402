"""Hugging Face ``config.json`` -> `DecoderArch`, one table row per ``model_type``.

One converter serves local folders, bare ``config.json`` files, Hub repos and the presets (which store
the published config fields verbatim). Each `Family` row says, for one ``model_type``:

* ``defaults``: the configuration class's defaults for keys a published config may leave out
  (transformers ``configuration_<family>.py``, or the remote code's ``configuration_*.py``);
* ``fixed``: architecture facts the config does not state (norm kind, MLP kind, fused projections,
  parallel blocks, biases the modeling code always or never creates);
* ``flags``: architecture fields read from a config key (``qkv_bias`` <- ``attention_bias``);
* ``features``: the few derived parts that need arithmetic (MoE layers, latent attention, vision
  towers, encoder tables), as small named functions.

The shape keys every family shares (hidden size, layers, heads, ...) are read through `KEYS`, one list of
aliases per architecture field. Sources per family: docs/methodology.md, "Architectures".
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fitcheck.errors import ModelSourceError, compact
from fitcheck.models import DecoderArch
from fitcheck.sources import vision
from fitcheck.terminal import clipped

Config = Mapping[str, Any]
Fields = dict[str, Any]

#: Architecture field -> the config keys that hold it, in the order tried (aliases across families).
KEYS: dict[str, tuple[str, ...]] = {
    # "n_embed": BLOOM's published configs (bigscience/bloom*, bloomz*) state the width only under this
    # key; BloomConfig.__init__ reads it into hidden_size (transformers models/bloom/configuration_bloom.py)
    "hidden_size": ("hidden_size", "n_embd", "n_embed", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "num_kv_heads": ("num_key_value_heads", "multi_query_group_num", "num_kv_heads"),
    "head_dim": ("head_dim", "kv_channels", "d_kv"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner", "d_ff", "ffn_dim"),
    "vocab_size": ("padded_vocab_size", "vocab_size"),
    "activation": ("hidden_activation", "hidden_act", "activation_function", "hidden_activation"),
}

#: Keys that name the same thing (transformers' attribute_map aliases), so a given key shadows the
#: class default of its alias.
_ALIASES: dict[str, tuple[str, ...]] = {
    k: group
    for group in (
        *KEYS.values(),
        ("num_experts", "num_local_experts", "moe_num_experts"),
        ("moe_k", "num_experts_per_tok"),
    )
    for k in group
}

#: Every config key the converter reads; `class_defaults` holds, per model_type, the transformers
#: configuration class's default for each of them (presets/architectures/config_defaults.yaml).
READ_KEYS: tuple[str, ...] = (
    *{k for keys in KEYS.values() for k in keys},
    "tie_word_embeddings", "attention_bias", "mlp_bias", "use_qkv_bias", "use_bias", "bias", "use_qk_norm",
    "qk_layernorm", "sliding_window", "use_sliding_window", "layer_types", "sliding_window_pattern",
    "max_window_layers", "attention_dropout", "final_logit_softcapping",
    "attn_logit_softcapping", "num_experts", "num_local_experts", "num_experts_per_tok",
    "moe_intermediate_size", "shared_expert_intermediate_size", "shared_intermediate_size",
    "decoder_sparse_step", "mlp_only_layers", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
    "moe_layer_freq", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
    "intermediate_size_mlp", "interleave_moe_layer_step", "moe_layers", "new_decoder_architecture",
    "multi_query", "parallel_attn", "num_ln_in_parallel_attn", "use_parallel_residual", "n_positions",
    "attn_pdrop", "resid_pdrop", "embd_pdrop", "expansion_ratio", "no_bias", "attn_config",
    "word_embed_proj_dim", "enable_bias", "do_layer_norm_before", "layer_norm_elementwise_affine",
    "dropout", "max_position_embeddings", "type_vocab_size", "attention_probs_dropout_prob",
    "hidden_dropout_prob", "position_biased_input", "embedding_size", "relative_attention",
    "position_buckets", "max_relative_positions", "norm_rel_ebd", "pos_att_type", "share_att_key",
    "conv_kernel_size", "num_decoder_layers", "feed_forward_proj", "relative_attention_num_buckets",
    "dropout_rate", "attention_out_bias", "residual_dropout", "lm_head_bias", "moe_num_experts", "moe_k",
    "moe_num_shared_experts", "moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval",
    "moe_topk",
)  # fmt: skip


@functools.cache
def class_defaults() -> dict[str, dict[str, Any]]:
    """model_type -> {config key: the configuration class's default} (generated from transformers by
    bench/arch_defaults.py; tests/test_architectures.py checks it against the installed transformers)."""
    from fitcheck.presets import presets_root, read_yaml

    data = read_yaml(presets_root() / "architectures" / "config_defaults.yaml")
    return {str(k): dict(v) for k, v in (data.get("defaults") or {}).items()}


#: Types whose attention has as many key/value heads as query heads whatever the config says: their
#: transformers configuration classes have no ``num_key_value_heads`` (transformers 5.24, checked on each
#: class in ``CONFIG_MAPPING``), so a stray key of that name (a converter's, or a hand-edited file's) changes
#: nothing in the model. Read as given it made a GPT-NeoX config with ``num_key_value_heads: 4`` 5% under
#: its traced step (bench/arch_trace.py: the fused query_key_value counted a quarter as wide).
MHA_ONLY_TYPES = frozenset(
    ("gpt2", "gpt_neox", "gptj", "bloom", "opt", "mpt", "bert", "roberta", "deberta-v2", "t5", "mt5")
)

#: State-space and recurrent families: refused until they are modelled (their memory is not a transformer's).
SSM_TYPES = frozenset(
    {"mamba", "mamba2", "jamba", "rwkv", "falcon_mamba", "zamba", "zamba2", "falcon_h1", "xlstm"}
)

#: Hybrids: attention layers interleaved with layers that are not attention, named from transformers 5.24's
#: modeling files (the meta-device fallback also refuses any other type whose built model holds such a
#: layer: `fitcheck.sources.meta_fallback.non_attention_mixers`). Refused like the state-space types: the
#: engine's layer rule (what attention and an MLP save) does not hold for those layers, and the meta-device
#: fallback would size them as attention.
HYBRID_TYPES: dict[str, str] = {
    "lfm2": "gated short-convolution layers (Lfm2ShortConv)",
    "lfm2_moe": "gated short-convolution layers (Lfm2MoeShortConv)",
    "lfm2_vl": "gated short-convolution layers (its LFM2 language model's Lfm2ShortConv)",
    "qwen3_next": "Gated DeltaNet linear-attention layers (Qwen3NextGatedDeltaNet)",
    "qwen3_5": "Gated DeltaNet linear-attention layers (Qwen3_5GatedDeltaNet)",
    "qwen3_5_moe": "Gated DeltaNet linear-attention layers (Qwen3_5MoeGatedDeltaNet)",
    "qwen3_5_text": "Gated DeltaNet linear-attention layers (Qwen3_5GatedDeltaNet)",
    "qwen3_5_moe_text": "Gated DeltaNet linear-attention layers (Qwen3_5MoeGatedDeltaNet)",
    "bailing_hybrid": "delta-rule linear-attention layers (BailingHybridDeltaAttention)",
    "lfm3": "gated short-convolution layers (Lfm3ShortConv)",
    "lfm3_vl": "gated short-convolution layers (its LFM3 language model's Lfm3ShortConv)",
    "inkling_text": "short-convolution layers (InklingShortConvolution)",
    "inkling_mm_model": "short-convolution layers (its language model's InklingShortConvolution)",
    "olmo_hybrid": "Gated DeltaNet linear-attention layers (OlmoHybridGatedDeltaNet)",
    "kimi_linear": "Kimi Delta Attention linear-attention layers (KimiLinearDeltaAttention)",
    "minimax": "lightning linear-attention layers (MiniMaxLightningAttention)",
    "granitemoehybrid": "Mamba-2 layers (GraniteMoeHybridMambaLayer)",
    "bamba": "Mamba-2 layers (BambaMixer)",
    "nemotron_h": "Mamba-2 layers (NemotronHMamba2Mixer)",
    "recurrent_gemma": "RG-LRU recurrent blocks (RecurrentGemmaRecurrentBlock)",
}


def _first(cfg: Config, keys: tuple[str, ...]) -> Any:
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _need(cfg: Config, *keys: str) -> Any:
    """First present key among ``keys`` (aliases), or a clear error naming the first."""
    value = _first(cfg, keys)
    if value is None:
        raise ModelSourceError(f"config.json lacks '{keys[0]}', which fitcheck needs to size the model")
    return value


def _opt(cfg: Config, key: str, default: Any) -> Any:
    value = cfg.get(key)
    return default if value is None else value


#: Optional counts that may be -1 (DeBERTa's "unset" position spans, ERNIE's "to the last layer").
MINUS_ONE_OK = frozenset({"position_buckets", "max_relative_positions", "moe_layer_end_index"})


def _opt_int(cfg: Config, key: str, default: int, lo: int = 0, hi: int | None = None) -> int:
    """An optional whole-number field: the default when absent, else a whole number from ``lo`` to ``hi``
    (by default the widest of `SIZE_BOUNDS`; -1 too for `MINUS_ONE_OK`), refused naming its key: ``int()``
    would truncate 2.5, raise without the key for "x" or a list, and let 10**12 through (a model of absurd
    size)."""
    value = cfg.get(key)
    if value is None:
        return default
    hi = max(SIZE_BOUNDS.values()) if hi is None else hi
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    whole = isinstance(value, int) and not isinstance(value, bool)
    if whole and (lo <= value <= hi or (value == -1 and key in MINUS_ONE_OK)):
        return int(value)
    raise ModelSourceError(
        f"config.json: {key} must be a whole number from {lo:,} to {hi:,} (got {clipped(repr(value))})"
    )


def _opt_prob(cfg: Config, key: str, default: float) -> float:
    """An optional dropout probability: the default when absent, else a number from 0 to under 1."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1:
        return float(value)
    raise ModelSourceError(
        f"config.json: {key} must be a probability from 0 to under 1 (got {clipped(repr(value))})"
    )


# ---------------------------------------------------------------------------------------------------
# Features: derived fields that need arithmetic. Each takes the (defaults-merged) config and the fields
# built so far, and returns the fields it sets.


def _moe_layers(cfg: Config, n_layers: int) -> int:
    step = _opt_int(cfg, "decoder_sparse_step", 1)
    dense_only = set(_opt(cfg, "mlp_only_layers", []))
    return sum(1 for i in range(n_layers) if i not in dense_only and step > 0 and (i + 1) % step == 0)


def _moe_all(expert_key: str, width_key: str) -> Callable[[Config, Fields], Fields]:
    """Every layer MoE (Mixtral, OLMoE, Granite MoE): experts from ``expert_key``, width ``width_key``."""

    def feature(cfg: Config, d: Fields) -> Fields:
        return {
            "num_experts": int(_need(cfg, expert_key, "num_local_experts", "num_experts")),
            "experts_per_token": int(_need(cfg, "num_experts_per_tok")),
            "moe_intermediate_size": int(_need(cfg, width_key)),
            "moe_layers": d["num_layers"],
        }

    return feature


def _qwen_moe(cfg: Config, d: Fields) -> Fields:
    return {
        "num_experts": int(_need(cfg, "num_experts", "num_local_experts")),
        "experts_per_token": int(_need(cfg, "num_experts_per_tok")),
        "moe_intermediate_size": int(_need(cfg, "moe_intermediate_size")),
        "shared_expert_intermediate_size": _opt_int(cfg, "shared_expert_intermediate_size", 0),
        "shared_expert_gate": bool(_opt(cfg, "shared_expert_intermediate_size", 0)),
        "moe_layers": _moe_layers(cfg, d["num_layers"]),
    }


def _minicpm_moe(cfg: Config, d: Fields) -> Fields:
    """MiniCPM-MoE (openbmb/MiniCPM-MoE-8x2B, remote code ``MiniCPMMoE``): with ``num_experts`` > 0 every
    layer's MLP is ``num_experts`` MLPs of the dense width ``intermediate_size`` and a bias-free router
    ``h x num_experts`` (vLLM models/minicpm.py reads the same keys: ``num_experts`` 0 or absent means the
    dense ``MiniCPMMLP``). Left out, MiniCPM-MoE-8x2B sized as its 2.7B dense sibling instead of 13.9B."""
    experts = _opt_int(cfg, "num_experts", 0)
    if experts <= 0:
        return {}
    return {
        "num_experts": experts,
        "experts_per_token": int(_need(cfg, "num_experts_per_tok")),
        "moe_intermediate_size": d["intermediate_size"],
        "moe_layers": d["num_layers"],
    }


def _granite_shared(cfg: Config, d: Fields) -> Fields:
    return {"shared_expert_intermediate_size": _opt_int(cfg, "shared_intermediate_size", 0)}


def _deepseek(cfg: Config, d: Fields) -> Fields:
    """DeepSeek-V2/V3: latent attention; MoE after ``first_k_dense_replace`` dense layers, every
    ``moe_layer_freq``-th layer, with ``n_shared_experts`` always-on experts (no gate)."""
    nope, rope = int(_need(cfg, "qk_nope_head_dim")), int(_need(cfg, "qk_rope_head_dim"))
    n = d["num_layers"]
    first, freq = _opt_int(cfg, "first_k_dense_replace", 0), _opt_int(cfg, "moe_layer_freq", 1)
    moe = sum(1 for i in range(first, n) if i % freq == 0) if cfg.get("n_routed_experts") else 0
    width = int(_need(cfg, "moe_intermediate_size"))
    return {
        # DeepseekV2/V3Config default 1536 when absent; null (V2-Lite) means one plain q_proj
        "q_lora_rank": int(cfg["q_lora_rank"] or 0) if "q_lora_rank" in cfg else 1536,
        "kv_lora_rank": int(_need(cfg, "kv_lora_rank")),
        "qk_rope_head_dim": rope,
        "v_head_dim": int(_need(cfg, "v_head_dim")),
        "head_dim": nope + rope,
        "num_kv_heads": d["num_heads"],
        "num_experts": _opt_int(cfg, "n_routed_experts", 0),
        "experts_per_token": _opt_int(cfg, "num_experts_per_tok", 0) if moe else 0,
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width * _opt_int(cfg, "n_shared_experts", 0),
        "moe_layers": moe,
    }


def _llama4_text(cfg: Config, d: Fields) -> Fields:
    """Llama 4 text: MoE every ``interleave_moe_layer_step``-th layer (or the listed ``moe_layers``),
    one shared expert of the expert width; dense layers use ``intermediate_size_mlp``."""
    n = d["num_layers"]
    listed = cfg.get("moe_layers")
    step = _opt_int(cfg, "interleave_moe_layer_step", 1)
    moe = len(listed) if isinstance(listed, list) else sum(1 for i in range(n) if (i + 1) % step == 0)
    width = int(_need(cfg, "intermediate_size"))
    return {
        "intermediate_size": _opt_int(cfg, "intermediate_size_mlp", width),
        "num_experts": int(_need(cfg, "num_local_experts")),
        "experts_per_token": _opt_int(cfg, "num_experts_per_tok", 1),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width,
        "moe_layers": moe,
    }


def _falcon(cfg: Config, d: Fields) -> Fields:
    """Falcon: kv heads from ``new_decoder_architecture`` / ``multi_query``; one or two input norms."""
    new = bool(_opt(cfg, "new_decoder_architecture", False))
    kv = _opt_int(cfg, "num_kv_heads", d["num_heads"]) if new else 1
    if not new and not bool(_opt(cfg, "multi_query", True)):
        kv = d["num_heads"]
    parallel = bool(_opt(cfg, "parallel_attn", True)) or new
    n_ln = cfg.get("num_ln_in_parallel_attn") or (2 if new else 1)
    bias = bool(_opt(cfg, "bias", False))
    return {
        "num_kv_heads": kv,
        "parallel_block": parallel,
        "norms_per_layer": (2 if n_ln == 2 else 1) if parallel else 2,
        "intermediate_size": _opt_int(cfg, "ffn_hidden_size", 4 * d["hidden_size"]),
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bias,
    }


def _refined_web(cfg: Config, d: Fields) -> Fields:
    """Falcon's 2023 remote-code config (``RefinedWebModel``, tiiuae/falcon-7b): read as transformers'
    converter reads it (models/falcon/convert_custom_code_checkpoint.py @15ea02a2: ``n_head`` ->
    ``num_attention_heads``, ``n_layer`` -> ``num_hidden_layers``, ``n_head_kv`` -> ``num_kv_heads`` with
    ``new_decoder_architecture`` true exactly when ``n_head_kv`` is given); the shape keys are `KEYS`
    aliases already."""
    legacy = {**cfg, "new_decoder_architecture": "n_head_kv" in cfg, "num_kv_heads": cfg.get("n_head_kv")}
    return _falcon(legacy, d)


def _parallel_residual(cfg: Config, d: Fields) -> Fields:
    """GPT-NeoX / StableLM: ``use_parallel_residual``; StableLM then keeps only the input norm."""
    par = bool(_opt(cfg, "use_parallel_residual", d["model_type"] == "gpt_neox"))
    out: Fields = {"parallel_block": par}
    if d["model_type"] == "stablelm":
        out["norms_per_layer"] = 1 if par else 2
    return out


def _four_h(cfg: Config, d: Fields) -> Fields:
    """Families whose MLP width defaults to 4 x hidden (GPT-J n_inner, BLOOM)."""
    inner = _first(cfg, ("n_inner", "ffn_hidden_size"))
    return {"intermediate_size": int(inner) if inner else 4 * d["hidden_size"]}


def _mpt(cfg: Config, d: Fields) -> Fields:
    attn = cfg.get("attn_config") or {}
    heads = d["num_heads"]
    kv = int(attn.get("kv_n_heads") or heads) if attn.get("attn_type") == "grouped_query_attention" else heads
    bias = not bool(_opt(cfg, "no_bias", True))
    return {
        "num_kv_heads": kv,
        "intermediate_size": int(_opt(cfg, "expansion_ratio", 4) * d["hidden_size"]),
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bias,
        "norm_bias": bias,
        "attn_dropout": float(attn.get("attn_pdrop") or 0.0),
    }


def _opt_model(cfg: Config, d: Fields) -> Fields:
    """OPT: learned positions with an offset of 2 rows; the final norm only with pre-norm layers."""
    wep = _opt_int(cfg, "word_embed_proj_dim", d["hidden_size"])
    if wep != d["hidden_size"]:
        raise ModelSourceError(
            "OPT with word_embed_proj_dim != hidden_size (opt-350m) is not modelled; other OPT sizes are"
        )
    bias = bool(_opt(cfg, "enable_bias", True))
    return {
        "learned_positions": _opt_int(cfg, "max_position_embeddings", 2048) + 2,
        "final_norm": bool(_opt(cfg, "do_layer_norm_before", True))
        and not bool(_opt(cfg, "_remove_final_layer_norm", False)),
        "norm_weight": bool(_opt(cfg, "layer_norm_elementwise_affine", True)),
        "norm_bias": bool(_opt(cfg, "layer_norm_elementwise_affine", True)),
        "qkv_bias": bias,
        "o_bias": bias,
        "mlp_bias": bias,
        "resid_dropout": _opt_prob(cfg, "dropout", 0.1),
    }


def _gpt2(cfg: Config, d: Fields) -> Fields:
    return {
        "learned_positions": _opt_int(cfg, "n_positions", 1024),
        # GPT2Config defaults: 0.1 each (configuration_gpt2.py); HF trains with them on.
        "attn_dropout": _opt_prob(cfg, "attn_pdrop", 0.1),
        "resid_dropout": _opt_prob(cfg, "resid_pdrop", 0.1),
        "embd_dropout": _opt_prob(cfg, "embd_pdrop", 0.1),
    }


def _chatglm(cfg: Config, d: Fields) -> Fields:
    mq = bool(_opt(cfg, "multi_query_attention", False))
    return {
        "num_kv_heads": _opt_int(cfg, "multi_query_group_num", 1) if mq else d["num_heads"],
        "norm": "rms" if bool(_opt(cfg, "rmsnorm", True)) else "layer",
        "final_norm": bool(_opt(cfg, "post_layer_norm", True)),
    }


def _encoder(cfg: Config, d: Fields) -> Fields:
    """BERT / RoBERTa: learned positions, token types, post-norm layers, a pooler before the labels."""
    h = d["hidden_size"]
    return {
        "learned_positions": _opt_int(cfg, "max_position_embeddings", 512),
        "misc_params": _opt_int(cfg, "type_vocab_size", 2) * h,
        "attn_dropout": _opt_prob(cfg, "attention_probs_dropout_prob", 0.1),
        "resid_dropout": _opt_prob(cfg, "hidden_dropout_prob", 0.1),
        "num_labels": _opt_int(cfg, "num_labels", len(cfg.get("id2label") or {}) or 2),
    }


def _deberta_v2(cfg: Config, d: Fields) -> Fields:
    """DeBERTa-v2/v3 (``modeling_deberta_v2.py``): relative position table (+ its LayerNorm), optional
    absolute positions, token types and a projection when ``embedding_size`` differs."""
    h = d["hidden_size"]
    out = _encoder(cfg, d)
    maxpos = _opt_int(cfg, "max_position_embeddings", 512)
    out["learned_positions"] = maxpos if bool(_opt(cfg, "position_biased_input", True)) else 0
    misc = _opt_int(cfg, "type_vocab_size", 0) * h
    if _opt_int(cfg, "embedding_size", h) != h:
        raise ModelSourceError("DeBERTa with embedding_size != hidden_size is not modelled")
    if bool(_opt(cfg, "relative_attention", False)):
        buckets = _opt_int(cfg, "position_buckets", -1)
        rel = _opt_int(cfg, "max_relative_positions", -1)
        size = buckets if buckets > 0 else (rel if rel >= 1 else maxpos)
        misc += 2 * size * h
        if "layer_norm" in [x.strip() for x in str(_opt(cfg, "norm_rel_ebd", "none")).lower().split("|")]:
            misc += 2 * h
        pos = cfg.get("pos_att_type") or []
        pos = pos.split("|") if isinstance(pos, str) else list(pos)
        if not bool(_opt(cfg, "share_att_key", False)):
            # separate position projections: c2p keys, p2c queries (with bias), every layer
            misc += d["num_layers"] * sum(h * h + h for t in ("c2p", "p2c") if t in pos)
        out["rel_terms"] = sum(1 for t in ("c2p", "p2c") if t in pos)
        out["rel_span"] = size  # DisentangledSelfAttention.pos_ebd_size (the gathered 2 x span columns)
    kernel = _opt_int(cfg, "conv_kernel_size", 0)
    if kernel:
        # ConvLayer (modeling_deberta_v2.py): Conv1d(h, h, kernel, groups) with bias, then a LayerNorm,
        # applied once, to the first layer's output (deberta-v2-xlarge / xxlarge: kernel 3)
        groups = _opt_int(cfg, "conv_groups", 1)
        if groups < 1 or h % groups:
            raise ModelSourceError(f"config.json: conv_groups must divide hidden_size (got {groups})")
        misc += h * (h // groups) * kernel + h + 2 * h
        out["conv_kernel"] = kernel
    out["misc_params"] = misc
    return out


def _t5(cfg: Config, d: Fields) -> Fields:
    """T5: relative position bias in the first layer of each stack; gated-gelu in v1.1 / Flan."""
    heads = d["num_heads"]
    proj = str(_opt(cfg, "feed_forward_proj", "relu"))
    return {
        "encoder_layers": d["num_layers"],
        "num_layers": _opt_int(cfg, "num_decoder_layers", d["num_layers"], 1, SIZE_BOUNDS["num_layers"]),
        "misc_params": 2 * _opt_int(cfg, "relative_attention_num_buckets", 32) * heads,
        "mlp": "gated" if proj.startswith("gated-") else "plain",
        # T5Config: "gated-gelu" runs dense_act_fn "gelu_new" (transformers' Python tanh GELU), kept for
        # backward compatibility with T5 v1.1 / Flan-T5 / mT5 checkpoints (configuration_t5.py)
        "activation": "gelu_new" if proj == "gated-gelu" else proj.removeprefix("gated-"),
        "resid_dropout": _opt_prob(cfg, "dropout_rate", 0.1),
        "attn_dropout": _opt_prob(cfg, "dropout_rate", 0.1),
        # T5DenseActDense / T5DenseGatedActDense: wi -> act (x wi_1) -> dropout -> wo
        "mlp_dropout": _opt_prob(cfg, "dropout_rate", 0.1),
    }


def _qwen(cfg: Config, d: Fields) -> Fields:
    """Qwen (1.x) remote code, ``modeling_qwen.py`` (Qwen/Qwen-7B @d4efd21, 2023-12-07, mirrored at
    github.com/zhangningboo/Qwen-7B; the same in Qwen/Qwen-7B-Chat @04df5dd, 2023-08-04, under the older
    key ``ffn_hidden_size``): ``w1`` and ``w2`` are ``intermediate_size // 2`` wide (``a1 * silu(a2)``)
    and ``mlp.c_proj`` reads that width back; ``c_attn`` always has a bias (``nn.Linear`` default), the
    output ``c_proj`` and the MLP have one only when ``no_bias`` is false."""
    bias = not bool(_opt(cfg, "no_bias", True))
    return {
        "intermediate_size": int(_need(cfg, "intermediate_size", "ffn_hidden_size")) // 2,
        "o_bias": bias,
        "mlp_bias": bias,
    }


def _first_k_dense(cfg: Config, d: Fields) -> Fields:
    """GLM-4.5 (``glm4_moe``) and dots.llm1 (``dots1``): DeepSeek-V3's expert layout with plain GQA
    attention: the first ``first_k_dense_replace`` layers dense, every later layer MoE, with
    ``n_shared_experts`` always-on experts of the expert width and no gate (``Glm4MoeDecoderLayer`` /
    ``Dots1DecoderLayer``: ``layer_idx >= config.first_k_dense_replace``)."""
    n = d["num_layers"]
    width = int(_need(cfg, "moe_intermediate_size"))
    return {
        "num_experts": int(_need(cfg, "n_routed_experts")),
        "experts_per_token": int(_need(cfg, "num_experts_per_tok")),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width * _opt_int(cfg, "n_shared_experts", 0),
        "moe_layers": max(0, n - _opt_int(cfg, "first_k_dense_replace", 0)),
    }


def _ernie_moe(cfg: Config, d: Fields) -> Fields:
    """ERNIE 4.5 MoE (``modeling_ernie4_5_moe.py``): layer i is MoE when ``(i + 1) % moe_layer_interval == 0``
    and ``moe_layer_start_index <= i <= moe_layer_end_index`` (-1: the last layer); shared experts are one
    MLP ``moe_num_shared_experts x moe_intermediate_size`` wide, no gate; each router keeps a frozen
    ``e_score_correction_bias`` parameter of ``moe_num_experts`` values (counted in ``misc_params``)."""
    n = d["num_layers"]
    start, end = _opt_int(cfg, "moe_layer_start_index", 1), _opt_int(cfg, "moe_layer_end_index", -1)
    step, end = _opt_int(cfg, "moe_layer_interval", 1), n - 1 if end == -1 else end
    moe = sum(1 for i in range(n) if step > 0 and (i + 1) % step == 0 and start <= i <= end)
    experts, width = (
        int(_need(cfg, "moe_num_experts", "num_experts")),
        int(_need(cfg, "moe_intermediate_size")),
    )
    return {
        "num_experts": experts,
        "experts_per_token": int(_need(cfg, "moe_k", "num_experts_per_tok")),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width * _opt_int(cfg, "moe_num_shared_experts", 0),
        "moe_layers": moe,
        "misc_params": moe * experts,
    }


def _per_layer_int(cfg: Config, key: str) -> int:
    """An int, or a per-layer list of equal ints (Hunyuan's ``moe_topk``); unequal lists are refused."""
    value = _need(cfg, key)
    if isinstance(value, list):
        if not value or len(set(value)) != 1:
            raise ModelSourceError(
                f"config.json: {key} differs between layers, which fitcheck does not model"
            )
        value = value[0]
    return int(value)


def _hunyuan_moe(cfg: Config, d: Fields) -> Fields:
    """Hunyuan MoE (``modeling_hunyuan_v1_moe.py``): every layer MoE; the routed experts and the one
    always-on ``shared_mlp`` are all ``intermediate_size`` wide (transformers reads neither
    ``moe_intermediate_size`` nor ``num_shared_expert``); ``num_experts`` / ``moe_topk`` may be per-layer
    lists."""
    width = d["intermediate_size"]
    return {
        "num_experts": _per_layer_int(cfg, "num_experts"),
        "experts_per_token": _per_layer_int(cfg, "moe_topk"),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width,
        "moe_layers": d["num_layers"],
    }


def _xielu_params(cfg: Config, d: Fields) -> Fields:
    """Apertus: xIELU's two learned scalars per layer (``alpha_p``, ``alpha_n``; transformers
    activations.py ``XIELUActivation``)."""
    return {"misc_params": 2 * d["num_layers"]}


def _seed_oss(cfg: Config, d: Fields) -> Fields:
    """Seed-OSS: dropout on both residual branches (``residual_dropout``, 0.1 by default; on in
    training)."""
    return {"resid_dropout": _opt_prob(cfg, "residual_dropout", 0.1)}


def _gemma2_caps(cfg: Config, d: Fields) -> Fields:
    return {
        "final_logit_softcapping": cfg.get("final_logit_softcapping"),
        "attn_logit_softcapping": cfg.get("attn_logit_softcapping"),
    }


@dataclass(frozen=True)
class Family:
    """One ``model_type``: defaults, fixed facts, config-driven flags and derived features."""

    defaults: dict[str, Any] = field(default_factory=dict)
    fixed: dict[str, Any] = field(default_factory=dict)
    flags: dict[str, tuple[str, Any]] = field(default_factory=dict)
    features: tuple[Callable[[Config, Fields], Fields], ...] = ()
    source: str = "transformers"  # "transformers" or "remote" (trust_remote_code families)


_TIE = {"tie_embeddings": ("tie_word_embeddings", False)}
_TIE_T = {"tie_embeddings": ("tie_word_embeddings", True)}
_ATTN_BIAS = {"qkv_bias": ("attention_bias", False), "o_bias": ("attention_bias", False)}
_LLAMA_FLAGS = {**_TIE, **_ATTN_BIAS, "mlp_bias": ("mlp_bias", False)}
_ALL_BIAS = {"qkv_bias": True, "o_bias": True, "mlp_bias": True}
#: ERNIE 4.5: ``use_bias`` gives q/k/v/o and the MLPs a bias (modeling_ernie4_5.py), and in the MoE
#: model the lm_head too (modeling_ernie4_5_moe.py)
_ERNIE_BIAS = {
    "qkv_bias": ("use_bias", False),
    "o_bias": ("use_bias", False),
    "mlp_bias": ("use_bias", False),
}
_LAYER = {"norm": "layer"}
_PLAIN = {"mlp": "plain"}
_GPT2 = {**_LAYER, **_PLAIN, **_ALL_BIAS, "fused_qkv": True}
_ENC = {"structure": "encoder", **_LAYER, **_PLAIN, **_ALL_BIAS, "final_norm": False}
_ENC |= {"embed_norm": True, "pooler": True}
_GEMMA = {"activation": "gelu_pytorch_tanh"}
#: `Gemma3TextConfig` defaults (transformers ``configuration_gemma3.py``) for the shape keys a published
#: config may leave out: google/gemma-3-4b-pt's ``text_config`` lists only hidden_size,
#: intermediate_size, num_hidden_layers, rope_scaling and sliding_window, and the 4B and 27B
#: ``text_config`` leave vocab_size to the default (262,208 rows; gemma-3-1b states 262,144).
_GEMMA3_TEXT_DEFAULTS: dict[str, Any] = {
    "vocab_size": 262_208,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
}
_LLAMA4_TEXT_DEFAULTS: dict[str, Any] = {"vocab_size": 202048, "head_dim": 128}
_QWEN_MOE = Family(
    defaults={"num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408},
    fixed={"qkv_bias": True},
    flags=_TIE,
    features=(_qwen_moe,),
)

#: Falcon-7B's remote-code config before transformers' FalconConfig (tiiuae/falcon-7b until 2023-08;
#: falcon-40b's ``RefinedWeb`` is not read: no published count to check it against here):
#: the modeling is Falcon's; RWConfig's defaults (configuration_RW.py of those repositories: multi_query,
#: parallel_attn and bias False) stand for keys a config leaves out.
_REFINED_WEB = Family(
    fixed={**_LAYER, **_PLAIN, "fused_qkv": True},
    flags=_TIE_T,
    features=(_refined_web,),
    defaults={"activation": "gelu", "multi_query": False, "parallel_attn": False, "bias": False},
    source="remote",
)

FAMILIES: dict[str, Family] = {
    # Llama-shaped decoders
    "llama": Family(flags=_LLAMA_FLAGS),
    "mistral": Family(flags=_TIE),
    "granite": Family(flags=_LLAMA_FLAGS),
    "helium": Family(defaults={"head_dim": 128}, flags=_LLAMA_FLAGS),
    "smollm3": Family(flags={**_LLAMA_FLAGS, "tie_embeddings": ("tie_word_embeddings", True)}),
    "internlm2": Family(
        fixed={"fused_qkv": True},
        flags={**_TIE, "qkv_bias": ("bias", False), "o_bias": ("bias", False)},
        source="remote",
    ),
    "baichuan": Family(fixed={"fused_qkv": True}, flags=_TIE, source="remote"),
    # QWenConfig defaults (configuration_qwen.py, Qwen/Qwen-7B @d4efd21); head_dim is kv_channels
    "qwen": Family(
        defaults={
            "vocab_size": 151936,
            "hidden_size": 4096,
            "num_hidden_layers": 32,
            "num_attention_heads": 32,
            "kv_channels": 128,
            "intermediate_size": 22016,
            "no_bias": True,
        },
        fixed={"fused_qkv": True, "qkv_bias": True},
        flags=_TIE,
        features=(_qwen,),
        source="remote",
    ),
    "minicpm": Family(flags={**_TIE_T, **_ATTN_BIAS}, features=(_minicpm_moe,), source="remote"),
    "qwen2": Family(fixed={"qkv_bias": True}, flags=_TIE),
    "qwen3": Family(fixed={"qk_norm": True}, flags=_LLAMA_FLAGS),
    "glm": Family(
        defaults={"head_dim": 128},
        fixed={"fused_gate_up": True},
        flags={**_TIE, "qkv_bias": ("attention_bias", True)},
    ),
    "glm4": Family(
        defaults={"head_dim": 128},
        fixed={"fused_gate_up": True, "norms_per_layer": 4},
        flags={**_TIE, "qkv_bias": ("attention_bias", True)},
    ),
    "chatglm": Family(
        defaults={"padded_vocab_size": 65024, "multi_query_group_num": 1},
        fixed={"fused_qkv": True, "fused_gate_up": True},
        flags={
            **_TIE,
            "qkv_bias": ("add_qkv_bias", False),
            "o_bias": ("add_bias_linear", False),
            "mlp_bias": ("add_bias_linear", False),
        },
        features=(_chatglm,),
        source="remote",
    ),
    "phi3": Family(fixed={"fused_qkv": True, "fused_gate_up": True}, flags=_TIE),
    "gemma": Family(fixed=_GEMMA, flags={**_TIE_T, **_ATTN_BIAS}),
    "gemma2": Family(
        fixed={**_GEMMA, "norms_per_layer": 4}, flags={**_TIE_T, **_ATTN_BIAS}, features=(_gemma2_caps,)
    ),
    "gemma3_text": Family(
        defaults=_GEMMA3_TEXT_DEFAULTS,
        fixed={"norms_per_layer": 4, "qk_norm": True},
        flags={**_TIE_T, **_ATTN_BIAS},
        features=(_gemma2_caps,),
    ),
    "olmo": Family(fixed={"norm": "layer", "norm_weight": False, "norm_bias": False}, flags=_LLAMA_FLAGS),
    "olmo2": Family(fixed={"qk_norm": True, "qk_norm_full": True}, flags=_LLAMA_FLAGS),
    "olmoe": Family(
        defaults={"num_experts": 64, "num_experts_per_tok": 8},
        fixed={"qk_norm": True, "qk_norm_full": True},
        flags=_LLAMA_FLAGS,
        features=(_moe_all("num_experts", "intermediate_size"),),
    ),
    "exaone": Family(flags=_TIE),
    "exaone4": Family(fixed={"qk_norm": True}, flags=_TIE),
    "cohere": Family(
        fixed={"norm": "layer", "norm_bias": False, "parallel_block": True, "norms_per_layer": 1},
        flags={**_TIE_T, **_ATTN_BIAS, "qk_norm": ("use_qk_norm", False)},
        defaults={"use_qk_norm": False},
    ),
    "cohere2": Family(
        fixed={"norm": "layer", "norm_bias": False, "parallel_block": True, "norms_per_layer": 1},
        flags={**_TIE_T, **_ATTN_BIAS},
    ),
    "stablelm": Family(
        fixed=_LAYER, flags={**_TIE, "qkv_bias": ("use_qkv_bias", False)}, features=(_parallel_residual,)
    ),
    "starcoder2": Family(
        fixed={**_LAYER, **_PLAIN},
        flags={
            **_TIE_T,
            "qkv_bias": ("use_bias", True),
            "o_bias": ("use_bias", True),
            "mlp_bias": ("use_bias", True),
        },
        defaults={"hidden_act": "gelu_pytorch_tanh"},
    ),
    "nemotron": Family(fixed={**_LAYER, **_PLAIN}, flags=_LLAMA_FLAGS, defaults={"hidden_act": "relu2"}),
    "arcee": Family(fixed=_PLAIN, flags=_LLAMA_FLAGS, defaults={"hidden_act": "relu2"}),
    "apertus": Family(fixed={**_PLAIN, "qk_norm": True}, flags=_LLAMA_FLAGS, features=(_xielu_params,)),
    "olmo3": Family(fixed={"qk_norm": True, "qk_norm_full": True}, flags=_LLAMA_FLAGS),
    "ernie4_5": Family(flags={**_TIE_T, **_ERNIE_BIAS}),
    "seed_oss": Family(
        flags={
            **_TIE,
            "qkv_bias": ("attention_bias", True),
            "o_bias": ("attention_out_bias", False),
            "mlp_bias": ("mlp_bias", False),
        },
        features=(_seed_oss,),
    ),
    "hunyuan_v1_dense": Family(fixed={"qk_norm": True}, flags={**_TIE, **_ATTN_BIAS}),
    "ministral": Family(flags=_TIE),
    "ministral3": Family(flags=_TIE),
    # GPT-style decoders
    "gpt2": Family(
        fixed=_GPT2, flags=_TIE_T, features=(_four_h, _gpt2), defaults={"activation_function": "gelu_new"}
    ),
    "gpt_neox": Family(
        fixed={**_LAYER, **_PLAIN, "fused_qkv": True, "mlp_bias": True},
        flags={**_TIE, "qkv_bias": ("attention_bias", True), "o_bias": ("attention_bias", True)},
        features=(_parallel_residual,),
    ),
    "gptj": Family(
        fixed={
            **_LAYER,
            **_PLAIN,
            "parallel_block": True,
            "norms_per_layer": 1,
            "mlp_bias": True,
            "lm_head_bias": True,
        },
        flags=_TIE,
        features=(_four_h,),
        defaults={"activation_function": "gelu_new"},
    ),
    "phi": Family(
        fixed={
            **_LAYER,
            **_PLAIN,
            **_ALL_BIAS,
            "parallel_block": True,
            "norms_per_layer": 1,
            "lm_head_bias": True,
        },
        flags={**_TIE, "qk_norm": ("qk_layernorm", False)},
        defaults={"hidden_act": "gelu_new"},
    ),
    "falcon": Family(
        fixed={**_LAYER, **_PLAIN, "fused_qkv": True},
        flags=_TIE_T,
        features=(_falcon,),
        defaults={"activation": "gelu"},
    ),
    "RefinedWebModel": _REFINED_WEB,
    "bloom": Family(
        fixed={**_LAYER, **_PLAIN, **_ALL_BIAS, "fused_qkv": True, "embed_norm": True},
        flags=_TIE_T,
        features=(_four_h,),
        defaults={"activation": "gelu"},
    ),
    "opt": Family(
        fixed={**_LAYER, **_PLAIN},
        flags=_TIE_T,
        features=(_opt_model,),
        defaults={"activation_function": "relu"},
    ),
    "mpt": Family(
        fixed={**_LAYER, **_PLAIN, "fused_qkv": True},
        flags=_TIE_T,
        features=(_mpt,),
        defaults={"d_model": 2048, "n_heads": 16, "n_layers": 24, "vocab_size": 50368, "activation": "gelu"},
    ),
    # Mixture-of-experts decoders
    "mixtral": Family(
        defaults={"num_local_experts": 8, "num_experts_per_tok": 2},
        flags=_LLAMA_FLAGS,
        features=(_moe_all("num_local_experts", "intermediate_size"),),
    ),
    "granitemoe": Family(
        defaults={"num_local_experts": 8, "num_experts_per_tok": 2},
        flags=_LLAMA_FLAGS,
        features=(_moe_all("num_local_experts", "intermediate_size"),),
    ),
    "granitemoeshared": Family(
        defaults={"num_local_experts": 8, "num_experts_per_tok": 2},
        flags=_LLAMA_FLAGS,
        features=(_moe_all("num_local_experts", "intermediate_size"), _granite_shared),
    ),
    "qwen2_moe": _QWEN_MOE,
    "qwen3_moe": Family(
        defaults={"num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
        fixed={"qk_norm": True},
        flags=_LLAMA_FLAGS,
        features=(_qwen_moe,),
    ),
    # gpt-oss: q/k/v/o biases, a learned sink logit per head, a biased router, biased experts (clamped
    # SwiGLU), sliding (128) and full attention alternating (modeling_gpt_oss.py)
    "gpt_oss": Family(
        fixed={"router_bias": True, "expert_bias": True, "attn_sinks": True},
        flags={**_TIE, "qkv_bias": ("attention_bias", True), "o_bias": ("attention_bias", True)},
        features=(_moe_all("num_local_experts", "intermediate_size"),),
    ),
    "glm4_moe": Family(
        flags={**_TIE, "qkv_bias": ("attention_bias", False), "qk_norm": ("use_qk_norm", False)},
        features=(_first_k_dense,),
    ),
    "dots1": Family(fixed={"qk_norm": True}, flags=_LLAMA_FLAGS, features=(_first_k_dense,)),
    "ernie4_5_moe": Family(
        flags={**_TIE_T, **_ERNIE_BIAS, "lm_head_bias": ("use_bias", False)},
        features=(_ernie_moe,),
    ),
    "phimoe": Family(
        fixed={**_LAYER},
        flags={**_TIE, **_ATTN_BIAS, "lm_head_bias": ("lm_head_bias", False)},
        features=(_moe_all("num_local_experts", "intermediate_size"),),
    ),
    "hunyuan_v1_moe": Family(fixed={"qk_norm": True}, flags={**_TIE, **_ATTN_BIAS}, features=(_hunyuan_moe,)),
    # Qwen3-VL's language models (Qwen3VLTextConfig / Qwen3VLMoeTextConfig; built only inside the
    # multimodal model): Qwen 3's layout, q/k norms over one head
    "qwen3_vl_text": Family(fixed={"qk_norm": True}, flags=_LLAMA_FLAGS),
    "qwen3_vl_moe_text": Family(fixed={"qk_norm": True}, flags=_LLAMA_FLAGS, features=(_qwen_moe,)),
    "deepseek_v2": Family(flags=_LLAMA_FLAGS, features=(_deepseek,)),
    "deepseek_v3": Family(flags=_LLAMA_FLAGS, features=(_deepseek,)),
    "llama4_text": Family(defaults=_LLAMA4_TEXT_DEFAULTS, flags=_LLAMA_FLAGS, features=(_llama4_text,)),
    # Encoders and encoder-decoders
    "bert": Family(fixed=_ENC, defaults={"hidden_act": "gelu"}, features=(_encoder,)),
    "roberta": Family(fixed=_ENC, defaults={"hidden_act": "gelu"}, features=(_encoder,)),
    "deberta-v2": Family(fixed=_ENC, defaults={"hidden_act": "gelu"}, features=(_deberta_v2,)),
    # transformers 5 ties T5's lm_head to the shared embedding always (configuration_t5.py forces
    # tie_word_embeddings=True; v1.1's `false` now only turns off the decoder-output scaling)
    "t5": Family(
        fixed={"structure": "encoder_decoder", "norm": "rms", "norms_per_layer": 3, "tie_embeddings": True},
        defaults={
            "d_model": 512,
            "d_kv": 64,
            "d_ff": 2048,
            "num_layers": 6,
            "num_heads": 8,
            "vocab_size": 32128,
        },
        features=(_t5,),
    ),
    # mT5 (google/mt5-*): T5 v1.1's layers and module names (transformers models/mt5/modeling_mt5.py),
    # its own class defaults (gated-gelu, vocabulary 250,112); MT5Config forces tie_word_embeddings=True
    # in transformers 5 as T5Config does (configuration_mt5.py)
    "mt5": Family(
        fixed={"structure": "encoder_decoder", "norm": "rms", "norms_per_layer": 3, "tie_embeddings": True},
        features=(_t5,),
    ),
}

#: Multimodal families: the language tower's config sits under ``text_config`` (or at the top level, as in
#: Qwen2-VL's published configs); the vision tower and projector are counted by `fitcheck.sources.vision`.
MULTIMODAL: dict[str, tuple[str, Callable[[Config, Config], vision.Tower]]] = {
    "llava": ("llama", vision.llava),
    "qwen2_vl": ("qwen2", vision.qwen2_vl),
    "qwen2_5_vl": ("qwen2", vision.qwen2_5_vl),
    "gemma3": ("gemma3_text", vision.gemma3),
    "llama4": ("llama4_text", vision.llama4),
    "mistral3": ("mistral", vision.mistral3),
    "qwen3_vl": ("qwen3_vl_text", vision.qwen3_vl),
    "qwen3_vl_moe": ("qwen3_vl_moe_text", vision.qwen3_vl),
}


#: Multimodal wrappers whose model ties the lm_head by the wrapper's own ``tie_word_embeddings``
#: (transformers 5.24, checked by building each with the key on one level, the other, both and neither),
#: and what a config that states the key on neither level means. Qwen3VLConfig / Qwen3VLMoeConfig: false,
#: their class default. Mistral3Config defaults it to true, but the published Mistral 3 checkpoints that
#: leave it out store a separate lm_head (mistralai/Magistral-Small-2509: 24,011,361,280 parameters in its
#: safetensors = the untied model), and ``from_pretrained`` keeps the two apart when the checkpoint stores
#: both (modeling_utils.py ``tie_weights``: both present with different values -> not tied): ``None`` reads
#: the text model's own class default there (MistralConfig: false).
WRAPPER_TIES: dict[str, bool | None] = {"mistral3": None, "qwen3_vl": False, "qwen3_vl_moe": False}


def _wrapper_tie(cfg: Config, text_cfg: Config, model_type: str, text_type: str) -> bool:
    """Whether the lm_head shares the embedding: the wrapper's key when the config states it, else the
    text config's, else `WRAPPER_TIES`."""
    for level in (cfg, text_cfg):
        if level.get("tie_word_embeddings") is not None:
            return bool(level["tie_word_embeddings"])
    default = WRAPPER_TIES[model_type]
    if default is None:
        return bool(class_defaults().get(text_type, {}).get("tie_word_embeddings", False))
    return default


#: Types whose publishers label a transformers architecture under their own name, read as that one.
#: kimi_k2 (moonshotai/Kimi-K2-*): "Kimi-K2 reuses the DeepSeekV3CausalLM architecture ... we set
#: model_type kimi_k2 in config.json" so engines can tell it apart, and changing it to deepseek_v3 runs
#: the model (the deploy guidance of github.com/MoonshotAI/Kimi-K2, docs/deploy_guidance.md); its
#: architectures entry is DeepseekV3ForCausalLM and its remote configuration_deepseek.py DeepseekV3Config.
TYPE_ALIASES: dict[str, str] = {"kimi_k2": "deepseek_v3"}


#: Suffixes of a model class in ``architectures`` that are not part of the architecture's name.
_CLASS_SUFFIXES = ("ForCausalLM", "ForConditionalGeneration", "LMHeadModel", "Model")


def inferred_model_type(cfg: Config) -> tuple[str, str] | None:
    """The ``model_type`` of a config.json that names none, and where it was read: (type, source).

    transformers itself reads a remote-code repo's type from the class its ``auto_map`` names
    (``AutoConfig``: ``configuration_minicpm.MiniCPMConfig`` defines ``model_type = "minicpm"``), so that
    class decides: its name less ``Config``, else (a bare module path) the module's ``configuration_<type>``.
    A module file can hold another generation's class (MiniCPM3-4B's ``configuration_minicpm.MiniCPM3Config``
    is latent attention, not MiniCPM's), so an ``auto_map`` class fitcheck does not read is not read as its
    module's type. Without an ``auto_map``: the first ``architectures`` class less its head suffix
    (``MiniCPMForCausalLM``). Accepted only when it names a type fitcheck reads (compared without case or
    punctuation), else None.
    """
    known = {compact(t): t for t in (*FAMILIES, *TYPE_ALIASES)}
    candidates: list[tuple[str, str]] = []
    auto_map = cfg.get("auto_map")
    if isinstance(auto_map, Mapping) and isinstance(auto_map.get("AutoConfig"), str):
        ref = auto_map["AutoConfig"].split("--")[-1]
        module, _, cls = ref.rpartition(".")
        if cls.endswith("Config") and len(cls) > len("Config"):
            candidates.append((cls.removesuffix("Config"), f"auto_map's {ref}"))
        elif ref.startswith("configuration_") and "." not in ref:
            candidates.append((ref.removeprefix("configuration_"), f"auto_map's {ref}"))
        elif module.startswith("configuration_"):
            candidates.append((module.removeprefix("configuration_"), f"auto_map's {ref}"))
    archs = cfg.get("architectures")
    if not candidates and isinstance(archs, list) and archs and isinstance(archs[0], str):
        cls = archs[0]
        for suffix in _CLASS_SUFFIXES:
            if cls.endswith(suffix) and len(cls) > len(suffix):
                candidates.append((cls.removesuffix(suffix), f"architectures' {cls}"))
                break
    for name, where in candidates:
        if compact(name) in known:
            return known[compact(name)], where
    return None


#: The shape keys whose silent class default would size another model: the width, depth, heads, MLP width
#: and vocabulary (`defaulted_shape`).
SHAPE_FIELDS = ("hidden_size", "num_layers", "num_heads", "intermediate_size", "vocab_size")


def defaulted_shape(cfg: Config) -> list[str]:
    """The shape keys a natively read text model's config leaves to its configuration class's defaults, as
    ``key value`` (``hidden_size 4,096``). A file ``save_pretrained`` wrote may leave out what equals the
    defaults (``to_diff_dict``) and transformers builds the same model from it, but a file that gives its
    shape under names fitcheck does not read (``hidden_dim``, ``ffn_embed_dim``: a tool's own format, not a
    Hub config) or one level down (a ``text_config`` under a text-only type) silently sizes the class's
    default model. Multimodal wrappers are left out: their published ``text_config`` often states only what
    differs from its class (llava-1.5's names its type alone)."""
    raw_type = cfg.get("model_type")
    if not isinstance(raw_type, str):
        return []
    model_type = TYPE_ALIASES.get(raw_type, raw_type)
    if model_type in MULTIMODAL or model_type not in FAMILIES:
        return []
    defaults = class_defaults().get(model_type, {})
    out = []
    for field_name in SHAPE_FIELDS:
        keys = KEYS[field_name]
        if any(cfg.get(k) is not None for k in keys):
            continue
        used = next((k for k in keys if defaults.get(k) is not None), None)
        if used is not None:
            out.append(f"{used} {defaults[used]:,}")
    return out


def supported_types() -> list[str]:
    """Every ``model_type`` fitcheck reads natively."""
    return sorted({*FAMILIES, *MULTIMODAL, *TYPE_ALIASES})


def _fields(cfg: Config, fam: Family, model_type: str) -> Fields:
    # absent keys take the configuration class's defaults (unless an alias of the key is given); an
    # explicit null stays null (q_lora_rank)
    given = {a for k in cfg for a in _ALIASES.get(k, (k,))}
    defaults = {**class_defaults().get(model_type, {}), **fam.defaults}
    cfg = {**{k: v for k, v in defaults.items() if k not in given}, **cfg}
    h = int(_need(cfg, *KEYS["hidden_size"]))
    heads = int(_need(cfg, *KEYS["num_heads"]))
    d: Fields = {
        "model_type": model_type,
        "hidden_size": h,
        "num_layers": int(_need(cfg, *KEYS["num_layers"])),
        "num_heads": heads,
        "num_kv_heads": heads
        if model_type in MHA_ONLY_TYPES
        else int(_first(cfg, KEYS["num_kv_heads"]) or heads),
        "head_dim": int(_first(cfg, KEYS["head_dim"]) or h // heads),
        "vocab_size": int(_need(cfg, *KEYS["vocab_size"])),
        "activation": str(_first(cfg, KEYS["activation"]) or "silu"),
        "sliding_window": cfg.get("sliding_window") if cfg.get("use_sliding_window", True) else None,
        "attn_dropout": _opt_prob(cfg, "attention_dropout", 0.0),
    }
    inter = _first(cfg, KEYS["intermediate_size"])
    if inter is not None:
        d["intermediate_size"] = int(inter)
    d.update(fam.fixed)
    for name, (key, default) in fam.flags.items():
        d[name] = bool(_opt(cfg, key, default))
    for feature in fam.features:
        d.update(feature(cfg, d))
    if "intermediate_size" not in d:
        raise ModelSourceError(
            "config.json lacks 'intermediate_size', which fitcheck needs to size the model"
        )
    if d.get("sliding_window") is not None and not isinstance(d["sliding_window"], int):
        d["sliding_window"] = None
    d["sliding_layers"] = _sliding_layers(cfg, model_type, d["num_layers"], d.get("sliding_window"))
    return d


#: Where a family puts its sliding-window layers when config.json lists no ``layer_types`` (transformers
#: 5.24): ``"all"``, every layer (the model builds one sliding-window mask for all of them: ``mask_function
#: = create_sliding_window_causal_mask`` when ``sliding_window`` is set, modeling_mistral.py, mixtral,
#: phi3, phimoe, starcoder2, ministral3; ministral's ``layer_types`` are all sliding then); an int ``p``,
#: layer ``i`` slides unless ``(i + 1) % p == 0``, the configuration class's ``layer_types`` derivation
#: (gemma2 and gpt_oss alternate, ``p`` 2; olmo3 ``p`` 4; gemma3_text, cohere2 and exaone4 read ``p`` from
#: ``sliding_window_pattern``, 6, 4 and 4 when absent); ``"max_window_layers"``, the layers from
#: ``max_window_layers`` on (qwen2, qwen3: their ``use_sliding_window`` already decides whether
#: ``sliding_window`` is read). A family not named attends to every key in every layer (``0``).
SLIDING_LAYOUT: dict[str, str | int] = {
    "mistral": "all", "mixtral": "all", "phi3": "all", "phimoe": "all", "starcoder2": "all",
    "ministral": "all", "ministral3": "all",
    "gemma2": 2, "gpt_oss": 2, "olmo3": 4, "gemma3_text": 6, "cohere2": 4, "exaone4": 4,
    "qwen2": "max_window_layers", "qwen3": "max_window_layers",
}  # fmt: skip
#: Families whose configuration class reads the period from ``sliding_window_pattern``.
PATTERN_KEY_TYPES = frozenset({"gemma3_text", "cohere2", "exaone4"})


def _sliding_layers(cfg: Config, model_type: str, layers: int, window: int | None) -> int:
    """How many decoder layers attend only to the last ``window`` keys (0 without a window): the
    ``sliding_attention`` entries of ``layer_types`` where config.json lists one per layer, else the
    family's layout (`SLIDING_LAYOUT`)."""
    if not window:
        return 0
    types = cfg.get("layer_types")
    if isinstance(types, list) and len(types) == layers:
        return sum(1 for t in types if t == "sliding_attention")
    layout = SLIDING_LAYOUT.get(model_type, 0)
    if layout == "all":
        return layers
    if layout == "max_window_layers":
        first = _opt_int(cfg, "max_window_layers", layers, 0)
        return max(0, layers - first)
    period = cfg.get("sliding_window_pattern") if model_type in PATTERN_KEY_TYPES else None
    if isinstance(period, str) and period and set(period) <= {"L", "G"}:
        return sum(1 for i in range(layers) if period[i % len(period)] == "L")  # EXAONE 4's "LLLG"
    p = period if isinstance(period, int) and not isinstance(period, bool) and period > 0 else layout
    if not isinstance(p, int) or p <= 0:
        return 0
    return layers - layers // p


def _multimodal(cfg: Config, model_type: str) -> Fields:
    text_type, tower = MULTIMODAL[model_type]
    text = cfg.get("text_config")
    if isinstance(text, Mapping):
        text_cfg = dict(text)
    else:  # Qwen2-VL publishes the language model's keys at the top level
        text_cfg = {k: v for k, v in cfg.items() if k != "vision_config"}
    text_type = str(text_cfg.get("model_type") or text_type)
    if text_type in ("qwen2_vl_text", "qwen2_5_vl_text"):
        text_type = "qwen2"
    if model_type in ("qwen2_vl", "qwen2_5_vl"):
        text_type = "qwen2"
    if text_type not in FAMILIES:
        raise ModelSourceError(f"{model_type}: its language model's type '{text_type}' is not supported")
    if model_type == "llava" and "tie_word_embeddings" not in text_cfg:
        text_cfg["tie_word_embeddings"] = bool(cfg.get("tie_word_embeddings", False))
    if model_type in WRAPPER_TIES:
        text_cfg["tie_word_embeddings"] = _wrapper_tie(cfg, text_cfg, model_type, text_type)
    d = _fields(text_cfg, FAMILIES[text_type], text_type)
    vis = cfg.get("vision_config")
    built = tower(dict(vis) if isinstance(vis, Mapping) else {}, {**text_cfg, "_top": cfg})
    d["extra_params"], d["tower_linears"], d["tower_convs"] = built.params, built.linears, built.convs
    d["model_type"] = model_type
    return d


#: Size fields of a config.json and the largest value a real model has come near (x ~50 of today's
#: largest: Llama 3.1 405B has hidden 16,384, 126 layers, 128 heads; vocabularies reach ~260k; MoE
#: models 256 experts). Past these a config is a typo or hostile, not a model.
SIZE_BOUNDS: dict[str, int] = {
    **dict.fromkeys(KEYS["hidden_size"], 1_048_576),
    **dict.fromkeys(KEYS["num_layers"], 10_000),
    **dict.fromkeys(KEYS["num_heads"], 100_000),
    **dict.fromkeys(KEYS["num_kv_heads"], 100_000),
    **dict.fromkeys(KEYS["head_dim"], 65_536),
    **dict.fromkeys(KEYS["intermediate_size"], 16_777_216),
    **dict.fromkeys(KEYS["vocab_size"], 67_108_864),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok"), 65_536),
    **dict.fromkeys(("moe_intermediate_size", "shared_expert_intermediate_size", "kv_lora_rank"), 16_777_216),
}


#: Size keys a published config may give as a list: Gemma 3n's MatFormer MLP widths (google/gemma-3n-E4B's
#: text_config.intermediate_size, one per layer; transformers models/gemma3n/configuration_gemma3n.py accepts
#: an int or a list of num_hidden_layers ints), ERNIE-4.5-VL's expert widths (moe_intermediate_size, one per
#: modality: text experts, vision experts; models/ernie4_5_vl_moe/configuration_ernie4_5_vl_moe.py).
PER_LAYER_KEYS = frozenset({*KEYS["intermediate_size"], "moe_intermediate_size"})


def _whole_in(value: Any, bound: int) -> bool:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= bound


#: Size keys whose 0 means "none", as the model code reads them: no shared expert
#: (transformers Qwen2-MoE / Qwen3-MoE configs; Qwen/Qwen3-Coder-480B-A35B-Instruct publishes
#: ``"shared_expert_intermediate_size": 0``, which Qwen3MoeConfig does not read), and MiniCPM's dense MLP
#: (``num_experts`` 0, `_minicpm`: vLLM models/minicpm.py reads 0 or absent as dense).
ZERO_IS_NONE: dict[str, tuple[str, ...] | None] = {
    "shared_expert_intermediate_size": None,
    "shared_intermediate_size": None,
    "num_experts": ("minicpm",),
}


def check_sizes(cfg: Config, where: str = "config.json") -> None:
    """Every size field present is a whole number from 1 to its bound (or, for `PER_LAYER_KEYS`, a
    non-empty list of them), named with its own key; 0 where it means none (`ZERO_IS_NONE`)."""
    for key, bound in SIZE_BOUNDS.items():
        value = cfg.get(key)
        if value is None:
            continue
        types = ZERO_IS_NONE.get(key, ())
        if value == 0 and type(value) is int and (types is None or cfg.get("model_type") in types):
            continue
        per_layer = key in PER_LAYER_KEYS and isinstance(value, list) and bool(value)
        if not (all(_whole_in(v, bound) for v in value) if per_layer else _whole_in(value, bound)):
            shown = clipped(repr(value))
            raise ModelSourceError(f"{where}: {key} must be a whole number from 1 to {bound:,} (got {shown})")


#: Flags a config.json holds as JSON true/false and the converter reads as booleans: a string there
#: ("false") would read as true (Python's bool of a non-empty string) and size another model.
FLAG_KEYS: tuple[str, ...] = (
    "tie_word_embeddings", "attention_bias", "mlp_bias", "use_qkv_bias", "use_bias", "bias", "use_qk_norm",
    "qk_layernorm", "add_bias_linear", "add_qkv_bias", "attention_out_bias", "lm_head_bias",
    "use_sliding_window", "new_decoder_architecture", "multi_query", "parallel_attn", "use_parallel_residual",
    "no_bias", "enable_bias", "do_layer_norm_before", "_remove_final_layer_norm",
    "layer_norm_elementwise_affine", "multi_query_attention", "rmsnorm", "post_layer_norm",
    "position_biased_input", "relative_attention", "share_att_key",
)  # fmt: skip


def check_flags(cfg: Config, where: str = "config.json") -> None:
    """Every flag present is true, false (or 0/1, as json.dump writes a Python int) or null."""
    for key in FLAG_KEYS:
        value = cfg.get(key)
        if value is None or isinstance(value, bool) or (type(value) is int and value in (0, 1)):
            continue
        raise ModelSourceError(f"{where}: {key} must be true or false (got {clipped(repr(value))})")


def arch_from_hf_config(cfg: Config) -> DecoderArch:
    """Build a `DecoderArch` from a parsed ``config.json``.

    Raises:
        ModelSourceError: unknown or state-space ``model_type``, missing or inconsistent fields.
    """
    if not isinstance(cfg, Mapping):
        raise ModelSourceError("config.json must hold a JSON object")
    raw_type = cfg.get("model_type")
    if not isinstance(raw_type, str) or not raw_type:
        shown = clipped(repr(raw_type))
        auto_map = cfg.get("auto_map")
        named = auto_map.get("AutoConfig") if isinstance(auto_map, Mapping) else None
        archs = cfg.get("architectures")
        named = named or (archs[0] if isinstance(archs, list) and archs else None)
        hint = f" (its classes name {clipped(str(named), 60)}, not a type fitcheck reads)" if named else ""
        raise ModelSourceError(
            f"config.json: model_type must name the architecture as a string (got {shown}){hint}; "
            "`fitcheck models` and docs/cli.md list the supported types"
        )
    check_sizes(cfg)
    check_flags(cfg)
    for sub in ("text_config", "llm_config", "language_config"):
        inner = cfg.get(sub)
        if isinstance(inner, Mapping):
            check_sizes(inner, f"config.json {sub}")
            check_flags(inner, f"config.json {sub}")
    model_type = raw_type
    if model_type in SSM_TYPES:
        raise ModelSourceError(
            f"model_type '{model_type}' is a state-space / recurrent model; fitcheck models transformers "
            "only, so it cannot estimate it yet"
        )
    if model_type in HYBRID_TYPES:
        raise ModelSourceError(
            f"model_type '{model_type}' interleaves attention with {HYBRID_TYPES[model_type]}; fitcheck "
            "models transformer layers only, so it cannot estimate it yet"
        )
    if model_type == "gemma3" and not isinstance(cfg.get("text_config"), Mapping):
        model_type = "gemma3_text"  # a text-only Gemma 3 config under the multimodal type
    model_type = TYPE_ALIASES.get(model_type, model_type)
    if model_type not in FAMILIES and model_type not in MULTIMODAL:
        raise UnsupportedTypeError(model_type)
    try:
        if model_type in MULTIMODAL:
            fields = _multimodal(cfg, model_type)
        else:
            fields = _fields(cfg, FAMILIES[model_type], model_type)
        if model_type == "gemma3_text" and cfg.get("model_type") == "gemma3":
            fields["model_type"] = "gemma3"
        return DecoderArch(**fields)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValidationError):
            first = exc.errors()[0]
            where = "".join(f"{p}: " for p in (".".join(str(p) for p in first["loc"]),) if p)
            msg = str(first["msg"]).removeprefix("Value error, ")  # pydantic's prefix for a ValueError
            raise ModelSourceError(f"config.json: {where}{msg}") from None
        raise ModelSourceError(f"config.json has a field of the wrong type: {exc}") from None


class UnsupportedTypeError(ModelSourceError):
    """A ``model_type`` without a table row (the meta-device fallback may still size it)."""

    def __init__(self, model_type: str, transformers_version: str | None = None) -> None:
        self.model_type = model_type
        shown = clipped(model_type, 60)
        if transformers_version is None:
            tail = (
                "Install the torch extra to size it from transformers (pip install torch==2.13.0, then "
                "pip install -e '.[torch]' from a checkout or pip install 'fitcheck-train[torch]')"
            )
        else:  # the extra is installed and transformers does not know the type either (remote code)
            tail = f"transformers {transformers_version} has no class for it either (remote code, never run)"
        super().__init__(
            f"model_type '{shown}' is not read natively; supported: {', '.join(supported_types())}. {tail}"
        )
