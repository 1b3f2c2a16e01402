"""Text that reaches a terminal: names from the user's files and arguments, shown as data, never obeyed.

A model folder, a Hub id, a key in a trainer config or a ``--lora-targets`` value may carry control
characters: an ANSI escape (``ESC[2J`` clears the screen, ``ESC]8;;`` makes a link, ``ESC]52;`` writes
the clipboard), a carriage return or backspace that overwrites what was printed before, a newline that
splits the one-line error the CLI contract promises into two, or a bidirectional override (U+202E) that
makes the text read in another order than it is. Every such character is written as its escape
(``\\x1b``, ``\\n``, ``\\u202e``), the way ``repr`` would, so the user sees what the name really holds.

JSON and YAML escape these characters themselves; this is for the human outputs (stderr lines, the
table, markdown).
"""

from __future__ import annotations

import unicodedata

#: Format characters that reorder or hide text (Unicode bidi controls: the "Trojan Source" set, and
#: the line/paragraph separators some terminals and editors break lines at).
_REORDERING = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u2028\u2029"
)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(ch: str) -> str:
    if ch in _NAMED:
        return _NAMED[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def is_unsafe(ch: str) -> bool:
    """A control character (C0, DEL, C1), a reordering format character, or a lone surrogate (a byte of
    a file name that is not UTF-8, as Python's ``surrogateescape`` keeps it: no terminal can show it)."""
    return ch in _REORDERING or unicodedata.category(ch) in ("Cc", "Cs")


def clipped(text: str, width: int = 40) -> str:
    """``text`` cut to ``width`` characters (its end written ``...``) for quoting a value in a one-line
    error."""
    return text if len(text) <= width else text[: width - 3] + "..."


def printable(text: str) -> str:
    """``text`` with every control and reordering character written as its escape; one line."""
    if text.isprintable():  # the common case, in C: nothing to escape (isprintable is False for \\n, ESC...)
        return text
    return "".join(_escaped(ch) if is_unsafe(ch) else ch for ch in text)


#: The longest error line fitcheck writes: a value quoted whole (``--lora-targets`` of 200,000 characters)
#: would make one "line" of any length.
MAX_ERROR_CHARS = 1000


def error_line(text: str) -> str:
    """A message as its one stderr line: `printable`, and past `MAX_ERROR_CHARS` its middle cut (the head
    names the problem, the tail usually says what to do)."""
    line = printable(text)
    if len(line) <= MAX_ERROR_CHARS:
        return line
    head, tail = MAX_ERROR_CHARS * 2 // 3, MAX_ERROR_CHARS // 4
    return f"{line[:head]}... ({len(line) - head - tail:,} characters cut) ...{line[-tail:]}"


def printable_lines(text: str) -> str:
    """Like `printable`, but the line breaks of a block fitcheck laid out itself are kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def printable_tree(data: object) -> object:
    """A parsed document (dicts, lists, scalars) with every string made `printable`."""
    if isinstance(data, str):
        return printable(data)
    if isinstance(data, dict):
        return {printable_tree(k): printable_tree(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [printable_tree(v) for v in data]
    return data
