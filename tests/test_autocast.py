"""Training without autocast (``--no-autocast``, setup ``autocast: false``): the option through every LLM
path, and what it changes in the regime and the activations (docs/methodology.md, "Training without
autocast"). The traced records in tests/data/calibration hold the rules to transformers + peft."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fitcheck import api
from fitcheck.engine.activations import context
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import AUTOCAST_TRAINERS, regime_for
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model

LORA = {"trainer": "hf", "precision": "fp16", "lora_rank": 32, "lora_targets": "q_proj,k_proj,v_proj,o_proj"}


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return resolve_model("smollm2-360m")


def test_default_is_the_trainers_own() -> None:
    for trainer in ("hf", "generic", "torchtune", "mlx", "litgpt"):
        setup = LlmSetup(trainer=trainer)  # type: ignore[arg-type]
        assert regime_for(setup) == regime_for(setup.model_copy(update={"autocast": None}))
    assert regime_for(LlmSetup(trainer="hf")).autocast


@pytest.mark.parametrize("trainer", AUTOCAST_TRAINERS)
def test_no_autocast_keeps_the_dtypes_and_drops_autocast(trainer: str) -> None:
    for method in ("full", "lora", "qlora"):
        setup = LlmSetup(trainer=trainer, method=method, precision="fp16")  # type: ignore[arg-type]
        on, off = regime_for(setup), regime_for(setup.model_copy(update={"autocast": False}))
        assert on.autocast and not off.autocast
        same = ("weight_dtype", "trainable_dtype", "adapter_dtype", "grad_dtype", "optimizer_state_dtype")
        assert all(getattr(on, k) == getattr(off, k) for k in same)
        assert off.name == on.name and "no autocast" in off.description and "no torch.autocast" in off.source


def test_no_autocast_changes_nothing_where_there_is_none() -> None:
    for trainer in ("generic", "torchtune", "mlx", "litgpt"):
        setup = LlmSetup(trainer=trainer, method="lora")  # type: ignore[arg-type]
        assert regime_for(setup) == regime_for(setup.model_copy(update={"autocast": False}))


def test_lora_saves_fp32_input_copies_per_wrapped_module(spec) -> None:  # type: ignore[no-untyped-def]
    """Under autocast each adapted projection saves a 16-bit cast of its input; without it, an fp32
    copy (peft ``_cast_input_dtype``): 2 more bytes per input element and wrapped module."""
    a = spec.arch
    setup = LlmSetup(**LORA, batch_size=1, seq_len=512)  # type: ignore[arg-type]
    on = estimate(spec, setup)
    off = estimate(spec, setup.model_copy(update={"autocast": False}))
    extra = a.num_layers * 512 * 2 * (3 * a.hidden_size + a.num_heads * a.head_dim)
    acts = [sum(c.bytes for c in e.phase("forward").components if c.name == "activations") for e in (on, off)]
    assert acts[1] - acts[0] == pytest.approx(extra, rel=0.01)


def test_qlora_runs_an_fp32_stream_without_autocast() -> None:
    """After prepare_model_for_kbit_training the embeddings and norms are fp32 and bitsandbytes returns
    its input's dtype: every activation is fp32 without autocast, the compute dtype with it."""
    setup = LlmSetup(trainer="hf", method="qlora", precision="fp16", kbit_prep=True)
    assert context(setup, regime_for(setup)).gamma == 2
    off = setup.model_copy(update={"autocast": False})
    assert context(off, regime_for(off)).gamma == 4
    lora = LlmSetup(trainer="hf", method="lora", precision="fp16", autocast=False)
    assert context(lora, regime_for(lora)).gamma == 2


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        ({"autocast": False, "master_weights": True, "trainer": "hf"}, "--no-autocast: --master-weights"),
        ({"autocast": True, "trainer": "mlx"}, "--autocast: mlx"),
        ({"autocast": True, "trainer": "hf", "precision": "fp32"}, "--autocast: --precision fp32"),
    ],
)
def test_contradictions_are_refused(opts: dict[str, object], words: str) -> None:
    with pytest.raises(OptionError, match=words):
        api.estimate("smollm2-360m", on="none", **opts)  # type: ignore[arg-type]


def test_diffusion_refuses_it() -> None:
    with pytest.raises(OptionError, match="--autocast applies to LLMs"):
        api.estimate("sd15", on="none", autocast=False)


