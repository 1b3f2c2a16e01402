"""Pure parsers for what hardware tools print. No I/O: text in, numbers out.

Each parser is written against real captured output (tests/data/hw/ says which) and is tolerant
of what real machines print: ``[N/A]`` and ``[Requested functionality has been deprecated]``
placeholders, warning lines mixed into CSV (exit code 14, corrupted infoROM), older drivers
without a field, and decimal commas in numbers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fitcheck.units import KIB, MIB

_INVALID_FIELD_RE = re.compile(r"Field\s+[\"“”']([^\"“”']+)[\"“”']\s+is not a valid field to query")
_PLACEHOLDER_RE = re.compile(r"^\[.*\]$")


def smi_value(raw: str) -> str | None:
    """One CSV cell of nvidia-smi: ``None`` for ``[N/A]``, ``N/A`` and any other ``[...]`` placeholder."""
    value = raw.strip()
    if not value or value in {"N/A", "Not Supported"} or _PLACEHOLDER_RE.match(value):
        return None
    return value


def mib_to_bytes(raw: str | None) -> int | None:
    """``"81559"`` or ``"81559 MiB"`` (MiB) to bytes; ``None`` when absent or not a number."""
    if raw is None:
        return None
    m = re.match(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(?:MiB)?\s*$", raw)
    return int(float(m.group(1)) * MIB) if m else None


def parse_smi_csv(fields: Sequence[str], text: str) -> list[dict[str, str | None]]:
    """Rows of ``--query-gpu=... --format=csv,noheader,nounits``, keyed by field.

    Lines that do not split into exactly one cell per field (warnings such as ``WARNING: infoROM
    is corrupted``, blank lines) are skipped, so usable output is kept even when nvidia-smi
    exits non-zero. GPU names contain no commas, so a plain split is exact.
    """
    rows: list[dict[str, str | None]] = []
    for line in text.splitlines():
        cells = line.split(",")
        if len(cells) != len(fields) or not line.strip():
            continue
        rows.append({f: smi_value(c) for f, c in zip(fields, cells, strict=True)})
    return rows


def invalid_smi_fields(text: str) -> list[str]:
    """Fields nvidia-smi refused (``Field "memory.reserved" is not a valid field to query.``)."""
    return _INVALID_FIELD_RE.findall(text)


def _kv(line: str) -> tuple[str, str] | None:
    if ":" not in line:
        return None
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def parse_smi_q_mig(text: str) -> dict[str, list[dict[str, int | None]]]:
    """MIG devices per GPU from ``nvidia-smi -q``: {bus id: [{index, total, used, free} in bytes]}.

    ``--query-gpu`` reports the whole physical GPU even in MIG mode; the per-instance memory is
    only in ``-q`` ("MIG Device" blocks with "FB Memory Usage", "Shared FB Memory Usage" on
    newer drivers) and in the default table.
    """
    out: dict[str, list[dict[str, int | None]]] = {}
    gpu: str | None = None
    current: dict[str, int | None] | None = None
    in_fb, mig_indent = False, 0
    for line in text.splitlines():
        if re.match(r"^GPU [0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9]", line):
            gpu = line.split()[1].upper()
            out.setdefault(gpu, [])
            current, in_fb = None, False
            continue
        stripped = line.strip()
        if gpu is None or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if stripped == "MIG Device":
            current = {"index": None, "total": None, "used": None, "free": None}
            out[gpu].append(current)
            mig_indent, in_fb = indent, False
            continue
        if current is not None and indent <= mig_indent:
            current = None  # back at the GPU level: its own "FB Memory Usage" is the whole GPU's
        if current is None:
            continue
        if stripped.endswith("FB Memory Usage"):
            in_fb = True
            continue
        kv = _kv(stripped)
        if kv is None:
            in_fb = False
            continue
        key, value = kv
        if key == "Index" and current["index"] is None:
            current["index"] = int(value) if value.isdigit() else None
        elif in_fb and key in {"Total", "Used", "Free"}:
            current[key.lower()] = mib_to_bytes(value)
    return out


def parse_smi_list_mig(text: str) -> dict[tuple[int, int], str]:
    """MIG profile names from ``nvidia-smi -L``: {(gpu index, MIG device index): "3g.40gb"}."""
    names: dict[tuple[int, int], str] = {}
    gpu = -1
    for line in text.splitlines():
        g = re.match(r"^GPU (\d+):", line)
        if g:
            gpu = int(g.group(1))
            continue
        m = re.match(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):", line)
        if m and gpu >= 0:
            names[(gpu, int(m.group(2)))] = m.group(1)
    return names


def parse_rocm_smi_json(text: str) -> list[dict[str, Any]]:
    """Cards from ``rocm-smi --showproductname --showmeminfo vram --json``.

    Returns one mapping per ``cardN`` with ``index``, ``name``, ``total`` and ``used`` (bytes,
    from the string values rocm-smi prints) and ``gfx``. Keys that are not cards (``system``)
    are ignored.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return []
    if not isinstance(data, dict):
        return []
    cards: list[dict[str, Any]] = []
    for key, info in data.items():
        m = re.match(r"^card(\d+)$", key)
        if not m or not isinstance(info, Mapping):
            continue
        total = _int_or_none(info.get("VRAM Total Memory (B)"))
        if total is None:
            continue
        cards.append(
            {
                "index": int(m.group(1)),
                "name": str(info.get("Card Series") or info.get("Device Name") or key),
                "total": total,
                "used": _int_or_none(info.get("VRAM Total Used Memory (B)")),
                "gfx": info.get("GFX Version"),
            }
        )
    return sorted(cards, key=lambda c: c["index"])


