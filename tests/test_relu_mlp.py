"""A ReLU MLP (OPT) held to the tracer: ReLU saves its output, and with nothing between it and the down
projection that output is the projection's saved input, one tensor (engine/activations.py
``OUTPUT_SAVING_ACTIVATIONS``). The calibration grid has no ReLU family; before this rule the engine
counted the tensor twice (OPT forward +16% over its trace)."""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import spec_from_config

OPT: dict[str, Any] = {
    "model_type": "opt", "hidden_size": 256, "ffn_dim": 1024, "num_hidden_layers": 2,
    "num_attention_heads": 4, "vocab_size": 1000, "max_position_embeddings": 512,
    "word_embed_proj_dim": 256, "dropout": 0.0, "attention_dropout": 0.0,
}  # fmt: skip


LORA = LlmSetup(method="lora", seq_len=256, batch_size=4, precision="bf16", lora_targets="all-linear")


@pytest.mark.parametrize(
    ("setup", "tolerance"),
    [
        (LlmSetup(method="full", seq_len=256, batch_size=4, precision="fp32"), 0.03),
        # fc2's LoRA reads the ReLU output too. This tiny model's LoRA step stays over its trace, forward
        # +3.9% (about one hidden-width tensor per token and layer, not the MLP's) and backward +5.5%
        # (its 1000-token vocabulary's logits dominate): left as found
        (LORA, 0.06),
    ],
    ids=["full-fp32", "lora-all-linear-bf16"],
)
def test_opt_relu_mlp_near_its_trace(setup: LlmSetup, tolerance: float) -> None:
    """Before the rule: +16% (full) and +18% (LoRA on fc2) over the trace's forward and backward."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitcheck.measure.trace import trace_step

    measured = trace_step(OPT, setup)
    est = estimate(spec_from_config(dict(OPT), id="opt", name="opt", source="test"), setup)
    for phase in measured.phases:
        if phase.name == "optimizer_step":
            continue  # a 2M-parameter model's foreach temporaries; the grid holds that phase
        got = sum(c.bytes for c in est.phase(phase.name).components)
        want = phase.peak_bytes
        assert abs(got - want) <= tolerance * want, (phase.name, got, want)
