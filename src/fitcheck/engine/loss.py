"""The logits/loss hump: what each cross-entropy kernel holds at the end of the forward and at the
start of the backward (docs/methodology.md, "Logits and loss").

One table of kernels, each a small function of (tokens, vocabulary, hidden size, dtypes) returning
whole-batch bytes, so a trainer's default and ``--loss`` resolve to the same rows:

===========  ======================================================================================
standard     HF ``ForCausalLMLoss``: lm_head output, ``logits.float()``, fp32 log-softmax (traced)
hf_legacy    transformers <= 4.45 ``LlamaForCausalLM.forward``: fp32 logits returned, shifted fp32 copy, CE
hf_4.46      transformers 4.46-4.48 ``ForCausalLMLoss``: output returned, fp32 copy, shifted fp32 copy, CE
chunked      torchtune ``CEWithChunkedOutputLoss`` (8 chunks): every chunk's fp32 log-softmax saved
litgpt       litgpt's adapter scripts: 128-position lm_head chunks, cast to fp32 by Fabric, chunked CE
litgpt_full  litgpt ``finetune/full.py``: whole logits, cast to fp32 by Fabric, CE in 128-row chunks
plain        a training loop's own ``nn.CrossEntropyLoss`` on the model's logits as they come (no upcast)
seq2seq      T5's own loss: ``CrossEntropyLoss`` on the unshifted logits as they come (no upcast, no copy)
unsloth      Unsloth's fused, chunked loss ("Chunk & Fuse"): one slice of tokens' logits at a time
liger        Liger ``LigerFusedLinearCrossEntropyLoss``: logits of one token chunk at a time
trl          TRL's SFTTrainer (1.16): ``fused_lm_head``, log-probabilities from lm_head tiles, no logits
cce          Apple ``linear_cross_entropy`` (Cut Cross-Entropy): no logits in global memory
mlx          mlx-lm's ``default_loss`` (``nn.losses.cross_entropy`` on the logits as they come), MLX's graph
===========  ======================================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fitcheck.engine import compiled
from fitcheck.models import DecoderArch, LlmSetup, Regime

#: torchtune's CEWithChunkedOutputLoss default (torchtune/modules/loss/ce_chunked_output_loss.py).
TORCHTUNE_CHUNKS = 8
#: litgpt finetune scripts call ``model(input_ids, lm_head_chunk_size=128)`` and
#: ``chunked_cross_entropy(..., chunk_size=128)`` (litgpt/finetune/lora.py, litgpt/utils.py @01db2ec3).
LITGPT_CHUNK_TOKENS = 128
#: Lightning Fabric casts every floating tensor a wrapped module returns to the default dtype, fp32
#: (``_FabricModule.forward``: ``precision.convert_output(output)``; ``HalfPrecision`` and
#: ``BitsandbytesPrecision.convert_output``: ``dst_type=torch.get_default_dtype()``; lightning 2.4.0
#: fabric/wrappers.py and fabric/plugins/precision/half.py, bitsandbytes.py, the same at 71aed751), so
#: litgpt's loss always runs on fp32 logits.
FABRIC_OUTPUT_BYTES = 4


@dataclass(frozen=True)
class Hump:
    """Whole-batch bytes of the loss at the forward's end, at the backward's start, and kept saved."""

    forward: float
    backward: float
    saved: float
    rule: str
    #: what the loss still holds when the output layer's own backward runs (default: ``backward``)
    head_backward: float | None = None

    @property
    def at_head(self) -> float:
        return self.backward if self.head_backward is None else self.head_backward


@dataclass(frozen=True)
class Dims:
    tokens: int
    vocab: int
    hidden: int
    gamma: int  # compute dtype bytes (the lm_head output)
    cap: int  # Gemma 2 final soft-cap: its tanh output, compute dtype (0 without)
    chunks: int
    batch: int = 1  # rows of the micro-batch (litgpt's head chunks are 128 positions of every row)
    head_grad: int = 0  # a kernel's own fp32 accumulator for a trained lm_head's gradient (`_trl`), bytes


def _standard(d: Dims) -> Hump:
    """HF: 10 B per vocabulary entry forward (lm_head output, fp32 copy, fp32 log-softmax); 12 B backward
    (saved log-softmax, nll_loss gradient, log-softmax input gradient; traced). With chunking, every
    chunk's log-softmax stays saved, so only the transient copy and the two gradients shrink. fp32
    logits (an fp32 model, or an fp32 lm_head without autocast) have no copy: ``.float()`` returns the
    tensor itself (traced)."""
    tv = d.tokens * d.vocab
    c = 1 / d.chunks
    copy = 4 * c if d.gamma != 4 else 0
    return Hump(
        forward=tv * (d.gamma + 4 + copy + d.cap),
        backward=tv * (4 + 8 * c + d.cap),
        saved=tv * (4 + d.cap),
        rule="lm_head output + fp32 upcast + log-softmax" + (f" ({d.chunks} chunks)" if d.chunks > 1 else ""),
    )


def _hf_legacy(d: Dims) -> Hump:
    """transformers before ``loss_function`` (4.37.2 through 4.45.2; 4.46.0 moved the loss into
    ``ForCausalLMLoss``): ``LlamaForCausalLM.forward`` (and Mistral's) computes ``logits = self.lm_head(h)``,
    ``logits = logits.float()`` (always; 4.45: ``self.lm_head(...).float()``) and returns those fp32 logits as
    the output, then ``shift_logits = logits[..., :-1, :].contiguous()`` (an fp32 copy), ``.view(-1, V)`` and
    ``CrossEntropyLoss`` (transformers 4.37.2 models/llama/modeling_llama.py lines 1201-1215; 4.45.2 lines
    1214-1229). Forward peak, per entry: the fp32 logits (4; a compute-dtype lm_head output, 2, is dropped
    when ``logits`` is rebound, and nothing saves it), the shifted copy (4) and the fp32 log-softmax (4).
    The shifted copy is local to ``forward`` (log-softmax saves its output, not its input) and dies with
    it; the fp32 logits die too unless the loop holds the output (``--keep-logits``: 4 bytes,
    ``output_logits_bytes``). Backward start: as ``standard``, the saved log-softmax and its two fp32
    gradients (12). The slice's backward then writes a whole fp32 gradient (8 with its input, under the
    12), and when the lm_head's backward runs, the cast back to the compute dtype sits beside its fp32
    source (``4 + g``; no cast for fp32 logits)."""
    tv = d.tokens * d.vocab
    cast = d.gamma if d.gamma != 4 else 0
    return Hump(
        forward=tv * (12 + d.cap),
        backward=tv * (12 + d.cap),
        saved=tv * (4 + d.cap),
        rule="fp32 logits returned + shifted fp32 copy + fp32 log-softmax (transformers <= 4.45)",
        head_backward=tv * (4 + cast + d.cap),
    )


def _hf_446(d: Dims) -> Hump:
    """transformers 4.46.0 through 4.48.3: the model returns the lm_head output as made (compute dtype) and
    ``ForCausalLMLoss`` does ``logits = logits.float()`` (an fp32 copy; the caller's compute-dtype tensor
    stays alive, it is the returned output), ``shift_logits = logits[..., :-1, :].contiguous()`` (a second
    fp32 copy), ``.view(-1, V)`` and ``cross_entropy`` (transformers 4.46.0 ``loss/loss_utils.py`` lines
    32-47, ``models/llama/modeling_llama.py`` lines 1210-1214; 4.47.1, 4.48.1 and 4.48.3 ``loss_utils.py``
    the same, lines 32-48; 4.49.0 lines 32-48 and 4.50.0 lines 33-57 pad the labels instead and shift
    nothing: ``standard``; read from the PyPI wheels of those releases). Forward peak, per entry:
    the lm_head output (``g``), its fp32 copy (4), the shifted copy (4) and the fp32 log-softmax (4); fp32
    logits have no first copy (``.float()`` returns the tensor itself) but still the shifted one. Both
    copies are locals of ``ForCausalLMLoss`` (log-softmax saves its output, not its input) and die when it
    returns, so backward starts as ``standard`` (12). Backward then runs the same nodes in the same order
    as ``hf_legacy`` (slice, then cast): the slice's backward writes a whole fp32 gradient, and when the
    lm_head's backward runs, the cast back to the compute dtype sits beside its fp32 source (``4 + g``)."""
    tv = d.tokens * d.vocab
    copy = 4 if d.gamma != 4 else 0
    cast = d.gamma if d.gamma != 4 else 0
    return Hump(
        forward=tv * (d.gamma + copy + 4 + 4 + d.cap),
        backward=tv * (12 + d.cap),
        saved=tv * (4 + d.cap),
        rule="lm_head output + fp32 upcast + shifted fp32 copy + fp32 log-softmax (transformers 4.46-4.48)",
        head_backward=tv * (4 + cast + d.cap),
    )


