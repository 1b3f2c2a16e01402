"""A stack of N checkpointed causal-attention blocks: does MLX hold every block's recompute at once?

What it runs: x (1, s, d) bf16 through N blocks `x + sdpa(x Wq, x Wk, x Wv, causal) Wo` (bf16 weights,
`mx.fast.scaled_dot_product_attention`, which runs unfused under grad tracing: mlx/fast.cpp @v0.32.0),
each wrapped in `mx.checkpoint` (as mlx_lm.tuner.trainer.grad_checkpoint wraps a decoder layer) or not
(`--no-ckpt`), optionally followed by a bf16 output layer and `nn.losses.cross_entropy` as mlx_lm's
default_loss (`--vocab V`); then `mx.eval(mx.grad(loss)(weights, x))`, optionally under `mx.compile`
(`--compile`): no model, no quantization, so it runs in seconds. Prints the marginal peak
(`mx.get_peak_memory()` minus active memory before) in bytes and in U = heads * s^2 * 2 B.

Why: `mx.checkpoint`'s VJP recomputes from `depends(primals, outputs)` (mlx/transforms.cpp @v0.32.0
`checkpoint`), not from the cotangent, and eval_impl orders the tape breadth-first with a width limit
(`MLX_BFS_MAX_WIDTH`, default 20, mlx/utils.h), so a block's recompute may run before the backward reaches
that block. Compare N = 1..4, `--limit 0` vs default, and `MLX_BFS_MAX_WIDTH=1` vs the default.

Versions: mlx 0.32.0 (Linux CPU backend). Not a project dependency; not imported by the tests.

Run: for n in 1 2 3 4; do python bench/mlx_ckpt_stack.py --seq-len 1024 --blocks $n --limit 0; done
"""

from __future__ import annotations

import argparse
import json
import math
import os

from mlx_cpu_step import open_window, shape_args  # bench/ is the script's directory (not a package)


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap, "0")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=0, help="> 0: a bf16 output layer and cross_entropy")
    ap.add_argument("--compile", action="store_true", help="mx.compile the gradient function")
    a = ap.parse_args()

    import mlx.core as mx
    import mlx.nn as nn

    s, h, dh, d = a.seq_len, a.heads, a.head_dim, a.hidden
    mx.random.seed(0)
    x = (mx.random.normal((1, s, d)) * 0.1).astype(mx.bfloat16)

    def w(shape):
        return (mx.random.normal(shape) * 0.05).astype(mx.bfloat16)

    weights = [[w((d, h * dh)), w((d, h * dh)), w((d, h * dh)), w((h * dh, d))] for _ in range(a.blocks)]
    head = w((d, a.vocab)) if a.vocab else None
    targets = mx.random.randint(0, max(a.vocab, 1), (1, s))
    mx.eval(x, weights, head, targets) if head is not None else mx.eval(x, weights)

    def block(wb, x):
        q, k, v = [(x @ m).reshape(1, s, h, dh).transpose(0, 2, 1, 3) for m in wb[:3]]
        o = mx.fast.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(dh), mask="causal")
        return x + o.transpose(0, 2, 1, 3).reshape(1, s, h * dh) @ wb[3]

    def loss(weights, x):
        for wb in weights:
            x = block(wb, x) if a.no_ckpt else mx.checkpoint(block)(wb, x)
        if head is None:
            return x.astype(mx.float32).sum()
        ce = nn.losses.cross_entropy(x @ head, targets)  # as mlx_lm default_loss: on bf16 logits
        return ce.astype(mx.float32).sum() / s

    grad = mx.compile(mx.grad(loss)) if a.compile else mx.grad(loss)
    before = open_window(mx, a.limit)
    mx.eval(grad(weights, x))
    peak = mx.get_peak_memory()
    u = h * s * s * 2
    out = {
        "seq_len": s,
        "heads": h,
        "head_dim": dh,
        "hidden": d,
        "blocks": a.blocks,
        "vocab": a.vocab,
        "logits_bf16": s * a.vocab * 2,
        "limit": a.limit,
        "ckpt": not a.no_ckpt,
        "compile": a.compile,
        "MLX_BFS_MAX_WIDTH": os.environ.get("MLX_BFS_MAX_WIDTH"),
        "marginal": peak - before,
        "U": u,
        "marginal_over_U": round((peak - before) / u, 4),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
