"""Where mlx-lm's training step holds its extra logits-shaped memory: the loss built up piece by piece.

What it runs: one gradient evaluation of a loss over bf16 logits (1, s, vocab), on MLX's CPU backend, with
the pieces of mlx-lm 0.31.3's LoRA step (bench/mlx_cpu_step.py) switched on one at a time:
- `--head bf16|q4`: the output layer, a bf16 `nn.Linear` or that layer after `nn.quantize(group_size=64,
  bits=4)` and `set_dtype(bfloat16)` (a `QuantizedLinear`, as mlx_lm.convert leaves Qwen3's lm_head);
- `--norm`: an `nn.RMSNorm` before the head (Qwen3Model's final norm);
- `--embed`: the input comes from a 4-bit `QuantizedEmbedding` of the tokens plus a trainable bf16 (d,)
  offset (the only trainable parameter), instead of a trainable bf16 (1, s, d) hidden state;
- `--loss plain|default`: `cross_entropy(logits, targets).astype(float32).sum() / s`, or
  `mlx_lm.tuner.trainer.default_loss` (the `lengths` mask, `ntoks`, the (loss, ntoks) tuple);
- `--vag`: `nn.value_and_grad(model, loss)` (as mlx-lm) instead of `mx.grad` of a function of the
  trainable array;
- `--compile`: the step compiled as mlx-lm's `train()` compiles it, with an Adam update inside
  (`mx.compile(inputs=state, outputs=state)`); needs `--vag`;
- `--ce nn|manual|no_gather_grad|no_lse_grad`: `nn.losses.cross_entropy`, or its two terms written out
  (`logsumexp(logits) - take_along_axis(logits, targets)`), with `mx.stop_gradient` on the gather term or
  on the logsumexp term, to see which backward branch holds what;
- `--qwen-layers N`: instead of the probe model, bench/mlx_cpu_step.py's model (random 4-bit Qwen3 of
  N layers, LoRA rank 8 everywhere, the first layer checkpointed; `--heads --kv-heads --head-dim
  --intermediate`), so `--qwen-layers 2 --loss default --vag --compile` is that script's step, and
  `--loss-first` can be added to it;
- `--grad-only` (without `--vag`): `mx.grad`, so the loss value is not an output and the forward
  LogSumExp / take_along_axis are not evaluated at all;
- `--loss-first`: `mx.eval` the loss value before the gradient (same graph, two evals), so the forward
  LogSumExp and take_along_axis have run, and let go of the logits, before any backward op runs.
Marginal = peak - active before (bench/mlx_cpu_step.py `open_window`); `--limit 0` makes MLX's eval wait
after every op (mlx/transforms.cpp eval_impl @v0.32.0). Prints one JSON line with the marginal in bytes and
in LG = s * vocab * 2 B (the bf16 logits).

Versions: mlx 0.32.0 (Linux, CPU backend), mlx-lm 0.31.3. Not a project dependency; not imported by the
tests.

Run: python bench/mlx_loss_probe.py --seq-len 512 --hidden 64 --vocab 32768 --head q4 --norm --embed \\
        --loss default --vag --compile --limit 0
"""

from __future__ import annotations

import argparse
import json
import os

