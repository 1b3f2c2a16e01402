"""diffusers ``UNet2DConditionModel`` (SD 1.x, SD 2.x, SDXL) as a module tree and its forward.

Built from the component's ``config.json`` exactly as ``UNet2DConditionModel.__init__`` reads it
(``num_attention_heads`` falls back to ``attention_head_dim``, per-block lists or scalars,
``transformer_layers_per_block``, ``use_linear_projection``, SDXL's ``text_time`` add-embedding), so
the parameter count is exact. The forward follows diffusers 0.42's code op by op, including where
``enable_gradient_checkpointing()`` puts checkpoints: every ``ResnetBlock2D`` in the down and up
blocks and every ``BasicTransformerBlock`` (the mid block's first resnet, the attention blocks'
norm/proj_in/proj_out and the samplers are not checkpointed).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fitcheck.diffusion.arch.common import Run, TimestepMLP, attention
from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import T, sim
from fitcheck.diffusion.sim.nn import Conv2d, GroupNorm, LayerNorm, Linear, Module, Seq


def _per_block(value: Any, n: int) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value] * n


class ResnetBlock2D(Module):
    kohya = "ResnetBlock2D"

    def __init__(self, c_in: int, c_out: int, temb: int, groups: int) -> None:
        super().__init__()
        self.norm1 = GroupNorm(groups, c_in)
        self.conv1 = Conv2d(c_in, c_out, 3, padding=1)
        self.time_emb_proj = Linear(temb, c_out)
        self.norm2 = GroupNorm(groups, c_out)
        self.conv2 = Conv2d(c_out, c_out, 3, padding=1)
        self.conv_shortcut = Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def __call__(self, x: T, temb: T) -> T:
        h = ops.silu(self.norm1(x))
        h = self.conv1(h)
        t = self.time_emb_proj(ops.silu(temb))
        t = ops.reshape(t, (*t.shape, 1, 1))
        h = ops.add(h, t)
        del t
        h = ops.silu(self.norm2(h))
        h = self.conv2(h)
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return ops.scale(ops.add(x, h))


class Attention(Module):
    """diffusers ``Attention`` with bias-free q/k/v and a biased output projection."""

    def __init__(self, dim: int, heads: int, ctx_dim: int | None = None) -> None:
        super().__init__()
        self.heads = heads
        self.to_q = Linear(dim, dim, bias=False)
        self.to_k = Linear(ctx_dim or dim, dim, bias=False)
        self.to_v = Linear(ctx_dim or dim, dim, bias=False)
        self.to_out = Seq([Linear(dim, dim)])

    def __call__(self, x: T, ctx: T | None, run: Run) -> T:
        src = x if ctx is None else ctx
        q = self.to_q(x)
        k = self.to_k(src)
        v = self.to_v(src)
        out = attention(q, k, v, self.heads, run)
        del q, k, v
        return ops.scale(self.to_out[0](out))


class GEGLUFeedForward(Module):
    """``FeedForward(activation_fn="geglu")``: proj to 2 x inner, chunk, ``h * gelu(gate)``, out."""

    def __init__(self, dim: int, mult: int = 4) -> None:
        super().__init__()
        inner = dim * mult
        self.proj = Linear(dim, inner * 2)  # net.0.proj
        self.out = Linear(inner, dim)  # net.2

    def __call__(self, x: T) -> T:
        h, gate = ops.chunk(self.proj(x), 2, -1)
        h = ops.mul(h, ops.gelu(gate))
        del gate
        return self.out(h)


class BasicTransformerBlock(Module):
    kohya = "BasicTransformerBlock"

    def __init__(self, dim: int, heads: int, ctx_dim: int) -> None:
        super().__init__()
        self.norm1 = LayerNorm(dim)
        self.attn1 = Attention(dim, heads)
        self.norm2 = LayerNorm(dim)
        self.attn2 = Attention(dim, heads, ctx_dim)
        self.norm3 = LayerNorm(dim)
        self.ff = GEGLUFeedForward(dim)

    def __call__(self, hidden_states: T, ctx: T, run: Run) -> T:
        # Same locals as diffusers: the last norm output and attention output stay referenced
        # until the next assignment rebinds them.
        norm_hidden_states = self.norm1(hidden_states)
        attn_output = self.attn1(norm_hidden_states, None, run)
        hidden_states = ops.add(attn_output, hidden_states)
        norm_hidden_states = self.norm2(hidden_states)
        attn_output = self.attn2(norm_hidden_states, ctx, run)
        hidden_states = ops.add(attn_output, hidden_states)
        norm_hidden_states = self.norm3(hidden_states)
        ff_output = self.ff(norm_hidden_states)
        hidden_states = ops.add(ff_output, hidden_states)
        return hidden_states


class Transformer2DModel(Module):
    kohya = "Transformer2DModel"

    def __init__(self, c: int, heads: int, depth: int, ctx_dim: int, groups: int, linear: bool) -> None:
        super().__init__()
        self.linear = linear
        self.norm = GroupNorm(groups, c)
        self.proj_in: Linear | Conv2d = Linear(c, c) if linear else Conv2d(c, c, 1)
        self.transformer_blocks = Seq([BasicTransformerBlock(c, heads, ctx_dim) for _ in range(depth)])
        self.proj_out: Linear | Conv2d = Linear(c, c) if linear else Conv2d(c, c, 1)

    def __call__(self, x: T, ctx: T, run: Run) -> T:
        b, c, h, w = x.shape
        s = sim()
        y = self.norm(x)
        if self.linear:
            y = self.proj_in(ops.contiguous(y, (b, h * w, c)))
        else:
            y = ops.contiguous(self.proj_in(y), (b, h * w, c))
        for block in self.transformer_blocks:
            with s.checkpoint(y, ctx, enabled=run.ckpt):
                y = block(y, ctx, run)
        if self.linear:
            y = ops.contiguous(self.proj_out(y), (b, c, h, w))
        else:
            y = self.proj_out(ops.contiguous(y, (b, c, h, w)))
        return ops.add(y, x)


class Downsample2D(Module):
    kohya = "Downsample2D"

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = Conv2d(c, c, 3, stride=2, padding=1)

    def __call__(self, x: T) -> T:
        return self.conv(x)


class Upsample2D(Module):
    kohya = "Upsample2D"

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = Conv2d(c, c, 3, padding=1)

    def __call__(self, x: T) -> T:
        return self.conv(ops.upsample_nearest(x))


class Block(Module):
    """A down or up block: resnets, optional attentions, optional sampler."""

    def __init__(self) -> None:
        super().__init__()
        self.resnets: Seq = Seq([])
        self.attentions: Seq | None = None
        self.sampler: Module | None = None


@dataclass(frozen=True)
class _Layout:
    """The per-block lists ``UNet2DConditionModel.__init__`` derives from its config (scalars spread)."""

    boc: list[int]
    heads: list[Any]
    layers: list[int]
    ctx: list[int]
    tlpb: list[Any]
    rtlpb: list[Any]
    groups: int
    linear: bool
    temb: int

    @classmethod
    def of(cls, cfg: Mapping[str, Any]) -> _Layout:
        boc = list(cfg["block_out_channels"])
        n = len(boc)
        head_dim = cfg.get("attention_head_dim", 8)
        tlpb = _per_block(cfg.get("transformer_layers_per_block", 1), n)
        return cls(
            boc=boc,
            heads=_per_block(cfg.get("num_attention_heads") or head_dim, n),
            layers=_per_block(cfg.get("layers_per_block", 2), n),
            ctx=_per_block(cfg.get("cross_attention_dim", 1280), n),
            tlpb=tlpb,
            rtlpb=cfg.get("reverse_transformer_layers_per_block") or list(reversed(tlpb)),
            groups=int(cfg.get("norm_num_groups", 32)),
            linear=bool(cfg.get("use_linear_projection", False)),
            temb=boc[0] * 4,
        )


def _down_blocks(lay: _Layout, kinds: list[str]) -> Seq:
    """Down blocks: resnets, cross-attention transformers (CrossAttn*), a downsampler but the last."""
    n = len(lay.boc)
    downs: list[Module] = []
    out_c = lay.boc[0]
    for i, kind in enumerate(kinds):
        in_c, out_c = out_c, lay.boc[i]
        blk = Block()
        blk.resnets = Seq(
            [
                ResnetBlock2D(in_c if j == 0 else out_c, out_c, lay.temb, lay.groups)
                for j in range(lay.layers[i])
            ]
        )
        if kind.startswith("CrossAttn"):
            depth = _per_block(lay.tlpb[i], lay.layers[i])
            blk.attentions = Seq(
                [
                    Transformer2DModel(out_c, lay.heads[i], depth[j], lay.ctx[i], lay.groups, lay.linear)
                    for j in range(lay.layers[i])
                ]
            )
        if i < n - 1:
            blk.sampler = Downsample2D(out_c)
        downs.append(blk)
    return Seq(downs)


def _mid_block(lay: _Layout) -> Block:
    """Two resnets around one cross-attention transformer at the lowest resolution."""
    c = lay.boc[-1]
    mid = Block()
    mid.resnets = Seq([ResnetBlock2D(c, c, lay.temb, lay.groups) for _ in range(2)])
    depth = _per_block(lay.tlpb[-1], 1)[0]
    mid.attentions = Seq([Transformer2DModel(c, lay.heads[-1], depth, lay.ctx[-1], lay.groups, lay.linear)])
    return mid


def _up_blocks(lay: _Layout, kinds: list[str]) -> Seq:
    """Up blocks: one more resnet than the down block, each reading a skip connection; upsamplers."""
    n = len(lay.boc)
    rboc = list(reversed(lay.boc))
    rheads, rlayers, rctx = list(reversed(lay.heads)), list(reversed(lay.layers)), list(reversed(lay.ctx))
    ups: list[Module] = []
    out_c = rboc[0]
    for i, kind in enumerate(kinds):
        prev, out_c = out_c, rboc[i]
        in_c = rboc[min(i + 1, n - 1)]
        nl = rlayers[i] + 1
        blk = Block()
        res = []
        for j in range(nl):
            skip = in_c if j == nl - 1 else out_c
            res.append(ResnetBlock2D((prev if j == 0 else out_c) + skip, out_c, lay.temb, lay.groups))
        blk.resnets = Seq(res)
        if kind.startswith("CrossAttn"):
            depth = _per_block(lay.rtlpb[i], nl)
            blk.attentions = Seq(
                [
                    Transformer2DModel(out_c, rheads[i], depth[j], rctx[i], lay.groups, lay.linear)
                    for j in range(nl)
                ]
            )
        if i < n - 1:
            blk.sampler = Upsample2D(out_c)
        ups.append(blk)
    return Seq(ups)


class UNet2DConditionModel(Module):
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        lay = _Layout.of(cfg)
        boc = lay.boc
        self.in_channels = int(cfg.get("in_channels", 4))
        self.conv_in = Conv2d(self.in_channels, boc[0], int(cfg.get("conv_in_kernel", 3)), padding=1)
        self.time_embedding = TimestepMLP(boc[0], lay.temb)
        self.text_time = cfg.get("addition_embed_type") == "text_time"
        self.add_embedding: TimestepMLP | None = None
        self.add_time_dim = int(cfg.get("addition_time_embed_dim") or 0)
        self.add_in = int(cfg.get("projection_class_embeddings_input_dim") or 0)
        if self.text_time:
            self.add_embedding = TimestepMLP(self.add_in, lay.temb)
        self.ctx_dim = lay.ctx[0]
        self.down_blocks = _down_blocks(lay, list(cfg["down_block_types"]))
        self.mid_block = _mid_block(lay)
        self.up_blocks = _up_blocks(lay, list(cfg["up_block_types"]))
        self.conv_norm_out = GroupNorm(lay.groups, boc[0])
        self.conv_out = Conv2d(
            boc[0], int(cfg.get("out_channels", 4)), int(cfg.get("conv_out_kernel", 3)), padding=1
        )
        self.down_factor = 2 ** (len(boc) - 1)

    # --- forward -------------------------------------------------------------------------------

    def inputs(self, batch: int, latent_hw: tuple[int, int], text_len: int, dtype: str) -> dict[str, T]:
        """The batch one step feeds: noisy latents, text states, (SDXL) pooled text and size ids."""
        s = sim()
        out = {
            "sample": s.new((batch, self.in_channels, *latent_hw), dtype, "inputs"),
            "context": s.new((batch, text_len, self.ctx_dim), dtype, "inputs"),
        }
        if self.text_time:
            out["text_embeds"] = s.new((batch, self.add_in - 6 * self.add_time_dim), dtype, "inputs")
        return out

    def __call__(self, inp: Mapping[str, T], run: Run) -> T:
        s = sim()
        x = inp["sample"]
        ctx = inp["context"]
        b = x.shape[0]
        t_emb = s.new((b, self.conv_in.c_out), x.dtype)
        emb = self.time_embedding(t_emb)
        del t_emb
        if self.add_embedding is not None:
            # concat(text_embeds, time-id embeddings) -> add_embedding; grads reach text_embeds
            add = ops.combine([inp["text_embeds"]], (b, self.add_in), emb.dtype)
            emb = ops.add(emb, self.add_embedding(add))
            del add
        x = self.conv_in(x)
        skips: list[T] = [x]
        # Each block is a call: like diffusers, the caller keeps the block's input alive until the
        # block returns (``sample = block(hidden_states=sample, ...)``); an up block's skip tensors
        # stay referenced by ``res_samples`` until the next block starts.
        for i, blk in enumerate(self.down_blocks):
            with s.at(f"down_blocks.{i}"):
                x = self._down(blk, x, emb, ctx, skips, run)
        with s.at("mid_block"):
            x = self._mid(x, emb, ctx, run)
        res: list[T] = []
        for i, blk in enumerate(self.up_blocks):
            n = len(blk.resnets)
            res = skips[-n:]
            skips = skips[:-n]
            with s.at(f"up_blocks.{i}"):
                x = self._up(blk, x, emb, ctx, list(res), run)
        x = ops.silu(self.conv_norm_out(x))
        return self.conv_out(x)

    @staticmethod
    def _down(blk: Block, x: T, emb: T, ctx: T, skips: list[T], run: Run) -> T:
        s = sim()
        for j, resnet in enumerate(blk.resnets):
            with s.checkpoint(x, emb, enabled=run.ckpt):
                x = resnet(x, emb)
            if blk.attentions is not None:
                x = blk.attentions[j](x, ctx, run)
            skips.append(x)
        if blk.sampler is not None:
            x = blk.sampler(x)
            skips.append(x)
        return x

    def _mid(self, x: T, emb: T, ctx: T, run: Run) -> T:
        s = sim()
        mid = self.mid_block
        assert mid.attentions is not None
        x = mid.resnets[0](x, emb)
        x = mid.attentions[0](x, ctx, run)
        with s.checkpoint(x, emb, enabled=run.ckpt):
            x = mid.resnets[1](x, emb)
        return x

    @staticmethod
    def _up(blk: Block, x: T, emb: T, ctx: T, skips: list[T], run: Run) -> T:
        s = sim()
        for j, resnet in enumerate(blk.resnets):
            skip = skips.pop()
            x = ops.cat([x, skip], 1)
            with s.checkpoint(x, emb, enabled=run.ckpt):
                x = resnet(x, emb)
            if blk.attentions is not None:
                x = blk.attentions[j](x, ctx, run)
        if blk.sampler is not None:
            x = blk.sampler(x)
        return x
