"""Image tokens per example from LLaMA-Factory's ``image_max_pixels``, for the Qwen-VL plugins.

LLaMA-Factory shrinks every image larger than ``image_max_pixels`` to that many pixels, keeping its aspect
(``BasePlugin._preprocess_image``: ``resize_factor = sqrt(image_max_pixels / (w * h))``, then ``int`` of
each side; hiyouga/LLaMA-Factory src/llamafactory/data/mm_plugin.py @ff6d4d12). The Qwen-VL processor then
rounds each side to a multiple of ``patch_size x merge_size`` (transformers 5.24
models/qwen2_vl/image_processing_pil_qwen2_vl.py ``smart_resize``: ``round(h / factor) * factor``, shrunk
again past the processor's ``max_pixels``), and the plugin puts ``grid_t x grid_h x grid_w / merge_size^2``
image tokens in the text (``Qwen2VLPlugin.process_messages``: ``image_grid_thw.prod() // merge_length``).
Caps below the processor's ``min_pixels`` (56 x 56) are not modelled. Patch and merge sizes are the vision
tower's (transformers ``Qwen2VLVisionConfig``: 14 and 2, which Qwen2.5-VL keeps; ``Qwen3VLVisionConfig``:
16 and 2), chosen by the file's ``template``, which names the plugin (data/template.py: ``qwen2_vl`` ->
Qwen2VLPlugin; ``qwen3_vl``, ``qwen3_vl_nothink`` -> Qwen3VLPlugin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class VisionGrid:
    """What turns pixels into tokens for one processor family."""

    patch: int
    merge: int
    max_pixels: int | None  # the processor's own cap (None: larger than any cap a file sets)

    @property
    def factor(self) -> int:
        return self.patch * self.merge


#: LLaMA-Factory template -> the processor's grid. Qwen2-VL's image processor caps at 28 x 28 x 1280 pixels
#: (``Qwen2VLImageProcessor`` default ``max_pixels``); Qwen3-VL's published preprocessor caps far above
#: the sizes a training file sets (not modelled).
TEMPLATES: dict[str, VisionGrid] = {
    "qwen2_vl": VisionGrid(14, 2, 28 * 28 * 1280),
    "qwen3_vl": VisionGrid(16, 2, None),
    "qwen3_vl_nothink": VisionGrid(16, 2, None),
}


def square_side(max_pixels: int) -> int:
    """The side LLaMA-Factory gives a square image larger than ``max_pixels`` (``int(side * factor)``)."""
    return math.isqrt(max_pixels)


def smart_side(side: int, grid: VisionGrid) -> int:
    """``smart_resize`` of a square side: the nearest multiple of the factor, floored under the cap."""
    f = grid.factor
    bar = max(f, round(side / f) * f)
    if grid.max_pixels is not None and bar * bar > grid.max_pixels:
        bar = max(f, math.floor(side / math.sqrt(side * side / grid.max_pixels) / f) * f)
    return bar


def image_tokens(max_pixels: int, grid: VisionGrid) -> int:
    """Tokens of one square image at the cap: (side / factor)^2 (the merged patches)."""
    side = smart_side(square_side(max_pixels), grid)
    return (side // grid.factor) ** 2
