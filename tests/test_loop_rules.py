"""Rules read from a plain training loop over a transformers + peft model (ljm565/universal-llm-trainer
@9efd14b5, the universal-llm-trainer corpus source): the loop's own loss (``--loss plain``), torch
AdamW's step (``--optimizer-impl``), and the LoRA projection transients and fused-qkv storage that decide
its layer-heavy runs (docs/methodology.md). The traced records phi3_mlp / llama2_mlp in
tests/data/calibration hold the last two to the tracer (tests/test_calibration.py)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fitcheck import api
from fitcheck.engine import lora_transient, loss
from fitcheck.engine.activations import context, fused_qkv_storage
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model

LOOP = {"trainer": "hf", "autocast": False, "loss": "plain", "optimizer_impl": "foreach"}


def _hump(model: str, **kw: object) -> loss.Hump:
    spec = resolve_model(model)
    setup = LlmSetup(**kw)  # type: ignore[arg-type]
    regime = regime_for(setup)
    return loss.hump(spec.arch, setup, regime, context(setup, regime).gamma)


def test_plain_loss_is_three_logits_copies_in_their_dtype() -> None:
    tv = 2 * 8192 * 128256
    h = _hump("llama-3.1-8b", method="lora", batch_size=2, seq_len=8192, **LOOP)
    assert (h.forward, h.backward, h.saved) == (3 * 2 * tv, 3 * 2 * tv, 2 * tv)
    # QLoRA without autocast: lm_head and the stream are fp32 (prepare_model_for_kbit_training)
    q = _hump("llama-3.1-8b", method="qlora", batch_size=2, seq_len=8192, kbit_prep=True, **LOOP)
    assert q.forward == 3 * 4 * tv
    # the standard kernel upcasts: more than the plain one for the same run
    std = _hump("llama-3.1-8b", method="lora", batch_size=2, seq_len=8192, trainer="hf", autocast=False)
    assert std.forward > h.forward


def test_plain_loss_keeps_gemma2_soft_cap() -> None:
    tv = 8192 * 256000
    h = _hump("gemma-2-9b", method="lora", seq_len=8192, **LOOP)
    assert h.forward == h.backward == 4 * 2 * tv and h.saved == 2 * 2 * tv


def test_optimizer_impl_picks_the_adamw_step() -> None:
    spec = resolve_model("llama-3.1-8b")
    base = LlmSetup(method="full", trainer="hf", grad_ckpt=True)
    fused = estimate(spec, base)
    foreach = estimate(spec, base.model_copy(update={"optimizer_impl": "foreach"}))
    assert fused.regime.fused_optimizer and not foreach.regime.fused_optimizer
    trans = foreach.phase("optimizer_step").components
    sqrt_copy = next(c for c in trans if c.name == "optimizer_transient").bytes
    assert sqrt_copy == 2 * fused.params.trainable  # one bf16 copy of every second moment
    assert foreach.peak_allocated_bytes - fused.peak_allocated_bytes >= sqrt_copy // 2
    same = estimate(spec, base.model_copy(update={"optimizer_impl": "fused"}))
    assert same.peak_allocated_bytes == fused.peak_allocated_bytes


def _step_temps(spec_id: str, **kw: object) -> int:
    est = estimate(resolve_model(spec_id), LlmSetup(**kw))  # type: ignore[arg-type]
    return next(
        (c.bytes for c in est.phase("optimizer_step").components if c.name == "optimizer_transient"), 0
    )


def test_torch20_foreach_holds_sqrt_and_denom() -> None:
    """torch 2.0.x's foreach AdamW (pytorch/pytorch#104898 made it in place in 2.1): one dtype group holds
    two copies of every tensor; the fp32 adapters and bf16 modules_to_save copies of a peft run are two
    groups, the first group's two lists alive while the second's are made."""
    full = {"method": "full", "trainer": "hf", "grad_ckpt": True}
    one = _step_temps("qwen2.5-0.5b", **full, optimizer_impl="foreach")
    assert _step_temps("qwen2.5-0.5b", **full, optimizer_impl="foreach-2.0") == 2 * one
    lora = {"method": "lora", "trainer": "hf", "lora_targets": "all-linear", "grad_ckpt": True}
    adapters = _step_temps("qwen2.5-0.5b", **lora, optimizer_impl="foreach")
    assert _step_temps("qwen2.5-0.5b", **lora, optimizer_impl="foreach-2.0") == 2 * adapters
    emb = {**lora, "train_modules": "embed_tokens"}
    both = _step_temps("qwen2.5-0.5b", **emb, optimizer_impl="foreach")  # adapters + copy, one list each
    copy = both - adapters
    assert copy > adapters  # the V x h copy is the larger group
    got = _step_temps("qwen2.5-0.5b", **emb, optimizer_impl="foreach-2.0")
    assert got == adapters + copy + copy  # both single lists plus the larger group's denom
    assert _step_temps("qwen2.5-0.5b", **emb, optimizer_impl="fused") == 0


def test_torch20_foreach_writes_adamw_torch_names_its_source_and_is_not_measured() -> None:
    from fitcheck.facts.hf_optim import optim_written

    assert optim_written("adamw", "foreach-2.0") == optim_written("adamw", "foreach") == "adamw_torch"
    setup = LlmSetup(method="lora", trainer="hf", optimizer_impl="foreach-2.0")
    regime = regime_for(setup)
    assert regime.foreach_denom and "#104898" in regime.source
    torch = pytest.importorskip("torch")
    from fitcheck.measure.optim import make_optimizer

    with pytest.raises(OptionError, match=r"torch 2\.0's AdamW step"):
        make_optimizer([torch.nn.Parameter(torch.zeros(2))], setup, regime)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"optimizer": "lion", "trainer": "hf"}, "--optimizer lion"),
        ({"trainer": "generic"}, "generic does not train with torch.optim.AdamW"),
        ({"trainer": "litgpt", "method": "qlora"}, "PagedAdamW"),
    ],
)
def test_optimizer_impl_refusals(kw: dict[str, str], message: str) -> None:
    with pytest.raises(OptionError, match=message):
        api.estimate("smollm2-360m", on="none", optimizer_impl="foreach", **kw)  # type: ignore[arg-type]


def test_cli_echoes_optimizer_impl_and_exits_2_on_a_contradiction(capsys) -> None:  # type: ignore[no-untyped-def]
    from fitcheck.cli import app, main

    base = ["estimate", "smollm2-360m", "--on", "none", "-f", "json", "--trainer", "hf"]
    res = CliRunner().invoke(app, [*base, "--optimizer-impl", "foreach", "--loss", "plain"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["setup"]["optimizer_impl"] == "foreach" and doc["setup"]["loss"] == "plain"
    assert doc["regime"]["fused_optimizer"] is False
    code = main([*base, "--optimizer-impl", "fused", "--optimizer", "sgd"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fitcheck: error: --optimizer-impl") and err.count("\n") == 1


def _transient(model: str, **kw: object) -> lora_transient.Transient | None:
    setup = LlmSetup(**kw)  # type: ignore[arg-type]
    return lora_transient.mlp_lora_transient(resolve_model(model).arch, setup, regime_for(setup))


def test_lora_transient_applies_to_peft_lora_only() -> None:
    lora = {"method": "lora", "grad_ckpt": True, "seq_len": 8192}
    assert _transient("llama-2-13b", trainer="hf", **lora) is not None
    assert _transient("llama-2-13b", trainer="axolotl", **lora) is not None
    for trainer in ("unsloth", "litgpt", "torchtune", "mlx", "generic"):
        assert _transient("llama-2-13b", trainer=trainer, **lora) is None, trainer
    assert _transient("llama-2-13b", trainer="hf", method="full") is None
    assert _transient("llama-2-13b", trainer="hf", dora=True, **lora) is None
    assert _transient("mixtral-8x7b", trainer="hf", **lora) is None
    assert _transient("llama-2-13b", trainer="hf", lora_targets="attn", **lora) is None


def test_lora_transient_is_wider_without_autocast() -> None:
    kw = {"method": "lora", "trainer": "hf", "grad_ckpt": True, "lora_dropout": 0.05}
    on, off = _transient("phi-3-mini", **kw), _transient("phi-3-mini", autocast=False, **kw)
    assert on is not None and off is not None
    assert off.forward > on.forward and off.recompute > on.recompute
    assert off.recompute > off.forward  # the recompute holds what the layer saved before


def test_lora_transient_decides_the_layer_heavy_run() -> None:
    spec = resolve_model("llama-2-13b")
    setup = LlmSetup(method="lora", batch_size=2, seq_len=8192, grad_ckpt=True, lora_dropout=0.05, **LOOP)
    est = estimate(spec, setup)
    names = [c.name for c in est.phase(est.peak_phase).components]
    assert est.peak_phase == "backward" and "lora_transient" in names


def test_fused_qkv_storage_only_where_v_stays_a_view() -> None:
    setup = LlmSetup(method="lora", trainer="hf")
    c = context(setup, regime_for(setup))
    phi3 = resolve_model("phi-3-mini").arch
    assert fused_qkv_storage(phi3, setup, c) == 2 * 2 * phi3.num_heads * phi3.head_dim
    assert fused_qkv_storage(resolve_model("phi-4").arch, setup, c) == 0  # GQA: repeat_kv copies v
    assert fused_qkv_storage(resolve_model("llama-3.1-8b").arch, setup, c) == 0
    assert fused_qkv_storage(phi3, setup.model_copy(update={"trainer": "litgpt"}), c) == 0


def test_universal_llm_trainer_records_are_posed_as_the_loop_runs() -> None:
    from bench_helpers import bench_module

    pub = bench_module("published")

    _, records = pub.load_source(pub.DATA / "universal-llm-trainer.yaml")
    posed = [p for r in records if r.gpus == 1 and not isinstance(p := pub.pose(r), str)]
    assert len(posed) >= 28
    for _spec, setup, _notes in posed:
        assert setup.trainer == "hf" and setup.autocast is False and setup.loss == "plain"
        assert setup.optimizer_impl == "foreach"
        assert setup.method == "full" or setup.lora_dropout == 0.05