def test_cli_echoes_it_and_exits_2_on_a_contradiction(capsys) -> None:  # type: ignore[no-untyped-def]
    from fitcheck.cli import app, main

    runner = CliRunner()
    base = ["estimate", "smollm2-360m", "--on", "none", "-f", "json", "--trainer", "hf"]
    for flag, value in (([], None), (["--no-autocast"], False), (["--autocast"], True)):
        res = runner.invoke(app, [*base, *flag])
        assert res.exit_code == 0, res.output
        doc = json.loads(res.stdout)
        assert doc["setup"]["autocast"] is value and doc["setup"]["keep_logits"] is False
        assert doc["regime"]["autocast"] is (value is not False)
    doc = json.loads(runner.invoke(app, [*base, "--keep-logits"]).stdout)
    assert doc["setup"]["keep_logits"] is True
    code = main([*base, "--no-autocast", "--master-weights"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fitcheck: error: --no-autocast") and err.count("\n") == 1


def test_plan_keeps_it_and_reproduces_it() -> None:
    plan = api.plan("smollm2-360m", on="24GB", trainer="hf", method="full", precision="fp16", autocast=False)
    assert plan.chosen is not None and plan.chosen.setup.autocast is False
    assert not plan.chosen.setup.master_weights  # no fp32-with-autocast plan without autocast


def test_traced_records_without_autocast_hold_the_rules() -> None:
    """The calibration grid traces runs without autocast (bench/calibrate.py EXTRA; held within 3% phase
    by phase by tests/test_calibration.py), LoRA fp16 and full bf16 among them, and they tell the rules
    apart: posed with autocast, the engine misses at least one of them by more than 3%."""
    from test_calibration import RECORDS, _estimate

    recs = [r for r in RECORDS if r["setup"].get("autocast") is False]
    assert {(r["setup"]["method"], r["setup"]["precision"]) for r in recs} >= {
        ("lora", "fp16"),
        ("full", "bf16"),
    }
    worst = 0.0
    for rec in recs:
        posed = _estimate({**rec, "setup": {**rec["setup"], "autocast": None}})
        for phase in rec["measured"]["phases"]:
            worst = max(worst, abs(posed.phase(phase["name"]).total_bytes / phase["peak_bytes"] - 1))
    assert worst > 0.03


def test_keep_logits_holds_the_output_through_backward_and_step(spec) -> None:  # type: ignore[no-untyped-def]
    """A loop that keeps ``out`` holds b x s x vocab logits in their dtype until the step is done (traced:
    calibration llama2-20); HF Trainer drops them with the forward; Liger / CCE never make them."""
    setup = LlmSetup(**LORA, batch_size=2, seq_len=512, autocast=False)  # type: ignore[arg-type]
    tv = 2 * 512 * spec.arch.vocab_size
    off, on = estimate(spec, setup), estimate(spec, setup.model_copy(update={"keep_logits": True}))
    held = [c.bytes for c in on.phase("optimizer_step").components if c.name == "held_logits"]
    assert held == [tv * 2]
    assert on.phase("optimizer_step").total_bytes - off.phase("optimizer_step").total_bytes == tv * 2
    assert on.phase("forward").total_bytes == off.phase("forward").total_bytes
    assert on.phase("backward").total_bytes > off.phase("backward").total_bytes
    assert any(c.name == "held_logits" for c in on.phase("backward").components)
    fused = setup.model_copy(update={"keep_logits": True, "loss": "liger"})
    assert all(c.name != "held_logits" for p in estimate(spec, fused).phases for c in p.components)


def test_fp32_logits_have_no_upcast_copy(spec) -> None:  # type: ignore[no-untyped-def]
    """``logits.float()`` on fp32 logits returns the tensor itself: 8 B per entry at the forward's end
    (logits, fp32 log-softmax), against 10 for 16-bit logits (traced: calibration llama2-21)."""
    tv = 512 * spec.arch.vocab_size
    for precision, per_entry in (("fp32", 8), ("bf16", 10)):
        est = estimate(spec, LlmSetup(trainer="hf", method="full", precision=precision, seq_len=512))  # type: ignore[arg-type]
        assert (
            sum(c.bytes for c in est.phase("forward").components if c.name == "logits_loss") == tv * per_entry
        )


def test_trl_config_with_both_flags_off_reads_as_no_autocast(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """HF Trainer with ``bf16: false, fp16: false`` on a model loaded in bf16 trains in pure bf16 (no AMP)."""
    from fitcheck.readers import read_config

    path = tmp_path / "sft.yaml"
    base = "model_name_or_path: HuggingFaceTB/SmolLM2-360M\ndtype: bfloat16\nuse_peft: true\n"
    path.write_text(base + "bf16: false\nfp16: false\n", encoding="utf-8")
    values = read_config(str(path), "trl").values
    assert values["autocast"] is False and values["precision"] == "bf16"
    path.write_text(base + "bf16: true\n", encoding="utf-8")
    assert "autocast" not in read_config(str(path), "trl").values


def test_hf_emitter_writes_both_flags_off_and_others_refuse(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from fitcheck.cli import main

    out = tmp_path / "run.hf.yaml"
    args = ["plan", "smollm2-360m", "--on", "24GB", "--method", "lora", "--no-autocast", "-o", str(tmp_path)]
    assert main([*args, "--trainer", "hf", "--emit", out.name]) == 0
    text = out.read_text(encoding="utf-8")
    assert "\nbf16: false" in text and "\nfp16: false" in text and "--no-autocast" in text
    assert main([*args, "--trainer", "axolotl", "--emit", "run.axolotl.yaml"]) == 2
    # pure fp16 full fine-tuning: no GradScaler without autocast, so no fp32-weights refusal
    full = [
        "plan",
        "smollm2-360m",
        "--on",
        "24GB",
        "--method",
        "full",
        "--precision",
        "fp16",
        "--no-autocast",
    ]
    assert main([*full, "--trainer", "hf", "-o", str(tmp_path), "--emit", "full.hf.yaml", "--force"]) == 0
    assert 'dtype: "float16"' in (tmp_path / "full.hf.yaml").read_text(encoding="utf-8")
