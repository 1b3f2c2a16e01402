"""Isolated causal `mx.fast.scaled_dot_product_attention` forward+backward peak on MLX (CPU proxy).

What it runs: the single-op experiment of IonDen/mlx-train-perf docs/papers/when-the-bottleneck-moved.md
section 2 (@ea3b035; its driver was not published): bf16 q, k, v of shape (1, heads, n, head_dim)
materialized, the cache cleared, the peak counter reset, then (a) the forward alone and (b)
`mx.value_and_grad(lambda q, k, v: sdpa(q, k, v, causal).sum(), argnums=(0, 1, 2))`, each with its own
reset/eval boundary, as scripts/bench_attention_op.py measure_condition does for its own arms (one
unmeasured warm-up call of each first). Under grad tracing MLX runs the unfused fallback (mlx/fast.cpp
@v0.32.0: bf16 scores matmul, `where` with a bool causal mask, softmax(precise=True), matmul with v) and
differentiates it op by op.

Printed per condition (one JSON line, one subprocess per condition so the allocator starts clean):
absolute peak (`mx.get_peak_memory()`, which includes the live q, k, v) and marginal peak (minus
`mx.get_active_memory()` before the window), in bytes and in units of U = heads * n^2 * 2 B (one bf16
score tensor).

Versions: written against mlx 0.32.0 (Linux, CPU backend, `pip install mlx[cpu]==0.32.0`); no mlx-lm needed.
Not a project dependency and not imported by the tests.

Run: python bench/mlx_sdpa_op.py --seq-lens 1024 2048 4096 --heads 8 --head-dim 128 --limit 0 default
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys

from mlx_cpu_step import open_window  # bench/ is the script's directory (not a package)


def measure(n: int, heads: int, kv_heads: int, head_dim: int, limit: str) -> dict[str, object]:
    import mlx.core as mx

    mx.random.seed(0)
    q = mx.random.normal((1, heads, n, head_dim)).astype(mx.bfloat16)
    k = mx.random.normal((1, kv_heads, n, head_dim)).astype(mx.bfloat16)
    v = mx.random.normal((1, kv_heads, n, head_dim)).astype(mx.bfloat16)
    mx.eval(q, k, v)
    scale = 1.0 / math.sqrt(head_dim)

    def attn(q_, k_, v_):
        return mx.fast.scaled_dot_product_attention(q_, k_, v_, scale=scale, mask="causal")

    def loss(q_, k_, v_):
        return attn(q_, k_, v_).sum()

    vag = mx.value_and_grad(loss, argnums=(0, 1, 2))
    # warm both passes outside the windows (as bench_attention_op.py does), then drop the results
    mx.eval(attn(q, k, v))
    val, grads = vag(q, k, v)
    mx.eval(val, *grads)
    del val, grads

    before_fwd = open_window(mx, limit)
    o = attn(q, k, v)
    mx.eval(o)
    fwd_peak = mx.get_peak_memory()
    del o

    before = open_window(mx, limit)
    val, grads = vag(q, k, v)
    mx.eval(val, *grads)
    peak = mx.get_peak_memory()
    u = heads * n * n * 2
    return {
        "n": n,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "limit": limit,
        "qkv_bytes": q.nbytes + k.nbytes + v.nbytes,
        "fwd_peak_abs": fwd_peak,
        "fwd_peak_marginal": fwd_peak - before_fwd,
        "fwdbwd_peak_abs": peak,
        "fwdbwd_peak_marginal": peak - before,
        "U": u,
        "fwdbwd_marginal_over_U": round((peak - before) / u, 4),
        "fwdbwd_abs_over_U": round(peak / u, 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-lens", nargs="+", type=int, default=[1024, 2048])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=None, help="defaults to --heads")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--limit", nargs="+", default=["0", "default"], help="bytes, or 'default'")
    ap.add_argument("--single", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    kv = a.kv_heads or a.heads
    if a.single:
        print(json.dumps(measure(a.seq_lens[0], a.heads, kv, a.head_dim, a.limit[0])), flush=True)
        return
    for n in a.seq_lens:
        for lim in a.limit:
            cmd = [sys.executable, __file__, "--single", "--seq-lens", str(n), "--heads", str(a.heads)]
            cmd += ["--kv-heads", str(kv), "--head-dim", str(a.head_dim), "--limit", lim]
            r = subprocess.run(cmd, capture_output=True, text=True, check=False)
            print(r.stdout.strip() or f"# n={n} limit={lim} failed: {r.stderr[-500:]}", flush=True)


if __name__ == "__main__":
    main()
