"""Regimes of the trainers fitcheck plan emits for: axolotl, LLaMA-Factory, mlx-lm (engine/regimes.py)."""

from __future__ import annotations

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.engine.states import counts
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return resolve_model("llama-3.2-1b")


def _component(est, phase: str, name: str) -> int:  # type: ignore[no-untyped-def]
    return next(c.bytes for c in est.phase(phase).components if c.name == name)


def test_axolotl_is_hf_except_qlora_upcast(spec) -> None:  # type: ignore[no-untyped-def]
    for method in ("full", "lora"):
        hf = estimate(spec, LlmSetup(method=method, trainer="hf"))
        axo = estimate(spec, LlmSetup(method=method, trainer="axolotl"))
        assert axo.device_bytes == hf.device_bytes
    setup = LlmSetup(method="qlora", trainer="axolotl")
    est = estimate(spec, setup)
    c = counts(spec.arch, setup)
    dense = c.total - c.adapter - c.quantized
    assert _component(est, "optimizer_step", "weights_unquantized") == dense * 2  # bf16, not fp32
    assert regime_for(setup).name == "axolotl (hf)"  # measure's clip rule keys on the (hf) suffix


def test_llamafactory_full_is_amp_fp32_trainables(spec) -> None:  # type: ignore[no-untyped-def]
    setup = LlmSetup(method="full", trainer="llamafactory")
    est = estimate(spec, setup)
    n = est.params.trainable
    assert _component(est, "optimizer_step", "weights") == 4 * n
    assert _component(est, "optimizer_step", "gradients") == 4 * n
    amp = estimate(spec, LlmSetup(method="full", trainer="hf", master_weights=True))
    assert est.device_bytes == amp.device_bytes


def test_llamafactory_lora_keeps_base_in_compute_dtype(spec) -> None:  # type: ignore[no-untyped-def]
    setup = LlmSetup(method="lora", trainer="llamafactory")
    est = estimate(spec, setup)
    c = counts(spec.arch, setup)
    assert _component(est, "optimizer_step", "weights_frozen") == (c.total - c.adapter) * 2
    assert _component(est, "optimizer_step", "adapters") == c.adapter * 4
    assert not regime_for(LlmSetup(method="qlora", trainer="llamafactory")).kbit_upcast


def test_mlx_regime(spec) -> None:  # type: ignore[no-untyped-def]
    lora = regime_for(LlmSetup(method="lora", trainer="mlx"))
    assert (lora.adapter_dtype, lora.grad_dtype, lora.autocast) == ("fp32", "fp32", False)
    full = regime_for(LlmSetup(method="full", trainer="mlx", precision="fp16"))
    assert (full.trainable_dtype, full.grad_dtype, full.optimizer_state_dtype) == ("fp16", "fp16", "param")
    est = estimate(spec, LlmSetup(method="full", trainer="mlx"))
    n = est.params.trainable
    assert _component(est, "optimizer_step", "optimizer_states") == 2 * 2 * n  # AdamW m, v in bf16
