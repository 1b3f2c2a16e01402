"""FLUX.1 in the layout kohya sd-scripts trains (``library/flux_models.py``, Black Forest Labs' code).

The parameter set is the one diffusers' ``FluxTransformer2DModel`` holds (its separate
``to_q``/``to_k``/``to_v`` are the rows of the fused ``qkv`` here), so the count is compared with
the diffusers class built from the published ``transformer/config.json``. The layout matters for
LoRA: kohya's ``networks/lora_flux.py`` wraps every ``nn.Linear`` in ``DoubleStreamBlock`` and
``SingleStreamBlock``, i.e. the fused ``qkv``, ``proj``, both MLP layers and the modulation linears,
and the single blocks' fused ``linear1``/``linear2``.

Forward: image tokens (latent/2 squared, 2x2 patches of 16 channels) and text tokens (T5, 512 for
dev, 256 for schnell) through 19 double-stream blocks (separate weights, joint attention), then 38
single-stream blocks on the concatenation; RoPE in fp32 on q and k (``apply_rope``), fp32 RMS
q/k norms, SDPA. Every block is a checkpoint unit when gradient checkpointing is on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.diffusion.arch.common import Run, attention
from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import Param, T, sim
from fitcheck.diffusion.sim.nn import LayerNorm, Linear, Module, Seq


class MLPEmbedder(Module):
    def __init__(self, d_in: int, d: int) -> None:
        super().__init__()
        self.in_layer = Linear(d_in, d)
        self.out_layer = Linear(d, d)

    def __call__(self, x: T) -> T:
        return self.out_layer(ops.silu(self.in_layer(x)))


class RMSNorm(Module):
    """``x.float() * rsqrt(mean(x^2) + eps) * scale.float()``, cast back to the input dtype."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.scale = Param((d,), "norm")

    def __call__(self, x: T) -> T:
        dt = x.dtype
        xf = ops.to(x, "fp32")
        rrms = ops.rsqrt(ops.shift(ops.mean_last(ops.pow2(xf))))
        y = ops.mul(ops.mul(xf, rrms), ops.to(ops.param(self.scale), "fp32"))
        return ops.to(y, dt)


