"""Sliding-window layers (session 22): which layers attend within ``sliding_window`` (hf_config
`_sliding_layers`, checked against transformers' own configuration classes), and what such a layer saves
once the keys reach its window under SDPA (engine/activations.py `windowed_layers`): K/V expanded to every
head, its own copy of the mask, no math-kernel scores in fp32. Held against fake-tensor traces of
transformers' Mistral (every layer windowed, two K/V heads) and Gemma 3 (five of six, one K/V head: the
expansion is a view), and on the H200 (tests/test_measured_gpu.py: Gemma 3 1B fp32 past its window)."""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck import api
from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config
from saved_helpers import forward_lines, saved_bytes

MISTRAL: dict[str, Any] = {
    "model_type": "mistral", "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 2048, "sliding_window": 64,
    "tie_word_embeddings": False,
}  # fmt: skip
GEMMA3: dict[str, Any] = {
    "model_type": "gemma3_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 6,
    "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 2048,
    "sliding_window": 64, "sliding_window_pattern": 6, "query_pre_attn_scalar": 64,
}  # fmt: skip


def _arch(cfg: dict[str, Any]) -> Any:
    return arch_from_hf_config(dict(cfg))


def _spec(cfg: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id="t", name="t", source_kind="hf_config", arch=_arch(cfg))


def _setup(**kw: Any) -> LlmSetup:
    base: dict[str, Any] = {"method": "lora", "trainer": "hf", "seq_len": 256, "batch_size": 2}
    return LlmSetup(**{**base, "attn": "sdpa", **kw})


# --- which layers slide ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "layers"),
    [
        (MISTRAL, 4),  # every layer: one sliding-window mask for the model
        ({**MISTRAL, "sliding_window": None}, 0),
        (GEMMA3, 5),  # every sixth layer global
        ({**GEMMA3, "num_hidden_layers": 26, "sliding_window_pattern": None}, 22),  # the class's 6
        ({**GEMMA3, "layer_types": ["sliding_attention", "full_attention"] * 3}, 3),  # the list wins
        ({**GEMMA3, "layer_types": ["full_attention"]}, 5),  # a list of the wrong length is not read
        ({**MISTRAL, "model_type": "gemma2", "num_hidden_layers": 26}, 13),  # alternating
        ({**MISTRAL, "model_type": "cohere2", "num_hidden_layers": 8}, 6),  # the class's period 4
        ({**MISTRAL, "model_type": "exaone4", "sliding_window_pattern": "LLLG", "num_hidden_layers": 8}, 6),
        ({**MISTRAL, "model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 3}, 1),
        ({**MISTRAL, "model_type": "qwen2", "use_sliding_window": False}, 0),
        ({**MISTRAL, "model_type": "llama"}, 0),  # a family without windowed layers
    ],
)
def test_sliding_layers_read_from_the_config(cfg: dict[str, Any], layers: int) -> None:
    assert _arch(cfg).sliding_layers == layers


@pytest.mark.parametrize(
    "cfg",
    [
        GEMMA3,
        {**GEMMA3, "num_hidden_layers": 26},
        {**MISTRAL, "model_type": "gemma2", "num_hidden_layers": 26},
        {**MISTRAL, "model_type": "cohere2", "num_hidden_layers": 8},
        {**MISTRAL, "model_type": "olmo3", "num_hidden_layers": 8},
        {**MISTRAL, "model_type": "gpt_oss", "num_hidden_layers": 6},
        {**MISTRAL, "model_type": "qwen2", "use_sliding_window": True, "max_window_layers": 3},
        {**MISTRAL, "model_type": "qwen3", "use_sliding_window": True, "max_window_layers": 1},
    ],
    ids=lambda c: f"{c['model_type']}-{c['num_hidden_layers']}",
)
def test_the_count_is_transformers_own(cfg: dict[str, Any]) -> None:
    """The configuration class's own ``layer_types`` (transformers installed) has as many sliding layers."""
    transformers = pytest.importorskip("transformers")
    kwargs = {k: v for k, v in cfg.items() if k != "model_type"}
    config = transformers.AutoConfig.for_model(cfg["model_type"], **kwargs)
    assert _arch(cfg).sliding_layers == sum(t == "sliding_attention" for t in config.layer_types)


def test_presets() -> None:
    assert api.resolve("gemma-3-1b").arch.sliding_layers == 22  # 26 layers, every sixth global
    assert api.resolve("mistral-7b-v0.1").arch.sliding_layers == 32
    assert api.resolve("gemma-2-2b").arch.sliding_layers == 13
    assert api.resolve("qwen2.5-7b").arch.sliding_layers == 0  # use_sliding_window false


# --- when a layer is windowed -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "windowed"),
    [
        ({}, 4),
        ({"seq_len": 63}, 0),  # keys shorter than the window: SDPA keeps is_causal
        ({"seq_len": 64}, 4),  # transformers masks from kv_length >= window
        ({"attn": "flash"}, 0),  # FlashAttention-2 applies the window itself
        ({"attn": "eager"}, 0),  # eager computes every score whatever the mask
        ({"backend": "mps"}, 0),
        ({"trainer": "litgpt"}, 0),
    ],
)
def test_windowed_layers(change: dict[str, Any], windowed: int) -> None:
    assert act.windowed_layers(_arch(MISTRAL), _setup(**change)) == windowed


