"""Errors with exit codes.

Every error a user can cause is a `FitcheckError`: the CLI prints its one-line message on stderr and
exits with its code, never a traceback (unless ``--debug``). Exit codes follow the ``diff``
convention of the CLI contract: 0 answered / fits, 1 does not fit, 2 trouble.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from enum import IntEnum


class ExitCode(IntEnum):
    """Process exit codes (design.md section 2)."""

    OK = 0
    DOES_NOT_FIT = 1
    TROUBLE = 2


class FitcheckError(Exception):
    """A problem the user can fix; ``str(err)`` is one line saying what is wrong and what would work."""

    exit_code: ExitCode = ExitCode.TROUBLE


class InputError(FitcheckError):
    """A value typed by the user is malformed or out of range."""


class NotFoundError(FitcheckError):
    """A preset id, file or hardware name that does not exist."""


class ModelSourceError(FitcheckError):
    """A model file or folder that cannot be read as a supported architecture."""


class OptionError(FitcheckError):
    """An option that does not apply to this model, method or backend."""


class MissingExtraError(FitcheckError):
    """An optional dependency (torch, transformers, ...) is needed for this command."""


def compact(name: str) -> str:
    """A name with case, spaces, hyphens and other punctuation dropped (``RTX 4090`` -> ``rtx4090``): the
    spelling lookups forgive (hardware ids, a config's class names)."""
    return "".join(ch for ch in name.lower() if ch.isascii() and ch.isalnum())


def suggest(name: str, candidates: Iterable[str], n: int = 3) -> str:
    """Return a ``did you mean ...?`` tail for an unknown name, or an empty string.

    Uses difflib's ratio (standard library, no dependency); substring matches come first because
    users type prefixes such as ``llama-3`` or ``4090``.
    """
    pool = sorted(set(candidates))
    low = name.lower()
    contains = [c for c in pool if low and low in c]
    close = difflib.get_close_matches(low, pool, n=n, cutoff=0.5)
    picks: list[str] = []
    for c in contains[:n] + close:
        if c not in picks:
            picks.append(c)
    if not picks:
        return ""
    return "did you mean " + ", ".join(picks[:n]) + "?"
