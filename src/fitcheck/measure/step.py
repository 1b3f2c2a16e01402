"""One training step the way each regime's trainer runs it, with phase marks for a probe.

The loop is HF Trainer's ``training_step`` reduced to what decides memory: forward and loss under
autocast when the regime uses it, backward outside autocast, gradient clipping (hf), the optimizer
step, then ``zero_grad(set_to_none=True)``. Gradient accumulation runs ``min(grad_accum, 2)``
micro-batches: the second one is where accumulated gradients meet a full set of activations.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from fitcheck.models import LlmSetup, Regime

IGNORE_INDEX = -100
MAX_GRAD_NORM = 1.0


class Probe(Protocol):
    """Something that watches memory and is told where phase boundaries are."""

    def begin(self, phase: str, step: int) -> None: ...

    def step_end(self, step: int, model: torch.nn.Module, optimizer: Any) -> None: ...


def make_batch(
    vocab_size: int, setup: LlmSetup, device: Any = None, *, task: str = "causal-lm", num_labels: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and labels for the task: the ids themselves (causal LM), one class per example
    (classification), ``--target-len`` target tokens (seq2seq, the source length when unset); no padding,
    no attention mask.

    No mask is passed on purpose: an all-ones mask makes transformers test ``mask.all()``, a
    data-dependent branch fake tensors cannot take, and it selects the same kernels as no mask.
    """
    b = setup.batch_size
    ids = torch.randint(0, vocab_size, (b, setup.seq_len), device=device)
    if task == "classification" and num_labels == 1:
        return ids, torch.rand(b, device=device)  # one label: transformers' regression (MSE on floats)
    if task == "classification":
        return ids, torch.randint(0, max(num_labels, 1), (b,), device=device)
    if task == "seq2seq":
        return ids, torch.randint(0, vocab_size, (b, setup.target_len or setup.seq_len), device=device)
    return ids, ids.clone()


def _autocast(regime: Regime, setup: LlmSetup, device_type: str) -> contextlib.AbstractContextManager[Any]:
    if not regime.autocast:
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if setup.precision == "bf16" else torch.float16
    return torch.autocast(device_type=device_type, dtype=dtype)


def model_loss(
    model: Any, ids: torch.Tensor, labels: torch.Tensor, held: list[Any] | None = None
) -> torch.Tensor:
    """The model's own loss (transformers ``ForCausalLMLoss``: logits upcast to fp32, shift, CE).

    Only the loss leaves this function, like HF Trainer's ``compute_loss``: the bf16 logits die here
    unless autograd saved them, or unless ``held`` (``--keep-logits``) keeps the output as a plain loop
    that writes ``out = model(**batch); out.loss.backward()`` does.
    """
    out = model(input_ids=ids, labels=labels)
    if held is not None:
        held[:] = [out]  # ``out = model(...)`` rebinds: the previous micro-batch's output dies only now
    return out.loss


