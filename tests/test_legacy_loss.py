"""``--loss hf-legacy``: the loss transformers computed inside ``LlamaForCausalLM.forward`` before
``loss_function`` (4.37.2 ``models/llama/modeling_llama.py`` lines 1201-1215; 4.45.2 lines 1214-1229;
4.46.0 calls ``self.loss_function``). The tracer runs transformers 5, so these tests redo the arithmetic
by hand from that code: every tensor it makes, its dtype and when it dies (docs/methodology.md,
"Logits and loss")."""

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
B, S, V = 4, 2048, 32000  # Llama 2 vocabulary
TV = B * S * V


def _setup(**kw: object) -> LlmSetup:
    base: dict[str, object] = {"method": "lora", "batch_size": B, "seq_len": S, "trainer": "hf"}
    return LlmSetup(**{**base, **kw})  # type: ignore[arg-type]


def _hump(**kw: object) -> loss.Hump:
    setup = _setup(**kw)
    regime = regime_for(setup)
    return loss.hump(resolve_model("llama-2-7b").arch, setup, regime, context(setup, regime).gamma)


def test_forward_holds_fp32_logits_their_shifted_copy_and_the_log_softmax() -> None:
    # logits = self.lm_head(h) (bf16), logits = logits.float(): the bf16 output loses its only reference
    # (ToCopyBackward saves no tensor), so the forward holds, at CrossEntropyLoss's log-softmax:
    returned = FP32  # logits.float(), returned as CausalLMOutputWithPast.logits
    shifted = FP32  # logits[..., :-1, :].contiguous(): a copy (the slice is not contiguous)
    log_softmax = FP32  # saved for nll_loss / log-softmax backward
    h = _hump(loss="hf-legacy")
    assert h.forward == TV * (returned + shifted + log_softmax)
    assert h.saved == TV * log_softmax
    # the cast itself (bf16 source beside its fp32 copy) is a smaller moment
    assert h.forward > TV * (BF16 + FP32)


def test_backward_start_is_the_log_softmax_and_its_two_gradients() -> None:
    # the shifted copy died with forward's locals (log-softmax saves its output, not its input); the
    # loss backward holds the saved log-softmax, nll_loss's gradient and the log-softmax input gradient
    h = _hump(loss="hf-legacy")
    assert h.backward == TV * 3 * FP32
    # the lm_head's backward: ToCopyBackward's bf16 gradient beside the fp32 one it was cast from
    assert h.at_head == TV * (FP32 + BF16)


def test_fp32_lm_head_makes_no_cast_but_the_same_forward() -> None:
    # QLoRA without autocast: prepare_model_for_kbit_training leaves lm_head fp32, .float() is a no-op
    h = _hump(loss="hf-legacy", method="qlora", autocast=False, kbit_prep=True)
    assert h.forward == TV * 3 * FP32
    assert h.at_head == TV * FP32


def test_held_output_is_fp32_under_the_legacy_loss() -> None:
    spec = resolve_model("llama-2-7b")

    def held(kernel: str) -> int:
        est = estimate(spec, _setup(loss=kernel, keep_logits=True))
        bwd = next(p for p in est.phases if p.name == "backward")
        return next(int(c.bytes) for c in bwd.components if c.name == "held_logits")

    assert held("hf-legacy") == TV * FP32
    assert held("standard") == TV * BF16  # transformers 5 returns the lm_head output as made


def test_cli_accepts_and_echoes_hf_legacy() -> None:
    args = ["estimate", "llama-2-7b", "--method", "lora", "--loss", "hf-legacy", "--format", "json"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code in (0, 1), res.output
    doc = json.loads(res.stdout)
    assert doc["setup"]["loss"] == "hf-legacy"
