"""Four rules held to the tracer (bench/arch_trace.py and checkpointed / eager sweeps of it found them):

* Cohere's LayerNorm is Python in fp32 (engine/activations.py ``PY_LAYERNORM_TYPES``): each norm keeps two
  fp32 ``x - mean`` tensors, and the normalized fp32 tensor too when its weight trains. Counted as
  ``F.layer_norm``'s one saved input before, Cohere was 2.4% (LoRA) / 3.4% (full) under its trace at
  h = 1024.
* Types whose transformers configuration has no ``num_key_value_heads`` (sources/hf_config.py
  ``MHA_ONLY_TYPES``) ignore a stray key of that name: GPT-NeoX was 5% under its trace with one.
* Under gradient checkpointing a MoE layer's experts merged with their LoRA factors (peft's
  ``ParamWrapper`` on transformers 5's 3-D experts) are a saved tensor of the checkpointed forward, dropped
  when the layer ends: none is alive at the loss, and the peaks are inside a layer, with the gradient of the
  merged down projection in its backward (engine/estimate.py ``_merged_experts``, docs/methodology.md#moe).
  Counted as one layer's copy at the loss before, checkpointed Mixtral LoRA was 8% over its trace at
  h = 1024 and 9% under at the real shape.
* Falcon's eager attention runs softmax in the hidden states' dtype (engine/activations.py
  ``INPUT_DTYPE_SOFTMAX``): counted as an fp32 softmax before, full fine-tuning was 11% over its trace.
"""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup
from fitcheck.sources.hf_config import MHA_ONLY_TYPES
from fitcheck.sources.resolve import spec_from_config

COHERE: dict[str, Any] = {
    "model_type": "cohere", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "pad_token_id": 0,
}  # fmt: skip
NEOX: dict[str, Any] = {
    "model_type": "gpt_neox", "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2000, "pad_token_id": 0,
}  # fmt: skip


def _near_trace(cfg: dict[str, Any], setup: LlmSetup) -> list[tuple[str, float]]:
    """(phase, relative error of the estimate) for forward and backward."""
    from fitcheck.measure.trace import trace_step

    measured = trace_step(dict(cfg), setup)
    est = estimate(spec_from_config(dict(cfg), id="t", name="t", source="test"), setup)
    out = []
    for phase in measured.phases:
        if phase.name in ("forward", "backward"):
            got = est.phase(phase.name).total_bytes
            out.append((phase.name, (got - phase.peak_bytes) / phase.peak_bytes))
    return out


@pytest.mark.parametrize("method", ["full", "lora"])
def test_cohere_python_layernorm_near_its_trace(method: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    setup = LlmSetup(method=method, seq_len=512, batch_size=2, lora_targets="all-linear")
    # before the rule, at this shape: full -9.4% / -9.2%, LoRA -6.5% / -5.5%; now full +1.2%, LoRA +4.8% /
    # +5.5%: under LoRA the first layer's norm reads the frozen embedding's output, which needs no
    # gradient, so it saves nothing there, where the engine counts every layer alike (a quarter of this
    # 4-layer model; 2.2% over at h = 1024, bench/arch_trace.py)
    high = 0.03 if method == "full" else 0.06
    for phase, err in _near_trace(COHERE, setup):
        assert -0.01 <= err <= high, (phase, err)


def test_mha_only_types_ignore_a_stray_kv_head_count() -> None:
    for model_type in ("gpt_neox", "gptj", "bloom", "opt", "gpt2"):
        assert model_type in MHA_ONLY_TYPES
    spec = spec_from_config(dict(NEOX), id="neox", name="neox", source="test")
    assert spec.arch.num_kv_heads == spec.arch.num_heads == 8
    gqa = spec_from_config({**COHERE}, id="cohere", name="cohere", source="test")
    assert gqa.arch.num_kv_heads == 2  # a type that reads the key keeps it


def test_gpt_neox_with_a_stray_kv_key_near_its_trace() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    setup = LlmSetup(method="full", seq_len=512, batch_size=2)
    for phase, err in _near_trace(NEOX, setup):
        assert abs(err) <= 0.03, (phase, err)  # +1.6% now; -10.5% before (the fused qkv read a third as wide)


MIXTRAL: dict[str, Any] = {
    "model_type": "mixtral", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 2,
    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "pad_token_id": 0,
    "num_local_experts": 4, "num_experts_per_tok": 2,
}  # fmt: skip


def test_checkpointed_moe_lora_holds_no_merged_experts_at_the_loss() -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    setup = LlmSetup(method="lora", seq_len=512, batch_size=2, lora_targets="all-linear", grad_ckpt=True)
    for phase, err in _near_trace(MIXTRAL, setup):
        assert abs(err) <= 0.02, (phase, err)


FALCON: dict[str, Any] = {
    "model_type": "falcon", "hidden_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
    "vocab_size": 2000, "pad_token_id": 0,
}  # fmt: skip


@pytest.mark.parametrize("method", ["full", "lora"])
def test_falcon_eager_softmax_in_the_hidden_dtype_near_its_trace(method: str) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    setup = LlmSetup(method=method, seq_len=512, batch_size=2, attn="eager", lora_targets="all-linear")
    # before, at this shape: full +27%, LoRA +45% (an fp32 softmax counted); now +2.2% and +4.5% / +5.6%
    # (LoRA: the first-layer overcount of test_cohere_python_layernorm_near_its_trace, on 2 layers)
    high = 0.03 if method == "full" else 0.06
    for phase, err in _near_trace(FALCON, setup):
        assert -0.01 <= err <= high, (phase, err)
