"""The engine against published measurements (tests/data/published/): schema, held scores, the bar.

The scores are recomputed here and must equal the committed ones (tests/data/published/scores.json) and
the generated section of docs/accuracy.md: a change to the engine or the corpus regenerates both with
``python bench/published.py --write-scores``. The acceptance bar of issue 10 is encoded record by record
and source by source; what fails it today is listed below as a known failure (strict xfail), so the suite is
green now and the lists can only shrink: a record that starts passing turns its xfail into a failure until
it is taken off the list.
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from bench_helpers import bench_module

ROOT = Path(__file__).resolve().parent.parent


def _bench() -> ModuleType:
    return bench_module("published")


pub = _bench()
FILES = sorted(pub.DATA.glob("*.yaml"))

#: Records more than 15% under their measured figure today, each with what is known of it, read from the
#: record's own `under_reason` (each one must be fixed, or its record must name a setting the source leaves
#: unstated in `known_gap`, to leave this list).
KNOWN_UNDER: dict[str, str] = {
    r.key: r.under_reason for _, recs in pub.corpus().values() for r in recs if r.under_reason
}
#: Sources whose median |error| is above 10% today.
KNOWN_SOURCE: dict[str, str] = {}


@cache
def _scored() -> tuple[dict[str, list[Any]], dict[str, list[Any]]]:
    return pub.score_all()  # type: ignore[no-any-return]


def _all_scores() -> list[Any]:
    return [s for sc in _scored()[0].values() for s in sc]


# --- schema ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_source_block(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert set(data) <= {"source", "defaults", "records"}
    src = data["source"]
    for key in pub.SOURCE_KEYS:
        assert src.get(key), f"{path.name}: source.{key} missing"
    assert src["id"] == path.stem
    assert str(src["url"]).startswith("https://")
    assert re.fullmatch(r"\d{4}-\d{2}(-\d{2})?", str(src["date"]))
    if "commit" in src:
        assert re.fullmatch(r"[0-9a-f]{40}", src["commit"]) and src["commit"] in src["url"]


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_records_schema(path: Path) -> None:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    defaults = data.get("defaults") or {}
    ids = [r["id"] for r in data["records"]]
    assert len(ids) == len(set(ids)), f"{path.name}: duplicate record ids"
    for raw in data["records"]:
        assert set(raw) <= set(pub.RECORD_KEYS), (
            f"{raw['id']}: unknown keys {set(raw) - set(pub.RECORD_KEYS)}"
        )
        assert raw.get("model", defaults.get("model")), f"{raw['id']}: no model"
        assert raw.get("metric", defaults.get("metric")) in pub.METRICS, f"{raw['id']}: metric"
        assert raw.get("relation", defaults.get("relation", "peak")) in pub.RELATIONS
        m = raw["measured"]
        assert m["unit"] in pub.UNITS and float(m["value"]) > 0, f"{raw['id']}: measured"
        setup = {
            **{k: v for k, v in defaults.items() if k not in pub.RECORD_KEYS},
            **(raw.get("setup") or {}),
        }
        assert setup.get("method"), f"{raw['id']}: setup.method"
        for u in [*(defaults.get("uncertain") or []), *(raw.get("uncertain") or [])]:
            assert isinstance(u, str) and u
        if raw.get("known_gap") is not None:
            assert isinstance(raw["known_gap"], str) and raw["known_gap"]
        if raw.get("under_reason") is not None:  # an unexplained shortfall is not a known gap: one or other
            assert isinstance(raw["under_reason"], str) and raw["under_reason"]
            assert raw.get("known_gap") is None, f"{raw['id']}: under_reason beside known_gap"


def test_corpus_size_and_independence() -> None:
    records = [r for _, recs in pub.corpus().values() for r in recs]
    single = [r for r in records if r.gpus == 1]
    publishers = {src["publisher"].split(" (")[0] for src, _ in pub.corpus().values()}
    assert len(single) >= 80
    assert len(publishers) >= 8, publishers
    assert len({r.key for r in records}) == len(records)


def test_units() -> None:
    assert pub.measured_bytes(1.5, "GB", "peak") == 1_500_000_000
    assert pub.measured_bytes(24, "GB", "capacity") == 24 << 30
    assert pub.measured_bytes(2, "MiB", "peak") == 2 << 20


# --- held scores -----------------------------------------------------------------------------------


def test_scores_match_committed() -> None:
    committed = json.loads(pub.SCORES.read_text(encoding="utf-8"))
    now = pub.scores_json(_scored()[0])
    assert now["records"].keys() == committed["records"].keys(), "scored records changed: --write-scores"
    drift = {
        k: (committed["records"][k], v)
        for k, v in now["records"].items()
        if abs(v - committed["records"][k]) > 1e-4
    }
    assert not drift, f"scores moved (run python bench/published.py --write-scores): {drift}"
    assert now["sources"] == committed["sources"]
    for key in ("band_spread", "band_held_out", "band_stability", "band_above_high"):
        assert now[key] == committed[key], f"{key} moved (run python bench/published.py --write-scores)"


def test_docs_section_is_generated() -> None:
    doc = pub.DOC.read_text(encoding="utf-8")
    assert pub.BEGIN in doc and pub.END in doc
    assert pub.splice(doc, pub.render(*_scored())) == doc, "docs/accuracy.md stale: python bench/published.py"


def test_band_table_is_the_derived_one() -> None:
    """engine/band.py holds the fractions bench/published.py derives from calibration and corpus."""
    from fitcheck.engine.band import FIXED, SPREAD

    derived = pub.derive_spread(_scored()[0])
    held = {**{k: tuple(v) for k, v in SPREAD.items()}, "fixed": tuple(float(b) for b in FIXED)}
    assert held == derived, f"update SPREAD / FIXED in engine/band.py: {derived}"
    assert pub.band_coverage(_scored()[0], derived) >= 0.8


def test_band_holds_on_sources_it_was_not_fitted_to() -> None:
    """Leave-one-source-out: the band derived without a source, on that source's records (no known gap),
    is exceeded by no more than the 10% its 90% coverage promises (docs/accuracy.md, "Held out")."""
    ho = pub.bd.held_out(pub.band_evidence(_scored()[0]))
    above, n = sum(h.above for h in ho.values()), sum(h.n for h in ho.values())
    # exactly the allowed share passes: (1 - 0.9) * 290 is 28.999999999999996 in floating point
    assert above <= (1 - pub.bd.COVERAGE) * n + 1e-9, f"{above} of {n} held-out records above high_bytes"


#: The band's stability history (docs/methodology.md, "The band"): it holds since session 15 (the joint fit,
#: every record one vote, at 92.5%, 383 records): 4.1% / 4.5% of an estimate at most; since session 18 it is
#: part of the choice (`bd.choose`; the joint fit at 95%, 395 records with the diffusion ones): 3.7% / 4.8%.
#: Session 19 (the layer blocks beside the loss): none of those four rules keeps both the promise and the
#: bound (3.8% / 5.1% at best); with fewer kinds, one fraction for transient and 4-bit bytes, each record one
#: vote, at 92.5%: 2.0% / 2.0%.
#: Before, one source
#: decided a term: session 12 (the sequential rule, PEFT README's T0_3B rows posed at their data's lengths):
#: 4.7% / 42.8%; session 11: 6.0% / 42.8%, both leaving torchtune out (ms-swift-2023-12's Qwen-72B-Chat
#: bitsandbytes 4-bit row moves most); session 10 (sequential fractions, each source one voice, at 92.5%):
#: 7.3% / 31.3% (without PEFT's README table); session 9 (joint fit at 92.5%): 4.4% / 14.3%; session 8
#: (sequential fractions at 90%): 17.3% / 8.8%; session 7 (fixed term first): 26.1% / 8.1%.


def test_diffusion_records_are_in_the_derivation() -> None:
    """The diffusion estimator shares the band, so its published records are rows of its derivation (each
    diffusion source one more source held out), after every LLM record."""
    import published_diffusion

    rows = pub.band_rows(_scored()[0])
    diffusion = {f"{r.source}/{r.id}" for r in published_diffusion.records()}
    assert diffusion and diffusion <= {r.key for r in rows}
    assert {r.source for r in rows if r.key in diffusion} <= set(pub.band_evidence(_scored()[0]).without)


def test_band_is_stable_leaving_one_source_out() -> None:
    """No source decides the band: leaving any one out moves neither edge of any scored record by more
    than STABILITY_BOUND of its estimate (docs/methodology.md, "The band", argues the bound), unless no
    candidate at any level keeps both the held-out promise and the bound; then the chosen rule keeps the
    promise and no candidate that keeps it moves less (session 19: 5.1%, docs/methodology.md)."""
    moves = pub.bd.stability(pub.band_evidence(_scored()[0]))
    chosen = pub.chosen_rule(_scored()[0])
    worst = max(mv.share for mv in moves.values())
    assert worst == pytest.approx(chosen.trials[(chosen.cover, chosen.name)].move)
    if any(t.steady and t.misses <= _allowed() for t in chosen.trials.values()):
        for side, mv in moves.items():
            assert mv.share <= pub.bd.STABILITY_BOUND, f"{side} edge: {mv}"
    else:
        kept = [t.move for t in chosen.trials.values() if t.misses <= _allowed()]
        assert chosen.misses <= _allowed() and worst == min(kept)


def _allowed() -> float:
    """Held-out misses the promise allows on the derivation's records."""
    rows = pub.band_rows(_scored()[0])
    return (1 - pub.bd.COVERAGE) * sum(1 for r in rows if not r.known_gap) + 1e-9


