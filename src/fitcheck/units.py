"""Units: the only place sizes and memory amounts are parsed or formatted.

Memory typed by a user (``24GB``, ``24GiB``, ``24``) always means binary gibibytes, because GPU and
Mac memory is marketed in binary units: an RTX 4090's "24 GB" is 24,564 MiB as the driver reports it
(docs/methodology.md, "Units"). Parameter counts (``7B``, ``350M``) are decimal.
"""

from __future__ import annotations

import math
import re

from fitcheck.errors import InputError
from fitcheck.terminal import clipped

GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10
#: Bandwidth and marketing gigabytes are decimal (GB/s = 10^9 bytes per second).
GB = 10**9

#: Largest parameter count accepted from a size string (10 trillion): beyond any model that exists.
MAX_PARAMS = 10**13
#: Smallest: a model below this has no sensible decoder shape.
MIN_PARAMS = 10**5
#: Largest dataset a plan takes (``--dataset-tokens``): 1,000T tokens, some 30 times the largest
#: pre-training corpora; past it a typo (and past float range an overflow), not a dataset.
MAX_DATASET_TOKENS = 10**15

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
_MEM_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+|[0-9]+\.)\s*(GIB|GB|G|MIB|MB|M|TIB|TB|T)?\s*$", re.IGNORECASE)
#: A memory size written with an exponent (``1e30GB``): refused by name, never read as a hardware id.
MEM_EXPONENT_RE = re.compile(
    r"^\s*[+-]?[0-9]*\.?[0-9]+[eE][+-]?[0-9]+\s*(GIB|GB|G|MIB|MB|M|TIB|TB|T)?\s*$", re.IGNORECASE
)
#: Memory sizes a user may type: from 1 MiB (below it no device or headroom means anything) to 1 PiB
#: (far above any device or host; past it a typo, not a machine).
MIN_MEMORY = MIB
MAX_MEMORY = 1 << 50


class SizeRangeError(InputError):
    """A memory size that parses as a number but no device has: an exponent, below 1 MiB, over 1 PiB."""


def looks_like_size(text: str) -> bool:
    """True when ``text`` has the shape of a parameter count (``7B``, ``1.1e9``), valid or not."""
    return bool(re.match(r"^\s*[-+]?[0-9.]+(?:[eE][+-]?[0-9]+)?\s*[A-Za-z]?\s*$", text))


def parse_param_count(text: str) -> int:
    """Parse ``7B``, ``1.5B``, ``350M``, ``1.1e9`` into an exact integer parameter count.

    Raises:
        InputError: malformed, zero, negative or absurdly large sizes.
    """
    m = _SIZE_RE.match(text)
    if not m:
        raise InputError(
            f"'{text}' is not a model size: use a number with K, M, B or T (7B, 1.5B, 350M, 1.1e9) "
            "or a preset id (see `fitcheck models`)"
        )
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if not math.isfinite(value) or value > MAX_PARAMS:
        raise InputError(f"'{text}' is too large: sizes up to 10T parameters are supported")
    count = round(value)
    if count < MIN_PARAMS:
        raise InputError(f"'{text}' is too small: a model needs at least 100K parameters")
    return count


def parse_memory(text: str) -> int:
    """Parse ``24GB``, ``24GiB``, ``24``, ``512MB``, ``1.5TB`` into bytes (binary units throughout).

    Raises:
        InputError: malformed, zero or negative amounts.
    """
    m = _MEM_RE.match(text)
    shown = clipped(text.strip())
    if not m:
        if MEM_EXPONENT_RE.match(text):
            raise SizeRangeError(
                f"'{shown}' has an exponent: write a memory size in digits, e.g. 24GB or 512MB"
            )
        raise InputError(f"'{shown}' is not a memory size: use a number of GB, e.g. 24GB, 24GiB or 512MB")
    unit = (m.group(2) or "GB").upper()
    scale = MIB if unit.startswith("M") else (GIB << 10 if unit.startswith("T") else GIB)
    number = float(m.group(1)) * scale  # inf for a number of over 308 digits
    if number <= 0:
        raise InputError(f"'{shown}' is not a usable memory size: it must be more than zero")
    if not MIN_MEMORY <= number <= MAX_MEMORY:
        raise SizeRangeError(f"'{shown}' is out of range: a memory size is from 1 MiB to 1024 TiB")
    return int(number)


def parse_option_memory(option: str, text: str) -> int:
    """`parse_memory` for a command-line option: its error line starts with the option's name."""
    try:
        return parse_memory(text)
    except InputError as exc:
        raise InputError(f"{option} {exc}") from None


def gib(n_bytes: int | float) -> float:
    """Bytes to GiB as a float."""
    return n_bytes / GIB


def fmt_gib(n_bytes: int | float, digits: int = 2) -> str:
    """Format bytes as ``12.34 GiB``."""
    return f"{n_bytes / GIB:.{digits}f} GiB"


def fmt_count(n: int) -> str:
    """A parameter count with three significant figures: ``8.03B``, ``494M``, ``1.00B``, ``135M``.

    The count is rounded to three figures before its suffix is chosen, so 999,885,952 is ``1.00B``
    (not ``1e+03M``).
    """
    if n < 1000:
        return str(n)
    rounded = float(f"{n:.3g}")
    for scale, suffix in ((10**12, "T"), (10**9, "B"), (10**6, "M"), (10**3, "K")):
        if rounded >= scale:
            value = rounded / scale
            digits = max(0, 2 - math.floor(math.log10(value)))
            return f"{value:.{digits}f}{suffix}"
    return str(n)
