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
