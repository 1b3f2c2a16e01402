"""The symbolic-batch step (``fitcheck.diffusion.sim.line``) equals direct simulation, batch by batch."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck.diffusion.sim.line import Lin, NotLinear
from fitcheck.diffusion.sources import spec_from_preset
from fitcheck.diffusion.step import _line, _line_at, _run, _spec_json, step_key
from fitcheck.models import DiffusionSetup

SMALL = {"cache_latents": True, "resolution": 256}


@pytest.mark.parametrize(
    ("preset", "fields"),
    [
        ("sd15", {"grad_ckpt": True}),
        ("sd15", {"train_text_encoder": True, "lora_targets": "conv", "grad_accum": 2}),
        ("sd15", {"method": "full", "precision": "fp16", "full_fp16": True, "cache_latents": False}),
        ("sdxl", {"fp8_base": True, "cache_text_encoder_outputs": True}),
        ("sd35-medium", {"grad_ckpt": True, "cache_text_encoder_outputs": True}),
        ("flux.1-schnell", {"cache_text_encoder_outputs": True, "attn": "eager"}),
    ],
)
def test_line_equals_direct_simulation(preset: str, fields: dict[str, object]) -> None:
    spec = spec_from_preset(preset)
    base = DiffusionSetup(trainer="kohya", **{**SMALL, **fields})
    sj = _spec_json(spec)
    family = tuple(kv for kv in step_key(spec, base) if kv[0] != "batch_size")
    through_one = _line(sj, family, 1) is not None
    if fields.get("attn") == "eager":
        assert not through_one  # head_to_batch_dim is a view only at b == 1: no line through it
    assert _line(sj, family, 2) is not None  # every supported step is linear from batch 2 on
    for b in (1, 2, 3, 5):
        direct = _run(spec, base.model_copy(update={"batch_size": b}))
        if b == 1 and not through_one:
            continue
        got = _line_at(sj, family, 1 if through_one else 2, b)
        assert dataclasses.asdict(got) == dataclasses.asdict(direct), b


def _value(x: int | Lin, b: int) -> int:
    return x.at(b) if isinstance(x, Lin) else x


lins = st.builds(Lin, st.integers(-50, 50), st.integers(-5, 5).filter(bool), st.integers(1, 3))


@given(lins, st.one_of(lins, st.integers(-50, 50)))
def test_lin_answers_only_what_holds_for_every_batch(a: Lin, o: int | Lin) -> None:
    """A comparison either holds (or fails) at every batch of the domain, or raises NotLinear."""
    lo = max(a.lo, o.lo) if isinstance(o, Lin) else a.lo
    batches = range(lo, lo + 200)
    signs = {(d > 0) - (d < 0) for d in (a.at(b) - _value(o, b) for b in batches)}
    for op in ("__lt__", "__le__", "__eq__", "__ne__", "__gt__", "__ge__"):
        truth = {getattr(a.at(b), op)(_value(o, b)) for b in batches}
        try:
            got = getattr(a, op)(o)
        except NotLinear:
            assert len(signs) > 1, (a, op, o)  # refused only where the sign changes with b
            continue
        assert truth == {got}, (a, op, o)
    for b in batches:
        assert _value(a + o, b) == a.at(b) + _value(o, b)
        assert _value(a * 3, b) == 3 * a.at(b)


def test_nonlinear_sizes_are_refused() -> None:
    b = Lin(0, 1, 1)
    with pytest.raises(NotLinear):
        b * b
    with pytest.raises(NotLinear):
        b // 2
    with pytest.raises(NotLinear):
        range(b)  # type: ignore[call-overload]
    assert (b * 4) // 2 == Lin(0, 2, 1) and b * 0 == 0
