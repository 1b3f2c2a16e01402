"""Ops of the simulator, each with PyTorch's saved-tensor rule and CUDA autocast's dtype policy.

Saved tensors follow ``tools/autograd/derivatives.yaml``: an operand of a matmul is saved only when
the other operand needs a gradient (a frozen linear keeps no input), a convolution saves input and
weight whenever it is differentiated at all (so conv layers keep their input even with frozen
weights, pytorch#133566), normalisations keep their input and statistics, pointwise activations
keep their input, softmax keeps its output, additions keep nothing.

Autocast follows ``aten/src/ATen/autocast_mode.h`` for CUDA: matmuls, convolutions and attention
run in the lower precision (inputs cast down; an fp32 parameter that trains is cast once per
forward and cached), ``layer_norm``/``group_norm``/``pow``/``rsqrt``/``mse_loss`` run in fp32
(inputs cast up), ``softmax`` returns fp32; everything else keeps its input dtype, and binary ops
promote (bf16 x fp32 -> fp32).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from fitcheck.diffusion.sim.core import BYTES, FLOATS, Param, T, out_of, sim, view_of

WIDE = {"fp32": 3, "bf16": 2, "fp16": 2, "fp8": 1}


def param(p: Param) -> T:
    """A parameter as an operand (no storage of its own in the step)."""
    return T(p.shape, p.dtype, None, rg=p.trainable and sim().grad_enabled, param=p)


def to(x: T, dtype: str) -> T:
    """``x.to(dtype)``: a copy; its backward casts the gradient back."""
    if x.dtype == dtype:
        return x
    s = sim()
    node = None
    if s.requires_grad(x):
        node = s.node("to")
        node.edges.append(s.edge(x))
    out = out_of(node, x.shape, dtype)
    return out


def _cast_param(x: T, dtype: str) -> T:
    """Autocast's cast of a parameter, through the weight cache when PyTorch caches it."""
    s = sim()
    if x.dtype == dtype:
        return x
    cacheable = x.param is not None and x.dtype == "fp32" and x.rg and dtype in ("bf16", "fp16")
    if cacheable and x.param is not None:
        key = id(x.param)
        hit = s.cache.get(key)
        if hit is None:
            hit = to(x, dtype)
            s.cache[key] = hit
        return hit
    return to(x, dtype)


def lower(x: T | None) -> T | None:
    """Inputs of a lower-precision op under autocast (matmul, conv, attention)."""
    s = sim()
    if x is None or s.autocast is None or x.dtype not in FLOATS or x.dtype == s.autocast:
        return x
    if x.param is not None:
        return _cast_param(x, s.autocast)
    return to(x, s.autocast)


def upper(x: T | None) -> T | None:
    """Inputs of an fp32-policy op under autocast (norms, pow, rsqrt, losses)."""
    s = sim()
    if x is None or s.autocast is None or x.dtype in ("fp32",) or x.dtype not in FLOATS:
        return x
    if x.param is not None:
        return _cast_param(x, "fp32")
    return to(x, "fp32")


def promote(*dtypes: str) -> str:
    return max(dtypes, key=lambda d: WIDE.get(d, 0))


def _grad_node(op: str, *inputs: T | None):  # type: ignore[no-untyped-def]
    s = sim()
    return s.node(op) if s.requires_grad(*inputs) else None


# --- matmul-like -----------------------------------------------------------------------------


def linear(x: T, w: Param, b: Param | None = None) -> T:
    """``F.linear``: saves the input iff the weight trains, the weight iff the input needs a grad."""
    s = sim()
    xc = lower(x)
    wc = lower(param(w))
    bc = lower(param(b)) if b is not None else None
    assert xc is not None and wc is not None
    node = _grad_node("linear", xc, wc, bc)
    if node is not None:
        if wc.rg:
            s.save(node, xc)
        if xc.rg:
            s.save(node, wc)
        node.edges += [s.edge(xc), s.edge(wc)]
        if bc is not None:
            node.edges.append(s.edge(bc))
    tokens = x.numel // x.shape[-1]
    s.flops += 2 * tokens * w.shape[0] * w.shape[1]
    return out_of(node, (*x.shape[:-1], w.shape[0]), xc.dtype)


