"""Bounds on the size fields of a diffusers component's ``config.json``, checked before its module tree is
built: a string, a zero or a huge count there was an internal error (``int('x')``, a division by zero) or
ran for ever (``layers_per_block: 1000000`` builds a million blocks).

Each bound is far past every released pipeline (SD 1.x-3.5, SDXL, Flux: widths up to 4,096 channels,
2-10 transformer layers per UNet block, 19 + 38 Flux blocks, CLIP/T5 text encoders of 12-24 layers at
width 768-4,096, vocabularies of 32k-250k); the key names are the ones `fitcheck.diffusion.arch` reads
(diffusers ``UNet2DConditionModel``, ``SD3Transformer2DModel``, ``FluxTransformer2DModel``,
``AutoencoderKL``; transformers ``CLIPTextModel``, ``T5EncoderModel``).
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.errors import ModelSourceError
from fitcheck.terminal import clipped

WIDTH = 65_536
COUNT = 512
SMALL = 65_536
#: Resnets per UNet/VAE block (released: 2-3) and transformer layers per UNet block (released: 1-10).
RESNETS, DEPTH = 16, 32

#: key -> (least, most) whole number, for an int or every int of a (nested) list under the key.
BOUNDS: dict[str, tuple[int, int]] = {
    **dict.fromkeys(
        ("block_out_channels", "cross_attention_dim", "hidden_size", "d_model", "d_ff"), (1, WIDTH)
    ),
    **dict.fromkeys(("intermediate_size", "projection_dim", "joint_attention_dim", "d_kv"), (1, WIDTH)),
    **dict.fromkeys(
        ("pooled_projection_dim", "caption_projection_dim", "addition_time_embed_dim"), (1, WIDTH)
    ),
    "projection_class_embeddings_input_dim": (1, WIDTH),
    **dict.fromkeys(("in_channels", "out_channels", "latent_channels", "norm_num_groups"), (1, SMALL)),
    **dict.fromkeys(("attention_head_dim", "num_attention_heads", "num_heads", "patch_size"), (1, SMALL)),
    **dict.fromkeys(("pos_embed_max_size", "relative_attention_num_buckets"), (1, SMALL)),
    **dict.fromkeys(("conv_in_kernel", "conv_out_kernel"), (1, 1_024)),
    "layers_per_block": (1, RESNETS),
    "transformer_layers_per_block": (1, DEPTH),
    "reverse_transformer_layers_per_block": (1, DEPTH),
    **dict.fromkeys(("num_layers", "num_hidden_layers"), (1, COUNT)),
    "num_single_layers": (0, COUNT),
    "vocab_size": (1, 67_108_864),
    "max_position_embeddings": (1, 16_777_216),
}

#: The longest list a size field holds (UNet blocks: 3-4 per side).
MAX_ITEMS = 64


def _whole(value: object) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) else None


def _numbers(value: object) -> list[object]:
    """The values under a key: itself, or every item of a list (nested one level, as SDXL's
    ``reverse_transformer_layers_per_block`` is)."""
    if not isinstance(value, (list, tuple)):
        return [value]
    return [inner for item in value for inner in (item if isinstance(item, (list, tuple)) else [item])]


def check_component(name: str, config: Mapping[str, object]) -> None:
    """Every size field present in a component's config is a whole number within its bound (a list of
    them: non-empty, at most `MAX_ITEMS`); one clear line naming the component and key otherwise."""
    for key, (least, most) in BOUNDS.items():
        value = config.get(key)
        if value is None:
            continue
        numbers = _numbers(value)
        fine = 0 < len(numbers) <= MAX_ITEMS and all(
            (n := _whole(v)) is not None and least <= n <= most for v in numbers
        )
        if not fine:
            raise ModelSourceError(
                f"component {name}: {key} must be a whole number from {least} to {most:,}, or a list of them "
                f"(got {clipped(repr(value))})"
            )


def _spread(value: object, n: int) -> list[object]:
    """A per-block field as diffusers spreads it: a list as given, a scalar once per block."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def _split(name: str, what: str, width: object, parts: object) -> None:
    if not (isinstance(width, int) and isinstance(parts, int) and width % parts == 0):
        raise ModelSourceError(f"component {name}: {what} {width!r:.20} does not split into {parts!r:.20}")


def check_shapes(name: str, class_name: str, config: Mapping[str, object]) -> None:
    """The splits the module tree makes, checked where diffusers/transformers would fail building it: a
    UNet block's channels into its attention heads and norm groups (``num_attention_heads`` falling back
    to ``attention_head_dim``, as `fitcheck.diffusion.arch.unet` reads them), a VAE's into norm groups, a
    CLIP width into heads. Call after `check_component` (the fields are whole numbers in bounds)."""
    if class_name in ("UNet2DConditionModel", "AutoencoderKL"):
        channels = _spread(config.get("block_out_channels", [64]), 1)
        groups = config.get("norm_num_groups", 32)
        heads = _spread(
            config.get("num_attention_heads") or config.get("attention_head_dim", 8), len(channels)
        )
        if class_name == "UNet2DConditionModel" and len(heads) != len(channels):
            raise ModelSourceError(f"component {name}: {len(heads)} head counts for {len(channels)} blocks")
        for i, width in enumerate(channels):
            _split(name, "block_out_channels", width, groups)
            if class_name == "UNet2DConditionModel":
                _split(name, "block_out_channels", width, heads[i])
    elif class_name.startswith("CLIPTextModel"):
        _split(name, "hidden_size", config.get("hidden_size", 512), config.get("num_attention_heads", 8))
