"""``env.sh``: the environment variables of the plan, each with why; source it before training.

Variables whose risk outweighs their use for this plan (the MPS watermark) are written commented
out, with the risk, so the choice is visible.
"""

from __future__ import annotations

import shlex

from fitcheck.emitters.common import EmitContext, chosen, comment_block, header
from fitcheck.planner.models import Plan

NAME = "env.sh"
TRAINER: str | None = None
DESCRIPTION = "environment variables (bash/zsh: source env.sh)"


def check(plan: Plan, ctx: EmitContext) -> None:
    """Any plan that fits can be written."""
    chosen(plan)


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def text(plan: Plan, ctx: EmitContext) -> str:
    """The shell text: comments and ``export`` lines."""
    check(plan, ctx)
    head = header(plan, ctx, "environment for this plan", f"source {NAME} (bash or zsh), then start training")
    body: list[str] = []
    for var in plan.env:
        body.append("")
        body += [f"# {var.why}", f"# source: {var.source}"]
        line = f"export {var.name}={shlex.quote(var.value)}"
        body.append(line if var.active else f"# {line}")
    if not plan.env:
        body += ["", f"# nothing to set on {plan.target.backend} for this plan"]
    return comment_block(head) + "\n".join(body) + "\n"
