"""Diffusion sources: a local diffusers folder and a single-file checkpoint's header."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from fitcheck.cli import main
from fitcheck.diffusion.sources import resolve_diffusion, spec_from_preset
from fitcheck.errors import ModelSourceError

PIPELINES = {
    "sd15": "StableDiffusionPipeline",
    "sdxl": "StableDiffusionXLPipeline",
    "flux.1-schnell": "FluxPipeline",
}
LIBS = {
    "CLIPTextModel": "transformers",
    "CLIPTextModelWithProjection": "transformers",
    "T5EncoderModel": "transformers",
}


def write_folder(root: Path, model: str) -> Path:
    """model_index.json + each component's config.json (no weights), like a diffusers snapshot."""
    spec = spec_from_preset(model)
    index: dict[str, object] = {"_class_name": PIPELINES[model], "_diffusers_version": "0.30.0"}
    index["scheduler"] = ["diffusers", "EulerDiscreteScheduler"]
    index["tokenizer"] = ["transformers", "CLIPTokenizer"]
    for p in spec.parts:
        index[p.name] = [LIBS.get(p.class_name, "diffusers"), p.class_name]
        (root / p.name).mkdir(parents=True)
        (root / p.name / "config.json").write_text(json.dumps(p.config), encoding="utf-8")
    (root / "model_index.json").write_text(json.dumps(index), encoding="utf-8")
    return root


@pytest.mark.parametrize("model", sorted(PIPELINES))
def test_diffusers_folder(tmp_path: Path, model: str) -> None:
    spec = resolve_diffusion(str(write_folder(tmp_path / model, model)))
    assert spec is not None and spec.source_kind == "diffusers_folder"
    preset = spec_from_preset(model)
    assert spec.family == preset.family and spec.text_tokens == preset.text_tokens
    assert {p.name: p.params for p in spec.parts} == {p.name: p.params for p in preset.parts}


def test_folder_estimate_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_folder(tmp_path / "sdxl", "sdxl")
    assert main(["estimate", str(folder), "--grad-ckpt", "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["model_source"] == "diffusers_folder" and doc["setup"]["resolution"] == 1024


def test_unsupported_pipeline(tmp_path: Path) -> None:
    (tmp_path / "model_index.json").write_text(json.dumps({"_class_name": "KandinskyPipeline"}))
    with pytest.raises(ModelSourceError, match="not supported"):
        resolve_diffusion(str(tmp_path))


def write_safetensors(path: Path, tensors: dict[str, tuple[str, tuple[int, ...]]]) -> Path:
    size = {"BF16": 2, "F16": 2, "F32": 4, "F8_E4M3": 1}
    header: dict[str, object] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)
    return path


def test_single_file_flux(tmp_path: Path) -> None:
    """A BFL-layout FLUX file (kohya loads these): family from names, counts and dtype from the header."""
    f = write_safetensors(
        tmp_path / "flux1-dev.safetensors",
        {
            "double_blocks.0.img_attn.qkv.weight": ("BF16", (96, 32)),
            "guidance_in.in_layer.weight": ("BF16", (32, 8)),
        },
    )
    spec = resolve_diffusion(str(f))
    assert spec is not None and spec.family == "flux" and spec.source_kind == "single_file"
    tr = spec.denoiser
    assert tr.declared_params == 96 * 32 + 32 * 8 and tr.stored_dtype == "bf16"
    assert any("architecture" in n for n in spec.notes)  # a toy file disagrees with FLUX.1's count
    assert spec.model_copy().parts[1].name == "text_encoder"  # the parts not in the file come from the preset


def test_single_file_sdxl_schnell_and_sd1(tmp_path: Path) -> None:
    sdxl = write_safetensors(
        tmp_path / "x.safetensors",
        {
            "model.diffusion_model.label_emb.0.0.weight": ("F16", (4, 4)),
            "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight": ("F16", (8,)),
            "first_stage_model.decoder.conv_in.weight": ("F32", (2, 2)),
        },
    )
    spec = resolve_diffusion(str(sdxl))
    assert spec is not None and spec.family == "sdxl"
    parts = {p.name: p for p in spec.parts}
    assert parts["unet"].declared_params == 16 and parts["text_encoder"].declared_params == 8
    assert parts["vae"].stored_dtype == "fp32"
    schnell = write_safetensors(
        tmp_path / "s.safetensors", {"double_blocks.0.img_attn.qkv.weight": ("BF16", (2, 2))}
    )
    spec = resolve_diffusion(str(schnell))
    assert spec is not None and spec.id.endswith("s.safetensors") and spec.text_tokens == 256
    sd1 = write_safetensors(
        tmp_path / "v1.safetensors", {"model.diffusion_model.input_blocks.0.0.weight": ("F16", (2,))}
    )
    spec = resolve_diffusion(str(sd1))
    assert spec is not None and spec.family == "sd1" and spec.native_resolution == 512


def test_llm_safetensors_is_not_diffusion(tmp_path: Path) -> None:
    f = write_safetensors(
        tmp_path / "model.safetensors", {"model.layers.0.self_attn.q_proj.weight": ("BF16", (4, 4))}
    )
    assert resolve_diffusion(str(f)) is None
