"""Diffusion plans computed once per test session and shared by the test files that check them.

A plan searches tens of setups; tests/test_diffusion_golden.py and tests/test_diffusion_plan.py
ask for several of the same ones. Plans are frozen pydantic models, so sharing them is safe.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from fitcheck.diffusion.plan import plan_diffusion
from fitcheck.diffusion.sources import spec_from_preset
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.hardware.budget import resolve_target
from fitcheck.models import DiffusionSetup
from fitcheck.planner.models import Plan


@functools.cache
def spec(preset: str) -> DiffusionSpec:
    return spec_from_preset(preset)


def plan(preset: str, on: str, fields: dict[str, Any] | None = None, floor: int | None = None) -> Plan:
    """``plan_diffusion`` for kohya, memoised on its arguments."""
    return _plan(preset, on, json.dumps(fields or {}, sort_keys=True), floor)


@functools.cache
def _plan(preset: str, on: str, fields_json: str, floor: int | None) -> Plan:
    setup = DiffusionSetup(trainer="kohya", **json.loads(fields_json))
    return plan_diffusion(spec(preset), setup, resolve_target(on, None), floor)
