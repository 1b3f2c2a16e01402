"""The tracer builds the run's task head (session 12): ``*ForSequenceClassification`` for encoders,
``*ForSeq2SeqLM`` for T5, as the engine estimates them (before, every config was built as a causal LM:
a BERT config was traced with a vocabulary-wide MLM head, -60% "error", and T5 could not be traced).
Held to the tracer here, T5's SDPA path (its position bias handed to CUDA's memory-efficient kernel,
one mask per layer), T5's own unshifted loss, the decoder-done moment of an encoder-decoder's backward
and gelu_new's fp32 output under autocast."""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")

BERT: dict[str, Any] = {
    "model_type": "bert", "hidden_size": 256, "intermediate_size": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512,
}  # fmt: skip
T5: dict[str, Any] = {
    "model_type": "t5", "d_model": 256, "d_ff": 704, "d_kv": 64, "num_heads": 4, "num_layers": 2,
    "vocab_size": 1000, "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False,
}  # fmt: skip


def _errors(cfg: dict[str, Any], setup: LlmSetup) -> dict[str, float]:
    from fitcheck.measure.trace import trace_step

    measured = trace_step(cfg, setup)
    spec = ModelSpec(id="t", name="t", source_kind="hf_config", arch=arch_from_hf_config(dict(cfg)))
    est = estimate(spec, setup)
    out = {}
    for phase in measured.phases[:2]:  # forward, backward
        got = sum(c.bytes for c in est.phase(phase.name).components)
        out[phase.name] = got / phase.peak_bytes - 1
    return out


def test_the_task_head_is_built() -> None:
    import torch

    from fitcheck.engine.regimes import regime_for
    from fitcheck.measure.build import build_model

    bert = LlmSetup(method="full", seq_len=64, batch_size=2, num_labels=3)
    t5 = LlmSetup(method="full", seq_len=64, target_len=16, batch_size=2)
    for cfg, setup, head, label_shape in (
        (BERT, bert, "BertForSequenceClassification", (2,)),
        (T5, t5, "T5ForConditionalGeneration", (2, 16)),
    ):
        with torch.device("meta"):
            built = build_model(cfg, setup, regime_for(setup))
        assert type(built.model).__name__ == head
        ids, labels = built.batch(setup, device="meta")
        assert tuple(ids.shape) == (2, 64) and tuple(labels.shape) == label_shape


CASES = {
    # T5 fp32 full: was -11.5% / -12.5% (math-kernel s^2 tensors traced; eager scores estimated)
    "t5-full-fp32": (
        T5,
        LlmSetup(method="full", precision="fp32", seq_len=512, target_len=128, batch_size=2),
    ),
    "t5-lora-bf16": (
        T5,
        LlmSetup(method="lora", lora_targets="attn", seq_len=512, target_len=64, batch_size=2),
    ),
    # the HF Trainer's autocast: gelu_new's fp32 pieces and output, fp32 cross-entropy (was -16%)
    "t5-hf-lora-eager": (
        T5,
        LlmSetup(
            method="lora",
            trainer="hf",
            attn="eager",
            lora_targets="all-linear",
            seq_len=256,
            target_len=64,
            batch_size=2,
        ),
    ),
    # the HF Trainer's autocast at 12 layers (at 2, the fp32 residual stream alive inside the last layer
    # outweighs the saved tensors: -13% forward)
    "bert12-hf-full": (
        dict(BERT, num_hidden_layers=12),
        LlmSetup(method="full", trainer="hf", seq_len=512, batch_size=8),
    ),
    # eager softmax in the scores' own dtype (BERT, T5 in transformers 5: no fp32 upcast): was +24% / +10%
    "bert-eager-bf16-lora": (
        dict(BERT, num_hidden_layers=6),
        LlmSetup(method="lora", attn="eager", seq_len=512, batch_size=4),
    ),
    "t5-eager-bf16-lora": (
        T5,
        LlmSetup(method="lora", attn="eager", seq_len=512, target_len=64, batch_size=2),
    ),
    # the last layer's working set (embedding output, fp32 residuals, feed-forward outputs): was -6.2%
    "bert12-hf-lora": (
        dict(BERT, num_hidden_layers=12),
        LlmSetup(method="lora", trainer="hf", lora_targets="attn", seq_len=512, batch_size=8),
    ),
    "bert12-hf-lora-eager": (
        dict(BERT, num_hidden_layers=12),
        LlmSetup(method="lora", trainer="hf", attn="eager", seq_len=512, batch_size=4),
    ),
    "bert-full-fp32-eager": (
        BERT,
        LlmSetup(method="full", precision="fp32", attn="eager", seq_len=256, batch_size=4),
    ),
}


#: Forward and backward within 5% (at these small shapes, session 12: T5 -4.0% to +0.7%, BERT fp32 +0.9% /
#: -4.0%; at hidden 768-1024 within 3%); before this session's rules -11% to -60%.
TOLERANCE = 0.05


@pytest.mark.parametrize("case", list(CASES))
def test_engine_near_the_task_trace(case: str) -> None:
    cfg, setup = CASES[case]
    errors = _errors(cfg, setup)
    assert all(abs(e) <= TOLERANCE for e in errors.values()), errors


#: Left as found (session 12), more than 5% under the trace: T5 full fine-tuning under the HF Trainer with
#: checkpointing at 2 layers per stack (forward -20%, backward -17%: the layer being run or recomputed
#: outweighs the checkpoints; at 12 layers +8% / -5%, after the recomputed encoder layer was sized on the
#: source tokens).
GAPS = {
    "t5-hf-full-ckpt": (
        T5,
        LlmSetup(method="full", trainer="hf", grad_ckpt=True, seq_len=512, target_len=128, batch_size=2),
    ),
}


@pytest.mark.xfail(strict=True, reason="autocast encoder / encoder-decoder gaps, docs/methodology.md 'Tasks'")
@pytest.mark.parametrize("case", list(GAPS))
def test_known_autocast_gaps(case: str) -> None:
    cfg, setup = GAPS[case]
    errors = _errors(cfg, setup)
    assert all(abs(e) <= TOLERANCE for e in errors.values()), errors


def test_measure_refuses_a_sequence_past_the_position_table() -> None:
    from fitcheck.measure.trace import trace_step

    with pytest.raises(OptionError, match="learned positions"):
        trace_step(BERT, LlmSetup(method="full", seq_len=1024, batch_size=1))


def test_one_label_traces_as_regression() -> None:
    """``--num-labels 1`` is transformers' regression (MSE on float labels): DeBERTa's own loss cast its
    logits to the labels' dtype and failed on integer labels (an internal error before session 12)."""
    from fitcheck.measure.trace import trace_step

    deberta = {
        "model_type": "deberta-v2", "hidden_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 256, "vocab_size": 500, "max_position_embeddings": 512,
        "relative_attention": True, "position_buckets": 32, "pos_att_type": ["p2c", "c2p"],
        "norm_rel_ebd": "layer_norm", "share_att_key": True, "position_biased_input": False,
    }  # fmt: skip
    for cfg in (BERT, deberta):
        measured = trace_step(cfg, LlmSetup(method="full", seq_len=64, batch_size=2, num_labels=1))
        assert measured.phase("forward").peak_bytes > 0
