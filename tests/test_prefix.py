"""Prefix tuning (``--method prefix-tuning``; engine/prefix.py, docs/methodology.md "Prefix tuning").

The traced check of the memory rules is tests/test_calibration.py (records llama3-16, qwen2-16, qwen2-17,
llama2-24, llama2-25: peft's real PREFIX_TUNING on fake tensors); here, the parameter counts against those
traces, the rule's parts by hand, and the CLI's refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.cli import main
from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config
from fitcheck.sources.resolve import spec_from_preset

CAL = Path(__file__).parent / "data" / "calibration"


def _prefix_records() -> list[dict[str, Any]]:
    out = []
    for path in sorted(CAL.glob("*.yaml")):
        for rec in yaml.safe_load(path.read_text(encoding="utf-8"))["records"]:
            if rec["setup"]["method"] == "prefix-tuning":
                out.append(rec)
    return out


RECORDS = _prefix_records()


def test_the_grid_traces_prefix_tuning_with_and_without_projection() -> None:
    assert len(RECORDS) >= 4
    assert {r["setup"]["prefix_projection"] for r in RECORDS} == {True, False}
    assert {
        r["hf_config"]["num_key_value_heads"] == r["hf_config"]["num_attention_heads"] for r in RECORDS
    } == {
        True,
        False,
    }


@pytest.mark.parametrize("rec", RECORDS, ids=[r["id"] for r in RECORDS])
def test_trainable_count_is_peft_s(rec: dict[str, Any]) -> None:
    """peft sizes the prefix from the config (token_dim = head_dim x kv heads): the trace's count."""
    spec = ModelSpec(
        id=rec["id"], name=rec["id"], source_kind="hf_config", arch=arch_from_hf_config(rec["hf_config"])
    )
    est = estimate(spec, LlmSetup(**rec["setup"]))
    assert est.params.trainable == rec["measured"]["trainable_params"]
    assert est.params.adapter == est.params.trainable


def test_keys_and_values_grow_by_the_prefix_at_every_head() -> None:
    """SDPA under the prefix's mask: K and V expanded to all heads (repeat_kv), s + p long, per token."""
    a = spec_from_preset("llama-3.1-8b").arch
    s, p = 512, 128
    setup = LlmSetup(method="prefix-tuning", prefix_tokens=p, seq_len=s, trainer="hf")
    parts = act.layer_activations(a, setup, regime_for(setup)).parts
    q_w, kv_w = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    assert parts["prefix_kv"] == pytest.approx(2 * 2 * (q_w * (s + p) / s - kv_w))
    assert "prefix_scores" not in parts  # no materialized scores under SDPA


def test_eager_scores_span_the_prefix() -> None:
    a = spec_from_preset("llama-3.1-8b").arch
    setup = LlmSetup(method="prefix-tuning", prefix_tokens=100, seq_len=400, attn="eager", trainer="hf")
    acts = act.layer_activations(a, setup, regime_for(setup))
    assert acts.parts["prefix_scores"] == acts.scores * 100


def test_prefix_encoder_is_fp32_on_a_16_bit_base() -> None:
    spec = spec_from_preset("llama-3.1-8b")
    est = estimate(spec, LlmSetup(method="prefix-tuning", prefix_tokens=64, seq_len=256, trainer="hf"))
    a = spec.arch
    n = 64 * a.num_layers * 2 * a.num_kv_heads * a.head_dim
    assert est.params.trainable == n
    comp = {c.name: c.bytes for c in est.phase("optimizer_step").components}
    assert comp["adapters"] == 4 * n and comp["gradients"] == 4 * n and comp["optimizer_states"] == 8 * n


def test_more_virtual_tokens_never_need_less() -> None:
    spec = spec_from_preset("qwen2.5-7b")
    peaks = [
        estimate(
            spec, LlmSetup(method="prefix-tuning", prefix_tokens=p, seq_len=512, trainer="hf")
        ).device_bytes
        for p in (1, 16, 128, 1024)
    ]
    assert peaks == sorted(peaks) and peaks[0] < peaks[-1]


@pytest.mark.parametrize(
    "kw, words",
    [
        ({"method": "prefix-tuning"}, "--prefix-tokens"),
        ({"method": "lora", "prefix_tokens": 8}, "apply to --method prefix-tuning"),
        ({"method": "prefix-tuning", "prefix_tokens": 8, "trainer": "torchtune"}, "no prefix tuning"),
        ({"method": "prefix-tuning", "prefix_tokens": 8, "prefix_hidden": 64}, "--prefix-projection"),
        ({"method": "prefix-tuning", "prefix_tokens": 8, "gpus": 2}, "one GPU"),
    ],
)
def test_refused_in_one_line(kw: dict[str, Any], words: str) -> None:
    with pytest.raises(OptionError, match=words):
        estimate(spec_from_preset("llama-3.1-8b"), LlmSetup(seq_len=256, **kw))


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_estimate_echoes_the_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(
        capsys, "estimate", "llama-3.1-8b", "-m", "prefix-tuning", "--prefix-tokens", "32", "--format", "json"
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["setup"]["method"] == "prefix-tuning" and doc["setup"]["prefix_tokens"] == 32
    assert doc["setup"]["lora_targets"] == ""


@pytest.mark.parametrize(
    "args",
    [
        ("estimate", "llama-3.1-8b", "-m", "prefix-tuning"),
        ("estimate", "llama-3.1-8b", "-m", "prefix-tuning", "--prefix-tokens", "8", "--lora-targets", "attn"),
        ("estimate", "llama-3.1-8b", "-m", "prefix-tuning", "--prefix-tokens", "8", "--lora-rank", "8"),
        ("plan", "llama-3.1-8b", "--on", "24GB", "-m", "prefix-tuning", "--prefix-tokens", "8"),
    ],
)
def test_cli_refusals_exit_2_with_one_line(capsys: pytest.CaptureFixture[str], args: tuple[str, ...]) -> None:
    rc, _, err = _run(capsys, *args)
    assert rc == 2
    lines = [x for x in err.splitlines() if x.startswith("fitcheck: error:")]
    assert len(lines) == 1 and "Traceback" not in err


def test_an_encoder_is_refused() -> None:
    from tests.test_tasks import CASES, _spec

    name, cfg = "bert", CASES["bert"][1]
    with pytest.raises(OptionError, match="causal LM"):
        estimate(_spec(name, cfg), LlmSetup(method="prefix-tuning", prefix_tokens=8, seq_len=128))


def test_the_caption_names_the_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = _run(capsys, "estimate", "llama-3.1-8b", "-m", "prefix-tuning", "--prefix-tokens", "32")
    assert rc == 0 and "prefix-tuning p32 ·" in out
