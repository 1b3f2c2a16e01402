"""Live tensor-storage accounting under a `TorchDispatchMode`, with phase windows.

Why not ``torch.distributed._tools.mem_tracker.MemTracker``? It works under FakeTensorMode on the
CPU build (checked: same peak as this tracker on a tiny Llama, see tests/test_measure_trace.py), but
it refuses a second iteration without ``reset_mod_stats()``, installs forward and backward hooks on
every module, and keeps one global peak rather than one per phase. fitcheck needs the running peak
of each phase of step 2 and the tensors alive at each of those peaks, so this module keeps an event
log instead: every storage gets an allocation and a free sequence number, and a breakdown at any
moment is computed afterwards from the log.

Counting rules (the same as MemTracker's on CPU): each untyped storage counts once, by its
``nbytes``, from the op that created it until its last reference dies (weakref callback). Views and
in-place ops create no storage. Outputs that alias an input are recognised from the op schema, so a
view of a tensor created before tracking started is not counted as new memory.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from fitcheck.measure._internals import TorchDispatchMode, current_autograd_node, storage_key, tree_leaves

#: Category given to storages created in each phase, unless later re-tagged (gradients, states).
PHASE_CATEGORY = {
    "setup": "inputs",
    "forward": "activations",
    "backward": "backward_temporaries",
    "optimizer_step": "optimizer_temporaries",
}


@dataclass
class Record:
    """One storage: its size, where it came from, when it was alive."""

    nbytes: int
    category: str
    op: str
    shape: tuple[int, ...]
    dtype: str
    module: str
    created_in: str
    alloc_seq: int
    free_seq: int | None = None
    ref: Any = None


@dataclass
class Window:
    """One phase of one step (or micro-batch): live bytes at its start, peak and end."""

    name: str
    step: int
    start_bytes: int
    peak_bytes: int
    peak_seq: int
    end_bytes: int = 0
    start_seq: int = 0
    end_seq: int = -1


@dataclass
class Tracker:
    """The accounting state; `LiveStorageMode` feeds it from dispatch, callers mark phases."""

    live_bytes: int = 0
    seq: int = 0
    phase: str = "setup"
    step: int = 0
    records: dict[int, Record] = field(default_factory=dict)
    log: list[Record] = field(default_factory=list)
    windows: list[Window] = field(default_factory=list)
    module_stack: list[str] = field(default_factory=list)

    def begin(self, phase: str, step: int) -> None:
        """Close the current window and open one for ``phase`` of ``step``."""
        self.end()
        self.module_stack.clear()
        self.phase, self.step = phase, step
        self.windows.append(
            Window(phase, step, self.live_bytes, self.live_bytes, self.seq, start_seq=self.seq)
        )

    def end(self) -> None:
        """Close the current window (idempotent)."""
        if self.windows and self.windows[-1].end_seq < 0:
            self.windows[-1].end_bytes = self.live_bytes
            self.windows[-1].end_seq = self.seq

    def register(self, tensors: Iterable[torch.Tensor], category: str, name: str = "") -> None:
        """Count storages that exist before tracking starts (parameters, buffers, the batch)."""
        for t in tensors:
            self._add(t, category, op=name or "<external>")

    def retag(self, tensors: Iterable[torch.Tensor], category: str) -> None:
        """Give storages their final role (a gradient, an optimizer state) once it is known."""
        for t in tensors:
            rec = self.records.get(_key(t))
            if rec is not None:
                rec.category = category

    def _add(self, t: torch.Tensor, category: str | None, op: str) -> None:
        st = t.untyped_storage()
        key = storage_key(t)
        rec = self.records.get(key)
        if rec is not None:
            self._resize(rec, st.nbytes())
            return
        self.seq += 1
        rec = Record(
            nbytes=st.nbytes(),
            category=category or PHASE_CATEGORY[self.phase],
            op=op,
            shape=tuple(t.shape),
            dtype=str(t.dtype).removeprefix("torch."),
            module=self._where(),
            created_in=f"{self.phase}@{self.step}",
            alloc_seq=self.seq,
        )

        def on_free(_ref: Any, k: int = key) -> None:
            self._free(k)

        rec.ref = weakref.ref(st, on_free)
        self.records[key] = rec
        self.log.append(rec)
        self._grow(rec.nbytes)

    def _where(self) -> str:
        """The module running forward (or being recomputed), and in backward the autograd node."""
        where = self.module_stack[-1] if self.module_stack else ""
        if self.phase == "backward":
            node = current_autograd_node()
            if node is not None:
                where = f"{node.name()} {where}".strip()
        return where

    def _resize(self, rec: Record, nbytes: int) -> None:
        if nbytes != rec.nbytes:
            delta = nbytes - rec.nbytes
            rec.nbytes = nbytes
            self._grow(delta)

    def _grow(self, delta: int) -> None:
        self.live_bytes += delta
        if self.windows:
            w = self.windows[-1]
            if self.live_bytes > w.peak_bytes:
                w.peak_bytes, w.peak_seq = self.live_bytes, self.seq

    def _free(self, key: int) -> None:
        rec = self.records.pop(key, None)
        if rec is None:
            return
        self.seq += 1
        rec.free_seq = self.seq
        self.live_bytes -= rec.nbytes

    def alive_at(self, seq: int) -> Iterator[Record]:
        """Records alive just after event ``seq``."""
        for rec in self.log:
            if rec.alloc_seq <= seq and (rec.free_seq is None or rec.free_seq > seq):
                yield rec

    def breakdown_at(self, seq: int) -> dict[str, int]:
        """Bytes by category alive just after event ``seq``."""
        out: dict[str, int] = {}
        for rec in self.alive_at(seq):
            out[rec.category] = out.get(rec.category, 0) + rec.nbytes
        return out


def timeline(
    tracker: Tracker, start_seq: int, end_seq: int, points: int, fold: dict[str, str]
) -> tuple[list[int], dict[str, list[int]]]:
    """Live bytes per folded category over events ``start_seq..end_seq``, at most ``points`` samples.

    Each sample is the event of largest total inside its slice of the event range, so the peak
    survives the thinning; categories are the records' final roles (a gradient is drawn as a
    gradient from its allocation on).
    """
    cats = sorted(set(fold.values()))
    now = dict.fromkeys(cats, 0)
    deltas: dict[int, tuple[str, int]] = {}
    for rec in tracker.log:
        cat = fold.get(rec.category, cats[-1])
        if rec.alloc_seq <= start_seq and (rec.free_seq is None or rec.free_seq > start_seq):
            now[cat] += rec.nbytes
        if start_seq < rec.alloc_seq <= end_seq:
            deltas[rec.alloc_seq] = (cat, rec.nbytes)
        if rec.free_seq is not None and start_seq < rec.free_seq <= end_seq:
            deltas[rec.free_seq] = (cat, -rec.nbytes)
    span = max(1, end_seq - start_seq)
    per = max(1, -(-span // max(1, points)))
    xs: list[int] = [start_seq]
    series = {c: [now[c]] for c in cats}
    best: tuple[int, int, dict[str, int]] | None = None
    for seq in range(start_seq + 1, end_seq + 1):
        if seq in deltas:
            cat, d = deltas[seq]
            now[cat] += d
        total = sum(now.values())
        if best is None or total > best[1]:
            best = (seq, total, dict(now))
        if (seq - start_seq) % per == 0 or seq == end_seq:
            xs.append(best[0])
            for c in cats:
                series[c].append(best[2][c])
            best = None
    return xs, series


def _key(t: torch.Tensor) -> int:
    return storage_key(t)


def _fresh_outputs(func: Any, out: Any) -> list[torch.Tensor]:
    """Output tensors that own a storage the op created (not views of, or in-place on, inputs)."""
    returns = func._schema.returns
    values = out if isinstance(out, tuple | list) and len(returns) != 1 else (out,)
    fresh: list[torch.Tensor] = []
    for ret, value in zip(returns, values, strict=False):
        if ret.alias_info is not None:
            continue
        fresh.extend(x for x in tree_leaves(value) if isinstance(x, torch.Tensor))
    return fresh


def _aliased_outputs(func: Any, out: Any) -> list[torch.Tensor]:
    returns = func._schema.returns
    values = out if isinstance(out, tuple | list) and len(returns) != 1 else (out,)
    aliased: list[torch.Tensor] = []
    for ret, value in zip(returns, values, strict=False):
        if ret.alias_info is not None:
            aliased.extend(x for x in tree_leaves(value) if isinstance(x, torch.Tensor))
    return aliased


class LiveStorageMode(TorchDispatchMode):
    """Dispatch mode that reports every newly created storage to a `Tracker`."""

    def __init__(self, tracker: Tracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        name = func.__name__
        for t in _fresh_outputs(func, out):
            self.tracker._add(t, None, name)
        if func._schema.is_mutable:
            for t in _aliased_outputs(func, out):
                rec = self.tracker.records.get(_key(t))
                if rec is not None:
                    self.tracker._resize(rec, t.untyped_storage().nbytes())
        return out


class ModuleScope:
    """Global module hooks that keep ``tracker.module_stack`` = the modules running forward now."""

    def __init__(self, tracker: Tracker, names: dict[int, str]) -> None:
        self.tracker, self.names = tracker, names
        self.handles: list[Any] = []

    def __enter__(self) -> ModuleScope:
        from torch.nn.modules.module import (
            register_module_forward_hook,
            register_module_forward_pre_hook,
        )

        def pre(module: torch.nn.Module, _args: Any) -> None:
            # Checkpoint recomputation stops early by raising, so post hooks can be skipped: drop
            # entries that are not ancestors of the module starting now.
            name = self.names.get(id(module), type(module).__name__)
            stack = self.tracker.module_stack
            while stack and not (stack[-1] == "" or name.startswith(stack[-1] + ".")):
                stack.pop()
            stack.append(name)

        def post(_module: torch.nn.Module, _args: Any, _out: Any) -> None:
            if self.tracker.module_stack:
                self.tracker.module_stack.pop()

        self.handles = [register_module_forward_pre_hook(pre), register_module_forward_hook(post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.handles:
            h.remove()
        self.tracker.module_stack.clear()
