"""Read the trainer option lists in tests/data/trainer_keys/ (TSV after '#' header lines)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

KEYS = Path(__file__).parent / "data" / "trainer_keys"


@functools.cache
def table(name: str) -> tuple[list[str], list[dict[str, str]], list[str]]:
    """(header comment lines, rows as dicts, column names) of one key file."""
    comments: list[str] = []
    rows: list[dict[str, str]] = []
    cols: list[str] = []
    for line in (KEYS / name).read_text().splitlines():
        if line.startswith("#"):
            comments.append(line)
            continue
        if not line.strip():
            continue
        cells = line.split("\t")
        if not cols:
            cols = cells
            continue
        rows.append(dict(zip(cols, cells + [""] * (len(cols) - len(cells)), strict=True)))
    return comments, rows, cols


def fields(name: str, key: str = "name") -> dict[str, dict[str, str]]:
    return {r[key]: r for r in table(name)[1]}


def header_choices(name: str, label: str) -> set[str]:
    """Values listed in a header comment after ``label`` (a|b|c)."""
    for line in table(name)[0]:
        if label in line:
            tail = line.split(label, 1)[1]
            m = re.search(r"([A-Za-z0-9_.]+(?:\|[A-Za-z0-9_.]+)+)", tail)
            if m:
                return set(m.group(1).split("|"))
    raise KeyError(label)


def type_ok(declared: str, value: Any) -> bool:
    """Whether a YAML value matches a declared Python type string (unions, Optional, Literal)."""
    if value is None:
        return "None" in declared or "null" in declared or "Optional" in declared
    if isinstance(value, bool):
        return "bool" in declared or ("Literal" in declared and str(value) in declared)
    if isinstance(value, int):
        return bool(re.search(r"\bint\b", declared)) or "float" in declared
    if isinstance(value, float):
        return "float" in declared
    if isinstance(value, str):
        enum_class = bool(re.fullmatch(r"[A-Z][A-Za-z]+", declared.strip()))
        return bool(re.search(r"\bstr\b", declared)) or "Literal" in declared or enum_class or "." in declared
    if isinstance(value, list):
        return "list" in declared
    if isinstance(value, dict):
        return "dict" in declared
    return False


def choices_ok(row: dict[str, str], value: Any) -> bool:
    """A string value must be one of the listed choices, when the list is closed."""
    choices = row.get("choices", "")
    if not choices or not isinstance(value, str):
        return True
    return value in choices.split("|")
