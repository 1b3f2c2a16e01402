"""How long the planner's search takes for one model (issue #5: under 0.2 s), measured, not asserted.

Times `fitcheck.planner.plan.make_plan` in-process (imports and the catalog already loaded; the
first call in the process reported separately), for the default request (``--method auto``: the whole grid
of three methods) and for cases where nothing fits (which also searches the smallest change).

Then an LLM plan against a diffusion plan in the same run (issue #9: the diffusion plan within 3x
of the LLM plan): ``fitcheck plan llama-3.1-8b`` and ``fitcheck plan sdxl`` on an RTX 3060 12GB,
each as a fresh process (what a user waits for: imports, resolution, search, rendering), median
wall time and median CPU time (user + system of the child: steadier than wall time on a shared
machine), and the diffusion search in-process with its simulation caches cleared before each run.

Run: PYTHONPATH=src python bench/plan_speed.py [--runs 7] [--only-ratio]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from fitcheck.api import device_for, other_targets
from fitcheck.hardware.budget import resolve_target
from fitcheck.models import DiffusionSetup, LlmSetup
from fitcheck.planner.models import Plan, PlanRequest
from fitcheck.planner.plan import make_plan
from fitcheck.sources.resolve import resolve_model

CASES = [
    # model, target, method, trainer, min_seq_len
    ("llama-3.1-8b", "rtx-4090", "auto", "hf", None),
    ("llama-3.1-8b", "rtx-3060-12gb", "auto", "hf", None),
    ("qwen2.5-7b", "a100-80gb", "auto", "axolotl", None),
    ("llama-3.1-70b", "h100-80gb", "auto", "hf", None),
    ("mixtral-8x7b", "h100-80gb", "auto", "hf", None),
    ("qwen2.5-7b", "apple-m3-max-36gb", "auto", "mlx", None),
    ("llama-3.1-8b", "rtx-4090", "auto", "hf", 256),  # four sequence lengths: 2048 ... 256
    ("llama-3.1-405b", "rtx-4090", "auto", "hf", None),  # nothing fits: + smallest change
    ("qwen2.5-7b", "rtx-4090", "lora", "hf", None),  # tight: + the changes that would fit the likely range
    ("llama-3.1-70b", "rtx-4090", "lora", "hf", None),  # nothing fits with LoRA: + its changes
]


def one(model: str, on: str, method: str, trainer: str, floor: int | None) -> tuple[Plan, float, float]:
    """The plan, its wall seconds and its CPU seconds (this process)."""
    spec = resolve_model(model)
    target = resolve_target(on)
    device = device_for(target)
    others = other_targets(target, None)
    base = LlmSetup(trainer=trainer, backend=target.backend, gpus=target.gpus)
    req = PlanRequest(base=base, method=method, min_seq_len=floor)
    t, c = time.perf_counter(), time.process_time()
    plan = make_plan(spec, target, device, req, others)
    return plan, time.perf_counter() - t, time.process_time() - c


#: (label, command after ``fitcheck``) of the LLM-vs-diffusion comparison.
PAIR = (
    ("llm", ["plan", "llama-3.1-8b", "--on", "rtx-3060-12gb", "--format", "json"]),
    ("diffusion", ["plan", "sdxl", "--on", "rtx-3060-12gb", "--format", "json"]),
)


def cli_times(args: list[str], runs: int) -> tuple[float, float]:
    """Median (wall, CPU) seconds of ``fitcheck ARGS`` as a fresh process."""
    walls, cpus = [], []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "fitcheck", *args], stdout=subprocess.DEVNULL, env=env)
        walls.append(time.perf_counter() - t)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def diffusion_in_process(runs: int) -> float:
    """Median CPU seconds of `plan_diffusion` for sdxl on an RTX 3060 12GB, caches cleared each run."""
    from fitcheck.diffusion.plan import plan_diffusion
    from fitcheck.diffusion.sources import spec_from_preset
    from fitcheck.diffusion.step import clear_caches

    spec, target = spec_from_preset("sdxl"), resolve_target("rtx-3060-12gb")
    times = []
    for _ in range(runs):
        clear_caches()
        t = time.process_time()
        plan_diffusion(spec, DiffusionSetup(trainer="kohya"), target)
        times.append(time.process_time() - t)
    return statistics.median(times)


def ratio(runs: int) -> None:
    print(f"{'fitcheck ...':58} {'wall':>8} {'cpu':>8}")
    got = {}
    for label, args in PAIR:
        wall, cpu = cli_times(args, runs)
        got[label] = (wall, cpu)
        print(f"{' '.join(args):58} {wall:7.2f}s {cpu:7.2f}s")
    (lw, lc), (dw, dc) = got["llm"], got["diffusion"]
    print(f"diffusion / llm: {dw / lw:.1f}x wall, {dc / lc:.1f}x cpu (target: within 3x)")
    print(f"plan_diffusion sdxl in-process, cold caches: {diffusion_in_process(runs):.2f}s cpu (median)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--only-ratio", action="store_true", help="only the LLM-vs-diffusion comparison")
    args = ap.parse_args()
    if args.only_ratio:
        ratio(args.runs)
        return
    print(
        f"{'model':16} {'target':18} {'method':8} {'trainer':8} {'grid':>5} {'est':>4} {'first':>8} "
        f"{'median':>8} {'cpu min':>8}  verdict"
    )
    for case in CASES:
        plan, first, _ = one(*case)
        runs = [one(*case) for _ in range(args.runs)]
        wall = statistics.median(r[1] for r in runs)
        cpu = min(r[2] for r in runs)  # the least CPU time: the steadiest figure on a shared machine
        model, on, method, trainer, floor = case
        label = f"{method}" + (f"/{floor}" if floor else "")
        print(
            f"{model:16} {on:18} {label:8} {trainer:8} {plan.grid_points:5} {plan.estimates_run:4} "
            f"{first * 1000:6.1f}ms {wall * 1000:6.1f}ms {cpu * 1000:6.1f}ms  {plan.verdict}"
        )
    print()
    ratio(args.runs)


if __name__ == "__main__":
    main()