def _int_or_none(value: Any) -> int | None:
    try:
        return int(str(value).strip())
    except (TypeError, ValueError):
        return None


def _amd_smi_mb(node: Any) -> int | None:
    """``{"value": 196592, "unit": "MB"}`` (amd-smi's MB are MiB) or a bare number, to bytes."""
    if isinstance(node, Mapping):
        value, unit = node.get("value"), str(node.get("unit", "MB")).upper()
    else:
        value, unit = node, "MB"
    number = _int_or_none(value)
    if number is None:
        return None
    return number * (1 if unit == "B" else (KIB if unit in {"KB", "KIB"} else MIB))


def parse_amd_smi_json(text: str) -> list[dict[str, Any]]:
    """GPUs from ``amd-smi metric --mem-usage --json`` (best effort: schema not seen in a real capture).

    Accepts a list of ``{"gpu": N, "mem_usage": {"total_vram": ..., "used_vram": ...}}`` or a
    mapping with such a list under ``gpu_data``.
    """
    try:
        data = json.loads(text)
    except ValueError:
        return []
    items = data.get("gpu_data", []) if isinstance(data, Mapping) else data
    gpus: list[dict[str, Any]] = []
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, Mapping):
            continue
        mem = item.get("mem_usage") or {}
        total = _amd_smi_mb(mem.get("total_vram")) if isinstance(mem, Mapping) else None
        if total is None:
            continue
        index = _int_or_none(item.get("gpu"))
        gpus.append(
            {
                "index": i if index is None else index,
                "name": str(item.get("market_name") or f"AMD GPU {i}"),
                "total": total,
                "used": _amd_smi_mb(mem.get("used_vram")),
                "gfx": None,
            }
        )
    return gpus


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` to bytes: ``{"MemTotal": ..., "MemAvailable": ...}`` (the file says kB = KiB)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s+kB)?\s*$", line)
        if m:
            out[m.group(1)] = int(m.group(2)) * (KIB if line.rstrip().endswith("kB") else 1)
    return out


#: cgroup v1 reports "no limit" as a huge page-aligned number (2^63 rounded down to the page size).
CGROUP_V1_UNLIMITED = 1 << 62


def parse_cgroup_bytes(text: str | None) -> int | None:
    """A cgroup memory file (``memory.max``, ``memory.limit_in_bytes``): bytes, ``None`` for no limit."""
    if text is None:
        return None
    value = text.strip()
    if value in {"", "max"} or not value.isdigit():
        return None
    number = int(value)
    return None if number >= CGROUP_V1_UNLIMITED else number


def cgroup_v2_path(proc_self_cgroup: str | None) -> str:
    """This process's cgroup v2 directory below /sys/fs/cgroup (``0::/path`` line), '' at the root."""
    for line in (proc_self_cgroup or "").splitlines():
        if line.startswith("0::"):
            return line[3:].strip().rstrip("/")
    return ""


def parse_sysctl_int(text: str | None) -> int | None:
    """``sysctl -n`` output as an integer; ``None`` when missing or not a number."""
    return _int_or_none(text) if text is not None else None


def first_line(text: str) -> str:
    """The first non-empty line, stripped (for one-line notes about a tool's answer)."""
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def dedupe(items: Iterable[str]) -> tuple[str, ...]:
    """Keep the first occurrence of each string, in order."""
    return tuple(dict.fromkeys(items))
