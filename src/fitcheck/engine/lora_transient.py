"""LoRA projection transients: inside one layer, what a LoRA-wrapped MLP projection holds while it runs
(docs/methodology.md, "LoRA projection transients").

peft ``tuners/lora/layer.py`` ``Linear.forward`` (0.14 and later; ``bnb.py`` ``Linear4bit.forward`` the
same after ``result = result.clone()``)::

    result = self.base_layer(x)
    x = self._cast_input_dtype(x, lora_A.weight.dtype)
    result = result + lora_B(lora_A(dropout(x))) * scaling

Two moments decide, each in the last layer's forward and, with checkpointing, in its recompute at the
start of backward (when everything the layer saved before it is back and its output's gradient waits):

* the MLP's input projection (``up_proj`` after ``gate_proj`` and the activation, a fused
  ``gate_up_proj``, ``fc1``), ``d_out`` = the MLP width: its base output, the scaled LoRA branch and
  their sum are alive at once; the branch has the adapter dtype without autocast (peft's fp32 adapters)
  and the compute dtype under autocast, the sum the wider of the two;
* the MLP's output projection (``down_proj``), ``d_in`` = the MLP width: when lora_A runs, the product
  that feeds it, its copy cast to the adapter dtype, the dropout output and mask, and under autocast
  lora_A's compute-dtype copy, beside the base output.

Traced with fitcheck's fake-tensor tracer (`fitcheck measure` on configs with the vocabulary cut to 512
so that no logits hide the layer: Phi-3 mini and Llama 2 13B shapes, b2 x 8192, LoRA r8 on all linears,
dropout 0.05 and 0, with and without autocast, checkpointing).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.engine import activations as act
from fitcheck.engine.lora import targeted
from fitcheck.engine.params import Linear, layer_linears
from fitcheck.models import DecoderArch, LlmSetup, Regime

#: Trainers whose LoRA layers are peft's (``Linear.forward`` above). Unsloth replaces the MLP's LoRA with
#: its own fused autograd functions (unsloth/kernels/fast_lora.py ``LoRA_MLP``); litgpt, torchtune and
#: mlx-lm build their own LoRA modules, not traced here.
PEFT_LORA_TRAINERS = ("hf", "axolotl", "llamafactory")


@dataclass(frozen=True)
class Transient:
    """Bytes per token of the larger LoRA projection moment, in the forward and in the recompute."""

    forward: float
    recompute: float
    rule: str


def _wrapped_mlp(a: DecoderArch, setup: LlmSetup) -> tuple[list[Linear], list[Linear]]:
    """The LoRA-wrapped MLP input projections and output projection of a dense layer."""
    h = a.hidden_size
    mlp = [x for x in layer_linears(a, False) if x.role == "mlp" and targeted(a, setup.lora_targets, x)]
    return [x for x in mlp if x.d_in == h], [x for x in mlp if x.d_out == h]


def mlp_lora_transient(a: DecoderArch, setup: LlmSetup, regime: Regime) -> Transient | None:
    """The larger of the two MLP moments, or None where the rule does not apply (full fine-tuning,
    DoRA, MoE layers, GPT-2, an MLP LoRA does not wrap, a trainer without peft's LoRA layers)."""
    if setup.method == "full" or setup.dora or a.is_moe or a.model_type == "gpt2":
        return None
    if setup.trainer not in PEFT_LORA_TRAINERS:
        return None
    ups, downs = _wrapped_mlp(a, setup)
    if not ups and not downs:
        return None
    c = act.context(setup, regime)
    acts = act.layer_activations(a, setup, regime)
    h, width = a.hidden_size, a.intermediate_size
    out_b = act.quantized_out_bytes(setup, regime, c)
    branch = c.gamma if c.autocast else c.adapter
    dropped = setup.lora_dropout > 0
    total = acts.total(setup.seq_len)
    hidden = acts.parts.get("mlp_hidden", 0.0)
    common = (c.norm_out + c.rho) * h  # the MLP's normed input and the residual stream
    out_grad = (c.rho + 4) * h  # the layer output's gradient, and the final norm's fp32 one
    moments: list[tuple[float, float, str]] = []
    if ups:
        d_out = ups[-1].d_out
        trans = (out_b + branch + max(out_b, branch)) * d_out
        # the input's copy in the adapter dtype stays referenced through the sum; lora_A saves it only
        # without autocast and without dropout (then it is in the layer's saved bytes)
        cast = c.adapter * h if c.adapter != c.norm_out else 0
        unsaved = cast if dropped or c.autocast else 0
        # gate_proj and its activation run before up_proj (LlamaMLP: down(act(gate(x)) * up(x)))
        gated = a.mlp == "gated" and len(ups) > 1
        act_out, earlier = (out_b * width, 2 * hidden / 3) if gated else (0.0, 0.0)
        before = total - hidden - acts.parts.get("down_input", 0.0) + earlier
        fwd = trans + cast + act_out + common
        rec = trans + unsaved + common + before + out_grad
        moments.append((fwd, rec, f"{ups[-1].name} output, scaled branch, sum"))
    if downs:
        differs = c.adapter != out_b
        cast = c.adapter * width if differs else 0
        # the dropout output is lora_A's argument; its mask is only kept by autograd, which a
        # checkpointed forward does not keep (in the recompute it is in the layer's saved bytes)
        drop = c.adapter * width if dropped else 0
        copy = c.gamma * width if c.autocast and c.adapter != c.gamma else 0
        base = out_b * h  # its base output; the h-wide branch comes after lora_A, once these are gone
        # a fused gate_up output stays alive through down_proj: ``gate`` is a chunk view of it, still
        # referenced (transformers Phi3MLP.forward); separate gate/up outputs are freed by then
        chunks = out_b * 2 * width if a.fused_gate_up else 0
        fwd = out_b * width + cast + drop + copy + common + base + chunks
        # in the recompute the saved inputs are in the layer's total; what is not saved stays extra
        unsaved = (cast if differs and (dropped or c.autocast) else 0) + (
            c.adapter * width if c.autocast and dropped else 0
        )
        moments.append((fwd, total + out_b * width + unsaved + common + base + out_grad, "down_proj input"))
    fwd = max(m[0] for m in moments)
    rec = max(m[1] for m in moments)
    which = max(moments, key=lambda m: m[1])[2]
    return Transient(fwd, rec, f"LoRA-wrapped MLP projection transient ({which})")
