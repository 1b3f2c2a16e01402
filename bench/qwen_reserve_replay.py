"""Replay Qwen-1-shaped LoRA steps through the caching allocator's model: what the code reserves.

The Qwen finetune profile's single-GPU LoRA rows (tests/data/published/qwen-finetune-profiling.yaml, exact
lengths) measure 0.9-1.8 GiB over the engine's allocated peak. This script traces each named row's step on
fake tensors (fitcheck.measure.trace, three steps from an empty cache: weights, adapters, optimizer states,
activations and temporaries in the order they are made) and replays the last tracker's allocations and frees
through bench/swift_loss.py's model of PyTorch's CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp at
001074d: 512 B rounding, 2 MiB small and 20 MiB large segments, 2 MiB rounding of larger ones, best fit,
splits, merges; one stream, no release), as bench/reserve_evidence.py part 3 does for other records.

Qwen-1's own model (``model_type: qwen``) is remote code the tracer cannot build, so each row is traced as
transformers' ``qwen2`` with Qwen-1's shapes (hidden, layers, heads, vocabulary, MLP width = Qwen-1's
``intermediate_size / 2``, separate q/k/v in place of the fused ``c_attn``), LoRA on every linear (PEFT
matches the row's ``c_attn,c_proj,w1,w2`` by suffix, so ``c_proj`` covers the attention and the MLP output),
SDPA for flash-attn 2 and this torch's own foreach AdamW step. Nothing here sets a constant: it prints the
traced allocated peak, the replayed reserve, the measured figure and the engine's figures side by side
(docs/methodology.md, "The exact per-tensor rounding, tried and not kept").

    PYTHONPATH=src python bench/qwen_reserve_replay.py                 # the default rows, ~3 min
    PYTHONPATH=src python bench/qwen_reserve_replay.py qwen-7b-lora-s256
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

import published as pub  # noqa: E402  (bench/ is not a package)

from fitcheck.units import GIB  # noqa: E402

SOURCE = "qwen-finetune-profiling"
ROWS = (
    "qwen-1.8b-lora-s256",
    "qwen-1.8b-lora-s1024",
    "qwen-7b-lora-s256",
    "qwen-14b-lora-s256",
    "qwen-14b-lora-s1024",
)
CONFIGS = ROOT / "tests" / "data" / "published" / "configs" / "Qwen"


def qwen2_shaped(q: dict[str, Any]) -> dict[str, Any]:
    """A transformers ``qwen2`` config with a Qwen-1 config's shapes (1.8B names its fields as Llama does,
    7B and 14B as GPT-2: ``n_embd``, ``n_layer``, ``n_head``, ``ffn_hidden_size``)."""
    hidden = q.get("hidden_size", q.get("n_embd"))
    heads = q.get("num_attention_heads", q.get("n_head"))
    return {
        "model_type": "qwen2",
        "hidden_size": hidden,
        "intermediate_size": q.get("intermediate_size", q.get("ffn_hidden_size")) // 2,
        "num_hidden_layers": q.get("num_hidden_layers", q.get("n_layer")),
        "num_attention_heads": heads,
        "num_key_value_heads": heads,
        "vocab_size": q.get("padded_vocab_size", q["vocab_size"]),
        "max_position_embeddings": 8192,
        "tie_word_embeddings": False,
        "rms_norm_eps": q["layer_norm_epsilon"],
        "torch_dtype": "bfloat16",
    }


def replay(row: str) -> tuple[int, int, Any]:
    """(traced peak allocated, replayed peak reserved, the engine's score) of one row."""
    import reserve_evidence

    rec = next(r for r in pub.corpus()[SOURCE][1] if r.id == row)
    posed = pub.pose(rec)
    assert not isinstance(posed, str), posed
    _, setup, _ = posed
    size = row.split("-")[1].upper().replace(".", "_")
    cfg = qwen2_shaped(json.loads((CONFIGS / f"Qwen-{size}-Chat" / "config.json").read_text()))
    setup = setup.model_copy(
        update={"lora_targets": "all-linear", "attn": "sdpa", "optimizer_impl": "foreach"}
    )
    alloc = reserve_evidence.traced_replay(cfg, setup)
    return alloc.peak_allocated, alloc.peak_reserved, pub.score(rec)


def main() -> None:
    rows = sys.argv[1:] or list(ROWS)
    print(
        "| row | measured | traced allocated | replayed reserve | measured - traced "
        "| engine allocated | engine reserve |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for row in rows:
        allocated, reserved, score = replay(row)
        est = score.estimate
        measured = score.estimate_bytes / (1 + score.error)
        print(
            f"| {row} | {measured / GIB:.2f} | {allocated / GIB:.2f} | {(reserved - allocated) / GIB:.2f} "
            f"| {(measured - allocated) / GIB:.2f} | {est.peak_allocated_bytes / GIB:.2f} "
            f"| {est.allocator_reserve_bytes / GIB:.2f} |"
        )


if __name__ == "__main__":
    main()
