"""A symbolic autograd: what one training step keeps alive, without torch and without numbers.

Why a simulator and not a formula: a UNet step is thousands of ops whose saved tensors depend on
which weights train, on autocast's per-op dtype policy, on the attention kernel and on gradient
checkpointing, and its backward peak depends on when gradients of the skip connections die. Writing
one closed formula per combination would be a cartesian if-chain; instead each op states PyTorch's
rules once (what ``derivatives.yaml`` saves, what autocast casts) and the architectures are written
as the same sequence of ops as the diffusers code. The result is checked against traces of the real
modules (``bench/calibrate_diffusion.py``; docs/diffusion.md).

Model of execution:

* a `Storage` is counted from creation until its last reference dies (CPython refcounting makes
  this exact and immediate, like PyTorch's caching allocator sees frees);
* ops that need gradients create a `Node` that holds the storages it saves; ``backward`` visits the
  nodes in reverse creation order, allocates input gradients, and frees each node's saved storages
  after it ran (``retain_graph=False``);
* inside a checkpointed region (non-reentrant ``torch.utils.checkpoint``) nodes only remember which
  storages they would save; the region's allocation log is replayed when backward first reaches it.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

#: Bytes per element of the dtypes the simulator knows.
BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "i64": 8, "bool": 1}
FLOATS = ("fp32", "bf16", "fp16", "fp8")


class Storage:
    """One allocation. Its bytes count while any tensor, node or cache refers to it."""

    __slots__ = ("__weakref__", "cat", "key", "nbytes", "sim", "where")

    def __init__(self, sim: Sim, nbytes: int, cat: str) -> None:
        self.sim, self.nbytes, self.cat = sim, nbytes, cat
        self.key: int | None = None
        self.where = sim.where[-1] if sim.debug else ""
        sim._alloc(self)

    def __del__(self) -> None:
        self.sim._free(self)


class Param:
    """A parameter: its shape, and (once a regime is applied) its dtype and whether it trains.

    Parameters are not simulated as storages: weights, gradients and optimizer states are model
    states, counted from the regime (``fitcheck.diffusion.states``). Only their casts and gradients
    inside a step are tensors here.
    """

    __slots__ = ("dtype", "kind", "name", "shape", "trainable")

    def __init__(self, shape: tuple[int, ...], kind: str = "weight") -> None:
        self.shape = shape
        self.kind = kind
        self.name = ""
        self.dtype = "fp32"
        self.trainable = False

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class T:
    """A symbolic tensor: a view of a storage, with dtype, shape, requires_grad and its grad_fn."""

    __slots__ = ("dtype", "fn", "idx", "param", "rg", "shape", "st")

    def __init__(
        self,
        shape: tuple[int, ...],
        dtype: str,
        st: Storage | None,
        rg: bool = False,
        fn: Node | None = None,
        idx: int = 0,
        param: Param | None = None,
    ) -> None:
        self.shape, self.dtype, self.st, self.rg, self.fn, self.idx, self.param = (
            shape,
            dtype,
            st,
            rg,
            fn,
            idx,
            param,
        )

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * BYTES[self.dtype]


@dataclass(slots=True)
class Edge:
    """Where the gradient of one op input goes, and how it is produced.

    ``mode`` "alloc": a new tensor of the input's size and dtype; "pass": the op hands on its own
    output gradient (add, views); "tmp": allocate ``tmp_bytes`` (a broadcast reduction) first.
    """

    target: Node | Param | None
    idx: int
    numel: int
    dtype: str
    mode: str = "alloc"
    out: int = 0
    tmp_bytes: int = 0


@dataclass(eq=False, slots=True)
class Node:
    """A grad_fn: saved storages, edges to its inputs, its output-gradient buffers."""

    seq: int
    op: str
    saved: list[Storage] = field(default_factory=list)
    deferred: list[int] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)
    grads: dict[int, Storage] = field(default_factory=dict)
    bwd_tmp: int = 0
    region: Region | None = None
    keep_inputs: list[Storage] = field(default_factory=list)


@dataclass(eq=False)
class Region:
    """A checkpointed call: its allocation log (replayed to recompute) and whether it was replayed."""

    events: list[tuple[str, int, int, str]] = field(default_factory=list)
    wanted: set[int] = field(default_factory=set)
    nodes: list[Node] = field(default_factory=list)
    recomputed: bool = False
    recording: bool = True
    first_key: int = 0


@dataclass
class PhasePeak:
    """The running peak of one phase and the bytes per category at that moment."""

    peak: int = 0
    cats: dict[str, int] = field(default_factory=dict)


class Sim:
    """Live-storage accounting plus the autograd graph of one simulated step."""

    def __init__(self) -> None:
        self.live = 0
        self.cats: dict[str, int] = {}
        self.phases: dict[str, PhasePeak] = {}
        self.phase: PhasePeak | None = None
        self.seq = 0
        self.nodes: list[Node] = []
        self.grad_enabled = True
        self.autocast: str | None = None
        self.cache: dict[int, T] = {}
        self.region: Region | None = None
        self._rkey = 0
        self.param_grads: dict[int, Storage | None] = {}
        self.flops = 0
        self.default_cat = "activations"
        #: Debugging aid: storages remember the module that allocated them; live ones are listed.
        self.debug = False
        self.where: list[str] = [""]
        self.registry: weakref.WeakSet[Storage] = weakref.WeakSet()
        self.snapshots: dict[str, list[tuple[str, int, str]]] = {}

    # --- accounting --------------------------------------------------------------------------

    def _alloc(self, st: Storage) -> None:
        if self.debug:
            self.registry.add(st)
        n = st.nbytes
        self.live += n
        self.cats[st.cat] = self.cats.get(st.cat, 0) + n
        if self.region is not None and self.region.recording:
            self._rkey += 1
            st.key = self._rkey
            self.region.events.append(("a", self._rkey, n, st.cat))
        ph = self.phase
        if ph is not None and self.live > ph.peak:
            self._peak()

    def _free(self, st: Storage) -> None:
        if self.debug:
            self.registry.discard(st)
        self.live -= st.nbytes
        self.cats[st.cat] -= st.nbytes
        if st.key is not None and self.region is not None and self.region.recording:
            self.region.events.append(("f", st.key, 0, ""))

    def retag(self, st: Storage, cat: str) -> None:
        """Move a live storage to another category (a checkpoint, a parameter gradient)."""
        self.cats[st.cat] -= st.nbytes
        st.cat = cat
        self.cats[cat] = self.cats.get(cat, 0) + st.nbytes

    def _peak(self) -> None:
        ph = self.phase
        if ph is not None and self.live > ph.peak:
            ph.peak = self.live
            ph.cats = {k: v for k, v in self.cats.items() if v}
            if self.debug:
                name = next(k for k, v in self.phases.items() if v is ph)
                self.snapshots[name] = [(x.where, x.nbytes, x.cat) for x in self.registry]

    def begin(self, name: str) -> None:
        """Start a phase: its peak starts from what is alive now."""
        self.phase = self.phases.setdefault(name, PhasePeak())
        self._peak()

    def new(self, shape: tuple[int, ...], dtype: str, cat: str | None = None) -> T:
        """A fresh tensor that needs no gradient (an input, a constant)."""
        return T(shape, dtype, Storage(self, math.prod(shape) * BYTES[dtype], cat or self.default_cat))

    @contextlib.contextmanager
    def at(self, path: str) -> Iterator[None]:
        """Debugging: attribute allocations to ``path``."""
        self.where.append(path)
        try:
            yield
        finally:
            self.where.pop()

    # --- graph -------------------------------------------------------------------------------

    def node(self, op: str) -> Node:
        self.seq += 1
        n = Node(self.seq, op, region=self.region)
        self.nodes.append(n)
        if self.region is not None:
            self.region.nodes.append(n)
        return n

    def save(self, node: Node, *tensors: T | None) -> None:
        """``ctx.save_for_backward``: parameters are free, a checkpoint region defers the rest."""
        for t in tensors:
            if t is None or t.st is None:
                continue
            st = t.st
            region = self.region
            if region is not None and st.key is not None and st.key >= region.first_key:
                node.deferred.append(st.key)
                region.wanted.add(st.key)
            else:
                node.saved.append(st)

    def requires_grad(self, *tensors: T | None) -> bool:
        return self.grad_enabled and any(t is not None and t.rg for t in tensors)

    @staticmethod
    def edge(t: T, mode: str = "alloc", out: int = 0, tmp_bytes: int = 0) -> Edge:
        target: Node | Param | None = t.param if t.param is not None else t.fn
        if not t.rg:
            target = None
        return Edge(target, t.idx, t.numel, t.dtype, mode, out, tmp_bytes)

    # --- contexts ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def no_grad(self) -> Iterator[None]:
        old, self.grad_enabled = self.grad_enabled, False
        try:
            yield
        finally:
            self.grad_enabled = old

    @contextlib.contextmanager
    def autocasting(self, dtype: str | None) -> Iterator[None]:
        """``torch.autocast``: the weight-cast cache lives until the context exits."""
        old, self.autocast = self.autocast, dtype
        try:
            yield
        finally:
            self.autocast = old
            if old is None:
                self.cache.clear()

    @contextlib.contextmanager
    def checkpoint(self, *inputs: T | None, enabled: bool = True) -> Iterator[None]:
        """Non-reentrant ``torch.utils.checkpoint``: keep the inputs, defer every saved tensor."""
        if not enabled or not self.grad_enabled or self.region is not None:
            yield
            return
        keeper = self.node("checkpoint_inputs")
        for t in inputs:
            if t is not None and t.st is not None:
                keeper.keep_inputs.append(t.st)
                if t.st.cat == "activations":
                    self.retag(t.st, "checkpoints")
        region = Region(first_key=self._rkey + 1)
        self.region = region
        try:
            yield
        finally:
            region.recording = False
            self.region = None

    # --- backward ----------------------------------------------------------------------------

    def backward(self, loss: T) -> None:
        """Run backward from a scalar ``loss``: gradients, frees and recomputation, in order."""
        assert loss.fn is not None, "loss does not require grad"
        loss.fn.grads[loss.idx] = Storage(self, loss.nbytes, "activation_grads")
        for node in reversed(self.nodes):
            if node.region is not None and not node.region.recomputed and node.grads:
                self._recompute(node.region)
            if node.grads:
                self._run(node)
            node.saved.clear()
            node.keep_inputs.clear()
            node.grads.clear()
        self.nodes.clear()

    def _run(self, node: Node) -> None:
        tmp = Storage(self, node.bwd_tmp, "backward_temporaries") if node.bwd_tmp else None
        for e in node.edges:
            if e.target is None:
                continue
            if e.mode == "pass" and e.out in node.grads:
                g = node.grads[e.out]
                self._deliver(e, g, shared=True)
                continue
            scratch = Storage(self, e.tmp_bytes, "backward_temporaries") if e.tmp_bytes else None
            g = Storage(self, e.numel * BYTES[e.dtype], "activation_grads")
            del scratch
            self._deliver(e, g, shared=False)
        del tmp

    def _deliver(self, e: Edge, g: Storage, shared: bool) -> None:
        target = e.target
        if isinstance(target, Param):
            key = id(target)
            if key in self.param_grads:
                return  # accumulated in place into .grad; the incoming tensor dies with this frame
            if shared:
                g = Storage(self, g.nbytes, "gradients")
            else:
                self.retag(g, "gradients")
            self.param_grads[key] = g
            return
        assert isinstance(target, Node)
        old = target.grads.get(e.idx)
        if old is None:
            target.grads[e.idx] = g
        elif not _sole_owner(old):
            target.grads[e.idx] = Storage(self, old.nbytes, "activation_grads")
        # else: accumulated in place into the existing buffer; ``g`` dies with this frame

    def _recompute(self, region: Region) -> None:
        """Replay a checkpointed region's allocations; keep what its nodes save."""
        region.recomputed = True
        alive: dict[int, Storage] = {}
        kept: dict[int, Storage] = {}
        last = max((i for i, ev in enumerate(region.events) if ev[1] in region.wanted), default=-1)
        for ev in region.events[: last + 1]:
            kind, key, nbytes, cat = ev
            if kind == "a":
                st = Storage(self, nbytes, cat)
                alive[key] = st
                if key in region.wanted:
                    kept[key] = st
            else:
                alive.pop(key, None)
        alive.clear()
        for n in region.nodes:
            n.saved.extend(kept[k] for k in n.deferred if k in kept)
            n.deferred.clear()
        kept.clear()


