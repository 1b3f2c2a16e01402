"""Speed facts the planners' throughput models read: utilisation per backend, an optimizer step's traffic.

One table per kind of fact, each row with its source. The LLM and the diffusion throughput models
both divide FLOPs by a device's dense peak times `UTILISATION`; the diffusion one adds the
optimizer step as memory traffic over the device's bandwidth (`STEP_BYTES`). docs/planner.md
("Throughput model") and docs/diffusion.md ("Speed") explain the models.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.facts.optimizers import EIGHT_BIT, OPTIMIZERS, OptimizerRow

#: Fraction of the dense peak a fine-tuning step sustains, per backend: (fraction, why).
UTILISATION: dict[str, tuple[float, str]] = {
    "cuda": (
        0.40,
        "below the 46-52% MFU of large pre-training runs (PaLM, arXiv 2204.02311 Table 3; Megatron-LM, "
        "arXiv 2104.04473), because fine-tuning stacks run unfused norms, RoPE and loss between matmuls",
    ),
    "rocm": (0.30, "assumed below CUDA: fewer fused kernels in the ROCm training stack (no measurement)"),
    "mps": (0.30, "assumed: PyTorch MPS and MLX run many small Metal kernels (no measurement)"),
    "cpu": (0.30, "assumed: oneDNN matmuls between memory-bound elementwise ops (no measurement)"),
}


@dataclass(frozen=True)
class StepTraffic:
    """Bytes one optimizer step reads and writes per trainable parameter, and how they add up."""

    bytes_per_param: int
    source: str


#: fp32 weight read and written (4 + 4) and its fp32 gradient read (4): every optimizer moves these.
#: kohya keeps trainable weights in fp32 (mixed precision autocasts the compute), so fp32 is the figure;
#: with full_bf16 the step moves less, which the ranking ignores.
WEIGHT_AND_GRAD = 4 + 4 + 4
#: Adafactor (beta1=None): the factored row and column states are negligible; the fp32 update tensor is
#: written once (transformers optimization.py, Adafactor.step).
ADAFACTOR_UPDATE = 4


def _traffic(name: str, row: OptimizerRow) -> StepTraffic:
    """An optimizer step's traffic from its state table: each state tensor read and written once, 4 B per
    fp32 element, 1 B per bitsandbytes uint8 one (the absmax blocks are under 2% and not counted)."""
    if name == "adafactor":
        update = f"12 + the fp32 update written once: {row.source}"
        return StepTraffic(WEIGHT_AND_GRAD + ADAFACTOR_UPDATE, update)
    per = 1 if name in EIGHT_BIT else 4
    return StepTraffic(
        WEIGHT_AND_GRAD + 2 * per * row.states, f"12 + {row.states} x 2 x {per} B of states: {row.source}"
    )


#: Bytes one step moves per trainable parameter, derived from `fitcheck.facts.optimizers.OPTIMIZERS`.
STEP_BYTES: dict[str, StepTraffic] = {name: _traffic(name, row) for name, row in OPTIMIZERS.items()}


def step_bytes(optimizer: str) -> int:
    """Bytes the optimizer step moves per trainable parameter (AdamW's for an optimizer not listed)."""
    row = STEP_BYTES.get(optimizer, STEP_BYTES["adamw"])
    return row.bytes_per_param
