"""Parameter inventory of a decoder: every weight matrix by name, shape and role.

The counts are exact integers from the architecture (Megatron-style accounting, see
docs/methodology.md "Parameter counts"); tests check them against published totals.
"""

from __future__ import annotations

from dataclasses import dataclass
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

    @property
    def numel(self) -> int:
        return self.copies * (self.d_in * self.d_out + (self.d_out if self.bias else 0))


def attention_linears(a: DecoderArch) -> list[Linear]:
    """q, k, v, o projections; GQA-narrowed k and v; fused where the family fuses them."""
    q = a.num_heads * a.head_dim
    kv = a.num_kv_heads * a.head_dim
    h = a.hidden_size
    if a.model_type == "gpt2":
        return [
            Linear("c_attn", h, q + 2 * kv, 1, a.qkv_bias, "attn"),
            Linear("c_proj", q, h, 1, a.o_bias, "attn"),
        ]
    if a.fused_qkv:
        proj = [Linear("qkv_proj", h, q + 2 * kv, 1, a.qkv_bias, "attn")]
    else:
        proj = [
            Linear("q_proj", h, q, 1, a.qkv_bias, "attn"),
            Linear("k_proj", h, kv, 1, a.qkv_bias, "attn"),
            Linear("v_proj", h, kv, 1, a.qkv_bias, "attn"),
        ]
    return [*proj, Linear("o_proj", q, h, 1, a.o_bias, "attn")]


def dense_mlp_linears(a: DecoderArch, width: int, role: Role = "mlp") -> list[Linear]:
    """The MLP of a dense layer (or a shared expert) of the given width."""
    h = a.hidden_size
    b = a.mlp_bias
    if a.model_type == "gpt2":
        return [Linear("c_fc", h, width, 1, b, role), Linear("mlp.c_proj", width, h, 1, b, role)]
    if a.mlp == "plain":
        return [Linear("fc1", h, width, 1, b, role), Linear("fc2", width, h, 1, b, role)]
    if a.fused_gate_up:
        return [Linear("gate_up_proj", h, 2 * width, 1, b, role), Linear("down_proj", width, h, 1, b, role)]
    return [
        Linear("gate_proj", h, width, 1, b, role),
        Linear("up_proj", h, width, 1, b, role),
        Linear("down_proj", width, h, 1, b, role),
    ]


def moe_linears(a: DecoderArch, copies: int) -> list[Linear]:
    """Routed experts (``copies`` of them), the router and the shared expert of an MoE layer."""
    h, w = a.hidden_size, a.moe_intermediate_size
    out = [
        Linear("experts.gate_up_proj", h, 2 * w, copies, False, "expert", is_module=False, lora_factor=2),
        Linear("experts.down_proj", w, h, copies, False, "expert", is_module=False),
        Linear("gate", h, a.num_experts, 1, False, "router", is_module=False),
    ]
    if a.shared_expert_intermediate_size:
        out += [
            Linear("shared_expert." + x.name, x.d_in, x.d_out, 1, x.bias, "shared_expert")
            for x in dense_mlp_linears(a, a.shared_expert_intermediate_size, "shared_expert")
        ]
        out.append(Linear("shared_expert_gate", h, 1, 1, False, "shared_expert"))
    return out


def layer_linears(a: DecoderArch, moe: bool, active: bool = False) -> list[Linear]:
    """All projections of one layer. ``active`` counts only the top-k experts a token uses."""
    lin = attention_linears(a)
    if moe:
        lin += moe_linears(a, a.experts_per_token if active else a.num_experts)
    else:
        lin += dense_mlp_linears(a, a.intermediate_size)
    return lin


def norm_params(a: DecoderArch) -> int:
    """Weights (and LayerNorm biases) of one norm of width hidden_size."""
    return a.hidden_size * (2 if a.norm == "layer" else 1)


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


def inventory(a: DecoderArch) -> Inventory:
    """Count every parameter of the architecture."""
    moe_n = a.moe_layers if a.is_moe else 0
    dense_n = a.num_layers - moe_n
    linears = 0
    modules = 0
    for n_layers, moe in ((dense_n, False), (moe_n, True)):
        for lin in layer_linears(a, moe):
            linears += n_layers * lin.numel
            if lin.is_module:
                modules += n_layers * lin.numel
    return Inventory(
        embedding=a.vocab_size * a.hidden_size,
        positions=a.learned_positions * a.hidden_size,
        lm_head=0 if a.tie_embeddings else a.vocab_size * a.hidden_size,
        final_norm=norm_params(a),
        per_layer_norms=a.num_layers * a.norms_per_layer * norm_params(a),
        linears=linears,
        linear_modules=modules,
        other_layer=a.num_layers * (2 * a.head_dim if a.qk_norm else 0),
        extra=a.extra_params,
    )


def count_params(a: DecoderArch) -> int:
    """Total parameters, as ``sum(p.numel() for p in model.parameters())`` reports them."""
    return inventory(a).total
