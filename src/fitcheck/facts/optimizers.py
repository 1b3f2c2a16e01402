"""Optimizers: state bytes per element, temporaries inside ``step()``, the implementation a trainer runs.

One table for both estimators (the decoder engine and the diffusion simulator); shapes are N-D
(convolutions are 4-D, LLM vectors 1-D). Rules and sources per row; docs/methodology.md, "Model states".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Shape = tuple[int, ...]
#: A trainable tensor shape and how many tensors have it.
Shapes = Sequence[tuple[Shape, int]]

#: bitsandbytes 8-bit optimizers: one uint8 per state element + an fp32 absmax per 256-element block;
#: tensors under 4096 elements keep 32-bit states (bitsandbytes optim/optimizer.py, min_8bit_size).
BNB8_BLOCK = 256
BNB8_MIN_SIZE = 4096
EIGHT_BIT = ("adamw8bit", "paged-adamw8bit", "lion8bit")
#: bitsandbytes paged optimizers allocate the state buffers of tensors with 1e5+ elements with
#: ``F.get_paged`` (CUDA managed memory from ``cget_managed_ptr``, wrapped by ``torch.frombuffer``), which
#: PyTorch's caching allocator never sees; smaller tensors' states and every absmax are ``torch.zeros`` on
#: the device (optim/optimizer.py ``get_state_buffer`` / ``init_state``, functional.py ``get_paged``
#: @0.43.3).
PAGED = ("paged-adamw", "paged-adamw8bit")
#: bitsandbytes 32-bit optimizers keep fp32 states whatever the parameter's dtype
#: (``Optimizer2State.init_state``: ``dtype = torch.float32`` when ``optim_bits == 32``, then
#: ``get_state_buffer(p, dtype=torch.float32)``) and update in place in their kernels.
BNB32 = ("paged-adamw",)
#: Every optimizer that runs bitsandbytes' CUDA kernels (refused on Apple silicon by the estimators and
#: the planner; HF's ``lion`` names bitsandbytes' 32-bit Lion too, which the planner knows per trainer).
BITSANDBYTES = (*BNB32, *EIGHT_BIT)
PAGED_MIN_NUMEL = 100_000

#: How an AdamW step allocates: torch's foreach path (``_foreach_sqrt(exp_avg_sq)``, one copy of every
#: second moment at once), the fused kernel (in place), or a for-loop step over fp32 moments of 16-bit
#: parameters (``sqrt(v)`` and the update of one tensor at a time, fp32); ``foreach-2.0``: the foreach
#: path of torch 2.0.x, which also held ``denom = _foreach_add(sqrt(v), eps)`` (two copies; in place from
#: torch 2.1, pytorch/pytorch#104898).
AdamImpl = Literal["foreach", "foreach-2.0", "fused", "loop-fp32"]


@dataclass(frozen=True)
class OptimizerRow:
    """One optimizer: state tensors per parameter element, and where that comes from."""

    states: int
    source: str


OPTIMIZERS: dict[str, OptimizerRow] = {
    "adamw": OptimizerRow(2, "torch.optim.AdamW: exp_avg, exp_avg_sq (zeros_like(param))"),
    "adamw8bit": OptimizerRow(2, "bitsandbytes AdamW8bit: two uint8 states + fp32 absmax per 256"),
    "paged-adamw": OptimizerRow(
        2, "bitsandbytes PagedAdamW (optim_bits 32): two fp32 states, in paged memory from 1e5 elements"
    ),
    "paged-adamw8bit": OptimizerRow(2, "bitsandbytes PagedAdamW8bit: as AdamW8bit, in paged memory"),
    "adafactor": OptimizerRow(
        1,
        "transformers.optimization.Adafactor (beta1=None): factored fp32 second moment, row "
        "shape[:-1] + column shape[:-2]+shape[-1:] for 2+-D tensors, full for vectors",
    ),
    "lion": OptimizerRow(1, "lion-pytorch Lion: exp_avg (zeros_like(param))"),
    "lion8bit": OptimizerRow(1, "bitsandbytes Lion8bit: one uint8 state + fp32 absmax per 256"),
    "prodigy": OptimizerRow(4, "prodigyopt Prodigy: exp_avg, exp_avg_sq, s, p0 (zeros_like(param))"),
    "sgd": OptimizerRow(1, "torch.optim.SGD momentum_buffer"),
}

#: Temporaries of one step, per optimizer (the largest tensor decides for per-tensor loops):
STEP_SOURCES: dict[str, str] = {
    "adamw": "torch/optim/adamw.py: foreach holds _foreach_sqrt(exp_avg_sq) for all tensors (torch 2.0.x: "
    "and denom = _foreach_add(sqrt, eps), in place from 2.1, pytorch/pytorch#104898); fused is in "
    "place; a for-loop step over fp32 moments holds sqrt(v) and the update of one tensor (traced)",
    "adafactor": "transformers Adafactor.step, per tensor: grad.float(), p.float() (16-bit weights only), "
    "grad**2 + eps, and the update from _approx_sq_grad with its row and column factors (traced: "
    "tests/data/calibration, llama2-11 and mixtral-11; tests/data/calibration/diffusion)",
    "lion": "lion-pytorch update_fn: exp_avg.clone().mul_(beta1).add(grad, ...) holds two tensors of the "
    "parameter's size (github.com/lucidrains/lion-pytorch, lion_pytorch.py; traced: qwen2-11, qwen3_moe-11)",
    "prodigy": "prodigyopt: per-tensor temporaries of the parameter's size (two)",
    "sgd": "torch foreach SGD: momentum and weights updated in place",
    "8-bit": "bitsandbytes 8-bit kernels update states and weights in place",
    "paged-adamw": "bitsandbytes 32-bit kernels (optimizer_update_32bit) update states and weights in place",
}


def _numel(shape: Shape) -> int:
    return math.prod(shape)


def _adafactor_elems(shape: Shape) -> int:
    if len(shape) >= 2:
        return _numel(shape[:-1]) + _numel(shape[:-2]) * shape[-1]
    return _numel(shape)


def state_bytes(optimizer: str, shapes: Iterable[tuple[Shape, int]], state_elem_bytes: int) -> int:
    """Optimizer states kept between steps, for trainable tensors whose states are ``state_elem_bytes``
    per element (the parameter dtype, or fp32 moments); Adafactor's are fp32, 8-bit ones uint8."""
    total = 0.0
    states = OPTIMIZERS[optimizer].states
    for shape, k in shapes:
        n = _numel(shape)
        if optimizer == "adafactor":
            total += k * 4 * _adafactor_elems(shape)
        elif optimizer in EIGHT_BIT:
            total += k * states * (n * 4 if n < BNB8_MIN_SIZE else n + 4 * math.ceil(n / BNB8_BLOCK))
        elif optimizer in BNB32:
            total += k * states * n * 4
        else:
            total += k * states * n * state_elem_bytes
    return int(total)


