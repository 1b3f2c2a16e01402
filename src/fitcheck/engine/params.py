"""Parameter inventory of a decoder: every weight matrix by name, shape and role.

The counts are exact integers from the architecture (Megatron-style accounting, see
docs/methodology.md "Parameter counts"); tests check them against published totals.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from fitcheck.models import DecoderArch

Role = Literal["attn", "mlp", "expert", "router", "shared_expert"]


@dataclass(frozen=True)
class Linear:
    """One projection inside a decoder layer.

    Attributes:
        name: the module name LoRA targets use (``q_proj``, ``c_attn``, ...).
        d_in, d_out: the matrix shape (input and output features).
        copies: how many of it one layer holds (experts) or that one token uses (active).
        bias: whether it has a bias vector.
        role: attention, dense MLP, routed expert, router or shared expert.
        is_module: an ``nn.Linear`` (or GPT-2 ``Conv1D``) that bitsandbytes can quantize;
            transformers >= 5 stores MoE experts as 3-D parameters.
        all_linear: whether peft's ``all-linear`` wraps it (`OUTSIDE_ALL_LINEAR`).
        lora_factor: rank multiplier peft applies: transformers 5 fuses the experts' w1 and w3 into
            ``gate_up_proj``, and peft >= 0.18 converts a rank-r target on each into rank 2r there
            (``ParamWrapper``: lora_A ``(2r*E, in)``, lora_B ``(out, 2r*E)``).
    """

    name: str
    d_in: int
    d_out: int
    copies: int
    bias: bool
    role: Role
    is_module: bool = True
    lora_factor: int = 1
    all_linear: bool = True

    @property
    def numel(self) -> int:
        return self.copies * (self.d_in * self.d_out + (self.d_out if self.bias else 0))


#: Module names per family, as peft matches LoRA targets (modeling_<family>.py in transformers, or the
#: remote code's modeling file). Keys: q k v o (attention), qkv (fused), up gate down (MLP), gate_up
#: (fused), cross (prefix of encoder-decoder cross-attention), router (an MoE layer's). Absent keys take
#: `_LLAMA_NAMES`.
_LLAMA_NAMES: dict[str, str] = {
    "q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "qkv": "qkv_proj",
    "gate": "gate_proj", "up": "up_proj", "down": "down_proj", "gate_up": "gate_up_proj", "router": "gate",
}  # fmt: skip
_PLAIN = {"up": "fc1", "down": "fc2"}
_NEOX = {"qkv": "query_key_value", "o": "dense", "up": "dense_h_to_4h", "down": "dense_4h_to_h"}
_BERT = {"q": "query", "k": "key", "v": "value", "o": "attention.output.dense"}
_BERT |= {"up": "intermediate.dense", "down": "output.dense"}
NAMES: dict[str, dict[str, str]] = {
    "gpt2": {"qkv": "c_attn", "o": "c_proj", "up": "c_fc", "down": "mlp.c_proj"},
    "phi": {"o": "dense", **_PLAIN},
    "gpt_neox": _NEOX,
    "falcon": _NEOX,
    "bloom": _NEOX,
    "chatglm": {**_NEOX, "gate_up": "dense_h_to_4h"},
    "gptj": {"o": "out_proj", "up": "fc_in", "down": "fc_out"},
    "opt": {"o": "out_proj", **_PLAIN},
    "mpt": {"qkv": "Wqkv", "o": "out_proj", "up": "up_proj", "down": "down_proj"},
    "starcoder2": {"up": "c_fc", "down": "c_proj"},
    "nemotron": {"up": "up_proj", "down": "down_proj"},
    "arcee": {"up": "up_proj", "down": "down_proj"},
    "internlm2": {"qkv": "wqkv", "o": "wo", "gate": "w1", "up": "w3", "down": "w2"},
    "baichuan": {"qkv": "W_pack"},
    "qwen": {"qkv": "c_attn", "o": "c_proj", "gate": "w2", "up": "w1", "down": "mlp.c_proj"},
    "bert": _BERT,
    "roberta": _BERT,
    "deberta-v2": {**_BERT, "q": "query_proj", "k": "key_proj", "v": "value_proj"},
    **{t: {"q": "q", "k": "k", "v": "v", "o": "o", "up": "wi", "gate": "wi_0", "down": "wo",
           "cross": "EncDecAttention."} for t in ("t5", "mt5")},
    # MoE routers held as ``self.router`` (modeling_<type>.py in transformers 5.24); the rest name it gate
    **{t: {"router": "router"} for t in ("gpt_oss", "granitemoe", "granitemoeshared", "llama4", "llama4_text",
                                          "phimoe")},
}  # fmt: skip
_GATED_UP = {"t5": "wi_1", "mt5": "wi_1"}

#: Families whose attention keeps b x heads x s^2 tensors whatever --attn says: MPT and BLOOM (ALiBi)
#: and DeBERTa (disentangled attention) have no SDPA path in transformers (no ``_supports_sdpa`` in
#: their modeling files); T5 hands its relative position bias to SDPA as a heads x s^2 additive mask,
#: counted here like eager scores.
EAGER_ONLY_TYPES = frozenset({"t5", "mt5", "deberta-v2", "mpt", "bloom"})
#: Of those, the ones with an SDPA path in transformers 5 (``_supports_sdpa``) that hands the kernel the
#: position bias as a mask: their attention probabilities (and any dropout on them) stay in the kernel.
SDPA_BIAS_TYPES = frozenset({"t5", "mt5"})
#: The rest always run their own eager attention code, whatever ``--attn`` says.
EAGER_CODE_TYPES = EAGER_ONLY_TYPES - SDPA_BIAS_TYPES


def module_names(a: DecoderArch) -> dict[str, str]:
    """The module names of this family (`NAMES`), over Llama's."""
    return {**_LLAMA_NAMES, **(_PLAIN if a.mlp == "plain" else {}), **NAMES.get(a.model_type, {})}


