"""What the model is trained for: which stack sees which tokens, and how wide the output layer is.

* ``causal-lm`` (decoders): every token through the decoder, logits over the vocabulary for every
  token. ``--image-tokens N`` (multimodal models) lengthens each example's sequence by the N image
  tokens the vision tower and projector put into it.
* ``classification`` (encoders; also decoders, as ``*ForSequenceClassification``): every token
  through the stack, then one pooled row per example into ``num_labels`` logits: no vocabulary hump.
  Encoders get a pooler (a dense h x h) before the classifier; decoders a bias-free ``score`` layer.
* ``seq2seq`` (T5): the source (``--seq-len``) through the encoder, the target (``--target-len``,
  default the source length) through the decoder, whose layers also attend to the encoder output
  (cross-attention); logits over the vocabulary for every target token.

Rules and sources: docs/methodology.md, "Tasks".
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.engine import activations as act
from fitcheck.engine.params import LayerKind, kind_layer_params
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup, ModelSpec, Regime
from fitcheck.vocab import Task

#: transformers' default for ``num_labels`` (PretrainedConfig: two labels).
DEFAULT_LABELS = 2


@dataclass(frozen=True)
class TaskShape:
    """Token counts of one micro-batch under a task."""

    task: Task
    seq_len: int  # tokens per example through the decoder (or the only) stack
    tokens: int  # batch x seq_len
    logit_rows: int  # rows entering the output layer: every token (LM) or one per example
    logit_width: int  # vocabulary or labels
    encoder_seq: int = 0  # encoder-decoder: source tokens per example
    encoder_tokens: int = 0


def model_task(a: DecoderArch) -> Task:
    """The task a model's architecture is built for."""
    return {"decoder": "causal-lm", "encoder": "classification", "encoder_decoder": "seq2seq"}[a.structure]  # type: ignore[return-value]


def check_task(a: DecoderArch, setup: LlmSetup) -> Task:
    """The task of this run, refusing combinations the architecture cannot train."""
    task = setup.task or model_task(a)
    if a.structure == "encoder" and task != "classification":
        raise OptionError(f"{a.model_type} is an encoder: use --task classification (with --num-labels)")
    if a.structure == "encoder_decoder" and task != "seq2seq":
        raise OptionError(f"{a.model_type} is an encoder-decoder: use --task seq2seq (with --target-len)")
    if a.structure == "decoder" and task == "seq2seq":
        raise OptionError(
            f"{a.model_type} is a decoder-only model: --task seq2seq needs an encoder-decoder (T5)"
        )
    if setup.num_labels is not None and task != "classification":
        raise OptionError("--num-labels applies to --task classification")
    if setup.target_len is not None and task != "seq2seq":
        raise OptionError("--target-len applies to --task seq2seq (encoder-decoder models)")
    if setup.image_tokens and not a.extra_params:
        raise OptionError(f"--image-tokens applies to multimodal models; {a.model_type} has no vision tower")
    return task


def with_task_head(spec: ModelSpec, setup: LlmSetup) -> ModelSpec:
    """The spec with the output layer the task trains: ``num_labels`` logits for classification."""
    task = check_task(spec.arch, setup)
    a = spec.arch
    if task == "classification":
        labels = setup.num_labels or a.num_labels or DEFAULT_LABELS
        a = a.model_copy(update={"num_labels": labels})
    elif a.num_labels:
        a = a.model_copy(update={"num_labels": 0})
    return spec if a is spec.arch else spec.model_copy(update={"arch": a})


def task_shape(a: DecoderArch, setup: LlmSetup) -> TaskShape:
    """How many tokens each stack and the output layer see."""
    task = setup.task or model_task(a)
    b = setup.batch_size
    if task == "seq2seq":
        tgt = setup.target_len or setup.seq_len
        return TaskShape(task, tgt, b * tgt, b * tgt, a.vocab_size, setup.seq_len, b * setup.seq_len)
    seq = setup.seq_len + setup.image_tokens
    if task == "classification":
        return TaskShape(task, seq, b * seq, b, a.num_labels or DEFAULT_LABELS)
    return TaskShape(task, seq, b * seq, b * seq, a.vocab_size)


def scale_logits(lg: dict[str, float], a: DecoderArch, shape: TaskShape) -> dict[str, float]:
    """Per-token logits bytes (`activations.logits_bytes`, vocabulary-wide for every token) rescaled so
    that ``tokens x value`` covers the rows and width this task's output layer really has."""
    factor = (shape.logit_rows * shape.logit_width) / (shape.tokens * a.vocab_size)
    return {k: v * factor for k, v in lg.items()}


def encoder_stack_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, shape: TaskShape) -> float:
    """Encoder-decoder: what the encoder stack keeps for backward (its layers on the source tokens, or
    one checkpoint per layer), plus what the decoder's cross-attention keeps: per decoder layer the
    source-side K and V as the attention kernel saves them and, per target token, the query side
    (norm input, q input and output, attention output and its projection's input); the encoder output
    feeding every K/V projection is one tensor."""
    if a.structure != "encoder_decoder":
        return 0.0
    c = act.context(setup, regime)
    h, q_w, kv_w = a.hidden_size, a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    src, n_dec = shape.encoder_seq, a.num_layers
    encoder = encoder_saved_bytes(a, setup, regime, shape)
    eager = act.uses_eager_scores(a, setup)
    per_target: float = 4 * h + act.normed_bytes(a, c) * h + c.gamma * (2 * q_w + q_w) + 4 * a.num_heads
    per_target += a.num_heads * (4 + c.gamma) * src if eager else 0
    if act.sdpa_position_bias(a, setup) and setup.padded_batches:
        # cross-attention's zero bias is made once (1 x heads x t x s); a padded source makes it a
        # per-layer b x heads x t x s mask (`position_bias_mask_bytes`)
        per_target += act.position_bias_mask_bytes(a, setup, c) * src
    cross = shape.tokens * n_dec * per_target + shape.encoder_tokens * (
        n_dec * c.gamma * 2 * kv_w + c.rho * h
    )
    return encoder + cross


def encoder_saved_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, shape: TaskShape) -> float:
    """Encoder-decoder: what the encoder's layers keep for backward (their saved tensors on the source
    tokens, or one checkpoint per layer); alive until the encoder's own backward, after the decoder's."""
    if a.structure != "encoder_decoder":
        return 0.0
    c = act.context(setup, regime)
    if setup.grad_ckpt:
        return float(shape.encoder_tokens * a.encoder_layers * c.rho * a.hidden_size)
    layer = act.layer_activations(a, setup, regime)
    return shape.encoder_tokens * a.encoder_layers * layer.total(shape.encoder_seq)


def encoder_layer_params(a: DecoderArch) -> int:
    """Parameters of the encoder stack's layers (linears and norms): their gradients do not exist yet
    when the decoder's backward ends."""
    if a.structure != "encoder_decoder":
        return 0
    return a.encoder_layers * kind_layer_params(a, LayerKind(a.encoder_layers, False, "encoder"))