def conv2d(x: T, w: Param, b: Param | None, stride: int = 1, padding: int = 0) -> T:
    """``F.conv2d``: input and weight are saved whenever anything needs a gradient."""
    s = sim()
    xc = lower(x)
    wc = lower(param(w))
    bc = lower(param(b)) if b is not None else None
    assert xc is not None and wc is not None
    k = w.shape[2]
    bsz, _, h, wd = x.shape
    ho = (h + 2 * padding - k) // stride + 1
    wo = (wd + 2 * padding - k) // stride + 1
    node = _grad_node("conv2d", xc, wc, bc)
    if node is not None:
        s.save(node, xc, wc)
        node.edges += [s.edge(xc), s.edge(wc)]
        if bc is not None:
            node.edges.append(s.edge(bc))
    s.flops += 2 * bsz * ho * wo * w.shape[0] * w.shape[1] * k * k
    return out_of(node, (bsz, w.shape[0], ho, wo), xc.dtype)


def bmm(a: T, b: T, cat: str | None = None, flops: bool = True) -> T:
    """Batched matmul (b, n, k) @ (b, k, m)."""
    s = sim()
    ac, bc = lower(a), lower(b)
    assert ac is not None and bc is not None
    node = _grad_node("bmm", ac, bc)
    if node is not None:
        if bc.rg:
            s.save(node, ac)
        if ac.rg:
            s.save(node, bc)
        node.edges += [s.edge(ac), s.edge(bc)]
    shape = (*a.shape[:-1], b.shape[-1])
    if flops:
        s.flops += 2 * math.prod(shape) * a.shape[-1]
    return out_of(node, shape, ac.dtype, cat)


def sdpa(q: T, k: T, v: T) -> T:
    """Flash / memory-efficient SDPA: saves q, k, v, the output and an fp32 logsumexp (O(N))."""
    s = sim()
    qc, kc, vc = lower(q), lower(k), lower(v)
    assert qc is not None and kc is not None and vc is not None
    node = _grad_node("sdpa", qc, kc, vc)
    bsz, heads, n, d = q.shape
    out = out_of(node, q.shape, qc.dtype)
    lse = out_of(None, (bsz, heads, n), "fp32")
    if node is not None:
        s.save(node, qc, kc, vc, out, lse)
        node.edges += [s.edge(qc), s.edge(kc), s.edge(vc)]
    s.flops += 4 * bsz * heads * n * k.shape[2] * d
    del lse
    return out


# --- normalisation and activations --------------------------------------------------------------


def _norm(op: str, x: T, w: Param | None, b: Param | None, stats: tuple[int, ...]) -> T:
    s = sim()
    xc = upper(x)
    wc = upper(param(w)) if w is not None else None
    bc = upper(param(b)) if b is not None else None
    assert xc is not None
    node = _grad_node(op, xc, wc, bc)
    out = out_of(node, x.shape, xc.dtype)
    sdt = "fp32" if xc.dtype in ("fp32", "bf16", "fp16") else xc.dtype
    mean = out_of(None, stats, sdt)
    rstd = out_of(None, stats, sdt)
    if node is not None:
        s.save(node, xc, wc, mean, rstd)
        node.edges.append(s.edge(xc))
        for p in (wc, bc):
            if p is not None:
                node.edges.append(s.edge(p))
    return out


def group_norm(x: T, w: Param | None, b: Param | None, groups: int) -> T:
    """``native_group_norm``: keeps its (fp32 under autocast) input, weight, mean and rstd."""
    return _norm("group_norm", x, w, b, (x.shape[0], groups))


def layer_norm(x: T, w: Param | None, b: Param | None) -> T:
    """``native_layer_norm``: keeps its (fp32 under autocast) input, weight, mean and rstd."""
    return _norm("layer_norm", x, w, b, (*x.shape[:-1], 1))


def _pointwise_saving_input(op: str, x: T) -> T:
    s = sim()
    node = _grad_node(op, x)
    if node is not None:
        s.save(node, x)
        node.edges.append(s.edge(x))
    return out_of(node, x.shape, x.dtype)


