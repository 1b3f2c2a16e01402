"""--lengths fixed|varying: the caching allocator's history over a varying-length run.

The history (engine/cache_history.py) is releasable cache: it is shown beside ``device_bytes``
(``Estimate.cache_history``), never in it, so the verdict, the band and the planner are the fixed-length
step's; a fixed-length setup's JSON is unchanged.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fitcheck import api
from fitcheck.cli import main
from fitcheck.engine import cache_history as ch
from fitcheck.engine.estimate import estimate
from fitcheck.models import LlmSetup
from fitcheck.units import GIB, MIB

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import published as pub

SPEC = api.resolve("qwen2.5-0.5b")


def _setup(seq_len: int, method: str = "lora", lengths: str = "varying", **kw: object) -> LlmSetup:
    return LlmSetup(method=method, seq_len=seq_len, grad_ckpt=True, backend="cuda", lengths=lengths, **kw)


def _history(seq_len: int, method: str = "lora", **kw: object) -> int:
    est = estimate(SPEC, _setup(seq_len, method, **kw))
    assert est.cache_history is not None
    return est.cache_history.bytes


def test_rungs_halve_down_to_one_token() -> None:
    assert ch.rungs(4096) == [2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1]
    assert ch.rungs(1) == []
    assert ch.rungs(3) == [1]


@settings(max_examples=12, deadline=None)
@given(seq_len=st.integers(min_value=1, max_value=16384), method=st.sampled_from(["lora", "full", "qlora"]))
def test_history_is_never_negative_and_leaves_the_need_alone(seq_len: int, method: str) -> None:
    fixed = estimate(SPEC, _setup(seq_len, method, lengths="fixed"))
    varying = estimate(SPEC, _setup(seq_len, method))
    assert fixed.cache_history is None
    assert varying.cache_history is not None and varying.cache_history.bytes >= 0
    assert varying.cache_history.name == "allocator_history"
    # releasable cache: not in what the run needs, nor in its band
    assert varying.device_bytes == fixed.device_bytes
    assert varying.band == fixed.band
    assert varying.phases == fixed.phases


@settings(max_examples=10, deadline=None)
@given(a=st.integers(min_value=64, max_value=16384), b=st.integers(min_value=64, max_value=16384))
def test_history_grows_with_the_maximum_length(a: int, b: int) -> None:
    lo, hi = sorted((a, b))
    assert _history(lo) <= _history(hi)
    one = lambda n: estimate(SPEC, _setup(n, lengths="fixed"))  # noqa: E731
    assert ch.history_bytes(one, lo) <= ch.history_bytes(one, hi)


def test_history_is_the_ladder_of_the_engines_own_steps() -> None:
    """Hand-checkable: the sum over rungs of each rung's length-dependent transient bytes (less a one-token
    step's), times 1 + FRAGMENTATION, until a rung fits one 20 MiB segment."""
    step = lambda n: estimate(SPEC, _setup(n, lengths="fixed"))  # noqa: E731
    one = step(1)
    want = 0
    for n in (1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1):
        cut = ch.length_bytes(step(n), one)
        if cut <= 20 * MIB:
            break
        want += round(cut * 1.15)
    assert want > 0
    assert _history(2048) == ch.reading_excess(step(2048), want) == want  # LoRA: the backward peak holds it


def test_a_peak_in_the_optimizer_step_can_hide_the_history() -> None:
    """Full fine-tuning of a small model at a short length peaks in the optimizer step, after the
    activations are freed: the reading shows the history only where it passes that peak."""
    step = lambda n: estimate(SPEC, _setup(n, "full", lengths="fixed"))  # noqa: E731
    est = step(256)
    assert est.peak_phase == "optimizer_step"
    history = ch.history_bytes(step, 256)
    hidden = est.peak_allocated_bytes - ch.activation_peak(est).total_bytes
    assert history > 0 and hidden > 0
    assert _history(256, "full") == max(0, history - hidden) < history


