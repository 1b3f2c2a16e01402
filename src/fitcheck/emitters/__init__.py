"""Emitters: turn a plan into files the trainers accept. One module per format, a registry by name.

Each module is pure (text in, text out) and provides ``NAME``, ``TRAINER`` (the regime the plan
must have been estimated with; None for trainer-neutral files), ``DESCRIPTION``, ``check(plan,
ctx)`` (raise `OptionError` when the format cannot express the plan) and ``emit(plan, ctx) ->
{file name: text}`` (one file for the LLM trainers' configs, two for kohya: config and dataset).
Writing files is separate (`fitcheck.emitters.writer`). The registry maps format names to module
paths, so nothing is imported until a format is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Protocol

from fitcheck.errors import OptionError, suggest

if TYPE_CHECKING:
    from fitcheck.emitters.common import EmitContext
    from fitcheck.planner.models import Plan


class Emitter(Protocol):
    """What a format module provides."""

    NAME: str
    TRAINER: str | None
    DESCRIPTION: str

    def check(self, plan: Plan, ctx: EmitContext) -> None: ...

    def emit(self, plan: Plan, ctx: EmitContext) -> dict[str, str]: ...


#: Format name -> module.
REGISTRY: dict[str, str] = {
    "hf.yaml": "fitcheck.emitters.hf",
    "axolotl.yaml": "fitcheck.emitters.axolotl",
    "llamafactory.yaml": "fitcheck.emitters.llamafactory",
    "mlx.yaml": "fitcheck.emitters.mlx",
    "env.sh": "fitcheck.emitters.envsh",
    "kohya.toml": "fitcheck.emitters.kohya",
    "deepspeed.json": "fitcheck.emitters.deepspeed",
    "accelerate.yaml": "fitcheck.emitters.accelerate",
}
#: Formats for diffusion models only.
DIFFUSION_ONLY = frozenset({"kohya.toml"})
#: The trainer each format's config runs (what the plan is estimated with).
TRAINERS: dict[str, str | None] = {
    "hf.yaml": "hf",
    "axolotl.yaml": "axolotl",
    "llamafactory.yaml": "llamafactory",
    "mlx.yaml": "mlx",
    "env.sh": None,
    "kohya.toml": "kohya",
    "deepspeed.json": None,
    "accelerate.yaml": None,
}


def format_for(filename: str, explicit: str | None = None) -> str:
    """The format of an output file: ``--emit-format``, else the file name's ending (``run.hf.yaml``)."""
    if explicit is not None:
        if explicit not in REGISTRY:
            hint = suggest(explicit, REGISTRY)
            raise OptionError(
                f"unknown --emit-format '{explicit}'"
                + (f"; {hint}" if hint else "")
                + f" (formats: {', '.join(REGISTRY)})"
            )
        return explicit
    base = filename.replace("\\", "/").split("/")[-1]
    matches = [
        name for name in REGISTRY if base == name or base.endswith("." + name) or base.endswith("-" + name)
    ]
    if not matches:
        raise OptionError(
            f"cannot tell the format of '{filename}' from its name: call it e.g. my-run.hf.yaml, or give "
            f"--emit-format ({', '.join(REGISTRY)})"
        )
    return max(matches, key=len)


def get(name: str) -> Emitter:
    """The emitter module of a format."""
    try:
        module = importlib.import_module(REGISTRY[name])
    except ModuleNotFoundError as exc:
        if exc.name != REGISTRY[name]:
            raise
        raise OptionError(
            f"{name} is not available in this build (it is delivered with diffusion support)"
        ) from None
    return module  # type: ignore[return-value]
