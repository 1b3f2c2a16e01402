"""``kbit_prep``: whether peft's ``prepare_model_for_kbit_training`` ran on a bitsandbytes k-bit base.

Under ``hf`` the default is TRL 1.16.0's SFTTrainer, which never calls it and casts a k-bit model's adapters
to bf16 (engine/regimes.py ``SRC_TRL_KBIT``); ``--kbit-prep`` is peft's documented recipe (every
non-quantized parameter fp32, fp32 adapters). The other trainers' code decides it (``KBIT_PREP_DEFAULT``)."""

from __future__ import annotations

import json

import pytest

from fitcheck.cli import main
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import KBIT_PREP_DEFAULT, kbit_prep, regime_for
from fitcheck.engine.states import counts
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model


def _get(est, phase: str, name: str) -> int:  # type: ignore[no-untyped-def]
    return sum(c.bytes for c in est.phase(phase).components if c.name == name)


@pytest.mark.parametrize(
    ("trainer", "prepared", "upcast", "adapters"),
    [
        ("hf", False, False, "bf16"),  # TRL 1.16.0 SFTTrainer: no preparation, adapters cast to bf16
        ("axolotl", True, False, "fp32"),  # prepared, then norms and embeddings cast back to the load dtype
        ("llamafactory", False, False, "fp32"),  # never calls it; cast_trainable_params_to_fp32
        ("unsloth", False, False, "fp32"),  # its own preparation keeps the load dtype
    ],
)
def test_default_per_trainer(trainer: str, prepared: bool, upcast: bool, adapters: str) -> None:
    setup = LlmSetup(method="qlora", trainer=trainer)  # type: ignore[arg-type]
    assert kbit_prep(setup) is prepared
    assert KBIT_PREP_DEFAULT.get(trainer, False) is prepared
    r = regime_for(setup)
    assert (r.kbit_upcast, r.adapter_dtype) == (upcast, adapters)


def test_only_a_kbit_base_is_prepared() -> None:
    assert not kbit_prep(LlmSetup(method="lora", trainer="hf", kbit_prep=True))
    assert not kbit_prep(LlmSetup(method="lora", base_quant="gptq", trainer="hf", kbit_prep=True))
    assert kbit_prep(LlmSetup(method="lora", base_quant="int8", trainer="hf", kbit_prep=True))
    # a 16-bit LoRA run is the same with either value
    plain = regime_for(LlmSetup(method="lora", trainer="hf"))
    assert regime_for(LlmSetup(method="lora", trainer="hf", kbit_prep=False)) == plain


def test_prepared_estimate_drops_by_the_fp32_upcast_exactly() -> None:
    """Without peft's preparation (TRL's default) the non-quantized weights keep bf16 (2 B each, not 4) and
    the adapters are bf16 (2 B, not 4): the resident weights drop by exactly those bytes."""
    spec = resolve_model("llama-3.1-8b")
    kw: dict[str, object] = {"method": "qlora", "trainer": "hf", "grad_ckpt": True}
    trl = LlmSetup(**kw)  # type: ignore[arg-type]
    peft = LlmSetup(**kw, kbit_prep=True)  # type: ignore[arg-type]
    c = counts(spec.arch, trl)
    dense = c.base - c.quantized
    a, b = estimate(spec, peft), estimate(spec, trl)
    for phase in ("forward", "optimizer_step"):
        unquantized = _get(a, phase, "weights_unquantized") - _get(b, phase, "weights_unquantized")
        assert unquantized == dense * (4 - 2)
        assert _get(a, phase, "adapters") - _get(b, phase, "adapters") == c.adapter * (4 - 2)
        assert _get(a, phase, "weights_4bit") == _get(b, phase, "weights_4bit")
    assert dense == spec.arch.vocab_size * spec.arch.hidden_size * 2 + _norms(spec)
    assert b.peak_allocated_bytes < a.peak_allocated_bytes - dense * 2


def _norms(spec) -> int:  # type: ignore[no-untyped-def]
    """Llama's RMSNorm weights: two per layer and the final one (untied embedding and lm_head above)."""
    return (2 * spec.arch.num_layers + 1) * spec.arch.hidden_size


