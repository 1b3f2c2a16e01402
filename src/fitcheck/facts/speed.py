"""Speed facts the planners' throughput models read: utilisation per backend, an optimizer step's traffic.

One table per kind of fact, each row with its source. The LLM and the diffusion throughput models
both divide FLOPs by a device's dense peak times `UTILISATION`; the diffusion one adds the
optimizer step as memory traffic over the device's bandwidth (`STEP_BYTES`). docs/planner.md
("Throughput model") and docs/diffusion.md ("Speed") explain the models.
"""

from __future__ import annotations

from dataclasses import dataclass

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


#: Every row: the fp32 weight read and written (4 + 4) and its fp32 gradient read (4) = 12 B, plus
#: each state tensor read and written once (`fitcheck.facts.optimizers.OPTIMIZERS` counts them:
#: 2 x 4 B per fp32 state element, 2 x 1 B per bitsandbytes uint8 one; the absmax blocks are
#: under 2% and not counted). kohya keeps trainable weights in fp32 (mixed precision autocasts the
#: compute), so fp32 is the figure; with full_bf16 the step moves less, which the ranking ignores.
STEP_BYTES: dict[str, StepTraffic] = {
    "adamw": StepTraffic(28, "12 + exp_avg, exp_avg_sq (fp32): 2 x 8 (torch/optim/adamw.py)"),
    "adamw8bit": StepTraffic(16, "12 + two uint8 states: 2 x 2 (bitsandbytes optim/adamw.py, blockwise)"),
    "paged-adamw8bit": StepTraffic(16, "as adamw8bit; paging moves states only under memory pressure"),
    "adafactor": StepTraffic(
        16,
        "12 + the fp32 update tensor written once (4); the factored row and column states are "
        "negligible (transformers optimization.py, Adafactor.step with beta1=None)",
    ),
    "lion": StepTraffic(20, "12 + exp_avg (fp32): 8 (lucidrains/lion-pytorch, lion_pytorch.py update_fn)"),
    "lion8bit": StepTraffic(14, "12 + one uint8 state: 2 (bitsandbytes optim/lion.py, 8-bit blockwise)"),
    "prodigy": StepTraffic(44, "12 + exp_avg, exp_avg_sq, s, p0 (fp32): 4 x 8 (prodigyopt prodigy.py)"),
    "sgd": StepTraffic(20, "12 + momentum_buffer (fp32): 8 (torch/optim/sgd.py)"),
}


def step_bytes(optimizer: str) -> int:
    """Bytes the optimizer step moves per trainable parameter (AdamW's for an optimizer not listed)."""
    row = STEP_BYTES.get(optimizer, STEP_BYTES["adamw"])
    return row.bytes_per_param
