"""The loss's blocks regrown (engine/overhead.py `regrown_loss_blocks`): a step's gradients fill the cached
blocks of the loss before them, so the next loss cuts as many again (read off the allocator's history on an
H200, docs/methodology.md "Real-GPU runs"; checked there on a full fine-tuning grid posed before it ran),
counted where a decoder layer's largest gradient tensor is at least 10 MiB."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fitcheck import api
from fitcheck.engine import overhead, states
from fitcheck.engine.estimate import estimate, model_states, saved_activations
from fitcheck.engine.regimes import model_as_trained, regime_for
from fitcheck.facts import allocator
from fitcheck.models import LlmSetup
from fitcheck.units import MIB

KERNEL = "standard"  # transformers' whole-logits loss (overhead.WHOLE_LOGITS_KERNELS)


def _setup(**kw: object) -> LlmSetup:
    base: dict[str, object] = {
        "method": "full",
        "trainer": "hf",
        "batch_size": 2,
        "seq_len": 2048,
        "grad_ckpt": True,
        "backend": "cuda",
    }
    return LlmSetup(**{**base, **kw})


def _without_rule(spec: api.ModelSpec, setup: LlmSetup, monkeypatch: pytest.MonkeyPatch) -> int:
    """The reserve ``setup`` gets with the rule left out (pytest's monkeypatch, undone before returning)."""
    import fitcheck.engine.estimate as engine

    with monkeypatch.context() as m:
        m.setattr(engine, "regrown_loss_blocks", lambda *_a, **_k: 0.0)
        return estimate(spec, setup).allocator_reserve_bytes


def _parts(spec: api.ModelSpec, setup: LlmSetup) -> tuple[int, int]:
    """(the trainable gradients, the loss's logits tensors at their largest moment) as counted."""
    spec = model_as_trained(spec, setup)
    regime = regime_for(setup)
    sv = saved_activations(spec, setup, regime)
    grads = model_states(spec, setup, regime)["gradients"].bytes
    return round(grads), round(max(sv.logits_fwd.bytes, sv.logits_bwd.bytes, sv.logits_head.bytes))


@settings(max_examples=200, deadline=None)
@given(grads=st.floats(0, 2**40), logits=st.floats(0, 2**40), layer=st.integers(0, 2**34))
def test_the_smaller_of_the_gradients_and_the_logits(grads: float, logits: float, layer: int) -> None:
    """The smaller of the two, once a layer's largest gradient is at least kMinLargeAlloc (10 MiB)."""
    got = overhead.regrown_loss_blocks(_setup(), KERNEL, grads, logits, layer)
    assert got == (min(grads, logits) if layer >= allocator.MIN_LARGE_ALLOC else 0.0)


def _layer_grad(model: str, setup: LlmSetup) -> int:
    spec = model_as_trained(api.resolve(model), setup)
    return states.largest_layer_grad_bytes(spec.arch, setup, regime_for(setup))


@pytest.mark.parametrize(
    ("model", "change", "mib"),
    [
        ("llama-3.2-3b", {}, 3072 * 8192 * 2 / MIB),  # the MLP's 3072 x 8192 in bf16: 48 MiB
        ("qwen2.5-0.5b", {}, 896 * 4864 * 2 / MIB),  # 8.3 MiB: under the line
        ("qwen2.5-0.5b", {"precision": "fp32"}, 896 * 4864 * 4 / MIB),  # fp32 doubles it: 16.6 MiB
        ("llama-3.2-3b", {"method": "lora", "lora_rank": 64}, 64 * 8192 * 4 / MIB),  # fp32 factor: 2 MiB
        ("llama-3.2-3b", {"method": "prefix-tuning"}, 0),
    ],
)
def test_a_layers_largest_gradient(model: str, change: dict[str, object], mib: float) -> None:
    assert _layer_grad(model, _setup(**change)) == round(mib * MIB)


@pytest.mark.parametrize(
    ("change", "kernel", "why"),
    [
        ({"backend": "mps"}, KERNEL, "another allocator"),
        ({}, "chunked", "a chunked loss's tensors fit the cached blocks"),
        ({"keep_grads": True}, KERNEL, "the gradients never leave their blocks"),
        ({"optimizer_in_bwd": True}, KERNEL, "each gradient freed as it is made"),
        ({"gpus": 2, "strategy": "ddp"}, KERNEL, "several ranks: not measured"),
    ],
)
def test_not_applied_where_the_rule_does_not_hold(change: dict[str, object], kernel: str, why: str) -> None:
    assert overhead.regrown_loss_blocks(_setup(**change), kernel, 1e9, 1e9, 64 * MIB) == 0.0, why


def test_full_fine_tuning_adds_the_logits_below_larger_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama 3.2 3B full fine-tuning at 2 x 2048 (the H200 holdout's row that was 15% under): 6 GiB of
    gradients beside 4.9 GiB of logits tensors; the reserve grows by the logits."""
    spec = api.resolve("llama-3.2-3b")
    setup = _setup()
    grads, logits = _parts(spec, setup)
    assert grads > logits > 0
    assert estimate(spec, setup).allocator_reserve_bytes - _without_rule(spec, setup, monkeypatch) == logits


def test_lora_adds_nothing_its_layer_tensors_are_adapter_factors(monkeypatch: pytest.MonkeyPatch) -> None:
    """High-rank LoRA at a short length (the H200 boundary grid's rows: with the rule +4.2% / +9.2%, without
    it -3.0% / +3.8%): the factors' gradients are a few MiB each."""
    spec = api.resolve("llama-3.2-1b")
    setup = _setup(method="lora", lora_rank=128, batch_size=1, seq_len=512)
    assert _layer_grad("llama-3.2-1b", setup) < allocator.MIN_LARGE_ALLOC
    assert estimate(spec, setup).allocator_reserve_bytes == _without_rule(spec, setup, monkeypatch)


def test_a_small_model_adds_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen2.5 0.5B full fine-tuning in bf16 (8.3 MiB layer gradients; the H200 rows 2-13% over without the
    rule)."""
    spec = api.resolve("qwen2.5-0.5b")
    setup = _setup(batch_size=8, seq_len=1024)
    assert estimate(spec, setup).allocator_reserve_bytes == _without_rule(spec, setup, monkeypatch)


def test_several_ranks_take_none(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = api.resolve("llama-3.2-1b")
    setup = _setup(gpus=2, strategy="ddp")
    assert estimate(spec, setup).allocator_reserve_bytes == _without_rule(spec, setup, monkeypatch)


def test_lora_with_a_trained_output_layer_takes_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """LoRA with the embedding and output layer trained in full (peft's modules_to_save): each copy's
    gradient is one large tensor (Qwen2.5 7B: 152,064 x 3,584 in bf16), which decides the rule as a
    layer's would (the H200 modules grid: without it Qwen2.5 1.5B / 7B were 6% under)."""
    spec = api.resolve("qwen2.5-7b")
    setup = _setup(method="lora", train_modules="embed_tokens,lm_head", batch_size=1, seq_len=1024)
    regime = regime_for(setup)
    trained = model_as_trained(spec, setup)
    assert states.largest_layer_grad_bytes(trained.arch, setup, regime) < allocator.MIN_LARGE_ALLOC
    assert states.largest_regrowing_grad_bytes(trained.arch, setup, regime) == 152064 * 3584 * 2
    assert estimate(spec, setup).allocator_reserve_bytes > _without_rule(spec, setup, monkeypatch)