def silu(x: T) -> T:
    return _pointwise_saving_input("silu", x)


def gelu(x: T) -> T:
    return _pointwise_saving_input("gelu", x)


def sigmoid(x: T) -> T:
    """``torch.sigmoid``: keeps its output."""
    s = sim()
    node = _grad_node("sigmoid", x)
    out = out_of(node, x.shape, x.dtype)
    if node is not None:
        s.save(node, out)
        node.edges.append(s.edge(x))
    return out


def softmax(x: T, cat: str | None = None) -> T:
    """Softmax keeps its output; under autocast it returns fp32 (CUDA fp32_set_opt_dtype)."""
    s = sim()
    if s.autocast is not None and x.dtype in FLOATS and x.dtype != "fp32":
        x = _to_cat(x, "fp32", cat)
    node = _grad_node("softmax", x)
    out = out_of(node, x.shape, x.dtype, cat)
    if node is not None:
        s.save(node, out)
        node.edges.append(s.edge(x))
    return out


def _to_cat(x: T, dtype: str, cat: str | None) -> T:
    s = sim()
    old, s.default_cat = s.default_cat, cat or s.default_cat
    try:
        return to(x, dtype)
    finally:
        s.default_cat = old


def pow2(x: T) -> T:
    """``x.pow(2)`` (fp32 policy): keeps its input."""
    xc = upper(x)
    assert xc is not None
    return _pointwise_saving_input("pow", xc)


def rsqrt(x: T) -> T:
    """``torch.rsqrt`` (fp32 policy): keeps its output."""
    s = sim()
    xc = upper(x)
    assert xc is not None
    node = _grad_node("rsqrt", xc)
    out = out_of(node, x.shape, xc.dtype)
    if node is not None:
        s.save(node, out)
        node.edges.append(s.edge(xc))
    return out


# --- elementwise --------------------------------------------------------------------------------


def _broadcast(a: Sequence[int], b: Sequence[int]) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a2 = (1,) * (n - len(a)) + tuple(a)
    b2 = (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a2, b2, strict=True))


def _edge_to(x: T, out_shape: tuple[int, ...], out_dtype: str, mode_if_same: str):  # type: ignore[no-untyped-def]
    """Gradient edge of a binary op input: passed on, or reduced/cast into a new tensor."""
    s = sim()
    # lengths first: tuples of different lengths differ without comparing a batch with a width
    same = len(x.shape) == len(out_shape) and x.shape == out_shape and x.dtype == out_dtype
    if same:
        return s.edge(x, mode_if_same)
    tmp = math.prod(out_shape) * BYTES[out_dtype] if math.prod(x.shape) != math.prod(out_shape) else 0
    return s.edge(x, "alloc", tmp_bytes=tmp)


def add(a: T, b: T) -> T:
    """``a + b``: keeps nothing; both inputs receive the output gradient itself."""
    shape = _broadcast(a.shape, b.shape)
    dt = promote(a.dtype, b.dtype)
    node = _grad_node("add", a, b)
    if node is not None:
        node.edges += [_edge_to(a, shape, dt, "pass"), _edge_to(b, shape, dt, "pass")]
    return out_of(node, shape, dt)


def mul(a: T, b: T) -> T:
    """``a * b``: each operand is saved for the other's gradient."""
    s = sim()
    shape = _broadcast(a.shape, b.shape)
    dt = promote(a.dtype, b.dtype)
    node = _grad_node("mul", a, b)
    if node is not None:
        if a.rg:
            s.save(node, b)
        if b.rg:
            s.save(node, a)
        node.edges += [_edge_to(a, shape, dt, "alloc"), _edge_to(b, shape, dt, "alloc")]
    return out_of(node, shape, dt)


def scale(x: T) -> T:
    """Multiplication or division by a Python number: keeps nothing, new gradient tensor."""
    s = sim()
    node = _grad_node("scale", x)
    if node is not None:
        node.edges.append(s.edge(x))
    return out_of(node, x.shape, x.dtype)


def shift(x: T) -> T:
    """``x + number`` (e.g. ``1 + scale``, ``variance + eps``): keeps nothing, passes the gradient."""
    s = sim()
    node = _grad_node("shift", x)
    if node is not None:
        node.edges.append(s.edge(x, "pass"))
    return out_of(node, x.shape, x.dtype)