def chunked_loss(model: Any, ids: torch.Tensor, labels: torch.Tensor, chunks: int) -> torch.Tensor:
    """torchtune's ``CEWithChunkedOutputLoss``: lm_head and fp32 cross-entropy per sequence chunk.

    torchtune's decoder applies the output projection chunk by chunk (``num_output_chunks``) and the
    loss upcasts one chunk at a time; labels are shifted left and padded with the ignore index.
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    head = base.get_output_embeddings()
    hidden = base.base_model(input_ids=ids).last_hidden_state  # the decoder stack (model, transformer)
    cap = getattr(base.config, "final_logit_softcapping", None)
    shifted = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE_INDEX)], dim=1)
    total = (shifted != IGNORE_INDEX).sum()
    logits = []
    for h in hidden.chunk(chunks, dim=1):
        out = head(h)
        if cap:
            out = torch.tanh(out / cap) * cap
        logits.append(out)
    del hidden
    loss: torch.Tensor | float = 0.0
    for out, lab in zip(logits, shifted.chunk(chunks, dim=1), strict=True):
        ce = torch.nn.functional.cross_entropy(
            out.reshape(-1, out.size(-1)).float(), lab.reshape(-1), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        loss = loss + ce
    return loss / total  # type: ignore[return-value]


def compute_loss(
    model: Any, ids: torch.Tensor, labels: torch.Tensor, regime: Regime, held: list[Any] | None = None
) -> torch.Tensor:
    """The loss as the regime computes it (model loss, or torchtune's chunked cross-entropy)."""
    if regime.loss_chunks > 1:
        return chunked_loss(model, ids, labels, regime.loss_chunks)
    return model_loss(model, ids, labels, held)


def clips_gradients(regime: Regime) -> bool:
    """HF Trainer clips to ``max_grad_norm=1.0`` by default (so do axolotl and LLaMA-Factory on top of it)."""
    return regime.name == "hf" or regime.name.endswith("(hf)")


def run_steps(
    model: Any,
    optimizer: Any,
    batch: tuple[torch.Tensor, torch.Tensor],
    setup: LlmSetup,
    regime: Regime,
    probe: Probe,
    steps: int,
    device_type: str,
) -> None:
    """Run ``steps`` optimizer steps, telling ``probe`` where each phase starts."""
    ids, labels = batch
    micro = min(setup.grad_accum, 2)
    params = [p for p in model.parameters() if p.requires_grad]
    held: list[Any] | None = [] if setup.keep_logits else None
    for step in range(1, steps + 1):
        for _ in range(micro):
            probe.begin("forward", step)
            with _autocast(regime, setup, device_type):
                loss = compute_loss(model, ids, labels, regime, held)
            probe.begin("backward", step)
            (loss / micro).backward()
            del loss
        probe.begin("optimizer_step", step)
        if clips_gradients(regime):
            torch.nn.utils.clip_grad_norm_(params, MAX_GRAD_NORM)
        optimizer.step()
        if held is not None:
            held.clear()  # the loop's output dies when its step function returns
        probe.step_end(step, model, optimizer)
        optimizer.zero_grad(set_to_none=not setup.keep_grads)  # --keep-grads: zeroed in place, kept


@contextlib.contextmanager
def cuda_dropout() -> Iterator[None]:
    """Make ``F.dropout`` take CUDA's fused path (``native_dropout``: a 1-byte bool mask).

    On CPU, ``at::dropout`` multiplies by a noise tensor of the input dtype (2-4 bytes a value);
    CUDA's fused kernel saves a bool mask. Patching the function keeps autograd's saved tensors those
    of the CUDA path while running on CPU or fake tensors.
    """
    import torch.nn.functional as F

    original = F.dropout

    def dropout(
        input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False
    ) -> torch.Tensor:
        if training and 0.0 < p < 1.0 and input.numel() > 0:
            out = torch.native_dropout(input, p, True)[0]
            return input.copy_(out) if inplace else out
        return original(input, p, training, inplace)

    F.dropout = dropout  # type: ignore[assignment]
    try:
        yield
    finally:
        F.dropout = original  # type: ignore[assignment]


@contextlib.contextmanager
def unpacked_batches() -> Iterator[None]:
    """Tell transformers' mask builder the batch holds one sequence per row, without reading it.

    ``find_packed_sequence_indices`` decides from the values of ``position_ids`` whether sequences are
    packed; on fake tensors it cannot read them and assumes packing, which forces an explicit
    (b, 1, s, s) mask and ``repeat_kv`` instead of SDPA's ``is_causal`` + ``enable_gqa`` path. Our
    batches are never packed (positions 0..s-1), so the answer eager mode computes is None.
    """
    from transformers import masking_utils

    original = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None  # type: ignore[assignment]
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original  # type: ignore[assignment]


@contextlib.contextmanager
def device_semantics(regime: Regime, emulate_cuda: bool, fake: bool = False) -> Iterator[None]:
    """Kernel-choice patches that make a CPU (or fake CPU) step behave like the CUDA step.

    Dropout takes the fused path (bool mask) and, under autocast, CUDA's op lists apply
    (fitcheck.measure.autocast); packed-sequence detection is answered without reading values. On
    fake tensors only, SDPA with attention dropout takes the flash kernel as on CUDA (the real CPU
    flash kernel refuses dropout, so a real CPU run keeps the math fallback).
    """
    with contextlib.ExitStack() as stack:
        stack.enter_context(unpacked_batches())
        stack.enter_context(grouped_mm_bf16_only())
        if emulate_cuda:
            stack.enter_context(cuda_dropout())
            if regime.autocast:
                from fitcheck.measure.autocast import cuda_autocast_policy

                stack.enter_context(cuda_autocast_policy())
            if fake:
                stack.enter_context(flash_with_dropout())
        yield


@contextlib.contextmanager
def flash_with_dropout() -> Iterator[None]:
    """Route SDPA with ``dropout_p > 0`` to the kernel CUDA's backend choice takes.

    CPU SDPA sends attention dropout to the math kernel, which materialises fp32 (b, heads, s, s)
    scores, their dropout mask and the product; CUDA's flash kernel applies dropout inside and saves
    only out, an fp32 logsumexp and the RNG seed. The CPU flash op has the same outputs and a meta
    kernel, so calling it on fake tensors gives the CUDA memory. (GPT-2 ships attn_pdrop=0.1.) With a
    mask (T5's relative position bias, handed to SDPA as an additive mask) CUDA takes the
    memory-efficient kernel, which applies the bias and the dropout inside (saving out, an fp32
    logsumexp, the RNG state and the bias it was given); its op has a meta kernel too.
    """
    import torch.nn.functional as F

    original = F.scaled_dot_product_attention
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    efficient = torch.ops.aten._scaled_dot_product_efficient_attention.default

    def sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: Any = None,
             dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
             enable_gqa: bool = False) -> torch.Tensor:  # fmt: skip
        if dropout_p > 0.0 and attn_mask is None and query.dim() == 4:
            return flash(query, key, value, dropout_p, is_causal, scale=scale)[0]
        if dropout_p > 0.0 and attn_mask is not None and attn_mask.is_floating_point() and query.dim() == 4:
            bias = attn_mask.to(query.dtype)
            return efficient(query, key, value, bias, True, dropout_p, is_causal, scale=scale)[0]
        return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal,
                        scale=scale, enable_gqa=enable_gqa)  # fmt: skip

    F.scaled_dot_product_attention = sdpa  # type: ignore[assignment]
    try:
        yield
    finally:
        F.scaled_dot_product_attention = original  # type: ignore[assignment]


@contextlib.contextmanager
def grouped_mm_bf16_only() -> Iterator[None]:
    """Send non-bf16 MoE experts to transformers' ``grouped_mm_fallback`` op.

    ``torch._grouped_mm`` accepts only bf16 on CUDA (its meta kernel checks it), so fp32 experts
    (AMP from an fp32 model) would fail the trace; the fallback op has the same output buffers and a
    fake implementation. bf16 experts keep the grouped_mm path.
    """
    from fitcheck.measure._internals import grouped_mm_gate, set_grouped_mm_gate

    original = grouped_mm_gate()

    def can_use(input: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor) -> bool:
        return weight.dtype == torch.bfloat16 and bool(original(input, weight, offs))

    set_grouped_mm_gate(can_use)
    try:
        yield
    finally:
        set_grouped_mm_gate(original)
