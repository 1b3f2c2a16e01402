"""Encoder and encoder-decoder layers held to real CPU training steps of transformers' own models (the
fake-tensor tracer builds causal LMs only): eager attention's dropout on its probabilities (BERT, RoBERTa,
DeBERTa-v2, T5), DeBERTa's disentangled attention and ConvLayer, T5 v1.1's gated gelu_new.

Saved tensors are counted with autograd's saved-tensor hooks (`_saved_bytes`). CPU dropout multiplies by
float noise (ATen ``_dropout_impl``: a 4-byte mask) where CUDA's fused ``native_dropout`` keeps a bool
(1 byte), the engine's figure: a test either takes the 3 bytes per masked element off the CPU count or
runs dropout through CUDA's path (`fitcheck.measure.step.cuda_dropout`).
"""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import spec_from_config

B, S, H, HEADS, LAYERS = 4, 256, 512, 8, 4
SAVED = ("inputs", "activations", "attention_scores", "attention_mask", "final_norm", "logits_loss")


def _bert(drop: float) -> dict[str, Any]:
    return {"model_type": "bert", "hidden_size": H, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "intermediate_size": 4 * H, "vocab_size": 30522, "max_position_embeddings": 512,
            "attention_probs_dropout_prob": drop, "hidden_dropout_prob": 0.1}  # fmt: skip


def _saved_bytes(model: Any, run: Any, cuda_masks: bool = False) -> int:
    """Bytes of the distinct storages autograd saves in ``run()`` (a forward of ``model``), parameters
    excepted, read with saved-tensor hooks; ``cuda_masks``: dropout takes CUDA's fused path (a bool mask,
    `fitcheck.measure.step.cuda_dropout`) instead of CPU's float noise."""
    import contextlib

    import torch

    from fitcheck.measure.step import cuda_dropout

    sizes: dict[int, int] = {}

    def pack(t: Any) -> Any:
        st = t.untyped_storage()
        sizes[st.data_ptr()] = max(sizes.get(st.data_ptr(), 0), st.nbytes())
        return t

    masks = cuda_dropout() if cuda_masks else contextlib.nullcontext()
    with masks, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(v for k, v in sizes.items() if k not in params)


def _saved_on_cpu(cfg: dict[str, Any]) -> int:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config = tf.BertConfig(**{k: v for k, v in cfg.items() if k != "model_type"}, attn_implementation="eager")
    model = tf.BertForSequenceClassification(config).train()
    ids = torch.randint(100, 1000, (B, S))
    return _saved_bytes(model, lambda: model(input_ids=ids, labels=torch.zeros(B, dtype=torch.long)))


def _engine(cfg: dict[str, Any]) -> int:
    setup = LlmSetup(method="full", seq_len=S, batch_size=B, attn="eager", precision="fp32",
                     task="classification", trainer="hf")  # fmt: skip
    est = estimate(spec_from_config(dict(cfg), id="bert", name="bert", source="test"), setup)
    return sum(c.bytes for c in est.phase("forward").components if c.name in SAVED)


@pytest.mark.parametrize("drop", [0.1, 0.0])
def test_bert_eager_saved_tensors(drop: float) -> None:
    cfg = _bert(drop)
    cpu_extra = 3 * B * S * H * 2 * LAYERS  # the two hidden-dropout masks per layer
    if drop:
        cpu_extra += 3 * B * HEADS * S * S * LAYERS  # the attention-probability mask
    want = _saved_on_cpu(cfg) - cpu_extra
    got = _engine(cfg)
    assert abs(got - want) <= 0.04 * want, (got, want)


def test_dropout_adds_its_mask_and_output() -> None:
    """fp32: 4 (softmax output) without dropout; 4 + 1 (mask) + 4 (dropout output) with it."""
    per_pair = B * HEADS * S * S * LAYERS
    assert _engine(_bert(0.1)) - _engine(_bert(0.0)) == 5 * per_pair


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_t5_dropout_counts_only_where_eager_code_runs(attn: str) -> None:
    """T5 under SDPA (transformers 5) hands its position bias to the kernel, which draws the dropout itself:
    nothing more; its eager code (transformers 4.x, or --attn eager) keeps the mask and the output."""
    base = {"model_type": "t5", "d_model": 256, "d_ff": 512, "num_layers": 2, "num_heads": 4, "d_kv": 64,
            "vocab_size": 32128}  # fmt: skip

    def scores(rate: float) -> int:
        setup = LlmSetup(method="full", seq_len=128, batch_size=2, attn=attn, target_len=128)
        spec = spec_from_config({**base, "dropout_rate": rate}, id="t5", name="t5", source="t")
        est = estimate(spec, setup)
        return sum(c.bytes for c in est.phase("forward").components if c.name == "attention_scores")

    if attn == "sdpa":
        assert scores(0.1) == scores(0.0)
    else:
        assert scores(0.1) > scores(0.0)


