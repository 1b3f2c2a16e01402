"""torchtune's own mechanisms: torchao NF4 as QLoRA's base and the optimizer step in backward.

Exact where the arithmetic is exact (docs/methodology.md, "NF4 formats" and "Optimizer in backward").
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fitcheck.cli import main
from fitcheck.engine import nf4
from fitcheck.engine.estimate import estimate
from fitcheck.engine.load import largest_projection
from fitcheck.engine.regimes import regime_for
from fitcheck.engine.states import counts, tensor_shapes
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup
from fitcheck.readers import read_config
from fitcheck.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return resolve_model("llama-3.2-1b")


def _get(est, phase: str, name: str) -> int:  # type: ignore[no-untyped-def]
    return sum(c.bytes for c in est.phase(phase).components if c.name == name)


def test_torchao_storage_by_hand() -> None:
    # one 4096 x 4096 weight: 8 Mi packed bytes, 262,144 int8 scalers, 1,024 bf16 factors, the bf16
    # nf4 table (16) and scaler_mean (1)
    n = 4096 * 4096
    assert nf4.stored_bytes("torchao", n, 1, True, 2) == n // 2 + n // 64 + 2 * (n // 64 // 256) + 17 * 2
    # torchao always double-quantizes: double_quant=False changes nothing
    assert nf4.stored_bytes("torchao", n, 1, False, 2) == nf4.stored_bytes("torchao", n, 1, True, 2)
    # bitsandbytes keeps its second-level absmax in fp32
    bnb = nf4.stored_bytes("bitsandbytes", n, 1, True, 2)
    assert bnb == n // 2 + n // 64 + 4 * (n // 64 // 256) + 256 * 4 + 4 + 16 * 4


def test_torchtune_qlora_is_torchao(spec) -> None:  # type: ignore[no-untyped-def]
    tt = LlmSetup(method="qlora", trainer="torchtune", grad_ckpt=True)
    assert regime_for(tt).nf4_format == "torchao"
    assert regime_for(tt.model_copy(update={"trainer": "hf"})).nf4_format == "bitsandbytes"
    est = estimate(spec, tt)
    c = counts(spec.arch, tt)
    assert _get(est, "forward", "weights_4bit") == nf4.stored_bytes(
        "torchao", c.quantized, c.quantized_tensors, True, 2
    )
    n = largest_projection(spec.arch, False)
    # get_original_weight: two int64 index tensors (8 B per weight together) + halves, scaled halves and
    # the stacked bf16 weight (3 x 2 B)
    assert _get(est, "forward", "dequant_transient") == 14 * n
    hf = estimate(spec, tt.model_copy(update={"trainer": "hf"}))
    assert _get(hf, "forward", "dequant_transient") == 2 * n


def test_torchao_load_quantizes_one_projection(spec) -> None:  # type: ignore[no-untyped-def]
    est = estimate(spec, LlmSetup(method="qlora", trainer="torchtune"))
    n = largest_projection(spec.arch, False)
    # weight + scaled_blocks (bf16) + uint8 codes, then the packing's two half-byte tensors
    assert _get(est, "load", "load_transient") == max(5 * n + 2 * min(n, 1024**2) * 16 * 2, 6 * n)
    assert nf4.quantize_bytes("bitsandbytes", n, 2) is None


def _in_bwd(**kw: object) -> LlmSetup:
    return LlmSetup(method="full", trainer="torchtune", grad_ckpt=True, optimizer_in_bwd=True, **kw)  # type: ignore[arg-type]


def test_optimizer_in_backward_keeps_one_gradient(spec) -> None:  # type: ignore[no-untyped-def]
    on = estimate(spec, _in_bwd())
    off = estimate(spec, _in_bwd().model_copy(update={"optimizer_in_bwd": False}))
    largest = max(math.prod(shape) for shape, _ in tensor_shapes(spec.arch, _in_bwd()))
    assert _get(on, "optimizer_step", "gradients") == 2 * largest  # bf16, the embedding here
    assert _get(off, "optimizer_step", "gradients") == 2 * counts(spec.arch, _in_bwd()).trainable
    assert on.peak_allocated_bytes < off.peak_allocated_bytes
    # the states are unchanged: only gradients stop coexisting
    assert _get(on, "forward", "optimizer_states") == _get(off, "forward", "optimizer_states")


def test_optimizer_in_backward_step_temporaries_are_one_tensor(spec) -> None:  # type: ignore[no-untyped-def]
    # generic fp32 runs foreach AdamW (sqrt of every second moment at once): in backward, one tensor's
    setup = LlmSetup(method="full", trainer="generic", precision="fp32", seq_len=256, optimizer_in_bwd=True)
    on = estimate(spec, setup)
    off = estimate(spec, setup.model_copy(update={"optimizer_in_bwd": False}))
    largest = max(math.prod(shape) for shape, _ in tensor_shapes(spec.arch, setup))
    assert _get(on, "optimizer_step", "optimizer_transient") == 4 * largest
    assert _get(off, "optimizer_step", "optimizer_transient") == 4 * counts(spec.arch, setup).trainable
    assert on.peak_allocated_bytes < off.peak_allocated_bytes


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"method": "lora"}, "applies to --method full"),
        ({"trainer": "hf"}, "--trainer hf has no optimizer step in backward"),
        ({"grad_accum": 4}, "cannot accumulate"),
        ({"gpus": 2}, "one GPU only"),
    ],
)
def test_optimizer_in_backward_refusals(spec, kw: dict[str, object], msg: str) -> None:  # type: ignore[no-untyped-def]
    base = {"method": "full", "trainer": "torchtune", "optimizer_in_bwd": True}
    with pytest.raises(OptionError, match=msg):
        estimate(spec, LlmSetup(**{**base, **kw}))  # type: ignore[arg-type]


def test_cli_flag_and_one_line_refusal(capsys) -> None:  # type: ignore[no-untyped-def]
    ok = main(["estimate", "llama-3.2-1b", "--on", "none", "--method", "full", "--trainer", "torchtune",
               "--optimizer-in-backward", "-f", "json"])  # fmt: skip
    out = capsys.readouterr().out
    assert ok == 0 and '"optimizer_in_bwd": true' in out
    code = main(["estimate", "7B", "--on", "none", "--method", "lora", "--optimizer-in-backward"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fitcheck: error: --optimizer-in-backward") and err.count("\n") == 1


def test_torchtune_reader_sets_optimizer_in_bwd(tmp_path: Path) -> None:
    cfg = tmp_path / "full.yaml"
    cfg.write_text(
        "model:\n  _component_: torchtune.models.llama3_1.llama3_1_8b\nbatch_size: 2\n"
        "optimizer:\n  _component_: bitsandbytes.optim.PagedAdamW8bit\noptimizer_in_bwd: True\n"
        "gradient_accumulation_steps: 1\nenable_activation_checkpointing: True\n"
    )
    got = read_config(str(cfg))
    assert got.values["optimizer_in_bwd"] is True and got.keys["optimizer_in_bwd"] == "optimizer_in_bwd"
    # the LoRA recipes never read the key: noted, not set
    cfg.write_text(cfg.read_text().replace("llama3_1_8b", "lora_llama3_1_8b"))
    lora = read_config(str(cfg))
    assert "optimizer_in_bwd" not in lora.values and any("LoRA recipes ignore" in n for n in lora.notes)


def test_paged_optimizer_states_are_their_own_line(spec) -> None:  # type: ignore[no-untyped-def]
    from fitcheck.facts.optimizers import PAGED_MIN_NUMEL

    paged = LlmSetup(method="full", trainer="torchtune", optimizer="paged-adamw8bit")
    plain = estimate(spec, paged.model_copy(update={"optimizer": "adamw8bit"}))
    est = estimate(spec, paged)
    big = sum(k * math.prod(s) for s, k in tensor_shapes(spec.arch, paged) if math.prod(s) >= PAGED_MIN_NUMEL)
    # the two uint8 states of every tensor of 1e5+ elements leave the allocator; the total is unchanged
    assert _get(est, "optimizer_step", "optimizer_states_paged") == 2 * big
    assert _get(est, "optimizer_step", "optimizer_states") + 2 * big == _get(
        plain, "optimizer_step", "optimizer_states"
    )
    assert est.device_bytes == plain.device_bytes
    assert any("CUDA managed memory" in w for w in est.warnings)
    assert _get(plain, "optimizer_step", "optimizer_states_paged") == 0


def test_torchtune_phi3_is_built_with_separate_projections() -> None:
    """torchtune's phi3 builder has q/k/v and gate/up/down apart (engine/regimes.py UNFUSED_TRAINERS):
    its recipes' q_proj,v_proj are r (d_in + d_out) each; peft on the Hub model (fused qkv_proj) has no
    q_proj, so under --trainer hf the same names are refused."""
    phi = resolve_model("phi-3-mini")  # h 3072, 32 heads = 32 kv heads, 32 layers, MLP 8192
    a = phi.arch
    assert a.fused_qkv and a.fused_gate_up
    r = 8
    est = estimate(phi, LlmSetup(trainer="torchtune", lora_rank=r, lora_targets="q_proj,v_proj", seq_len=256))
    assert est.params.adapter == a.num_layers * 2 * r * (3072 + 3072)
    mlp = estimate(
        phi, LlmSetup(trainer="torchtune", lora_rank=r, lora_targets="gate_proj,up_proj", seq_len=256)
    )
    assert mlp.params.adapter == a.num_layers * 2 * r * (3072 + 8192)
    full = estimate(phi, LlmSetup(trainer="torchtune", method="full", seq_len=256))
    assert (
        full.params.total == estimate(phi, LlmSetup(method="full", seq_len=256)).params.total
    )  # same weights
    with pytest.raises(OptionError, match="no module 'q_proj'"):
        estimate(phi, LlmSetup(trainer="hf", lora_rank=r, lora_targets="q_proj,v_proj", seq_len=256))
