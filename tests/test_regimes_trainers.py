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


def test_litgpt_mixed_is_an_fp32_model_under_autocast(spec) -> None:  # type: ignore[no-untyped-def]
    """litgpt bf16-mixed (--master-weights): Fabric's MixedPrecision keeps the module fp32 and runs the
    forward under autocast, so the weights, grads and AdamW states are fp32 and autocast's bf16 casts of
    the trained weights are saved; bf16-true keeps everything bf16 with no casts."""
    true = LlmSetup(method="full", trainer="litgpt")
    mixed = true.model_copy(update={"master_weights": True})
    est_true, est_mixed = estimate(spec, true), estimate(spec, mixed)
    n = est_mixed.params.trainable
    assert _component(est_true, "optimizer_step", "weights") == 2 * n
    assert _component(est_mixed, "optimizer_step", "weights") == 4 * n
    assert _component(est_mixed, "optimizer_step", "gradients") == 4 * n
    assert _component(est_mixed, "optimizer_step", "optimizer_states") == 8 * n
    assert regime_for(mixed).autocast and not regime_for(true).autocast
    assert _component(est_mixed, "forward", "autocast_weight_copies") > 0
    assert all(
        c.name != "autocast_weight_copies" or not c.bytes for c in est_true.phase("forward").components
    )


def test_litgpt_fsdp_shards_follow_fabrics_precision(spec) -> None:  # type: ignore[no-untyped-def]
    """Fabric's FSDPPrecision builds the module in bf16 for bf16-true (module_init_context), in fp32 for
    bf16-mixed (gathered in bf16 under autocast): litgpt's trainable shards are 2 or 4 bytes per element,
    where the HF Trainer's accelerate upcasts them to fp32 whenever its mixed precision is on."""
    from fitcheck.engine.distributed import shard_bytes

    true = LlmSetup(method="full", trainer="litgpt", gpus=2, strategy="fsdp")
    assert shard_bytes(true) == 2
    assert shard_bytes(true.model_copy(update={"master_weights": True})) == 4
    assert shard_bytes(true.model_copy(update={"trainer": "hf"})) == 4
    assert regime_for(true.model_copy(update={"master_weights": True})).weight_dtype != "fp32"


@pytest.mark.parametrize(
    ("trainer", "method", "words"),
    [("torchtune", "full", "trains the model in the dtype it loads"), ("litgpt", "qlora", "mixed precision")],
)
def test_master_weights_refused_where_the_trainer_has_none(trainer: str, method: str, words: str) -> None:
    from fitcheck import api
    from fitcheck.errors import FitcheckError

    with pytest.raises(FitcheckError, match=words):
        api.estimate("llama-3.2-1b", method=method, trainer=trainer, master_weights=True)


def test_mlx_qlora_stores_embedding_and_head_in_affine_4bit(spec) -> None:  # type: ignore[no-untyped-def]
    """mlx_lm.convert quantizes every Linear, the lm_head and the embedding (group 64, a 16-bit scale and
    bias per group: 0.5625 B/param), and MLX's quantized matmul dequantizes no weight whole."""
    from fitcheck.engine import nf4
    from fitcheck.engine.params import inventory

    setup = LlmSetup(method="qlora", trainer="mlx", double_quant=False)
    est = estimate(spec, setup)
    c = counts(spec.arch, setup)
    inv = inventory(spec.arch)
    n = c.quantized + inv.embedding + inv.lm_head
    assert _component(est, "optimizer_step", "weights_4bit") == n // 2 + 4 * -(-n // nf4.MLX_GROUP)
    assert all(x.bytes == 0 for p in est.phases for x in p.components if x.name == "dequant_transient")
    assert regime_for(setup).nf4_format == "mlx"
    # LoRA on a 16-bit model and the other trainers' QLoRA keep their layouts
    assert regime_for(LlmSetup(method="lora", trainer="mlx")).nf4_format == "bitsandbytes"
    assert regime_for(LlmSetup(method="qlora", trainer="hf")).nf4_format == "bitsandbytes"
