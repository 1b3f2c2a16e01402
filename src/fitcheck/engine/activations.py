"""Activations: what autograd saves per layer and per token, the logits hump, and transients.

The inventory follows the Hugging Face modeling code and PyTorch's saved-tensor rules (an operand is
saved only when the *other* operand needs a gradient, so a frozen linear saves no input; a conv saves
its input even with frozen weights), see docs/methodology.md, "Activations". All figures are bytes
per token unless a name says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from fitcheck.engine import litgpt, prefix
from fitcheck.engine.lora import targeted
from fitcheck.engine.params import EAGER_CODE_TYPES, EAGER_ONLY_TYPES, SDPA_BIAS_TYPES, Linear, layer_linears
from fitcheck.engine.quant import TRANSFORMERS_TRAINERS, expert_modules
from fitcheck.engine.regimes import PYTHON_GELUS
from fitcheck.facts.dtypes import nbytes
from fitcheck.models import DecoderArch, LlmSetup, Regime


@dataclass(frozen=True)
class Ctx:
    """Dtype facts of one setup, resolved once."""

    gamma: int  # bytes of the compute dtype (what matmuls produce)
    rho: int  # bytes of the residual stream (the embedding weight's dtype)
    norm_w: int  # bytes of norm weights
    adapter: int  # bytes of LoRA weights
    autocast: bool
    full: bool
    lora: bool

    @property
    def norm_out(self) -> int:
        return max(self.rho, self.norm_w)


def context(setup: LlmSetup, regime: Regime) -> Ctx:
    """The setup's dtypes. Without autocast every op runs in its inputs' dtype: the weights' dtype, or
    fp32 throughout on a k-bit-prepared bitsandbytes base (`fp32_stream`)."""
    full = setup.method == "full"
    weight = regime.trainable_dtype if full else regime.weight_dtype
    # after TRL 0.9-0.25's cast-back the fp32 norms still promote every norm output, hence every bitsandbytes
    # projection's output (`quantized_out_bytes`) and the residual stream from the first MLP on, to fp32
    embed = "fp32" if regime.kbit_upcast or regime.kbit_norms_fp32 else weight
    if regime.autocast:
        gamma = nbytes(setup.precision)
    else:
        gamma = 4 if fp32_stream(setup, regime) else nbytes(weight)
    return Ctx(
        gamma=gamma,
        rho=nbytes(embed),
        norm_w=nbytes(embed),
        adapter=nbytes(regime.adapter_dtype),
        autocast=regime.autocast,
        full=full,
        lora=not full,
    )


@dataclass
class LayerActs:
    """Bytes per token saved by one layer, by named part (sums to ``total``)."""

    parts: dict[str, float] = field(default_factory=dict)
    scores: float = 0.0  # bytes per token per key position (x seq_len): eager attention only

    def add(self, name: str, value: float) -> None:
        if value:
            self.parts[name] = self.parts.get(name, 0.0) + value

    def total(self, seq_len: int) -> float:
        return sum(self.parts.values()) + self.scores * seq_len


#: Trainers whose attention is one fused qkv module with one LoRA dropout for q, k and v (litgpt
#: ``LoRAQKVLinear.forward``: ``F.linear(self.lora_dropout(x), self.lora_A)``, litgpt/lora.py @00af8b0d).
FUSED_QKV_DROPOUT_TRAINERS = ("litgpt",)


#: Trainers whose model code expands grouped keys and values to every query head before SDPA in training
#: (litgpt ``CausalSelfAttention.forward``: ``k = k.expand(B, n_query_groups, q_per_kv, T, hs)`` then
#: ``k.reshape(B, -1, T, hs)``, "training: flash attention requires it", litgpt/model.py @00af8b0d), so the
#: kernel saves full-width K and V as eager attention does.
EXPANDED_KV_TRAINERS = ("litgpt",)
#: transformers' ``use_gqa_in_sdpa``: the largest head dim it hands SDPA unexpanded K/V with.
SDPA_GQA_MAX_HEAD_DIM = 256
#: Grouped-query families whose remote code runs its own attention and expands K/V before SDPA (never
#: ``enable_gqa``): ChatGLM (THUDM/chatglm3-6b modeling_chatglm.py ``SelfAttention.forward``: multi-query
#: ``key_layer.unsqueeze(-2).expand(...)``) and InternLM2 (modeling_internlm2.py ``InternLM2SdpaAttention``,
#: copied from transformers 4.38's ``LlamaSdpaAttention``: ``repeat_kv`` before the kernel).
OWN_GQA_ATTENTION_TYPES = frozenset({"chatglm", "internlm2"})
#: Types whose LayerNorm is Python in fp32 (transformers 5.24 models/cohere/modeling_cohere.py
#: ``CohereLayerNorm.forward``: ``hidden_states.to(torch.float32)``, two separate ``hidden_states - mean``,
#: ``self.weight.to(torch.float32) * hidden_states``; Cohere 2 reuses it), not ``F.layer_norm``: `_norm`'s
#: family ``layer_py``. Traced (bench/arch_trace.py): 2.4% (LoRA) and 3.4% (full) under before.
PY_LAYERNORM_TYPES = ("cohere", "cohere2")
#: Trainers whose loop keeps the step's output (so its autograd graph) until the next forward returns
#: (litgpt finetune/lora.py, full.py ``fit`` @00af8b0: ``logits = model(input_ids, ...)`` and ``loss`` are
#: rebound each iteration, not deleted).
LOOP_KEEPS_GRAPH_TRAINERS = ("litgpt",)


def fused_qkv_storage(a: DecoderArch, setup: LlmSetup, c: Ctx) -> float:
    """The fused qkv output kept whole, per token, beyond the q, k, v the attention saves.

    transformers' Phi3Attention slices one ``qkv_proj`` output into query, key and value views; RoPE
    makes new q and k, but v stays a view, and the attention kernel saves it, so the whole fused tensor
    (q, k and v wide) stays alive until backward (traced: phi3_mlp calibration records). With as many
    KV heads as query heads no ``repeat_kv`` copy replaces v; litgpt builds its own attention."""
    if not a.fused_qkv or a.model_type == "gpt2" or setup.trainer in EXPANDED_KV_TRAINERS:
        return 0.0
    if a.num_kv_heads != a.num_heads:
        return 0.0
    q_w = a.num_heads * a.head_dim
    return float(c.gamma * 2 * q_w)  # q and k of the fused tensor; its v is the v counted as saved


def holds_4bit_inputs(setup: LlmSetup) -> bool:
    """Whether every 4-bit projection keeps its input alive until backward: QLoRA on a bitsandbytes older
    than 0.43.2 (``bnb_keeps_input``), whose ``MatMul4Bit.forward`` stored ``ctx.tensors = (A, B)`` whenever
    the input needs a gradient, although backward uses only B ("fix QLoRA mem bug: delete useless buffered
    activation", #1270, commit 9e753741, bitsandbytes/autograd/_functions.py). No trainer's current release
    pins one: litgpt pinned ==0.41.0 (pyproject.toml @01fe959c) and ==0.42.0 (@00af8b0d) until 2024-12-28
    (d2ed13c3: >=0.44.0 on Linux and Windows), so it is said of the run (the published records of those
    litgpt releases say it), never assumed."""
    return setup.method == "qlora" and setup.bnb_keeps_input is True


def int8_holds_inputs(setup: LlmSetup) -> bool:
    """Whether every 8-bit projection keeps its input: LoRA on a bitsandbytes LLM.int8 base, whose
    ``MatMul8bitLt.forward`` stores ``ctx.tensors = (CAt, subA, A)`` whenever the input needs a gradient, in
    every release (autograd/_functions.py @0.42.0 L431, @0.50.1 L187); ``Linear8bitLt.forward`` hands it
    ``x`` uncast, so the kept tensor is the input itself (``A.reshape``, a view), once per shared input."""
    return setup.method == "lora" and setup.base_quant == "int8"


#: How a layer's quantized matmuls keep their inputs: ``cast``, bitsandbytes 4-bit < 0.43.2 keeps the
#: compute-dtype copy ``Linear4bit.forward`` makes; ``as-is``, LLM.int8 keeps the input itself; ``""`` none.
HeldInputs = Literal["", "cast", "as-is"]


def held_inputs(setup: LlmSetup) -> HeldInputs:
    """Which of `HeldInputs` this run's quantized matmuls keep."""
    if holds_4bit_inputs(setup):
        return "cast"
    return "as-is" if int8_holds_inputs(setup) else ""


def zero3_linear_keeps_inputs(setup: LlmSetup) -> bool:
    """Whether every projection keeps its input until backward because DeepSpeed ZeRO-3 replaced
    ``F.linear``: LoRA on a dense base under ``--strategy zero3``.

    ``zero.Init`` (transformers' ``from_pretrained`` under ZeRO-3; ``Init(module=...)`` too since #8189,
    617061d6, 2026-07-31: partition_parameters.py @edaa7221 L1077-1078) sets ``torch.nn.functional.linear =
    zero3_linear_wrap`` when ``mem_efficient_linear`` is on, its default (zero config
    ``memory_efficient_linear`` True), and never puts it back ("This will persist unless manually reset":
    @v0.7.7 L399-404, @v0.12.3 L496-501, @edaa7221 L406-413). ``LinearFunctionForZeroStage3`` saves its
    input whether or not a gradient needs it (runtime/zero/linear.py: ``ctx.save_for_backward(input,
    ...)`` @v0.7.7, ``(input, weight, bias)`` @v0.12.3 and @edaa7221), where torch's own linear keeps a
    frozen weight's input only if another op does. So a LoRA step's frozen projections keep their inputs,
    each shared input once: the run's ``held`` inputs ``as-is`` (`_linear_inputs`), saved with
    ``save_for_backward`` (checkpointing drops them like any saved tensor). A CPU step of a T5 v1.1 LoRA
    model run with DeepSpeed's wrapper keeps ``(d + inner + d + d_ff)`` x 4 B more per encoder token and
    layer, as counted (tests/test_zero3_linear.py). Full fine-tuning saves every input anyway;
    bitsandbytes' 4-bit and 8-bit layers do not call ``F.linear``; docs/distributed.md#zero3-linear."""
    return setup.strategy == "zero3" and setup.method == "lora" and setup.base_quant == "none"


def _kept_through_checkpoint(setup: LlmSetup) -> bool:
    """Whether non-reentrant checkpointing runs (only its saved-tensor hooks drop what a layer saved):
    ``ckpt_reentrant`` False, or for LLM.int8 left unsaid too, today's transformers' default (5.24
    ``_activation_checkpointing_enable``: ``use_reentrant`` False). The 4-bit stacks of bitsandbytes <
    0.43.2 (transformers 4.x, torch <= 2.3) checkpoint reentrantly unless told."""
    if setup.ckpt_reentrant is not None:
        return not setup.ckpt_reentrant
    return held_inputs(setup) == "as-is"


def every_layer_holds_4bit_inputs(setup: LlmSetup) -> bool:
    """Whether every layer, not only the recomputed one, keeps its 4-bit matmuls' inputs until its backward.

    bitsandbytes < 0.43.2 keeps the input as a plain attribute (``ctx.tensors = (A, B)``), not through
    ``save_for_backward``, so non-reentrant checkpointing, which drops only what its saved-tensor hooks
    see, cannot drop it: each layer's compute-dtype input copies live from its forward to its backward.
    Reentrant checkpointing runs the forward under ``no_grad``, where no autograd node (and no ``ctx``)
    outlives the call. Traced by emulation (bench/qlora2023_trace.py: 4-layer LLaMA, h 512, I 1376,
    non-reentrant 10,944 B per token per layer vs 2,048 B reentrant or with the 0.43.2 fix; 7B shape,
    32 layers, 3.16 MB per token vs 0.88 MB). ``ckpt_reentrant`` None counts as reentrant for them: the
    stacks that pin such a bitsandbytes (transformers 4.x, torch <= 2.3) checkpoint reentrantly by default;
    LLM.int8 keeps its input the same way in every release, on today's non-reentrant default
    (`_kept_through_checkpoint`)."""
    return setup.grad_ckpt and bool(held_inputs(setup)) and _kept_through_checkpoint(setup)


def held_4bit_input_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> float:
    """Bytes per token per layer of the quantized matmuls' kept inputs saved through the forward beside every
    layer's checkpoint (`every_layer_holds_4bit_inputs`; `kept_quant_input_bytes` says which)."""
    if not every_layer_holds_4bit_inputs(setup):
        return 0.0
    return kept_quant_input_bytes(a, setup, regime)


def graph_keeps_quant_inputs(setup: LlmSetup) -> bool:
    """Whether the step's autograd graph still holds every layer's kept matmul inputs after its backward.

    ``ctx.tensors`` is a plain attribute of the ``MatMul4Bit`` node: the backward's ``release_variables``
    frees only ``save_for_backward`` tensors, so the inputs stay with the node for as long as anything
    reaches the graph (the loss, the logits). Under reentrant checkpointing the layers' forward leaves no
    node, and the recomputed graph is local to the checkpoint's backward: nothing outlives it. LLM.int8's
    ``MatMul8bitLt`` keeps its input the same way (`int8_holds_inputs`)."""
    if not held_inputs(setup):
        return False
    return not setup.grad_ckpt or _kept_through_checkpoint(setup)


def loop_keeps_graph(setup: LlmSetup) -> bool:
    """Whether the training loop still references the step's output, and so its autograd graph, through the
    optimizer step and the next step's forward: litgpt's fit loop rebinds ``logits = model(...)`` (and
    ``loss``) only once the next forward returns (`LOOP_KEEPS_GRAPH_TRAINERS`); a loop that holds its
    output (``keep_logits``) does so across micro-batches (with accumulation, as its ``held_logits``)."""
    return setup.trainer in LOOP_KEEPS_GRAPH_TRAINERS or (setup.keep_logits and setup.grad_accum > 1)


def kept_quant_input_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> float:
    """Bytes per token per layer of the inputs every quantized matmul of a layer keeps (`held_inputs`).

    ``Linear4bit.forward`` runs ``x.to(compute_dtype)`` and the matmul keeps that tensor: one copy per
    projection when its input is in another dtype (the fp32 stream of a k-bit-prepared model: q, k and v
    each keep their own), the input itself, once for the projections sharing it, when it already is
    (bitsandbytes nn/modules.py, autograd/_functions.py ``MatMul4Bit.forward`` @0.39.0). The compute dtype
    is the precision's. Every decoder projection counts, LoRA target or not (the input requires grad in
    every layer); MoE layers are not counted (not traced). LLM.int8 keeps the input itself, in its own
    dtype, once per shared input (`int8_holds_inputs`)."""
    kind = held_inputs(setup)
    if not kind:
        return 0.0
    c = context(setup, regime)
    compute = nbytes(setup.precision)
    lins = [x for x in layer_linears(a, False, active=True, stack="encoder") if x.role != "expert"]
    attn = [x for x in lins if x.role == "attn"]
    mlp = [x for x in lins if x.role in ("mlp", "shared_expert")]
    h = a.hidden_size
    shared_input = a.parallel_block and a.norms_per_layer == 1
    up = [x for x in mlp if x.d_in == h]
    groups = [
        (attn[:-1] + (up if shared_input else []), c.norm_out),
        (attn[-1:], c.gamma),
        ([] if shared_input else up, c.norm_out),
        ([x for x in mlp if x.d_in != h], quantized_out_bytes(setup, regime, c)),
    ]
    total = 0.0
    for group, x_bytes in groups:
        if kind == "as-is":
            total += x_bytes * sum({x.d_in for x in group})
        elif x_bytes == compute:
            total += compute * sum({x.d_in for x in group})
        else:
            total += compute * sum(x.d_in for x in group)
    return total


def _linear_inputs(
    c: Ctx,
    setup: LlmSetup,
    a: DecoderArch,
    lins: list[Linear],
    x_bytes: int,
    one_dropout: bool = False,
    held: HeldInputs = "",
    input_saved: bool = False,
) -> float:
    """Bytes saved for the inputs of projections that share one input tensor of dtype ``x_bytes``.

    Full fine-tuning: each linear saves its input; under autocast an input that is not already in
    the compute dtype is cast per op, and each cast copy is saved. LoRA: peft casts the input to the
    adapter dtype per wrapped module (``_cast_input_dtype``); under autocast lora_A then works on its
    own compute-dtype copy, which is what it saves.

    LoRA dropout (``lora_dropout > 0``): each wrapped module runs ``lora_A(dropout(x))`` (peft
    lora/layer.py ``Linear.forward``; litgpt ``LoRALinear.forward``), so it keeps native_dropout's 1-byte
    mask and lora_A saves the dropout output, its own tensor in the adapter dtype where no autocast
    cast follows (where one does, lora_A saves that cast copy, counted already). ``one_dropout``: the
    wrapped modules of this group share one dropout (a fused qkv module). ``held``: the base matmuls keep
    their input (`held_inputs`): ``cast``, the compute-dtype input of a 4-bit matmul, the shared input
    itself, saved once whatever the adapters do, when it already is in that dtype, else each module's own
    ``x.to(compute_dtype)`` copy; ``as-is``, LLM.int8's, the shared input itself whatever its dtype.
    ``input_saved``: another op already saves the input tensor itself (ReLU its output), so keeping it
    here costs nothing more.
    """
    d_in = lins[0].d_in
    compute = nbytes(setup.precision)
    shared = held == "as-is" or (held == "cast" and x_bytes == compute)
    per_op = compute * d_in * len(lins) if held and not shared else 0.0
    dropouts = 0
    for lin in lins:
        if c.full:
            if c.autocast and x_bytes != c.gamma:
                per_op += c.gamma * d_in
            else:
                shared = True
        elif targeted(a, setup.lora_targets, lin):
            dropped = setup.lora_dropout > 0 and not (one_dropout and dropouts)
            dropouts += 1 if setup.lora_dropout > 0 else 0
            if setup.lora_fa:
                # LoRA-FA: a frozen lora_A saves no input (autograd keeps an operand only for a gradient
                # it computes); the dropout keeps its mask for the input's gradient
                per_op += d_in if dropped else 0
            elif c.autocast and c.adapter != c.gamma:
                per_op += c.gamma * d_in + (d_in if dropped else 0)
            elif c.adapter != x_bytes or dropped:
                per_op += c.adapter * d_in + (d_in if dropped else 0)
            elif setup.lora_dropout > 0:
                pass  # shares the fused module's dropout output, counted once
            else:
                shared = True
    return per_op + (x_bytes * d_in if shared and not input_saved else 0.0)


def saves_input_itself(c: Ctx, setup: LlmSetup, a: DecoderArch, lins: list[Linear], x_bytes: int) -> bool:
    """Whether these projections keep their shared input tensor itself (not a cast or dropout copy of it):
    the part `_linear_inputs` counts as the input's own bytes."""
    if not lins:
        return False
    return _linear_inputs(c, setup, a, lins, x_bytes) != _linear_inputs(
        c, setup, a, lins, x_bytes, input_saved=True
    )


def _dora_outputs(c: Ctx, setup: LlmSetup, a: DecoderArch, lins: list[Linear]) -> float:
    """DoRA rescales ``(m/||W + BA|| - 1) * base_out + m/||W + BA|| * lora_out``: both multiplies save
    their output operand because the magnitude trains, so each wrapped module keeps its base output
    and its LoRA output (peft ``lora/dora.py``; traced)."""
    lora_out = c.gamma if c.autocast else c.adapter
    return sum((c.gamma + lora_out) * x.d_out for x in lins if targeted(a, setup.lora_targets, x))


def normed_bytes(a: DecoderArch, c: Ctx) -> int:
    """Bytes per element of a norm's output, the projections' input: under autocast a LayerNorm runs
    in fp32 and returns fp32 (CUDA autocast's fp32 op list), so each projection reading it saves its own
    compute-dtype cast (BERT's q, k and v three copies: a real step with saved-tensor hooks and the
    traced `*ForSequenceClassification` step); RMSNorm modules cast back to the input's dtype."""
    return 4 if c.autocast and a.norm == "layer" else c.norm_out


def _norm(c: Ctx, width: int, family: str) -> float:
    """RMSNorm saves an fp32 copy of its input; the normalized tensor too if its weight trains.

    Gemma's norm multiplies in fp32 (``output * (1 + weight.float())``), and so does litgpt's ``RMSNorm``
    for every model (``(x_normed * weight.float()).to(dtype=dtype)``, litgpt/model.py @00af8b0d): family
    ``rms_fp32``, whose copy is fp32. LayerNorm saves its input (fp32 under autocast, which runs
    layer_norm in fp32). Cohere's LayerNorm is Python in fp32 (`PY_LAYERNORM_TYPES`, family ``layer_py``):
    ``(x - mean).pow(2)`` and ``(x - mean) * rsqrt(...)`` each save their own fp32 ``x - mean``, and
    ``weight.float() * x_normed`` saves the normalized fp32 tensor when the weight trains.
    """
    if family == "layer_py":
        return 8 * width + (4 * width if c.full else 0)
    if family == "layer":
        return 4 * width if c.autocast else c.rho * width
    trained = (4 if family == "rms_fp32" else c.rho) * width if c.full else 0
    return 4 * width + trained


def norm_family(a: DecoderArch, setup: LlmSetup) -> str:
    """How a model's norms save for backward (`_norm`): ``layer``, ``layer_py``, ``rms`` or ``rms_fp32``."""
    if a.model_type in PY_LAYERNORM_TYPES:
        return "layer_py"
    if a.norm == "layer":
        return "layer"
    fp32_product = a.model_type.startswith("gemma") or setup.trainer in litgpt.LITGPT_MODEL_TRAINERS
    return "rms_fp32" if fp32_product else "rms"


def final_norm_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> float:
    """Bytes per token the final norm saves: an fp32 copy of its input, or Cohere's Python LayerNorm's
    tensors (`_norm`, family ``layer_py``: its weight trains under full fine-tuning)."""
    if norm_family(a, setup) == "layer_py":
        return _norm(context(setup, regime), a.hidden_size, "layer_py")
    return 4.0 * a.hidden_size


def uses_eager_scores(a: DecoderArch, setup: LlmSetup) -> bool:
    """Whether attention materializes b x heads x s^2 scores.

    Eager does; so does every kernel on MPS (no memory-efficient SDPA backward there), and SDPA on a
    model with attention soft-capping (Gemma 2), which transformers runs with eager attention
    because SDPA cannot soft-cap. FlashAttention-2 soft-caps and keeps O(s). Attention sinks (gpt-oss)
    have no SDPA path either (``GptOssPreTrainedModel._supports_sdpa = False``): eager, unless a flash
    kernel that takes the sinks is chosen.
    """
    if sdpa_position_bias(a, setup):
        return False
    if setup.attn == "eager" or setup.backend == "mps" or a.model_type in EAGER_ONLY_TYPES:
        return True
    return (bool(a.attn_logit_softcapping) or a.attn_sinks) and setup.attn in ("sdpa", "xformers")


def sdpa_math(a: DecoderArch, setup: LlmSetup, regime: Regime) -> bool:
    """Whether SDPA runs its math kernel, which keeps b x heads x s^2 probabilities as eager attention
    does (and the K/V expanded to every head): fp32 attention inputs on a grouped-query model.

    transformers 5.24 hands SDPA the unexpanded K/V with ``enable_gqa=True`` when no mask is passed
    (integrations/sdpa_attention.py ``use_gqa_in_sdpa``: no mask, equal head dims up to 256; else
    ``repeat_kv``). PyTorch's flash kernel takes fp16/bf16 only (sdp_utils.cpp ``check_dtypes_low_precision``)
    and its CUDA memory-efficient kernel refused grouped K/V heads until pytorch/pytorch#191085 (2026-07;
    ROCm's still does), so fp32 falls to ``_scaled_dot_product_attention_math``: the softmax output (fp32
    here: the saved probabilities, as eager's) and the ``repeat_interleave``'d K/V the matmuls save.
    Measured on an H200 (torch 2.11, tests/data/measured/h200-threshold.yaml): SmolLM2 360M and Qwen2.5
    0.5B full fine-tuning in fp32 allocated 28% and 17% above the O(s) count, one layer's b x heads x s^2
    fp32 per layer. A torch release with #191085 keeps O(s): there the count is over (the safe side).
    Only trainers that run transformers' attention, on CUDA / ROCm (MPS counts every kernel as eager),
    without a padding or prefix mask (a mask takes ``repeat_kv`` and the memory-efficient kernel), and
    not for a k-bit base's fp32 stream (`fp32_stream`): the published QLoRA runs of that regime on GQA
    models show no s^2 term (fitcheck-llm's T4 rows, SDPA 41% under eager at 2,048 tokens, on "an earlier
    stack (transformers 4.x)"; universal-llm-trainer's Llama 3 8B rows, transformers 4.x), stacks whose
    attention may have expanded K/V before SDPA; not measured on transformers 5. fitcheck-llm's fp16
    LoRA rows on a T4 (transformers 5.0, torch 2.10; flash needs compute capability 8.0) show none
    either, which the kernel rules above do not explain: fp16 / bf16 are not counted here. Sliding-window
    layers past their window get a mask, so not there (`windowed_layers`: Gemma 3 1B in fp32 past its
    512-token window, five of six layers sliding, within 0.5% on the H200 once counted so, +6.6% before);
    False when every layer is windowed (Mistral past 4096 tokens)."""
    return (
        setup.attn == "sdpa"
        and setup.backend in ("cuda", "rocm")
        and setup.trainer in TRANSFORMERS_TRAINERS
        and a.num_kv_heads < a.num_heads
        and a.model_type not in OWN_GQA_ATTENTION_TYPES
        and not a.is_mla
        and a.head_dim <= SDPA_GQA_MAX_HEAD_DIM
        and not setup.masked_rows
        and not prefix.tokens(setup)
        and not uses_eager_scores(a, setup)
        and context(setup, regime).gamma == 4
        and not fp32_stream(setup, regime)
        and windowed_layers(a, setup) < a.num_layers
    )


def sdpa_takes_masks(a: DecoderArch, setup: LlmSetup) -> bool:
    """The attention is transformers' SDPA path, where an explicit mask is handed to the kernel (not eager,
    whose one mask is shared; not T5's position bias, which folds the padding in; not a trainer with its
    own attention)."""
    return (
        setup.attn == "sdpa"
        and setup.trainer in TRANSFORMERS_TRAINERS
        and not uses_eager_scores(a, setup)
        and not sdpa_position_bias(a, setup)
    )


def masked_gqa(a: DecoderArch, setup: LlmSetup, windowed: bool) -> bool:
    """SDPA gets an explicit mask a grouped-query layer's K/V are expanded for (``repeat_kv``): a padded
    batch, or a sliding window past its length (``windowed``); transformers' ``use_gqa_in_sdpa`` keeps
    them unexpanded on CUDA only without a mask. (Prefix tuning's expansion is `_prefix_acts`'.)"""
    return (windowed or setup.masked_rows) and sdpa_takes_masks(a, setup)


def windowed_layers(a: DecoderArch, setup: LlmSetup) -> int:
    """Decoder layers whose sliding window hands SDPA an explicit mask at this length: the model's
    sliding layers (``sliding_layers``) once the keys (sequence, and a prefix) reach ``sliding_window``.

    transformers 5.24 skips the mask, leaving SDPA ``is_causal``, only while the keys are shorter than the
    window (masking_utils ``_ignore_causal_mask_sdpa``: ``kv_length >= local_attention_size`` returns
    False); from there each sliding layer gets a ``b x 1 x s x kv`` boolean mask, so ``use_gqa_in_sdpa``
    is false and ``repeat_kv`` expands K/V to every query head, CUDA's flash kernel (no mask) gives way to
    the memory-efficient one (O(s) even in fp32: no math-kernel scores, `sdpa_math`), which saves its own
    copy of the mask (`sdpa_mask_copy_bytes`). FlashAttention-2 applies the window itself, and eager
    attention computes every score whatever the mask: only SDPA under transformers' attention on CUDA /
    ROCm (MPS counts every kernel as eager). Traced (tests/test_sliding_window.py)."""
    if (
        not a.sliding_layers
        or a.sliding_window is None
        or setup.attn != "sdpa"
        or setup.trainer not in TRANSFORMERS_TRAINERS
        or setup.backend not in ("cuda", "rocm")
        or uses_eager_scores(a, setup)
        or setup.seq_len + prefix.tokens(setup) < a.sliding_window
    ):
        return 0
    return min(a.sliding_layers, a.num_layers)


def materializes_scores(a: DecoderArch, setup: LlmSetup, regime: Regime) -> bool:
    """Attention keeps b x heads x s^2 probabilities: eager (`uses_eager_scores`) or SDPA's math kernel
    (`sdpa_math`)."""
    return uses_eager_scores(a, setup) or sdpa_math(a, setup, regime)


def sdpa_position_bias(a: DecoderArch, setup: LlmSetup) -> bool:
    """T5 under SDPA (`SDPA_BIAS_TYPES`; CUDA): transformers 5 hands the kernel the relative position
    bias as an additive mask, so CUDA's memory-efficient kernel runs (bias and dropout inside, O(s)
    saved) instead of eager scores; each layer keeps its own mask (`position_bias_mask_bytes`)."""
    return a.model_type in SDPA_BIAS_TYPES and setup.attn == "sdpa" and setup.backend != "mps"


def position_bias_mask_bytes(a: DecoderArch, setup: LlmSetup, c: Ctx) -> float:
    """Bytes per token per key position of the mask T5's SDPA path makes in every layer and the kernel
    saves for backward (transformers 5.24 integrations/sdpa_attention.py ``get_position_bias_mask``:
    ``.contiguous()`` of the ``1 x heads x q x k`` bias, or ``torch.where`` with a padded batch's mask,
    ``b x heads x q x k``; traced: a ``clone`` per layer). In the bias's dtype (the embedding's), cast
    to the compute dtype under autocast. Per token: ``heads x`` that, divided by the batch when no
    padding mask broadcasts it over the batch."""
    per = c.rho + (c.gamma if c.autocast and c.rho != c.gamma else 0)
    padded = setup.padded_batches
    return a.num_heads * per / (1 if padded else setup.batch_size)


def layer_activations(
    a: DecoderArch, setup: LlmSetup, regime: Regime, moe: bool = False, windowed: bool = False
) -> LayerActs:
    """Saved bytes per token of one decoder layer (no checkpointing): norms, attention, MLP; under
    ``--compile`` the partitioner's saved set where it was traced (`engine.compiled`). ``windowed``: a
    layer whose sliding window hands SDPA an explicit mask at this length (`windowed_layers`)."""
    if setup.compile:
        from fitcheck.engine import compiled

        if not compiled.untraced(a, setup, regime):
            return compiled.layer_activations(a, setup, regime)
    c = context(setup, regime)
    if a.model_type == "gpt2":
        return _gpt2_layer(a, setup, c)
    acts = LayerActs()
    h = a.hidden_size
    fam = norm_family(a, setup)
    # the self-attention layer; an encoder-decoder's cross-attention is engine/tasks.py's
    lins = layer_linears(a, moe, active=True, stack="encoder")
    attn = [x for x in lins if x.role == "attn"]
    qkv, o = attn[:-1], attn[-1:]
    if a.is_mla:
        qkv = [x for x in qkv if x.d_in == h]  # the projections reading the layer input

    acts.add("norm_inputs", _norm(c, h, fam) * (2 if a.norms_per_layer >= 2 else 1))
    if a.norms_per_layer == 4:
        acts.add("norm_inputs", _norm(c, h, fam) * 2)
    mlp = [x for x in lins if x.role in ("mlp", "expert", "shared_expert")]
    up = [x for x in mlp if x.d_in == h and x.role != "expert"]
    shared_input = a.parallel_block and a.norms_per_layer == 1
    # a parallel block with one norm (GPT-J, Phi, Cohere): attention and MLP read the same tensor
    fused = setup.trainer in FUSED_QKV_DROPOUT_TRAINERS and not shared_input
    held = held_inputs(setup) or ("as-is" if zero3_linear_keeps_inputs(setup) else "")
    normed = normed_bytes(a, c)
    acts.add(
        "qkv_inputs", _linear_inputs(c, setup, a, qkv + (up if shared_input else []), normed, fused, held)
    )
    scores = uses_eager_scores(a, setup) if windowed else materializes_scores(a, setup, regime)
    _attention_acts(acts, a, setup, c, fam, qkv, o, held, scores, windowed)
    if setup.dora and not c.full:
        acts.add("dora_outputs", _dora_outputs(c, setup, a, lins))
    if up and not shared_input:
        acts.add("mlp_inputs", _linear_inputs(c, setup, a, up, normed, held=held))
    if a.resid_dropout:
        # hidden dropout after attention and after the MLP: a 1-byte mask each (native_dropout)
        acts.add("dropout_masks", 2 * h)
    _mlp_acts(acts, a, setup, regime, c, mlp, moe, held)
    return acts


def _attention_acts(
    acts: LayerActs,
    a: DecoderArch,
    setup: LlmSetup,
    c: Ctx,
    fam: str,
    qkv: list[Linear],
    o: list[Linear],
    held: HeldInputs,
    eager: bool,
    windowed: bool = False,
) -> None:
    """What attention saves: MLA's parts, q/k norms, q/k/v after RoPE, scores (``eager``: eager attention
    or SDPA's math kernel, `materializes_scores`) or the kernel's output and logsumexp, and the output
    projection's input. ``windowed``: SDPA gets the sliding window as an explicit mask, so K/V are
    expanded to every head (``repeat_kv``: a copy, except from a single K/V head, whose expansion is a
    stride-0 view the kernel takes as it is) and the kernel keeps its own copy of the mask."""
    q_w, kv_w = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    if a.is_mla:
        for name, value in _mla_parts(a, setup, c).items():
            acts.add(name, value)
    if a.qk_norm:
        acts.add("qk_norm", _norm(c, q_w + kv_w, fam))
    # q, k, v after RoPE as the attention kernel saves them; K/V at all heads where repeat_kv runs
    # (eager always; SDPA when the GQA kernel path is not taken).
    # MPS has no memory-efficient SDPA backward: training there materializes the scores like eager
    # (hardware_detection.md 3.7); the engine treats every kernel as eager on that backend.
    # (a padding or window mask takes repeat_kv too, a copy unless one K/V head: a stride-0 view, traced)
    masked = masked_gqa(a, setup, windowed) and a.num_kv_heads > 1
    expanded = eager or masked or setup.trainer in EXPANDED_KV_TRAINERS
    kv_saved = q_w if expanded else kv_w
    acts.add("qkv", c.gamma * (q_w + 2 * kv_saved))
    for name, value in litgpt.layer_extras(a, setup, qkv, c.gamma, c.adapter).items():
        acts.add(name, value)
    acts.add("qkv", fused_qkv_storage(a, setup, c))
    if eager:
        # softmax output in fp32 (saved by softmax) and its compute-dtype copy (saved by the matmul; with
        # fp32 activations ``.to(query.dtype)`` returns the same tensor, saved once); with attention
        # soft-capping (Gemma 2) also the tanh output (traced)
        capped = c.gamma if a.attn_logit_softcapping else 0
        acts.scores = a.num_heads * (softmax_bytes(a, c) + _probs_after_softmax(a, setup, c) + capped)
        acts.add("attn_out", c.gamma * q_w)
    else:
        # flash / memory-efficient kernels save the output and an fp32 logsumexp per head
        acts.add("attn_out", c.gamma * q_w + 4 * a.num_heads)
        if sdpa_position_bias(a, setup):
            acts.scores = position_bias_mask_bytes(a, setup, c)
    acts.add("o_input", _linear_inputs(c, setup, a, o, c.gamma, held=held))
    acts.add("relative_attention", _disentangled_bytes(a, setup, c))
    _prefix_acts(acts, setup, q_w, kv_saved, c.gamma)
    acts.add(MASK_COPY, sdpa_mask_copy_bytes(a, setup, c.gamma, windowed))


def _disentangled_bytes(a: DecoderArch, setup: LlmSetup, c: Ctx) -> float:
    """Bytes per token DeBERTa's disentangled attention saves beyond plain attention, per layer.

    Each relative term (c2p, p2c: ``pos_att_type``) multiplies the queries (keys) by the position keys
    (queries) of ``2 x att_span`` relative positions and gathers the s columns it needs; ``torch.gather``
    saves its whole input (its backward takes the input: derivatives.yaml ``gather_backward(grad, self,
    ...)``): heads x 2 span per token per term. The position keys / queries are repeated for every
    sequence (``.repeat``), saved by the matmul: h x 2 span per sequence per term; the clamped relative
    index is s x s int64 per term; p2c's matmul also saves the unscaled keys (h per token). Traced on a
    real CPU step of transformers' DebertaV2ForSequenceClassification (tests/test_encoder_saved_tensors.py).
    """
    if not a.rel_terms:
        return 0.0
    s, b, span2 = setup.seq_len, setup.batch_size, 2 * a.rel_span
    per_token: float = a.rel_terms * a.num_heads * span2 * c.gamma
    per_token += a.rel_terms * a.hidden_size * span2 * c.gamma / s
    per_token += a.rel_terms * s * 8 / b  # one s x s int64 index per layer and term, over b x s tokens
    if a.rel_terms == 2:
        per_token += c.gamma * a.hidden_size
    return per_token


#: The rule of the ``conv_layer`` line (`conv_layer_bytes`).
CONV_LAYER_RULE = "DeBERTa's ConvLayer after the first layer (outside the layers' checkpoints)"


def conv_layer_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> float:
    """Bytes per token DeBERTa-v2's ConvLayer saves (``conv_kernel_size`` > 0; modeling_deberta_v2.py
    ``ConvLayer``, run by the encoder on the first layer's output, outside any layer's checkpoint): the
    contiguous permuted copy the Conv1d saves, the activation's saved tensor (tanh: its output), the
    LayerNorm's input and the output the input-mask product saves, each the hidden width in the
    compute dtype, and dropout's 1-byte mask. Traced on a real CPU step
    (tests/test_encoder_saved_tensors.py)."""
    if not a.conv_kernel:
        return 0.0
    c = context(setup, regime)
    return a.hidden_size * (4 * c.gamma + (1 if a.resid_dropout else 0))


def _probs_after_softmax(a: DecoderArch, setup: LlmSetup, c: Ctx) -> float:
    """Bytes per query-key pair per head that eager attention saves after its softmax output
    (`softmax_bytes`: fp32, or the scores' dtype for `INPUT_DTYPE_SOFTMAX` families without autocast).

    Without attention dropout: the compute-dtype copy the value matmul saves (none where the softmax
    output already is in the compute dtype: the copy is that tensor). With it
    (``attention_probs_dropout_prob`` 0.1 in BERT, RoBERTa, DeBERTa-v2; ``dropout_rate`` in T5):
    dropout's mask (CUDA's fused ``native_dropout`` keeps a bool, 1 byte) and its output in the compute
    dtype, which the matmul saves (a new tensor, also in fp32); the copy that fed the dropout is freed
    (its backward needs the mask only). A real CPU step shows the output and a 4-byte mask (CPU dropout
    multiplies by float noise): tests/test_encoder_saved_tensors.py. Only where the probabilities are
    materialized by eager code (``--attn eager``, MPS, a family with no SDPA path such as DeBERTa-v2):
    T5 under SDPA (`SDPA_BIAS_TYPES`) draws the dropout inside the kernel.
    """
    eager_code = setup.attn == "eager" or setup.backend == "mps" or a.model_type in EAGER_CODE_TYPES
    if a.attn_dropout and eager_code:
        return 1 + c.gamma
    return c.gamma if softmax_bytes(a, c) != c.gamma else 0


#: Families whose eager attention runs softmax in the scores' own dtype (transformers 5.24:
#: ``nn.functional.softmax(attn_weights, dim=-1)`` in modeling_bert / roberta / deberta_v2 / t5, and Falcon's
#: ``F.softmax(scores + mask, dim=-1, dtype=hidden_states.dtype)`` in modeling_falcon; the other decoder
#: families pass ``dtype=torch.float32``): without autocast a 16-bit model keeps 16-bit probabilities, and
#: the value matmul saves them as they are (no compute-dtype copy). Under autocast softmax runs in fp32.
#: Falcon traced (bench/arch_trace.py shape, eager): full +11% over before, counted as an fp32 softmax.
INPUT_DTYPE_SOFTMAX = frozenset({"bert", "roberta", "deberta-v2", "t5", "mt5", "falcon"})


def softmax_bytes(a: DecoderArch, c: Ctx) -> int:
    """Bytes per element of eager attention's softmax output (`INPUT_DTYPE_SOFTMAX`)."""
    return c.gamma if a.model_type in INPUT_DTYPE_SOFTMAX and not c.autocast else 4


#: The part of `LayerActs` that is SDPA's own copy of an explicit attention mask (`sdpa_mask_copy_bytes`).
MASK_COPY = "sdpa_mask_copy"
#: The memory-efficient kernel's alignment of the mask's last dimension: an unaligned mask is padded to a
#: multiple of it (aten/src/ATen/native/transformers/attention.cpp ``preprocess_mask``: ``pad_bias<16>``).
MEM_EFF_MASK_ALIGN = 16


def sdpa_mask_copy_bytes(a: DecoderArch, setup: LlmSetup, gamma: int, windowed: bool = False) -> float:
    """Bytes per token of one layer's copy of an explicit attention mask that SDPA saves for backward.

    transformers passes SDPA a boolean ``b x 1 x s x kv`` mask whenever ``is_causal`` cannot stand in
    for it (masking_utils ``_ignore_causal_mask_sdpa``): a padded batch (some ``attention_mask`` zero:
    ``--lengths varying`` with more than one example), a padding-free row of packed examples (one
    ``1 x 1 x bs x bs`` mask: ``kv`` is the setup's ``mask_keys``), keys longer than the queries (prefix
    tuning's ``s + p``), or a sliding-window layer at least as long as its window (``windowed``,
    `windowed_layers`).
    ``scaled_dot_product_attention`` turns a boolean mask into a new tensor of the query's
    dtype in every call (``convert_boolean_attn_mask``: ``zeros_like`` then ``masked_fill_`` with
    -inf), the memory-efficient kernel (flash takes no mask) pads its last dimension to a multiple of
    16, and ``_scaled_dot_product_efficient_attention`` saves it as ``attn_bias`` for its backward, so
    each layer keeps its own copy until its backward (traced on CPU: one ``b x 1 x s x kv`` tensor of the
    compute dtype per layer, transformers 5.24 / torch 2.13). Per token: ``gamma x kv`` (aligned).
    Eager attention's single shared mask is `eager_mask_bytes`; FlashAttention-2 unpads instead. Only
    for trainers that run transformers' attention (`quant.TRANSFORMERS_TRAINERS`; litgpt, torchtune,
    unsloth and mlx build their own)."""
    if not sdpa_takes_masks(a, setup):
        return 0.0  # (T5: the padding mask is folded into the position-bias mask, `position_bias_mask_bytes`)
    p = prefix.tokens(setup)
    if not p and not setup.masked_rows and not windowed:
        return 0.0
    kv = setup.mask_keys + p  # a padding-free row: every query sees the whole row's mask
    return float(gamma * -(-kv // MEM_EFF_MASK_ALIGN) * MEM_EFF_MASK_ALIGN)


def _prefix_acts(acts: LayerActs, setup: LlmSetup, q_w: int, kv_saved: int, gamma: int) -> None:
    """Prefix tuning (engine/prefix.py): every layer's keys and values are ``p`` positions longer, per
    token ``(s + p) / s`` of them.

    The prefix is concatenated in front (``DynamicLayer.update``'s ``torch.cat``; ChatGLM's
    ``torch.cat((cache_k, key_layer))``); with ``q_len != kv_len`` transformers hands SDPA an explicit
    mask, so ``use_gqa_in_sdpa`` is false and ``repeat_kv`` expands K and V to every query head, which the
    kernel saves (transformers 5.24 integrations/sdpa_attention.py; ChatGLM expands its query groups
    itself). The cache's own concatenated tensors are `prefix_cache_bytes`. Eager scores get ``s + p`` key
    positions."""
    p = prefix.tokens(setup)
    if not p:
        return
    grow = (setup.seq_len + p) / setup.seq_len
    acts.add("prefix_kv", gamma * 2 * (q_w * grow - kv_saved))
    acts.add("prefix_scores", acts.scores * p)


def prefix_cache_bytes(a: DecoderArch, setup: LlmSetup, gamma: int) -> int:
    """The cache's concatenated ``s + p`` keys and values of every layer (b x (s + p) x L x 2 x kv width),
    held through the forward only (traced: gone by backward); none when ``repeat_kv`` has one head per
    group and returns the very tensor the kernel saves."""
    p, kv_w = prefix.tokens(setup), prefix.token_dim(a)
    if not p or kv_w == a.num_heads * a.head_dim:
        return 0
    return setup.batch_size * (setup.seq_len + p) * a.num_layers * 2 * kv_w * gamma


def _mlp_acts(
    acts: LayerActs,
    a: DecoderArch,
    setup: LlmSetup,
    regime: Regime,
    c: Ctx,
    mlp: list[Linear],
    moe: bool,
    held: HeldInputs,
) -> None:
    """What the MLP saves past its input: the experts' (MoE), or the hidden activations and the down
    projection's input."""
    if moe:
        acts.add("moe", _moe(a, c, setup))
        return
    width = a.intermediate_size
    out_b = quantized_out_bytes(setup, regime, c)
    if a.mlp == "gated":
        # what the activation keeps (a one-op activation: the gate output, its input), its output and the
        # up output (both saved by the product that feeds down_proj): 3 for SiLU; 6 for a Python GELU
        # (T5 v1.1 / Flan-T5 / mT5's "gated-gelu" runs gelu_new: its input, tanh output, 1 + tanh, 0.5 x)
        act_out = 4 if c.autocast and a.activation in PYTHON_GELU_FP32_OUT else out_b
        acts.add("mlp_hidden", (plain_activation_bytes(a.activation, c, out_b) + act_out + out_b) * width)
    else:
        # what the activation keeps; its output is the down projection's input
        acts.add("mlp_hidden", plain_activation_bytes(a.activation, c, out_b) * width)
    if a.mlp_dropout:
        # T5's dropout before wo: native_dropout's 1-byte mask; wo then reads the dropout's output
        acts.add("dropout_masks", width)
    # ReLU saves its output: with nothing between it and the down projection, that very tensor is the
    # projection's saved input, counted once (a real CPU step of OPT and T5 with saved-tensor hooks)
    same = a.mlp == "plain" and a.activation in OUTPUT_SAVING_ACTIVATIONS and not a.mlp_dropout
    down = [x for x in mlp if x.d_out == a.hidden_size and x.role != "expert"]
    saved = _linear_inputs(c, setup, a, down, out_b, held=held, input_saved=same) if down else 0
    acts.add("down_input", saved)


#: What an MLP activation saves for backward, per element of the MLP width, besides its output:
#: (tensors in the compute dtype, tensors in fp32 under autocast). One-op activations save their input
#: (``gelu``, ``gelu_pytorch_tanh`` = F.gelu(approximate="tanh"), ``silu``) or output (``relu``;
#: ``relu2`` = relu then square, whose pow saves the relu output). ``gelu_new`` (NewGELUActivation, the
#: Python tanh formula) keeps its input, the tanh output, ``1 + tanh`` and ``0.5 x``; under autocast
#: ``pow`` runs in fp32, so its input copy, the tanh output and ``1 + tanh`` are fp32 and so is the
#: activation's output (``0.5 x`` times an fp32 tensor: `PYTHON_GELU_FP32_OUT`), as in the GPT-2 rule
#: (session 12: T5 v1.1's gated-gelu traced under the HF Trainer's autocast; was (4, 2)). ``quick_gelu``
#: = x * sigmoid(1.702 x): its input and the sigmoid output. ``xielu`` (Apertus; ``XIELUActivation``'s
#: Python path, which transformers takes unless the separate ``xielu`` CUDA package is installed):
#: ``where(x > 0, alpha_p * x * x + beta * x, (expm1(min(x, eps)) - x) * alpha_n + beta * x)`` keeps its
#: input, ``alpha_p * x``, the ``expm1`` output and the 1-byte ``x > 0`` mask (2.5 tensors past the input:
#: listed with torch's saved-tensor hooks, transformers 5.24); ``alpha_p`` is a shape-(1,) parameter, so
#: with fp32 weights under autocast ``alpha_p * x`` is promoted to fp32. transformers ``activations.py``.
ACTIVATION_SAVES: dict[str, tuple[float, int]] = {
    "gelu_new": (4, 3), "gelu_python": (4, 2), "gelu_fast": (4, 2), "gelu_accurate": (4, 3),
    "quick_gelu": (2, 0), "xielu": (3.5, 1),
}  # fmt: skip
#: Activations with learned parameters save more when those train (full fine-tuning): xIELU keeps
#: ``expm1(...) - x`` for ``alpha_n``'s gradient (same hooks).
ACTIVATION_PARAM_SAVES: dict[str, int] = {"xielu": 1}
#: Activations whose output is fp32 under autocast (a ``pow`` in the formula runs in fp32 and promotes
#: the rest): what a gated MLP's product saves of them is fp32.
PYTHON_GELU_FP32_OUT = frozenset({"gelu_new", "gelu_accurate"})
#: Activations whose backward reads their output, not their input (``threshold_backward`` of ReLU's
#: result): what they save is the tensor the next op reads. ``relu2`` saves the ReLU output for its
#: square, a tensor the down projection does not read.
OUTPUT_SAVING_ACTIVATIONS = frozenset({"relu"})


def plain_activation_bytes(activation: str, c: Ctx, elem: int | None = None) -> float:
    """Bytes per MLP-width element an activation of a plain (non-gated) MLP saves (`ACTIVATION_SAVES`);
    ``elem``: bytes of the projection's output when it is not the compute dtype (`quantized_out_bytes`)."""
    b = c.gamma if elem is None else elem
    n, fp32 = ACTIVATION_SAVES.get(activation, (1, 0))
    if c.full:
        n += ACTIVATION_PARAM_SAVES.get(activation, 0)
    if c.autocast and fp32:
        return (n - fp32) * b + fp32 * 4
    return n * b


def _mla_parts(a: DecoderArch, setup: LlmSetup, c: Ctx) -> dict[str, float]:
    """Multi-head latent attention (DeepSeek-V2/V3) beyond the generic rule: the latent RMSNorms'
    fp32 input copies and the up-projections' inputs (q_b reads the q latent, kv_b the kv latent);
    values are ``v_head_dim`` wide while keys are ``qk_nope + qk_rope``, which the generic ``qkv``
    term counts as ``head_dim``: the difference is taken off."""
    lins = {x.name: x for x in layer_linears(a, False) if x.role == "attn"}
    out: dict[str, float] = {}
    norms = 4 * (a.q_lora_rank + a.kv_lora_rank)
    out["mla_latent_norms"] = norms
    ups = [lins[n] for n in ("q_b_proj", "kv_b_proj") if n in lins]
    out["mla_up_inputs"] = sum(_linear_inputs(c, setup, a, [x], c.norm_out) for x in ups)
    out["qkv"] = -c.gamma * a.num_heads * (a.head_dim - a.v_head_dim)
    return out


def bnb_kbit_base(setup: LlmSetup, regime: Regime) -> bool:
    """A bitsandbytes 4-/8-bit base whose norms (and, after peft's own preparation, every other
    non-quantized parameter) k-bit preparation made fp32."""
    from fitcheck.engine.states import quantized_base

    bnb = setup.method == "qlora" or setup.base_quant == "int8"
    return quantized_base(setup) and bnb and (regime.kbit_upcast or regime.kbit_norms_fp32)


def fp32_stream(setup: LlmSetup, regime: Regime) -> bool:
    """Whether a run without autocast computes every layer in fp32.

    ``prepare_model_for_kbit_training`` casts every non-quantized parameter to fp32 (peft utils/other.py),
    so the embedding output and every norm output are fp32; bitsandbytes' ``Linear4bit.forward`` casts
    its input to ``compute_dtype`` for the matmul and the output back to the input's dtype
    (``matmul_4bit(...).to(inp_dtype)``, bitsandbytes nn/modules.py @005a63c2), so every projection returns
    fp32, and with no autocast to cast them down, attention, MLP and logits all run in fp32 (peft 0.21.2
    utils/other.py ``param.data.to(torch.float32)``).
    """
    return not regime.autocast and bnb_kbit_base(setup, regime)


def quantized_out_bytes(setup: LlmSetup, regime: Regime, c: Ctx) -> int:
    """Bytes of a projection's output: the compute dtype, except for bitsandbytes layers fed an fp32
    residual stream.

    ``Linear4bit.forward`` casts its input to the compute dtype and its output back to the input's dtype
    (``out.to(inp_dtype)``, bitsandbytes nn/modules.py; ``Linear8bitLt`` likewise), so after peft's k-bit
    preparation has made the embeddings and norms fp32, every quantized projection returns fp32 and the
    MLP keeps its gate, activation and up outputs in fp32 (the attention kernel's autocast casts q, k, v
    back to the compute dtype).
    """
    if bnb_kbit_base(setup, regime) and c.autocast:
        return 4
    return c.gamma


def _gpt2_layer(a: DecoderArch, setup: LlmSetup, c: Ctx) -> LayerActs:
    """GPT-2 (``modeling_gpt2.py``): LayerNorm, fused ``c_attn``, dropout everywhere, ``gelu_new``.

    Under autocast, layer_norm and pow run in fp32, so each LayerNorm saves an fp32 copy of its input
    and ``gelu_new`` keeps three fp32 tensors of the MLP width (the pow input, tanh output and
    ``1 + tanh``) plus a compute-dtype ``0.5 x``; projections then get compute-dtype cast copies of
    fp32 inputs. Without autocast the same ops run in the compute dtype. Dropout keeps a 1-byte mask
    and, on attention probabilities, its output (traced). ``GPT2MLP`` runs ``ACT2FN[activation_function]``,
    so a config naming a one-op GELU (``gelu_pytorch_tanh``, ``gelu``) saves only its input
    (`plain_activation_bytes`; transformers activations.py ``PytorchGELUTanh``:
    ``F.gelu(approximate="tanh")``).
    """
    acts = LayerActs()
    h, width = a.hidden_size, a.intermediate_size
    lins = layer_linears(a, False)
    c_attn, c_proj, c_fc, mlp_proj = lins
    act_in = 4 if c.autocast else c.gamma  # dtype of LayerNorm / gelu intermediates
    ln_out = 4 if c.autocast else c.rho
    acts.add("norm_inputs", 2 * act_in * h if c.autocast else 2 * c.rho * h)
    acts.add("qkv_inputs", _linear_inputs(c, setup, a, [c_attn], ln_out))
    acts.add("qkv", c.gamma * (a.num_heads * a.head_dim + 2 * a.num_kv_heads * a.head_dim))
    drop = 1 if a.attn_dropout else 0
    if setup.attn == "eager" or setup.backend == "mps":
        acts.scores = a.num_heads * ((4 if c.autocast else c.gamma) + c.gamma + drop)
    else:
        acts.add("attn_out", 4 * a.num_heads)
    acts.add("o_input", _linear_inputs(c, setup, a, [c_proj], c.gamma))
    acts.add("dropout_masks", 2 * h if a.resid_dropout else 0)
    acts.add("mlp_inputs", _linear_inputs(c, setup, a, [c_fc], ln_out))
    python_gelu = a.activation in PYTHON_GELUS
    acts.add(
        "mlp_hidden",
        width * ((3 * act_in + c.gamma) if python_gelu else plain_activation_bytes(a.activation, c)),
    )
    acts.add("down_input", _linear_inputs(c, setup, a, [mlp_proj], act_in))
    if setup.dora and not c.full:
        acts.add("dora_outputs", _dora_outputs(c, setup, a, lins))
    acts.add(MASK_COPY, sdpa_mask_copy_bytes(a, setup, c.gamma))
    return acts


def _moe(a: DecoderArch, c: Ctx, setup: LlmSetup) -> float:
    """Routed experts (transformers 5 grouped-mm path), per token: each of its top-k experts keeps the
    gate/up output (the activation's input is a view of it), the activation output and the down
    output (saved by the routing-weight multiply); trainable experts also keep the gathered input and
    the product that feeds down_proj. Router logits and probabilities in fp32. A shared expert keeps
    what a dense gated MLP keeps (traced)."""
    k, w, h = a.experts_per_token, a.moe_intermediate_size, a.hidden_size
    experts = [x for x in layer_linears(a, True) if x.role == "expert"]
    trainable = c.full or any(targeted(a, setup.lora_targets, x) for x in experts)
    per_expert = c.gamma * (2 * w + w + h + ((h + w) if trainable else 0))
    router = 4 * a.num_experts * 2
    shared = c.gamma * 4 * a.shared_expert_intermediate_size if a.shared_expert_intermediate_size else 0
    return k * per_expert + router + shared


def _merged_expert_linears(a: DecoderArch, setup: LlmSetup) -> tuple[list[Linear], list[Linear]]:
    """The 3-D expert parameters peft merges with their LoRA factors, (up: ``gate_up_proj``, down:
    ``down_proj``): peft's ``ParamWrapper`` parametrizes each as ``W + B A`` (``_LoraFactorsProxy``,
    ``baddbmm``), a full compute-dtype copy of every expert's weights per layer, saved for backward
    (traced). None when the experts are not adapted; when they are per-expert modules that peft wraps one
    by one (`quant.expert_modules`: a GPTQ / AWQ base, or transformers 4.x's layout); and under Unsloth,
    whose "Split LoRA" computes the experts' adapters without merging them (`quant.UNSLOTH_EXPERTS_4BIT`)."""
    if setup.method == "full" or not a.is_moe or expert_modules(a, setup) or setup.trainer == "unsloth":
        return [], []
    adapted = [x for x in layer_linears(a, True) if x.role == "expert" and targeted(a, setup.lora_targets, x)]
    down = [x for x in adapted if x.name.endswith("down_proj")]
    return [x for x in adapted if x not in down], down


def merged_expert_copies(a: DecoderArch, setup: LlmSetup, regime: Regime) -> tuple[int, int]:
    """Bytes of one MoE layer's merged expert copies (`_merged_expert_linears`): (up, down)."""
    gamma = context(setup, regime).gamma
    up, down = _merged_expert_linears(a, setup)

    def copy(lins: list[Linear]) -> int:
        return int(sum(x.copies * x.d_in * x.d_out for x in lins) * gamma)

    return copy(up), copy(down)


def merged_expert_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """One MoE layer's merged expert weights, up and down (`merged_expert_copies`)."""
    return sum(merged_expert_copies(a, setup, regime))


def expert_forward_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, tokens: int) -> int:
    """Inside one MoE layer's experts when peft merges them (`merged_expert_copies`), the larger of two
    moments: both merged copies made, or the up copy beside the routed tokens' intermediate tensors (the
    up projection's output, 2 x the expert width when gated, the activation's output and the gated
    product: twice the up projection's output width per routed token). Traced on Mixtral shapes: the
    first at the real shape (h 4096, 8 x 14336 experts), the second at h 512 with a 2,000-token
    vocabulary (tests/test_arch_trace_fixes.py, docs/methodology.md#moe)."""
    up, down = merged_expert_copies(a, setup, regime)
    if not up + down:
        return 0
    width = sum(x.d_out for x in _merged_expert_linears(a, setup)[0])
    routed = tokens * max(1, a.experts_per_token) * 2 * width * context(setup, regime).gamma
    return int(max(up + down, up + routed))


#: Parts of a layer's saved activations that belong to its MLP: freed by the time the layer's
#: attention runs its backward (the MLP's backward comes first).
MLP_PARTS = ("mlp_inputs", "mlp_hidden", "mlp_act_out", "down_input", "moe")


def attention_part(acts: LayerActs) -> float:
    """Bytes per token of a layer's saved activations outside its MLP (scores excluded)."""
    return sum(v for k, v in acts.parts.items() if k not in MLP_PARTS)


def eager_mask_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """The additive causal mask eager attention materializes: b x 1 x s x s in the embedding dtype.

    transformers' ``masking_utils`` builds it once per forward (``torch.where`` on the boolean mask,
    min-dtype where masked) and every layer reads it, so it lives from the model's forward to the end of
    its backward (traced: ``where.self (b, 1, s, s)``). SDPA and flash take ``is_causal`` instead.
    """
    if not uses_eager_scores(a, setup) or setup.backend == "mps":
        return 0
    c = context(setup, regime)
    return setup.batch_size * setup.seq_len**2 * c.rho


@dataclass(frozen=True)
class EagerPeaks:
    """Bytes per query-key pair per sequence (x b x s^2) of eager attention's short-lived tensors.

    ``forward_transient``: in a checkpointed (unsaved) forward, the masked scores, their fp32 copy and
    the fp32 softmax exist together. ``forward_extra``: in a saving forward, what exists at the softmax
    beyond the saved scores (the fp32 copy of the input). ``backward``: at the softmax backward the saved
    fp32 probabilities, the incoming gradient upcast to fp32 and the fp32 result (traced: three fp32
    b x heads x s^2 tensors); the saved compute-dtype copy is already freed by then.
    """

    forward_transient: float
    forward_extra: float
    backward: float


def eager_peaks(a: DecoderArch, setup: LlmSetup, regime: Regime) -> EagerPeaks:
    """Eager attention's transients, zero for kernels that never materialize the scores."""
    if not materializes_scores(a, setup, regime) or a.model_type == "gpt2":
        return EagerPeaks(0.0, 0.0, 0.0)
    c = context(setup, regime)
    sm = softmax_bytes(a, c)
    upcast = 4 if c.gamma != 4 and sm == 4 else 0  # softmax(dtype=float32) copies a 16-bit input first
    capped = c.gamma if a.attn_logit_softcapping else 0
    h = a.num_heads
    return EagerPeaks(
        forward_transient=h * (c.gamma + upcast + sm + capped),
        forward_extra=h * upcast,
        backward=h * 3 * sm,  # the saved probabilities, the incoming gradient and the result, in sm's dtype
    )


def head_input_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> float:
    """Bytes per token the output layer saves when it trains: a ``modules_to_save`` copy of lm_head
    saves its input (compute dtype); LoRA on lm_head saves lora_A's cast input (as any wrapped linear)
    and lora_B's rank-r input. Traced: LoRA on lm_head leaves the loss hump as it is (the base output
    and the LoRA output are summed before the fp32 upcast)."""
    from fitcheck.engine.lora import head_targets, trained_modules

    if setup.method == "full":
        return 0.0
    c = context(setup, regime)
    h = a.hidden_size
    out = 0.0
    if "lm_head" in trained_modules(setup) or zero3_linear_keeps_inputs(setup):
        out += c.gamma * h  # a trained copy's input, or the frozen head's under ZeRO-3's F.linear
    if "lm_head" in head_targets(setup.lora_targets):
        x = c.gamma if c.autocast else c.adapter
        out += (0 if setup.lora_fa else x * h) + x * setup.lora_rank  # a frozen lora_A saves no input
    return out