def _mla_linears(a: DecoderArch) -> list[Linear]:
    """DeepSeek-V2/V3 multi-head latent attention (``modeling_deepseek_v3.py``): q through a low-rank
    pair (or one q_proj), k/v through a shared compressed latent plus a decoupled RoPE key."""
    h, n = a.hidden_size, a.num_heads
    qk = a.head_dim  # qk_nope_head_dim + qk_rope_head_dim
    b = a.qkv_bias
    if a.q_lora_rank:
        q = [
            Linear("q_a_proj", h, a.q_lora_rank, 1, b, "attn"),
            Linear("q_b_proj", a.q_lora_rank, n * qk, 1, False, "attn"),
        ]
    else:
        q = [Linear("q_proj", h, n * qk, 1, False, "attn")]
    nope = qk - a.qk_rope_head_dim
    kv = [
        Linear("kv_a_proj_with_mqa", h, a.kv_lora_rank + a.qk_rope_head_dim, 1, b, "attn"),
        Linear("kv_b_proj", a.kv_lora_rank, n * (nope + a.v_head_dim), 1, False, "attn"),
    ]
    return [*q, *kv, Linear("o_proj", n * a.v_head_dim, h, 1, a.o_bias, "attn")]


def attention_linears(a: DecoderArch, cross: bool = False) -> list[Linear]:
    """q, k, v, o projections; GQA-narrowed k and v; fused where the family fuses them. ``cross``: the
    cross-attention of an encoder-decoder's decoder layer (q from the decoder, k and v from the encoder)."""
    if a.is_mla and not cross:
        return _mla_linears(a)
    q = a.num_heads * a.head_dim
    kv = a.num_kv_heads * a.head_dim
    h = a.hidden_size
    nm = module_names(a)
    pre = nm.get("cross", "cross_") if cross else ""
    if a.fused_qkv and not cross:
        proj = [Linear(nm["qkv"], h, q + 2 * kv, 1, a.qkv_bias, "attn")]
    else:
        proj = [
            Linear(pre + nm["q"], h, q, 1, a.qkv_bias, "attn"),
            Linear(pre + nm["k"], h, kv, 1, a.qkv_bias, "attn"),
            Linear(pre + nm["v"], h, kv, 1, a.qkv_bias, "attn"),
        ]
    return [*proj, Linear(pre + nm["o"], q, h, 1, a.o_bias, "attn")]


