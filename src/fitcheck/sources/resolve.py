"""Resolve the MODEL argument: a size, a preset id, a folder, a config.json or safetensors files."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from fitcheck.errors import ModelSourceError, NotFoundError, suggest
from fitcheck.models import ModelSpec, TensorGroup
from fitcheck.presets import load_preset, preset_ids
from fitcheck.sources.hf_config import arch_from_hf_config
from fitcheck.sources.safetensors_header import read_all
from fitcheck.units import looks_like_size

MAX_CONFIG_BYTES = 4_000_000


def read_config(path: Path) -> dict[str, Any]:
    """Parse a config.json, bounded in size."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise ModelSourceError(f"{path}: over {MAX_CONFIG_BYTES:,} bytes, not a model config")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelSourceError(f"{path} is not valid JSON ({exc.__class__.__name__})") from None
    if not isinstance(data, dict):
        raise ModelSourceError(f"{path} must hold a JSON object")
    return data


def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for pid in preset_ids("models"):
        for alias in load_preset("models", pid).get("aliases", []) or []:
            out[str(alias).lower()] = pid
    return out


def spec_from_preset(preset_id: str) -> ModelSpec:
    """A model preset by id or alias."""
    pid = preset_id.lower()
    ids = preset_ids("models")
    if pid not in ids:
        pid = _aliases().get(pid, pid)
    data = load_preset("models", pid)
    arch = arch_from_hf_config(data["config"])
    return ModelSpec(
        id=data["id"],
        name=data.get("name", data["id"]),
        source_kind="preset",
        hf_id=data.get("hf_id"),
        source=data.get("source"),
        arch=arch,
        declared_params=data.get("params"),
        hf_config=dict(data["config"]),
    )


def _groups(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> tuple[TensorGroup, ...]:
    by: Counter[tuple[str, str]] = Counter()
    for name, (dtype, shape) in tensors.items():
        kind = (
            "embedding"
            if "embed" in name or name.endswith("wte.weight")
            else (
                "lm_head" if "lm_head" in name else ("norm" if "norm" in name or ".ln_" in name else "layers")
            )
        )
        by[(kind, dtype)] += math.prod(shape)
    return tuple(TensorGroup(name=k, numel=n, dtype=d) for (k, d), n in sorted(by.items()))


def spec_from_path(path: Path) -> ModelSpec:
    """A local Hugging Face folder, a config.json, or safetensors files (with a config.json beside)."""
    if not path.exists():
        raise NotFoundError(f"{path}: no such file or folder")
    folder = path if path.is_dir() else path.parent
    cfg_path = (
        path if path.suffix == ".json" and not path.name.endswith("index.json") else folder / "config.json"
    )
    if not cfg_path.exists():
        raise ModelSourceError(
            f"{folder}: no config.json; fitcheck needs the model's config.json beside its weights"
        )
    cfg = read_config(cfg_path)
    arch = arch_from_hf_config(cfg)
    weights: Path | None = None
    if (
        (
            path.is_dir()
            and (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").exists())
        )
        or path.suffix == ".safetensors"
        or path.name.endswith(".index.json")
    ):
        weights = path
    groups: tuple[TensorGroup, ...] = ()
    declared = None
    kind = "hf_config"
    if weights is not None:
        tensors = read_all(weights)
        groups = _groups(tensors)
        declared = sum(g.numel for g in groups)
        kind = "safetensors"
    name = cfg.get("_name_or_path") or folder.name
    return ModelSpec(
        id=str(path),
        name=str(name),
        source_kind=kind,  # type: ignore[arg-type]
        source=str(cfg_path),
        arch=arch,
        declared_params=declared,
        file_groups=groups,
        hf_config=cfg,
    )


def resolve_model(text: str) -> ModelSpec:
    """Turn the MODEL argument into a `ModelSpec`.

    Order: an existing path; a preset id or alias; a size string; else an error naming the closest
    presets.
    """
    from fitcheck.sources.size import spec_from_size

    p = Path(text).expanduser()
    if p.exists() or text.endswith((".json", ".safetensors")) or "/" in text:
        return spec_from_path(p)
    low = text.lower()
    if low in preset_ids("models"):
        return spec_from_preset(low)
    if looks_like_size(text):  # before the aliases, which need every preset file read
        return spec_from_size(text)
    if low in _aliases():
        return spec_from_preset(low)
    hint = suggest(text, [*preset_ids("models"), *_aliases()])
    raise NotFoundError(
        f"unknown model '{text}'"
        + (f"; {hint}" if hint else "")
        + " (a preset id from `fitcheck models`, a size like 7B, or a path to a model folder)"
    )
