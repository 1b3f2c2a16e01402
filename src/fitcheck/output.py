"""stdout that never lies about the exit code.

A reader that goes away early (``fitcheck ... | head -1``) is no failure of fitcheck: the rest of
the answer is dropped quietly and the command still ends with its own exit code (0, 1), and files it
was asked to write are still written. A stdout that cannot be written at all (closed, a full
device) is trouble: exit 2 with one line on stderr. `guarded_stdout` swaps ``sys.stdout`` for a
wrapper that tells the two apart; `GuardedStdout.finish` flushes and turns what happened into the
final exit code.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import IO, Any

from fitcheck.errors import ExitCode, FitcheckError


class OutputError(FitcheckError):
    """stdout cannot be written (closed, a full device, an I/O error)."""


class GuardedStdout:
    """A text stream proxy: broken pipes are swallowed, other write failures raise `OutputError`."""

    def __init__(self, real: IO[str] | None) -> None:
        self._real = real
        self.gone = False

    def _fail(self, exc: OSError) -> None:
        if isinstance(exc, BrokenPipeError):
            self.gone = True
            _silence(self._real)
            return
        _silence(self._real)
        self.gone = True
        raise OutputError(f"cannot write the answer to stdout: {exc.strerror or exc}") from None

    def write(self, text: str) -> int:
        if self._real is None:
            raise OutputError("cannot write the answer to stdout: it is closed")
        if self.gone:
            return len(text)
        try:
            return self._real.write(text)
        except OSError as exc:
            self._fail(exc)
            return len(text)

    def flush(self) -> None:
        if self._real is None or self.gone:
            return
        try:
            self._real.flush()
        except OSError as exc:
            self._fail(exc)

    def isatty(self) -> bool:
        return bool(self._real is not None and not self.gone and self._real.isatty())

    def __getattr__(self, name: str) -> Any:
        if self._real is None:
            raise AttributeError(name)
        return getattr(self._real, name)


def _silence(stream: IO[str] | None) -> None:
    """Point the stream's descriptor at /dev/null so the interpreter's last flush cannot fail."""
    if stream is None:
        return
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, stream.fileno())
        os.close(devnull)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[GuardedStdout]:
    """Install a `GuardedStdout` for the duration of a command."""
    real = sys.stdout
    guard = GuardedStdout(real)
    sys.stdout = guard  # type: ignore[assignment]
    try:
        yield guard
    finally:
        sys.stdout = real


def finish(guard: GuardedStdout, code: int) -> int:
    """Flush what is left; a full device or closed stdout turns the exit code into 2 with one line."""
    try:
        guard.flush()
    except OutputError as exc:
        from fitcheck.terminal import error_line

        sys.stderr.write(f"fitcheck: error: {error_line(str(exc))}\n")
        return int(ExitCode.TROUBLE)
    return code
