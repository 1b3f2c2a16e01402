"""A one-line progress report on stderr for work that can take more than a second.

The core stays pure: a long search takes an optional ``progress`` callback and calls it with a
short message; without one it asks `current()`, which is the reporter a caller installed with
``reporting(...)`` (the CLI installs a `StderrProgress` around ``api.plan``), or None.
`StderrProgress` writes only on a terminal and only once the work has run for `DELAY_S` (a fast
plan prints nothing), rewrites one line with ``\\r``, and clears it when done (stderr is chatter,
stdout stays data).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import TextIO

from fitcheck.terminal import printable

#: Work shorter than this shows no progress at all.
DELAY_S = 1.0

Progress = Callable[[str], None]

_CURRENT: ContextVar[Progress | None] = ContextVar("fitcheck_progress", default=None)


def current() -> Progress | None:
    """The progress reporter installed by `reporting`, if any."""
    return _CURRENT.get()


@contextlib.contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Install ``progress`` for long searches called inside this block."""
    token = _CURRENT.set(progress)
    try:
        yield progress
    finally:
        _CURRENT.reset(token)


class StderrProgress:
    """``progress(message)`` rewrites ``fitcheck: <label>: <message>`` on a terminal's stderr."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        clock: Callable[[], float] = time.monotonic,
        force: bool = False,
    ) -> None:
        self.label, self.clock = label, clock
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = force or self.stream.isatty()
        self.start = clock()
        self.shown = False

    def __call__(self, message: str) -> None:
        if self.enabled and self.clock() - self.start >= DELAY_S:
            self.stream.write(f"\r\x1b[Kfitcheck: {printable(self.label)}: {printable(message)}")
            self.stream.flush()
            self.shown = True

    def __enter__(self) -> StderrProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