def test_band_rule_is_the_one_the_held_out_records_choose() -> None:
    """SPREAD and FIXED hold the candidate rule, at the lowest fit level (bench/band_derive.py
    ``FIT_COVERAGES``) where some candidate keeps the held-out promise and is stable, that leaves the fewest
    held-out records above the high edge among those (narrowest among equals; ``choose``); at every lower
    level each candidate breaks the promise or moves an edge by more than STABILITY_BOUND. Where no level
    has such a candidate, the rule keeps the promise and moves least (`test_band_is_stable_...`)."""
    rows, states = pub.band_rows(_scored()[0]), pub.states_spread()
    clean = sum(1 for r in rows if not r.known_gap)
    allowed = _allowed()
    chosen = pub.chosen_rule(_scored()[0])
    trials = chosen.trials
    # the trial of the chosen rule is what its own leave-one-out gives
    fitted = pub.bd.at(dict(pub.bd.CANDIDATES)[chosen.name], chosen.cover)
    loo = pub.bd.leave_one_out(rows, states, fitted)
    assert trials[(chosen.cover, chosen.name)].misses == pub.bd.held_out_misses(rows, states, fitted)
    assert chosen.misses <= allowed, (chosen.misses, clean)

    def eligible(cover: float) -> dict[str, Any]:
        return {n: t for (c, n), t in trials.items() if c == cover and t.misses <= allowed and t.steady}

    if not any(eligible(c) for c in pub.bd.FIT_COVERAGES):
        return  # the fallback: test_band_is_stable_leaving_one_source_out holds it
    assert trials[(chosen.cover, chosen.name)].steady
    assert max(m.share for m in pub.bd.stability(loo).values()) <= pub.bd.STABILITY_BOUND

    for cover in pub.bd.FIT_COVERAGES:
        if cover == chosen.cover:
            break
        assert not eligible(cover), cover
    ok = eligible(chosen.cover)
    assert chosen.name in ok and chosen.misses == min(t.misses for t in ok.values()), ok
    ties = [n for n, t in ok.items() if t.misses == chosen.misses]
    assert trials[(chosen.cover, chosen.name)].width == min(ok[n].width for n in ties)
    assert chosen.misses <= allowed, (chosen.misses, clean)


