"""Median wall time of `fitcheck estimate 7B --method lora` against `python -c pass`.

Run: python bench/cli_latency.py [--runs 15]. Prints both medians and their difference.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time


def median_time(cmd: list[str], runs: int) -> float:
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    args = ap.parse_args()
    exe = shutil.which("fitcheck")
    cmd = [exe] if exe else [sys.executable, "-m", "fitcheck"]
    base = median_time([sys.executable, "-c", "pass"], args.runs)
    est = median_time([*cmd, "estimate", "7B", "--method", "lora"], args.runs)
    js = median_time([*cmd, "estimate", "7B", "--method", "lora", "--format", "json"], args.runs)
    hlp = median_time([*cmd, "--help"], args.runs)
    print(f"python -c pass                          median {base * 1000:7.1f} ms")
    print(f"fitcheck --help                         median {hlp * 1000:7.1f} ms")
    print(
        f"fitcheck estimate 7B --method lora      median {est * 1000:7.1f} ms"
        f"  (+{(est - base) * 1000:.1f} ms)"
    )
    print(
        f"  ... --format json                     median {js * 1000:7.1f} ms  (+{(js - base) * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    main()
