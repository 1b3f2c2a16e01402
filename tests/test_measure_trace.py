"""The step tracer: storage accounting, exact byte arithmetic, and agreement with independent references.

References: the CPU allocator's alloc/free events from ``torch.profiler`` on a real CPU run of the
same step (no dispatch mode involved), and torch's own ``MemTracker`` where it can run.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

from fitcheck.measure.real import real_step  # noqa: E402
from fitcheck.measure.trace import trace_step  # noqa: E402
from fitcheck.measure.tracker import LiveStorageMode, Tracker  # noqa: E402
from fitcheck.models import LlmSetup  # noqa: E402

V = 32000
LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": V,
}
TINY = {
    "llama": LLAMA,
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        "hidden_size": 256,
        "intermediate_size": 512,
        "moe_intermediate_size": 128,
        "shared_expert_intermediate_size": 256,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": V,
    },
    # attn_pdrop=0: with attention dropout the trace takes CUDA's flash path, which the CPU kernel refuses
    "gpt2": {"model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4, "vocab_size": V,
             "bos_token_id": 0, "eos_token_id": 0, "attn_pdrop": 0.0},
    "gemma2": {
        "model_type": "gemma2",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "vocab_size": V,
    },
}  # fmt: skip


def small(**kw: object) -> LlmSetup:
    return LlmSetup(batch_size=2, seq_len=128, **kw)  # type: ignore[arg-type]


# --- the accounting itself (no model) ---------------------------------------------------------


def test_tracker_counts_storages_once_and_frees() -> None:
    tr = Tracker()
    tr.begin("forward", 1)
    with LiveStorageMode(tr):
        a = torch.empty(1024, dtype=torch.float32)
        view = a[:10].view(2, 5)  # a view: no new storage
        a.add_(1.0)  # in place: no new storage
        b = a * 2
        assert tr.live_bytes == 8192
        del b
        assert tr.live_bytes == 4096
        del view
    assert tr.windows[-1].peak_bytes == 8192
    del a
    assert tr.live_bytes == 0


def test_tracker_ignores_views_of_untracked_tensors() -> None:
    base = torch.zeros(256)
    tr = Tracker()
    tr.begin("forward", 1)
    with LiveStorageMode(tr):
        v = base.view(16, 16)
        t = v.t()
    assert tr.live_bytes == 0
    del t, v


# --- exact arithmetic on tiny models ------------------------------------------------------------


@pytest.mark.slow
def test_full_hf_states_and_grads_exact() -> None:
    """bf16 model, fused AdamW states in bf16 plus one fp32 step scalar per tensor, bf16 grads."""
    r = trace_step(LLAMA, small(method="full", trainer="hf"))
    n_tensors = 2 * 9 + 3  # per layer: 7 linears + 2 norms; embed, final norm, lm_head
    assert r.param_bytes == 2 * r.total_params
    opt = r.phase("optimizer_step").breakdown
    assert opt is not None
    assert opt["optimizer_states"] == 2 * r.param_bytes + 4 * n_tensors
    assert opt["gradients"] == r.param_bytes
    for ph in r.phases:
        assert ph.breakdown is not None and sum(ph.breakdown.values()) == ph.peak_bytes
    assert r.peak_allocated_bytes == max(p.peak_bytes for p in r.phases)
    assert r.first_step_peak_bytes is not None and r.first_step_peak_bytes < r.peak_allocated_bytes


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["hf", "torchtune", "generic"])
def test_lora_adapters_in_the_regime_dtype(trainer: str) -> None:
    """Adapter count is r(d_in + d_out) per targeted linear; bytes follow the regime's adapter dtype."""
    from fitcheck.engine.regimes import regime_for

    h, i, kv = 256, 512, 128  # hidden, MLP width, k/v width (2 heads x 64)
    per_layer = sum(16 * (a + b) for a, b in [(h, h), (h, kv), (h, kv), (h, h), (h, i), (h, i), (i, h)])
    setup = small(method="lora", trainer=trainer, lora_rank=16)
    r = trace_step(LLAMA, setup)
    assert r.trainable_params == 2 * per_layer
    width = {"fp32": 4, "bf16": 2}[regime_for(setup).adapter_dtype]
    opt = r.phase("optimizer_step").breakdown
    assert opt is not None and opt["parameters_trainable"] == width * r.trainable_params


@pytest.mark.slow
def test_checkpointing_and_sdpa_reduce_the_peak() -> None:
    base = trace_step(LLAMA, small(method="full", trainer="generic", attn="eager"))
    ckpt = trace_step(LLAMA, small(method="full", trainer="generic", attn="eager", grad_ckpt=True))
    sdpa = trace_step(LLAMA, small(method="full", trainer="generic", attn="sdpa"))
    act = lambda r: r.phase("forward").breakdown["activations"]  # noqa: E731
    assert act(ckpt) < act(base) and act(sdpa) < act(base)


