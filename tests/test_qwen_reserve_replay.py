"""bench/qwen_reserve_replay.py: Qwen-1's configs read as qwen2 shapes (the trace itself takes minutes)."""

from __future__ import annotations

import json

from bench_helpers import bench_module


def _shape(size: str) -> dict[str, object]:
    mod = bench_module("qwen_reserve_replay")
    cfg = json.loads((mod.CONFIGS / f"Qwen-{size}-Chat" / "config.json").read_text())
    return mod.qwen2_shaped(cfg)  # type: ignore[no-any-return]


def test_llama_style_fields_and_half_the_mlp_width() -> None:
    # Qwen-1.8B: intermediate_size 11008 is w1 and w2 together, each 5504 wide (Qwen-1's QWenMLP)
    s = _shape("1_8B")
    assert (s["hidden_size"], s["num_hidden_layers"], s["intermediate_size"]) == (2048, 24, 5504)
    assert s["vocab_size"] == 151936 and s["num_key_value_heads"] == s["num_attention_heads"] == 16


def test_gpt2_style_fields() -> None:
    # Qwen-7B names its fields n_embd, n_layer, n_head, ffn_hidden_size
    s = _shape("7B")
    assert (s["hidden_size"], s["num_hidden_layers"], s["num_attention_heads"]) == (4096, 32, 32)
    assert s["intermediate_size"] == 11008 and s["model_type"] == "qwen2"
