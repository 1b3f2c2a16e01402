"""Process overhead: CUDA context and the caching allocator's reserve.

The context is data per GPU generation in the hardware catalog; without a target the default is the
most recent public measurement (docs/methodology.md, "Overhead"). The allocator reserve model is
provisional: no GPU measurement has been made by this project yet (see docs/accuracy.md).
"""

from __future__ import annotations

from fitcheck.facts import allocator
from fitcheck.facts.context import DEFAULT_CONTEXT_MIB
from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.units import MIB

# Context per process when the GPU is not in the catalog (the catalog holds one per generation):
# the one table of defaults is fitcheck.facts.context.
#: The caching allocator rounds large blocks up to 2 MiB (``kRoundLarge``, facts/allocator.py): on average
#: half of it, 1 MiB, lost per large live tensor.
ROUNDING_PER_TENSOR = allocator.ROUND_LARGE // 2
#: c10/cuda/CUDACachingAllocator.cpp ``kSmallSize``: a request of at most 1 MiB is served from the small
#: pool (2 MiB segments shared by many blocks, 512-byte rounding), so only larger tensors count for the
#: rounding above (the engine's tensor count, engine/estimate.py ``_tensor_count``).
SMALL_REQUEST = allocator.SMALL_SIZE
#: Short-lived blocks fragment the cache: measured reserved/allocated 1.07-1.49 (fitcheck-llm, T4);
#: Megatron adds 5%. Applied to activations and transients only (weights are allocated once).
FRAGMENTATION = 0.15


#: Loss kernels whose tensors are whole-batch logits (engine/loss.py): each is larger than any block a
#: decoder layer cuts when the output layer's rows x width are at least the tokens x the layer's widest
#: tensor (`stranded_layer_blocks`). The chunked kernels' tensors are one chunk's and fit the cached blocks.
WHOLE_LOGITS_KERNELS = ("standard", "hf_legacy", "hf_4.46", "plain", "seq2seq", "litgpt_full")


def stranded_layer_blocks(
    a: DecoderArch, setup: LlmSetup, kernel: str, layer_bytes: float, logit_elements: int
) -> float:
    """Bytes of the checkpointed forward's layer blocks the caching allocator holds free but unusable at
    the loss (``layer_bytes``: one layer's activations as the engine counts them, the proxy for the
    blocks a layer's unsaved forward cuts; eager attention's scores are left out, being blocks as large
    as the logits' and able to serve them), 0 where the rule does not hold.

    Under checkpointing each layer's forward runs without saving (reentrant: ``torch.no_grad``), so its
    intermediates are freed as it goes and the next layer reuses their blocks; at the loss those blocks
    are all free. The caching allocator serves a request from the smallest cached free block at least as
    large, cuts a new segment otherwise, and merges free blocks only within a segment
    (c10/cuda/CUDACachingAllocator.cpp at 001074d, ``get_free_block`` / ``alloc_block`` /
    ``try_merge_blocks``): the loss's whole-batch logits (``logit_elements``, the output layer's rows x
    width, each tensor at least the compute dtype) are larger than every layer block when they hold at
    least as many elements as the layer's widest tensor, tokens x (the fused gate/up projection's
    ``2 x intermediate``, the attention's heads x head_dim, the hidden size), so they cut segments of their
    own and the layer blocks stay reserved beside them; a classification head's rows x labels fit any
    cached block. Without checkpointing the layer's tensors are saved, alive at the loss, and nothing is
    stranded. Replayed through an allocator model on an emulated trace (bench/ult_qlora_replay.py):
    Phi-3-mini QLoRA at 2 x 8192 tokens keeps 4.6 GiB of free layer blocks beside its fp32 logits; this
    proxy counts 4.3 (docs/methodology.md, "Layer blocks beside the loss")."""
    if (
        not setup.grad_ckpt
        or setup.backend not in allocator.BACKENDS
        or kernel not in WHOLE_LOGITS_KERNELS
        or logit_elements < setup.tokens * widest_layer_tensor(a)
    ):
        return 0.0
    return layer_bytes


