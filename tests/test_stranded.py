"""The layer blocks cached beside the loss (engine/overhead.py ``stranded_layer_blocks``).

Under checkpointing each layer's unsaved forward frees its intermediates as it goes; at the loss those
blocks are free and cached, and a loss that makes whole-batch logits (each tensor larger than every layer
block) cuts segments of its own beside them. The reserve is therefore at least how far the loss, with one
layer's activations cached beside it, stands above the allocated peak (docs/methodology.md, "Layer blocks
beside the loss").
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fitcheck import api
from fitcheck.engine import activations as act
from fitcheck.engine import overhead
from fitcheck.engine.estimate import estimate, loss_moments, model_states, saved_activations
from fitcheck.engine.regimes import model_as_trained, regime_for
from fitcheck.models import LlmSetup
from fitcheck.units import GIB

PHI3 = api.resolve("phi-3-mini")


def _setup(**kw: object) -> LlmSetup:
    """universal-llm-trainer's Phi-3-mini QLoRA row as bench/published.py poses it: 2 x 8192 tokens, the
    loop's own loss on fp32 logits, no autocast (tests/data/published/universal-llm-trainer.yaml)."""
    base: dict[str, object] = {
        "method": "qlora",
        "seq_len": 8192,
        "batch_size": 2,
        "grad_accum": 32,
        "grad_ckpt": True,
        "ckpt_reentrant": True,
        "lora_dropout": 0.05,
        "autocast": False,
        "kbit_prep": True,
        "backend": "cuda",
        "trainer": "hf",
        "loss": "plain",
    }
    return LlmSetup(**{**base, **kw})


def _parts(spec: api.ModelSpec, setup: LlmSetup) -> tuple[float, float]:
    """(the layer blocks, the largest loss moment) of ``setup``."""
    spec = model_as_trained(spec, setup)
    regime = regime_for(setup)
    sv = saved_activations(spec, setup, regime)
    ms = model_states(spec, setup, regime)
    at_loss = max(sum(c.bytes for c in m) for m in loss_moments(ms, sv, setup.grad_accum > 1))
    return sv.stranded, at_loss


def _flat_reserve(setup: LlmSetup, spec: api.ModelSpec = PHI3) -> int:
    """The reserve ``setup`` gets with the margin left out (the flat share and the rounding only)."""
    import fitcheck.engine.estimate as engine

    original = engine.stranded_margin
    engine.stranded_margin = lambda *_a, **_k: 0  # type: ignore[assignment]
    try:
        return estimate(spec, setup).allocator_reserve_bytes
    finally:
        engine.stranded_margin = original


def _frag(est: api.Estimate) -> int:
    """The flat share of ``est``: FRAGMENTATION of the peak's bytes beyond its steady states."""
    from fitcheck.engine.estimate import STEADY

    steady = sum(c.bytes for c in est.phase(est.peak_phase).components if c.name in STEADY)
    return int(overhead.FRAGMENTATION * max(0, est.peak_allocated_bytes - steady))


def test_reserve_is_at_least_the_loss_with_the_layer_blocks_beside_it() -> None:
    setup = _setup()
    blocks, at_loss = _parts(PHI3, setup)
    est = estimate(PHI3, setup)
    # one layer's activations, scores aside: past its 2,047-token window Phi-3's layers are windowed (each
    # saves its SDPA mask copy; tests/test_sliding_window.py)
    assert act.windowed_layers(PHI3.arch, setup) == PHI3.arch.num_layers
    layer = act.layer_activations(PHI3.arch, setup, est.regime, moe=False, windowed=True)
    assert blocks == setup.tokens * sum(layer.parts.values())
    margin = round(at_loss + blocks) - est.peak_allocated_bytes
    assert margin > 0
    assert est.peak_reserved_bytes >= at_loss + blocks
    # the margin comes on top of the flat share and the rounding (session 20's real-GPU runs)
    assert est.allocator_reserve_bytes == _flat_reserve(setup) + margin


