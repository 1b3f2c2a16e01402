"""Writing emitted text: to stdout, or atomically into files (temp file + rename), never clobbering.

Every destination is checked before anything is written, so a refusal (an existing file without
``--force``) writes nothing. Each file is written to a temporary file in the same folder, flushed
and fsynced, then renamed into place: a failed write leaves no partial file. Without ``--force``
the rename is a hard link, which fails if the name appeared meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from fitcheck.errors import FitcheckError


class WriteError(FitcheckError):
    """A file could not be written (exists without --force, permission, disk full, ...)."""


def _regular_or_absent(p: Path) -> bool:
    """True when ``p`` (followed through a link) is a regular file, False when nothing is there.

    Raises:
        WriteError: a folder, a device, a FIFO, a dangling link, a file this command read (its input),
            or a path the system refuses.
    """
    from fitcheck.fileio import was_read

    try:
        st = p.stat()  # follows a symlink: what would be overwritten
        mode = st.st_mode
    except FileNotFoundError:
        if os.path.lexists(p):
            raise WriteError(f"{p} is a dangling symbolic link; remove it first") from None
        return False
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        raise WriteError(f"cannot write {p}: {getattr(exc, 'strerror', None) or exc}") from None
    if stat.S_ISDIR(mode):
        raise WriteError(f"{p} is a folder")
    if not stat.S_ISREG(mode):
        from fitcheck.fileio import file_kind

        raise WriteError(f"{p} is {file_kind(mode)}; fitcheck writes regular files only")
    if was_read(st):
        raise WriteError(f"{p} is a file this command read (its input); write to another name")
    return True


def check_destinations(paths: Sequence[Path], force: bool) -> None:
    """Refuse existing files (without ``force``), anything but a regular file, and duplicate names."""
    seen: set[str] = set()
    for p in paths:
        if "\0" in str(p):
            raise WriteError(f"cannot write {p}: a file name cannot hold a NUL byte")
        key = os.path.realpath(p)  # one file by two names (a linked folder, ../) is named twice
        if key in seen:
            raise WriteError(f"{p} is named twice")
        seen.add(key)
        if _regular_or_absent(p) and not force:
            raise WriteError(f"{p} exists; add --force to overwrite it")


@contextlib.contextmanager
def _signals_unwind() -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into an exception while writing, so ``finally`` removes the temp file."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    wanted = [s for s in ("SIGTERM", "SIGHUP") if hasattr(signal, s)]
    old = {name: signal.signal(getattr(signal, name), _raise) for name in wanted}
    try:
        yield
    finally:
        for name, handler in old.items():
            signal.signal(getattr(signal, name), handler)


def write_atomic(path: Path, text: str | bytes, force: bool) -> None:
    """Write ``text`` (or bytes: a PNG chart) to ``path`` through a temporary file in the same folder."""
    with _signals_unwind():
        _write_atomic(path, text, force)


def _write_atomic(path: Path, text: str | bytes, force: bool) -> None:
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        data = text if isinstance(text, bytes) else utf8(text)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        if force:
            _regular_or_absent(path)  # checked again just before replacing
            os.replace(tmp, path)
        else:
            _link_no_clobber(tmp, path)
    except FileExistsError:
        raise WriteError(f"{path} exists; add --force to overwrite it") from None
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _link_no_clobber(tmp: str, path: Path) -> None:
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise
    except OSError:  # no hard links here (some network or FAT file systems): check, then rename
        if path.exists():
            raise FileExistsError(path) from None
        os.replace(tmp, path)


def write_all(files: Sequence[tuple[Path, str]], force: bool) -> list[Path]:
    """Write every file (all destinations checked first); returns the paths written."""
    check_destinations([p for p, _ in files], force)
    done: list[Path] = []
    for path, text in files:
        write_atomic(path, text, force)
        done.append(path)
    return done


def utf8(text: str) -> bytes:
    """The text as UTF-8; a lone surrogate (a non-UTF-8 byte of a file name the user typed, kept by
    Python's ``surrogateescape``) is written as its escape (``\\udce9``), so the file stays valid UTF-8
    text its trainer's parser can read instead of the write failing."""
    return text.encode("utf-8", "backslashreplace")


def write_stdout(text: str) -> None:
    sys.stdout.write(utf8(text).decode("utf-8"))
