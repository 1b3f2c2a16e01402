"""The diffusion engine against traced peaks of real diffusers UNets (tests/data/calibration/diffusion).

The UNet records come from ``bench/calibrate_diffusion.py``: a kohya-style step of
``diffusers.UNet2DConditionModel`` built from the preset's published config, traced on fake
tensors (exact storage bytes). The ``kohya_*`` records come from ``bench/calibrate_kohya_dit.py``:
the same step of sd-scripts' own FLUX.1 and SD 3.5 models (the layout the DiT estimates follow).
The engine must agree within 3% on the allocated peak, and on each phase's peak, for every record.
One small record is re-traced here (when diffusers is installed) so that a change in torch or
diffusers that moves the reference shows up as a failure.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.diffusion.estimate import estimate_diffusion
from fitcheck.diffusion.sources import spec_from_preset
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.models import DiffusionSetup

DIR = Path(__file__).parent / "data" / "calibration" / "diffusion"
RECORDS = sorted(DIR.glob("*.json"))
TOLERANCE = 0.03


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text(encoding="utf-8"))


def denoiser_only(model: str) -> DiffusionSpec:
    """The records trace the denoiser's step (latents and text-encoder outputs cached)."""
    spec = spec_from_preset(model)
    return spec.model_copy(update={"parts": (spec.denoiser,)})


def test_grid_covers_the_acceptance() -> None:
    """SD 1.5 and SDXL, two resolutions each, eager and SDPA; and every DiT preset family."""
    seen = {
        (r["model"], r["setup"].get("resolution"), r["setup"].get("attn", "sdpa")) for r in map(load, RECORDS)
    }
    for model, resolutions in (("sd15", (512, 768)), ("sdxl", (768, 1024))):
        for res in resolutions:
            for attn in ("eager", "sdpa"):
                assert (model, res, attn) in seen, (model, res, attn)
    models = {m for m, _, _ in seen}
    assert {"flux.1-dev", "flux.1-schnell", "sd35-medium", "sd35-large", "sd21"} <= models


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_record_provenance(path: Path) -> None:
    rec = load(path)
    assert rec["name"] == path.stem
    kohya = rec["name"].startswith("kohya_")
    script = "bench/calibrate_kohya_dit.py" if kohya else "bench/calibrate_diffusion.py"
    assert script in rec["command"]
    for tool in ("torch", "python", "sd-scripts" if kohya else "diffusers"):
        assert tool in rec["tool_versions"], tool
    site = "https://github.com/kohya-ss/sd-scripts/blob/" if kohya else "https://huggingface.co/"
    assert rec["config_source"].startswith(site)
    for phase in rec["traced"]["phases"]:
        assert sum(phase["breakdown"].values()) == phase["peak_bytes"]


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.stem)
def test_engine_agrees_with_the_trace(path: Path) -> None:
    rec = load(path)
    est = estimate_diffusion(denoiser_only(rec["model"]), DiffusionSetup(**rec["setup"]))
    traced = rec["traced"]
    err = est.peak_allocated_bytes / traced["peak_allocated_bytes"] - 1
    assert abs(err) <= TOLERANCE, (
        f"peak: engine {est.peak_allocated_bytes:,} vs trace {traced['peak_allocated_bytes']:,}"
    )
    for phase in traced["phases"]:
        ours = est.phase(phase["name"]).total_bytes
        assert abs(ours / phase["peak_bytes"] - 1) <= TOLERANCE, phase["name"]
    assert est.params.trainable == traced["trainable_params"]


@pytest.mark.slow
def test_retrace_one_record() -> None:
    """The reference itself: re-trace the smallest record and get the same bytes."""
    pytest.importorskip("diffusers")
    pytest.importorskip("torch")
    from fitcheck.measure.diffusion import trace_denoiser_step

    rec = load(DIR / "sd15_512px_sdpa_lora_r16_adamw_ckpt_b1.json")
    step = trace_denoiser_step(denoiser_only("sd15"), DiffusionSetup(**rec["setup"]))
    assert step.peak_allocated_bytes == rec["traced"]["peak_allocated_bytes"]
