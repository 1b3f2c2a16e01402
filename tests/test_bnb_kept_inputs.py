"""bitsandbytes < 0.43.2 keeps every 4-bit matmul's input (docs/methodology.md, "bitsandbytes kept inputs").

The traced figures come from bench/qlora2023_trace.py, which emulates bitsandbytes 0.39's ``Linear4bit``
on fake tensors (bitsandbytes itself cannot run on them) beside peft LoRA, k-bit preparation, eager
attention and fp16 autocast, and counts storages with fitcheck's tracker:

- 2- and 4-layer LLaMA, hidden 512, MLP 1376, 8 heads, sequence 512, batch 1 and 2: the peak grows by
  2,048 B per token per layer (the fp32 checkpoint) with reentrant checkpointing or the 0.43.2 fix, and by
  10,944 B with non-reentrant checkpointing (+8,896: q, k, v, gate and up each keep an fp16 copy of their
  fp32 input, o its fp16 input, down an fp16 copy of its fp32 input);
- the recomputed layer under reentrant checkpointing keeps the same 8,896 B per token more than with the
  fix (backward peak per token at 4 layers: 96,088 B vs 87,192 B).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from fitcheck.cli import main
from fitcheck.engine.activations import every_layer_holds_4bit_inputs, held_4bit_input_bytes
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config

#: the emulated trace's model (bench/qlora2023_trace.py SMALL_LLAMA)
SMALL: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_attention_heads": 8,
    "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 512, "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "hidden_act": "silu",
}  # fmt: skip
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
TRACED_PER_LAYER_TOKEN = {"reentrant": 2048, "non-reentrant": 10944}  # bench/qlora2023_trace.py
TRACED_RECOMPUTE_KEPT = 96088 - 87192  # backward peak per token at 4 layers, kept vs fixed


def _setup(batch: int = 1, layers_cfg: dict[str, Any] | None = None, **kw: Any) -> LlmSetup:
    return LlmSetup(
        method="qlora", kbit_path="peft", grad_ckpt=True, attn="eager", precision="fp16", trainer="hf",
        optimizer="adamw", lora_rank=16, lora_alpha=32, lora_dropout=0.05, lora_targets=TARGETS,
        double_quant=False, batch_size=batch, seq_len=512, backend="cuda", **kw,
    )  # fmt: skip


def _spec(layers: int) -> ModelSpec:
    cfg = {**SMALL, "num_hidden_layers": layers}
    return ModelSpec(id="s", name="s", source_kind="hf_config", arch=arch_from_hf_config(cfg), hf_config=cfg)


def _phase(setup: LlmSetup, layers: int, name: str) -> int:
    est = estimate(_spec(layers), setup)
    return next(p.total_bytes for p in est.phases if p.name == name)


def _per_token_per_layer(phase: str, **kw: Any) -> float:
    """Double difference over layers (2 -> 4) and batch (1 -> 2): weights and states cancel."""

    def per_token(layers: int) -> float:
        return (_phase(_setup(2, **kw), layers, phase) - _phase(_setup(1, **kw), layers, phase)) / 512

    return (per_token(4) - per_token(2)) / 2


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_every_layer_keeps_its_inputs_only_non_reentrant(phase: str) -> None:
    non = _per_token_per_layer(phase, bnb_keeps_input=True, ckpt_reentrant=False)
    assert non == TRACED_PER_LAYER_TOKEN["non-reentrant"]
    for kw in ({"bnb_keeps_input": True}, {"bnb_keeps_input": True, "ckpt_reentrant": True}, {}):
        assert _per_token_per_layer(phase, **kw) == TRACED_PER_LAYER_TOKEN["reentrant"], kw
    # the fix (>= 0.43.2): non-reentrant checkpointing keeps one checkpoint per layer, as reentrant
    fixed = _per_token_per_layer(phase, bnb_keeps_input=False, ckpt_reentrant=False)
    assert fixed == TRACED_PER_LAYER_TOKEN["reentrant"]


def test_the_held_line_is_the_traced_bytes() -> None:
    setup = _setup(bnb_keeps_input=True, ckpt_reentrant=False)
    assert every_layer_holds_4bit_inputs(setup)
    extra = TRACED_PER_LAYER_TOKEN["non-reentrant"] - TRACED_PER_LAYER_TOKEN["reentrant"]
    assert held_4bit_input_bytes(_spec(4).arch, setup, regime_for(setup)) == extra
    est = estimate(_spec(4), setup.model_copy(update={"batch_size": 2}))
    fwd = next(p for p in est.phases if p.name == "forward")
    held = next(c for c in fwd.components if c.name == "held_4bit_inputs")
    assert held.bytes == 2 * 512 * 4 * extra


def test_the_recomputed_layer_keeps_the_copies() -> None:
    """Reentrant: only the layer being recomputed keeps them, per projection on the fp32 stream."""

    def per_token(**kw: Any) -> float:
        return (_phase(_setup(2, **kw), 4, "backward") - _phase(_setup(1, **kw), 4, "backward")) / 512

    assert per_token(bnb_keeps_input=True) - per_token(bnb_keeps_input=False) == TRACED_RECOMPUTE_KEPT


def test_a_16_bit_stream_keeps_the_shared_input_once() -> None:
    """Without k-bit preparation (TRL >= 0.26: bf16 stream) ``x.to(compute_dtype)`` returns x itself: q, k and
    v share one kept input, gate and up another (h + h + h + I at 2 B: o and down read their own inputs)."""
    setup = _setup(bnb_keeps_input=True, ckpt_reentrant=False).model_copy(
        update={"kbit_path": "trl", "precision": "bf16"}
    )
    h, i = SMALL["hidden_size"], SMALL["intermediate_size"]
    assert held_4bit_input_bytes(_spec(4).arch, setup, regime_for(setup)) == 2 * (3 * h + i)


def test_other_methods_and_no_checkpointing_hold_nothing_per_layer() -> None:
    assert not every_layer_holds_4bit_inputs(
        LlmSetup(method="lora", bnb_keeps_input=True, ckpt_reentrant=False)
    )
    assert not every_layer_holds_4bit_inputs(
        LlmSetup(method="qlora", bnb_keeps_input=True, ckpt_reentrant=False)
    )
    # kept inputs, checkpointing reentrant unless told (the stacks of those bitsandbytes releases)
    setup = LlmSetup(method="qlora", trainer="litgpt", bnb_keeps_input=True, grad_ckpt=True)
    assert not every_layer_holds_4bit_inputs(setup)


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["estimate", "llama-2-7b", "--on", "a100-40gb", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_flags_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--method", "qlora", "--grad-ckpt", "--trainer", "hf", "--kbit-path", "peft", "-f", "json"]
    rc, out, err = _run([*base, "--bnb-keeps-input", "--no-ckpt-reentrant"], capsys)
    assert rc in (0, 1), err
    doc = json.loads(out)
    assert doc["setup"]["bnb_keeps_input"] is True and doc["setup"]["ckpt_reentrant"] is False
    names = {c["name"] for p in doc["phases"] for c in p["components"]}
    assert "held_4bit_inputs" in names
    rc, out, err = _run(base, capsys)
    assert json.loads(out)["setup"]["bnb_keeps_input"] is None
    for bad, says in (
        (["--method", "lora", "--bnb-keeps-input"], "--bnb-keeps-input applies to --method qlora"),
        (["--method", "qlora", "--no-ckpt-reentrant"], "--no-ckpt-reentrant applies with --grad-ckpt"),
    ):
        rc, out, err = _run(bad, capsys)
        assert rc == 2 and out == "" and err.count("\n") == 1, err
        assert err.startswith("fitcheck: error: " + says)


@pytest.mark.parametrize("reentrant", [True, False])
def test_the_emulated_trace_grows_as_the_engine(reentrant: bool) -> None:
    """Run bench/qlora2023_trace.py's emulation (fake tensors, ~1 s a trace): the traced per-token-per-layer
    growth equals the engine's, and the traced figures above still hold."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from bench_helpers import bench_module

    emu = bench_module("qlora2023_trace")
    kw = {"bnb_keeps_input": True, "ckpt_reentrant": reentrant}
    peaks = {}
    for layers in (2, 4):
        for b in (1, 2):
            cfg = {**SMALL, "num_hidden_layers": layers}
            measured = emu.trace(cfg, emu.qlora_setup(b, 512, **kw), reentrant=reentrant, holds=True)
            peaks[layers, b] = emu.phase_peaks(measured)["forward"]
    traced = ((peaks[4, 2] - peaks[4, 1]) - (peaks[2, 2] - peaks[2, 1])) / 512 / 2
    assert traced == TRACED_PER_LAYER_TOKEN["reentrant" if reentrant else "non-reentrant"]
    assert traced == _per_token_per_layer("forward", **kw)
