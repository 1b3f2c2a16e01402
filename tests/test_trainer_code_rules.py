"""Rules read from trainers' and libraries' code for the published-corpus gap (docs/methodology.md,
"Adapters" and "Trainers: litgpt and Unsloth"): each test pins the exact bytes a rule adds."""

from __future__ import annotations

import pytest

from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import model_as_trained, regime_for
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import spec_from_preset


def _acts(model: str, **kw: object) -> float:
    """Saved bytes per token of one layer."""
    spec = spec_from_preset(model)
    setup = LlmSetup(**kw)  # type: ignore[arg-type]
    return act.layer_activations(spec.arch, setup, regime_for(setup)).total(setup.seq_len)


def test_litgpt_unties_a_tied_head() -> None:
    spec = spec_from_preset("llama-3.2-1b")
    assert spec.arch.tie_embeddings
    a = spec.arch
    hf = estimate(spec, LlmSetup(trainer="hf", method="lora", seq_len=512))
    lit = estimate(spec, LlmSetup(trainer="litgpt", method="lora", seq_len=512))
    assert lit.params.total - hf.params.total == a.vocab_size * a.hidden_size
    assert any("untied" in w for w in lit.warnings)
    assert model_as_trained(spec, LlmSetup(trainer="hf")) == spec


def test_untied_model_is_unchanged_under_litgpt() -> None:
    spec = spec_from_preset("llama-2-7b")
    assert model_as_trained(spec, LlmSetup(trainer="litgpt")) == spec


def test_peft_dropout_adds_one_mask_byte_per_wrapped_input() -> None:
    """HF regime (autocast, fp32 adapters): lora_A saves its bf16 cast either way; dropout adds the mask."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"trainer": "hf", "method": "lora", "lora_targets": "q_proj,k_proj,v_proj,o_proj"}
    diff = _acts("llama-3.1-8b", lora_dropout=0.05, **kw) - _acts("llama-3.1-8b", **kw)
    assert diff == 3 * a.hidden_size + a.num_heads * a.head_dim  # q, k, v read h; o reads heads x head_dim


def test_litgpt_dropout_is_one_per_fused_qkv() -> None:
    """litgpt (no autocast, bf16 adapters): the shared bf16 input gives way to one dropout output + mask."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"trainer": "litgpt", "method": "lora", "lora_targets": "q_proj,v_proj"}
    diff = _acts("llama-3.1-8b", lora_dropout=0.05, **kw) - _acts("llama-3.1-8b", **kw)
    assert diff == a.hidden_size  # (2 + 1) h for the one dropout, minus the 2 h shared input


@pytest.mark.parametrize(
    ("trainer", "method", "holds"),
    [
        ("litgpt", "qlora", True),
        ("litgpt", "lora", False),
        ("hf", "qlora", False),
        ("unsloth", "qlora", False),
    ],
)
def test_which_runs_hold_4bit_inputs(trainer: str, method: str, holds: bool) -> None:
    assert act.holds_4bit_inputs(LlmSetup(trainer=trainer, method=method)) is holds  # type: ignore[arg-type]


def test_old_bitsandbytes_holds_every_quantized_projection_input(monkeypatch: pytest.MonkeyPatch) -> None:
    """bitsandbytes < 0.43.2 MatMul4Bit: o_proj's, the MLP's and down_proj's inputs stay alive (q/v LoRA
    already saves the attention input)."""
    a = spec_from_preset("llama-2-7b").arch
    kw = {"trainer": "litgpt", "method": "qlora", "lora_targets": "q_proj,v_proj"}
    held = _acts("llama-2-7b", **kw)
    monkeypatch.setattr(act, "BNB_HOLDS_INPUT_TRAINERS", ())
    free = _acts("llama-2-7b", **kw)
    assert held - free == 2 * (a.num_heads * a.head_dim + a.hidden_size + a.intermediate_size)


def test_litgpt_saves_grouped_kv_at_every_head() -> None:
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"method": "lora", "lora_targets": "q_proj,v_proj", "lora_rank": 8}
    diff = _acts("llama-3.1-8b", trainer="litgpt", **kw) - _acts("llama-3.1-8b", trainer="torchtune", **kw)
    assert diff == 2 * 2 * (a.num_heads - a.num_kv_heads) * a.head_dim
