"""bitsandbytes < 0.43.2's kept 4-bit matmul inputs after the layer's backward (docs/methodology.md,
"bitsandbytes kept inputs"): what a custom autograd ``Function`` sets on its context outlives the backward
while the graph is referenced, and the engine counts it where the loop keeps the graph."""

from __future__ import annotations

import pytest

from fitcheck import api
from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate
from fitcheck.models import Estimate, LlmSetup

SPEC = api.resolve("llama-2-7b")


def _kept(est: Estimate, phase: str) -> int:
    return sum(c.bytes for c in est.phase(phase).components if c.name == "kept_quant_inputs")


def test_pytorch_frees_saved_tensors_not_context_attributes() -> None:
    """The semantics the rule rests on, on real torch (CPU): after backward a node's saved tensors are
    gone, a tensor kept as ``ctx.tensors`` (bitsandbytes' MatMul4Bit before 0.43.2) is not, and it goes
    only with the graph."""
    torch = pytest.importorskip("torch")

    class Kept(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):  # type: ignore[no-untyped-def]
            ctx.tensors = (a, w)
            return a @ w

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g @ ctx.tensors[1].t(), None

    class Saved(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, w):  # type: ignore[no-untyped-def]
            ctx.save_for_backward(a, w)
            return a @ w

        @staticmethod
        def backward(ctx, g):  # type: ignore[no-untyped-def]
            return g @ ctx.saved_tensors[1].t(), None

    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 3)
    kept_out = Kept.apply(x * 2, w)
    kept_out.sum().backward()
    a, _ = kept_out.grad_fn.tensors  # the node still holds the input the forward was given
    assert a.shape == (4, 8)
    saved_out = Saved.apply(x * 2, w)
    saved_out.sum().backward()
    with pytest.raises(RuntimeError):
        _ = saved_out.grad_fn.saved_tensors  # freed by the backward (release_variables)


def test_litgpt_loop_holds_the_previous_steps_inputs_in_forward() -> None:
    setup = LlmSetup(
        method="qlora", trainer="litgpt", bnb_keeps_input=True, batch_size=2, seq_len=512, grad_accum=4
    )
    est = estimate(SPEC, setup)
    per = act.kept_quant_input_bytes(SPEC.arch, setup, est.regime)
    assert per > 0 and act.graph_keeps_quant_inputs(setup) and act.loop_keeps_graph(setup)
    whole = 2 * 512 * SPEC.arch.num_layers * per
    assert _kept(est, "forward") == pytest.approx(whole, rel=1e-9)  # the previous step's, every layer
    assert _kept(est, "optimizer_step") == pytest.approx(whole, rel=1e-9)  # this step's, loop still holds it
    # longest first (Lit-GPT 2023 forces the longest example into the first iteration): none before it
    first = estimate(SPEC, setup.model_copy(update={"lengths": "longest-first"}))
    assert _kept(first, "forward") == 0
    assert first.phase("forward").total_bytes < est.phase("forward").total_bytes


@pytest.mark.parametrize(
    ("update", "forward"),
    [
        ({"trainer": "hf"}, False),  # training_step returns loss.detach()
        ({"bnb_keeps_input": False}, False),  # bitsandbytes >= 0.43.2 keeps nothing
        ({"grad_ckpt": True, "ckpt_reentrant": True}, False),  # no node outlives a reentrant forward
        ({"grad_ckpt": True, "ckpt_reentrant": False}, True),  # non-reentrant: every layer's, as without
        ({"method": "lora"}, False),  # no 4-bit matmul
        ({"bnb_keeps_input": None}, False),  # current litgpt: bitsandbytes >= 0.44
    ],
)
def test_where_the_kept_inputs_outlive_the_step(update: dict[str, object], forward: bool) -> None:
    base = {"method": "qlora", "trainer": "litgpt", "bnb_keeps_input": True, "batch_size": 2, "seq_len": 512}
    est = estimate(SPEC, LlmSetup(**{**base, **update}))  # type: ignore[arg-type]
    assert (_kept(est, "forward") > 0) is forward


def test_hf_trainer_graph_dies_with_its_step() -> None:
    """The HF Trainer's training_step returns loss.detach(): its graph keeps the inputs to the end of the
    backward only, never into the optimizer step or the next forward."""
    setup = LlmSetup(method="qlora", trainer="hf", bnb_keeps_input=True, seq_len=512)
    est = estimate(SPEC, setup)
    assert act.graph_keeps_quant_inputs(setup) and not act.loop_keeps_graph(setup)
    assert _kept(est, "forward") == 0 and _kept(est, "optimizer_step") == 0


def test_llm_int8_keeps_the_input_itself_in_every_release() -> None:
    """LoRA on an LLM.int8 base: MatMul8bitLt keeps its (uncast) input in every bitsandbytes release, so
    non-reentrant checkpointing (today's transformers default when unsaid) keeps every layer's, once per
    shared input in the input's own dtype; reentrant keeps none."""
    base = {"method": "lora", "base_quant": "int8", "grad_ckpt": True, "seq_len": 1024}
    setup = LlmSetup(**base)  # type: ignore[arg-type]
    assert act.held_inputs(setup) == "as-is" and act.every_layer_holds_4bit_inputs(setup)
    est = estimate(SPEC, setup)
    held = sum(c.bytes for c in est.phase("forward").components if c.name == "held_int8_inputs")
    a = SPEC.arch
    per = act.kept_quant_input_bytes(a, setup, est.regime)
    x = act.context(setup, est.regime).norm_out  # q/k/v (and gate/up) read the norm's output
    assert per >= x * (2 * a.hidden_size) and held == pytest.approx(1024 * a.num_layers * per, rel=1e-9)
    reentrant = estimate(SPEC, LlmSetup(**base, ckpt_reentrant=True))  # type: ignore[arg-type]
    assert not any(c.name == "held_int8_inputs" for p in reentrant.phases for c in p.components)
    assert reentrant.device_bytes < est.device_bytes
