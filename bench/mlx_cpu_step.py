"""mlx-lm's compiled LoRA train step on a small random Qwen3, peak memory on MLX's CPU backend.

What it runs: the stock arm of IonDen/mlx-train-perf's train-step bench (bench/worker.py `run_train_step`
@ea3b035) on a randomly initialised `mlx_lm.models.qwen3.Model` of the given shape instead of
mlx-community/Qwen3-8B-4bit: `nn.quantize(model, group_size=64, bits=4)` (every Linear and the embedding,
as mlx_lm.convert does), `model.set_dtype(bfloat16)`, `model.freeze()`,
`linear_to_lora_layers(model, -1, {"rank": 8, "dropout": 0.0, "scale": 20.0})`,
`mlx_lm.tuner.trainer.grad_checkpoint(model.layers[0])`, Adam, and the step compiled as mlx-lm 0.31.3's
`train()` compiles it (value_and_grad of `default_loss` + optimizer.update under
`mx.compile(inputs=state, outputs=state)`), on one row of seq_len + 1 random tokens (every token in the
loss), `--steps` steps (default 2, as the paper's probes), the cache cleared after each.

Measured as the benchmark does: `active_before = mx.get_active_memory()`, `mx.reset_peak_memory()`, the
steps, then marginal = `mx.get_peak_memory() - active_before` (bytes). `--limit` sets
`mx.set_memory_limit` before the window: 0 makes MLX's eval wait for the running task after every op
(mlx/transforms.cpp eval_impl @v0.32.0), "default" leaves MLX's default. One JSON line is printed with the
shape, U = heads * seq^2 * 2 B (one bf16 score tensor) and the logits size seq * vocab * 2 B.
The MLX_BFS_MAX_WIDTH environment variable (MLX's tape width, default 20) is recorded.
`--no-quant` leaves the weights unquantized and `--dtype float32` casts the model to fp32 instead of bf16
(both recorded): unquantized bf16 runs far faster on the CPU backend and holds the 4-bit step's marginal to
32 B at 1 and 2 layers, but its graph differs (at 4 layers 181,815,384 B against 169,232,504), so it is a
proxy of the proxy; fp32 drops the adapters' casts and is another graph again.
`--config-dir DIR` also writes an HF-style Qwen3 config.json of the same shape there (for
`fitcheck estimate DIR --method qlora --trainer mlx ...`) and exits without running MLX.

Versions: mlx 0.32.0 (Linux, CPU backend: `pip install "mlx[cpu]==0.32.0" mlx-lm==0.31.3`), mlx-lm 0.31.3.
The CPU backend's bf16 quantized matmul is slow (about 0.15-0.2 GMAC/s on one core), so keep hidden and
vocab small; 2,048 tokens at hidden 256 takes a few minutes. Not a project dependency; not imported by the
tests.

Run: python bench/mlx_cpu_step.py --seq-len 2048 --heads 8 --kv-heads 2 --head-dim 64 --hidden 256 \\
        --intermediate 768 --layers 2 --vocab 512 --limit 0
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path
from types import ModuleType


def hf_config(a: argparse.Namespace) -> dict[str, object]:
    return {
        "model_type": "qwen3",
        "architectures": ["Qwen3ForCausalLM"],
        "hidden_size": a.hidden,
        "intermediate_size": a.intermediate,
        "num_hidden_layers": a.layers,
        "num_attention_heads": a.heads,
        "num_key_value_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "vocab_size": a.vocab,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }


def qwen_lora_model(a: argparse.Namespace, layers: int, checkpoint: bool = True):  # an mlx_lm Model
    """A random Qwen3 of the given shape as mlx-train-perf's stock arm trains it: 4-bit (group 64, as
    mlx_lm.convert), floating params cast to bf16, frozen, LoRA rank 8 (scale 20) on every block linear, and
    `grad_checkpoint(model.layers[0])` (every layer checkpointed) unless `checkpoint` is false."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import qwen3
    from mlx_lm.tuner.trainer import grad_checkpoint
    from mlx_lm.tuner.utils import linear_to_lora_layers

    args = qwen3.ModelArgs(
        model_type="qwen3",
        hidden_size=a.hidden,
        num_hidden_layers=layers,
        intermediate_size=a.intermediate,
        num_attention_heads=a.heads,
        rms_norm_eps=1e-6,
        vocab_size=a.vocab,
        num_key_value_heads=a.kv_heads,
        max_position_embeddings=32768,
        rope_theta=1e6,
        head_dim=a.head_dim,
        tie_word_embeddings=False,
    )
    mx.random.seed(0)
    model = qwen3.Model(args)
    if not getattr(a, "no_quant", False):
        nn.quantize(model, group_size=64, bits=4)
    model.set_dtype(getattr(mx, getattr(a, "dtype", "bfloat16")))
    model.freeze()
    linear_to_lora_layers(model, -1, {"rank": 8, "dropout": 0.0, "scale": 20.0})
    if checkpoint:
        grad_checkpoint(model.layers[0])
    return model