def dense_mlp_linears(a: DecoderArch, width: int, role: Role = "mlp") -> list[Linear]:
    """The MLP of a dense layer (or a shared expert) of the given width."""
    h = a.hidden_size
    b = a.mlp_bias
    nm = module_names(a)
    al = role not in OUTSIDE_ALL_LINEAR.get(a.model_type, frozenset())
    if a.mlp == "plain":
        return [
            Linear(nm["up"], h, width, 1, b, role, all_linear=al),
            Linear(nm["down"], width, h, 1, b, role, all_linear=al),
        ]
    if a.fused_gate_up:
        return [
            Linear(nm["gate_up"], h, 2 * width, 1, b, role, all_linear=al),
            Linear(nm["down"], width, h, 1, b, role, all_linear=al),
        ]
    return [
        Linear(nm["gate"], h, width, 1, b, role, all_linear=al),
        Linear(_GATED_UP.get(a.model_type, nm["up"]), h, width, 1, b, role, all_linear=al),
        Linear(nm["down"], width, h, 1, b, role, all_linear=al),
    ]


#: The types peft 0.21's v4->v5 MoE conversion rewrites, with the pattern it applies (peft
#: utils/transformers_weight_conversion.py ``_convert_peft_config_moe``: the types transformers 5.24's
#: conversion_mapping.py maps to ``qwen2_moe``, listed in ``_MODEL_TO_CONVERSION_PATTERN``, and Mixtral's
#: own).
#: A target named by a v4 name (`PEFT_MOE_RENAMES`: ``gate_proj``, ``up_proj``, ``down_proj``, ``gate``;
#: Mixtral's ``w1``/``w3``/``w2``) becomes the fused experts' (or the router's) target parameter and leaves
#: the module targets; ``all-linear`` is first resolved to leaf names, so the shared experts' and the dense
#: layers' (DeepSeek's first ``first_k_dense_replace``, Qwen3-MoE's ``mlp_only_layers``) MLP ``nn.Linear``
#: layers get no adapter; attention, experts and router do. qwen2_moe itself is the pattern, not a key: it
#: is not converted.
PEFT_MOE_CONVERSION: dict[str, str] = {
    **dict.fromkeys(("glm4_moe", "dots1", "ernie4_5_moe", "hunyuan_v1_moe", "deepseek_v2", "deepseek_v3",
                     "qwen3_moe", "olmoe"), "qwen2_moe"),
    "mixtral": "mixtral",
}  # fmt: skip

#: Per pattern, the v4 name and the projection (`moe_linears`) it targets after the conversion
#: (``_MOE_TARGET_MODULE_MAPPING``; ``gate_proj`` and ``up_proj``, or ``w1`` and ``w3``, are fused into one
#: target and must be named together, ``_MOE_FUSED_TARGETS``, at rank 2r).
PEFT_MOE_RENAMES: dict[str, dict[str, str]] = {
    "qwen2_moe": {"gate": "gate", "gate_proj": "experts.gate_up_proj", "up_proj": "experts.gate_up_proj",
                  "down_proj": "experts.down_proj"},
    "mixtral": {"gate": "gate", "w1": "experts.gate_up_proj", "w3": "experts.gate_up_proj",
                "w2": "experts.down_proj"},
}  # fmt: skip


def peft_moe_renames(a: DecoderArch) -> dict[str, str]:
    """The v4 target names peft converts for this model type (`PEFT_MOE_RENAMES`); empty if none."""
    return PEFT_MOE_RENAMES.get(PEFT_MOE_CONVERSION.get(a.model_type, ""), {})


#: What peft's ``all-linear`` does not reach, per MoE family (checked with peft 0.21 + transformers 5.24,
#: ``get_peft_model(model, LoraConfig(target_modules="all-linear"))`` on the meta device, held by
#: tests/test_peft_reach.py for every MoE family fitcheck reads): Granite MoE's experts and router are
#: plain 3-D parameters, Llama 4's experts too (its router is an ``nn.Linear`` and is wrapped), gpt-oss's
#: experts and router (``GptOssTopKRouter`` holds a bare weight and bias), Qwen2-MoE's and Qwen3-VL-MoE's
#: too (not converted: their dense MLPs and shared experts are wrapped), Phi-3.5-MoE's experts (its router
#: is wrapped, and breaks the forward: `LORA_BREAKS`); the converted types (`PEFT_MOE_CONVERSION`) their
#: shared experts and dense MLPs. Mixtral (converted by its own ``w1``/``w2``/``w3`` pattern) gets all.
OUTSIDE_ALL_LINEAR: dict[str, frozenset[str]] = {
    "granitemoe": frozenset({"expert", "router"}),
    "granitemoeshared": frozenset({"expert", "router"}),
    "llama4": frozenset({"expert"}),
    "llama4_text": frozenset({"expert"}),
    "gpt_oss": frozenset({"expert", "router"}),
    "phimoe": frozenset({"expert"}),
    "qwen2_moe": frozenset({"expert", "router"}),
    "qwen3_vl_moe": frozenset({"expert", "router"}),
    **dict.fromkeys(PEFT_MOE_CONVERSION, frozenset({"shared_expert", "mlp"})),
}


