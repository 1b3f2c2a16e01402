"""Parameter counts of the vision towers and projectors of multimodal models.

The language tower is what people fine-tune; the vision tower sits in memory beside it (frozen in the
usual recipes), so its exact size matters for the weights. Each function follows the module tree of
the transformers modeling file named in its docstring; the defaults are those of the matching
configuration class (transformers 5.x ``configuration_*.py``), used where a published ``vision_config``
leaves a key out. Tests compare each against transformers on the meta device.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fitcheck.errors import ModelSourceError
from fitcheck.terminal import clipped

Config = Mapping[str, Any]

#: One kind of ``nn.Linear`` in a tower: (d_in, d_out, how many).
LinearShape = tuple[int, int, int]


@dataclass(frozen=True)
class Tower:
    """A vision tower with its projector: every parameter, and the ``nn.Linear`` layers among them (the
    modules peft's ``all-linear`` wraps: it takes every ``nn.Linear`` but the output layer, tuners_utils
    ``_maybe_include_all_linear_layers``; patch convolutions and bare weight matrices stay out)."""

    params: int
    linears: tuple[LinearShape, ...]
    #: Convolutions that a leaf name shared with a tower linear makes peft wrap when the names are fixed
    #: before peft sees the model (`--lora-targets linear-modules`): Qwen3-VL's ``patch_embed.proj``
    #: (Conv3d) shares ``proj`` with the blocks' attention output. As (in x kernel volume, out, how many):
    #: peft's ``lora.Conv3d`` is A = Conv3d(in, r, kernel) and B = Conv3d(r, out, 1), the parameters of a
    #: linear ``in*k^3 -> out`` (peft tuners/lora/layer.py ``_ConvNd.update_layer``).
    convs: tuple[LinearShape, ...] = ()


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

#: Mistral3Config's vision sub-config when ``vision_config`` is absent (configuration_mistral3.py
#: ``sub_configs_defaults``); a given ``vision_config`` takes PixtralVisionConfig's own defaults (patch 16).
MISTRAL3_PIXTRAL_DEFAULTS = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                             "num_channels": 3, "patch_size": 14}  # fmt: skip
PIXTRAL_DEFAULTS = {**MISTRAL3_PIXTRAL_DEFAULTS, "patch_size": 16}
QWEN3_VL_DEFAULTS = {"hidden_size": 1152, "intermediate_size": 4304, "depth": 27, "in_channels": 3,
                     "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2,
                     "out_hidden_size": 3584, "num_position_embeddings": 2304,
                     "deepstack_visual_indexes": (8, 16, 24)}  # fmt: skip


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
                f"(got {clipped(repr(value))})"
            )
    ratio = c.get("mlp_ratio", 1)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1_024:
        raise ModelSourceError(
            f"config.json vision_config: mlp_ratio must be a number above 0 (got {clipped(repr(ratio))})"
        )
    return c


def _vit_layers(h: int, inter: int, layers: int) -> int:
    """Pre-norm ViT layers: q, k, v, o and fc1, fc2 with biases, two LayerNorms."""
    return layers * (4 * (h * h + h) + 2 * h * inter + inter + h + 4 * h)


def _vit_linears(h: int, inter: int, layers: int) -> list[LinearShape]:
    """The linears of `_vit_layers`: q, k, v, o, fc1, fc2 per layer."""
    return [(h, h, 4 * layers), (h, inter, layers), (inter, h, layers)]


def _gated_linears(h: int, inter: int, layers: int) -> list[LinearShape]:
    """A gated MLP per layer: gate and up (h -> inter), down (Pixtral, Qwen2.5-VL)."""
    return [(h, inter, 2 * layers), (inter, h, layers)]


def _fused_qkv_linears(e: int, inter: int, layers: int) -> list[LinearShape]:
    """Qwen-VL blocks: one qkv (e -> 3e), proj, and a plain MLP (fc1, fc2)."""
    return [(e, 3 * e, layers), (e, e, layers), (e, inter, layers), (inter, e, layers)]


def _tower(params: int, linears: list[LinearShape]) -> Tower:
    return Tower(params, tuple(x for x in linears if x[2]))


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


def siglip_linears(cfg: Config) -> list[LinearShape]:
    """SigLIP's linears: the ViT layers and, with the pooling head, its MLP and the attention's
    ``out_proj`` (an ``nn.Linear`` subclass; ``in_proj`` is a bare weight)."""
    c = _merged(cfg, SIGLIP_DEFAULTS)
    h, inter = int(c["hidden_size"]), int(c["intermediate_size"])
    out = _vit_linears(h, inter, int(c["num_hidden_layers"]))
    if c.get("vision_use_head"):
        out += [(h, h, 1), (h, inter, 1), (inter, h, 1)]
    return out


def llava(vis: Config, text: Config) -> Tower:
    """``LlavaForConditionalGeneration``: a CLIP (or SigLIP) tower and a two-layer projector
    (``linear_1`` from the vision width, times the number of feature layers, ``linear_2``)."""
    top = text.get("_top") or {}
    kind = vis.get("model_type", "clip_vision_model")
    if kind == "siglip_vision_model":
        tower, vh = siglip_vision(vis), int(_merged(vis, SIGLIP_DEFAULTS)["hidden_size"])
        lins = siglip_linears(vis)
    else:
        defaults = LLAVA_CLIP_DEFAULTS if not vis else CLIP_DEFAULTS
        c = _merged(vis, defaults)
        tower, vh = clip_vision(vis, defaults), int(c["hidden_size"])
        lins = _vit_linears(vh, int(c["intermediate_size"]), int(c["num_hidden_layers"]))
    layer = top.get("vision_feature_layer", -2)
    n_feat = len(layer) if isinstance(layer, list) else 1
    th = int(text.get("hidden_size", 4096))
    bias = bool(top.get("multimodal_projector_bias", True))
    params = tower + (vh * n_feat * th + th * bias) + (th * th + th * bias)
    return _tower(params, [*lins, (vh * n_feat, th, 1), (th, th, 1)])


def qwen2_vl(vis: Config, text: Config) -> Tower:
    """``Qwen2VisionTransformerPretrainedModel`` (modeling_qwen2_vl.py): a bias-free 3-D patch conv,
    LayerNorm blocks with fused qkv and a plain MLP (all with biases), and the patch merger (LayerNorm
    then two linears from ``embed_dim x merge^2`` to the text width)."""
    c = _merged(vis, QWEN2_VL_DEFAULTS)
    e, p, t = int(c["embed_dim"]), int(c["patch_size"]), int(c["temporal_patch_size"])
    inter = int(e * c["mlp_ratio"])
    block = 4 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e * inter + inter + e
    m = e * int(c["spatial_merge_size"]) ** 2
    merger = 2 * e + (m * m + m) + (m * int(c["hidden_size"]) + int(c["hidden_size"]))
    params = int(c["in_channels"]) * t * p * p * e + int(c["depth"]) * block + merger
    lins = _fused_qkv_linears(e, inter, int(c["depth"]))
    return _tower(params, [*lins, (m, m, 1), (m, int(c["hidden_size"]), 1)])


def qwen2_5_vl(vis: Config, text: Config) -> Tower:
    """``Qwen2_5_VisionTransformerPretrainedModel`` (modeling_qwen2_5_vl.py): RMSNorm blocks, fused qkv,
    a gated MLP with biases, and the merger (RMSNorm, two linears) to ``out_hidden_size``."""
    c = _merged(vis, QWEN2_5_VL_DEFAULTS)
    e, p, t = int(c["hidden_size"]), int(c["patch_size"]), int(c["temporal_patch_size"])
    inter, out = int(c["intermediate_size"]), int(c["out_hidden_size"])
    block = 2 * e + (3 * e * e + 3 * e) + (e * e + e) + 3 * e * inter + 2 * inter + e
    m = e * int(c["spatial_merge_size"]) ** 2
    merger = e + (m * m + m) + (m * out + out)
    params = int(c["in_channels"]) * t * p * p * e + int(c["depth"]) * block + merger
    depth = int(c["depth"])
    lins = [(e, 3 * e, depth), (e, e, depth), *_gated_linears(e, inter, depth)]
    return _tower(params, [*lins, (m, m, 1), (m, out, 1)])


def gemma3(vis: Config, text: Config) -> Tower:
    """``Gemma3ForConditionalGeneration``: a SigLIP tower (no pooling head) and the projector: one
    vision-to-text weight matrix and an RMSNorm on the vision width (modeling_gemma3.py)."""
    # Gemma3Config's default vision tower: SiglipVisionConfig() with the head off (configuration_gemma3.py)
    c = _merged(vis, {**SIGLIP_DEFAULTS, "vision_use_head": False})
    vh, th = int(c["hidden_size"]), int(text.get("hidden_size", 2304))
    # the projection is a bare weight (mm_input_projection_weight): all-linear does not reach it
    return _tower(siglip_vision(c) + vh * th + vh, siglip_linears(c))


def llama4(vis: Config, text: Config) -> Tower:
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
    vout, th = int(c["vision_output_dim"]), int(text.get("hidden_size", 5120))
    lins = [(int(c["num_channels"]) * p * p, h, 1), *_vit_linears(h, inter, int(c["num_hidden_layers"]))]
    return _tower(total + vout * th, [*lins, (inter, pin, 1), (pout, pout, 1), (vout, th, 1)])


def mistral3(vis: Config, text: Config) -> Tower:
    """``Mistral3ForConditionalGeneration``: a Pixtral tower (modeling_pixtral.py: bias-free patch conv,
    RMSNorm ``ln_pre``, layers of bias-free q/k/v/o at the tower width, a gated MLP and two RMSNorms) and
    the projector (modeling_mistral3.py: RMSNorm, the patch merger's bias-free ``merge^2 x h_v -> h_v``,
    ``linear_1`` from the vision width times the feature layers, ``linear_2``; biases only with
    ``multimodal_projector_bias``)."""
    top = text.get("_top") or {}
    c = _merged(vis, PIXTRAL_DEFAULTS if vis else MISTRAL3_PIXTRAL_DEFAULTS)
    h, inter, p = int(c["hidden_size"]), int(c["intermediate_size"]), int(c["patch_size"])
    tower = (
        int(c["num_channels"]) * p * p * h
        + h
        + int(c["num_hidden_layers"]) * (2 * h + 4 * h * h + 3 * h * inter)
    )
    merge = int(top.get("spatial_merge_size", 2))
    layer = top.get("vision_feature_layer", -1)
    n_feat = len(layer) if isinstance(layer, list) else 1
    th, bias = int(text.get("hidden_size", 5120)), bool(top.get("multimodal_projector_bias", False))
    params = tower + h + merge * merge * h * h + (h * n_feat * th + th * bias) + (th * th + th * bias)
    layers = int(c["num_hidden_layers"])
    lins = [(h, h, 4 * layers), *_gated_linears(h, inter, layers)]
    return _tower(params, [*lins, (merge * merge * h, h, 1), (h * n_feat, th, 1), (th, th, 1)])


def qwen3_vl(vis: Config, text: Config) -> Tower:
    """``Qwen3VLVisionModel`` (modeling_qwen3_vl.py): a 3-D patch conv with bias, a learned position table
    (``num_position_embeddings`` rows), LayerNorm blocks with fused qkv and a plain MLP (all with biases),
    the patch merger (LayerNorm on the tower width, ``m x m`` and ``m x out`` linears, ``m = h merge^2``)
    and one DeepStack merger per ``deepstack_visual_indexes`` entry (the same, normed on ``m``)."""
    c = _merged(vis, QWEN3_VL_DEFAULTS)
    e, p, t = int(c["hidden_size"]), int(c["patch_size"]), int(c["temporal_patch_size"])
    inter, out = int(c["intermediate_size"]), int(c["out_hidden_size"])
    block = 4 * e + (3 * e * e + 3 * e) + (e * e + e) + 2 * e * inter + inter + e
    m = e * int(c["spatial_merge_size"]) ** 2
    linears = (m * m + m) + (m * out + out)
    embed = int(c["in_channels"]) * t * p * p * e + e + int(c["num_position_embeddings"]) * e
    n_deep = len(c["deepstack_visual_indexes"])
    params = embed + int(c["depth"]) * block + 2 * e + linears + n_deep * (2 * m + linears)
    lins = _fused_qkv_linears(e, inter, int(c["depth"]))
    conv = (int(c["in_channels"]) * t * p * p, e, 1)  # patch_embed.proj: its leaf is the blocks' ``proj``
    return replace(_tower(params, [*lins, (m, m, 1 + n_deep), (m, out, 1 + n_deep)]), convs=(conv,))
