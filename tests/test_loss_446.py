"""``--loss hf-4.46``: transformers 4.46.0 through 4.48.3's ``ForCausalLMLoss`` (``loss/loss_utils.py``
lines 32-47 at 4.46.0, 32-48 at 4.48.1): ``logits = logits.float()`` beside the compute-dtype logits the
model returns, ``shift_logits = logits[..., :-1, :].contiguous()`` (a second fp32 copy), then
``cross_entropy``. 4.49.0 pads the labels instead (no logits copy: ``standard``). The tracer runs
transformers 5, so these tests redo the arithmetic by hand from that code (docs/methodology.md, "Logits
and loss")."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from fitcheck.cli import app
from fitcheck.engine import loss
from fitcheck.engine.activations import context
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model

FP32 = 4
BF16 = 2
B, S, V = 2, 1024, 128256  # Llama 3 vocabulary
TV = B * S * V


def _setup(**kw: object) -> LlmSetup:
    base: dict[str, object] = {"method": "lora", "batch_size": B, "seq_len": S, "trainer": "hf"}
    return LlmSetup(**{**base, **kw})  # type: ignore[arg-type]


def _hump(model: str = "llama-3.1-8b", **kw: object) -> loss.Hump:
    setup = _setup(**kw)
    regime = regime_for(setup)
    return loss.hump(resolve_model(model).arch, setup, regime, context(setup, regime).gamma)


def test_forward_holds_the_output_its_fp32_copy_the_shifted_copy_and_the_log_softmax() -> None:
    output = BF16  # self.lm_head(h): returned as CausalLMOutputWithPast.logits, alive in the caller
    upcast = FP32  # logits.float() inside ForCausalLMLoss
    shifted = FP32  # logits[..., :-1, :].contiguous(): the slice is not contiguous, so a copy
    log_softmax = FP32  # cross_entropy's log-softmax output, saved for backward
    h = _hump(loss="hf-4.46")
    assert h.forward == TV * (output + upcast + shifted + log_softmax)
    assert h.saved == TV * log_softmax
    # one shifted fp32 copy more than the later form, and the bf16 output more than the legacy one
    assert h.forward - _hump(loss="standard").forward == TV * shifted
    assert h.forward - _hump(loss="hf-legacy").forward == TV * output


def test_backward_as_the_legacy_loss() -> None:
    # both copies are ForCausalLMLoss's locals and die when it returns; the backward runs the slice's and
    # then the cast's backward, as before 4.46
    h = _hump(loss="hf-4.46")
    legacy = _hump(loss="hf-legacy")
    assert h.backward == legacy.backward == TV * 3 * FP32
    assert h.at_head == legacy.at_head == TV * (FP32 + BF16)


def test_fp32_logits_have_no_upcast_copy_but_the_shifted_one() -> None:
    # QLoRA without autocast after prepare_model_for_kbit_training: lm_head fp32, .float() returns itself
    h = _hump(loss="hf-4.46", method="qlora", autocast=False, kbit_prep=True)
    assert h.forward == TV * 3 * FP32
    assert h.at_head == TV * FP32


def test_gemma2_soft_cap_is_outside_the_loss() -> None:
    # Gemma2ForCausalLM.forward (4.48.1 lines 858-865) applies tanh before self.loss_function
    cap = _hump("gemma-2-9b", loss="hf-4.46")
    tv = B * S * resolve_model("gemma-2-9b").arch.vocab_size
    tanh_out = BF16
    assert cap.forward == tv * (BF16 + 3 * FP32 + tanh_out)
    assert cap.backward == tv * (3 * FP32 + tanh_out)


def test_held_output_is_in_the_compute_dtype() -> None:
    spec = resolve_model("llama-3.1-8b")
    est = estimate(spec, _setup(loss="hf-4.46", keep_logits=True))
    bwd = next(p for p in est.phases if p.name == "backward")
    held = next(int(c.bytes) for c in bwd.components if c.name == "held_logits")
    assert held == TV * BF16


def test_estimate_grows_by_the_shifted_copy_at_most() -> None:
    spec = resolve_model("llama-3.1-8b")
    new = estimate(spec, _setup(loss="hf-4.46")).peak_allocated_bytes
    old = estimate(spec, _setup(loss="standard")).peak_allocated_bytes
    assert old < new <= old + TV * FP32


def test_cli_accepts_and_echoes_hf_446() -> None:
    args = ["estimate", "llama-3.1-8b", "--method", "lora", "--loss", "hf-4.46", "--format", "json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    assert doc["setup"]["loss"] == "hf-4.46"
    rules = [c["rule"] for p in doc["phases"] for c in p["components"] if c["name"] == "logits_loss"]
    assert any("shifted fp32 copy" in r for r in rules)
