"""Locate, load and validate the YAML presets shipped with fitcheck.

Presets live in ``presets/models/*.yaml`` and ``presets/hardware/*.yaml``: one entry per file, ``id``
equal to the file stem, read with ``yaml.safe_load`` and cached. In a wheel they sit inside the
package (``fitcheck/presets``); in an editable install or a checkout, at the repository root.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from fitcheck.errors import FitcheckError, NotFoundError, suggest

#: Preset files are small; anything larger is not one of ours and is refused before parsing.
MAX_PRESET_BYTES = 256 * 1024


@functools.cache
def presets_root() -> Path:
    """The folder holding ``models/`` and ``hardware/``."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "presets", here.parent.parent / "presets"):
        if (candidate / "models").is_dir() or (candidate / "hardware").is_dir():
            return candidate
    raise FitcheckError("fitcheck's presets folder is missing: reinstall the package")


def read_yaml(path: Path, max_bytes: int = MAX_PRESET_BYTES) -> Any:
    """Read a YAML file with the safe loader, refusing files over ``max_bytes``."""
    import yaml

    size = path.stat().st_size
    if size > max_bytes:
        raise FitcheckError(f"{path} is {size} bytes, over the {max_bytes}-byte limit for a preset file")
    try:
        with path.open("r", encoding="utf-8") as fh:
            # libyaml's safe loader when present: same safe constructors, about 10x faster
            loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            return yaml.load(fh, Loader=loader)  # a safe loader, never the full one
    except yaml.YAMLError as exc:
        raise FitcheckError(f"{path} is not valid YAML: {str(exc).splitlines()[0]}") from None


@functools.cache
def _index(kind: str) -> dict[str, Path]:
    folder = presets_root() / kind
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def preset_ids(kind: str) -> list[str]:
    """All preset ids of a kind (``models`` or ``hardware``)."""
    return list(_index(kind))


@functools.cache
def load_preset(kind: str, preset_id: str) -> dict[str, Any]:
    """The raw mapping of one preset; ``NotFoundError`` with the closest ids when unknown."""
    index = _index(kind)
    path = index.get(preset_id.lower())
    if path is None:
        hint = suggest(preset_id, index)
        what = "model" if kind == "models" else "hardware"
        listing = "fitcheck models" if kind == "models" else "fitcheck hw list"
        raise NotFoundError(
            f"unknown {what} preset '{preset_id}'" + (f"; {hint}" if hint else "") + f" (see `{listing}`)"
        )
    data = read_yaml(path)
    if not isinstance(data, dict) or data.get("id") != path.stem:
        raise FitcheckError(f"{path}: a preset must be a mapping whose id equals the file stem")
    return data
