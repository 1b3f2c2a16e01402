"""Click's exception classes as typer raises them.

typer >= 0.25 vendors click as ``typer._click`` (with ``Exit``/``Abort`` in ``typer`` itself) and no
longer installs click; older releases use ``click``. Whichever are importable are returned, so either
is caught.
"""

from __future__ import annotations

import importlib
from typing import Any

import typer


def click_exceptions() -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """(Exit classes, ClickException classes, Abort classes)."""
    exits: list[Any] = [typer.Exit]
    errors: list[Any] = []
    aborts: list[Any] = [typer.Abort] if hasattr(typer, "Abort") else []
    for name in ("typer._click.exceptions", "click.exceptions"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        errors.append(mod.ClickException)
        for attr, bucket in (("Exit", exits), ("Abort", aborts)):
            if hasattr(mod, attr):
                bucket.append(getattr(mod, attr))
    return tuple(exits), tuple(errors), tuple(aborts)


def given_parameters() -> frozenset[str]:
    """Names of the current command's parameters the user typed (or set through the environment).

    A typer default and a typed value look the same to the command; click's parameter source tells
    them apart, which ``--from`` needs (flags on the command line override the file, defaults do not).
    """
    ctx = None
    for name in ("typer._click.globals", "click.globals"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        ctx = mod.get_current_context(silent=True)
        if ctx is not None:
            break
    if ctx is None:
        return frozenset()
    out = set()
    for name in ctx.params:
        source = ctx.get_parameter_source(name)
        if source is not None and source.name in ("COMMANDLINE", "ENVIRONMENT", "PROMPT"):
            out.add(name)
    return frozenset(out)
