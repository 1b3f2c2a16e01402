"""Build plans for tests the way the command does, without the CLI."""

from __future__ import annotations

from typing import Any

from fitcheck.hardware.budget import apply_headroom, cpu_target, resolve_target
from fitcheck.hardware.detected import CpuMemory
from fitcheck.models import LlmSetup, Target
from fitcheck.planner.models import Plan, PlanRequest

GIB = 1 << 30
BASE_KEYS = ("trainer", "dora", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout", "double_quant")


def cpu_machine(total_gib: int = 64, available_gib: int = 48) -> Target:
    """A CPU-only machine with this much RAM (no probing)."""
    mem = CpuMemory(total_bytes=total_gib * GIB, available_bytes=available_gib * GIB, method="test")
    return apply_headroom(cpu_target(mem), None)


def target(on: str) -> Target:
    return cpu_machine() if on == "cpu" else resolve_target(on)


def request(t: Target, **kw: Any) -> PlanRequest:
    base_kw = {k: kw.pop(k) for k in BASE_KEYS if k in kw}
    base_kw.setdefault("trainer", "hf")
    base = LlmSetup(backend=t.backend, gpus=t.gpus, **base_kw)
    return PlanRequest(base=base, **kw)


def plan_for(model: str, on: str, **kw: Any) -> Plan:
    """`fitcheck.api.plan` for a model id and a target id (``cpu``: a 64 GiB machine, no probing)."""
    from fitcheck import api

    result = api.plan(model, target(on), **kw)
    assert isinstance(result, Plan)
    return result
