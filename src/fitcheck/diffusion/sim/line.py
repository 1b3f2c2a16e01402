"""One simulation for every micro-batch: the step with a symbolic batch size ``b``.

Why: the planner asks for the same step at micro-batches 1, 2, 4, 8, 16, and each simulation walks
thousands of ops in Python. Every tensor of a step is either independent of the batch (weight
casts, parameter gradients) or has the batch as one factor of its shape, so its size is
``c + k*b``; what varies with ``b`` is only which moment of the step is the peak.

This is used only where the simulator proves it. The batch enters the step as a `Lin` (``c + k*b``
for every integer ``b >= lo``); arithmetic that keeps a size linear is allowed, and anything else
raises `NotLinear`: a product of two batch-dependent numbers, a division that is not exact, using
the batch as a plain integer, or a comparison whose answer is not the same for every ``b`` in the
domain (``b == 1`` in eager attention's ``head_to_batch_dim``, say). The caller then simulates
that batch directly. `LineSim` logs every allocation, free and re-tag as ``(c, k)`` instead of
tracking one peak; `Line.at` replays the log for one ``b`` and returns what `Sim` would have
counted, byte for byte (``tests/test_diffusion_line.py`` checks it against direct simulation).
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field

from fitcheck.diffusion.sim.core import Sim, Storage

Ints = array  # of signed 64-bit integers ("q"): byte counts and log positions


class NotLinear(Exception):
    """A size or a decision of the step depends on the batch in a way one line cannot carry."""


class Lin:
    """``c + k*b`` for every integer batch ``b >= lo``; ``k != 0`` (a constant is a plain int)."""

    __slots__ = ("c", "k", "lo")

    def __init__(self, c: int, k: int, lo: int) -> None:
        self.c, self.k, self.lo = c, k, lo

    @staticmethod
    def make(c: int, k: int, lo: int) -> int | Lin:
        return Lin(c, k, lo) if k else c

    def at(self, b: int) -> int:
        return self.c + self.k * b

    def __repr__(self) -> str:
        return f"Lin({self.c} + {self.k}*b, b>={self.lo})"

    # --- arithmetic that stays linear -------------------------------------------------------

    def __add__(self, o: object) -> int | Lin:
        if type(o) is int:
            return Lin(self.c + o, self.k, self.lo)
        if isinstance(o, Lin):
            return Lin.make(self.c + o.c, self.k + o.k, max(self.lo, o.lo))
        return NotImplemented

    __radd__ = __add__

    def __neg__(self) -> Lin:
        return Lin(-self.c, -self.k, self.lo)

    def __sub__(self, o: object) -> int | Lin:
        if isinstance(o, Lin | int):
            return self + (-o)
        return NotImplemented

    def __rsub__(self, o: object) -> int | Lin:
        return (-self) + o

    def __mul__(self, o: object) -> int | Lin:
        if type(o) is int:  # the hot path: a dimension times the batch
            return Lin(self.c * o, self.k * o, self.lo) if o else 0
        if isinstance(o, Lin):
            raise NotLinear(f"{self} x {o}")
        return NotImplemented

    __rmul__ = __mul__

    def __floordiv__(self, o: object) -> int | Lin:
        if isinstance(o, int) and o and self.c % o == 0 and self.k % o == 0:
            return Lin.make(self.c // o, self.k // o, self.lo)
        raise NotLinear(f"{self} // {o}")

    def __index__(self) -> int:
        raise NotLinear(f"{self} used as an integer")

    # --- comparisons: answered only when the same for every b >= lo ---------------------------

    def _sign(self, o: object) -> int:
        """The sign of ``self - o``, the same for every ``b`` in the domain, or `NotLinear`."""
        if isinstance(o, Lin):
            c, k, lo = self.c - o.c, self.k - o.k, max(self.lo, o.lo)
        elif isinstance(o, int):
            c, k, lo = self.c - o, self.k, self.lo
        else:
            raise TypeError(o)
        first = c + k * lo
        if k == 0 or (k > 0 and first > 0) or (k < 0 and first < 0):
            return (first > 0) - (first < 0)
        raise NotLinear(f"the sign of {self} - {o} depends on the batch")

    def __eq__(self, o: object) -> bool:
        if not isinstance(o, Lin | int):
            return NotImplemented
        return self._sign(o) == 0

    def __ne__(self, o: object) -> bool:
        if not isinstance(o, Lin | int):
            return NotImplemented
        return self._sign(o) != 0

    def __lt__(self, o: object) -> bool:
        return self._sign(o) < 0

    def __le__(self, o: object) -> bool:
        return self._sign(o) <= 0

    def __gt__(self, o: object) -> bool:
        return self._sign(o) > 0

    def __ge__(self, o: object) -> bool:
        return self._sign(o) >= 0

    def __bool__(self) -> bool:
        return self._sign(0) != 0

    def __hash__(self) -> int:
        return hash((self.c, self.k))


@dataclass
class Line:
    """A symbolic step, ready to evaluate at any batch of its domain.

    ``points[phase]``: the candidate peaks of the phase (its start and every allocation inside it,
    as in `Sim._peak`), each as (log entries applied, live ``c``, live ``k``); per category, the
    positions of its log entries and the running ``(c, k)`` after each (``cats`` in order of first
    appearance, which is the order `Sim` reports them in).
    """

    points: dict[str, tuple[Ints, Ints, Ints]] = field(default_factory=dict)
    cats: dict[str, tuple[Ints, Ints, Ints]] = field(default_factory=dict)

    def peak(self, phase: str, b: int) -> tuple[int, dict[str, int]]:
        """(peak bytes, bytes per category at its first occurrence) of ``phase`` at batch ``b``."""
        idx, pc, pk = self.points.get(phase, (_ints(), _ints(), _ints()))
        vals = [c + k * b for c, k in zip(pc, pk, strict=True)]
        best = max(vals, default=0)
        if best <= 0:
            return 0, {}
        n = idx[vals.index(best)]
        out: dict[str, int] = {}
        for cat, (pos, cs, ks) in self.cats.items():
            j = bisect.bisect_right(pos, n)  # entries 1..n are applied
            if j:
                v = cs[j - 1] + ks[j - 1] * b
                if v:
                    out[cat] = v
        return best, out


class LineSim(Sim):
    """A `Sim` whose sizes may be `Lin`: it logs instead of keeping a peak (see the module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self._events: list[tuple[str, int | Lin, int]] = []
        self._phases: dict[str, list[int]] = {}
        self._points: list[int] | None = None

    def _alloc(self, st: Storage) -> None:
        if self.region is not None and self.region.recording:
            self._rkey += 1
            st.key = self._rkey
            self.region.events.append(("a", self._rkey, st.nbytes, st.cat))
        self._events.append((st.cat, st.nbytes, 1))
        if self._points is not None:
            self._points.append(len(self._events))

    def _free(self, st: Storage) -> None:
        self._events.append((st.cat, st.nbytes, -1))
        if st.key is not None and self.region is not None and self.region.recording:
            self.region.events.append(("f", st.key, 0, ""))

    def retag(self, st: Storage, cat: str) -> None:
        self._events.append((st.cat, st.nbytes, -1))
        st.cat = cat
        self._events.append((cat, st.nbytes, 1))

    def begin(self, name: str) -> None:
        self._points = self._phases.setdefault(name, [])
        self._points.append(len(self._events))

    def finish(self) -> Line:
        """The log as a `Line` (running sums by C-level ``accumulate``, one pass to group by category)."""
        ev = self._events
        cs: list[int] = [sign * (n.c if isinstance(n, Lin) else n) for _, n, sign in ev]
        ks: list[int] = [sign * n.k if isinstance(n, Lin) else 0 for _, n, sign in ev]
        live_c = [0, *itertools.accumulate(cs)]
        live_k = [0, *itertools.accumulate(ks)]
        line = Line()
        for name, pts in self._phases.items():
            line.points[name] = (_ints(pts), _ints(live_c[i] for i in pts), _ints(live_k[i] for i in pts))
        pos: dict[str, list[int]] = {}
        for i, (cat, _, _) in enumerate(ev, 1):
            pos.setdefault(cat, []).append(i)
        for cat, idx in pos.items():
            line.cats[cat] = (
                _ints(idx),
                _ints(itertools.accumulate(cs[i - 1] for i in idx)),
                _ints(itertools.accumulate(ks[i - 1] for i in idx)),
            )
        return line


def _ints(values: Iterable[int] = ()) -> Ints:
    """Signed 64-bit integers, packed: a cached line of an SDXL step is a few MiB, not tens."""
    return array("q", values)