@pytest.mark.slow
def test_chunked_loss_lowers_the_logits_hump() -> None:
    hf = trace_step(LLAMA, small(method="full", trainer="hf"))
    tt = trace_step(LLAMA, small(method="full", trainer="torchtune"))
    assert tt.phase("forward").peak_bytes < hf.phase("forward").peak_bytes


@pytest.mark.slow
def test_attention_dropout_takes_the_flash_path() -> None:
    """CUDA SDPA applies attention dropout inside flash; no (b, heads, s, s) tensor may appear."""
    cfg = {**TINY["gpt2"], "attn_pdrop": 0.1}
    setup = LlmSetup(batch_size=1, seq_len=512, method="lora", trainer="hf")
    r = trace_step(cfg, setup)
    for ph in r.phases:
        assert all(t.shape[-2:] != (512, 512) for t in ph.top_tensors), ph.name


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["sgd", "lion", "adafactor"])
def test_other_optimizers_trace(optimizer: str) -> None:
    r = trace_step(LLAMA, small(method="full", trainer="hf", optimizer=optimizer))
    states = r.phase("optimizer_step").breakdown["optimizer_states"]  # type: ignore[index]
    assert 0 < states < 2 * r.param_bytes  # one state (SGD, Lion) or factored (Adafactor)


@pytest.mark.slow
def test_qlora_and_8bit_are_refused() -> None:
    from fitcheck.errors import OptionError

    with pytest.raises(OptionError, match="QLoRA"):
        trace_step(LLAMA, small(method="qlora"))
    with pytest.raises(OptionError, match="8-bit"):
        trace_step(LLAMA, small(method="lora", optimizer="adamw8bit"))


# --- agreement with independent references -----------------------------------------------------

AGREE = [
    ("llama", dict(method="full", trainer="hf")),
    ("llama", dict(method="lora", trainer="generic", lora_dropout=0.1)),
    ("llama", dict(method="full", trainer="torchtune", attn="eager", grad_ckpt=True)),
    ("qwen2_moe", dict(method="lora", trainer="hf", lora_targets="attn", grad_ckpt=True)),
    ("gpt2", dict(method="full", trainer="hf")),
    ("gemma2", dict(method="lora", trainer="generic", dora=True, attn="eager")),
]


@pytest.mark.slow
@pytest.mark.parametrize(("arch", "kw"), AGREE, ids=[f"{a}-{i}" for i, (a, _) in enumerate(AGREE)])
def test_trace_matches_real_cpu_profiler(arch: str, kw: dict[str, object]) -> None:
    """Per phase, the traced peak equals the CPU allocator's peak within 0.1%.

    The real run counts what the trace cannot: kernel scratch freed inside an op, the CPU RNG state
    that non-reentrant checkpointing saves per layer (5 KB, a CPU tensor on CUDA too).
    """
    setup = small(**kw)
    traced = trace_step(TINY[arch], setup)
    real = real_step(TINY[arch], setup, device="cpu")
    for t, r in zip(traced.phases, real.phases, strict=True):
        assert t.name == r.name
        assert r.peak_bytes == pytest.approx(t.peak_bytes, rel=1e-3), t.name


