"""Trainer details and the options that model them (issue 13): loss kernels, litgpt and Unsloth regimes,
quantized LoRA bases, LoRA on lm_head / embed_tokens, modules trained in full, activation offload and
the load phase. Exact where the arithmetic is exact; every rule cites its code in docs/methodology.md."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from fitcheck.cli import main
from fitcheck.engine.estimate import estimate
from fitcheck.engine.load import largest_projection
from fitcheck.engine.quant import quantized_bytes
from fitcheck.engine.regimes import regime_for
from fitcheck.engine.states import counts
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup
from fitcheck.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return resolve_model("llama-3.2-1b")


def _get(est, phase: str, name: str) -> int:  # type: ignore[no-untyped-def]
    return sum(c.bytes for c in est.phase(phase).components if c.name == name)


def test_standard_hump_is_exact(spec) -> None:  # type: ignore[no-untyped-def]
    setup = LlmSetup(trainer="hf", batch_size=2, seq_len=1024)
    est = estimate(spec, setup)
    tv = 2 * 1024 * spec.arch.vocab_size
    assert _get(est, "forward", "logits_loss") == tv * 10  # bf16 logits, fp32 copy, fp32 log-softmax


@pytest.mark.parametrize("kernel", ["chunked", "liger", "cce"])
def test_fused_and_chunked_losses_shrink_the_hump(spec, kernel: str) -> None:  # type: ignore[no-untyped-def]
    base = estimate(spec, LlmSetup(trainer="hf", seq_len=4096))
    other = estimate(spec, LlmSetup(trainer="hf", seq_len=4096, loss=kernel))  # type: ignore[arg-type]
    for phase in ("forward", "backward"):
        assert _get(other, phase, "logits_loss") < _get(base, phase, "logits_loss")
    # the fused kernels never hold a vocabulary-sized fp32 tensor
    if kernel != "chunked":
        assert _get(other, "forward", "logits_loss") < 4 * 4096 * spec.arch.vocab_size


def test_cce_keeps_one_float_per_token(spec) -> None:  # type: ignore[no-untyped-def]
    est = estimate(spec, LlmSetup(trainer="hf", seq_len=2048, loss="cce"))
    assert _get(est, "forward", "logits_loss") == 4 * 2048


def test_torchtune_default_is_chunked_and_standard_overrides(spec) -> None:  # type: ignore[no-untyped-def]
    tt = estimate(spec, LlmSetup(trainer="torchtune"))
    std = estimate(spec, LlmSetup(trainer="torchtune", loss="standard"))
    assert _get(std, "forward", "logits_loss") > _get(tt, "forward", "logits_loss")


def test_litgpt_regime(spec) -> None:  # type: ignore[no-untyped-def]
    lora = regime_for(LlmSetup(trainer="litgpt"))
    assert (lora.adapter_dtype, lora.autocast, lora.loss_kernel) == ("bf16", False, "litgpt")
    setup = LlmSetup(method="qlora", trainer="litgpt")
    r = regime_for(setup)
    assert r.quantized_lm_head and r.optimizer_state_dtype == "fp32" and not r.kbit_upcast
    est = estimate(spec, setup)
    c = counts(spec.arch, setup)
    # PagedAdamW keeps two fp32 states per bf16 adapter parameter
    assert _get(est, "optimizer_step", "optimizer_states") == 8 * c.adapter
    # lm_head is 4-bit too (llama-3.2-1b ties it to the embedding, so nothing moves there)
    hf = estimate(spec, LlmSetup(method="qlora", trainer="hf", kbit_prep=True))
    assert _get(est, "optimizer_step", "weights_unquantized") < _get(
        hf, "optimizer_step", "weights_unquantized"
    )


def test_litgpt_quantizes_an_untied_head() -> None:
    spec = resolve_model("llama-2-7b")
    est = estimate(spec, LlmSetup(method="qlora", trainer="litgpt"))
    hf = estimate(spec, LlmSetup(method="qlora", trainer="generic"))
    head = spec.arch.vocab_size * spec.arch.hidden_size
    diff = _get(hf, "optimizer_step", "weights_unquantized") - _get(
        est, "optimizer_step", "weights_unquantized"
    )
    assert diff == head * 2
    # loading holds the largest Linear (the head) in 16 bits plus lightning's fp16 copy
    assert _get(est, "load", "load_transient") == 4 * head


def test_unsloth_regime_offloads_checkpoints(spec) -> None:  # type: ignore[no-untyped-def]
    setup = LlmSetup(method="qlora", trainer="unsloth", grad_ckpt=True, seq_len=4096)
    r = regime_for(setup)
    assert r.offload_checkpoints and r.loss_kernel == "unsloth" and not r.kbit_upcast
    hf = estimate(spec, LlmSetup(method="qlora", trainer="hf", grad_ckpt=True, seq_len=4096, kbit_prep=True))
    un = estimate(spec, setup)
    # fp32 checkpoints under hf with peft's k-bit preparation (upcast), bf16 under Unsloth with 2 of n
    # layers on the device
    n_layers = spec.arch.num_layers
    expected = _get(hf, "forward", "checkpoints") / 2 * 2 / n_layers
    assert _get(un, "forward", "checkpoints") == pytest.approx(expected, rel=1e-6)
    assert un.device_bytes < hf.device_bytes
    warned = estimate(spec, LlmSetup(method="qlora", trainer="unsloth"))
    assert any("use_gradient_checkpointing" in w for w in warned.warnings)


def test_offload_activations_keeps_two_layers(spec) -> None:  # type: ignore[no-untyped-def]
    on = estimate(spec, LlmSetup(trainer="torchtune", grad_ckpt=True, offload_activations=True))
    off = estimate(spec, LlmSetup(trainer="torchtune", grad_ckpt=True))
    assert _get(on, "forward", "checkpoints") * spec.arch.num_layers == pytest.approx(
        2 * _get(off, "forward", "checkpoints"), rel=1e-6
    )


@pytest.mark.parametrize("fmt", ["int8", "gptq", "gptq-int8", "awq"])
def test_quantized_bases(spec, fmt: str) -> None:  # type: ignore[no-untyped-def]
    setup = LlmSetup(method="lora", base_quant=fmt)  # type: ignore[arg-type]
    est = estimate(spec, setup)
    c = counts(spec.arch, setup)
    q = _get(est, "optimizer_step", "weights_quantized")
    assert q == quantized_bytes(spec.arch, setup)
    per = q / c.quantized
    bounds = {"int8": (1.0, 1.01), "gptq-int8": (1.02, 1.05)}.get(fmt, (0.5, 0.53))
    assert bounds[0] < per < bounds[1]
    per_dq = 6 if fmt == "gptq-int8" else 2
    assert _get(est, "forward", "dequant_transient") == largest_projection(spec.arch, False) * per_dq


def test_gptq_int8_buffers() -> None:
    """auto_gptq 0.5.1 QuantLinear at 8 bits, group 128, a 4096 x 11008 projection: qweight int32
    (4096 // 32 * 8, 11008), qzeros int32 (32, 11008 // 32 * 8), scales fp16 (32, 11008), g_idx int32
    (4096)."""
    from fitcheck.engine.quant import _tensor_bytes

    expected = 4 * (4096 // 32 * 8) * 11008 + 4 * 32 * (11008 // 32 * 8) + 2 * 32 * 11008 + 4 * 4096
    assert _tensor_bytes("gptq-int8", 4096, 11008) == expected


def test_int8_gets_the_kbit_upcast_and_gptq_does_not() -> None:
    prep = {"method": "lora", "trainer": "hf", "kbit_prep": True}
    assert regime_for(LlmSetup(base_quant="int8", **prep)).kbit_upcast  # type: ignore[arg-type]
    assert not regime_for(LlmSetup(base_quant="gptq", **prep)).kbit_upcast  # type: ignore[arg-type]
    # TRL's SFTTrainer casts an 8-bit model's adapters to bf16 as a 4-bit one's; GPTQ keeps peft's fp32
    assert regime_for(LlmSetup(method="lora", base_quant="int8", trainer="hf")).adapter_dtype == "bf16"
    assert regime_for(LlmSetup(method="lora", base_quant="gptq", trainer="hf")).adapter_dtype == "fp32"


@pytest.mark.parametrize(
    ("kw", "msg"),
    [
        ({"method": "qlora", "base_quant": "int8"}, "--base-quant int8 is a LoRA base"),
        ({"method": "full", "base_quant": "gptq"}, "--base-quant gptq is a LoRA base"),
        ({"method": "lora", "base_quant": "awq", "backend": "mps"}, "needs CUDA kernels"),
        ({"method": "full", "train_modules": "lm_head"}, "--train-modules applies to LoRA"),
        ({"method": "lora", "train_modules": "mlp"}, "'mlp' is not one of"),
        ({"method": "lora", "train_modules": "lm_head", "lora_targets": "q_proj,lm_head"}, "both"),
    ],
)
def test_refusals(spec, kw: dict[str, str], msg: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(OptionError, match=msg):
        estimate(spec, LlmSetup(**kw))  # type: ignore[arg-type]


def test_lora_on_lm_head_and_embeddings(spec) -> None:  # type: ignore[no-untyped-def]
    a = spec.arch
    base = counts(a, LlmSetup(lora_targets="q_proj,v_proj", lora_rank=8))
    both = counts(a, LlmSetup(lora_targets="q_proj,v_proj,lm_head,embed_tokens", lora_rank=8))
    assert both.adapter - base.adapter == 2 * 8 * (a.hidden_size + a.vocab_size)
    # all-linear leaves the output layer out, as peft does
    assert (
        counts(a, LlmSetup(lora_targets="all-linear")).adapter
        == counts(a, LlmSetup(lora_targets="q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")).adapter
    )
    est = estimate(spec, LlmSetup(lora_targets="q_proj,lm_head", trainer="hf"))
    assert _get(est, "forward", "head_inputs") > 0


def test_modules_to_save_copies(spec) -> None:  # type: ignore[no-untyped-def]
    a = spec.arch
    setup = LlmSetup(trainer="hf", train_modules="embed_tokens,lm_head")
    est = estimate(spec, setup)
    plain = estimate(spec, LlmSetup(trainer="hf"))
    n = 2 * a.vocab_size * a.hidden_size
    assert _get(est, "optimizer_step", "module_copies") == 2 * n  # bf16 copies beside the frozen originals
    assert _get(est, "optimizer_step", "gradients") - _get(plain, "optimizer_step", "gradients") == 2 * n
    assert (
        _get(est, "optimizer_step", "optimizer_states") - _get(plain, "optimizer_step", "optimizer_states")
        == 4 * n
    )
    assert est.params.trainable - plain.params.trainable == n


def test_load_phase(spec) -> None:  # type: ignore[no-untyped-def]
    full = estimate(spec, LlmSetup(method="full", trainer="hf"))
    assert full.phase("load").total_bytes == _get(full, "optimizer_step", "weights")
    q = estimate(spec, LlmSetup(method="qlora", trainer="generic"))
    assert _get(q, "load", "load_transient") == 2 * largest_projection(spec.arch, False)
    assert q.phase("load").total_bytes < q.peak_allocated_bytes


def test_cli_options_reach_the_setup() -> None:
    runner = CliRunner()
    from fitcheck.cli import app

    args = ["estimate", "llama-3.2-1b", "--on", "none", "-f", "json", "--loss", "liger"]
    args += ["--trainer", "unsloth", "--offload-activations", "--train-modules", "lm_head"]
    args += ["--lora-targets", "q_proj,embed_tokens"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    assert '"loss": "liger"' in res.output and '"offload_activations": true' in res.output
    assert '"name": "load"' in res.output


def test_cli_refusal_is_one_line(capsys) -> None:  # type: ignore[no-untyped-def]
    code = main(["estimate", "7B", "--on", "none", "--method", "qlora", "--base-quant", "gptq"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("fitcheck: error: --base-quant gptq") and err.count("\n") == 1
