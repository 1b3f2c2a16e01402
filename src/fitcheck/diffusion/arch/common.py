"""Pieces shared by the architectures: run settings, attention, timestep embedding MLP."""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import T, sim
from fitcheck.diffusion.sim.nn import Linear, Module


@dataclass(frozen=True)
class Run:
    """How a forward runs: attention kernel and gradient checkpointing."""

    attn: str = "sdpa"  # sdpa | eager (flash and xformers keep what sdpa keeps)
    ckpt: bool = False


def attention(q: T, k: T, v: T, heads: int, run: Run) -> T:
    """Multi-head attention on (b, n, heads*d) projections, returning (b, n, heads*d).

    ``sdpa`` is diffusers' ``AttnProcessor2_0`` (views in, flash-style kernel, a view out);
    ``eager`` is ``AttnProcessor``: ``head_to_batch_dim`` copies, ``baddbmm`` into an empty scores
    tensor, fp32 softmax (kept), its compute-dtype copy (kept by the second bmm), and a copy back.
    """
    b, n, inner = q.shape
    m = k.shape[1]
    d = inner // heads
    if run.attn != "eager":
        qh = ops.reshape(q, (b, heads, n, d))
        kh = ops.reshape(k, (b, heads, m, d))
        vh = ops.reshape(v, (b, heads, m, d))
        out = ops.sdpa(qh, kh, vh)
        return ops.reshape(out, (b, n, inner))
    # head_to_batch_dim: reshape, permute, reshape; the last reshape is a view only when b == 1
    qb, kb, vb = (_heads_first(t, heads) for t in (q, k, v))
    dt = sim().autocast or qb.dtype
    scratch = ops.empty((b * heads, n, m), dt, "attention_scores")
    kt = ops.reshape(kb, (b * heads, d, m))
    scores = ops.bmm(qb, kt, cat="attention_scores")
    del scratch
    probs = ops.softmax(scores, cat="attention_scores")
    del scores
    probs16 = _to_scores(probs, dt)
    del probs
    out = ops.bmm(probs16, vb)
    return ops.contiguous(out, (b, n, inner))


def _heads_first(x: T, heads: int) -> T:
    b, n, inner = x.shape
    shape = (b * heads, n, inner // heads)
    return ops.reshape(x, shape) if b == 1 else ops.contiguous(x, shape)


def _to_scores(x: T, dtype: str) -> T:
    s = sim()
    old, s.default_cat = s.default_cat, "attention_scores"
    try:
        return ops.to(x, dtype)
    finally:
        s.default_cat = old


class TimestepMLP(Module):
    """diffusers ``TimestepEmbedding``: linear_1, SiLU, linear_2."""

    def __init__(self, d_in: int, d: int, d_out: int | None = None) -> None:
        super().__init__()
        self.linear_1 = Linear(d_in, d)
        self.linear_2 = Linear(d, d_out or d)

    def __call__(self, x: T) -> T:
        return self.linear_2(ops.silu(self.linear_1(x)))