def _json(args: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    rc = main(["estimate", "llama-3.1-8b", "--method", "qlora", "--on", "rtx-4090", "-f", "json", *args])
    out, err = capsys.readouterr()
    assert rc == 0, err
    doc: dict[str, object] = json.loads(out)
    return doc


def test_the_field_through_cli_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    default = _json(["--trainer", "hf"], capsys)
    on = _json(["--trainer", "hf", "--kbit-prep"], capsys)
    off = _json(["--trainer", "hf", "--no-kbit-prep"], capsys)
    assert [d["setup"]["kbit_prep"] for d in (default, on, off)] == [None, True, False]  # type: ignore[index]
    assert on["regime"]["kbit_upcast"] and not default["regime"]["kbit_upcast"]  # type: ignore[index]
    assert default["peak_allocated_bytes"] == off["peak_allocated_bytes"]
    assert on["peak_allocated_bytes"] > default["peak_allocated_bytes"]  # type: ignore[operator]
    # axolotl's own value is accepted, the other refused with one line and exit 2
    assert _json(["--trainer", "axolotl", "--kbit-prep"], capsys)["setup"]["kbit_prep"] is True  # type: ignore[index]
    rc = main(["estimate", "llama-3.1-8b", "--method", "qlora", "--trainer", "axolotl", "--no-kbit-prep"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert err.startswith("fitcheck: error: --no-kbit-prep: axolotl decides its own k-bit preparation")


def test_trl_reader_notes_the_default(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "sft.yaml"
    cfg.write_text(
        "model_name_or_path: meta-llama/Llama-3.1-8B\nuse_peft: true\nload_in_4bit: true\nbf16: true\n"
    )
    rc = main(["estimate", "llama-3.1-8b", "--from", str(cfg), "--from-format", "trl", "--on", "rtx-4090"])
    _, err = capsys.readouterr()
    assert rc in (0, 1), err
    assert "cannot say whether a script calls peft's prepare_model_for_kbit_training" in err


def test_hf_yaml_refuses_a_prepared_plan(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """``trl sft`` cannot run peft's preparation, so a --kbit-prep plan is not emitted as hf.yaml."""
    out = tmp_path / "run.hf.yaml"
    base = ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--method", "qlora", "--trainer", "hf"]
    base += ["--emit", str(out)]
    assert main([*base, "--kbit-prep"]) == 2 and not out.exists()
    assert "never calls prepare_model_for_kbit_training" in capsys.readouterr().err
    for path in ("trl-legacy", "none", "peft"):
        assert main([*base, "--kbit-path", path]) == 2 and not out.exists()
        assert "casts the adapters to bf16" in capsys.readouterr().err
    assert main([*base, "--kbit-path", "trl"]) == 0 and out.exists()


def test_the_warning_says_which_k_bit_path_the_estimate_took() -> None:
    spec = resolve_model("llama-3.1-8b")
    base = {"method": "qlora", "trainer": "hf"}
    default = estimate(spec, LlmSetup(**base, grad_ckpt=True)).warnings
    assert any("follows TRL's SFTTrainer" in w and "--kbit-prep" in w for w in default)
    prepared = estimate(spec, LlmSetup(**base, grad_ckpt=True, kbit_prep=True)).warnings
    assert not any("SFTTrainer" in w or "turns gradient checkpointing on" in w for w in prepared)
    no_ckpt = estimate(spec, LlmSetup(**base, grad_ckpt=False, kbit_prep=True)).warnings
    assert any("turns gradient checkpointing on" in w for w in no_ckpt)
    said = estimate(spec, LlmSetup(**base, grad_ckpt=True, kbit_prep=False)).warnings
    assert not any("SFTTrainer" in w for w in said)  # the user chose the path: nothing to say


# --- kbit_path: the four hf paths (engine/regimes.py SRC_TRL_LEGACY, SRC_PLAIN_KBIT, SRC_TRL_KBIT) ---------


def _path(path: str, **kw: object) -> LlmSetup:
    return LlmSetup(method="qlora", trainer="hf", grad_ckpt=True, kbit_path=path, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("path", "prepared", "upcast", "norms", "adapters"),
    [
        ("peft", True, True, False, "fp32"),
        ("trl-legacy", True, False, True, "fp32"),
        ("none", False, False, False, "fp32"),
        ("trl", False, False, False, "bf16"),
    ],
)
def test_each_path_regime(path: str, prepared: bool, upcast: bool, norms: bool, adapters: str) -> None:
    setup = _path(path)
    assert kbit_prep(setup) is prepared
    r = regime_for(setup)
    assert (r.kbit_upcast, r.kbit_norms_fp32, r.adapter_dtype) == (upcast, norms, adapters)


def test_kbit_prep_is_an_alias_of_the_two_end_paths() -> None:
    spec = resolve_model("llama-3.1-8b")
    kw: dict[str, object] = {"method": "qlora", "trainer": "hf", "grad_ckpt": True}
    for prep, path in ((True, "peft"), (False, "trl"), (None, "trl")):
        a = estimate(spec, LlmSetup(**kw, kbit_prep=prep))  # type: ignore[arg-type]
        b = estimate(spec, LlmSetup(**kw, kbit_path=path))  # type: ignore[arg-type]
        assert a.peak_allocated_bytes == b.peak_allocated_bytes


def test_trl_legacy_casts_back_exactly_the_embeddings_and_lm_head() -> None:
    """TRL 0.9-0.25 casts lm_head and embed_tokens (fp32 after peft's preparation) back to bf16 and leaves the
    norms fp32: the resident unquantized weights are peft's less 2 B per embedding / lm_head parameter, and a
    plain script's plus 2 B per norm parameter; the adapters are fp32 in all three."""
    spec = resolve_model("llama-3.1-8b")
    c = counts(spec.arch, _path("trl"))
    v, h = spec.arch.vocab_size, spec.arch.hidden_size
    peft, legacy, plain, trl = (estimate(spec, _path(p)) for p in ("peft", "trl-legacy", "none", "trl"))
    for phase in ("forward", "optimizer_step"):
        w = [_get(e, phase, "weights_unquantized") for e in (peft, legacy, plain, trl)]
        assert w[0] - w[1] == 2 * v * h * (4 - 2)
        assert w[1] - w[2] == _norms(spec) * (4 - 2)
        assert w[2] == w[3]
        ad = [_get(e, phase, "adapters") for e in (peft, legacy, plain, trl)]
        assert ad[0] == ad[1] == ad[2] == ad[3] + c.adapter * (4 - 2)
    # the fp32 norms keep the residual stream fp32 (from layer 0's MLP on; counted for every layer), so the
    # checkpointed layer inputs are fp32 as after peft's preparation, twice the plain script's bf16 ones
    ck = [_get(e, "backward", "checkpoints") for e in (peft, legacy, plain)]
    assert ck[0] == ck[1] == 2 * ck[2]
    # peft's fp32 lm_head is cast to bf16 for its autocast matmul and the copy saved; the bf16 one is not
    copies = [_get(e, "backward", "autocast_weight_copies") for e in (peft, legacy, plain)]
    assert copies == [v * h * 2, 0, 0]
    assert trl.peak_allocated_bytes < plain.peak_allocated_bytes < legacy.peak_allocated_bytes
    assert legacy.peak_allocated_bytes < peft.peak_allocated_bytes


@pytest.mark.parametrize(
    "kw",
    [{"precision": "fp16"}, {"autocast": False}],
)
def test_trl_legacy_without_bf16_keeps_the_full_upcast(kw: dict[str, object]) -> None:
    """peft_module_casting_to_bf16 runs only with args.bf16: fp16 or no mixed precision keeps the upcast."""
    spec = resolve_model("llama-3.1-8b")
    assert regime_for(_path("trl-legacy", **kw)).kbit_upcast
    a, b = estimate(spec, _path("trl-legacy", **kw)), estimate(spec, _path("peft", **kw))
    assert a.peak_allocated_bytes == b.peak_allocated_bytes


def test_trl_legacy_on_an_int8_base_keeps_the_full_upcast() -> None:
    """TRL casts back only a model is_loaded_in_4bit (trl v0.13.0 sft_trainer.py:228)."""
    setup = LlmSetup(method="lora", base_quant="int8", trainer="hf", kbit_path="trl-legacy")
    assert regime_for(setup).kbit_upcast and kbit_prep(setup)


def test_kbit_path_through_cli_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    doc = _json(["--trainer", "hf", "--kbit-path", "trl-legacy"], capsys)
    assert doc["setup"]["kbit_path"] == "trl-legacy"  # type: ignore[index]
    assert doc["regime"]["kbit_norms_fp32"] is True  # type: ignore[index]
    assert _json(["--trainer", "hf", "--kbit-path", "trl-legacy", "--kbit-prep"], capsys)["setup"][
        "kbit_prep"
    ]  # type: ignore[index]
    for bad, says in (
        (
            ["--trainer", "hf", "--kbit-path", "none", "--kbit-prep"],
            "--kbit-prep contradicts --kbit-path none",
        ),
        (["--trainer", "axolotl", "--kbit-path", "peft"], "--kbit-path: axolotl decides its own"),
    ):
        rc = main(["estimate", "llama-3.1-8b", "--method", "qlora", *bad])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and err.count("\n") == 1
        assert err.startswith("fitcheck: error: " + says)
