"""--task, --num-labels, --target-len, --image-tokens: the head, the stacks and the logits follow."""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine import tasks
from fitcheck.engine.estimate import estimate
from fitcheck.engine.lora import LORA_BREAKS
from fitcheck.engine.params import count_params
from fitcheck.errors import OptionError
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config
from fitcheck.sources.resolve import spec_from_config, spec_from_preset
from test_architectures import CASES, MM_CASES, NUM_LABELS, S


def _spec(model_type: str, cfg: dict[str, Any]) -> ModelSpec:
    return spec_from_config({"model_type": model_type, **cfg}, id=model_type, name=model_type, source="test")


def _component(est: Estimate, phase: str, name: str) -> int:
    return sum(c.bytes for c in est.phase(phase).components if c.name == name)


@pytest.mark.parametrize("model_type", sorted(CASES))
@pytest.mark.parametrize("method", ["full", "lora", "qlora"])
def test_every_type_estimates(model_type: str, method: str) -> None:
    _, cfg = CASES[model_type]
    # all-linear is refused where peft cannot run it (LORA_BREAKS: Phi-3.5-MoE's router)
    targets = "attn" if model_type in LORA_BREAKS and method != "full" else "all-linear"
    setup = LlmSetup(method=method, seq_len=64, batch_size=2, lora_targets=targets)
    est = estimate(_spec(model_type, cfg), setup)
    assert est.peak_allocated_bytes > 0
    assert all(c.bytes >= 0 for p in est.phases for c in p.components)
    acts = _component(est, "forward", "activations")
    assert acts > 0, "every layer saves something for backward"


@pytest.mark.parametrize(
    ("model_type", "setup", "match"),
    [
        ("bert", {"task": "causal-lm"}, "encoder"),
        ("t5", {"task": "causal-lm"}, "encoder-decoder"),
        ("llama", {"task": "seq2seq"}, "decoder-only"),
        ("llama", {"num_labels": 3}, "--num-labels"),
        ("llama", {"target_len": 64}, "--target-len"),
        ("llama", {"image_tokens": 64}, "no vision tower"),
    ],
)
def test_task_refusals(model_type: str, setup: dict[str, Any], match: str) -> None:
    _, cfg = CASES[model_type]
    with pytest.raises(OptionError, match=match):
        estimate(_spec(model_type, cfg), LlmSetup(**setup))


def test_decoder_classification_head_matches_transformers() -> None:
    tf = pytest.importorskip("transformers")
    torch = pytest.importorskip("torch")
    cfg = {**S, "tie_word_embeddings": False}
    est = estimate(_spec("llama", cfg), LlmSetup(method="full", task="classification", num_labels=NUM_LABELS))
    config = tf.AutoConfig.for_model("llama", **cfg, num_labels=NUM_LABELS)
    with torch.device("meta"):
        model = tf.AutoModelForSequenceClassification.from_config(config)
    assert est.params.total == sum(p.numel() for p in model.parameters())


def test_encoder_labels_change_the_head() -> None:
    _, cfg = CASES["bert"]
    two = estimate(_spec("bert", cfg), LlmSetup(method="full", num_labels=2))
    nine = estimate(_spec("bert", cfg), LlmSetup(method="full", num_labels=9))
    assert nine.params.total - two.params.total == 7 * (cfg["hidden_size"] + 1)


def test_classification_has_no_vocabulary_hump() -> None:
    spec = spec_from_preset("qwen2.5-0.5b")
    lm = estimate(spec, LlmSetup(seq_len=1024))
    cls = estimate(spec, LlmSetup(seq_len=1024, task="classification", num_labels=4))
    assert _component(lm, "forward", "logits_loss") > 1000 * _component(cls, "forward", "logits_loss")
    assert _component(lm, "forward", "activations") == _component(cls, "forward", "activations")


def test_seq2seq_source_and_target_lengths() -> None:
    """The logits follow the target length, the encoder the source length (the logits' own line, read
    where it is made: which moment of a phase is its peak depends on the shape)."""
    from fitcheck.engine.estimate import saved_activations
    from fitcheck.engine.regimes import regime_for

    _, cfg = CASES["t5"]
    spec = tasks.with_task_head(_spec("t5", cfg), LlmSetup(method="full"))

    def logits(**kw: Any) -> int:
        setup = LlmSetup(method="full", **kw)
        return saved_activations(spec, setup, regime_for(setup)).logits_fwd.bytes

    base = logits(seq_len=256, target_len=64)
    assert base > 0
    assert logits(seq_len=256, target_len=128) == 2 * base
    assert logits(seq_len=512, target_len=64) == base
    assert logits(seq_len=256) == 4 * base  # no --target-len: the target is seq_len long
    name = "encoder_and_cross_attention"
    short = estimate(_spec("t5", cfg), LlmSetup(method="full", seq_len=256, target_len=64))
    longer_source = estimate(_spec("t5", cfg), LlmSetup(method="full", seq_len=512, target_len=64))
    assert _component(longer_source, "forward", name) > _component(short, "forward", name) > 0


def test_t5_attention_is_eager_whatever_the_kernel() -> None:
    _, cfg = CASES["t5"]
    est = estimate(_spec("t5", cfg), LlmSetup(method="full", seq_len=128, attn="flash"))
    assert _component(est, "forward", "attention_scores") > 0


def test_image_tokens_lengthen_the_language_sequence() -> None:
    spec = spec_from_preset("gemma-3-4b")
    with_images = estimate(spec, LlmSetup(seq_len=512, image_tokens=256))
    longer = estimate(spec, LlmSetup(seq_len=768))
    assert with_images.peak_allocated_bytes == longer.peak_allocated_bytes
    assert spec.arch.extra_params > 400_000_000  # the SigLIP tower is held in memory


@pytest.mark.parametrize("model_type", sorted(MM_CASES))
def test_multimodal_types_take_image_tokens(model_type: str) -> None:
    spec = _spec(model_type, MM_CASES[model_type])
    est = estimate(spec, LlmSetup(seq_len=64, image_tokens=16))
    assert est.params.total >= count_params(
        arch_from_hf_config({"model_type": model_type, **MM_CASES[model_type]})
    )
