"""Time the JSON nesting bound and a whole safetensors header read on large headers (fileio.loads).

Run: python bench/json_scan.py [--mb 100] [--old]. Builds, in memory and in a temporary file:

- ``header``: a realistic safetensors header of about MB megabytes (one object and two arrays per tensor);
- ``mountains``: valid JSON nested exactly to the bound, over and over (the scan's most passes; MB / 8);
- ``strings``: brackets inside strings (the scan cannot tell; the parsed document is walked);
- ``deep``: a million unclosed ``[`` (refused before parsing).

and prints the seconds of ``fitcheck.fileio.deeper_than`` (the pre-scan), ``loads`` (scan + parse + bound)
and, for ``header``, ``read_header_sized`` + ``tensors`` (what ``estimate model.safetensors`` does).
``--old`` also times the pure-Python character loop the scan replaced (session 4: ~10 s per 100 MB).
"""

from __future__ import annotations

import argparse
import json
import struct
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from fitcheck.errors import ModelSourceError
from fitcheck.fileio import MAX_JSON_DEPTH, deeper_than, loads
from fitcheck.sources.safetensors_header import read_header_sized, tensors


def header_text(mb: float) -> str:
    """A safetensors header of about ``mb`` megabytes: MoE expert weights, as a large shard has."""
    parts, size, off, i = [], 0, 0, 0
    while size < mb * 1e6:
        n = 2048 * 7168 * 2
        name = f"model.layers.{i // 384}.mlp.experts.{i % 384}.gate_proj.weight"
        info = {"dtype": "BF16", "shape": [2048, 7168], "data_offsets": [off, off + n]}
        entry = json.dumps({name: info})[1:-1]
        parts.append(entry)
        size, off, i = size + len(entry) + 1, off + n, i + 1
    return "{" + ",".join(parts) + "}"


def old_depth(text: str) -> int:
    """The session-4 scan, kept here only as the baseline: one Python step per character."""
    depth = deepest = 0
    in_str = escaped = False
    for ch in text:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def timed(fn: Callable[[], object]) -> tuple[float, str]:
    t = time.perf_counter()
    try:
        out = fn()
        what = type(out).__name__ if not isinstance(out, (bool, type(None))) else repr(out)
    except ModelSourceError as exc:
        what = "refused: " + str(exc).split(": ", 1)[-1][:50]
    return time.perf_counter() - t, what


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=100.0, help="size of the header and mountain documents")
    ap.add_argument("--old", action="store_true", help="also time the pure-Python loop it replaced")
    args = ap.parse_args()
    level = "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1)  # inside one list: exactly the bound
    cases = {
        "header": header_text(args.mb),
        "mountains": "[" + ",".join([level] * int(args.mb * 1e6 / len(level) / 8)) + "]",
        "strings": json.dumps(['x"[' + "{" * 3 + '"'] * int(args.mb * 1e6 / 14)),
        "deep": "[" * 1_000_000,
    }
    for name, text in cases.items():
        scan, told = timed(lambda text=text: deeper_than(text, MAX_JSON_DEPTH))
        full, parsed = timed(lambda text=text, name=name: loads(text, name))
        line = f"{name:10s} {len(text) / 1e6:7.1f} MB  scan {scan:6.2f} s ({told})"
        line += f"  loads {full:6.2f} s ({parsed})"
        if args.old:
            old, _ = timed(lambda text=text: old_depth(text))
            line += f"  old loop {old:6.2f} s"
        print(line, flush=True)
    raw = cases["header"].encode()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(struct.pack("<Q", len(raw)) + raw)
        t = time.perf_counter()
        header, _ = read_header_sized(path)
        read = time.perf_counter() - t
        t = time.perf_counter()
        found = tensors(header, path)
        check = time.perf_counter() - t
    print(f"header file: read_header_sized {read:.2f} s, tensors() {check:.2f} s ({len(found):,} tensors)")


if __name__ == "__main__":
    main()
