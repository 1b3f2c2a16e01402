"""Writing emitted text: to stdout, or atomically into files (temp file + rename), never clobbering.

Every destination is checked before anything is written, so a refusal (an existing file without
``--force``) writes nothing. Each file is written to a temporary file in the same folder, flushed
and fsynced, then renamed into place: a failed write leaves no partial file. Without ``--force``
the rename is a hard link, which fails if the name appeared meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from fitcheck.errors import FitcheckError


class WriteError(FitcheckError):
    """A file could not be written (exists without --force, permission, disk full, ...)."""


def check_destinations(paths: Sequence[Path], force: bool) -> None:
    """Refuse existing files (without ``force``), folders in the way and duplicate names."""
    seen: set[Path] = set()
    for p in paths:
        key = p.resolve()
        if key in seen:
            raise WriteError(f"{p} is named twice")
        seen.add(key)
        if p.is_dir():
            raise WriteError(f"{p} is a folder")
        if p.exists() and not force:
            raise WriteError(f"{p} exists; add --force to overwrite it")


def write_atomic(path: Path, text: str | bytes, force: bool) -> None:
    """Write ``text`` (or bytes: a PNG chart) to ``path`` through a temporary file in the same folder."""
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise WriteError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        if force:
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


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
