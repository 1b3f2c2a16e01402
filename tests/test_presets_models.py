"""Model presets: every file in presets/models/ is well formed and its declared count is exact.

Each preset stores the published config.json fields verbatim; the converter and the parameter
inventory must turn them into exactly the ``params`` the file declares, and a few counts are pinned
to the figures everyone quotes (the "8.03B" of Llama 3.1 8B and friends) so that a change to the
converter or to ``count_params`` cannot silently move them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.engine.params import count_params
from fitcheck.sources.hf_config import arch_from_hf_config

MODELS_DIR = Path(__file__).parents[1] / "presets" / "models"
PRESET_FILES = sorted(MODELS_DIR.glob("*.yaml"))
REQUIRED_KEYS = ("id", "name", "family", "hf_id", "source", "params", "params_source", "config")
KEBAB = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")

#: Exact parameter counts (what ``sum(p.numel() for p in model.parameters())`` reports).
PINNED_COUNTS: dict[str, int] = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-2-7b": 6_738_415_616,
    "mistral-7b-v0.1": 7_241_732_096,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,  # tied embeddings
    "gemma-2-9b": 9_241_705_984,
    "phi-3-mini": 3_821_079_552,
    "mixtral-8x7b": 46_702_792_704,
    "gpt2": 124_439_808,
    "tinyllama-1.1b": 1_100_048_384,
}


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name}: a preset is a YAML mapping"
    return data


def test_presets_exist() -> None:
    assert len(PRESET_FILES) >= 38


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_preset_shape(path: Path) -> None:
    data = load(path)
    missing = [k for k in REQUIRED_KEYS if k not in data]
    assert not missing, f"{path.name}: missing {missing}"
    assert data["id"] == path.stem
    assert KEBAB.match(data["id"]), "ids are lowercase-kebab"
    assert str(data["source"]).startswith("https://")
    assert isinstance(data["params"], int) and data["params"] > 0
    assert isinstance(data["config"], dict) and "model_type" in data["config"]
    assert all(isinstance(a, str) for a in data.get("aliases", []))


@pytest.mark.parametrize("path", PRESET_FILES, ids=lambda p: p.stem)
def test_declared_params_equal_derived_count(path: Path) -> None:
    data = load(path)
    assert count_params(arch_from_hf_config(data["config"])) == data["params"]


def test_ids_and_aliases_are_unique() -> None:
    names: list[str] = []
    for path in PRESET_FILES:
        data = load(path)
        names += [data["id"], *data.get("aliases", [])]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    assert not duplicates


@pytest.mark.parametrize(("preset_id", "expected"), sorted(PINNED_COUNTS.items()))
def test_pinned_counts(preset_id: str, expected: int) -> None:
    data = load(MODELS_DIR / f"{preset_id}.yaml")
    assert data["params"] == expected
    assert count_params(arch_from_hf_config(data["config"])) == expected
