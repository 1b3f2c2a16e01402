"""Reading the files users point fitcheck at: bounded while reading, regular files only.

A size check by ``stat`` alone is not a bound: ``/dev/zero`` or a growing file reports a small size
and reads forever, and opening a FIFO blocks until a writer appears. So files are opened
non-blocking, checked with ``fstat`` on the opened descriptor (no race with a rename), refused
unless they are regular files, and read up to the bound plus one byte. JSON is parsed with a nesting
bound (checked before parsing by a C-speed scan where it can tell, else on the parsed document: Python's
parser recurses) and without ``NaN``/``Infinity``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from fitcheck.errors import ModelSourceError
from fitcheck.terminal import clipped
from fitcheck.units import MIB

#: Nesting deeper than this is no model or trainer config (real ones nest 3-6 levels).
MAX_JSON_DEPTH = 64

_KIND = (
    (stat.S_ISDIR, "a folder"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


#: (device, inode) of every regular file read during one command (`reading`), so a file the command
#: writes is never one it read: ``plan --from run.hf.yaml --emit run.hf.yaml --force`` would otherwise
#: replace the user's config with fitcheck's, and ``-o MODEL_DIR --emit config.json`` the model's config.
_READ: ContextVar[set[tuple[int, int]] | None] = ContextVar("fitcheck_files_read", default=None)


@contextmanager
def reading() -> Iterator[None]:
    """Record the files read inside the block (one CLI command); `was_read` asks about them."""
    token = _READ.set(set())
    try:
        yield
    finally:
        _READ.reset(token)


def was_read(st: os.stat_result) -> bool:
    """Whether the file with this ``stat`` was read by the current command (hard links and symlinks too)."""
    seen = _READ.get()
    return seen is not None and (st.st_dev, st.st_ino) in seen


#: Longer than any path the system accepts (PATH_MAX is 4,096 on Linux); NAME_MAX is 255 bytes.
MAX_PATH_CHARS = 4096
MAX_NAME_BYTES = 255


def could_be_path(text: str) -> bool:
    """Whether ``text`` can name a file at all: no NUL byte, no longer than PATH_MAX, no part over NAME_MAX
    bytes. Asking the system about anything else is an error, not "no such file" (``Path.exists`` raises
    ValueError on a NUL and OSError ENAMETOOLONG on a long name), so a name from a file is checked first."""
    if "\0" in text or len(text) > MAX_PATH_CHARS:
        return False
    return all(len(os.fsencode(part)) <= MAX_NAME_BYTES for part in text.split("/"))


def user_path(text: str) -> Path:
    """A path as the user typed it, ``~`` expanded; a ``~name`` whose user does not exist (pathlib raises
    RuntimeError) stays as typed, so it reads as a name that is no file rather than an internal error."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        return Path(text)


def file_kind(mode: int) -> str:
    """Words for a non-regular file type (``a FIFO``, ``a folder``...)."""
    return next((words for test, words in _KIND if test(mode)), "not a regular file")


@contextmanager
def open_regular(path: Path, what: str = "file") -> Iterator[tuple[int, int]]:
    """A read descriptor of a regular file and its size, closed on leaving the block.

    Opened non-blocking (a FIFO does not block the open) and checked with ``fstat`` on the descriptor
    (no race with a rename); anything but a regular file is refused. An ``OSError`` inside the block
    becomes the same one-line `ModelSourceError`.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except (FileNotFoundError, ValueError):  # ValueError: a NUL in the name, which no file has
        raise ModelSourceError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ModelSourceError(f"{path} is a folder, not a {what}") from None
    except OSError as exc:
        raise ModelSourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ModelSourceError(f"{path} is {file_kind(st.st_mode)}, not a {what}")
        seen = _READ.get()
        if seen is not None:
            seen.add((st.st_dev, st.st_ino))
        yield fd, st.st_size
    except OSError as exc:
        raise ModelSourceError(f"cannot read {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)


def read_upto(fd: int, n: int) -> bytes:
    """Up to ``n`` bytes from ``fd``: fewer only at the end of the file."""
    chunks: list[bytes] = []
    size = 0
    while size < n:
        chunk = os.read(fd, min(MIB, n - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def read_bytes(path: Path, limit: int, what: str = "file") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes; `ModelSourceError` otherwise."""
    with open_regular(path, what) as (fd, _size):
        data = read_upto(fd, limit + 1)  # one byte past the bound: st_size is no bound (/dev/zero)
    if len(data) > limit:
        raise ModelSourceError(f"{path}: over {limit:,} bytes, too large for a {what}")
    return data