def _litgpt(d: Dims) -> Hump:
    """litgpt's LoRA / QLoRA / adapter scripts: ``model(input_ids, lm_head_chunk_size=128)`` returns a list
    of compute-dtype chunks (128 positions of every row), which Fabric casts to fp32 while the
    compute-dtype list still exists (``FABRIC_OUTPUT_BYTES``); ``chunked_cross_entropy`` then saves each
    chunk's fp32 log-softmax while the training loop's ``logits`` list keeps the fp32 chunks through
    backward (litgpt/finetune/lora.py, litgpt/utils.py @00af8b0d).

    Backward runs every chunk's cross-entropy before any chunk's cast or lm_head (autograd runs the
    highest sequence number first, and those nodes were made last), so each fp32 log-softmax gives way
    to an fp32 gradient of the same size, plus one chunk's two gradients in flight; when the lm_head's
    backward runs the gradients have been cast back to the compute dtype.
    """
    tv = d.tokens * d.vocab
    f = FABRIC_OUTPUT_BYTES
    chunk = min(d.tokens, d.batch * LITGPT_CHUNK_TOKENS) * d.vocab
    cast = tv * (d.gamma + f) if d.gamma != f else 0
    return Hump(
        forward=max(cast, tv * 2 * f),
        backward=tv * 2 * f + chunk * 2 * f,
        saved=tv * 2 * f,
        rule="logits in 128-position chunks, cast to fp32 by Fabric, fp32 log-softmax per chunk",
        head_backward=tv * (f + d.gamma),
    )


