"""diffusers ``AutoencoderKL``: encoder, decoder, the 1x1 quant convs, and the encoder's forward.

Only the encoder runs in a training step (images to latents, under ``no_grad``) and only when the
latents are not cached; its transient at full image resolution is what ``--cache-latents`` saves
besides the VAE weights. The decoder exists for the parameter count.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.diffusion.arch.common import Run, attention
from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import T, sim
from fitcheck.diffusion.sim.nn import Conv2d, GroupNorm, Linear, Module, Seq


class VAEResnet(Module):
    """``ResnetBlock2D`` without a time embedding."""

    def __init__(self, c_in: int, c_out: int, groups: int) -> None:
        super().__init__()
        self.norm1 = GroupNorm(groups, c_in)
        self.conv1 = Conv2d(c_in, c_out, 3, padding=1)
        self.norm2 = GroupNorm(groups, c_out)
        self.conv2 = Conv2d(c_out, c_out, 3, padding=1)
        self.conv_shortcut = Conv2d(c_in, c_out, 1) if c_in != c_out else None

    def __call__(self, x: T) -> T:
        h = self.conv1(ops.silu(self.norm1(x)))
        h = self.conv2(ops.silu(self.norm2(h)))
        if self.conv_shortcut is not None:
            x = self.conv_shortcut(x)
        return ops.scale(ops.add(x, h))


class VAEAttention(Module):
    """The mid block's single-head ``Attention`` with its own GroupNorm and biased projections."""

    def __init__(self, c: int, groups: int) -> None:
        super().__init__()
        self.group_norm = GroupNorm(groups, c)
        self.to_q, self.to_k, self.to_v = (Linear(c, c) for _ in range(3))
        self.to_out = Seq([Linear(c, c)])

    def __call__(self, x: T, run: Run) -> T:
        b, c, h, w = x.shape
        y = ops.contiguous(self.group_norm(x), (b, h * w, c))
        out = attention(self.to_q(y), self.to_k(y), self.to_v(y), 1, run)
        out = ops.contiguous(self.to_out[0](out), (b, c, h, w))
        return ops.scale(ops.add(out, x))


class Mid(Module):
    def __init__(self, c: int, groups: int, attn: bool) -> None:
        super().__init__()
        self.resnets = Seq([VAEResnet(c, c, groups), VAEResnet(c, c, groups)])
        self.attentions = Seq([VAEAttention(c, groups)]) if attn else None

    def __call__(self, x: T, run: Run) -> T:
        x = self.resnets[0](x)
        if self.attentions is not None:
            x = self.attentions[0](x, run)
        return self.resnets[1](x)


class AutoencoderKL(Module):
    def __init__(self, cfg: Mapping[str, Any]) -> None:
        super().__init__()
        boc = list(cfg.get("block_out_channels", [64]))
        groups = int(cfg.get("norm_num_groups", 32))
        layers = int(cfg.get("layers_per_block", 1))
        lat = int(cfg.get("latent_channels", 4))
        attn = bool(cfg.get("mid_block_add_attention", True))
        self.in_channels = int(cfg.get("in_channels", 3))
        self.latent_channels = lat
        self.factor = 2 ** (len(boc) - 1)
        # encoder
        self.enc_conv_in = Conv2d(self.in_channels, boc[0], 3, padding=1)
        downs: list[Module] = []
        c = boc[0]
        for i, out in enumerate(boc):
            blk = Module()
            blk.resnets = Seq([VAEResnet(c if j == 0 else out, out, groups) for j in range(layers)])  # type: ignore[attr-defined]
            c = out
            blk.down = Conv2d(out, out, 3, stride=2) if i < len(boc) - 1 else None  # type: ignore[attr-defined]
            downs.append(blk)
        self.enc_down = Seq(downs)
        self.enc_mid = Mid(boc[-1], groups, attn)
        self.enc_norm_out = GroupNorm(groups, boc[-1])
        self.enc_conv_out = Conv2d(boc[-1], 2 * lat, 3, padding=1)
        self.quant_conv = Conv2d(2 * lat, 2 * lat, 1) if cfg.get("use_quant_conv", True) else None
        self.post_quant_conv = Conv2d(lat, lat, 1) if cfg.get("use_post_quant_conv", True) else None
        # decoder
        rb = list(reversed(boc))
        self.dec_conv_in = Conv2d(lat, rb[0], 3, padding=1)
        self.dec_mid = Mid(rb[0], groups, attn)
        ups: list[Module] = []
        c = rb[0]
        for i, out in enumerate(rb):
            blk = Module()
            blk.resnets = Seq([VAEResnet(c if j == 0 else out, out, groups) for j in range(layers + 1)])  # type: ignore[attr-defined]
            c = out
            blk.up = Conv2d(out, out, 3, padding=1) if i < len(rb) - 1 else None  # type: ignore[attr-defined]
            ups.append(blk)
        self.dec_up = Seq(ups)
        self.dec_norm_out = GroupNorm(groups, boc[0])
        self.dec_conv_out = Conv2d(boc[0], int(cfg.get("out_channels", 3)), 3, padding=1)

    def encode(self, batch: int, size: tuple[int, int], dtype: str, run: Run) -> T:
        """Images to latents (the mean is taken; kohya samples, which adds one latent-sized tensor)."""
        s = sim()
        x = s.new((batch, self.in_channels, *size), dtype)
        x = self.enc_conv_in(x)
        for blk in self.enc_down:
            for r in blk.resnets:
                x = r(x)
            if blk.down is not None:
                b, c, h, w = x.shape
                x = blk.down(ops.contiguous(x, (b, c, h + 1, w + 1)))  # F.pad(0, 1, 0, 1), then stride 2
        x = self.enc_mid(x, run)
        x = self.enc_conv_out(ops.silu(self.enc_norm_out(x)))
        if self.quant_conv is not None:
            x = self.quant_conv(x)
        mean, _ = ops.chunk(x, 2, 1)
        return ops.contiguous(mean)