def read_text(path: Path, limit: int, what: str = "file") -> str:
    """A bounded regular file decoded as UTF-8 (one clear line when it is not text)."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelSourceError(f"{path} is not UTF-8 text, not a {what}") from None


#: Arrays and objects in one JSON document. A safetensors header (at most 100 MB, the reference limit)
#: spends at least ~45 bytes on each tensor's object and its two arrays, so a real one holds under 7
#: million; past this bound the document is refused before it is parsed (each container is an object).
MAX_JSON_CONTAINERS = 10_000_000

_DROP = bytes(sorted(set(range(256)) - set(b'[]{}"')))
_LEVELS = bytes.maketrans(b"[{]}", b"(())")
#: Passes of the C-speed scan before the parsed document is walked instead (real files need 2-6).
_FAST_PASSES = 8


def _levels(text: str) -> bytes | None:
    """The brackets of ``text`` outside its strings as ``(`` and ``)``; None when a string holds one.

    Every step is one C-speed pass over the bytes: escaped backslashes and quotes go first, then
    everything but brackets and quotes; an even run of quotes is removed whole (the inside/outside of
    every bracket after it is unchanged), so quotes are left only where a string holds a bracket.
    """
    data = text.encode("utf-8", "surrogatepass")
    if b"\\" in data:
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    kept = data.translate(None, _DROP).replace(b'""', b"")
    return None if b'"' in kept else kept.translate(_LEVELS)


def deeper_than(text: str, limit: int) -> bool | None:
    """Whether ``[``/``{`` nest more than ``limit`` deep outside the strings of ``text``; None: cannot tell
    cheaply (a bracket inside a string, unbalanced brackets, deep nesting), walk the parsed document.

    The nesting depth is the highest running count of openers minus closers. Removing every ``()`` pair
    lowers that peak by exactly one (each peak opener is followed by a closer once closers are appended
    for the unclosed openers, and the opener before the first peak stays), so after ``k`` passes that
    leave no pair the depth was at most ``k``, and a level ``v`` still reached after ``k`` passes means a
    depth of at least ``v + k``. Each pass is one ``bytes.replace``, each count one ``bytes.count``.
    """
    levels = _levels(text)
    if levels is None:
        return None
    opens = levels.count(b"(")
    if opens <= limit:
        return False
    levels += b")" * max(0, 2 * opens - len(levels))
    passes = min(limit, _FAST_PASSES)
    for _ in range(passes):
        if b"()" not in levels:
            return False
        levels = levels.replace(b"()", b"")
    at = levels.find(b"()")
    if at < 0:
        return False
    peak = levels.count(b"(", 0, at + 1) - levels.count(b")", 0, at)  # a level the depth passes through
    return True if peak > limit - passes else None


def nested_deeper(data: object, limit: int) -> bool:
    """Whether a parsed JSON document nests lists/dicts more than ``limit`` deep (level by level, no
    recursion: one ``extend`` per container and one ``isinstance`` per value)."""
    level = [data] if isinstance(data, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            return True
        values: list[object] = []
        for item in level:
            values.extend(item.values() if isinstance(item, dict) else item)  # type: ignore[union-attr]
        level = [value for value in values if isinstance(value, (dict, list))]
    return False


def parser_error(exc: BaseException) -> str:
    """A parser's error in words for the user: Python's bound on the digits of an integer read from text
    (``sys.get_int_max_str_digits``, 4,300 by default) otherwise tells them to raise it in the interpreter."""
    text = " ".join(str(exc).split())
    if isinstance(exc, ValueError) and "integer string conversion" in text:
        return f"a number with over {sys.get_int_max_str_digits():,} digits, longer than any setting"
    return text[:200] or type(exc).__name__


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _pairs_noting(duplicates: list[str]) -> Callable[[list[tuple[str, Any]]], dict[str, Any]]:
    """A JSON ``object_pairs_hook`` that keeps the last value of a repeated key (as ``json.loads`` and
    the trainers' loaders do) and names the key in ``duplicates``."""

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out = dict(items)
        if len(out) < len(items):
            seen: set[str] = set()
            for key, _ in items:
                if key in seen and key not in duplicates:
                    duplicates.append(key)
                seen.add(key)
        return out

    return pairs


def loads(text: str, source: str, duplicates: list[str] | None = None, *, python_floats: bool = False) -> Any:
    """Parse JSON text with a nesting bound and no NaN/Infinity; one clear line on failure.

    ``duplicates``, when given, collects the keys an object repeats (the last value is kept).
    ``python_floats`` reads ``NaN``, ``Infinity`` and ``-Infinity`` as floats, for files Python's own
    ``json.dumps`` wrote and ``json.loads`` reads back (a transformers config.json: see `read_json`).

    The bound is checked before parsing where a C-speed scan can tell (`deeper_than`), else on the parsed
    document; the parser itself stops at the interpreter's recursion limit (RecursionError), never the
    C stack, so nothing deeper than that is ever built.
    """
    deep = ModelSourceError(f"{source}: JSON nested deeper than {MAX_JSON_DEPTH} levels")
    if text.count("[") + text.count("{") > MAX_JSON_CONTAINERS:
        raise ModelSourceError(f"{source}: over {MAX_JSON_CONTAINERS:,} JSON arrays and objects")
    known = deeper_than(text, MAX_JSON_DEPTH)
    if known:
        raise deep
    try:
        hook = None if duplicates is None else _pairs_noting(duplicates)
        constant = None if python_floats else _no_constant  # None: json's own float("inf"), float("nan")
        data = json.loads(text, parse_constant=constant, object_pairs_hook=hook)
    except RecursionError:
        raise deep from None
    except json.JSONDecodeError as exc:
        raise ModelSourceError(f"{source} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    except ValueError as exc:
        raise ModelSourceError(f"{source}: {parser_error(exc)}") from None
    if known is None and nested_deeper(data, MAX_JSON_DEPTH):
        raise deep
    return data


def read_json(
    path: Path,
    limit: int,
    what: str = "JSON file",
    duplicates: list[str] | None = None,
    *,
    python_floats: bool = False,
) -> Any:
    """A bounded regular file parsed as strict JSON (repeated keys collected in ``duplicates``);
    ``python_floats`` as in `loads`."""
    return loads(read_text(path, limit, what), str(path), duplicates, python_floats=python_floats)


def duplicate_note(keys: list[str]) -> str:
    """The warning for keys a file repeats: the loaders keep the last value, so does fitcheck."""
    named = [clipped(repr(k)) for k in keys[:5]]
    shown = ", ".join(named) + (f" and {len(keys) - 5} more" if len(keys) > 5 else "")
    return f"duplicate key{'s' if len(keys) > 1 else ''} {shown}: the last value is read (as the loader does)"
