"""Environment variables for the plan, and the smallest change when nothing fits.

Environment variables are advice with a reason and a source; some are shown commented out in
``env.sh`` because their risk outweighs their use for this plan (the MPS watermark).
"""

from __future__ import annotations

from fitcheck.models import Target
from fitcheck.planner import rules as R
from fitcheck.planner.models import EnvVar
from fitcheck.planner.models import LlmCandidate as Candidate
from fitcheck.units import GIB

#: "Near the limit": the plan uses more than this share of the budget.
NEAR_LIMIT = 0.90


def _env(rule: str, name: str, value: str, active: bool, why: str) -> EnvVar:
    return EnvVar(name=name, value=value, active=active, why=why, source=R.RULES[rule].source)


def env_vars(chosen: Candidate, target: Target) -> tuple[EnvVar, ...]:
    """What to export before training, per backend, each with why (and when it is left off)."""
    s = chosen.setup
    share = chosen.reach_bytes / max(1, chosen.budget_bytes)  # the band's upper edge on the device
    out: list[EnvVar] = []
    if target.backend == "cuda":
        near = share > NEAR_LIMIT
        out.append(
            _env(
                "expandable-segments",
                "PYTORCH_CUDA_ALLOC_CONF",
                "expandable_segments:True",
                near,
                f"the plan may use up to {100 * share:.0f}% of the budget (the band's upper edge)"
                + (
                    ": expandable segments let the caching allocator grow blocks instead of fragmenting"
                    if near
                    else f", under the {100 * NEAR_LIMIT:.0f}% at which fitcheck turns this on"
                ),
            )
        )
    if target.backend == "mps" and s.trainer != "mlx":
        out.append(
            _env(
                "mps-fallback",
                "PYTORCH_ENABLE_MPS_FALLBACK",
                "1",
                True,
                "an operator MPS lacks runs on the CPU (slower, with a warning naming it) instead of "
                "stopping",
            )
        )
        out.append(
            _env(
                "mps-watermark",
                "PYTORCH_MPS_HIGH_WATERMARK_RATIO",
                "0.0",
                False,
                f"lifts PyTorch's cap on MPS allocations. RISK: the run can push macOS into swap (about 10x "
                f"slower) or freeze it. This plan needs {chosen.device_bytes / GIB:.1f} GiB of the "
                f"{chosen.budget_bytes / GIB:.1f} GiB working-set budget, under the default cap, so it "
                "stays off",
            )
        )
    return tuple(out)
