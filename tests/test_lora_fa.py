"""LoRA-FA (``--lora-fa``): peft's create_lorafa_optimizer freezes every lora_A (src/peft/optimizers/lorafa.py
@01ee6424). The trace check is tests/test_measure_trace.py::test_lora_fa_trace_matches_the_engine."""

from __future__ import annotations

import pytest

from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import spec_from_preset

KW = {"method": "lora", "lora_rank": 16, "lora_targets": "q_proj,v_proj", "seq_len": 512}


def test_only_the_b_factors_train() -> None:
    spec = spec_from_preset("llama-3.1-8b")
    a = spec.arch
    lora = estimate(spec, LlmSetup(**KW))  # type: ignore[arg-type]
    fa = estimate(spec, LlmSetup(lora_fa=True, **KW))  # type: ignore[arg-type]
    frozen_a = a.num_layers * 2 * 16 * a.hidden_size  # r x h for q_proj and v_proj
    assert fa.params.adapter == lora.params.adapter
    assert lora.params.trainable - fa.params.trainable == frozen_a
    assert fa.params.frozen - lora.params.frozen == frozen_a


@pytest.mark.parametrize("dropout", [0.0, 0.05])
def test_a_frozen_lora_a_saves_no_input(dropout: float) -> None:
    """hf regime (autocast, fp32 adapters): each wrapped lora_A saves its bf16 cast (2 h) and, with
    dropout, the mask (h); LoRA-FA keeps only the masks."""
    a = spec_from_preset("llama-3.1-8b").arch
    parts = {}
    for fa in (False, True):
        setup = LlmSetup(trainer="hf", lora_dropout=dropout, lora_fa=fa, **KW)  # type: ignore[arg-type]
        parts[fa] = act.layer_activations(a, setup, regime_for(setup)).parts.get("qkv_inputs", 0.0)
    masks = 2 * a.hidden_size if dropout else 0
    assert parts[True] == masks
    assert parts[False] - parts[True] == 2 * 2 * a.hidden_size


@pytest.mark.parametrize("extra", [{"method": "full"}, {"dora": True}])
def test_refused_where_it_means_nothing(extra: dict[str, object]) -> None:
    spec = spec_from_preset("llama-3.2-1b")
    with pytest.raises(OptionError, match="--lora-fa"):
        estimate(spec, LlmSetup(**{**KW, "lora_fa": True, **extra}))  # type: ignore[arg-type]
