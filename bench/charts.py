"""Regenerate the pictures in README.md and docs/ with fitcheck's own commands (the chart extra).

Run from a checkout: ``python bench/charts.py``. Each picture is the output of the command printed
beside it; nothing is drawn by hand. The measure timeline traces Llama 3.1 8B on fake tensors (about
a minute on a 2-core machine, no memory used).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from fitcheck.cli import main

OUT = Path(__file__).resolve().parents[1] / "docs" / "img"

COMMANDS: list[list[str]] = [
    ["estimate", "llama-3.1-8b", "--method", "qlora", "--grad-ckpt", "--seq-len", "4096", "--on", "rtx-4090",
     "--chart", "estimate-llama-3.1-8b-qlora-rtx-4090.svg"],
    ["matrix", "--on", "rtx-4090", "--grad-ckpt", "--chart", "matrix-rtx-4090.svg"],
    ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--chart", "plan-llama-3.1-8b-rtx-4090.svg"],
    ["measure", "llama-3.1-8b", "--method", "lora", "--timeline", "timeline-llama-3.1-8b-lora.svg"],
]  # fmt: skip


def run(args: list[str]) -> int:
    """Run one command with its chart path under docs/img, overwriting the previous picture."""
    flag = "--timeline" if "--timeline" in args else "--chart"
    i = args.index(flag) + 1
    args = [*args[:i], str(OUT / args[i]), *args[i + 1 :], "--force", "--format", "json"]
    started = time.perf_counter()
    code = main(args)
    sys.stderr.write(f"fitcheck {' '.join(args)}: exit {code} in {time.perf_counter() - started:.1f} s\n")
    return code


if __name__ == "__main__":
    OUT.mkdir(parents=True, exist_ok=True)
    sys.exit(max(run(a) for a in COMMANDS) > 1)
