"""MoE experts' layout (``--moe-layout``): transformers 5's fused 3-D experts, which bitsandbytes leaves in
the compute dtype and peft adapts through ParamWrapper (a merged copy), against transformers 4.x's
per-expert nn.Linear modules, which bitsandbytes quantizes and peft wraps one by one (no merged copy);
Unsloth's own 4-bit fused experts (docs/methodology.md#moe-experts-layout)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fitcheck.cli import main
from fitcheck.engine.estimate import estimate
from fitcheck.engine.load import largest_projection
from fitcheck.engine.params import layer_kinds
from fitcheck.engine.quant import FUSED_IN_V4, expert_modules, experts_unquantized
from fitcheck.engine.states import counts, quantizable_tensors, trainable_shapes
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.resolve import resolve_model

MOE = ("qwen3-30b-a3b", "mixtral-8x7b")


def _spec(name: str) -> ModelSpec:
    spec = resolve_model(name)
    assert isinstance(spec, ModelSpec)
    return spec


def _get(est, phase: str, name: str) -> int:  # type: ignore[no-untyped-def]
    return sum(c.bytes for c in est.phase(phase).components if c.name == name)


def _merged(est) -> int:  # type: ignore[no-untyped-def]
    return max(
        (c.bytes for p in est.phases for c in p.components if c.name == "merged_expert_weights"), default=0
    )


def _expert_params(spec: ModelSpec) -> int:
    a = spec.arch
    return sum(
        k.count * lin.copies * lin.d_in * lin.d_out
        for k in layer_kinds(a)
        for lin in k.linears(a)
        if lin.role == "expert"
    )


@pytest.mark.parametrize("name", MOE)
def test_fused_experts_stay_16bit_under_bitsandbytes(name: str) -> None:
    """QLoRA on transformers 5's fused experts: the 4-bit count is every projection less the experts, the
    experts are bf16 weights among the unquantized ones, and the warning says why and what to do."""
    spec = _spec(name)
    setup = LlmSetup(method="qlora", lora_targets="attn")
    assert experts_unquantized(spec.arch, setup)
    c = counts(spec.arch, setup)
    everything, _ = quantizable_tensors(spec.arch)
    assert c.quantized == everything - _expert_params(spec)
    est = estimate(spec, setup)
    assert _get(est, "optimizer_step", "weights_unquantized") >= 2 * _expert_params(spec)
    text = " ".join(est.warnings)
    assert "bitsandbytes quantizes nn.Linear only" in text and "--moe-layout per-expert" in text
    assert "#1849" in text


@pytest.mark.parametrize("name", MOE)
def test_per_expert_layout_quantizes_the_experts_without_a_merged_copy(name: str) -> None:
    """transformers 4.x: every projection but the router is 4-bit, LoRA on the experts (all-linear) is one
    module per expert and projection, and there is no ParamWrapper copy; the fused layout keeps one."""
    spec = _spec(name)
    per = LlmSetup(method="qlora", moe_layout="per-expert")
    assert expert_modules(spec.arch, per) and not experts_unquantized(spec.arch, per)
    assert counts(spec.arch, per).quantized == quantizable_tensors(spec.arch)[0]
    est = estimate(spec, per)
    assert _merged(est) == 0
    assert not any("nn.Linear only" in w for w in est.warnings)
    fused = estimate(spec, LlmSetup(method="qlora"))
    assert _merged(fused) > 0
    weights = ("weights_4bit", "weights_unquantized")
    saved = sum(_get(fused, "optimizer_step", n) - _get(est, "optimizer_step", n) for n in weights)
    assert saved > 1.4 * _expert_params(spec)  # 2 B a weight against NF4's ~0.5


def test_per_expert_adapters_are_one_pair_per_expert_module() -> None:
    """Each expert's gate and up projections are their own modules (w x r B factors, two per expert), not
    one rank-2r ParamWrapper factor per layer."""
    spec = _spec("qwen3-30b-a3b")
    a = spec.arch
    shapes = trainable_shapes(a, LlmSetup(method="qlora", moe_layout="per-expert", lora_rank=8))
    assert (a.moe_intermediate_size, 8, 2 * a.moe_layers * a.num_experts) in shapes
    fused = trainable_shapes(a, LlmSetup(method="qlora", lora_rank=8))
    assert not any(n == 2 * a.moe_layers * a.num_experts for _, _, n in fused)


def test_lora_16bit_per_expert_has_no_merged_copy() -> None:
    spec = _spec("qwen3-30b-a3b")
    assert _merged(estimate(spec, LlmSetup(method="lora", moe_layout="per-expert"))) == 0
    assert _merged(estimate(spec, LlmSetup(method="lora"))) > 0


def test_int8_base_leaves_fused_experts_too() -> None:
    """LLM.int8 goes through the same replace_with_bnb_linear: its quantized bytes leave the fused experts
    out, and per-expert modules put them back."""
    spec = _spec("mixtral-8x7b")
    fused = estimate(spec, LlmSetup(method="lora", base_quant="int8", lora_targets="attn"))
    per = estimate(
        spec, LlmSetup(method="lora", base_quant="int8", lora_targets="attn", moe_layout="per-expert")
    )
    diff = _get(per, "optimizer_step", "weights_quantized") - _get(
        fused, "optimizer_step", "weights_quantized"
    )
    assert _expert_params(spec) <= diff < 1.01 * _expert_params(spec)
    assert any("--base-quant int8 on MoE" in w for w in fused.warnings)


def test_unsloth_packs_fused_experts_in_4bit_and_dequantizes_a_whole_stack() -> None:
    """Unsloth: 4-bit fused experts, no merged copy (Split LoRA), and the dequantized transient is one
    whole expert stack (every expert of the largest projection) in the compute dtype."""
    spec = _spec("qwen3-30b-a3b")
    a = spec.arch
    setup = LlmSetup(method="qlora", trainer="unsloth", grad_ckpt=True)
    assert not experts_unquantized(a, setup)
    assert counts(a, setup).quantized == quantizable_tensors(a)[0]
    est = estimate(spec, setup)
    assert _merged(est) == 0
    stack = a.num_experts * a.hidden_size * 2 * a.moe_intermediate_size
    assert largest_projection(a, False, setup) == stack
    assert _get(est, "forward", "dequant_transient") >= 2 * stack
    assert any("Unsloth" in w and "#850" in w for w in est.warnings)


def test_per_expert_changes_nothing_where_transformers_4_was_fused_too() -> None:
    """A type whose 4.x class already held 3-D experts (gpt-oss, Granite MoE, Llama 4, Qwen3-VL-MoE) is
    sized as fused under either layout, with a warning naming the type."""
    spec = _spec("qwen3-30b-a3b")
    arch = spec.arch.model_copy(update={"model_type": "gpt_oss"})
    assert "gpt_oss" in FUSED_IN_V4
    moved = spec.model_copy(update={"arch": arch})
    per = LlmSetup(method="qlora", moe_layout="per-expert", lora_targets="attn")
    assert experts_unquantized(arch, per)
    est = estimate(moved, per)
    assert any("gpt_oss held its experts as 3-D parameters" in w for w in est.warnings)


def test_dense_models_ignore_the_layout() -> None:
    spec = _spec("llama-3.2-1b")
    a = estimate(spec, LlmSetup(method="qlora"))
    b = estimate(spec, LlmSetup(method="qlora", moe_layout="per-expert"))
    assert a.peak_allocated_bytes == b.peak_allocated_bytes
    assert not any("moe-layout" in w for w in a.warnings)


def test_cli_json_echoes_the_layout() -> None:
    from fitcheck.cli import app

    runner = CliRunner()
    args = ["estimate", "qwen3-30b-a3b", "--method", "qlora", "--on", "h100-80gb", "--format", "json"]
    out = runner.invoke(app, [*args, "--moe-layout", "per-expert"])
    assert out.exit_code in (0, 1), out.output
    assert json.loads(out.stdout)["setup"]["moe_layout"] == "per-expert"
    default = runner.invoke(app, args)
    assert json.loads(default.stdout)["setup"]["moe_layout"] == "fused"


def test_cli_refuses_an_unknown_layout_in_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["estimate", "qwen3-30b-a3b", "--on", "none", "--method", "qlora", "--moe-layout", "v4"])
    err = capsys.readouterr().err
    assert code == 2 and "--moe-layout" in err and "Traceback" not in err


def test_device_map_version_4_points_at_the_layout() -> None:
    """--device-map-version 4 poses accelerate's placement only; a fused MoE under it says which option
    poses transformers 4.x's experts, and says nothing once it is given."""
    from fitcheck.engine.estimate import moe_layout_warnings

    a = _spec("mixtral-8x7b").arch
    v4 = {"method": "qlora", "strategy": "device-map", "gpus": 2, "device_map_version": 4}
    assert any("--moe-layout per-expert poses" in w for w in moe_layout_warnings(a, LlmSetup(**v4)))
    assert not moe_layout_warnings(a, LlmSetup(**v4, moe_layout="per-expert"))


