"""Diffusion presets: well formed, every part's count exact against diffusers/transformers, published figures.

Each part stores its published component ``config.json``; the module tree built from it must count
exactly the parameters that the real class counts when instantiated on the meta device from the
same config (no weights are downloaded), the preset must declare that count, and the totals must
agree with what the model cards and papers publish.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.diffusion.sources import diffusion_ids, spec_from_preset
from fitcheck.diffusion.spec import count_part

DIR = Path(__file__).parents[1] / "presets" / "diffusion"
FILES = sorted(DIR.glob("*.yaml"))
IDS = ["sd15", "sd21", "sdxl", "sd35-medium", "sd35-large", "flux.1-dev", "flux.1-schnell"]
KEBAB = re.compile(r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$")

#: Exact counts, pinned: what ``sum(p.numel() for p in model.parameters())`` reports for each part
#: (computed with diffusers 0.42 / transformers 5.24 on the meta device; re-checked below).
PINNED: dict[tuple[str, str], int] = {
    ("sd15", "unet"): 859_520_964,
    ("sd15", "text_encoder"): 123_060_480,
    ("sd15", "vae"): 83_653_863,
    ("sd21", "unet"): 865_910_724,
    ("sd21", "text_encoder"): 340_387_840,
    ("sdxl", "unet"): 2_567_463_684,
    ("sdxl", "text_encoder_2"): 694_659_840,
    ("sd35-medium", "transformer"): 2_243_171_520,
    ("sd35-large", "transformer"): 8_056_627_520,
    ("sd35-large", "text_encoder"): 123_650_304,
    ("sd35-large", "text_encoder_3"): 4_762_310_656,
    ("sd35-large", "vae"): 83_819_683,
    ("flux.1-dev", "transformer"): 11_901_408_320,
    ("flux.1-schnell", "transformer"): 11_891_178_560,
}


def load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_the_seven_presets_exist() -> None:
    assert sorted(diffusion_ids()) == sorted(IDS)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_preset_shape(path: Path) -> None:
    data = load(path)
    assert data["id"] == path.stem and KEBAB.match(data["id"])
    for key in ("name", "family", "hf_id", "source", "native_resolution", "params", "published", "parts"):
        assert key in data, f"{path.name}: missing {key}"
    roles = [p["role"] for p in data["parts"].values()]
    assert roles.count("denoiser") == 1 and "vae" in roles and "text_encoder" in roles
    for name, part in data["parts"].items():
        assert part["source"].startswith("https://huggingface.co/"), name
        assert part["read_via"], f"{name}: where the config was read must be recorded"
        assert isinstance(part["config"], dict) and part["config"]
    for pub in data["published"]:
        assert pub["source"] and pub["value"] > 0


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_declared_counts_are_derived(path: Path) -> None:
    data = load(path)
    total = 0
    for name, part in data["parts"].items():
        n, buffers = count_part(part["class"], part["config"])
        assert part["params"] == n, f"{path.stem}.{name}: declared {part['params']:,}, derived {n:,}"
        assert part.get("buffers", 0) == buffers
        total += n
    assert data["params"] == total


@pytest.mark.parametrize(("model", "part"), sorted(PINNED), ids=lambda x: str(x))
def test_pinned_counts(model: str, part: str) -> None:
    spec = spec_from_preset(model)
    assert next(p for p in spec.parts if p.name == part).params == PINNED[(model, part)]


def _meta_count(class_name: str, config: dict[str, Any]) -> int:
    torch = pytest.importorskip("torch")
    if class_name in ("CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel"):
        transformers = pytest.importorskip("transformers")
        conf_cls = transformers.T5Config if class_name == "T5EncoderModel" else transformers.CLIPTextConfig
        with torch.device("meta"):
            model = getattr(transformers, class_name)(conf_cls(**config))
    else:
        diffusers = pytest.importorskip("diffusers")
        with torch.device("meta"):
            model = getattr(diffusers, class_name).from_config(config)
    return sum(p.numel() for p in model.parameters())


#: One instance of each distinct (class, config) across the presets (the T5-XXL, CLIP-L and VAE
#: configs repeat), so the meta builds stay few.
def _distinct_parts() -> list[tuple[str, str, dict[str, Any]]]:
    seen: dict[str, tuple[str, str, dict[str, Any]]] = {}
    for model in IDS:
        for p in spec_from_preset(model).parts:
            key = p.class_name + repr(sorted(p.config.items()))
            seen.setdefault(key, (f"{model}.{p.name}", p.class_name, p.config))
    return list(seen.values())


@pytest.mark.parametrize(
    ("label", "class_name", "config"), _distinct_parts(), ids=lambda x: x if isinstance(x, str) else ""
)
def test_counts_match_the_real_classes_on_meta(label: str, class_name: str, config: dict[str, Any]) -> None:
    ours, _ = count_part(class_name, config)
    assert ours == _meta_count(class_name, config), label


#: Published figures (model cards, papers; sources in each preset's ``published``) hold to their
#: last digit, rounded or truncated: "817M" means 816-818M. SD3.5's figures include the positional
#: table, which both diffusers and sd-scripts register as a buffer, not a parameter.
@pytest.mark.parametrize("model", IDS)
def test_published_figures(model: str) -> None:
    data = load(DIR / f"{model}.yaml")
    spec = spec_from_preset(model)
    for pub in data["published"]:
        part = pub["part"]
        if part == "text_encoders":
            n = sum(p.params for p in spec.text_encoders)
        elif part == "transformer+buffers":
            n = spec.denoiser.params + spec.denoiser.buffers
        else:
            n = next(p for p in spec.parts if p.name == part).params
        unit = 10 ** (len(str(pub["value"])) - len(str(pub["value"]).rstrip("0")))
        assert abs(n - pub["value"]) < unit, f"{model} {pub['figure']}: derived {n:,}"


def test_aliases_resolve() -> None:
    assert spec_from_preset("sd1.5").id == "sd15"
    assert spec_from_preset("flux-dev").id == "flux.1-dev"