class QKNorm(Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.query_norm = RMSNorm(d)
        self.key_norm = RMSNorm(d)


class Modulation(Module):
    def __init__(self, d: int, n: int) -> None:
        super().__init__()
        self.n = n
        self.lin = Linear(d, n * d)

    def __call__(self, vec: T) -> list[T]:
        out = self.lin(ops.silu(vec))
        b, nd = out.shape
        return ops.chunk(ops.reshape(out, (b, 1, nd)), self.n, -1)


def modulate(x: T, shift: T, scale: T) -> T:
    """``(1 + scale) * x + shift``."""
    return ops.add(ops.mul(ops.shift(scale), x), shift)


def rope_attention(q: T, k: T, v: T, heads: int, run: Run, pe: T) -> T:
    """``apply_rope`` (fp32 rotation of q and k, cast back) then attention; (b, n, heads*d) out."""
    qr = _rope(q, pe)
    kr = _rope(k, pe)
    return attention(qr, kr, v, heads, run)


def _rope(x: T, pe: T) -> T:
    """``freqs[..., 0] * x_[..., 0] + freqs[..., 1] * x_[..., 1]`` on ``x.float()``, cast back.

    The products keep only ``freqs`` (shared by every block, no gradient).
    """
    xf = ops.to(x, "fp32")
    y = ops.add(ops.mul(pe, xf), ops.mul(pe, xf))
    del xf
    return ops.to(y, x.dtype)


class StreamHalf(Module):
    """One stream of a ``DoubleStreamBlock`` (the img_* or txt_* modules)."""

    def __init__(self, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.mod = Modulation(d, 6)
        self.norm1 = LayerNorm(d, affine=False)
        self.qkv = Linear(d, 3 * d)
        self.norm = QKNorm(d // heads)
        self.proj = Linear(d, d)
        self.norm2 = LayerNorm(d, affine=False)
        self.mlp_0 = Linear(d, mlp)
        self.mlp_2 = Linear(mlp, d)

    def pre(self, x: T, vec: T) -> tuple[list[T], T, T, T]:
        m = self.mod(vec)
        xm = modulate(self.norm1(x), m[0], m[1])
        qkv = self.qkv(xm)
        del xm
        q, k, v = ops.chunk(qkv, 3, -1)
        q = self.norm.query_norm(q)
        k = self.norm.key_norm(k)
        return m, q, k, v

    def post(self, x: T, attn: T, m: list[T]) -> T:
        x = ops.add(x, ops.mul(m[2], self.proj(attn)))
        h = self.mlp_2(ops.gelu(self.mlp_0(modulate(self.norm2(x), m[3], m[4]))))
        return ops.add(x, ops.mul(m[5], h))


class DoubleStreamBlock(Module):
    kohya = "DoubleStreamBlock"

    def __init__(self, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.heads = heads
        self.img = StreamHalf(d, heads, mlp)
        self.txt = StreamHalf(d, heads, mlp)

    def __call__(self, img: T, txt: T, vec: T, pe: T, run: Run) -> tuple[T, T]:
        im, iq, ik, iv = self.img.pre(img, vec)
        tm, tq, tk, tv = self.txt.pre(txt, vec)
        # like DoubleStreamBlock._forward, the per-stream and joint q/k/v stay referenced until return
        q = ops.cat([tq, iq], 1)
        k = ops.cat([tk, ik], 1)
        v = ops.cat([tv, iv], 1)
        attn = rope_attention(q, k, v, self.heads, run, pe)
        txt_attn, img_attn = ops.split(attn, [txt.shape[1], img.shape[1]], 1)
        img = self.img.post(img, img_attn, im)
        txt = self.txt.post(txt, txt_attn, tm)
        return img, txt


class SingleStreamBlock(Module):
    kohya = "SingleStreamBlock"

    def __init__(self, d: int, heads: int, mlp: int) -> None:
        super().__init__()
        self.d, self.heads, self.mlp = d, heads, mlp
        self.linear1 = Linear(d, 3 * d + mlp)
        self.linear2 = Linear(d + mlp, d)
        self.norm = QKNorm(d // heads)
        self.pre_norm = LayerNorm(d, affine=False)
        self.modulation = Modulation(d, 3)

    def __call__(self, x: T, vec: T, pe: T, run: Run) -> T:
        mod = self.modulation(vec)
        x_mod = modulate(self.pre_norm(x), mod[0], mod[1])
        h = self.linear1(x_mod)
        del x_mod
        q, k, v, mlp = ops.split(h, [self.d, self.d, self.d, self.mlp], -1)
        del h
        q = self.norm.query_norm(q)
        k = self.norm.key_norm(k)
        attn = rope_attention(q, k, v, self.heads, run, pe)
        del q, k, v
        out = self.linear2(ops.cat([attn, ops.gelu(mlp)], 2))
        return ops.add(x, ops.mul(mod[2], out))


class Flux(Module):
    """Built from a diffusers ``FluxTransformer2DModel`` config (published ``transformer/config.json``)."""

    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        heads = int(cfg.get("num_attention_heads", 24))
        d = heads * int(cfg.get("attention_head_dim", 128))
        self.d, self.heads = d, heads
        self.in_channels = int(cfg.get("in_channels", 64))
        self.joint_dim = int(cfg.get("joint_attention_dim", 4096))
        self.pooled_dim = int(cfg.get("pooled_projection_dim", 768))
        mlp = int(d * float(cfg.get("mlp_ratio", 4.0)))
        self.img_in = Linear(self.in_channels, d)
        self.time_in = MLPEmbedder(256, d)
        self.vector_in = MLPEmbedder(self.pooled_dim, d)
        self.guidance_in = MLPEmbedder(256, d) if cfg.get("guidance_embeds", False) else None
        self.txt_in = Linear(self.joint_dim, d)
        self.double_blocks = Seq(
            [DoubleStreamBlock(d, heads, mlp) for _ in range(int(cfg.get("num_layers", 19)))]
        )
        self.single_blocks = Seq(
            [SingleStreamBlock(d, heads, mlp) for _ in range(int(cfg.get("num_single_layers", 38)))]
        )
        self.norm_final = LayerNorm(d, affine=False)
        patch = int(cfg.get("patch_size", 1))
        out = int(cfg.get("out_channels") or self.in_channels)
        self.final_linear = Linear(d, patch * patch * out)
        self.final_mod = Linear(d, 2 * d)

    def inputs(self, batch: int, latent_hw: tuple[int, int], text_len: int, dtype: str) -> dict[str, T]:
        s = sim()
        h, w = latent_hw
        return {
            "img": s.new((batch, (h // 2) * (w // 2), self.in_channels), dtype, "inputs"),
            "txt": s.new((batch, text_len, self.joint_dim), dtype, "inputs"),
            "y": s.new((batch, self.pooled_dim), dtype, "inputs"),
        }

    def __call__(self, inp: Mapping[str, T], run: Run) -> T:
        s = sim()
        img = self.img_in(inp["img"])
        b = img.shape[0]
        vec = self.time_in(s.new((b, 256), "fp32"))
        if self.guidance_in is not None:
            vec = ops.add(vec, self.guidance_in(s.new((b, 256), "fp32")))
        vec = ops.add(vec, self.vector_in(inp["y"]))
        txt = self.txt_in(inp["txt"])
        n_txt, n_img = txt.shape[1], img.shape[1]
        head = self.d // self.heads
        pe = s.new((1, n_txt + n_img, 2 * head), "fp32")  # EmbedND output (L x head/2 x 2 x 2), shared
        for blk in self.double_blocks:
            with s.checkpoint(img, txt, vec, enabled=run.ckpt):
                img, txt = blk(img, txt, vec, pe, run)
        x = ops.cat([txt, img], 1)
        del txt, img
        for blk in self.single_blocks:
            with s.checkpoint(x, vec, enabled=run.ckpt):
                x = blk(x, vec, pe, run)
        _, x = ops.split(x, [n_txt, n_img], 1)
        shift, scale = ops.chunk(self.final_mod(ops.silu(vec)), 2, 1)
        x = modulate(
            self.norm_final(x), ops.reshape(shift, (b, 1, self.d)), ops.reshape(scale, (b, 1, self.d))
        )
        return self.final_linear(x)
