"""The engine held to this project's own real-GPU runs (tests/data/measured/*.yaml, bench/gpu_measure.py).

The runs are re-estimated by bench/measured.py, whose generated section of docs/accuracy.md these tests
also keep fresh. No GPU is needed here: the files are what a lent GPU measured, committed as written.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import measured  # noqa: E402

#: LoRA / QLoRA / full rows whose reserved figure the engine is more than 10% under, each with what is known
#: of why. (Full fine-tuning's gap, 6-15% under on 8 of 14 rows, closed with engine/overhead.py
#: `regrown_loss_blocks`, checked on the h200-full-holdout grid posed before it ran.)
RESERVED_UNDER = {
    ("h200-holdout", "gemma-2-9b", "qlora"): (
        "eager attention under checkpointing at 4,096 tokens (-11.2%, allocated -0.5%): the layer-blocks "
        "rule leaves eager scores out (taken as able to serve the logits); Gemma 2's 16 heads x 4,096 keys "
        "are smaller than its 256,000-wide logits, so they may be stranded too. Counting them (tried in "
        "session 20) brings this row to about -4% but Llama-2-7B QLoRA b16 / b32 x 512 (eager) from +0.3% to "
        "+5-6% and 7 more published records over by 15%: not adopted on one row"
    ),
}


@pytest.fixture(scope="module")
def files() -> dict[str, list[measured.Row]]:
    return measured.load_all()


def _rows(files: dict[str, list[measured.Row]]) -> list[measured.Row]:
    return [r for rows in files.values() for r in rows]


def _key(r: measured.Row) -> tuple[str, str, str]:
    return (r.file, r.model, str(r.setup["method"]))


def test_files_are_what_a_gpu_wrote(files: dict[str, list[measured.Row]]) -> None:
    import yaml

    assert set(files) == set(measured.CARDS)  # every file named with its card, every card's file there
    for path in measured.DATA.glob("*.yaml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        env = doc["environment"]
        assert env["gpu"] == "NVIDIA H200" and env["torch"].startswith("2.") and env["driver"]
        assert doc["command"].startswith("bench/gpu_measure.py")
        assert all("error" not in r for r in doc["records"]), path.name
    assert len(_rows(files)) == sum(len(g) for g in _grids().values())


#: Rows whose allocated peak the engine misses by more than 3%, each with why.
#: (empty since session 22: Gemma 3 1B fp32 past its 512-token sliding window was +6.6% while `sdpa_math`
#: counted the scores in every layer; with the windowed layers counted as SDPA runs them, +0.5%)
ALLOCATED_OFF: dict[tuple[str, str, str], str] = {}


def _grids() -> dict[str, list[tuple[str, dict[str, Any]]]]:
    """bench/gpu_measure.py's grid behind each file: ``h200`` the fit grid, ``h200-<name>`` grid <name>."""
    import gpu_measure

    names = {stem: stem.removeprefix("h200-") if "-" in stem else "fit" for stem in measured.CARDS}
    return {stem: gpu_measure.GRIDS[name] for stem, name in names.items()}


def test_allocated_peaks_within_3_percent(files: dict[str, list[measured.Row]]) -> None:
    """The engine's allocated peak against torch's max_memory_allocated, every row (QLoRA included) but
    the named ones."""
    off = {_key(r) for r in _rows(files) if abs(r.allocated_error) > 0.03}
    assert off == set(ALLOCATED_OFF), off


def test_reserved_median_within_5_percent_per_file(files: dict[str, list[measured.Row]]) -> None:
    """Every grid but the ones posed to probe a rule's edges (boundary, threshold, math, modules: each held
    by its own test below); the holdouts included."""
    for name, rows in files.items():
        if name in ("h200-boundary", "h200-threshold", "h200-math", "h200-modules"):
            continue
        errors = [r.reserved_error for r in rows]
        assert statistics.median(abs(e) for e in errors) <= 0.05, name
        assert abs(statistics.median(errors)) <= 0.05, name  # no lean beyond 5% either way


def test_reserved_never_more_than_10_percent_under_unless_named(files: dict[str, list[measured.Row]]) -> None:
    assert {_key(r) for r in _rows(files) if r.reserved_error < -0.10} == set(RESERVED_UNDER)


#: The boundary grid's rows over by more than 10%: SmolLM2 360M full fine-tuning at 2 x 1024 (+13.1%, the
#: rule off: 4.7 MiB layer gradients), where the flat fragmentation share stands above what the allocator
#: held.
BOUNDARY_OVER = {("h200-boundary", "smollm2-360m", "full")}