def _deberta(drop: float) -> dict[str, Any]:
    """DeBERTa-v3's shape, small: disentangled attention (c2p and p2c), shared position keys, 256 buckets."""
    return {"model_type": "deberta-v2", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 1024, "vocab_size": 1000, "max_position_embeddings": 512,
            "relative_attention": True, "position_buckets": 256, "norm_rel_ebd": "layer_norm",
            "share_att_key": True, "pos_att_type": ["p2c", "c2p"], "position_biased_input": False,
            "type_vocab_size": 0, "attention_probs_dropout_prob": drop, "hidden_dropout_prob": 0.0,
            "max_relative_positions": -1}  # fmt: skip


@pytest.mark.parametrize("drop", [0.1, 0.0])
def test_deberta_disentangled_attention_saved_tensors(drop: float) -> None:
    """DeBERTa-v2/v3 has no SDPA path: its eager attention keeps the probabilities (and dropout's), and
    each relative term's gather keeps its whole b x heads x s x 2 span input (torch's gather backward takes
    the input), the position keys repeated per sequence and the clamped s x s index."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    b, s = 2, 256
    cfg = _deberta(drop)
    torch.manual_seed(0)
    model = tf.DebertaV2ForSequenceClassification(
        tf.DebertaV2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    ).train()
    ids = torch.randint(100, 1000, (b, s))
    want = _saved_bytes(model, lambda: model(input_ids=ids, labels=torch.zeros(b, dtype=torch.long)), True)
    setup = LlmSetup(
        method="full", seq_len=s, batch_size=b, precision="fp32", task="classification", trainer="hf"
    )
    est = estimate(spec_from_config(dict(cfg), id="deberta", name="deberta", source="test"), setup)
    got = sum(c.bytes for c in est.phase("forward").components if c.name in SAVED)
    assert abs(got - want) <= 0.03 * want, (got, want)


@pytest.mark.parametrize("proj", ["gated-gelu", "relu"])
@pytest.mark.parametrize("drop", [0.0, 0.1])
def test_t5_mlp_saved_tensors(proj: str, drop: float) -> None:
    """T5 v1.1's gated-gelu runs gelu_new (T5Config), whose Python tanh formula keeps three tensors
    more than a one-op activation; T5 v1.0's ReLU saves its output, which is wo's input unless the
    dropout between them runs (then its mask and its output): the encoder-decoder step against a real
    CPU step, dropout through CUDA's path."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    b, s, t = 4, 256, 4
    cfg = {"model_type": "t5", "d_model": 256, "d_ff": 1024, "num_layers": 2, "num_heads": 4, "d_kv": 64,
           "vocab_size": 1000, "feed_forward_proj": proj, "dropout_rate": drop,
           "tie_word_embeddings": False}  # fmt: skip
    config = tf.T5Config(**{k: v for k, v in cfg.items() if k != "model_type"}, attn_implementation="eager")
    config.decoder_start_token_id = config.pad_token_id = 0
    torch.manual_seed(0)
    model = tf.T5ForConditionalGeneration(config).train()
    ids, labels = torch.randint(5, 1000, (b, s)), torch.randint(5, 1000, (b, t))
    want = _saved_bytes(model, lambda: model(input_ids=ids, labels=labels), cuda_masks=True)
    setup = LlmSetup(method="full", seq_len=s, target_len=t, batch_size=b, precision="fp32", attn="eager")
    est = estimate(spec_from_config(dict(cfg), id="t5", name="t5", source="test"), setup)
    states = ("weights", "optimizer_states", "gradients")
    got = sum(c.bytes for c in est.phase("forward").components if c.name not in states)
    assert abs(got - want) <= 0.03 * want, (got, want)


def test_deberta_conv_layer_counted() -> None:
    """DeBERTa-v2 xlarge / xxlarge's ConvLayer (``conv_kernel_size`` 3): its parameters exactly, and what
    it saves once, outside the layers (a real CPU step with CUDA's dropout path, `cuda_dropout`)."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    from fitcheck.engine.params import count_params

    b, s = 2, 256
    cfg = {**_deberta(0.1), "hidden_dropout_prob": 0.1, "conv_kernel_size": 3, "conv_act": "gelu"}
    torch.manual_seed(0)
    model = tf.DebertaV2ForSequenceClassification(
        tf.DebertaV2Config(**{k: v for k, v in cfg.items() if k != "model_type"})
    ).train()
    spec = spec_from_config(dict(cfg), id="deberta", name="deberta", source="test")
    assert count_params(spec.arch) == sum(p.numel() for p in model.parameters())
    want = _saved_bytes(
        model,
        lambda: model(input_ids=torch.randint(5, 1000, (b, s)), labels=torch.zeros(b, dtype=torch.long)),
        cuda_masks=True,
    )
    setup = LlmSetup(
        method="full", seq_len=s, batch_size=b, precision="fp32", task="classification", trainer="hf"
    )
    est = estimate(spec, setup)
    states = ("weights", "optimizer_states", "gradients")
    got = sum(c.bytes for c in est.phase("forward").components if c.name not in states)
    assert any(c.name == "conv_layer" and c.bytes > 0 for c in est.phase("forward").components)
    assert abs(got - want) <= 0.03 * want, (got, want)
