"""The band around an estimate and the conservative verdict (issue 10): every boundary of the rule."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck import api
from fitcheck.cli import main
from fitcheck.engine.band import FIXED, KINDS, SPREAD, band, kind_bytes, kind_of, no_spread
from fitcheck.engine.verdict import high_bytes, judge, judge_bytes
from fitcheck.models import Band, Component, Phase
from fitcheck.units import GIB, MIB

# --- the rule, at each boundary ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "high", "budget", "expected"),
    [
        (10, 20, 20, "fits"),  # high exactly at the budget
        (10, 19, 20, "fits"),
        (10, 21, 20, "tight"),  # high one byte over, device under
        (20, 21, 20, "tight"),  # device exactly at the budget
        (21, 22, 20, "does_not_fit"),  # device one byte over
        (20, 20, 20, "fits"),  # no spread: fits up to the budget itself
        (21, 21, 20, "does_not_fit"),  # no spread: never tight
    ],
)
def test_judge_bytes_boundaries(device: int, high: int, budget: int, expected: str) -> None:
    assert judge_bytes(device, high, budget) == expected


@given(st.integers(0, 10**12), st.integers(0, 10**12), st.integers(0, 10**12))
def test_judge_bytes_is_conservative(device: int, extra: int, budget: int) -> None:
    high = device + extra
    v = judge_bytes(device, high, budget)
    assert (v == "fits") == (high <= budget)
    assert (v == "does_not_fit") == (device > budget)


def _phase(**parts: int) -> Phase:
    comps = tuple(Component(name=k, bytes=v, rule="", source="") for k, v in parts.items())
    return Phase(name="backward", components=comps, total_bytes=sum(parts.values()))


def test_kinds() -> None:
    assert kind_of("optimizer_states") == "states" and kind_of("unet_weights") == "states"
    assert kind_of("weights_4bit") == "quantized" and kind_of("dequant_transient") == "quantized"
    assert kind_of("activations") == "transient" and kind_of("merged_expert_weights") == "transient"
    parts = kind_bytes(_phase(weights=100, activations=50, weights_4bit=10), 7, 3)
    assert parts == {"states": 100, "quantized": 10, "transient": 60}
    # several GPUs: shards, partitions and gathered units are exact counts of kept tensors (states);
    # gradients of activations and the communicators are not
    for name in (
        "param_shards",
        "gradient_shards",
        "fp32_master_partition",
        "gathered_units",
        "ddp_grad_buckets",
    ):
        assert kind_of(name) == "states", name
    assert kind_of("activation_gradients") == "transient" and kind_of("nccl_communicators") == "transient"


def test_every_registered_component_has_the_kind_of_its_category() -> None:
    from fitcheck.components import REGISTRY

    kept = {"weights", "optimizer states", "gradients"}
    for name, row in REGISTRY.items():
        if kind_of(name) == "states":
            assert row.category in kept, name
        if kind_of(name) == "quantized":
            assert row.category in ("weights", "temporaries") and ("4bit" in name or "dequant" in name), name


def test_band_is_the_per_kind_spread() -> None:
    ph = _phase(weights=1000 * MIB, activations=400 * MIB, weights_4bit=200 * MIB)
    b = band(ph, 100 * MIB, 300 * MIB)
    device = ph.total_bytes + 400 * MIB
    transient = 800 * MIB
    up = round(1000 * MIB * SPREAD["states"][1]) + round(transient * SPREAD["transient"][1])
    up += round(200 * MIB * SPREAD["quantized"][1])
    down = round(1000 * MIB * SPREAD["states"][0]) + round(transient * SPREAD["transient"][0])
    down += round(200 * MIB * SPREAD["quantized"][0])
    up, down = up + FIXED[1], down + FIXED[0]  # the fixed bytes, once per estimate
    assert (b.low_bytes, b.high_bytes) == (device - down, device + up)
    assert "states" in b.basis and "published" in b.basis
    assert ("fixed" in b.basis) == any(FIXED), b.basis  # the fixed bytes are named when the rule has any


@given(st.lists(st.integers(0, 10**10), min_size=len(KINDS) + 2, max_size=len(KINDS) + 2))
def test_band_contains_the_estimate(sizes: list[int]) -> None:
    ph = _phase(weights=sizes[0], activations=sizes[1], weights_4bit=sizes[2])
    b = band(ph, sizes[3], sizes[4])
    device = ph.total_bytes + sizes[3] + sizes[4]
    assert 0 <= b.low_bytes <= device <= b.high_bytes


def test_no_spread() -> None:
    b = no_spread(9 * GIB, "rule of thumb")
    assert b.low_bytes == b.high_bytes == 9 * GIB


def test_band_rejects_inverted_edges() -> None:
    with pytest.raises(ValueError):
        Band(low_bytes=2, high_bytes=1, basis="x")


# --- on real estimates --------------------------------------------------------------------------------


def _run(model: str, options: dict[str, object], on: str | None, headroom: str | None) -> Any:
    return api.estimate(model, on=on, headroom=headroom, **options)  # type: ignore[arg-type]


def test_every_estimate_carries_a_band() -> None:
    est = _run("llama-3.1-8b", {"method": "lora"}, None, None)
    assert est.band is not None
    assert est.band.low_bytes < est.device_bytes < est.band.high_bytes
    assert high_bytes(est) == est.band.high_bytes


def test_diffusion_estimates_carry_a_band() -> None:
    est = _run("sd15", {"method": "lora"}, None, None)
    assert est.band is not None and est.band.low_bytes <= est.device_bytes <= est.band.high_bytes


def _find(verdict: str, on: str = "24GB", headroom: str | None = None) -> int:
    """A sequence length whose estimate of qwen2.5-0.5b LoRA gets this verdict on the target."""
    for seq in range(256, 65536, 256):
        est = _run("qwen2.5-0.5b", {"method": "lora", "seq_len": seq}, on, headroom)
        assert est.target is not None
        if est.target.verdict == verdict:
            return seq
    pytest.fail(f"no {verdict} setup found")


def test_verdict_follows_the_band() -> None:
    for name in ("fits", "tight", "does_not_fit"):
        seq = _find(name)
        est = _run("qwen2.5-0.5b", {"method": "lora", "seq_len": seq}, "24GB", None)
        v = est.target
        assert v is not None and v.high_bytes == est.band.high_bytes  # type: ignore[union-attr]
        assert judge(est, _target("24GB"))[0] == name == v.verdict
        if name == "fits":
            assert v.high_bytes <= v.budget_bytes
        elif name == "tight":
            assert v.device_bytes <= v.budget_bytes < v.high_bytes
        else:
            assert v.device_bytes > v.budget_bytes


def _target(on: str, headroom: str | None = None) -> object:
    from fitcheck.hardware.budget import resolve_target

    return resolve_target(on, headroom)


def test_default_headroom_is_zero_and_a_given_one_comes_off() -> None:
    est = _run("qwen2.5-0.5b", {"method": "lora"}, "24GB", None)
    kept = _run("qwen2.5-0.5b", {"method": "lora"}, "24GB", "2GB")
    assert est.target is not None and kept.target is not None
    assert est.target.budget_bytes == est.target.usable_bytes  # no default margin
    assert est.target.spare_bytes == est.target.budget_bytes - est.device_bytes
    assert est.target.headroom_bytes == 0  # the margin (default none), not the spare
    assert kept.target.budget_bytes == est.target.budget_bytes - 2 * GIB
    assert kept.target.headroom_bytes == 2 * GIB  # the margin, in the verdict as on the target
    assert kept.target.spare_bytes == est.target.spare_bytes - 2 * GIB


def test_headroom_can_turn_fits_into_tight() -> None:
    seq = _find("fits")
    est = _run("qwen2.5-0.5b", {"method": "lora", "seq_len": seq}, "24GB", None)
    assert est.target is not None and est.band is not None
    spare = est.target.budget_bytes - est.band.high_bytes
    room = est.band.high_bytes - est.device_bytes
    margin = f"{(spare + room // 2) // MIB}MB"
    kept = _run("qwen2.5-0.5b", {"method": "lora", "seq_len": seq}, "24GB", margin)
    assert kept.target is not None and kept.target.verdict == "tight"


# --- check: exit codes and the warning ----------------------------------------------------------------


def _args(seq: int) -> list[str]:
    return ["check", "qwen2.5-0.5b", "--method", "lora", "--seq-len", str(seq), "--on", "24GB"]


def test_check_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    fits, tight, too_big = _find("fits"), _find("tight"), _find("does_not_fit")
    capsys.readouterr()
    assert main(_args(fits)) == 0
    assert "warning" not in capsys.readouterr().err
    assert main(_args(tight)) == 0
    err = capsys.readouterr().err
    assert err.startswith("fitcheck: warning: tight:") and "--strict" in err and len(err.splitlines()) == 1
    assert main([*_args(tight), "--strict"]) == 1
    assert main(_args(too_big)) == 1
    assert main([*_args(fits), "--strict"]) == 0


def test_json_carries_band_and_high_bytes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*_args(_find("tight")), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc["band"]) == {"low_bytes", "high_bytes", "basis"}
    assert doc["band"]["low_bytes"] <= doc["device_bytes"] <= doc["band"]["high_bytes"]
    assert doc["target"]["verdict"] == "tight" and doc["target"]["high_bytes"] == doc["band"]["high_bytes"]


def test_table_says_it_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "llama-3.1-8b", "--method", "lora", "--on", "24GB", "-f", "markdown"]) == 0
    out = capsys.readouterr().out
    assert ", likely " in out and "\u2013" in out


def test_thumb_rule_has_no_spread(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "7B", "--rule", "thumb", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["band"]["low_bytes"] == doc["band"]["high_bytes"] == doc["thumb_bytes"]
    assert (
        main(["matrix", "--on", "36GB-unified", "--rule", "thumb", "--models", "7B", "--format", "json"]) == 0
    )
    row = json.loads(capsys.readouterr().out)[0]
    assert row["lora_high_bytes"] == row["lora_bytes"]


def test_band_basis_names_the_fixed_bytes_and_its_evidence() -> None:
    """The basis names a fixed term only when there is one, and the evidence: the traced calibration and the
    published LLM and diffusion measurements (the diffusion records are in the derivation, session 18)."""
    ph = _phase(weights=1000 * MIB, activations=400 * MIB, weights_4bit=0)
    fixed = band(ph, 0, 0, fixed=(0, GIB))
    assert "plus a fixed 0/+1 GiB per process" in fixed.basis, fixed.basis
    plain = band(ph, 0, 0, fixed=(0, 0))
    assert "fixed" not in plain.basis  # no fixed term: not named
    assert "(traced calibration and published LLM and diffusion measurements)" in plain.basis