def test_boundary_grid_never_under_by_10_percent_and_its_overshoots_named(
    files: dict[str, list[measured.Row]],
) -> None:
    rows = files["h200-boundary"]
    assert len(rows) == 8
    assert min(r.reserved_error for r in rows) >= -0.05  # Qwen2.5 1.5B at 8 x 2048: -7.5% before session 21
    assert {_key(r) for r in rows if r.reserved_error > 0.10} == BOUNDARY_OVER


#: The threshold grid's rows over by more than 10% (all full fine-tuning; "model precision" as key), each
#: with why. The grid was posed to test the layer-gradient condition: the allocator's history
#: (bench/gpu_segments.py on Qwen3 1.7B, SmolLM2 1.7B, Gemma 3 1B, TinyLlama 1.1B) shows the step-2 loss
#: cutting its segments anew in all four, but only Qwen3 1.7B's reserve grows by much: elsewhere the
#: optimizer states fill the old segments, so the regrown ones are not waste.
THRESHOLD_OVER = {
    "qwen2.5-0.5b fp32": "2 x 1024, no checkpointing: 1.8 GiB of regrown blocks counted (16.6 MiB layer "
    "gradients) that the reserve does not show; +8.8% without the rule",
    "gpt2-medium fp32": "16 MiB layer gradients: 1.3 GiB counted, not seen; +11.6% without the rule",
    "tinyllama-1.1b bf16": "22 MiB layer gradients: 2.1 GiB counted; the segments are regrown (allocator "
    "history) but the optimizer states fill the old ones; -2.3% without the rule",
    "smollm2-360m fp32": "the rule off (9.4 MiB): the flat fragmentation share stands above what the "
    "allocator held, as on the bf16 rows of this model",
    "qwen3-0.6b bf16": "the rule off (6 MiB): the flat fragmentation share, as above",
}


def test_threshold_grid_allocated_close_never_under_and_its_overshoots_named(
    files: dict[str, list[measured.Row]],
) -> None:
    """Posed with the layer-gradient condition before it ran: no row under its reserved figure, every
    allocated peak within 1.5% (SDPA's math kernel on the fp32 grouped-query rows, `sdpa_math`: SmolLM2
    360M and Qwen2.5 0.5B were 28% and 17% under before it), and the over-counts named."""
    rows = files["h200-threshold"]
    assert len(rows) == 9 and all(r.setup["method"] == "full" for r in rows)
    assert all(abs(r.allocated_error) <= 0.015 for r in rows), [(r.model, r.allocated_error) for r in rows]
    assert min(r.reserved_error for r in rows) >= 0.0
    over = {f"{r.model} {r.setup['precision']}" for r in rows if r.reserved_error > 0.10}
    assert over == set(THRESHOLD_OVER)


#: The math grid's rows over their reserved figure by more than 10%, each with why.
MATH_OVER = {
    "qwen3-0.6b": "+23.7%, full fine-tuning in fp32 without checkpointing: the regrown blocks (12 MiB layer "
    "gradients, 2.2 GiB) and the flat fragmentation share (2.6 GiB) against a measured reserve of 0.21 GiB",
    "gemma-3-1b": "+25.9%: the scores of its sliding layers (ALLOCATED_OFF), the regrown blocks (3.7 GiB) "
    "and the flat share, against a measured reserve of 0.63 GiB",
}


def test_math_grid_posed_with_the_rule(files: dict[str, list[measured.Row]]) -> None:
    """Posed with `sdpa_math` before it ran: fp32 grouped-query rows (LoRA on a 0.5B and a 7B base, Qwen3
    full, a checkpointed Llama 3.2 1B) allocated within 2%, the fp16 control within 1%, no row under its
    reserved figure by more than 1% (the fp16 control: -0.7%), and the over-counts named."""
    rows = {f"{r.model} {r.setup['method']} {r.setup['precision']}": r for r in files["h200-math"]}
    assert len(rows) == 6
    assert abs(rows["qwen2.5-0.5b full fp16"].allocated_error) <= 0.01
    assert all(abs(r.allocated_error) <= 0.02 for r in rows.values() if r.model != "gemma-3-1b")
    assert min(r.reserved_error for r in rows.values()) >= -0.01
    assert {r.model for r in rows.values() if r.reserved_error > 0.10} == set(MATH_OVER)


