"""Bytes per element of each storage dtype (PyTorch ``element_size()``; NF4 per bitsandbytes)."""

from __future__ import annotations

BYTES: dict[str, float] = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "nf4": 0.5,
    "fp4": 0.5,
}


def nbytes(dtype: str) -> int:
    """Whole bytes per element of a dense dtype."""
    b = BYTES[dtype]
    if b != int(b):
        raise ValueError(f"{dtype} is packed; use the quantization rules")
    return int(b)


def promote(a: str, b: str) -> str:
    """Result dtype of a binary op between two floating dtypes (PyTorch type promotion)."""
    if a == b:
        return a
    if "fp32" in (a, b):
        return "fp32"
    return "fp32"  # bf16 op fp16 promotes to fp32
