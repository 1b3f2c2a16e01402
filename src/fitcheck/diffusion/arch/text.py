"""Text encoders: transformers ``CLIPTextModel`` (+``WithProjection``) and ``T5EncoderModel``.

Parameter layouts follow transformers 5.x (``modeling_clip.py``, ``modeling_t5.py``): CLIP has
learned token and position embeddings, pre-norm layers with biased q/k/v/out and a two-matrix MLP,
a final LayerNorm, and (with projection) a bias-free ``text_projection``; the T5 v1.1 encoder has
bias-free projections, one relative-position bias table (block 0), RMS-style ``T5LayerNorm``
weights and a gated-GELU MLP (``wi_0``, ``wi_1``, ``wo``).

Their forwards matter for memory only when they run on the device during training: under
``no_grad`` when their outputs are not cached (a transient), or with gradients when they train
(kohya's LoRA on ``CLIPAttention``/``CLIPMLP``; T5 is not trained here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.diffusion.arch.common import Run, attention
from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import Param, T, sim
from fitcheck.diffusion.sim.nn import Embedding, LayerNorm, Linear, Module, Seq


class CLIPAttention(Module):
    kohya = "CLIPAttention"

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (Linear(d, d) for _ in range(4))

    def __call__(self, x: T, run: Run) -> T:
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        out = attention(q, k, v, self.heads, run)
        del q, k, v
        return self.out_proj(out)


class CLIPMLP(Module):
    kohya = "CLIPMLP"

    def __init__(self, d: int, inner: int, quick: bool) -> None:
        super().__init__()
        self.quick = quick
        self.fc1 = Linear(d, inner)
        self.fc2 = Linear(inner, d)

    def __call__(self, x: T) -> T:
        h = self.fc1(x)
        # quick_gelu is ``x * sigmoid(1.702 * x)``; gelu is one op keeping its input
        h = ops.mul(h, ops.sigmoid(ops.scale(h))) if self.quick else ops.gelu(h)
        return self.fc2(h)


class CLIPLayer(Module):
    def __init__(self, d: int, heads: int, inner: int, quick: bool) -> None:
        super().__init__()
        self.layer_norm1 = LayerNorm(d)
        self.self_attn = CLIPAttention(d, heads)
        self.layer_norm2 = LayerNorm(d)
        self.mlp = CLIPMLP(d, inner, quick)

    def __call__(self, hidden_states: T, run: Run) -> T:
        residual = hidden_states
        hidden_states = self.layer_norm1(hidden_states)
        hidden_states = self.self_attn(hidden_states, run)
        hidden_states = ops.add(residual, hidden_states)
        residual = hidden_states
        hidden_states = self.layer_norm2(hidden_states)
        hidden_states = self.mlp(hidden_states)
        return ops.add(residual, hidden_states)


class CLIPTextModel(Module):
    """``CLIPTextModel`` or ``CLIPTextModelWithProjection`` from a ``clip_text_model`` config."""

    def __init__(self, cfg: Mapping[str, Any], projection: bool) -> None:
        super().__init__()
        d = int(cfg.get("hidden_size", 512))
        self.d = d
        self.max_len = int(cfg.get("max_position_embeddings", 77))
        self.token_embedding = Embedding(int(cfg.get("vocab_size", 49408)), d)
        self.position_embedding = Embedding(self.max_len, d)
        quick = cfg.get("hidden_act", "quick_gelu") == "quick_gelu"
        heads, inner = int(cfg.get("num_attention_heads", 8)), int(cfg.get("intermediate_size", 2048))
        self.layers = Seq(
            [CLIPLayer(d, heads, inner, quick) for _ in range(int(cfg.get("num_hidden_layers", 12)))]
        )
        self.final_layer_norm = LayerNorm(d)
        self.text_projection = (
            Linear(d, int(cfg.get("projection_dim", 512)), bias=False) if projection else None
        )

    def encode(self, batch: int, run: Run, dtype: str) -> T:
        """Token ids in, hidden states out (every layer's output kept, as ``output_hidden_states``)."""
        s = sim()
        h = s.new((batch, self.max_len, self.d), dtype)
        states = [h]
        for layer in self.layers:
            with s.checkpoint(h, enabled=run.ckpt):
                h = layer(h, run)
            states.append(h)
        out = self.final_layer_norm(h)
        if self.text_projection is not None:
            self.text_projection(out)
        return states[-2]


class T5Block(Module):
    def __init__(self, d: int, heads: int, d_kv: int, d_ff: int, rel: int) -> None:
        super().__init__()
        inner = heads * d_kv
        self.heads = heads
        self.q, self.k, self.v = (Linear(d, inner, bias=False) for _ in range(3))
        self.o = Linear(inner, d, bias=False)
        self.relative_attention_bias = Embedding(rel, heads) if rel else None
        self.ln0 = Param((d,), "norm")
        self.wi_0 = Linear(d, d_ff, bias=False)
        self.wi_1 = Linear(d, d_ff, bias=False)
        self.wo = Linear(d_ff, d, bias=False)
        self.ln1 = Param((d,), "norm")

    def __call__(self, h: T, run: Run) -> T:
        # T5LayerNorm is computed in fp32 (variance) and scaled by its weight.
        n = ops.to(h, "fp32")
        a = attention(self.q(n), self.k(n), self.v(n), self.heads, Run("eager", run.ckpt))
        h = ops.add(h, self.o(a))
        del a, n
        n = ops.to(h, "fp32")
        g = ops.gelu(self.wi_0(n))
        h = ops.add(h, self.wo(ops.mul(g, self.wi_1(n))))
        return h


class T5EncoderModel(Module):
    """The T5 v1.1 encoder stack (FLUX.1 and SD3 ``text_encoder_2``/``text_encoder_3``)."""

    def __init__(self, cfg: Mapping[str, Any], max_len: int = 512) -> None:
        super().__init__()
        d = int(cfg.get("d_model", 512))
        self.d, self.max_len = d, max_len
        self.shared = Embedding(int(cfg.get("vocab_size", 32128)), d)
        heads, d_kv, d_ff = int(cfg.get("num_heads", 8)), int(cfg.get("d_kv", 64)), int(cfg.get("d_ff", 2048))
        rel = int(cfg.get("relative_attention_num_buckets", 32))
        self.block = Seq(
            [
                T5Block(d, heads, d_kv, d_ff, rel if i == 0 else 0)
                for i in range(int(cfg.get("num_layers", 6)))
            ]
        )
        self.final_layer_norm = Param((d,), "norm")

    def encode(self, batch: int, run: Run, dtype: str) -> T:
        s = sim()
        h = s.new((batch, self.max_len, self.d), dtype)
        for blk in self.block:
            h = blk(h, run)
        return ops.to(h, dtype)
