"""Golden-file check shared by the tests that hold what a real file reads to."""

from __future__ import annotations

import os
from pathlib import Path


def check_golden(path: Path, text: str, name: str) -> None:
    """``text`` must equal the golden at ``path``; ``FITCHECK_UPDATE_GOLDEN=1`` (re)writes it."""
    if os.environ.get("FITCHECK_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden for {name}; FITCHECK_UPDATE_GOLDEN=1 writes it"
    assert text == path.read_text(), f"{name} reads differently; FITCHECK_UPDATE_GOLDEN=1 regenerates"