def _litgpt_full(d: Dims) -> Hump:
    """litgpt ``finetune/full.py``: ``model(input_ids)`` returns the whole compute-dtype logits, which
    Fabric casts to fp32 (``FABRIC_OUTPUT_BYTES``); ``chunked_cross_entropy(logits[..., :-1, :], ...)``
    flattens the shifted logits (a copy when the batch has more than one row) and saves each 128-row
    chunk's fp32 log-softmax (litgpt/finetune/full.py, litgpt/utils.py @00af8b0d).

    Backward: the chunks' gradients meet in the split's backward, which concatenates them into one
    whole-batch fp32 gradient while the fp32 logits are still held by the training loop.
    """
    tv = d.tokens * d.vocab
    f = FABRIC_OUTPUT_BYTES
    flat = tv * f if d.batch > 1 else 0
    cast = tv * (d.gamma + f) if d.gamma != f else 0
    return Hump(
        forward=max(cast, tv * 2 * f + flat),
        backward=tv * 3 * f,
        saved=tv * 2 * f,
        rule="whole logits cast to fp32 by Fabric, flattened, fp32 log-softmax in 128-row chunks",
        head_backward=tv * (f + d.gamma),
    )


def _seq2seq(d: Dims) -> Hump:
    """T5ForConditionalGeneration's own loss (transformers 5.24 modeling_t5.py: ``CrossEntropyLoss``
    on ``lm_logits.view(-1, V)``; the decoder's inputs are shifted, not the logits): the logits and the
    log-softmax in the logits' dtype in forward, no shifted copy; at the backward's start `_plain`'s
    three tensors (traced: ``fitcheck measure`` on a T5 config)."""
    return _no_upcast(d, 2, "logits + log-softmax in the logits' dtype (T5's own loss: unshifted, no upcast)")


