"""SDPA's own copy of an explicit attention mask, one per layer (engine/activations.py
``sdpa_mask_copy_bytes``; docs/methodology.md#attention-mask-copies): the engine's rule, and the mechanism
checked on a real CPU step of transformers + torch (a padded batch; prefix tuning's longer keys)."""

from __future__ import annotations

import pytest

from fitcheck.engine import activations as act
from fitcheck.engine.estimate import estimate, saved_activations
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.resolve import resolve_model

PADDED: dict[str, object] = {
    "lengths": "varying",
    "batch_size": 4,
    "seq_len": 1000,
    "trainer": "hf",
    "method": "lora",
}
Saved = list[tuple[tuple[int, ...], object, int]]


def _spec() -> ModelSpec:
    spec = resolve_model("llama-3.2-1b")
    assert isinstance(spec, ModelSpec)
    return spec


def _line(setup: LlmSetup, name: str = "attention_mask_copies") -> int:
    est = estimate(_spec(), setup)
    return sum(c.bytes for c in est.phase(est.peak_phase).components if c.name == name)


def test_a_padded_batch_keeps_one_mask_copy_per_layer() -> None:
    """b x s x align16(s) in the compute dtype, every layer: 1000 keys pad to 1008."""
    spec = _spec()
    assert _line(LlmSetup.model_validate(PADDED)) == spec.arch.num_layers * 4 * 1000 * 1008 * 2


@pytest.mark.parametrize(
    "change",
    [
        {"lengths": "fixed"},  # packed or unpadded: is_causal, no mask
        {"batch_size": 1},  # a batch of one is never padded
        {"attn": "flash"},  # FlashAttention-2 unpads
        {"attn": "eager"},  # one shared mask (attention_mask), scores instead
        {"trainer": "unsloth"},  # its own attention
    ],
)
def test_no_copies_without_an_explicit_mask_through_sdpa(change: dict[str, object]) -> None:
    assert _line(LlmSetup.model_validate({**PADDED, **change})) == 0


def test_checkpointing_keeps_one_layer_copy_in_the_recompute() -> None:
    """With checkpointing the copies are made again in the recompute, one layer at a time."""
    spec = _spec()
    ckpt = LlmSetup.model_validate({**PADDED, "grad_ckpt": True})
    per_tok = act.layer_activations(spec.arch, ckpt, regime_for(ckpt)).parts[act.MASK_COPY]
    assert per_tok == 1008 * 2
    assert _line(ckpt) == 0  # no line of its own: inside the one recomputed layer

    plain = ckpt.model_copy(update={"lengths": "fixed"})
    late = [saved_activations(spec, s, regime_for(s)).late.bytes for s in (ckpt, plain)]
    # the recomputed layer's copy, and its K/V expanded to every head by the mask's repeat_kv (32 query
    # heads over 8 K/V heads of 64: tests/test_sliding_window.py holds the expansion against a real step)
    a = spec.arch
    expanded = 2 * (a.num_heads - a.num_kv_heads) * a.head_dim * 2
    assert late[0] - late[1] == 4 * 1000 * (1008 * 2 + expanded)


def test_prefix_tuning_keys_get_the_copies_at_any_batch() -> None:
    setup = LlmSetup(method="prefix-tuning", prefix_tokens=24, trainer="hf", batch_size=1, seq_len=1000)
    assert _line(setup) == _spec().arch.num_layers * 1000 * 1024 * 2


def _saved_masks(model: object, ids: object, mask: object | None) -> Saved:
    torch = pytest.importorskip("torch")
    saved: Saved = []

    def pack(t: object) -> object:
        shape = tuple(t.shape)  # type: ignore[attr-defined]
        if len(shape) == 4 and shape[1] == 1 and shape[-1] == shape[-2]:  # b x 1 x s x s
            saved.append((shape, t.dtype, t.untyped_storage().data_ptr()))  # type: ignore[attr-defined]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(input_ids=ids, attention_mask=mask, labels=ids)  # type: ignore[operator]
    return saved


def test_real_step_saves_a_mask_copy_per_layer_only_when_padded() -> None:
    """transformers' SDPA path on a real CPU step: a padded batch hands SDPA a boolean mask, which torch
    converts to the query's dtype in every layer and the kernel saves; an unpadded batch gets none."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=128, attn_implementation="sdpa",
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).train()
    ids = torch.randint(0, 128, (4, 40))
    padded = torch.ones(4, 40, dtype=torch.long)
    padded[1, 30:] = 0
    copies = _saved_masks(model, ids, padded)
    assert [(s, d) for s, d, _ in copies] == [((4, 1, 40, 40), torch.bfloat16)] * 3
    assert len({p for _, _, p in copies}) == 3  # one storage per layer, not one shared mask
    assert _saved_masks(model, ids, torch.ones(4, 40, dtype=torch.long)) == []
