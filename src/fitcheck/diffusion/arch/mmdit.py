"""Stable Diffusion 3.5 MMDiT in the layout kohya sd-scripts trains (``library/sd3_models.py``).

The parameters equal diffusers' ``SD3Transformer2DModel`` built from the published
``transformer/config.json`` (fused ``qkv`` here = ``to_q/to_k/to_v`` there; ``attn2`` for the
MMDiT-X dual-attention layers of 3.5 Medium; the last block's context stream is "pre-only": no
output projection, no MLP). kohya's ``networks/lora_sd3.py`` wraps every ``nn.Linear`` inside
``SingleDiTBlock`` (both streams of each joint block).

Forward: ``(latent/2)^2`` image tokens (2x2 patches) and 77 CLIP + 256 T5 text tokens; per block
adaLN modulation, LayerNorm, fused qkv, RMS q/k norm in the compute dtype, joint SDPA over both
streams, gated residuals, GELU(tanh) MLPs. Every joint block is a checkpoint unit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.diffusion.arch.common import Run, attention
from fitcheck.diffusion.arch.flux import MLPEmbedder, modulate
from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import Param, T, sim
from fitcheck.diffusion.sim.nn import Conv2d, LayerNorm, Linear, Module, Seq


class QKRMSNorm(Module):
    """sd3_models.RMSNorm: ``x * rsqrt(mean(x^2) + eps) * weight.to(x.dtype)``.

    Under autocast ``pow`` and ``rsqrt`` run in fp32, so ``x * rsqrt`` promotes to fp32 and q and k
    leave the norm in fp32 (nothing casts them back before attention).
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = Param((d,), "norm")

    def __call__(self, x: T) -> T:
        y = ops.mul(x, ops.rsqrt(ops.shift(ops.mean_last(ops.pow2(x)))))
        return ops.mul(y, ops.to(ops.param(self.weight), y.dtype))