def moe_linears(a: DecoderArch, copies: int) -> list[Linear]:
    """Routed experts (``copies`` of them), the router and the shared expert of an MoE layer."""
    h, w = a.hidden_size, a.moe_intermediate_size
    up = 2 * w if a.mlp == "gated" else w
    outside = OUTSIDE_ALL_LINEAR.get(a.model_type, frozenset())
    ex, ro = "expert" not in outside, "router" not in outside
    nm = module_names(a)
    out = [
        Linear("experts.gate_up_proj", h, up, copies, a.expert_bias, "expert", False, 2, all_linear=ex),
        Linear("experts.down_proj", w, h, copies, a.expert_bias, "expert", is_module=False, all_linear=ex),
        Linear(nm["router"], h, a.num_experts, 1, a.router_bias, "router", False, all_linear=ro),
    ]
    if a.shared_expert_intermediate_size and a.model_type.startswith("granitemoe"):
        # GraniteMoeSharedMLP: one fused input_linear (gate and up) and output_linear
        s = a.shared_expert_intermediate_size
        out += [
            Linear("shared_mlp.input_linear", h, 2 * s, 1, False, "shared_expert"),
            Linear("shared_mlp.output_linear", s, h, 1, False, "shared_expert"),
        ]
    elif a.shared_expert_intermediate_size:
        out += [
            Linear(
                "shared_expert." + x.name,
                x.d_in,
                x.d_out,
                1,
                x.bias,
                "shared_expert",
                all_linear=x.all_linear,
            )
            for x in dense_mlp_linears(a, a.shared_expert_intermediate_size, "shared_expert")
        ]
        if a.shared_expert_gate:
            out.append(Linear("shared_expert_gate", h, 1, 1, False, "shared_expert"))
    return out


def layer_linears(
    a: DecoderArch, moe: bool, active: bool = False, stack: Literal["decoder", "encoder"] = "decoder"
) -> list[Linear]:
    """All projections of one layer. ``active`` counts only the top-k experts a token uses.

    ``stack="encoder"``: a layer of an encoder-decoder's encoder (no cross-attention); an
    encoder-decoder's decoder layers add cross-attention projections.
    """
    return list(_layer_linears(a, moe, active, stack))


#: Architectures whose counts are kept (the planner estimates one model hundreds of times; the
#: architecture is frozen, so its projections and inventory are computed once per architecture).
_ARCH_CACHE = 64


@lru_cache(maxsize=_ARCH_CACHE)
def _layer_linears(
    a: DecoderArch, moe: bool, active: bool, stack: Literal["decoder", "encoder"]
) -> tuple[Linear, ...]:
    lin = attention_linears(a)
    if a.structure == "encoder_decoder" and stack == "decoder":
        lin += attention_linears(a, cross=True)
    if moe:
        lin += moe_linears(a, a.experts_per_token if active else a.num_experts)
    else:
        lin += dense_mlp_linears(a, a.intermediate_size)
    return tuple(lin)


@dataclass(frozen=True)
class LayerKind:
    """A run of identical layers: how many, MoE or dense, and in which stack."""

    count: int
    moe: bool
    stack: Literal["decoder", "encoder"] = "decoder"

    def linears(self, a: DecoderArch, active: bool = False) -> list[Linear]:
        return layer_linears(a, self.moe, active, self.stack)


def layer_kinds(a: DecoderArch) -> list[LayerKind]:
    """Every kind of layer in the model with its count (kinds with no layer left out)."""
    moe_n = a.moe_layers if a.is_moe else 0
    kinds = [LayerKind(a.num_layers - moe_n, False), LayerKind(moe_n, True)]
    if a.structure == "encoder_decoder":
        kinds.append(LayerKind(a.encoder_layers, False, "encoder"))
    return [k for k in kinds if k.count]


