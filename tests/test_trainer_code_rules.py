"""Rules read from trainers' and libraries' code for the published-corpus gap (docs/methodology.md,
"Adapters" and "Trainers: litgpt and Unsloth"): each test pins the exact bytes a rule adds."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitcheck.engine import activations as act
from fitcheck.engine import litgpt, loss
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import model_as_trained, regime_for
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model, spec_from_preset

CONFIGS = Path(__file__).parent / "data" / "published" / "configs"


def _acts(model: str, **kw: object) -> float:
    """Saved bytes per token of one layer."""
    spec = spec_from_preset(model)
    setup = LlmSetup(**kw)  # type: ignore[arg-type]
    return act.layer_activations(spec.arch, setup, regime_for(setup)).total(setup.seq_len)


def test_litgpt_unties_a_tied_head() -> None:
    spec = spec_from_preset("llama-3.2-1b")
    assert spec.arch.tie_embeddings
    a = spec.arch
    hf = estimate(spec, LlmSetup(trainer="hf", method="lora", seq_len=512))
    lit = estimate(spec, LlmSetup(trainer="litgpt", method="lora", seq_len=512))
    assert lit.params.total - hf.params.total == a.vocab_size * a.hidden_size
    assert any("untied" in w for w in lit.warnings)
    assert model_as_trained(spec, LlmSetup(trainer="hf")) == spec


def test_untied_model_is_unchanged_under_litgpt() -> None:
    spec = spec_from_preset("llama-2-7b")
    assert model_as_trained(spec, LlmSetup(trainer="litgpt")) == spec


def test_peft_dropout_adds_one_mask_byte_per_wrapped_input() -> None:
    """HF regime (autocast, fp32 adapters): lora_A saves its bf16 cast either way; dropout adds the mask."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"trainer": "hf", "method": "lora", "lora_targets": "q_proj,k_proj,v_proj,o_proj"}
    diff = _acts("llama-3.1-8b", lora_dropout=0.05, **kw) - _acts("llama-3.1-8b", **kw)
    assert diff == 3 * a.hidden_size + a.num_heads * a.head_dim  # q, k, v read h; o reads heads x head_dim


def test_litgpt_dropout_is_one_per_fused_qkv() -> None:
    """litgpt (no autocast, bf16 adapters): the shared bf16 input gives way to one dropout output + mask."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"trainer": "litgpt", "method": "lora", "lora_targets": "q_proj,v_proj"}
    diff = _acts("llama-3.1-8b", lora_dropout=0.05, **kw) - _acts("llama-3.1-8b", **kw)
    assert diff == a.hidden_size  # (2 + 1) h for the one dropout, minus the 2 h shared input


@pytest.mark.parametrize(
    ("trainer", "method", "keeps", "holds"),
    [
        ("litgpt", "qlora", None, False),  # current litgpt pins bitsandbytes >= 0.44 (d2ed13c3)
        ("litgpt", "qlora", True, True),  # its 2023-2024 releases pinned 0.41 / 0.42
        ("litgpt", "lora", True, False),
        ("hf", "qlora", None, False),
        ("hf", "qlora", True, True),
        ("unsloth", "qlora", None, False),
    ],
)
def test_which_runs_hold_4bit_inputs(trainer: str, method: str, keeps: bool | None, holds: bool) -> None:
    setup = LlmSetup(trainer=trainer, method=method, bnb_keeps_input=keeps)  # type: ignore[arg-type]
    assert act.holds_4bit_inputs(setup) is holds


def test_old_bitsandbytes_holds_every_quantized_projection_input() -> None:
    """bitsandbytes < 0.43.2 MatMul4Bit: o_proj's, the MLP's and down_proj's inputs stay alive (q/v LoRA
    already saves the attention input)."""
    a = spec_from_preset("llama-2-7b").arch
    kw = {"trainer": "litgpt", "method": "qlora", "lora_targets": "q_proj,v_proj"}
    held = _acts("llama-2-7b", bnb_keeps_input=True, **kw)
    free = _acts("llama-2-7b", **kw)
    assert held - free == 2 * (a.num_heads * a.head_dim + a.hidden_size + a.intermediate_size)


def test_litgpt_saves_grouped_kv_at_every_head() -> None:
    """q, k and v all adapted, so litgpt's zero_pad scatter (and its saved source) does not run."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"method": "lora", "lora_targets": "q_proj,k_proj,v_proj", "lora_rank": 8}
    diff = _acts("llama-3.1-8b", trainer="litgpt", **kw) - _acts("llama-3.1-8b", trainer="torchtune", **kw)
    assert diff == 2 * 2 * (a.num_heads - a.num_kv_heads) * a.head_dim