class AttentionLinears(Module):
    def __init__(self, d: int, heads: int, pre_only: bool) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = Linear(d, 3 * d)
        self.proj = None if pre_only else Linear(d, d)
        self.ln_q = QKRMSNorm(d // heads)
        self.ln_k = QKRMSNorm(d // heads)

    def pre(self, x: T) -> tuple[T, T, T]:
        qkv = self.qkv(x)
        q, k, v = ops.chunk(qkv, 3, -1)
        return self.ln_q(q), self.ln_k(k), v


class SingleDiTBlock(Module):
    kohya = "SingleDiTBlock"

    def __init__(self, d: int, heads: int, pre_only: bool, dual: bool) -> None:
        super().__init__()
        self.pre_only, self.dual = pre_only, dual
        self.norm1 = LayerNorm(d, affine=False)
        self.attn = AttentionLinears(d, heads, pre_only)
        self.attn2 = AttentionLinears(d, heads, False) if dual else None
        self.norm2 = None if pre_only else LayerNorm(d, affine=False)
        self.mlp_fc1 = None if pre_only else Linear(d, 4 * d)
        self.mlp_fc2 = None if pre_only else Linear(4 * d, d)
        n_mods = 9 if dual else (2 if pre_only else 6)
        self.adaLN_modulation = Linear(d, n_mods * d)
        self.n_mods = n_mods

    def mods(self, c: T) -> list[T]:
        out = self.adaLN_modulation(ops.silu(c))
        b, nd = out.shape
        return ops.chunk(ops.reshape(out, (b, 1, nd)), self.n_mods, -1)

    def post(self, x: T, attn: T, m: list[T], attn2: T | None) -> T:
        assert self.attn.proj is not None and self.norm2 is not None
        assert self.mlp_fc1 is not None and self.mlp_fc2 is not None
        x = ops.add(x, ops.mul(m[2], self.attn.proj(attn)))
        if attn2 is not None and self.attn2 is not None and self.attn2.proj is not None:
            x = ops.add(x, ops.mul(m[8], self.attn2.proj(attn2)))
        h = self.mlp_fc2(ops.gelu(self.mlp_fc1(modulate(self.norm2(x), m[3], m[4]))))
        return ops.add(x, ops.mul(m[5], h))


class JointBlock(Module):
    kohya = "MMDiTBlock"

    def __init__(self, d: int, heads: int, last: bool, dual: bool) -> None:
        super().__init__()
        self.heads = heads
        self.context_block = SingleDiTBlock(d, heads, last, False)
        self.x_block = SingleDiTBlock(d, heads, False, dual)

    def __call__(self, ctx: T, x: T, c: T, run: Run) -> tuple[T | None, T]:
        cb, xb = self.context_block, self.x_block
        cm = cb.mods(c)
        cq, ck, cv = cb.attn.pre(modulate(cb.norm1(ctx), cm[0], cm[1]))
        xm = xb.mods(c)
        xn = xb.norm1(x)
        xq, xk, xv = xb.attn.pre(modulate(xn, xm[0], xm[1]))
        q2 = None
        if xb.attn2 is not None:
            q2 = xb.attn2.pre(modulate(xn, xm[6], xm[7]))
        del xn
        # like sd3_models.MMDiTBlock._forward, the per-stream q/k/v (ctx_qkv, x_qkv) and the joint
        # q/k/v stay referenced until the block returns
        q = ops.cat([cq, xq], 1)
        k = ops.cat([ck, xk], 1)
        v = ops.cat([cv, xv], 1)
        attn = _attention(q, k, v, self.heads, run)
        ctx_attn, x_attn = ops.split(attn, [ctx.shape[1], x.shape[1]], 1)
        attn2 = _attention(*q2, self.heads, run) if q2 is not None else None
        x = xb.post(x, x_attn, xm, attn2)
        new_ctx = None if cb.pre_only else cb.post(ctx, ctx_attn, cm, None)
        return new_ctx, x


def _attention(q: T, k: T, v: T, heads: int, run: Run) -> T:
    """sd3_models.attention: ``sdpa(q, k.to(q), v.to(q))``; q and k arrive in fp32 from the norm."""
    return attention(q, ops.to(k, q.dtype), ops.to(v, q.dtype), heads, run)


class MMDiT(Module):
    """Built from a diffusers ``SD3Transformer2DModel`` config."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        heads = int(cfg.get("num_attention_heads", 18))
        d = heads * int(cfg.get("attention_head_dim", 64))
        self.d = d
        self.patch = int(cfg.get("patch_size", 2))
        self.in_channels = int(cfg.get("in_channels", 16))
        self.joint_dim = int(cfg.get("joint_attention_dim", 4096))
        self.pooled_dim = int(cfg.get("pooled_projection_dim", 2048))
        n = int(cfg.get("num_layers", 18))
        dual = set(cfg.get("dual_attention_layers") or ())
        self.x_embedder = Conv2d(self.in_channels, d, self.patch, stride=self.patch)
        pos = int(cfg.get("pos_embed_max_size") or 0)
        # A registered buffer in both diffusers and sd-scripts: stored with the weights (and in the
        # published parameter figures: 2.5B for 3.5 Medium, 8.1B for Large), not a parameter.
        self.pos_embed = Param((1, pos * pos, d), "buffer") if pos else None
        self.t_embedder = MLPEmbedder(256, d)
        self.y_embedder = MLPEmbedder(self.pooled_dim, d)
        self.context_embedder = Linear(self.joint_dim, int(cfg.get("caption_projection_dim") or d))
        self.joint_blocks = Seq([JointBlock(d, heads, i == n - 1, i in dual) for i in range(n)])
        self.norm_final = LayerNorm(d, affine=False)
        out = int(cfg.get("out_channels") or self.in_channels)
        self.final_linear = Linear(d, self.patch * self.patch * out)
        self.final_mod = Linear(d, 2 * d)

    def inputs(self, batch: int, latent_hw: tuple[int, int], text_len: int, dtype: str) -> dict[str, T]:
        s = sim()
        return {
            "x": s.new((batch, self.in_channels, *latent_hw), dtype, "inputs"),
            "context": s.new((batch, text_len, self.joint_dim), dtype, "inputs"),
            "y": s.new((batch, self.pooled_dim), dtype, "inputs"),
        }

    def __call__(self, inp: Mapping[str, T], run: Run) -> T:
        s = sim()
        x = self.x_embedder(inp["x"])
        b, d, h, w = x.shape
        x = ops.add(ops.contiguous(x, (b, h * w, d)), s.new((1, h * w, d), x.dtype))
        c = ops.add(self.t_embedder(s.new((b, 256), "fp32")), self.y_embedder(inp["y"]))
        ctx: T | None = self.context_embedder(inp["context"])
        for blk in self.joint_blocks:
            assert ctx is not None
            with s.checkpoint(ctx, x, c, enabled=run.ckpt):
                ctx, x = blk(ctx, x, c, run)
        del ctx
        shift, scale = ops.chunk(self.final_mod(ops.silu(c)), 2, 1)
        x = modulate(self.norm_final(x), ops.reshape(shift, (b, 1, d)), ops.reshape(scale, (b, 1, d)))
        return self.final_linear(x)