def norm_params(a: DecoderArch, width: int | None = None) -> int:
    """Weights (and biases) of one norm of width hidden_size (or ``width``)."""
    w = a.hidden_size if width is None else width
    return w * (int(a.norm_weight) + int(a.has_norm_bias))


def _layer_norm_count(a: DecoderArch, kind: LayerKind) -> int:
    # T5: 2 norms per encoder layer, 3 per decoder layer (self, cross, feed-forward)
    return 2 if kind.stack == "encoder" else a.norms_per_layer


def _layer_other(a: DecoderArch) -> int:
    """Per-layer small tensors besides the main norms: q/k norms, MLA's latent norms, attention sinks."""
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    n = a.num_heads if a.attn_sinks else 0
    if a.qk_norm:
        n += (q + kv) if a.qk_norm_full else 2 * a.head_dim
    if a.is_mla:
        n += a.q_lora_rank + a.kv_lora_rank
    return n


def head_params(a: DecoderArch) -> int:
    """The task head: an untied lm_head (decoders, seq2seq) or pooler + classifier (encoders)."""
    h = a.hidden_size
    if a.structure == "encoder":
        return (h * h + h if a.pooler else 0) + a.num_labels * (h + 1)
    if a.num_labels:  # a decoder trained for classification: a bias-free `score` layer
        return a.num_labels * h
    if a.tie_embeddings:
        return a.vocab_size if a.lm_head_bias else 0
    return a.vocab_size * h + (a.vocab_size if a.lm_head_bias else 0)


def head_shapes(a: DecoderArch) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of the head's tensors; sums to `head_params`."""
    h, v = a.hidden_size, a.vocab_size
    if a.structure == "encoder":
        out = [(h, h, 1), (h, 1, 1)] if a.pooler else []
        return out + ([(a.num_labels, h, 1), (a.num_labels, 1, 1)] if a.num_labels else [])
    if a.num_labels:
        return [(a.num_labels, h, 1)]
    out = [] if a.tie_embeddings else [(v, h, 1)]
    return out + ([(v, 1, 1)] if a.lm_head_bias else [])


@dataclass(frozen=True)
class Inventory:
    """Exact parameter counts by role."""

    embedding: int
    positions: int
    lm_head: int
    final_norm: int
    per_layer_norms: int
    linears: int
    linear_modules: int  # in nn.Linear modules (what 4-bit quantization and LoRA can wrap)
    other_layer: int  # qk-norms
    extra: int

    @property
    def total(self) -> int:
        return (
            self.embedding
            + self.positions
            + self.lm_head
            + self.final_norm
            + self.per_layer_norms
            + self.linears
            + self.other_layer
            + self.extra
        )

    @property
    def norms(self) -> int:
        return self.final_norm + self.per_layer_norms + self.other_layer


@lru_cache(maxsize=_ARCH_CACHE)
def inventory(a: DecoderArch) -> Inventory:
    """Count every parameter of the architecture."""
    linears = modules = norms = other = 0
    for kind in layer_kinds(a):
        for lin in kind.linears(a):
            linears += kind.count * lin.numel
            if lin.is_module:
                modules += kind.count * lin.numel
        norms += kind.count * _layer_norm_count(a, kind) * norm_params(a)
        if kind.stack == "decoder":
            other += kind.count * _layer_other(a)
    finals = int(a.final_norm) + (1 if a.structure == "encoder_decoder" else 0) + int(a.embed_norm)
    return Inventory(
        embedding=a.vocab_size * a.hidden_size,
        positions=a.learned_positions * a.hidden_size,
        lm_head=head_params(a),
        final_norm=finals * norm_params(a),
        per_layer_norms=norms,
        linears=linears,
        linear_modules=modules,
        other_layer=other + a.misc_params,
        extra=a.extra_params,
    )


def kind_layer_params(a: DecoderArch, kind: LayerKind) -> int:
    """Parameters of one layer of this kind: its linears and its norms (the qk-norms and other small
    per-layer tensors of `_layer_other` left out)."""
    return sum(x.numel for x in kind.linears(a)) + _layer_norm_count(a, kind) * norm_params(a)


def count_params(a: DecoderArch) -> int:
    """Total parameters, as ``sum(p.numel() for p in model.parameters())`` reports them."""
    return inventory(a).total
