"""Where a diffusion model comes from: a preset, a local diffusers folder, or a single-file checkpoint.

* preset: ``presets/diffusion/<id>.yaml`` (each part's published config and its source);
* diffusers folder: ``model_index.json`` names the pipeline and its components; each component's
  ``config.json`` is read from its subfolder (weights are never needed);
* single file (``*.safetensors``, as kohya and ComfyUI load them): only the header is read; the
  family is recognised from tensor names, each part's exact parameter count and stored dtype come
  from the header, and the architecture from the family's preset (a count that disagrees with the
  preset's is reported).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from fitcheck.diffusion.spec import TEXT_TOKENS, DiffusionSpec, PartSpec, count_part
from fitcheck.errors import ModelSourceError
from fitcheck.fileio import user_path
from fitcheck.presets import load_preset, preset_ids

KIND = "diffusion"
#: Pipeline classes (``model_index.json`` ``_class_name``) -> family.
PIPELINES = {
    "StableDiffusionPipeline": "sd1",
    "StableDiffusionXLPipeline": "sdxl",
    "StableDiffusion3Pipeline": "sd3",
    "FluxPipeline": "flux",
}
ROLES = {"unet": "denoiser", "transformer": "denoiser", "vae": "vae"}
#: Components that are not networks with weights we count (tokenizers, schedulers, ...).
SKIP = (
    "tokenizer",
    "tokenizer_2",
    "tokenizer_3",
    "scheduler",
    "feature_extractor",
    "safety_checker",
    "image_encoder",
)


def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for pid in preset_ids(KIND):
        for alias in load_preset(KIND, pid).get("aliases", []) or []:
            out[str(alias).lower()] = pid
    return out


def diffusion_ids() -> list[str]:
    """Ids of the diffusion presets."""
    return preset_ids(KIND)


def spec_from_preset(preset_id: str) -> DiffusionSpec:
    """A diffusion preset by id or alias."""
    pid = preset_id.lower()
    if pid not in diffusion_ids():
        pid = _aliases().get(pid, pid)
    data = load_preset(KIND, pid)
    parts = tuple(
        _part(name, p["class"], p["config"], p.get("source"), p.get("role"), p.get("params"))
        for name, p in data["parts"].items()
    )
    return DiffusionSpec(
        id=data["id"],
        name=data.get("name", data["id"]),
        family=data["family"],
        source_kind="preset",
        hf_id=data.get("hf_id"),
        source=data.get("source"),
        native_resolution=int(data["native_resolution"]),
        text_tokens=int(data.get("text_tokens") or TEXT_TOKENS[data["family"]]),
        parts=parts,
    )


def _part(
    name: str,
    class_name: str,
    config: dict[str, Any],
    source: str | None,
    role: str | None = None,
    declared: int | None = None,
) -> PartSpec:
    from fitcheck.diffusion.arch import BUILDERS
    from fitcheck.diffusion.bounds import check_component, check_shapes

    if class_name not in BUILDERS:
        raise ModelSourceError(f"component {name}: class {class_name} is not modelled by fitcheck")
    check_component(name, config)
    check_shapes(name, class_name, config)
    try:
        n, buffers = count_part(class_name, config)
    except (LookupError, ValueError, TypeError, ArithmeticError) as exc:  # a key missing, a value of no use
        raise ModelSourceError(
            f"component {name}: its config.json is not a {class_name} fitcheck can read "
            f"({type(exc).__name__}: {str(exc)[:80]})"
        ) from None
    if n < 1 or buffers < 0:
        raise ModelSourceError(
            f"component {name}: its config.json describes no {class_name} ({n:,} parameters)"
        )
    return PartSpec(
        name=name,
        role=role or ROLES.get(name, "text_encoder"),  # type: ignore[arg-type]
        class_name=class_name,
        config=dict(config),
        source=source,
        params=n,
        buffers=buffers,
        declared_params=declared,
    )


# --- diffusers folder ----------------------------------------------------------------------------


def spec_from_folder(folder: Path) -> DiffusionSpec:
    """A local diffusers pipeline folder (``model_index.json`` + component ``config.json`` files)."""
    from fitcheck.sources.resolve import read_config

    index = read_config(folder / "model_index.json")
    pipeline = str(index.get("_class_name", ""))
    if pipeline not in PIPELINES:
        raise ModelSourceError(
            f"{folder}: pipeline {pipeline or '(none)'} is not supported; fitcheck models "
            + ", ".join(PIPELINES)
        )
    parts = []
    for name, value in index.items():
        if name.startswith("_") or name in SKIP or not isinstance(value, list) or value[1] is None:
            continue
        cfg_path = folder / name / "config.json"
        if not cfg_path.exists():
            raise ModelSourceError(f"{folder}: component {name} has no {name}/config.json")
        cfg = read_config(cfg_path)
        parts.append(_part(name, str(value[1]), cfg, str(cfg_path)))
    family = PIPELINES[pipeline]
    den = next((p for p in parts if p.role == "denoiser"), None)
    if den is None:
        raise ModelSourceError(f"{folder}: no unet or transformer component")
    if family == "sd1" and int(den.config.get("cross_attention_dim", 768)) == 1024:
        family = "sd2"
    tokens = TEXT_TOKENS[family]
    if family == "flux" and not den.config.get("guidance_embeds", False):
        tokens = TEXT_TOKENS["flux-schnell"]
    native = 8 * int(den.config.get("sample_size") or 64) if family in ("sd1", "sd2", "sdxl") else 1024
    return DiffusionSpec(
        id=str(folder),
        name=str(index.get("_name_or_path") or folder.absolute().name or str(folder)),
        family=family,  # type: ignore[arg-type]
        source_kind="diffusers_folder",
        source=str(folder / "model_index.json"),
        native_resolution=native,
        text_tokens=tokens,
        parts=tuple(parts),
    )


# --- single-file checkpoint ------------------------------------------------------------------------

#: (family, preset, tensor-name test) in the order they are tried; the first match wins.
SIGNATURES: tuple[tuple[str, str, str], ...] = (
    ("flux", "flux.1-dev", "double_blocks.0.img_attn.qkv.weight"),
    ("sd3", "sd35-large", "joint_blocks.0.x_block.attn.qkv.weight"),
    ("sdxl", "sdxl", "conditioner.embedders.1.model.transformer.resblocks.0.attn.in_proj_weight"),
    ("sdxl", "sdxl", "model.diffusion_model.label_emb.0.0.weight"),
    ("sd2", "sd21", "cond_stage_model.model.transformer.resblocks.0.attn.in_proj_weight"),
    ("sd1", "sd15", "model.diffusion_model.input_blocks.0.0.weight"),
)
#: Tensor-name prefixes of each part in the original (ldm / sgm / BFL / SAI) layouts.
PREFIXES: dict[str, tuple[tuple[str, str], ...]] = {
    "sd1": (
        ("unet", "model.diffusion_model."),
        ("text_encoder", "cond_stage_model."),
        ("vae", "first_stage_model."),
    ),
    "sd2": (
        ("unet", "model.diffusion_model."),
        ("text_encoder", "cond_stage_model."),
        ("vae", "first_stage_model."),
    ),
    "sdxl": (
        ("unet", "model.diffusion_model."),
        ("text_encoder", "conditioner.embedders.0."),
        ("text_encoder_2", "conditioner.embedders.1."),
        ("vae", "first_stage_model."),
    ),
    "sd3": (
        ("transformer", "model.diffusion_model."),
        ("text_encoder", "text_encoders.clip_l."),
        ("text_encoder_2", "text_encoders.clip_g."),
        ("text_encoder_3", "text_encoders.t5xxl."),
        ("vae", "first_stage_model."),
    ),
    "flux": (("transformer", ""),),
}


def _strip(name: str) -> str:
    for pre in ("model.diffusion_model.", "diffusion_model."):
        if name.startswith(pre) and ("double_blocks" in name or "single_blocks" in name or "img_in" in name):
            return name[len(pre) :]
    return name


def is_diffusion_checkpoint(tensors: dict[str, tuple[str, tuple[int, ...]]]) -> bool:
    names = {_strip(n) for n in tensors}
    return any(sig in names for _, _, sig in SIGNATURES)


def spec_from_checkpoint(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> DiffusionSpec:
    """A single-file checkpoint: family from tensor names, per-part counts and dtypes from the header."""
    names = {_strip(n): v for n, v in tensors.items()}
    family, preset = next(((f, p) for f, p, sig in SIGNATURES if sig in names), (None, None))
    if family is None or preset is None:
        raise ModelSourceError(f"{path}: not a checkpoint of a supported diffusion family")
    if family == "flux" and "guidance_in.in_layer.weight" not in names:
        preset = "flux.1-schnell"
    if family == "sd3" and any(".x_block.attn2." in n for n in names):
        preset = "sd35-medium"  # MMDiT-X dual attention: only 3.5 Medium has attn2 tensors
    base = spec_from_preset(preset)
    counted: dict[str, int] = Counter()
    dtypes: dict[str, Counter[str]] = {}
    prefixes = PREFIXES[family]
    for name, (dtype, shape) in names.items():
        part = next((p for p, pre in prefixes if name.startswith(pre)), None)
        if family == "flux":
            part = "transformer"
        if part is None:
            continue
        n = math.prod(shape)
        counted[part] += n
        dtypes.setdefault(part, Counter())[dtype] += n
    notes = []
    parts = []
    for p in base.parts:
        if p.name in counted:
            stored = dtypes[p.name].most_common(1)[0][0]
            parts.append(
                p.model_copy(
                    update={"declared_params": counted[p.name], "stored_dtype": stored, "source": str(path)}
                )
            )
            expected = p.params + p.buffers
            if abs(counted[p.name] - expected) > 0.01 * expected:
                notes.append(
                    f"{p.name}: the file holds {counted[p.name]:,} values but {base.name}'s architecture has "
                    f"{expected:,} parameters; the estimate follows the architecture"
                )
        else:
            parts.append(p)
            notes.append(f"{p.name} is not in the file; the {base.name} preset's config is used")
    return base.model_copy(
        update={
            "id": str(path),
            "name": f"{path.name} ({base.name})",
            "source_kind": "single_file",
            "source": str(path),
            "parts": tuple(parts),
            "notes": tuple(notes),
        }
    )


# --- dispatch --------------------------------------------------------------------------------------


def resolve_diffusion(text: str) -> DiffusionSpec | None:
    """A `DiffusionSpec` when ``text`` names a diffusion model, else None (it may be an LLM).

    Diffusion: a diffusion preset id or alias, a folder with ``model_index.json``, a
    ``model_index.json`` file, or a ``.safetensors`` file whose tensor names are a diffusion
    layout and that has no ``config.json`` beside it (LLM checkpoints do).
    """
    from fitcheck.units import looks_like_size

    low = text.lower()
    if low in diffusion_ids() or (not looks_like_size(text) and low in _aliases()):
        return spec_from_preset(low)
    p = user_path(text)
    if p.is_dir() and (p / "model_index.json").exists():
        return spec_from_folder(p)
    if p.name == "model_index.json" and p.is_file():
        return spec_from_folder(p.parent)
    if p.suffix == ".safetensors" and p.is_file() and not (p.parent / "config.json").exists():
        from fitcheck.sources.safetensors_header import read_all

        tensors = read_all(p)
        if is_diffusion_checkpoint(tensors):
            return spec_from_checkpoint(p, tensors)
    return None