def test_the_proxy_against_the_allocator_replay() -> None:
    """bench/ult_qlora_replay.py --stack: 4.6 GiB of free layer blocks beside Phi-3-mini QLoRA's fp32
    logits at 2 x 8192 tokens (the record file's session-15 note); the proxy is within 10% of it."""
    blocks, _ = _parts(PHI3, _setup())
    assert blocks / GIB == pytest.approx(4.6, rel=0.10)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"grad_ckpt": False}, "saved tensors are alive at the loss"),
        ({"backend": "mps"}, "not the CUDA caching allocator"),
        ({"trainer": "torchtune", "loss": None, "kbit_prep": None}, "chunked loss: fits the cached blocks"),
        ({"loss": "liger"}, "fused loss: no whole-batch logits"),
    ],
)
def test_not_applied_where_the_rule_does_not_hold(change: dict[str, object], why: str) -> None:
    setup = _setup(**change)
    blocks, _ = _parts(PHI3, setup)
    assert blocks == 0, why
    est, flat = estimate(PHI3, setup), _flat_reserve(setup)
    assert est.allocator_reserve_bytes == flat, why


def test_a_classification_head_strands_nothing() -> None:
    """Rows x labels fit any cached block (the vocabulary is not the output width)."""
    spec = api.resolve("qwen2.5-0.5b")
    setup = LlmSetup(method="full", seq_len=512, batch_size=8, grad_ckpt=True, backend="cuda", trainer="hf")
    assert _parts(spec, setup)[0] > 0  # as a causal LM it does
    assert _parts(spec, setup.model_copy(update={"task": "classification"}))[0] == 0


def test_a_vocabulary_narrower_than_the_layer_strands_nothing() -> None:
    arch = PHI3.arch.model_copy(update={"vocab_size": 2 * PHI3.arch.intermediate_size - 1})
    spec = PHI3.model_copy(update={"arch": arch})
    assert _parts(spec, _setup())[0] == 0


@settings(max_examples=200, deadline=None)
@given(
    tensors=st.integers(0, 10_000),
    transient=st.integers(0, 2**40),
    stranded=st.integers(0, 2**40),
)
def test_the_margin_adds_to_the_reserve(tensors: int, transient: int, stranded: int) -> None:
    """The reserve is the rounding plus the flat share plus the margin: the layer blocks beside the loss
    come on top of the short-lived bytes' fragmentation (the H200 runs, docs/methodology.md)."""
    flat = overhead.reserve_bytes("cuda", tensors, transient)
    got = overhead.reserve_bytes("cuda", tensors, transient, stranded)
    assert got == flat + stranded
    assert flat == tensors * overhead.ROUNDING_PER_TENSOR + int(overhead.FRAGMENTATION * transient)
    assert overhead.reserve_bytes("mps", tensors, transient, stranded) == 0


@settings(max_examples=20, deadline=None)
@given(
    seq=st.sampled_from([256, 1024, 4096]),
    batch=st.integers(1, 4),
    method=st.sampled_from(["lora", "qlora", "full"]),
    ckpt=st.booleans(),
)
def test_the_reserve_holds_the_loss_and_the_layer_blocks(
    seq: int, batch: int, method: str, ckpt: bool
) -> None:
    spec = api.resolve("qwen2.5-0.5b")
    setup = LlmSetup(
        method=method, seq_len=seq, batch_size=batch, grad_ckpt=ckpt, backend="cuda", trainer="hf"
    )
    est = estimate(spec, setup)
    blocks, at_loss = _parts(spec, setup)
    assert (blocks > 0) == ckpt  # Qwen2.5's 151,936-entry vocabulary is wider than any layer tensor
    assert est.peak_reserved_bytes >= round(at_loss + blocks)
    margin = max(0, round(at_loss + blocks) - est.peak_allocated_bytes)
    assert est.allocator_reserve_bytes == _flat_reserve(setup, spec) + margin
    assert est.allocator_reserve_bytes >= _frag(est) + margin


def test_a_device_map_counts_it_on_the_gpu_that_runs_the_loss() -> None:
    """The first GPU runs half the layers and no loss: its reserve is the flat share; the last runs the
    loss beside its layers' cached blocks."""
    est = estimate(PHI3, _setup(strategy="device-map", gpus=2))
    assert est.distributed is not None
    first, last = est.distributed.per_gpu
    blocks, _ = _parts(PHI3, _setup())
    assert est.distributed.bottleneck_gpu == 1
    assert last.peak_reserved_bytes - last.peak_allocated_bytes > 0.5 * blocks
    assert first.peak_reserved_bytes - first.peak_allocated_bytes < 0.5 * blocks