def test_every_skip_has_a_reason() -> None:
    for recs in _scored()[1].values():
        for rec, why in recs:
            assert why and rec.key


def test_enough_scored() -> None:
    assert len(_all_scores()) >= 80


# --- the bar ---------------------------------------------------------------------------------------


def _record_cases() -> list[Any]:
    out = []
    for s in sorted(_all_scores(), key=lambda x: x.record.key):
        key = s.record.key
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_UNDER[key])] if key in KNOWN_UNDER else []
        out.append(pytest.param(s, id=key, marks=marks))
    return out


@pytest.mark.parametrize("score", _record_cases())
def test_record_not_more_than_15_percent_under(score: Any) -> None:
    if score.record.known_gap:
        return  # the record names why the engine cannot be held to it
    assert score.error >= pub.UNDER_BAR, f"{score.record.key}: {score.error:+.1%}"


def _source_cases() -> list[Any]:
    out = []
    for sid in sorted(_scored()[0]):
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_SOURCE[sid])] if sid in KNOWN_SOURCE else []
        out.append(pytest.param(sid, id=sid, marks=marks))
    return out


@pytest.mark.parametrize("sid", _source_cases())
def test_source_median_within_10_percent(sid: str) -> None:
    med = pub.Summary.of(_scored()[0][sid]).median_abs
    assert med <= pub.MEDIAN_BAR, f"{sid}: median |error| {med:.1%}"


def test_known_lists_name_real_records() -> None:
    keys = {s.record.key for s in _all_scores()}
    assert set(KNOWN_UNDER) <= keys
    assert set(KNOWN_SOURCE) <= set(_scored()[0])


def test_model_configs_resolve_offline_and_are_sourced() -> None:
    """Every config folder is read by fitcheck's resolver and has its row (where it was read) in the
    folder's README."""
    from fitcheck.sources.resolve import resolve_model

    readme = (pub.CONFIGS / "README.md").read_text(encoding="utf-8")
    folders = sorted(p.parent for p in pub.CONFIGS.glob("*/*/config.json"))
    assert folders
    for folder in folders:
        name = f"{folder.parent.name}/{folder.name}"
        assert f"| {name} |" in readme, f"{name}: no source row in configs/README.md"
        assert resolve_model(str(folder)).source_kind == "hf_config"
        assert not isinstance(pub._spec(name), str)