def test_modules_grid_posed_before_it_ran(files: dict[str, list[measured.Row]]) -> None:
    """LoRA / QLoRA with the embedding and the output layer trained in full (peft's modules_to_save, built
    by `measure` since session 21), posed before it ran: allocated within 2.5%, reserved never under and at
    most 8% over. Posed with `regrown_loss_blocks` off for the copies, Qwen2.5 1.5B / 7B were -5.8% / -6.1%
    and the 7B's nvidia-smi peak stood above the band's high edge; the copies' gradients count since
    (engine/states.py `largest_regrowing_grad_bytes`)."""
    rows = files["h200-modules"]
    assert len(rows) == 5 and all(r.setup["train_modules"] for r in rows)
    assert all(abs(r.allocated_error) <= 0.025 for r in rows), [(r.model, r.allocated_error) for r in rows]
    assert all(0.0 <= r.reserved_error <= 0.08 for r in rows), [(r.model, r.reserved_error) for r in rows]


def test_session_21_holdout(files: dict[str, list[measured.Row]]) -> None:
    """Other models and mixes, posed at the end of session 21 with its rules and band before it ran:
    allocated within 2% on all 8 (the fp32 LoRA row through SDPA's math kernel +1.1%), reserved within
    -8% / +12% (over: Qwen2.5 3B full fine-tuning's regrown blocks, Llama 3.2 1B's fp32 run without
    checkpointing under the flat share; under: Llama 3.2 3B LoRA with trained copies, named in NVML_ABOVE)."""
    rows = files["h200-holdout-21"]
    assert len(rows) == 8
    assert all(abs(r.allocated_error) <= 0.02 for r in rows), [(r.model, r.allocated_error) for r in rows]
    assert all(-0.08 <= r.reserved_error <= 0.12 for r in rows), [(r.model, r.reserved_error) for r in rows]


def test_full_fine_tuning_rule_out_of_sample(files: dict[str, list[measured.Row]]) -> None:
    """The full-FT holdout, posed with `regrown_loss_blocks` before it ran: no row more than 5% under."""
    rows = files["h200-full-holdout"]
    assert len(rows) == 8 and all(r.setup["method"] == "full" for r in rows)
    assert min(r.reserved_error for r in rows) >= -0.05
    assert all(abs(r.allocated_error) <= 0.02 for r in rows)


#: Rows whose nvidia-smi step peak stands above the band's high edge without a named reserved shortfall.
NVML_ABOVE = {
    ("h200-holdout-21", "llama-3.2-3b", "lora"): (
        "LoRA with the (tied) embedding and output layer trained, 2 x 2048, posed before it ran: allocated "
        "-0.4%, reserved -7.8% (the copies' regrown blocks counted, 1.7 GiB short still), nvidia-smi 2% "
        "above the +9% band's high edge"
    ),
    ("h200", "llama-3.2-1b", "full"): (
        "torchtune full fine-tuning at 1 x 2048 (its chunked loss: no regrown blocks counted; reserved "
        "-6.2%): 20 MB above the high edge of session 21's band (+9% on transient bytes, the derivation's "
        "90% level); inside the +15% band before it"
    ),
}


def test_nvml_step_peak_inside_the_band_unless_named(files: dict[str, list[measured.Row]]) -> None:
    """What nvidia-smi showed at the step's peak is at or below the band's high edge (the verdict's figure),
    on the card's catalog context; a row above it must be a named reserved shortfall."""
    read = [r for r in _rows(files) if r.outside_allocator is not None and r.nvml is not None]
    assert len(read) >= 20
    above = {_key(r) for r in read if r.nvml is not None and r.nvml > r.est_high}
    assert above <= set(RESERVED_UNDER) | set(NVML_ABOVE)


def test_accuracy_doc_section_is_fresh(files: dict[str, list[measured.Row]]) -> None:
    doc = measured.DOC.read_text(encoding="utf-8")
    assert measured.splice(doc, measured.render(files)) == doc, (
        "docs/accuracy.md stale: python bench/measured.py"
    )


def test_the_grids_are_the_recorded_setups() -> None:
    """bench/gpu_measure.py's grids, row for row, are what the files recorded (a rerun measures the same)."""
    import yaml

    from fitcheck.models import LlmSetup

    for stem, grid in _grids().items():
        records = yaml.safe_load((measured.DATA / f"{stem}.yaml").read_text(encoding="utf-8"))["records"]
        assert len(records) == len(grid)
        for (model, kw), rec in zip(grid, records, strict=True):
            assert rec["model"] == model
            assert LlmSetup(**{**kw, "backend": "cuda"}).model_dump(mode="json") == rec["setup"]
