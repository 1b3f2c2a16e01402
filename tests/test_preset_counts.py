"""Preset parameter counts held to independent, published counts (issue 9, item 8).

fitcheck derives every preset's count from its architecture (`count_params` for decoders, the op-level
module inventory for diffusion parts). These tests do not compare that count with itself: they compare it
with counts published outside fitcheck, recorded with their sources in tests/data/param_counts.yaml: a
checkpoint index's byte total (exact), an exact count someone else made on the real model (KerasHub's
preset counts, a loaded model's printed count), the count a calibration record measured on the real
implementation, or a rounded figure (to one unit in its last digit). Both the preset path and the
resolve path that every command takes are checked.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.api import resolve
from fitcheck.diffusion.sources import diffusion_ids
from fitcheck.diffusion.sources import spec_from_preset as diffusion_preset
from fitcheck.engine.params import count_params
from fitcheck.models import ModelSpec
from fitcheck.presets import preset_ids
from fitcheck.sources.resolve import spec_from_preset

DATA = Path(__file__).parent / "data"
COUNTS: dict[str, Any] = yaml.safe_load((DATA / "param_counts.yaml").read_text(encoding="utf-8"))
LLM: dict[str, dict[str, Any]] = COUNTS["llm"]
DIFFUSION: dict[str, dict[str, Any]] = COUNTS["diffusion"]
UNCHECKED: dict[str, str] = COUNTS["unchecked"] or {}

#: Bytes per element of a checkpoint's stored dtype (safetensors dtypes F32, F16, BF16).
STORED_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
SCALE = {"K": 10**3, "M": 10**6, "B": 10**9}
FIGURE = re.compile(r"^(\d+(?:\.\d+)?)([KMB])$")


def figure_range(figure: str) -> tuple[int, int]:
    """The counts a printed figure admits: one unit in its last stated digit either way.

    Publishers mix rounding and truncation (Qwen's card prints 7.61B for 7,615,616,512), so a figure
    pins the count to within a unit of its last digit, not half a unit.
    """
    m = FIGURE.match(figure)
    assert m, f"{figure!r}: a figure is digits and a K/M/B suffix"
    value = Decimal(m.group(1))
    unit = Decimal(1).scaleb(value.as_tuple().exponent)  # type: ignore[arg-type]
    scale = SCALE[m.group(2)]
    return int((value - unit) * scale), int((value + unit) * scale)


def published_range(entry: dict[str, Any]) -> tuple[int, int]:
    """The parameter counts an entry's source admits (low, high), inclusive."""
    if "index" in entry:
        idx = entry["index"]
        payload = idx["total_size_bytes"] - idx.get("buffer_bytes", 0)
        per = STORED_BYTES[idx["dtype"]]
        assert payload % per == 0, "an index total is a whole number of stored elements"
        return payload // per, payload // per
    if "count" in entry:
        return entry["count"], entry["count"]
    if "traced" in entry:
        rec = json.loads((DATA / "calibration" / "diffusion" / entry["traced"]["record"]).read_text())
        traced = rec["traced"]
        adapters = traced["trainable_params"] if rec["setup"]["method"] == "lora" else 0
        n = traced["total_params"] - adapters
        return n, n
    return figure_range(entry["figure"])


def test_figure_range_reads_the_last_digit() -> None:
    assert figure_range("8.03B") == (8_020_000_000, 8_040_000_000)
    assert figure_range("865M") == (864_000_000, 866_000_000)
    assert figure_range("406B") == (405_000_000_000, 407_000_000_000)


def test_an_index_total_pins_the_count_exactly() -> None:
    """16,060,522,496 bytes of bf16 tensors are 8,030,261,248 parameters: one more or less fails."""
    assert published_range(LLM["llama-3.1-8b"]) == (8_030_261_248, 8_030_261_248)
    low, high = published_range(LLM["llama-2-7b"])  # less its 8,192 bytes of inv_freq buffers
    assert low == high == (13_476_839_424 - 8_192) // 2


def test_every_preset_is_checked_or_listed_unchecked() -> None:
    llm, diff = set(preset_ids("models")), set(diffusion_ids())
    assert set(LLM) <= llm, f"entries for no preset: {sorted(set(LLM) - llm)}"
    assert set(DIFFUSION) <= diff, f"entries for no preset: {sorted(set(DIFFUSION) - diff)}"
    assert set(UNCHECKED) == (llm - set(LLM)) | (diff - set(DIFFUSION))


@pytest.mark.parametrize("entry", [*LLM.values(), *DIFFUSION.values()], ids=[*LLM, *DIFFUSION])
def test_entries_say_where_the_figure_comes_from(entry: dict[str, Any]) -> None:
    assert "traced" in entry or str(entry["source"]).startswith("https://")
    assert entry["seen_in"] and entry["read_on"]
    assert sum(k in entry for k in ("index", "count", "figure", "traced")) == 1


@pytest.mark.parametrize("pid", sorted(LLM))
def test_llm_preset_count_matches_the_published_one(pid: str) -> None:
    low, high = published_range(LLM[pid])
    counted = count_params(spec_from_preset(pid).arch)
    assert low <= counted <= high, f"{pid}: count_params {counted:,} outside the published {low:,}..{high:,}"


@pytest.mark.parametrize("pid", sorted(LLM))
def test_llm_resolve_path_agrees(pid: str) -> None:
    spec = resolve(pid)
    assert isinstance(spec, ModelSpec)
    low, high = published_range(LLM[pid])
    assert low <= count_params(spec.arch) <= high


@pytest.mark.parametrize("pid", sorted(DIFFUSION))
def test_diffusion_denoiser_count_matches_the_published_one(pid: str) -> None:
    low, high = published_range(DIFFUSION[pid])
    for spec in (diffusion_preset(pid), resolve(pid)):
        assert not isinstance(spec, ModelSpec)
        n = spec.denoiser.params
        assert low <= n <= high, f"{pid}: {spec.denoiser.name} {n:,} outside the published {low:,}..{high:,}"