def paged_state_bytes(optimizer: str, shapes: Iterable[tuple[Shape, int]]) -> int:
    """The part of `state_bytes` a paged optimizer keeps in CUDA managed memory: the states of tensors
    with at least `PAGED_MIN_NUMEL` elements (uint8, their fp32 absmax staying in the allocator; or fp32
    for the 32-bit ones)."""
    if optimizer not in PAGED:
        return 0
    states = OPTIMIZERS[optimizer].states
    per = 4 if optimizer in BNB32 else 1
    return sum(k * states * per * _numel(s) for s, k in shapes if _numel(s) >= PAGED_MIN_NUMEL)


def step_temporary_bytes(optimizer: str, shapes: Shapes, param_bytes: int, adam: AdamImpl = "foreach") -> int:
    """Temporaries alive inside ``optimizer.step()`` (`STEP_SOURCES` gives each rule's source)."""
    if not shapes:
        return 0
    largest = max(_numel(s) for s, _ in shapes)
    if optimizer == "adamw":
        if adam == "fused":
            return 0
        if adam == "loop-fp32":
            return 2 * 4 * largest
        copies = 2 if adam == "foreach-2.0" else 1
        return copies * sum(k * _numel(s) for s, k in shapes) * param_bytes
    if optimizer == "adafactor":
        copies = 3 if param_bytes == 4 else 4
        return max(
            4 * (copies * _numel(s) + (2 * _numel(s) // s[-1] if len(s) >= 2 else 0)) for s, _ in shapes
        )
    if optimizer in ("lion", "prodigy"):
        return 2 * param_bytes * largest
    return 0  # sgd, 8-bit: in place
