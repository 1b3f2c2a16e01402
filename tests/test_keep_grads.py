"""--keep-grads: a loop that zeroes gradients in place (``zero_grad(set_to_none=False)``, torch < 2.0's
default, pytorch#92731) keeps every gradient allocated beside the next step's activations."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from fitcheck import api
from fitcheck.engine.estimate import estimate
from fitcheck.errors import OptionError
from fitcheck.models import Estimate, LlmSetup
from fitcheck.sources.resolve import spec_from_config

CFG: dict[str, Any] = {"model_type": "llama", "hidden_size": 512, "intermediate_size": 1376,
                       "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
                       "vocab_size": 32000}  # fmt: skip


def _est(**kw: Any) -> Estimate:
    return estimate(spec_from_config(dict(CFG), id="t", name="t", source="test"), LlmSetup(**kw))


def _grads(est: Estimate, phase: str) -> int:
    return sum(c.bytes for c in est.phase(phase).components if c.name == "gradients")


@pytest.mark.parametrize("method", ["full", "lora"])
def test_kept_gradients_sit_beside_the_activations(method: str) -> None:
    kw: dict[str, Any] = {"method": method, "seq_len": 256, "batch_size": 2, "trainer": "hf"}
    plain, kept = _est(**kw), _est(keep_grads=True, **kw)
    every = _grads(_est(grad_accum=2, **kw), "forward")  # accumulation holds them all already
    assert every > 0 and _grads(plain, "forward") == 0
    assert _grads(kept, "forward") == every
    assert kept.phase("forward").total_bytes == plain.phase("forward").total_bytes + every
    assert kept.phase("optimizer_step").total_bytes == plain.phase("optimizer_step").total_bytes
    # with accumulation the gradients are there already: nothing more
    acc = _est(grad_accum=4, **kw)
    assert _est(grad_accum=4, keep_grads=True, **kw).peak_allocated_bytes == acc.peak_allocated_bytes


@pytest.mark.parametrize("method", ["full", "lora"])
def test_kept_gradients_match_the_traced_step(method: str) -> None:
    """The fake-device tracer runs the loop with ``optimizer.zero_grad(set_to_none=False)``: PyTorch's
    own zeroing in place, whose gradients the engine must count at each phase's peak."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitcheck.measure.trace import trace_step

    setup = LlmSetup(method=method, seq_len=256, batch_size=2, trainer="hf", keep_grads=True)
    est = estimate(spec_from_config(dict(CFG), id="t", name="t", source="test"), setup)
    traced = {p.name: p.peak_bytes for p in trace_step(dict(CFG), setup, steps=2).phases}
    for phase in ("forward", "backward", "optimizer_step"):
        got, want = est.phase(phase).total_bytes, traced[phase]
        assert abs(got - want) <= 0.01 * want, (phase, got, want)


@pytest.mark.parametrize(
    "kw",
    [
        {"gpus": 2},
        {"strategy": "zero2"},
        {"offload": "optimizer", "strategy": "zero2"},
        {"optimizer_in_bwd": True, "trainer": "torchtune"},
    ],
)
def test_refused_where_not_modelled(kw: dict[str, Any]) -> None:
    with pytest.raises(OptionError, match="--keep-grads"):
        _est(method="full", keep_grads=True, **kw)


def test_library_and_cli() -> None:
    est = api.estimate("llama-3.2-1b", method="full", keep_grads=True, on="24GB")
    assert est.setup.keep_grads
    with pytest.raises(OptionError, match="keep_grads"):
        api.plan("llama-3.2-1b", on="24GB", keep_grads=True)  # type: ignore[call-arg]
    run = [sys.executable, "-m", "fitcheck"]
    args = ["estimate", "llama-3.2-1b", "--method", "full", "--keep-grads", "--on", "24GB", "-f", "json"]
    out = subprocess.run([*run, *args], capture_output=True, text=True, check=False)
    assert out.returncode in (0, 1), out.stderr
    assert json.loads(out.stdout)["setup"]["keep_grads"] is True
    table = subprocess.run([*run, *args[:-2]], capture_output=True, text=True, check=False)
    assert "gradients kept between steps" in " ".join(table.stdout.split())  # the caption may wrap
    bad = subprocess.run([*run, "plan", "llama-3.2-1b", "--on", "24GB", "--keep-grads"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
    # diffusion too since session 12 (the PEFT README's DreamBooth run): counted, and in the JSON setup
    diff = subprocess.run([*run, "estimate", "sdxl", "--on", "24GB", "--keep-grads", "-f", "json"],
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert diff.returncode in (0, 1), diff.stderr
    assert json.loads(diff.stdout)["setup"]["keep_grads"] is True
    bad = subprocess.run([*run, "plan", "sdxl", "--on", "24GB", "--keep-grads"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("kw", [{"grad_accum": 2}, {"keep_grads": True}])
def test_tied_embedding_sum_beside_kept_gradients(kw: dict[str, Any]) -> None:
    """A tied embedding's two gradients and their sum coexist at the end of backward; where the gradients
    are already there the sum is a third tensor beside them, added into ``.grad`` after (traced)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitcheck.measure.trace import trace_step

    cfg = {**CFG, "num_hidden_layers": 2, "vocab_size": 128256, "tie_word_embeddings": True}
    setup = LlmSetup(method="full", seq_len=32, batch_size=1, trainer="hf", **kw)
    est = estimate(spec_from_config(dict(cfg), id="t", name="t", source="test"), setup)
    traced = {p.name: p.peak_bytes for p in trace_step(dict(cfg), setup, steps=2).phases}
    got, want = est.phase("backward").total_bytes, traced["backward"]
    assert abs(got - want) <= 0.01 * want, (got, want)


def test_diffusion_keep_grads_matches_the_trace() -> None:
    """``--keep-grads`` for a diffusion model (session 12: the PEFT README's DreamBooth full fine-tuning ran
    torch 1.13's in-place ``zero_grad()``): every trained parameter's gradient sits beside the next step's
    forward, as under accumulation; the traced diffusers UNet (``zero_grad(set_to_none=False)``) agrees with
    the estimate on every phase, and the forward grows by the gradients."""
    pytest.importorskip("diffusers")
    from fitcheck.diffusion.estimate import estimate_diffusion
    from fitcheck.measure.diffusion import trace_denoiser_step
    from fitcheck.models import DiffusionSetup
    from test_diffusion_calibration import denoiser_only

    spec = denoiser_only("sd15")
    kept = DiffusionSetup(method="full", resolution=256, batch_size=1, attn="sdpa", keep_grads=True)
    step = trace_denoiser_step(spec, kept)
    est = estimate_diffusion(spec, kept)
    for phase in step.phases:
        assert abs(est.phase(phase.name).total_bytes / phase.peak_bytes - 1) <= 0.01, phase.name
    freed = estimate_diffusion(spec, kept.model_copy(update={"keep_grads": False}))
    grads = next(c.bytes for c in est.phase("optimizer_step").components if c.name == "gradients")
    assert est.phase("forward").total_bytes - freed.phase("forward").total_bytes == grads
