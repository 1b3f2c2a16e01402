"""Progress on stderr: only on a terminal, only after a second, one line cleared at the end."""

from __future__ import annotations

import io

from fitcheck.diffusion.plan import plan_diffusion
from fitcheck.diffusion.sources import spec_from_preset
from fitcheck.hardware.budget import resolve_target
from fitcheck.models import DiffusionSetup
from fitcheck.progress import DELAY_S, StderrProgress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_silent_when_fast_then_one_rewritten_line_cleared_at_the_end() -> None:
    out, clock = io.StringIO(), Clock()
    with StderrProgress("planning x", stream=out, clock=clock, force=True) as progress:
        progress("1 setup")
        assert out.getvalue() == ""
        clock.now = DELAY_S
        progress("2 setups")
        progress("3 setups")
    text = out.getvalue()
    assert "\n" not in text and text.count("\r") == 3
    assert "fitcheck: planning x: 3 setups" in text and text.endswith("\r\x1b[K")


def test_nothing_when_stderr_is_not_a_terminal() -> None:
    out, clock = io.StringIO(), Clock()
    with StderrProgress("planning x", stream=out, clock=clock) as progress:
        clock.now = 10 * DELAY_S
        progress("1 setup")
    assert out.getvalue() == ""


def test_the_diffusion_planner_reports_each_setup() -> None:
    seen: list[str] = []
    plan = plan_diffusion(
        spec_from_preset("sd15"), DiffusionSetup(), resolve_target("rtx-4090", None), progress=seen.append
    )
    assert len(seen) == plan.estimates_run and seen[-1].startswith(f"{plan.estimates_run} setups estimated")


def test_the_library_reports_through_the_installed_reporter() -> None:
    from fitcheck import api
    from fitcheck.progress import reporting

    seen: list[str] = []
    with reporting(seen.append):
        plan = api.plan("sd15", "rtx-4090")
    assert len(seen) == plan.estimates_run
