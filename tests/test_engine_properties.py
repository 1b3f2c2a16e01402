"""Property tests of the engine (hypothesis): monotonicity, orderings and phase sums."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from fitcheck.engine.estimate import estimate
from fitcheck.models import DecoderArch, LlmSetup, ModelSpec
from fitcheck.sources.size import spec_from_size

SIZES = ["125M", "350M", "1B", "1.5B", "3B", "7B", "13B"]
_SPECS = {s: spec_from_size(s) for s in SIZES}

setups = st.builds(
    LlmSetup,
    method=st.sampled_from(["full", "lora", "qlora"]),
    batch_size=st.integers(1, 16),
    seq_len=st.integers(16, 8192),
    grad_accum=st.integers(1, 4),
    precision=st.sampled_from(["bf16", "fp16", "fp32"]),
    optimizer=st.sampled_from(["adamw", "adamw8bit", "adafactor", "lion", "sgd", "prodigy"]),
    grad_ckpt=st.booleans(),
    attn=st.sampled_from(["eager", "sdpa", "flash"]),
    lora_rank=st.integers(1, 256),
    lora_targets=st.sampled_from(["attn", "all-linear", "q_proj,v_proj"]),
    trainer=st.sampled_from(["generic", "hf", "torchtune"]),
    master_weights=st.booleans(),
).filter(lambda s: not (s.attn == "flash" and s.precision == "fp32"))  # FlashAttention-2: fp16/bf16 only
specs = st.sampled_from(SIZES).map(_SPECS.__getitem__)


def peak(spec: ModelSpec, setup: LlmSetup) -> int:
    return estimate(spec, setup).peak_allocated_bytes


def _lora(setup: LlmSetup) -> LlmSetup:
    return setup.model_copy(update={"method": "lora" if setup.method == "full" else setup.method})


@given(specs, setups)
def test_phases_sum_and_peak_is_largest(spec: ModelSpec, setup: LlmSetup) -> None:
    est = estimate(spec, setup)
    for phase in est.phases:
        assert sum(c.bytes for c in phase.components) == phase.total_bytes
    assert est.peak_allocated_bytes == max(p.total_bytes for p in est.phases)
    assert est.phase(est.peak_phase).total_bytes == est.peak_allocated_bytes
    assert est.device_bytes == est.peak_reserved_bytes + est.context_bytes


@given(specs, setups, st.integers(1, 8))
def test_peak_monotone_in_batch(spec: ModelSpec, setup: LlmSetup, extra: int) -> None:
    bigger = setup.model_copy(update={"batch_size": setup.batch_size + extra})
    assert peak(spec, bigger) >= peak(spec, setup)


@given(specs, setups, st.integers(1, 4096))
def test_peak_monotone_in_seq_len(spec: ModelSpec, setup: LlmSetup, extra: int) -> None:
    longer = setup.model_copy(update={"seq_len": setup.seq_len + extra})
    assert peak(spec, longer) >= peak(spec, setup)


@given(specs, setups, st.integers(1, 128))
def test_peak_monotone_in_rank(spec: ModelSpec, setup: LlmSetup, extra: int) -> None:
    setup = _lora(setup)
    if setup.optimizer in ("adamw8bit", "paged-adamw8bit", "lion8bit"):
        # bitsandbytes keeps 32-bit states for tensors under 4096 elements (min_8bit_size), so a
        # rank-1 lora_A can cost more optimizer memory than a rank-2 one: a real, tested exception
        # (test_bnb_small_tensors_keep_32bit_states); the property is checked on the other optimizers.
        setup = setup.model_copy(update={"optimizer": "adamw"})
    wider = setup.model_copy(update={"lora_rank": setup.lora_rank + extra})
    assert peak(spec, wider) >= peak(spec, setup)


def _llama(layers: int, heads: int, vocab: int) -> ModelSpec:
    arch = DecoderArch(
        model_type="llama",
        hidden_size=128 * heads,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=128,
        intermediate_size=344 * heads,
        vocab_size=vocab,
    )
    return ModelSpec(id="t", name="t", source_kind="size", arch=arch)


@given(
    st.integers(2, 40),
    st.integers(4, 40),
    st.integers(1000, 130000),
    st.integers(0, 8),
    st.integers(0, 8),
    setups,
)
def test_peak_monotone_in_params(
    layers: int, heads: int, vocab: int, more_l: int, more_h: int, setup: LlmSetup
) -> None:
    # More parameters of the same family (deeper and/or wider, same head size): never less memory.
    small, big = _llama(layers, heads, vocab), _llama(layers + more_l, heads + more_h, vocab)
    assert peak(big, setup) >= peak(small, setup)


@given(specs, setups, st.integers(1, 64))
def test_generic_qlora_le_lora_le_full(spec: ModelSpec, setup: LlmSetup, rank: int) -> None:
    # Ranks up to 64: far above that, on a 125M model, adapters outgrow the matrices they adapt.
    # Adafactor is left out: its factored states for a whole model can be smaller than LoRA's extra
    # adapter weights and their states (a real corner: full fine-tuning can then peak a few KB lower).
    optimizer = "adamw" if setup.optimizer == "adafactor" else setup.optimizer
    setup = setup.model_copy(update={"trainer": "generic", "lora_rank": rank, "optimizer": optimizer})
    q, lo, f = (peak(spec, setup.model_copy(update={"method": m})) for m in ("qlora", "lora", "full"))
    assert q <= lo <= f


@given(specs, setups)
def test_checkpointing_never_raises_peak(spec: ModelSpec, setup: LlmSetup) -> None:
    assert spec.arch.num_layers >= 2
    on = setup.model_copy(update={"grad_ckpt": True})
    off = setup.model_copy(update={"grad_ckpt": False})
    assert peak(spec, on) <= peak(spec, off)


@given(specs, setups)
def test_sdpa_never_above_eager(spec: ModelSpec, setup: LlmSetup) -> None:
    eager = setup.model_copy(update={"attn": "eager"})
    sdpa = setup.model_copy(update={"attn": "sdpa"})
    assert peak(spec, sdpa) <= peak(spec, eager)


def test_bnb_small_tensors_keep_32bit_states() -> None:
    from fitcheck.engine.regimes import regime_for
    from fitcheck.engine.states import optimizer_state_bytes

    arch = _llama(2, 25, 32000).arch  # hidden 3200: a rank-1 lora_A has 3200 elements, rank 2 has 6400
    small, large = (LlmSetup(method="lora", optimizer="adamw8bit", lora_rank=r, lora_targets="q_proj")
                    for r in (1, 2))  # fmt: skip
    b1 = optimizer_state_bytes(arch, small, regime_for(small))
    b2 = optimizer_state_bytes(arch, large, regime_for(large))
    assert b1 > b2  # 8 B/param under the threshold vs about 2 B/param above it
