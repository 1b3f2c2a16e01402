"""Architectures by the class name a component's config declares (``_class_name`` / ``architectures``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fitcheck.diffusion.arch.flux import Flux
from fitcheck.diffusion.arch.mmdit import MMDiT
from fitcheck.diffusion.arch.text import CLIPTextModel, T5EncoderModel
from fitcheck.diffusion.arch.unet import UNet2DConditionModel
from fitcheck.diffusion.arch.vae import AutoencoderKL
from fitcheck.diffusion.sim.nn import Module

#: class name -> builder; the keys are the diffusers/transformers classes whose configs we read.
BUILDERS: dict[str, Callable[[Mapping[str, Any]], Module]] = {
    "UNet2DConditionModel": UNet2DConditionModel,
    "SD3Transformer2DModel": MMDiT,
    "FluxTransformer2DModel": Flux,
    "AutoencoderKL": AutoencoderKL,
    "CLIPTextModel": lambda cfg: CLIPTextModel(cfg, projection=False),
    "CLIPTextModelWithProjection": lambda cfg: CLIPTextModel(cfg, projection=True),
    "T5EncoderModel": T5EncoderModel,
}


def build(class_name: str, config: Mapping[str, Any]) -> Module:
    """The module tree of one component; ``KeyError`` for a class fitcheck does not model."""
    return BUILDERS[class_name](config)