def compiled_step(model, vag):
    """mlx-lm 0.31.3 `train()`'s step: the value and gradient of the loss and an Adam update, compiled with
    the model's, the optimizer's and the random state as inputs and outputs; returns (step, state)."""
    import mlx.core as mx
    import mlx.optimizers as optim

    opt = optim.Adam(learning_rate=1e-5)
    state = [model.state, opt.state, mx.random.state]

    @partial(mx.compile, inputs=state, outputs=state)
    def step(batch, lengths):
        (lvalue, toks), grad = vag(model, batch, lengths)
        opt.update(model, grad)
        return lvalue, toks

    return step, state


def run(a: argparse.Namespace) -> dict[str, object]:
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.tuner.trainer import default_loss

    model = qwen_lora_model(a, a.layers, checkpoint=not a.no_ckpt)
    mx.eval(model.parameters())
    step, state = compiled_step(model, nn.value_and_grad(model, default_loss))
    s = a.seq_len
    batch = mx.random.randint(0, a.vocab, (1, s + 1))
    lengths = mx.array([[0, s + 1]])
    mx.eval(batch, lengths)
    before = open_window(mx, a.limit)
    t0 = time.time()
    peaks = []
    for _ in range(a.steps):
        lv, toks = step(batch, lengths)
        mx.eval(lv, toks, state)
        mx.clear_cache()
        peaks.append(mx.get_peak_memory() - before)
    peak = mx.get_peak_memory()
    u = a.heads * s * s * 2
    logits = s * a.vocab * 2
    return {
        "seq_len": s,
        "heads": a.heads,
        "kv_heads": a.kv_heads,
        "head_dim": a.head_dim,
        "hidden": a.hidden,
        "intermediate": a.intermediate,
        "layers": a.layers,
        "vocab": a.vocab,
        "limit": a.limit,
        "grad_ckpt": not a.no_ckpt,
        "dtype": a.dtype,
        "quantized": not a.no_quant,
        "steps": a.steps,
        "active_before": before,
        "peak": peak,
        "marginal": peak - before,
        "marginal_after_each_step": peaks,
        "U": u,
        "logits_bf16": logits,
        "marginal_over_U": round((peak - before) / u, 4),
        "marginal_over_logits": round((peak - before) / logits, 4),
        "wall_s": round(time.time() - t0, 1),
        "MLX_BFS_MAX_WIDTH": os.environ.get("MLX_BFS_MAX_WIDTH"),
    }


def shape_args(ap: argparse.ArgumentParser, limit: str) -> None:
    """The options every MLX probe here shares: the attention shape, the memory limit, checkpointing."""
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--limit", default=limit, help="bytes for mx.set_memory_limit, or 'default'")
    ap.add_argument("--no-ckpt", action="store_true", help="no gradient checkpointing")


def open_window(mx: ModuleType, limit: str) -> int:
    """Set the memory limit (`limit` bytes, or MLX's default), empty the cache, reset the peak counter and
    return the active bytes the window starts from (the benchmark's ``active_before``)."""
    if limit != "default":
        mx.set_memory_limit(int(limit))
    mx.synchronize()
    mx.clear_cache()
    before = int(mx.get_active_memory())
    mx.reset_peak_memory()
    return before


def main() -> None:
    ap = argparse.ArgumentParser()
    shape_args(ap, "default")
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--intermediate", type=int, default=768)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"], help="model.set_dtype")
    ap.add_argument("--no-quant", action="store_true", help="leave the weights unquantized (a fast proxy)")
    ap.add_argument("--config-dir", type=Path, default=None, help="write config.json here and exit")
    a = ap.parse_args()
    if a.config_dir is not None:
        a.config_dir.mkdir(parents=True, exist_ok=True)
        (a.config_dir / "config.json").write_text(json.dumps(hf_config(a), indent=2) + "\n")
        return
    print(json.dumps(run(a)), flush=True)


if __name__ == "__main__":
    main()