def mean_last(x: T) -> T:
    """``x.mean(-1, keepdim=True)``: its backward expands and divides (a full-size gradient)."""
    s = sim()
    node = _grad_node("mean", x)
    if node is not None:
        node.edges.append(s.edge(x))
    return out_of(node, (*x.shape[:-1], 1), x.dtype)


def cat(xs: Sequence[T], dim: int) -> T:
    """``torch.cat``: keeps nothing; each input's gradient is a slice (view) of the output's."""
    s = sim()
    dim = dim % len(xs[0].shape)
    shape = list(xs[0].shape)
    shape[dim] = sum(x.shape[dim] for x in xs)
    dt = promote(*(x.dtype for x in xs))
    node = _grad_node("cat", *xs)
    if node is not None:
        node.edges += [s.edge(x, "pass" if x.dtype == dt else "alloc") for x in xs]
    return out_of(node, tuple(shape), dt)


def split(x: T, sizes: Sequence[int], dim: int) -> list[T]:
    """``torch.split`` (also ``chunk``, ``unbind``, slicing): views of one storage; the backward
    stitches the pieces' gradients into one full-size gradient of ``x``."""
    s = sim()
    dim = dim % len(x.shape)
    assert sum(sizes) == x.shape[dim], (sizes, x.shape)
    node = _grad_node("split", x)
    if node is not None:
        node.edges.append(s.edge(x))
    out = []
    for i, n in enumerate(sizes):
        shape = list(x.shape)
        shape[dim] = n
        out.append(T(tuple(shape), x.dtype, x.st, rg=node is not None, fn=node, idx=i))
    return out


def chunk(x: T, n: int, dim: int) -> list[T]:
    """``x.chunk(n, dim)``."""
    return split(x, [x.shape[dim % len(x.shape)] // n] * n, dim)


def contiguous(x: T, shape: tuple[int, ...] | None = None) -> T:
    """A copy into a new layout (``.contiguous()``, a reshape of a permuted tensor)."""
    s = sim()
    node = _grad_node("copy", x)
    if node is not None:
        node.edges.append(s.edge(x, "pass"))
    return out_of(node, shape or x.shape, x.dtype)


def reshape(x: T, shape: tuple[int, ...]) -> T:
    """A view (the tensor is contiguous in the layout the reshape needs)."""
    assert math.prod(shape) == x.numel, (shape, x.shape)
    return view_of(x, shape)


def upsample_nearest(x: T, factor: int = 2) -> T:
    """``F.interpolate(mode="nearest")``: keeps nothing."""
    s = sim()
    node = _grad_node("upsample", x)
    if node is not None:
        node.edges.append(s.edge(x))
    b, c, h, w = x.shape
    return out_of(node, (b, c, h * factor, w * factor), x.dtype)


def empty(shape: tuple[int, ...], dtype: str, cat: str | None = None) -> T:
    """``torch.empty`` (a scratch tensor, no gradient)."""
    return out_of(None, shape, dtype, cat)


def mse(a: T, b: T) -> T:
    """``F.mse_loss(a, b, reduction="none")`` (fp32 policy): keeps both operands."""
    s = sim()
    ac, bc = upper(a), upper(b)
    assert ac is not None and bc is not None
    node = _grad_node("mse", ac, bc)
    if node is not None:
        s.save(node, ac, bc)
        node.edges += [s.edge(ac), s.edge(bc)]
    return out_of(node, a.shape, ac.dtype)


def mean_all(x: T) -> T:
    """``x.mean()`` to a scalar."""
    s = sim()
    node = _grad_node("mean_all", x)
    if node is not None:
        node.edges.append(s.edge(x))
    return out_of(node, (), x.dtype)


def combine(srcs: Sequence[T], shape: tuple[int, ...], dtype: str) -> T:
    """A new tensor computed from ``srcs`` (e.g. text states assembled for the denoiser)."""
    s = sim()
    node = _grad_node("combine", *srcs)
    if node is not None:
        node.edges += [s.edge(x) for x in srcs]
    return out_of(node, shape, dtype)