from mlx_cpu_step import (  # bench/ is the script's directory (not a package)
    compiled_step,
    open_window,
    qwen_lora_model,
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=32768)
    ap.add_argument("--head", choices=["bf16", "q4"], default="bf16")
    ap.add_argument("--norm", action="store_true")
    ap.add_argument("--embed", action="store_true")
    ap.add_argument("--loss", choices=["plain", "default"], default="plain")
    ap.add_argument("--vag", action="store_true")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument(
        "--qwen-layers",
        type=int,
        default=0,
        help="> 0: instead of the probe model, bench/mlx_cpu_step.py's 4-bit Qwen3 with LoRA on every layer"
        " and the first layer checkpointed (needs --vag; --head/--norm/--embed do not apply)",
    )
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--grad-only", action="store_true", help="mx.grad, not the loss value (no --vag)")
    ap.add_argument("--loss-first", action="store_true", help="eval the loss value, then the gradient")
    ap.add_argument(
        "--ce",
        choices=["nn", "manual", "no_gather_grad", "no_lse_grad"],
        default="nn",
        help="nn.losses.cross_entropy, or its two terms written out (manual), with the gradient of the"
        " take_along_axis term or of the logsumexp term stopped",
    )
    ap.add_argument("--limit", default="0", help="bytes for mx.set_memory_limit, or 'default'")
    a = ap.parse_args()

    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.trainer import default_loss

    s, d, v = a.seq_len, a.hidden, a.vocab
    mx.random.seed(0)

    class Probe(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed_tokens = nn.Embedding(v, d) if a.embed else None
            self.norm = nn.RMSNorm(d) if a.norm else None
            self.lm_head = nn.Linear(d, v, bias=False)

        def __call__(self, inputs):
            h = self.embed_tokens(inputs) + self.offset if a.embed else self.h
            if self.norm is not None:
                h = self.norm(h)
            return self.lm_head(h)

    if a.qwen_layers:
        model = qwen_lora_model(a, a.qwen_layers)
    else:
        model = Probe()
        if a.head == "q4":
            nn.quantize(model, group_size=64, bits=4)
        model.set_dtype(mx.bfloat16)
        model.freeze()
        if a.embed:
            model.offset = mx.zeros((d,), dtype=mx.bfloat16)
        else:
            model.h = (mx.random.normal((1, s, d)) * 0.5).astype(mx.bfloat16)
        model.unfreeze(keys=["offset" if a.embed else "h"], recurse=False)
    mx.eval(model.parameters())

    def cross_entropy(logits, targets, **kw):
        if a.ce == "nn":
            return nn.losses.cross_entropy(logits, targets, **kw)
        score = mx.take_along_axis(logits, mx.expand_dims(targets, -1), -1).squeeze(-1)
        lse = mx.logsumexp(logits, axis=-1)
        if a.ce == "no_gather_grad":
            score = mx.stop_gradient(score)
        if a.ce == "no_lse_grad":
            lse = mx.stop_gradient(lse)
        return lse - score

    def plain_loss(model, batch, lengths):
        logits = model(batch[:, :-1])
        ce = cross_entropy(logits, batch[:, 1:])
        return ce.astype(mx.float32).sum() / s, mx.array(s)

    if a.ce != "nn":  # default_loss calls nn.losses.cross_entropy: route it to the variant
        nn.losses.cross_entropy = cross_entropy
    loss_fn = default_loss if a.loss == "default" else plain_loss
    batch = mx.random.randint(0, v, (1, s + 1))
    lengths = mx.array([[0, s + 1]])
    mx.eval(batch, lengths)
    name = "offset" if a.embed else "h"

    if a.vag:
        vag = nn.value_and_grad(model, loss_fn)

        if a.compile:
            step, state = compiled_step(model, vag)

            def outputs():
                return [*step(batch, lengths), state]
        else:

            def outputs():
                (lvalue, toks), grad = vag(model, batch, lengths)
                return [lvalue, toks, grad]
    else:
        if a.compile or a.qwen_layers:
            raise SystemExit("--compile and --qwen-layers need --vag")

        def of_param(p):
            setattr(model, name, p)
            return loss_fn(model, batch, lengths)[0]

        param = getattr(model, name)

        def outputs():
            if a.grad_only:
                return [mx.grad(of_param)(param)]
            return mx.value_and_grad(of_param)(param)

    first_marginal = None
    before = open_window(mx, a.limit)
    outs = outputs()
    if a.loss_first:
        mx.eval(outs[0])
        first_marginal = int(mx.get_peak_memory()) - before
    mx.eval(outs)
    del outs
    peak = int(mx.get_peak_memory())
    lg = s * v * 2
    out = {
        "seq_len": s,
        "hidden": d,
        "vocab": v,
        "head": "qwen3" if a.qwen_layers else a.head,
        "norm": a.norm or bool(a.qwen_layers),
        "embed": a.embed or bool(a.qwen_layers),
        "loss": a.loss,
        "ce": a.ce,
        "vag": a.vag,
        "compile": a.compile,
        "qwen_layers": a.qwen_layers,
        "limit": a.limit,
        "active_before": before,
        "marginal": peak - before,
        "LG": lg,
        "marginal_over_LG": round((peak - before) / lg, 4),
        "grad_only": a.grad_only,
        "loss_first": a.loss_first,
        "loss_eval_marginal_over_LG": None if first_marginal is None else round(first_marginal / lg, 4),
        "MLX_BFS_MAX_WIDTH": os.environ.get("MLX_BFS_MAX_WIDTH"),
    }
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
