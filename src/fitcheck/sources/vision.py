"""Parameter counts of the vision towers and projectors of multimodal models.

The language tower is what people fine-tune; the vision tower sits in memory beside it (frozen in the
usual recipes), so its exact size matters for the weights. Each function follows the module tree of
the transformers modeling file named in its docstring; the defaults are those of the matching
configuration class (transformers 5.x ``configuration_*.py``), used where a published ``vision_config``
leaves a key out. Tests compare each against transformers on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fitcheck.errors import ModelSourceError

Config = Mapping[str, Any]

CLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                 "num_channels": 3, "image_size": 224, "patch_size": 32}  # fmt: skip
#: LlavaConfig builds this CLIP tower when ``vision_config`` is absent (configuration_llava.py).
LLAVA_CLIP_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                       "num_channels": 3, "image_size": 336, "patch_size": 14}  # fmt: skip
SIGLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_channels": 3,
                   "image_size": 224, "patch_size": 16, "vision_use_head": True}  # fmt: skip
QWEN2_VL_DEFAULTS = {"embed_dim": 1280, "depth": 32, "mlp_ratio": 4, "in_channels": 3, "patch_size": 14,
                     "spatial_merge_size": 2, "temporal_patch_size": 2, "hidden_size": 3584}  # fmt: skip
QWEN2_5_VL_DEFAULTS = {"hidden_size": 3584, "intermediate_size": 3420, "depth": 32, "in_channels": 3,
                       "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
                       "out_hidden_size": 3584}  # fmt: skip
LLAMA4_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 5632, "num_hidden_layers": 34,
                          "num_channels": 3, "image_size": 448, "patch_size": 14, "vision_output_dim": 7680,
                          "projector_input_dim": 4096, "projector_output_dim": 4096}  # fmt: skip


#: Size fields of a ``vision_config`` and a bound no real tower comes near (today's largest towers: width
#: ~1,664, 48 layers, images of 896 px): past these a config is a typo or hostile, not a model.
VISION_BOUNDS: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "embed_dim", "out_hidden_size", "vision_output_dim"), 1_048_576),
    **dict.fromkeys(("projector_input_dim", "projector_output_dim"), 1_048_576),
    "intermediate_size": 16_777_216,
    **dict.fromkeys(("num_hidden_layers", "depth"), 10_000),
    **dict.fromkeys(("image_size", "patch_size"), 65_536),
    **dict.fromkeys(("num_channels", "in_channels", "spatial_merge_size", "temporal_patch_size"), 1_024),
}


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _merged(cfg: Config, defaults: Mapping[str, Any]) -> dict[str, Any]:
    """The tower's config over its class defaults, every size field checked (one clear line if not)."""
    c = {**defaults, **{k: v for k, v in cfg.items() if v is not None}}
    for key, bound in VISION_BOUNDS.items():
        value = c.get(key)
        if isinstance(value, float) and value.is_integer() and 1 <= value <= bound:
            c[key] = value = int(value)
        if key in c and not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= bound):
            raise ModelSourceError(
                f"config.json vision_config: {key} must be a whole number from 1 to {bound:,} "
                f"(got {_shown(value)})"
            )
    ratio = c.get("mlp_ratio", 1)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1_024:
        raise ModelSourceError(
            f"config.json vision_config: mlp_ratio must be a number above 0 (got {_shown(ratio)})"
        )
    return c


def _vit_layers(h: int, inter: int, layers: int) -> int:
    """Pre-norm ViT layers: q, k, v, o and fc1, fc2 with biases, two LayerNorms."""
    return layers * (4 * (h * h + h) + 2 * h * inter + inter + h + 4 * h)


