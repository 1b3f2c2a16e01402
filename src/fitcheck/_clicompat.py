"""Click's exception classes as typer raises them.

typer >= 0.25 vendors click as ``typer._click`` (with ``Exit``/``Abort`` in ``typer`` itself); older
releases use ``click``. Both sets are returned so either is caught.
"""

from __future__ import annotations

from typing import Any

import typer


def click_exceptions() -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """(Exit classes, ClickException classes, Abort classes)."""
    import click

    exits: list[Any] = [typer.Exit, click.exceptions.Exit]
    errors: list[Any] = [click.ClickException]
    aborts: list[Any] = [getattr(typer, "Abort", click.exceptions.Abort), click.exceptions.Abort]
    try:
        from typer._click import exceptions as vendored  # type: ignore[import-not-found]

        errors.append(vendored.ClickException)
    except ImportError:
        pass
    return tuple(exits), tuple(errors), tuple(aborts)
