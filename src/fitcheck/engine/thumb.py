"""The source documents' rules of thumb (seeds/002), in GiB per billion parameters.

LoRA 2/B + 3, full 12/B + 4 (16/B + 4 with an fp32 master copy), QLoRA 0.7/B + 3.4: the QLoRA line
is a fit through the seeds' two QLoRA figures (8B about 9 GB; 27-32B about 22-26 GB). The seeds'
"GB" are read as GiB, the binary units GPU memory is sold in.
"""

from __future__ import annotations

from fitcheck.models import LlmSetup, Thumb
from fitcheck.units import GIB

SOURCE = "seeds/002 'La regola empirica' (LoRA 2 GB/B + 3, full 12 GB/B + 4, 16 with master copy)"
RULES: dict[str, tuple[float, float, str]] = {
    "lora": (2.0, 3.0, "2 GiB per billion parameters + 3 GiB"),
    "full": (12.0, 4.0, "12 GiB per billion parameters + 4 GiB"),
    "full+master": (16.0, 4.0, "16 GiB per billion parameters + 4 GiB (fp32 master copy)"),
    # the seeds give no prefix-tuning line; their LoRA one is the frozen 16-bit base it also trains on
    "prefix-tuning": (2.0, 3.0, "2 GiB per billion parameters + 3 GiB (the seeds' LoRA rule: a frozen base)"),
    "qlora": (0.7, 3.4, "0.7 GiB per billion parameters + 3.4 GiB (fit to the seeds' 8B ~9, 27-32B ~22-26)"),
}
#: The seeds present thumb figures as approximate ("~"); the band shown beside them.
BAND = 0.15


def thumb(params: int, setup: LlmSetup) -> Thumb:
    """The rule-of-thumb total for this many parameters and this method."""
    key: str = setup.method
    if key == "full" and setup.master_weights:
        key = "full+master"
    per_b, fixed, text = RULES[key]
    gib = per_b * params / 1e9 + fixed
    total = round(gib * GIB)
    return Thumb(
        bytes=total,
        low_bytes=round(total * (1 - BAND)),
        high_bytes=round(total * (1 + BAND)),
        rule=text,
        source=SOURCE,
    )
