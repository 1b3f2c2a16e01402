"""torch.compile: what a compiled decoder layer saves for backward, and the compiled loss.

Under torch.compile, AOTAutograd partitions each compiled graph's joint forward/backward with the
min-cut rematerialization partitioner (``torch._inductor.compile_fx.partition_fn`` ->
``functorch.compile.min_cut_rematerialization_partition``, torch 2.13): cheap pointwise ops (RMSNorm's fp32
upcast and scaling, SiLU, the residual adds, RoPE's products, the softmax of eager attention) are recomputed
in backward from a few saved tensors instead of being saved, and Inductor fuses the pointwise chains so their
intermediates never exist. The rules below are read from the partitioned forward graphs that
``bench/compile_trace.py`` records (tests/data/compile/partition.yaml: HF Llama, Qwen2, Mistral and Gemma 2
layers in bf16, full and LoRA, and the two losses); tests/test_compiled.py holds the engine to that file.

Where the rules apply: torchtune compiles each decoder layer (``training.compile_model``: ``m.compile()`` on
every ``TransformerSelfAttentionLayer`` on torch >= 2.5, the whole model before) *before* activation
checkpointing wraps it, so a checkpointed layer recomputes with the same compiled forward; it compiles only
``CEWithChunkedOutputLoss.compute_cross_entropy`` (``training.compile_loss``), torchtune/training/_compile.py
@30b8519e. HF Trainer's ``torch_compile`` compiles the whole model, the loss with it; with non-reentrant
checkpointing inside the graph the partitioner keeps one input per layer, as eager checkpointing does
(traced).
Architectures outside the traced set keep the eager rule (a warning says so).
"""

from __future__ import annotations

from fitcheck.engine import activations as act
from fitcheck.engine.lora import targeted
from fitcheck.engine.params import layer_linears
from fitcheck.models import DecoderArch, LlmSetup, Regime

SOURCE = (
    "torch.compile partition traces (bench/compile_trace.py, tests/data/compile/partition.yaml, torch 2.13 "
    "Inductor partition_fn); torchtune training/_compile.py @30b8519e"
)
#: Loss kernels whose compiled form was traced: torchtune's ``compute_cross_entropy`` on one chunk and
#: transformers' ``ForCausalLMLoss`` (``logits.float()``, label shift by padding, ``cross_entropy``).
COMPILED_LOSS_KERNELS = ("standard", "chunked")
#: What the compiled cross-entropy saves per row besides the logits: its fp32 ``amax`` and ``log`` of the
#: sum of exponentials (traced: both losses save the bf16 logits, ``amax`` and ``log`` per row, nothing
#: vocabulary-wide in fp32).
LSE_BYTES_PER_ROW = 8
#: Trainers whose compile was read: torchtune (per layer + the chunked loss) and the HF-Trainer family
#: (``torch_compile``: the whole model). litgpt, Unsloth and MLX compile their own way or not at all.
COMPILE_TRAINERS = ("generic", "hf", "torchtune", "axolotl", "llamafactory")


def untraced(a: DecoderArch, setup: LlmSetup, regime: Regime) -> str:
    """Why the traced layer rule does not cover this setup ('' when it does)."""
    c = act.context(setup, regime)
    checks = (
        (setup.trainer not in COMPILE_TRAINERS, f"trainer {setup.trainer}"),
        (a.structure != "decoder", f"an {a.structure.replace('_', '-')} model"),
        (a.model_type == "gpt2" or a.norm != "rms", "a LayerNorm model"),
        (a.mlp != "gated", "a non-gated MLP"),
        (a.is_moe, "a mixture of experts"),
        (a.is_mla, "multi-head latent attention"),
        (a.parallel_block or a.fused_qkv or a.qk_norm, "a parallel block, fused qkv or q/k norms"),
        (bool(a.resid_dropout), "hidden dropout"),
        (setup.dora, "DoRA"),
        (setup.base_quant != "none", f"a {setup.base_quant} base"),
        (setup.method == "qlora" and regime.nf4_format != "torchao", "bitsandbytes 4-bit layers"),
        (setup.lora_dropout > 0, "LoRA dropout"),
        (c.gamma == 4 or act.fp32_stream(setup, regime), "an fp32 compute dtype"),
        (c.full and c.autocast and c.rho != c.gamma, "fp32 weights under autocast (master weights)"),
    )
    return next((why for bad, why in checks if bad), "")


def warning(a: DecoderArch, setup: LlmSetup, regime: Regime) -> str:
    """The caveat of a compiled run: where the eager rule is kept, or what was not traced."""
    if not setup.compile:
        return ""
    why = untraced(a, setup, regime)
    if why:
        return f"torch.compile: the partitioner's saved set was not traced for {why}; the eager rule is kept"
    return (
        "torch.compile: saved activations and the loss follow partition traces of torch 2.13's Inductor "
        "partitioner; other torch versions may save a different set"
    )