def _without_litgpt_model_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(litgpt, "LITGPT_MODEL_TRAINERS", ())


def test_litgpt_mha_keeps_the_fused_qkv(monkeypatch: pytest.MonkeyPatch) -> None:
    """Multi-head: v is a view of the fused qkv output, so q's and k's slices stay alive with it."""
    a = spec_from_preset("llama-2-7b").arch
    assert a.num_kv_heads == a.num_heads
    kw = {"trainer": "litgpt", "method": "lora", "lora_targets": "q_proj,k_proj,v_proj"}
    with_rule = _acts("llama-2-7b", **kw)
    _without_litgpt_model_code(monkeypatch)
    assert with_rule - _acts("llama-2-7b", **kw) == 2 * (a.num_heads + a.num_kv_heads) * a.head_dim


def test_litgpt_grouped_model_keeps_no_fused_qkv() -> None:
    a = spec_from_preset("llama-3.1-8b").arch
    setup = LlmSetup(trainer="litgpt", method="lora")
    assert litgpt.fused_qkv_kept_bytes(a, setup, 2) == 0


def test_litgpt_partial_qkv_lora_keeps_the_scatter_source(monkeypatch: pytest.MonkeyPatch) -> None:
    """q and v adapted, k not: index_copy_ keeps the q and v LoRA outputs (bf16 adapters)."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"trainer": "litgpt", "method": "lora", "lora_targets": "q_proj,v_proj"}
    with_rule = _acts("llama-3.1-8b", **kw)
    _without_litgpt_model_code(monkeypatch)
    assert with_rule - _acts("llama-3.1-8b", **kw) == 2 * (a.num_heads + a.num_kv_heads) * a.head_dim


def test_litgpt_full_norm_product_is_fp32(monkeypatch: pytest.MonkeyPatch) -> None:
    """Full fine-tuning: litgpt's RMSNorm multiplies by weight.float(), so the saved operand is fp32."""
    a = spec_from_preset("llama-3.1-8b").arch
    kw = {"trainer": "litgpt", "method": "full"}
    with_rule = _acts("llama-3.1-8b", **kw)
    _without_litgpt_model_code(monkeypatch)
    assert with_rule - _acts("llama-3.1-8b", **kw) == 2 * (4 - 2) * a.hidden_size


@pytest.mark.parametrize(
    ("trainer", "precision", "per_weight"),
    [("litgpt", "bf16", 4), ("litgpt", "fp16", 2), ("litgpt", "fp32", 6), ("hf", "bf16", 2)],
)
def test_dequantized_weight_bytes(trainer: str, precision: str, per_weight: int) -> None:
    """lightning quantizes from fp16: bitsandbytes dequantizes to fp16, then casts to the compute dtype."""
    setup = LlmSetup(trainer=trainer, method="qlora", precision=precision)  # type: ignore[arg-type]
    gamma = act.context(setup, regime_for(setup)).gamma
    assert litgpt.dequant_bytes_per_weight(setup, gamma) == per_weight


def test_litgpt_qlora_dequantizes_the_head_again_in_backward() -> None:
    spec = spec_from_preset("llama-3.2-1b")
    est = estimate(spec, LlmSetup(trainer="litgpt", method="qlora", batch_size=2, seq_len=512))
    a = est.phase("backward")
    head = [c for c in a.components if c.name == "dequant_transient"]
    assert [c.bytes for c in head] == [spec.arch.vocab_size * spec.arch.hidden_size * 4]


def _hump(kernel_trainer: str, method: str, batch: int) -> tuple[loss.Hump, int, int]:
    spec = spec_from_preset("llama-3.2-1b")
    setup = LlmSetup(trainer=kernel_trainer, method=method, batch_size=batch, seq_len=512)  # type: ignore[arg-type]
    tv = setup.tokens * spec.arch.vocab_size
    chunk = batch * loss.LITGPT_CHUNK_TOKENS * spec.arch.vocab_size
    return loss.hump(spec.arch, setup, regime_for(setup), 2), tv, chunk


def test_litgpt_adapter_loss_runs_on_fabric_fp32_logits() -> None:
    """fp32 logits (Fabric's cast) and fp32 log-softmax; backward adds a chunk's two fp32 gradients; at the
    lm_head's backward the gradient is back in bf16 beside the fp32 logits."""
    h, tv, chunk = _hump("litgpt", "lora", 2)
    assert (h.forward, h.backward, h.at_head) == (8 * tv, 8 * tv + 8 * chunk, 6 * tv)


