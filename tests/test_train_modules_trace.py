"""`--train-modules` in the tracer (session 21): `measure` builds them as peft's ``modules_to_save`` (trained
copies of the embedding / output layer in their module's dtype, the adapters in the regime's), and the
engine's lines hold against the trace, tied and untied."""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 4096, "tie_word_embeddings": False,
}  # fmt: skip


def _setup(train_modules: str) -> LlmSetup:
    return LlmSetup(method="lora", trainer="hf", train_modules=train_modules, seq_len=64, batch_size=2)


@pytest.mark.parametrize(
    ("tied", "modules"),
    [(False, "lm_head"), (False, "embed_tokens,lm_head"), (True, "embed_tokens,lm_head")],
)
def test_each_phase_within_3_percent_of_the_trace(tied: bool, modules: str) -> None:
    from fitcheck.measure.trace import trace_step

    cfg = {**LLAMA, "tie_word_embeddings": tied}
    setup = _setup(modules)
    measured = trace_step(cfg, setup)
    spec = ModelSpec(id="t", name="t", source_kind="hf_config", arch=arch_from_hf_config(dict(cfg)))
    est = estimate(spec, setup)
    for phase in measured.phases:
        got = sum(c.bytes for c in est.phase(phase.name).components)
        assert abs(got / phase.peak_bytes - 1) <= 0.03, (phase.name, got, phase.peak_bytes)


def test_the_copies_keep_their_dtype_and_train() -> None:
    """The copies are bf16 (the module's dtype) and trainable; the adapters fp32 (peft's upcast)."""
    import torch

    from fitcheck.engine.regimes import regime_for
    from fitcheck.measure.build import build_model

    setup = _setup("embed_tokens,lm_head")
    with torch.device("meta"):
        built = build_model(LLAMA, setup, regime_for(setup))
    trained = {n: p.dtype for n, p in built.model.named_parameters() if p.requires_grad}
    copies = {n: d for n, d in trained.items() if "modules_to_save" in n}
    assert len(copies) == 2 and set(copies.values()) == {torch.bfloat16}
    assert {d for n, d in trained.items() if "lora_" in n} == {torch.float32}
