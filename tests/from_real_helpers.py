"""What the real-config rounds (tests/test_from_real_b.py, _c.py) share: run ``check --from`` on a fixture,
the reading it poses, and its golden file."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli import main
from fitcheck.readers import read_config
from fitcheck.readers.neutral import is_neutral
from golden_helpers import check_golden


def run_check(
    path: Path, model: str | None, target: str, capsys: pytest.CaptureFixture[str]
) -> tuple[int, dict[str, Any] | None, str]:
    """``fitcheck check [MODEL] --from PATH --on TARGET --format json``: exit code, document, stderr."""
    args = ["check", *([model] if model else []), "--from", str(path), "--on", target, "--format", "json"]
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc in (0, 1) else None), err


def posed(
    path: Path, doc: dict[str, Any], rel: Callable[[str], str], not_understood: bool = False
) -> dict[str, Any]:
    """What the file reads to: the reader's result and the setup it poses (stable under engine changes),
    with the fixture folder's absolute path taken out by ``rel`` (the goldens hold on any checkout);
    ``not_understood``: also the unused keys that are not neutral."""
    read = read_config(str(path))
    out: dict[str, Any] = {
        "format": read.format,
        "trainer": read.trainer,
        "file_model": read.model,
        "values": dict(read.values),
        "keys": {k: rel(v) for k, v in read.keys.items()},  # a companion file's path, as the notes
        "notes": [rel(n) for n in read.notes],
        "unused": list(read.unused),
        "model": doc["model"],
        "setup": doc["setup"],
        "setup_origin": doc["setup_origin"],
    }
    if not_understood:
        out["not_understood"] = [k for k in read.unused if not is_neutral(k)]
    return out


def check_case_golden(golden: Path, name: str, data: dict[str, Any]) -> None:
    """The case's golden file (``a/b.yaml`` -> ``a__b.yaml.json``)."""
    path = golden / (name.replace("/", "__") + ".json")
    check_golden(path, json.dumps(data, indent=1, sort_keys=True) + "\n", name)