def _sole_owner(st: Storage) -> bool:
    """Whether an accumulation buffer can be added to in place (autograd's InputBuffer rule)."""
    import sys

    # The buffer is referenced by the dict, the local ``old`` and getrefcount's argument.
    return sys.getrefcount(st) <= 3


_CURRENT: list[Sim] = []


def sim() -> Sim:
    """The simulator the ops write to."""
    return _CURRENT[-1]


@contextlib.contextmanager
def simulating(s: Sim) -> Iterator[Sim]:
    _CURRENT.append(s)
    try:
        yield s
    finally:
        _CURRENT.pop()


def out_of(node: Node | None, shape: tuple[int, ...], dtype: str, cat: str | None = None, idx: int = 0) -> T:
    """A new output tensor of ``node`` (or of a no-grad op when ``node`` is None)."""
    s = sim()
    st = Storage(s, math.prod(shape) * BYTES[dtype], cat or s.default_cat)
    return T(shape, dtype, st, rg=node is not None, fn=node, idx=idx)


def view_of(x: T, shape: tuple[int, ...]) -> T:
    """A view: same storage, new shape; its gradient is the incoming gradient, unchanged."""
    if x.param is not None:
        return T(shape, x.dtype, None, rg=x.rg, param=x.param)
    node = None
    s = sim()
    if s.requires_grad(x):
        node = s.node("view")
        node.edges.append(s.edge(x, "pass"))
    return T(shape, x.dtype, x.st, rg=node is not None, fn=node)


def nbytes_of(shape: tuple[int, ...], dtype: str) -> int:
    return math.prod(shape) * BYTES[dtype]