def test_no_math_kernel_where_every_layer_is_windowed() -> None:
    """fp32 on a grouped-query model takes SDPA's math kernel only in layers without a mask."""
    a = _arch(MISTRAL)
    full = _setup(method="full", precision="fp32")
    assert not act.sdpa_math(a, full, regime_for(full))
    short = _setup(method="full", precision="fp32", seq_len=48)
    assert act.sdpa_math(a, short, regime_for(short))
    g = _arch(GEMMA3)  # its global layer still does
    assert act.sdpa_math(g, full, regime_for(full))


def test_the_windowed_line_says_so() -> None:
    est = estimate(_spec(MISTRAL), _setup())
    acts = next(c for c in est.phase("backward").components if c.name == "activations")
    assert "4 windowed +" in acts.rule
    copies = next(c for c in est.phase("backward").components if c.name == "attention_mask_copies")
    assert copies.bytes == 4 * 2 * 256 * 256 * 2  # a b x s x s bf16 copy per layer


# --- against the traced step ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cfg", "change"),
    [
        (MISTRAL, {}),
        (MISTRAL, {"method": "full", "precision": "fp32"}),  # no math kernel where the mask is
        (MISTRAL, {"grad_ckpt": True}),
        (GEMMA3, {}),  # one K/V head: the expansion is a view, only the mask copies count
    ],
    ids=["mistral-lora", "mistral-full-fp32", "mistral-ckpt", "gemma3-lora"],
)
def test_each_phase_within_2_percent_of_the_trace(cfg: dict[str, Any], change: dict[str, Any]) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from fitcheck.measure.trace import trace_step

    setup = _setup(**change)
    measured = trace_step(dict(cfg), setup)
    est = estimate(_spec(cfg), setup)
    for phase in measured.phases:
        got = sum(c.bytes for c in est.phase(phase.name).components)
        assert abs(got / phase.peak_bytes - 1) <= 0.02, (phase.name, got, phase.peak_bytes)


# --- a padded batch: the same mask, the same expansion ----------------------------------------------


def test_a_padded_batch_expands_grouped_kv_as_a_real_step_does() -> None:
    """A padding mask takes the same path as a window's (``use_gqa_in_sdpa`` false: ``repeat_kv``, a mask
    copy per layer): a real bf16 step of transformers' Llama on the CPU saves, padded against unpadded,
    exactly what the engine's lines add for ``--lengths varying`` (fake tensors cannot take the padded
    mask's ``all()`` test, so this one is a real step)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = {**MISTRAL, "model_type": "llama", "num_hidden_layers": 2, "sliding_window": None}
    config = transformers.LlamaConfig(
        **{k: v for k, v in cfg.items() if k not in ("model_type", "sliding_window")}
    )
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).train()
    b, s = 2, 128
    ids = torch.randint(0, cfg["vocab_size"], (b, s))
    full = torch.ones(b, s, dtype=torch.long)
    padded = full.clone()
    padded[1, -10:] = 0
    measured = saved_bytes(model, input_ids=ids, attention_mask=padded, labels=ids) - saved_bytes(
        model, input_ids=ids, attention_mask=full, labels=ids
    )

    varying, fixed = (
        LlmSetup(method="full", precision="bf16", trainer="hf", seq_len=s, batch_size=b, lengths=lengths)
        for lengths in ("varying", "fixed")
    )
    assert measured > 0
    assert forward_lines(_spec(cfg), varying) - forward_lines(_spec(cfg), fixed) == measured


# --- what the user is told ----------------------------------------------------------------------------


def test_a_windowed_run_is_warned_and_offered_flash() -> None:
    """The estimate says which layers take a mask and what it costs; the verdict's remedies include
    FlashAttention-2 (which applies the window itself), and it saves what the masks cost."""
    from fitcheck.engine.verdict import candidate_changes

    arch, setup = _arch(MISTRAL), _setup()
    est = estimate(_spec(MISTRAL), setup)
    assert any("sliding window, SDPA gets a mask in 4 of 4 layers" in w for w in est.warnings)
    flags = {flag: s for _, flag, s in candidate_changes(setup, arch)}
    flash = estimate(_spec(MISTRAL), flags["--attn flash"])
    assert not any(c.name == "attention_mask_copies" for c in flash.phase(flash.peak_phase).components)
    assert flash.device_bytes < est.device_bytes


@pytest.mark.parametrize(
    ("change", "offered", "warned"),
    [
        ({"seq_len": 48}, False, False),  # under the window: no mask
        ({"precision": "fp32"}, False, True),  # the masks are there; FlashAttention-2 refuses fp32
        ({"attn": "flash"}, False, False),
        ({"seq_len": 48, "lengths": "varying"}, True, False),  # a padded batch's mask, no window's
    ],
)
def test_flash_is_offered_only_where_sdpa_gets_a_mask(
    change: dict[str, Any], offered: bool, warned: bool
) -> None:
    from fitcheck.engine.verdict import candidate_changes

    setup = _setup(**change)
    assert ("--attn flash" in {flag for _, flag, _ in candidate_changes(setup, _arch(MISTRAL))}) == offered
    assert any("sliding window" in w for w in estimate(_spec(MISTRAL), setup).warnings) == warned
