"""SDPA's math kernel (engine/activations.py `sdpa_math`): fp32 attention inputs on a grouped-query model
under transformers' attention keep b x heads x s^2 fp32 probabilities per layer, as eager attention does
(measured on an H200: tests/data/measured/h200-threshold.yaml, h200-math.yaml)."""

from __future__ import annotations

import pytest

from fitcheck import api
from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import model_as_trained, regime_for
from fitcheck.models import LlmSetup

GQA = "qwen2.5-0.5b"  # 14 query heads over 2 K/V heads


def _setup(**kw: object) -> LlmSetup:
    base: dict[str, object] = {
        "method": "full",
        "trainer": "hf",
        "precision": "fp32",
        "batch_size": 2,
        "seq_len": 1024,
        "backend": "cuda",
    }
    return LlmSetup(**{**base, **kw})


def _math(model: str, setup: LlmSetup) -> bool:
    spec = model_as_trained(api.resolve(model), setup)
    return act.sdpa_math(spec.arch, setup, regime_for(setup))


def _scores(model: str, setup: LlmSetup) -> int:
    est = estimate(api.resolve(model), setup)
    return sum(c.bytes for c in est.phase(est.peak_phase).components if c.name == "attention_scores")


def test_fp32_grouped_query_attention_keeps_the_probabilities() -> None:
    """One fp32 b x heads x s^2 tensor per layer (the softmax output both matmuls read), with a warning."""
    setup = _setup()
    spec = api.resolve(GQA)
    assert _math(GQA, setup)
    a = spec.arch
    assert _scores(GQA, setup) == setup.batch_size * a.num_heads * setup.seq_len**2 * 4 * a.num_layers
    assert any("math kernel" in w for w in estimate(spec, setup).warnings)


@pytest.mark.parametrize(
    ("model", "change", "why"),
    [
        (GQA, {"precision": "bf16"}, "the flash kernel takes bf16"),
        (GQA, {"precision": "fp16"}, "the flash kernel takes fp16 (the math grid's control, -0.6%)"),
        ("gpt2-medium", {}, "equal K/V heads: the memory-efficient kernel takes fp32 (threshold grid)"),
        (GQA, {"attn": "eager"}, "eager attention is counted as eager"),
        (GQA, {"lengths": "varying"}, "a padding mask: repeat_kv and the memory-efficient kernel"),
        (GQA, {"backend": "mps"}, "MPS: every kernel counted as eager already"),
        (GQA, {"trainer": "litgpt"}, "litgpt expands K/V itself"),
        (GQA, {"method": "qlora", "precision": "bf16", "kbit_path": "peft", "autocast": False},
         "a k-bit base's fp32 stream: published runs show no s^2 term"),
    ],
)  # fmt: skip
def test_not_where_another_kernel_runs(model: str, change: dict[str, object], why: str) -> None:
    assert not _math(model, _setup(**change)), why


def test_lora_on_an_fp32_base_takes_it_too() -> None:
    """The math grid's Qwen2.5 0.5B and Mistral 7B LoRA rows on fp32 bases (allocated within 1%)."""
    assert _math(GQA, _setup(method="lora"))
    assert _math("mistral-7b-v0.1", _setup(method="lora"))


def test_an_fp32_run_is_offered_bf16() -> None:
    """The verdict's remedies for an fp32 run include bf16 mixed precision (half of every weight and
    activation; on a grouped-query model the flash kernel instead of the math one); not for a bf16 run."""
    from fitcheck.engine.verdict import candidate_changes

    flags = {flag: s for _, flag, s in candidate_changes(_setup())}
    assert flags["--precision bf16"].precision == "bf16"
    assert "--precision bf16" not in {flag for _, flag, _ in candidate_changes(_setup(precision="bf16"))}
    spec = api.resolve(GQA)
    saved = estimate(spec, _setup()).device_bytes - estimate(spec, flags["--precision bf16"]).device_bytes
    assert saved > _scores(GQA, _setup())  # the scores go, and half of everything else
