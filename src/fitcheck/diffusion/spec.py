"""What fitcheck knows about a diffusion model: its parts, their configs, sources and exact counts."""

from __future__ import annotations

import functools
from typing import Any, Literal

from pydantic import Field, model_validator

from fitcheck.models import Frozen

Family = Literal["sd1", "sd2", "sdxl", "sd3", "flux"]
Role = Literal["denoiser", "text_encoder", "vae"]
FAMILIES: tuple[str, ...] = Family.__args__  # type: ignore[attr-defined]

#: Text tokens each family's denoiser attends to in kohya sd-scripts (defaults of its scripts):
#: CLIP 75 + BOS/EOS (max_token_length unset); SD3 77 CLIP + 256 T5 (t5xxl_max_token_length
#: default 256); FLUX.1 dev 512 T5 tokens, schnell 256 (flux_train_network.py defaults).
TEXT_TOKENS: dict[str, int] = {
    "sd1": 77,
    "sd2": 77,
    "sdxl": 77,
    "sd3": 77 + 256,
    "flux": 512,
    "flux-schnell": 256,
}


class PartSpec(Frozen):
    """One component of a pipeline (``model_index.json`` entry): its class, config and counts."""

    name: str = Field(description="the pipeline's component name: unet, transformer, text_encoder_2, vae")
    role: Role
    class_name: str = Field(description="diffusers/transformers class the config is for")
    config: dict[str, Any]
    source: str | None = Field(default=None, description="where the config comes from (URL or path)")
    params: int = Field(ge=0, description="exact parameter count derived from the architecture")
    buffers: int = Field(default=0, ge=0, description="non-parameter tensors stored with the weights")
    declared_params: int | None = Field(default=None, description="published or header-exact count")
    stored_dtype: str | None = Field(default=None, description="dtype in the checkpoint header, if read")


class DiffusionSpec(Frozen):
    """A diffusion pipeline as the estimate sees it."""

    id: str
    name: str
    family: Family
    source_kind: Literal["preset", "diffusers_folder", "single_file"]
    hf_id: str | None = None
    source: str | None = None
    native_resolution: int = Field(gt=0)
    text_tokens: int = Field(gt=0)
    parts: tuple[PartSpec, ...]
    notes: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _one_denoiser(self) -> DiffusionSpec:
        if sum(p.role == "denoiser" for p in self.parts) != 1:
            raise ValueError("a diffusion model has exactly one denoiser (unet or transformer)")
        return self

    @property
    def denoiser(self) -> PartSpec:
        return next(p for p in self.parts if p.role == "denoiser")

    @property
    def text_encoders(self) -> tuple[PartSpec, ...]:
        return tuple(p for p in self.parts if p.role == "text_encoder")

    @property
    def vae(self) -> PartSpec | None:
        return next((p for p in self.parts if p.role == "vae"), None)

    @property
    def total_params(self) -> int:
        return sum(p.params for p in self.parts)

    @property
    def is_dit(self) -> bool:
        return self.family in ("sd3", "flux")


@functools.lru_cache(maxsize=64)
def _count(class_name: str, config_key: str) -> tuple[int, int]:
    import json

    from fitcheck.diffusion.arch import build

    mod = build(class_name, json.loads(config_key))
    return mod.numel(), mod.buffer_numel()


def count_part(class_name: str, config: dict[str, Any]) -> tuple[int, int]:
    """(parameters, buffers) of a component, from its architecture (cached per config)."""
    import json

    return _count(class_name, json.dumps(config, sort_keys=True))