def clip_vision(cfg: Config, defaults: Mapping[str, Any] = CLIP_DEFAULTS) -> int:
    """``CLIPVisionModel`` (modeling_clip.py): class embedding, bias-free patch conv, positions for the
    patches plus the class token, pre- and post-LayerNorm."""
    c = _merged(cfg, defaults)
    h, p = int(c["hidden_size"]), int(c["patch_size"])
    patches = (int(c["image_size"]) // p) ** 2
    embed = h + int(c["num_channels"]) * p * p * h + (patches + 1) * h
    return embed + 2 * h + _vit_layers(h, int(c["intermediate_size"]), int(c["num_hidden_layers"])) + 2 * h


def siglip_vision(cfg: Config) -> int:
    """``SiglipVisionModel`` (modeling_siglip.py): patch conv with bias, positions, post-LayerNorm, and
    the attention-pooling head when ``vision_use_head``."""
    c = _merged(cfg, SIGLIP_DEFAULTS)
    h, p, inter = int(c["hidden_size"]), int(c["patch_size"]), int(c["intermediate_size"])
    patches = (int(c["image_size"]) // p) ** 2
    total = int(c["num_channels"]) * p * p * h + h + patches * h
    total += _vit_layers(h, inter, int(c["num_hidden_layers"])) + 2 * h
    if c.get("vision_use_head"):
        # probe, nn.MultiheadAttention (in_proj 3h x h + bias, out_proj), LayerNorm, MLP
        total += h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h + (2 * h * inter + inter + h)
    return total


def llava(vis: Config, text: Config) -> int:
    """``LlavaForConditionalGeneration``: a CLIP (or SigLIP) tower and a two-layer projector
    (``linear_1`` from the vision width, times the number of feature layers, ``linear_2``)."""
    top = text.get("_top") or {}
    kind = vis.get("model_type", "clip_vision_model")
    if kind == "siglip_vision_model":
        tower, vh = siglip_vision(vis), int(_merged(vis, SIGLIP_DEFAULTS)["hidden_size"])
    else:
        defaults = LLAVA_CLIP_DEFAULTS if not vis else CLIP_DEFAULTS
        tower, vh = clip_vision(vis, defaults), int(_merged(vis, defaults)["hidden_size"])
    layer = top.get("vision_feature_layer", -2)
    n_feat = len(layer) if isinstance(layer, list) else 1
    th = int(text.get("hidden_size", 4096))
    bias = bool(top.get("multimodal_projector_bias", True))
    return tower + (vh * n_feat * th + th * bias) + (th * th + th * bias)


def qwen2_vl(vis: Config, text: Config) -> int:
    """``Qwen2VisionTransformerPretrainedModel`` (modeling_qwen2_vl.py): a bias-free 3-D patch conv,
    LayerNorm blocks with fused qkv and a plain MLP (all with biases), and the patch merger (LayerNorm
    then two linears from ``embed_dim x merge^2`` to the text width)."""
    c = _merged(vis, QWEN2_VL_DEFAULTS)
    e, p, t = int(c["embed_dim"]), int(c["patch_size"]), int(c["temporal_patch_size"])
    inter = int(e * c["mlp_ratio"])
    block = 4 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e * inter + inter + e
    m = e * int(c["spatial_merge_size"]) ** 2
    merger = 2 * e + (m * m + m) + (m * int(c["hidden_size"]) + int(c["hidden_size"]))
    return int(c["in_channels"]) * t * p * p * e + int(c["depth"]) * block + merger


def qwen2_5_vl(vis: Config, text: Config) -> int:
    """``Qwen2_5_VisionTransformerPretrainedModel`` (modeling_qwen2_5_vl.py): RMSNorm blocks, fused qkv,
    a gated MLP with biases, and the merger (RMSNorm, two linears) to ``out_hidden_size``."""
    c = _merged(vis, QWEN2_5_VL_DEFAULTS)
    e, p, t = int(c["hidden_size"]), int(c["patch_size"]), int(c["temporal_patch_size"])
    inter, out = int(c["intermediate_size"]), int(c["out_hidden_size"])
    block = 2 * e + (3 * e * e + 3 * e) + (e * e + e) + 3 * e * inter + 2 * inter + e
    m = e * int(c["spatial_merge_size"]) ** 2
    merger = e + (m * m + m) + (m * out + out)
    return int(c["in_channels"]) * t * p * p * e + int(c["depth"]) * block + merger


def gemma3(vis: Config, text: Config) -> int:
    """``Gemma3ForConditionalGeneration``: a SigLIP tower (no pooling head) and the projector: one
    vision-to-text weight matrix and an RMSNorm on the vision width (modeling_gemma3.py)."""
    # Gemma3Config's default vision tower: SiglipVisionConfig() with the head off (configuration_gemma3.py)
    c = _merged(vis, {**SIGLIP_DEFAULTS, "vision_use_head": False})
    vh, th = int(c["hidden_size"]), int(text.get("hidden_size", 2304))
    return siglip_vision(c) + vh * th + vh


def llama4(vis: Config, text: Config) -> int:
    """``Llama4VisionModel`` + projector (modeling_llama4.py): an unfold-and-linear patch embedding
    (no bias), class token, positions for the patches + 1, pre/post LayerNorm, ViT layers with biases,
    the pixel-shuffle MLP adapter (two bias-free linears) and a bias-free ``linear_1`` to the text width."""
    c = _merged(vis, LLAMA4_VISION_DEFAULTS)
    h, p, inter = int(c["hidden_size"]), int(c["patch_size"]), int(c["intermediate_size"])
    patches = (int(c["image_size"]) // p) ** 2 + 1
    total = int(c["num_channels"]) * p * p * h + h + patches * h + 4 * h
    total += _vit_layers(h, inter, int(c["num_hidden_layers"]))
    pin, pout = int(c["projector_input_dim"]), int(c["projector_output_dim"])
    total += inter * pin + pout * pout
    return total + int(c["vision_output_dim"]) * int(text.get("hidden_size", 5120))