@pytest.mark.parametrize(("batch", "forward"), [(1, 8), (4, 12)])
def test_litgpt_full_loss_flattens_the_shifted_logits(batch: int, forward: int) -> None:
    """full.py: the shifted logits are copied when flattened (more than one row); backward concatenates the
    chunks' gradients beside the fp32 logits."""
    h, tv, _ = _hump("litgpt", "full", batch)
    assert (h.forward, h.backward) == (forward * tv, 12 * tv)


def test_litgpt_adapts_the_parts_of_a_fused_qkv() -> None:
    """litgpt's LoRAQKVLinear adapts q, k and v of one fused module each on its own (enable_lora): a
    fused-qkv model is posed with separate q/k/v (same weights): q_proj,v_proj = lora_query + lora_value."""
    spec = spec_from_preset("phi-3-mini")
    a = spec.arch
    assert a.fused_qkv
    lit = LlmSetup(trainer="litgpt", method="lora", lora_rank=8, lora_targets="q_proj,v_proj", seq_len=256)
    built = model_as_trained(spec, lit)
    assert not built.arch.fused_qkv
    est = estimate(spec, lit)
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    # lora_A (2r, h) and lora_B (q + kv, r) per layer: litgpt/lora.py @00af8b0d LoRAQKVLinear
    assert est.params.adapter == a.num_layers * 8 * (2 * a.hidden_size + q + kv)
    hf = estimate(spec, LlmSetup(trainer="hf", method="lora", seq_len=256))
    assert est.params.frozen == hf.params.frozen
    with pytest.raises(OptionError, match="no module 'q_proj'"):
        estimate(spec, LlmSetup(trainer="hf", method="lora", lora_targets="q_proj,v_proj", seq_len=256))


def test_litgpt_runs_a_python_gelu_as_one_op() -> None:
    """Phi's config names gelu_new (the Python tanh formula, four saved tensors); litgpt's GptNeoxMLP calls
    torch's gelu(approximate="tanh"), which saves its input only."""
    spec = resolve_model(str(CONFIGS / "microsoft" / "phi-2"))
    assert spec.arch.activation == "gelu_new"
    lit = LlmSetup(trainer="litgpt", method="lora", seq_len=256)
    built = model_as_trained(spec, lit)
    assert built.arch.activation == "gelu_pytorch_tanh"
    parts = act.layer_activations(built.arch, lit, regime_for(lit)).parts
    assert parts["mlp_hidden"] == 2 * spec.arch.intermediate_size  # one bf16 tensor, the GELU input
    assert model_as_trained(spec, LlmSetup(trainer="hf")).arch.activation == "gelu_new"


def test_gpt2_mlp_runs_the_activation_its_config_names() -> None:
    """GPT2MLP calls ACT2FN[activation_function]: gelu_new (the Python tanh formula) keeps three
    intermediates beside its input, a one-op GELU (gelu_pytorch_tanh) only its input."""
    spec = resolve_model(str(CONFIGS / "rasbt" / "gpt-124m-untied-v50257"))
    assert spec.arch.activation == "gelu_pytorch_tanh"
    setup = LlmSetup(trainer="hf", method="full", seq_len=256, autocast=False)
    parts = act.layer_activations(spec.arch, setup, regime_for(setup)).parts
    assert parts["mlp_hidden"] == 2 * spec.arch.intermediate_size  # one bf16 tensor, the GELU input
    new = spec.arch.model_copy(update={"activation": "gelu_new"})
    parts_new = act.layer_activations(new, setup, regime_for(setup)).parts
    assert parts_new["mlp_hidden"] == 8 * new.intermediate_size  # gelu_new: 3 intermediates + 0.5 x


def test_foreach_adamw_copies_the_second_moments_of_modules_to_save_too() -> None:
    """torch's foreach AdamW takes _foreach_sqrt of every exp_avg_sq in the param group, one list per dtype:
    the fp32 adapters' and the bf16 modules_to_save copies' (V x h each) are both alive in the step."""
    from fitcheck.engine import states

    spec = resolve_model(str(CONFIGS / "Qwen" / "Qwen-7B-Chat"))
    a = spec.arch
    kw = {"trainer": "hf", "method": "lora", "seq_len": 256, "optimizer_impl": "foreach"}
    plain = LlmSetup(**kw)
    emb = LlmSetup(**kw, train_modules="embed_tokens,lm_head")
    extra = states.step_transient_bytes(a, emb, regime_for(emb)) - states.step_transient_bytes(
        a, plain, regime_for(plain)
    )
    assert extra == 2 * a.vocab_size * a.hidden_size * 2  # two bf16 V x h copies
    fused = LlmSetup(**{**kw, "optimizer_impl": "fused"}, train_modules="embed_tokens,lm_head")
    assert states.step_transient_bytes(a, fused, regime_for(fused)) == 0