def test_no_history_off_cuda() -> None:
    for backend in ("mps", "cpu"):
        est = estimate(SPEC, LlmSetup(method="lora", seq_len=2048, backend=backend, lengths="varying"))
        assert est.cache_history is None


def test_verdict_and_plan_ignore_releasable_cache() -> None:
    """A run whose reading with the history would pass the card, but whose step fits, still fits."""
    fixed = api.check("qwen2.5-3b", "rtx-4090", method="lora", seq_len=4096, grad_ckpt=True)
    varying = api.check(
        "qwen2.5-3b", "rtx-4090", method="lora", seq_len=4096, grad_ckpt=True, lengths="varying"
    )
    assert varying.cache_history is not None
    assert varying.target is not None and fixed.target is not None
    budget = varying.target.budget_bytes
    assert varying.band is not None
    assert varying.device_bytes + varying.cache_history.bytes > budget >= varying.band.high_bytes
    assert varying.target == fixed.target and varying.target.verdict == "fits"
    p_fixed = api.plan("qwen2.5-7b", "rtx-4090")
    p_varying = api.plan("qwen2.5-7b", "rtx-4090", lengths="varying")
    assert p_varying.chosen is not None and p_fixed.chosen is not None
    assert p_varying.chosen.setup.model_copy(update={"lengths": "fixed"}) == p_fixed.chosen.setup
    assert p_varying.estimate is not None and p_varying.estimate.cache_history is not None


def test_the_planner_sizes_the_padded_step_without_the_rungs() -> None:
    """plan's cost model skips the history's rungs (releasable cache) but keeps what a padded batch's step
    holds (SDPA's mask copies): the device bytes estimate reports, not the fixed-length step's."""
    from fitcheck.hardware.budget import resolve_target
    from fitcheck.planner.search import device_bytes_fn

    setup = LlmSetup(method="lora", seq_len=2048, batch_size=4, attn="sdpa", trainer="hf", lengths="varying")
    est = estimate(SPEC, setup)
    fixed = estimate(SPEC, setup.model_copy(update={"lengths": "fixed"}))
    assert est.device_bytes > fixed.device_bytes  # the padded batch's mask copies
    need = device_bytes_fn(SPEC, resolve_target("a100-sxm4-80gb", None))(setup)
    on_target = estimate(SPEC, setup, resolve_target("a100-sxm4-80gb", None).context_bytes or None)
    assert need.device_bytes == on_target.device_bytes