def layer_activations(a: DecoderArch, setup: LlmSetup, regime: Regime) -> act.LayerActs:
    """Bytes per token one compiled decoder layer saves for backward (traced).

    Saved by the partitioned forward: the layer input (the residual stream), one fp32 ``rsqrt`` per token per
    RMSNorm, the normed input of attention and of the MLP (compute dtype, shared by q/k/v or gate/up and their
    lora_A), the attention output projection's output (a pre-norm layer's second norm reads input + it; the
    sum is recomputed) and, with sandwich norms (4 per layer, Gemma 2), the MLP output too; attention as its
    kernel saves it (SDPA: q, k, v after RoPE, output, fp32 logsumexp; eager: q and k, v repeated to every
    head, the scores before and after softmax, fp32 max and sum per row, the reshaped output); the MLP's gate
    and up outputs and their product (SiLU's / GELU's output is recomputed); each LoRA-wrapped projection's
    lora_A output (rank wide). Not saved, unlike eager: RMSNorm's fp32 input copy, the activation's output,
    the output projection's input under SDPA (recomputed from the kernel output), except where autocast gives
    a LoRA-wrapped o_proj its own cast copy.
    """
    c = act.context(setup, regime)
    acts = act.LayerActs()
    h, g = a.hidden_size, c.gamma
    q_w, kv_w, heads = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim, a.num_heads
    sandwich = a.norms_per_layer >= 4
    acts.add("layer_input", c.rho * h)
    acts.add("norm_inputs", 4 * a.norms_per_layer + g * h * (2 if sandwich else 1))
    acts.add("qkv_inputs", g * h)
    lins = layer_linears(a, False, active=True, stack="encoder")
    o_proj = [x for x in lins if x.role == "attn"][-1]
    if act.uses_eager_scores(a, setup):
        acts.add("qkv", g * 3 * q_w)
        acts.add("attn_out", g * q_w + 8 * heads)
        acts.scores = 2 * g * heads
    else:
        acts.add("qkv", g * (q_w + 2 * kv_w))
        acts.add("attn_out", g * q_w + 4 * heads)
        lora_o = c.lora and c.autocast and targeted(a, setup.lora_targets, o_proj)
        acts.add("o_input", g * q_w if lora_o else 0)
    acts.add("mlp_inputs", g * h)
    acts.add("mlp_hidden", 3 * g * a.intermediate_size)
    if c.lora:
        wrapped = sum(1 for x in lins if targeted(a, setup.lora_targets, x))
        acts.add("lora_ranks", g * setup.lora_rank * wrapped)
    acts.add("nf4_dequantized", nf4_saved_bytes(a, setup, regime) / setup.tokens)
    return acts


def nf4_saved_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Bytes one compiled layer saves of its dequantized torchao NF4 weights (0 without them).

    Traced (``torchao-linear-nf4``, torchao 0.18.0): torchao's ``LinearNF4`` saves only the NF4 weight, but
    once AOTAutograd traces it into the joint graph the partitioner saves the dequantized compute-dtype
    weight for backward instead of recomputing it (the dequantization indexes a lookup table, which it does
    not recompute), and Inductor's backward allocates no weight. So every projection of a compiled QLoRA layer
    keeps its weight in the compute dtype until that layer's backward: every layer's without checkpointing,
    the recomputed layer's with it. Returned whole per layer; `layer_activations` spreads it per token.
    """
    if setup.method != "qlora" or regime.nf4_format != "torchao":
        return 0
    lins = layer_linears(a, False, active=True, stack="encoder")
    return act.context(setup, regime).gamma * sum(x.d_in * x.d_out * x.copies for x in lins if x.is_module)


def nf4_dequant_bytes(numel: int, gamma: int) -> int:
    """A torchao NF4 weight dequantized inside a compiled layer: Inductor fuses the unpacking, table lookups
    and scaling into one kernel that writes the compute-dtype weight (traced: the generated forward allocates
    one weight-sized compute-dtype buffer, no int64 indices or halves)."""
    return numel * gamma


def loss_hump(
    tokens_x_vocab: float, rows: int, gamma: int, chunks: int, cap: int
) -> tuple[float, float, float, float]:
    """(forward, backward, saved, at the output layer's backward) of a compiled cross-entropy, whole batch.

    Traced: the compiled loss saves the compute-dtype logits it was given and two fp32 values per row; its
    fp32 upcast, log-softmax and their gradients are fused (one reduction kernel forward, one pointwise kernel
    backward), so nothing vocabulary-wide in fp32 exists. Backward writes a compute-dtype gradient chunk
    beside
    the saved logits; by the output layer's backward the logits are freed (torchtune ``del logits`` in
    ``_loss_step``, lora_finetune_single_device.py @30b8519e; HF Trainer keeps only the loss) and every
    chunk's
    gradient exists. A Gemma 2 final soft-cap keeps its tanh output as in eager (not traced).
    """
    tv = tokens_x_vocab
    lse = LSE_BYTES_PER_ROW * rows
    return (
        tv * (gamma + cap) + lse,
        tv * (gamma + gamma / chunks + cap) + lse,
        tv * (gamma + cap) + lse,
        tv * (gamma + cap),
    )