def test_suggestions_offer_the_runs_that_quantize_fused_experts() -> None:
    """QLoRA on fused experts that do not fit: each run that quantizes them is suggested, re-estimated, and
    is the change that makes it fit; a dense model and a trainer that already quantizes get neither."""
    from fitcheck.engine.verdict import candidate_changes, moe_changes

    a = _spec("mixtral-8x7b").arch
    fused = LlmSetup(method="qlora", grad_ckpt=True)
    flags = [f for _, f, _ in moe_changes(a, fused)]
    assert flags == ["--lora-targets attn", "--moe-layout per-expert", "--trainer unsloth"]
    assert [f for _, f, _ in moe_changes(a, fused.model_copy(update={"lora_targets": "attn"}))] == flags[1:]
    unsloth = fused.model_copy(update={"trainer": "unsloth"})  # quantizes them already
    assert [f for _, f, _ in moe_changes(a, unsloth)] == ["--lora-targets attn"]
    assert moe_changes(a, fused.model_copy(update={"method": "full"})) == []
    assert not moe_changes(_spec("llama-3.2-1b").arch, fused)
    gpt_oss = a.model_copy(update={"model_type": "gpt_oss"})  # fused in transformers 4.x too
    assert "--moe-layout per-expert" not in [f for _, f, _ in moe_changes(gpt_oss, fused)]
    assert [f for _, f, _ in candidate_changes(fused, a)][-3:] == flags
    assert "--moe-layout per-expert" not in [f for _, f, _ in candidate_changes(fused)]  # no arch, no MoE


def test_check_and_plan_name_the_layout_that_fits() -> None:
    """Mixtral QLoRA on an 80 GB card: 16-bit fused experts do not fit; the estimate's suggestion and the
    plan's smallest change are a transformers 4.x run, which does (checked against the band's high edge)."""
    from fitcheck.api import check, plan

    v = check("mixtral-8x7b", "a100-80gb", method="qlora", grad_ckpt=True).target
    assert v is not None and v.verdict == "does_not_fit"
    sug = {s.flag: s for s in v.suggestions}
    assert sug["--moe-layout per-expert"].fits and sug["--trainer unsloth"].fits
    assert not sug["--lora-targets attn"].fits  # the experts' 16-bit weights stay
    p = plan("mixtral-8x7b", "a100-80gb", method="qlora")
    assert not p.fits
    assert p.changes[0].flag == "--moe-layout per-expert"
    assert p.changes[0].high_bytes is not None and p.changes[0].high_bytes <= p.changes[0].budget_bytes
    assert "--trainer unsloth" in [c.flag for c in p.changes]
