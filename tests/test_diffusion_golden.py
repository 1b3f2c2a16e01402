"""Golden diffusion plans and estimates: what the simulator and planner answer, byte for byte.

Written before the simulator and planner were made fast (issue #9, item 7), so a speed-up that
changes an answer fails here. The cases span every family (sd15, sd21, sdxl, sd35, flux), LoRA
(linear and conv) and full training, resolutions, caching, checkpointing, eager attention, fp8
base, full_bf16, gradient accumulation, trained text encoders, and the plans' step-down and
nothing-fits paths.

Regenerate with ``FITCHECK_UPDATE_GOLDEN=1 pytest tests/test_diffusion_golden.py`` only after a
deliberate change of an answer (and say which in the commit).
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from diffusion_plans import plan
from fitcheck.diffusion.estimate import estimate_diffusion
from fitcheck.diffusion.plan import images_per_second
from fitcheck.diffusion.sources import spec_from_preset
from fitcheck.diffusion.step import simulate
from fitcheck.models import DiffusionSetup

GOLDEN = Path(__file__).parent / "golden" / "diffusion"

#: name -> (preset, setup fields)
ESTIMATES: dict[str, tuple[str, dict[str, Any]]] = {
    "sd15-lora-512": ("sd15", {}),
    "sd15-lora-768-b4-eager": ("sd15", {"resolution": 768, "batch_size": 4, "attn": "eager"}),
    "sd15-full-fp32-ckpt": ("sd15", {"method": "full", "precision": "fp32", "grad_ckpt": True}),
    "sd15-lora-te-conv-accum": (
        "sd15",
        {"train_text_encoder": True, "lora_targets": "conv", "grad_accum": 4, "batch_size": 2},
    ),
    "sd15-lora-mps-eager": ("sd15", {"backend": "mps", "resolution": 640}),
    "sd21-lora-fp16": ("sd21", {"precision": "fp16", "cache_latents": True}),
    "sdxl-lora-1024": ("sdxl", {}),
    "sdxl-lora-cached-ckpt-b2": (
        "sdxl",
        {"cache_latents": True, "cache_text_encoder_outputs": True, "grad_ckpt": True, "batch_size": 2},
    ),
    "sdxl-lora-fp8-ckpt": ("sdxl", {"fp8_base": True, "grad_ckpt": True, "cache_latents": True}),
    "sdxl-full-bf16-ckpt-adafactor": (
        "sdxl",
        {
            "method": "full",
            "full_bf16": True,
            "grad_ckpt": True,
            "optimizer": "adafactor",
            "cache_latents": True,
        },
    ),
    "sdxl-full-accum": (
        "sdxl",
        {"method": "full", "grad_accum": 2, "cache_latents": True, "resolution": 768},
    ),
    "sdxl-lora-te": ("sdxl", {"train_text_encoder": True, "grad_ckpt": True, "resolution": 896}),
    "sd35-medium-lora": ("sd35-medium", {"cache_latents": True, "cache_text_encoder_outputs": True}),
    "sd35-large-lora-ckpt": (
        "sd35-large",
        {
            "grad_ckpt": True,
            "cache_latents": True,
            "cache_text_encoder_outputs": True,
            "optimizer": "adamw8bit",
        },
    ),
    "sd35-medium-full-ckpt": ("sd35-medium", {"method": "full", "grad_ckpt": True, "cache_latents": True}),
    "flux-dev-lora-fp8-ckpt": (
        "flux.1-dev",
        {"fp8_base": True, "grad_ckpt": True, "cache_latents": True, "cache_text_encoder_outputs": True},
    ),
    "flux-dev-lora-512-b2": ("flux.1-dev", {"resolution": 512, "batch_size": 2, "cache_latents": True}),
    "flux-schnell-lora-eager": ("flux.1-schnell", {"attn": "eager", "resolution": 512, "grad_ckpt": True}),
}

#: name -> (preset, target, setup fields, min_resolution); tests/test_diffusion_plan.py checks
#: several of the same plans' properties (tests/diffusion_plans.py computes each once).
PLANS: dict[str, tuple[str, str, dict[str, Any], int | None]] = {
    "sdxl-rtx-3060-12gb": ("sdxl", "rtx-3060-12gb", {}, None),
    "sdxl-full-a100-80gb-eff16": (
        "sdxl",
        "a100-sxm4-80gb",
        {"method": "full", "batch_size": 1, "grad_accum": 16},
        None,
    ),
    "sdxl-te-conv-rtx-4090": ("sdxl", "rtx-4090", {"train_text_encoder": True, "lora_targets": "conv"}, None),
    "flux-dev-rtx-4090": ("flux.1-dev", "rtx-4090", {}, None),
    "flux-dev-8gb-nothing-fits": ("flux.1-dev", "8GB", {}, 512),
    "sd15-mac-xformers": ("sd15", "apple-m3-max-36gb", {"attn": "xformers"}, None),
    "sd15-full-8gb-step-down": ("sd15", "8GB", {"method": "full", "resolution": 1024}, 512),
    "sd21-rtx-3060-8gb": ("sd21", "rtx-3060-8gb", {"resolution": 768}, None),
    "sd35-large-rtx-4090": ("sd35-large", "rtx-4090", {}, None),
    "sd35-medium-full-h100": ("sd35-medium", "h100-sxm5-80gb", {"method": "full"}, None),
}


def estimate_doc(preset: str, fields: dict[str, Any]) -> dict[str, Any]:
    spec = spec_from_preset(preset)
    setup = DiffusionSetup(trainer="kohya", **fields)
    est = estimate_diffusion(spec, setup, None)
    step = simulate(spec, est.setup)
    return {
        "estimate": est.model_dump(mode="json"),
        "step": dataclasses.asdict(step),
        "images_per_second_a100": images_per_second(spec, est.setup, 312.0, 2039.0),
    }


def plan_doc(preset: str, on: str, fields: dict[str, Any], floor: int | None) -> dict[str, Any]:
    return plan(preset, on, fields, floor).model_dump(mode="json")


def _check(path: Path, doc: dict[str, Any]) -> None:
    text = json.dumps(doc, indent=1, sort_keys=True) + "\n"
    if os.environ.get("FITCHECK_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{path.name} changed; see this module's docstring"


@pytest.mark.parametrize("name", sorted(ESTIMATES))
def test_estimate_unchanged(name: str) -> None:
    _check(GOLDEN / "estimates" / f"{name}.json", estimate_doc(*ESTIMATES[name]))


#: Plans that search many setups (every resolution down to 512 px, or trained text encoders).
SLOW = ("flux-dev-8gb-nothing-fits", "sdxl-te-conv-rtx-4090")


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW else n for n in sorted(PLANS)]
)
def test_plan_unchanged(name: str) -> None:
    _check(GOLDEN / "plans" / f"{name}.json", plan_doc(*PLANS[name]))