def regrown_loss_blocks(
    setup: LlmSetup, kernel: str, gradient_bytes: float, logits_bytes: float, grad_tensor_bytes: int
) -> float:
    """Bytes of segments a step's loss cuts anew because the step before filled its cached blocks with
    gradients: the smaller of the trainable gradients and the loss's logits tensors (``logits_bytes``, the
    largest loss moment's), 0 where the rule does not hold, and 0 when a decoder layer's largest gradient
    tensor, or that of a module copy trained beside LoRA (``grad_tensor_bytes``, engine/states.py
    `largest_regrowing_grad_bytes`), is under the allocator's ``kMinLargeAlloc`` (10 MiB).

    Read off the allocator's history on an H200 (bench/gpu_segments.py, Llama 3.2 3B full fine-tuning,
    session 20): step 1's whole-logits loss cuts segments of its own; backward's gradients, made after the
    loss has freed them, are served from those blocks (best fit, c10/cuda/CUDACachingAllocator.cpp
    ``get_free_block``), so the optimizer's states cut new segments, and the next step's loss finds its
    blocks split and cuts as many again. Bounded by the gradients and by the logits (a narrow vocabulary:
    little). Not on several ranks (their gradients are bucketed or sharded; not measured), with
    ``keep_grads`` (the gradients never leave their blocks) or an optimizer step inside backward (each
    gradient freed as it is made). A device map (one process) counts it on the GPU that runs the loss, with
    that GPU's gradients.

    The layer-tensor condition (session 21) replaced "the gradients are at least the output logits", which the
    boundary grid found wanting: on every row of the first five H200 grids the loss's blocks regrow where a
    layer's largest gradient is 27-136 MB (Llama 3.2 1B / 3B, Gemma 2 2B, Qwen2.5 1.5B-7B, Mistral 7B, SmolLM2
    1.7B in part) and not where it is 1.8-8.7 MB (Qwen2.5 0.5B, SmolLM2 135M / 360M, LoRA factors; and
    Sebastian Raschka's GPT-2 pre-training rows of the published corpus, 4.7 MB). The split is what the rows
    show; placing it at ``kMinLargeAlloc`` (the largest request that shares a 20 MiB segment with others) was
    a conjecture about why, which the threshold grid (tests/data/measured/h200-threshold.yaml), posed before
    it ran, refutes in the safe direction: no row under, but 5 of its 7 rows on the rule's side 5-19% over.
    The allocator's history there shows the loss's segments regrown in every row read; whether that is waste
    depends on how fully the optimizer states fill the old ones, which wants the step's tensors placed by best
    fit, not a rule (docs/methodology.md, "Real-GPU runs")."""
    if (
        setup.backend not in allocator.BACKENDS
        or kernel not in WHOLE_LOGITS_KERNELS
        or setup.keep_grads
        or setup.optimizer_in_bwd
        or (setup.distributed and setup.strategy != "device-map")
        or grad_tensor_bytes < allocator.MIN_LARGE_ALLOC
    ):
        return 0.0
    return min(gradient_bytes, logits_bytes)


def widest_layer_tensor(a: DecoderArch) -> int:
    """Elements per token of a decoder layer's widest tensor: a fused gate/up output (``2 x intermediate``),
    the attention's projected queries (heads x head_dim) or the hidden state."""
    return max(2 * (a.intermediate_size or 0), a.num_heads * a.head_dim, a.hidden_size)


def context_bytes(backend: str, target_context: int | None = None) -> int:
    """Memory the runtime holds outside PyTorch's allocator (CUDA/ROCm context)."""
    if target_context is not None:
        return target_context
    return DEFAULT_CONTEXT_MIB[backend] * MIB


def reserve_bytes(backend: str, live_tensors: int, transient_bytes: int, stranded: int = 0) -> int:
    """What the caching allocator holds beyond the allocated peak: the rounding of the live tensors, the
    fragmentation share of the short-lived bytes, and ``stranded``, how far the reading at the loss with the
    layer blocks cached beside it stands above the peak (`stranded_layer_blocks`). The last two add up: on
    the H200 runs (tests/data/measured/, docs/methodology.md "Real-GPU runs") checkpointed LoRA and QLoRA
    steps held 0.10-0.26 of their short-lived bytes beyond that margin; the larger of the two (session 19)
    left every checkpointed row's reserved figure short, to -11.4%."""
    if backend not in allocator.BACKENDS:
        return 0
    return live_tensors * ROUNDING_PER_TENSOR + int(FRAGMENTATION * transient_bytes) + stranded