def test_json_carries_lengths_and_history_only_when_varying(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "qwen2.5-0.5b", "--seq-len", "4096", "--grad-ckpt", "--on", "a100-sxm4-80gb"]
    assert main([*args, "--format", "json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert "lengths" not in plain["setup"] and "cache_history" not in plain
    assert main([*args, "--lengths", "varying", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"]["lengths"] == "varying"
    h = doc["cache_history"]
    assert h["name"] == "allocator_history" and h["bytes"] > 0
    assert h["source"] == "docs/methodology.md#allocator-history-over-varying-lengths"
    assert doc["device_bytes"] == plain["device_bytes"] and doc["target"] == plain["target"]
    assert main([*args, "--lengths", "varying"]) == 0
    assert "allocator history (varying lengths)" in capsys.readouterr().out
    assert main([*args, "--lengths", "varying", "--format", "markdown"]) == 0
    assert "| allocator history (varying lengths) |" in capsys.readouterr().out


@settings(max_examples=8, deadline=None)
@given(seq_len=st.integers(min_value=2, max_value=8192), method=st.sampled_from(["lora", "full", "qlora"]))
def test_longest_first_is_the_padded_step_without_a_ladder(seq_len: int, method: str) -> None:
    """--lengths longest-first (HF Trainer's group_by_length): the padded batch's step, as varying, but
    no later step is longer than the first, so no history from the run's lengths."""
    kw = {"batch_size": 4, "attn": "sdpa", "trainer": "hf"}
    varying = estimate(SPEC, _setup(seq_len, method, **kw))
    first = estimate(SPEC, _setup(seq_len, method, lengths="longest-first", **kw))
    fixed = estimate(SPEC, _setup(seq_len, method, lengths="fixed", **kw))
    assert first.phases == varying.phases and first.device_bytes == varying.device_bytes
    assert first.cache_history is None and fixed.cache_history is None
    # the padded batch carries SDPA's mask copies, which a fixed-length batch does not
    assert first.device_bytes >= fixed.device_bytes


def test_longest_first_holds_no_previous_micro_batch_output() -> None:
    """A loop that keeps its output (--keep-logits) with accumulation holds the previous micro-batch's
    logits into the next forward; a longest-first run's longest micro-batch is its first, with none held,
    while a varying or fixed run's peak forward may follow one."""

    def held_in_forward(lengths: str) -> int:
        kw = {"batch_size": 4, "attn": "sdpa", "keep_logits": True, "grad_accum": 4}
        est = estimate(SPEC, _setup(2048, "lora", lengths=lengths, **kw))
        return sum(c.bytes for c in est.phase("forward").components if c.name == "held_logits")

    assert held_in_forward("varying") > 0 and held_in_forward("fixed") > 0
    assert held_in_forward("longest-first") == 0


def test_longest_first_in_json_and_cli(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "qwen2.5-0.5b", "--seq-len", "2048", "--batch-size", "4", "--on", "a100-sxm4-80gb"]
    assert main([*args, "--lengths", "longest-first", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["setup"]["lengths"] == "longest-first" and "cache_history" not in doc


def test_bad_lengths_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "qwen2.5-0.5b", "--lengths", "sometimes"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fitcheck: error:")


def _record(**setup: object) -> pub.Record:
    base = {"method": "lora", "seq_len": 4096, "grad_ckpt": True, "lengths": "varying"}
    return pub.Record(
        source="t", id="r", model="qwen2.5-7b", setup={**base, **setup}, metric="max_memory_reserved",
        relation="peak", measured_bytes=30 * GIB, uncertain=[], known_gap=None,
    )  # fmt: skip


def test_scorer_adds_the_history_to_a_reading_and_caps_it_at_the_card() -> None:
    free = pub.score(_record())
    capped = pub.score(_record(gpu_memory_gib=30))
    fixed = pub.score(_record(lengths="fixed"))
    assert isinstance(free, pub.Score) and isinstance(capped, pub.Score) and isinstance(fixed, pub.Score)
    est = free.estimate
    assert est is not None and est.cache_history is not None
    assert free.estimate_bytes == fixed.estimate_bytes + est.cache_history.bytes
    # a reserved figure cannot pass the card less the context the allocator never holds; only the
    # history is capped (the step's own figure is the engine's)
    assert fixed.estimate_bytes < 30 * GIB - est.context_bytes < free.estimate_bytes
    assert capped.estimate_bytes == 30 * GIB - est.context_bytes
    allocated = pub.score(pub.Record(**{**_record().__dict__, "metric": "max_memory_allocated"}))
    assert isinstance(allocated, pub.Score) and allocated.estimate_bytes == est.peak_allocated_bytes


def test_the_words_never_show_a_reading_past_the_card(capsys: pytest.CaptureFixture[str]) -> None:
    from fitcheck.render import history_words

    assert "up to 30.00 GiB (never more than the card)" in history_words(20 * GIB, 10 * GIB, 80 * GIB)
    assert "up to 24.00 GiB (the whole card" in history_words(20 * GIB, 10 * GIB, 24 * GIB)
    args = ["estimate", "qwen2.5-3b", "--seq-len", "8192", "--grad-ckpt", "--on", "rtx-4090"]
    assert main([*args, "--lengths", "varying", "--format", "markdown"]) == 0
    assert "up to 23.99 GiB (the whole card" in capsys.readouterr().out