def test_multi_gpu_records_are_posed_per_gpu() -> None:
    """Records with several GPUs are estimated through the distributed setup, as the source states it
    (world size, strategy, offload); their bar is the corpus bar above (it replaced the 15% median / 25%
    under bar of the former tests/test_published_multigpu.py; multigpu_peft.yaml's runs are posed as they
    ran, with a bf16 stream, and its CPU-offload row is in KNOWN_UNDER)."""
    multi = [s for s in _all_scores() if s.record.gpus > 1]
    assert len(multi) >= 30
    for s in multi:
        d = s.estimate.distributed
        assert d is not None, s.record.key
        assert d.gpus_per_node * d.nodes == s.record.gpus
        assert d.strategy == pub._STRATEGIES[s.record.setup["strategy"]]
        assert d.offload == pub._OFFLOAD[str(s.record.setup.get("offload", "none"))]
    peft = [s for s in multi if s.record.source == "multigpu_peft"]
    assert len(peft) == 3 and all(s.estimate.regime.kbit_upcast is False for s in peft)


def test_the_stability_sentence_says_when_the_choice_fell_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/accuracy.md's stability sentence adds the fallback's words only when the chosen rule is past
    the bound (`bd.choose` found no candidate keeping both the promise and the bound)."""
    chosen = pub.chosen_rule(_scored()[0])
    steady = chosen.trials[(chosen.cover, chosen.name)].steady
    assert (pub._stability_words(_scored()[0]) == "") == steady
    key = (chosen.cover, chosen.name)
    unsteady = {**chosen.trials, key: pub.bd.Trial(chosen.misses, 0.1, 0.06)}
    fell_back = pub.bd.Choice(chosen.name, chosen.cover, chosen.rule, chosen.misses, unsteady)
    monkeypatch.setattr(pub, "chosen_rule", lambda _scored: fell_back)
    assert "moves least, past the bound" in pub._stability_words(_scored()[0])


def test_a_tool_named_as_the_gap_accounts_for_it() -> None:
    """A record that names its source's unstated reading tool as its known gap (the Qwen profile's
    Qwen-1.8B rows, session 22) is beyond the bar scored as reserved, as the scorer reads an unstated metric,
    and within it read as nvidia-smi, which is what its known gap says."""
    import dataclasses

    named = [
        r
        for _, recs in pub.corpus().values()
        for r in recs
        if r.known_gap and r.known_gap.startswith("the tool that read the figures is not stated")
    ]
    assert len(named) == 4
    for rec in named:
        as_reserved, as_smi = (
            pub.score(dataclasses.replace(rec, metric=m)) for m in (rec.metric, "nvidia-smi")
        )
        assert rec.metric == "unknown" and as_reserved.error < pub.UNDER_BAR < as_smi.error, rec.key


def _posed(key: str, **setup: Any) -> float:
    """A record's error posed with some of its unstated settings given other values."""
    import dataclasses

    rec = next(r for _, recs in pub.corpus().values() for r in recs if r.key == key)
    scored = pub.score(dataclasses.replace(rec, setup={**rec.setup, **setup}))
    assert not isinstance(scored, str), scored
    return float(scored.error)


def test_an_unstated_attention_named_as_the_gap_accounts_for_it() -> None:
    """ms-swift's OpenBuddy-Zephyr-7B at 8192 tokens (session 24): beyond the bar as swift's code reads it
    (flash-attn 2), over its figure with eager attention, which is what its known gap says."""
    key = "ms-swift/openbuddy-zephyr-7b-chat-lora-s8192"
    assert _posed(key) < pub.UNDER_BAR < 0 < _posed(key, attn="eager") < 0.15


@pytest.mark.parametrize("row", ["qlora-b24", "qlora-b32", "qlora-s2048"])
def test_unstated_settings_named_as_the_gap_span_the_figure(row: str) -> None:
    """Google's Vertex QLoRA rows (session 24): beyond the bar as the published image runs, over their
    figure with non-reentrant checkpointing and an fp16 base, or with varying step lengths: the span its
    known gap names."""
    key = f"google-vertex-openllama-finetune/{row}"
    assert _posed(key) < pub.UNDER_BAR
    assert _posed(key, ckpt_reentrant=False, kbit_path="none") > 0
    assert _posed(key, lengths="varying") > 0