def _plain(d: Dims) -> Hump:
    """A training loop that calls the model without labels and computes the loss itself:
    ``nn.CrossEntropyLoss()(out.logits[:, :-1, :].reshape(-1, V), label[:, 1:].reshape(-1))`` on the
    logits in the dtype the output layer made them (no ``.float()``), then drops the model output before
    ``loss.backward()`` (ljm565/universal-llm-trainer src/models/llama3.py ``Llama3.forward``,
    ``del_logits_after_forward: True`` in every config/*.yaml @9efd14b5). The slice is not contiguous, so
    ``reshape`` copies it. Forward: logits, the shifted copy and the log-softmax (all ``g`` bytes). At the
    backward's start the logits and the copy are gone; the saved log-softmax, the ``nll_loss`` gradient and
    the log-softmax input gradient are alive (``g`` bytes each). A soft-cap keeps its tanh output. A loop
    that keeps the output instead is ``--keep-logits`` (``held_logits``)."""
    rule = "logits + shifted copy + log-softmax in the logits' dtype (the loop's own loss, no upcast)"
    return _no_upcast(d, 3, rule)


def _no_upcast(d: Dims, forward_tensors: int, rule: str) -> Hump:
    """Cross-entropy on the logits in their own dtype: ``forward_tensors`` logit-sized tensors at the end of
    the forward; at the backward's start the saved log-softmax, the ``nll_loss`` gradient and the
    log-softmax input gradient (a soft-cap keeps its tanh output throughout)."""
    tv = d.tokens * d.vocab
    return Hump(
        forward=tv * (forward_tensors * d.gamma + d.cap),
        backward=tv * (3 * d.gamma + d.cap),
        saved=tv * (d.gamma + d.cap),
        rule=rule,
    )


def _unsloth_materialized(d: Dims) -> Hump:
    """Unsloth's Triton cross-entropy on materialized logits: saves them and an fp32 logsumexp per row and
    writes the gradient into the logits buffer in backward (unsloth/kernels/cross_entropy_loss.py
    @0050c73e, ``Fast_CrossEntropyLoss``). Not a default: see ``_unsloth``."""
    tv = d.tokens * d.vocab
    lse = 4 * d.tokens
    return Hump(
        forward=tv * d.gamma + lse,
        backward=tv * d.gamma + lse,
        saved=tv * d.gamma + lse,
        rule="logits kept in the compute dtype, fp32 logsumexp, gradient in place",
    )


def _unsloth(d: Dims) -> Hump:
    """Unsloth's current loss never holds every token's logits: it runs the lm_head and cross-entropy
    over slices of the flattened sequence, each slice's forward and backward fused in the forward
    (Unsloth docs, "500K Context Length Fine-tuning", "Unsloth Loss Refactoring: Chunk & Fuse";
    unsloth_zoo loss_utils.py). Sized like Liger's fused kernel (one slice's logits, the input gradient
    kept). ``Fast_CrossEntropyLoss`` on materialized logits could not hold the 342k-token Llama 3.1 8B
    run Unsloth published (88 GiB of logits alone)."""
    h = _liger(d)
    return Hump(h.forward, h.backward, h.saved, "fused, chunked lm_head + cross-entropy (one slice's logits)")