@pytest.mark.slow
def test_trace_matches_torch_memtracker() -> None:
    """torch's MemTracker (full fine-tuning only: it cannot hook frozen parameters) gives the same peak."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from fitcheck.engine.regimes import regime_for
    from fitcheck.measure._internals import fakeify
    from fitcheck.measure.build import build_model, trainable_parameters
    from fitcheck.measure.optim import make_optimizer
    from fitcheck.measure.step import compute_loss, device_semantics, make_batch

    setup = small(method="full", trainer="generic", attn="eager")
    regime = regime_for(setup)
    fake = FakeTensorMode()
    with torch.device("meta"):
        model = build_model(LLAMA, setup, regime).model
    fakeify(model, fake)
    with fake:
        opt = make_optimizer(trainable_parameters(model), setup, regime)
        ids, labels = make_batch(V, setup)
        mt = MemTracker()
        mt.track_external(model, opt, ids, labels)
        with mt, device_semantics(regime, True):
            for _ in range(2):
                compute_loss(model, ids, labels, regime).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                mt.reset_mod_stats()
        peak = mt.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    ours = trace_step(LLAMA, setup).peak_allocated_bytes
    assert abs(peak - ours) <= 64


# --- the command -----------------------------------------------------------------------------------


@pytest.mark.slow
def test_measure_command_json(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from fitcheck.cli import main

    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(LLAMA))
    rc = main(["measure", str(cfg), "--method", "lora", "--seq-len", "128", "--format", "json"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = json.loads(out)
    assert [r["phase"] for r in doc["comparison"]] == ["forward", "backward", "optimizer_step", "peak"]
    assert doc["measured"]["mode"] == "trace" and doc["estimate"]["peak_allocated_bytes"] > 0


@pytest.mark.slow
def test_measure_8b_lora_acceptance(capsys) -> None:  # type: ignore[no-untyped-def]
    """`fitcheck measure llama-3.1-8b --method lora` traces the 8B model on fake tensors in seconds."""
    from fitcheck.cli import main

    rc = main(["measure", "llama-3.1-8b", "--method", "lora"])
    out = capsys.readouterr().out
    assert rc == 0 and "peak (" in out and "error" in out


@pytest.mark.slow
def test_lora_fa_trace_matches_the_engine() -> None:
    """LoRA-FA (lora_A frozen, peft create_lorafa_optimizer): the trace keeps B's gradients and states only
    and no lora_A input; the engine's phases agree with it within 1% and its LoRA -> LoRA-FA saving within 3%
    (the optimizer step's saving, 0.66 MB here, is where the tracer's small-block rounding shows)."""
    from fitcheck.engine.estimate import estimate
    from fitcheck.sources.resolve import spec_from_config

    spec = spec_from_config(dict(LLAMA), id="tiny", name="tiny", source="test")
    kw = {"method": "lora", "trainer": "hf", "lora_rank": 16, "lora_targets": "q_proj,v_proj"}
    kw["lora_dropout"] = 0.05
    traced, est = {}, {}
    for fa in (False, True):
        setup = small(lora_fa=fa, **kw)
        r = trace_step(LLAMA, setup)
        e = estimate(spec, setup)
        assert r.trainable_params == e.params.trainable
        traced[fa] = {p.name: p.peak_bytes for p in r.phases}
        est[fa] = {p.name: p.total_bytes for p in e.phases}
        for name in ("forward", "backward"):
            assert est[fa][name] == pytest.approx(traced[fa][name], rel=0.01)
    for name in ("forward", "backward", "optimizer_step"):
        saved_trace = traced[False][name] - traced[True][name]
        assert saved_trace > 0
        assert est[False][name] - est[True][name] == pytest.approx(saved_trace, rel=0.03)


@pytest.mark.slow
def test_prefix_tuning_trace_matches_the_engine() -> None:
    """peft PREFIX_TUNING traced live (the tracer wraps the model with PrefixTuningConfig and fakes peft's
    prompt-token ids): the trainable count is peft's, and with many virtual tokens on a short sequence and a
    small vocabulary (the prefix's K/V outweighing the logits) every phase agrees within 3%, while without the
    prefix's K/V growth (engine/activations.py ``_prefix_acts``) forward and backward would be over 10% under
    (docs/methodology.md, "Prefix tuning")."""
    from fitcheck.engine import activations as act
    from fitcheck.engine.estimate import estimate
    from fitcheck.engine.regimes import regime_for
    from fitcheck.sources.resolve import spec_from_config

    cfg = {**LLAMA, "vocab_size": 2048}
    spec = spec_from_config(dict(cfg), id="tiny", name="tiny", source="test")
    setup = LlmSetup(method="prefix-tuning", prefix_tokens=512, trainer="hf", batch_size=4, seq_len=128)
    r = trace_step(cfg, setup)
    e = estimate(spec, setup)
    assert r.trainable_params == e.params.trainable == 512 * 2 * 2 * 2 * 64
    growth = act.layer_activations(spec.arch, setup, regime_for(setup)).parts["prefix_kv"] * 512 * 2
    for p in r.phases:
        ours = e.phase(p.name).total_bytes
        assert ours == pytest.approx(p.peak_bytes, rel=0.03), p.name
        if p.name != "optimizer_step":
            assert (ours - growth) / p.peak_bytes - 1 < -0.10, p.name


def test_qlora_without_bitsandbytes_is_one_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real QLoRA build without bitsandbytes installed says so (an OptionError, exit 2), no traceback."""
    import sys

    from fitcheck.engine.regimes import regime_for
    from fitcheck.errors import OptionError
    from fitcheck.measure.build import quantize_4bit

    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # import fails as when it is not installed
    setup = small(method="qlora")
    with pytest.raises(OptionError, match="needs bitsandbytes"):
        quantize_4bit(object(), setup, regime_for(setup), [])
