"""Per-architecture check of the engine against the traced training step (`fitcheck measure`'s fake
device): every decoder family of tests/test_architectures.py, widened to h=1024, 4 layers, 16 heads,
vocabulary 32,000, batch 2 x 512 tokens, bf16, under LoRA and full fine-tuning.

    PYTHONPATH=src python bench/arch_trace.py [types,...] [--method lora|full] [--lora-targets attn]
        [--attn eager] [--grad-ckpt] [--dora]

Prints estimate, traced peak and error for the forward and backward phases (docs/methodology.md,
"Architectures", quotes a run).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

WIDE = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 16, "num_key_value_heads": 4,
        "intermediate_size": 2816, "vocab_size": 32000}  # fmt: skip


def widen(model_type: str, cfg: dict[str, Any]) -> dict[str, Any]:
    c = {k: (WIDE.get(k, v)) for k, v in cfg.items()}
    if "n_embd" in c:
        c.update(n_embd=1024, n_layer=4, n_head=16, vocab_size=32000)
    if model_type == "opt":
        # a learned position table long enough for the traced 512 tokens (measure refuses a longer sequence)
        c.update(word_embed_proj_dim=1024, ffn_dim=2816, max_position_embeddings=2048)
    if isinstance(c.get("moe_topk"), list):  # Hunyuan's per-layer top-k follows the widened depth
        c.update(moe_topk=[c["moe_topk"][0]] * WIDE["num_hidden_layers"])
    if model_type == "helium" or "head_dim" in c:
        c.update(head_dim=64)  # hidden / heads (transformers' HeliumAttention sizes o_proj from hidden_size)
    if model_type == "mpt":
        c.update(d_model=1024, n_layers=4, n_heads=16, vocab_size=32000)
    if model_type in ("deepseek_v2", "deepseek_v3"):
        c.update(num_attention_heads=8, num_key_value_heads=8, kv_lora_rank=512, qk_nope_head_dim=128,
                 qk_rope_head_dim=64, v_head_dim=128, moe_intermediate_size=512,
                 q_lora_rank=None if model_type == "deepseek_v2" else 1536)  # fmt: skip
    return {"model_type": model_type, **{k: v for k, v in c.items() if v is not None or k == "q_lora_rank"}}


def main() -> None:
    from fitcheck.engine.estimate import estimate
    from fitcheck.measure.trace import trace_step
    from fitcheck.models import LlmSetup
    from fitcheck.sources.resolve import spec_from_config
    from test_architectures import CASES

    ap = argparse.ArgumentParser()
    ap.add_argument("types", nargs="?", default="")
    ap.add_argument("--method", default="lora")
    # phimoe: peft 0.21 wraps PhimoeTopKRouter (an nn.Linear whose forward returns a tuple) under
    # all-linear and the LoRA forward fails; trace it with --lora-targets attn
    ap.add_argument("--lora-targets", default="all-linear")
    # the sweeps session 13 ran beside the default one (docs/methodology.md, "Architectures")
    ap.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    ap.add_argument("--grad-ckpt", action="store_true")
    ap.add_argument("--dora", action="store_true")
    args = ap.parse_args()
    types = (
        args.types.split(",")
        if args.types
        else [t for t, (task, _) in sorted(CASES.items()) if task == "causal"]
    )
    setup = LlmSetup(
        method=args.method,
        seq_len=512,
        batch_size=2,
        lora_targets=args.lora_targets,
        attn=args.attn,
        grad_ckpt=args.grad_ckpt,
        dora=args.dora,
    )
    print("| model_type | method | forward est / traced MiB | error | backward est / traced MiB | error |")
    for t in types:
        cfg = widen(t, CASES[t][1])
        try:
            est = estimate(spec_from_config(dict(cfg), id=t, name=t, source="bench"), setup)
            traced = {p.name: p.peak_bytes for p in trace_step(dict(cfg), setup, steps=2).phases}
        except Exception as exc:  # a family the tracer cannot build at this shape
            print(f"| {t} | {args.method} | {type(exc).__name__}: {str(exc)[:80]} | | | |", flush=True)
            continue
        cells = []
        for ph in ("forward", "backward"):
            e, m = est.phase(ph).total_bytes, traced[ph]
            cells += [f"{e / 2**20:.0f} / {m / 2**20:.0f}", f"{100 * (e - m) / m:+.1f}%"]
        print(f"| {t} | {args.method} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    warnings.filterwarnings("ignore")
    main()