def _liger(d: Dims) -> Hump:
    """Liger's fused linear cross-entropy computes logits, loss and gradients chunk by chunk in the
    forward: chunk = next_power_of_2(ceil(BT / ceil(V / H))) tokens (so a chunk's logits are about BT x H
    elements), and keeps the input gradient (BT x H) for backward (linkedin/Liger-Kernel
    ops/fused_linear_cross_entropy.py)."""
    inc = -(-d.vocab // d.hidden)
    rows = -(-d.tokens // inc)
    chunk = 1 << max(0, (rows - 1).bit_length())
    chunk = min(chunk, d.tokens)
    grad_in = d.tokens * d.hidden * d.gamma
    return Hump(
        forward=grad_in + chunk * d.vocab * d.gamma + 4 * chunk,
        backward=2 * grad_in,
        saved=grad_in,
        rule="fused linear cross-entropy: one token chunk's logits, the input gradient kept",
    )


#: TRL's tile of the fused LM head: ``TOKEN_CHUNK_SIZE`` tokens by ``_CHUNKED_LOGPROB_CHUNK_SIZE`` vocabulary
#: entries (trl 1.16.0 trl/kernels/chunked_logprob.py, trl/trainer/utils.py).
TRL_TILE_TOKENS = 4096
TRL_TILE_VOCAB = 32768


def _trl(d: Dims) -> Hump:
    """TRL 1.16.0's SFTTrainer: ``compute_loss`` calls ``model(**inputs, fused_lm_head=True)``, the forward
    ``add_fused_lm_head`` installs (trl/trainer/sft_trainer.py, trl/trainer/utils.py; also with
    ``use_liger_kernel``, whose fused cross-entropy it switches off). The backbone's last hidden states at
    the labelled positions are gathered (``hidden_states[mask]``: a compact copy, saved for backward) and
    ``ChunkedLogProbFunction`` (trl/kernels/chunked_logprob.py) projects them through the lm_head into one
    reused buffer of ``min(tokens, 4096) x 32768`` in the compute dtype (``mm_buf``, sized by ``chunk_size``
    whatever the vocabulary), folding each tile into fp32 per-token statistics (seven running rows; log-Z,
    the entropy and the targets saved). Its backward recomputes every tile into a new buffer, accumulates
    the input gradient in fp32 (and, when the lm_head trains, its weight gradient: ``head_grad``) and casts
    them back on return (no copy for fp32 hidden states; the weight's cast is its gradient, counted with
    the others). Every token is counted as labelled (a prompt-masked dataset scores fewer)."""
    tile = min(d.tokens, TRL_TILE_TOKENS) * TRL_TILE_VOCAB * d.gamma
    hidden = d.tokens * d.hidden * d.gamma
    saved = hidden + 16 * d.tokens  # the compact hidden states; fp32 log-Z and entropy; int64 targets
    return Hump(
        forward=saved + tile + 4 * 7 * d.tokens,
        backward=saved + tile + d.tokens * d.hidden * 4 + (hidden if d.gamma != 4 else 0) + d.head_grad,
        saved=saved,
        rule="TRL's fused LM head: log-probabilities from lm_head tiles, no logits",
    )


def _cce(d: Dims) -> Hump:
    """Cut Cross-Entropy keeps only an fp32 log-sum-exp per token and recomputes logits blockwise in
    shared memory in backward, which writes the input gradient (Wijmans et al. 2024, arXiv:2411.09009;
    apple/ml-cross-entropy)."""
    lse = 4 * d.tokens
    return Hump(
        forward=lse,
        backward=lse + d.tokens * d.hidden * d.gamma,
        saved=lse,
        rule="cut cross-entropy: fp32 log-sum-exp per token, no logits in memory",
    )


def _mlx(d: Dims) -> Hump:
    """mlx-lm's ``default_loss``: ``nn.losses.cross_entropy`` on the model-dtype logits (``logsumexp`` less
    the gathered target logit; no upcast, python/mlx/nn/losses.py @v0.32.0), evaluated as MLX's lazy graph.
    Measured on MLX's CPU backend built up from a bare head (bench/mlx_loss_probe.py): the loss holds exactly
    3 logit-sized tensors at its backward, the logits, the backward softmax of ``LogSumExp::vjp`` and the
    ``GatherAxis::vjp`` scatter (mlx/primitives.cpp). The logits are the loss value's: mlx-lm's
    ``nn.value_and_grad`` returns it, so its forward ``LogSumExp`` / ``GatherAxis`` nodes sit near the tape's
    outputs and run last, and the logits live through the backward (``output_logits_bytes``, ``held_logits``);
    the hump itself is the logits at the forward's end and the two gradients at the backward's."""
    tv = d.tokens * d.vocab
    return Hump(
        forward=tv * (d.gamma + d.cap),
        backward=tv * (2 * d.gamma + d.cap),
        saved=tv * (d.gamma + d.cap),
        rule="MLX cross-entropy on the logits' dtype: softmax and scatter gradients beside the held logits",
    )


KERNELS: dict[str, Callable[[Dims], Hump]] = {
    "standard": _standard,
    "hf_legacy": _hf_legacy,
    "hf_4.46": _hf_446,
    "chunked": _standard,
    "litgpt": _litgpt,
    "litgpt_full": _litgpt_full,
    "plain": _plain,
    "seq2seq": _seq2seq,
    "unsloth": _unsloth,
    "liger": _liger,
    "trl": _trl,
    "cce": _cce,
    "mlx": _mlx,
}


#: Kernels that run Gemma 2's final soft-cap as separate ops, keeping its tanh output (compute dtype).
SOFTCAP_OUTSIDE = ("standard", "hf_legacy", "hf_4.46", "chunked", "plain", "seq2seq", "mlx")


def kernel_for(setup: LlmSetup, regime: Regime, a: DecoderArch | None = None) -> str:
    """``--loss`` when given (spelt ``hf-legacy`` / ``hf-4.46`` for the ``hf_legacy`` / ``hf_4.46`` kernels),
    else the trainer's own; an encoder-decoder's transformers loss is its own (`_seq2seq`)."""
    seq2seq = a is not None and a.structure == "encoder_decoder"
    if setup.loss is None and regime.loss_kernel == "standard" and seq2seq and not regime.autocast:
        return "seq2seq"  # under autocast cross_entropy runs in fp32: the standard hump (traced)
    return (setup.loss or regime.loss_kernel).replace("-", "_")


def hump(
    a: DecoderArch,
    setup: LlmSetup,
    regime: Regime,
    gamma: int,
    rows: int | None = None,
    width: int | None = None,
) -> Hump:
    """The loss hump of the whole micro-batch under the setup's kernel.

    ``rows`` and ``width``: the output layer's rows (every token, or one per example for
    classification) and width (vocabulary or labels); by default every token and the vocabulary.
    """
    kernel = kernel_for(setup, regime, a)
    chunks = 1
    if kernel == "chunked":
        chunks = regime.loss_chunks if regime.loss_chunks > 1 else TORCHTUNE_CHUNKS
    cap = gamma if a.final_logit_softcapping and kernel in SOFTCAP_OUTSIDE else 0
    if setup.compile and kernel in compiled.COMPILED_LOSS_KERNELS and gamma != 4:
        n = setup.tokens if rows is None else rows
        fwd, bwd, saved, head = compiled.loss_hump(
            n * (a.vocab_size if width is None else width), n, gamma, chunks, cap
        )
        label = f" ({chunks} chunks)" if chunks > 1 else ""
        rule = f"compiled cross-entropy{label}: logits + fp32 max/log-sum per row"
        return Hump(fwd, bwd, saved, rule, head)
    dims = Dims(
        setup.tokens if rows is None else rows,
        a.vocab_size if width is None else width,
        a.hidden_size,
        gamma,
        cap,
        chunks,
        setup.batch_size if rows is None else 1,
        _head_grad(a, setup, regime) if kernel == "trl" else 0,
    )
    return KERNELS[kernel](dims)


def _head_grad(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Bytes of an fp32 ``vocab x hidden`` gradient accumulator for the lm_head when it trains (full
    fine-tuning, or a ``modules_to_save`` copy of it) in 16 bits; an fp32 lm_head's accumulator is its
    gradient (the cast back is no copy), counted with the others."""
    from fitcheck.engine.lora import trained_modules

    trains = setup.method == "full" or "lm_head" in trained_modules(setup)
    return 4 * a.vocab_size * a.hidden_size if trains and regime.trainable_dtype != "fp32" else 0


#: Kernels whose model output carries the whole batch's logits (``CausalLMOutput.logits``; litgpt's list
#: of chunks); Unsloth, Liger and CCE return none in training.
MATERIALIZED_LOGITS = ("standard", "hf_legacy", "hf_4.46", "chunked", "litgpt", "plain", "seq2seq", "mlx")
#: Kernels whose loss value keeps the model's logits alive through the backward, whatever the loop does
#: with the output (MLX's graph: `_mlx`).
LOSS_HOLDS_LOGITS = ("mlx",)


def loss_holds_logits(setup: LlmSetup, regime: Regime) -> bool:
    """Whether the setup's loss keeps the model's logits alive through the backward (`LOSS_HOLDS_LOGITS`)."""
    return kernel_for(setup, regime) in LOSS_HOLDS_LOGITS


#: Kernels whose returned logits are fp32 whatever the lm_head made (transformers <= 4.45 ``.float()``).
FP32_OUTPUT_LOGITS = ("hf_legacy",)


def output_logits_bytes(setup: LlmSetup, regime: Regime, rows: int, width: int, gamma: int) -> int:
    """Bytes of the logits the model returns (lm_head output in ``gamma`` bytes, the final soft-cap
    applied; fp32 for `FP32_OUTPUT_LOGITS`), zero for kernels that never materialize them
    (`MATERIALIZED_LOGITS`)."""
    kernel = kernel_for(setup, regime)
    if kernel not in MATERIALIZED_LOGITS:
        return 0
    return rows * width * (4 if kernel in FP32_OUTPUT_LOGITS else gamma)
