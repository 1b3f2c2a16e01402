"""How long the planner's search takes for one model (issue #5: under 0.2 s), measured, not asserted.

Times `fitcheck.planner.plan.make_plan` in-process (imports and the catalog already loaded; the
first call in the process reported separately), for the default request (``--method auto``: the whole grid
of three methods) and for cases where nothing fits (which also searches the smallest change).

Run: PYTHONPATH=src python bench/plan_speed.py [--runs 7]
"""

from __future__ import annotations

import argparse
import statistics
import time

from fitcheck.api import device_for, other_targets
from fitcheck.hardware.budget import resolve_target
from fitcheck.models import LlmSetup
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
]


def one(model: str, on: str, method: str, trainer: str, floor: int | None) -> tuple[Plan, float]:
    spec = resolve_model(model)
    target = resolve_target(on)
    device = device_for(target)
    others = other_targets(target, None)
    base = LlmSetup(trainer=trainer, backend=target.backend, gpus=target.gpus)
    req = PlanRequest(base=base, method=method, min_seq_len=floor)
    t = time.perf_counter()
    plan = make_plan(spec, target, device, req, others)
    return plan, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    print(
        f"{'model':16} {'target':18} {'method':8} {'trainer':8} {'grid':>5} {'est':>4} {'first':>8} "
        f"{'median':>8}  fits"
    )
    for case in CASES:
        plan, first = one(*case)
        times = [one(*case)[1] for _ in range(args.runs)]
        model, on, method, trainer, floor = case
        label = f"{method}" + (f"/{floor}" if floor else "")
        print(
            f"{model:16} {on:18} {label:8} {trainer:8} {plan.grid_points:5} {plan.estimates_run:4} "
            f"{first * 1000:6.1f}ms {statistics.median(times) * 1000:6.1f}ms  {plan.fits}"
        )


if __name__ == "__main__":
    main()
