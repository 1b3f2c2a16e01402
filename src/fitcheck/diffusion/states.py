"""Optimizer states and step temporaries per trainable tensor (N-D shapes: convolutions are 4-D).

Per-element rules come from ``fitcheck.engine.states`` (the LLM engine's table: AdamW 2 states,
Lion 1, SGD 1, Prodigy 4, bitsandbytes 8-bit 1 B + an fp32 absmax per 256, fp32 below 4096
elements). What differs here is the tensor shapes and Adafactor's factoring, which
``transformers.optimization.Adafactor`` applies to the last two dimensions of every tensor of two
or more dimensions: a row state ``shape[:-1]`` and a column state ``shape[:-2] + shape[-1:]``, both
fp32 (it computes on ``grad.float()``). For a 3x3 convolution that is ``6 c_out c_in`` of
``9 c_out c_in`` weights, not a negligible ``rows + cols``.

State dtype: kohya builds ``torch.optim.AdamW`` (and lion-pytorch, prodigyopt) directly, whose
states are ``zeros_like(param)``: fp32 for fp32 LoRA and AMP weights, bf16 with ``full_bf16``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from fitcheck.engine.states import BNB8_BLOCK, BNB8_MIN_SIZE, optimizer_bytes_per_param

Shape = tuple[int, ...]


def state_bytes(optimizer: str, shapes: Iterable[Shape], param_bytes: int) -> int:
    """Optimizer states kept between steps for trainable tensors of ``param_bytes`` per element."""
    total = 0.0
    for shape in shapes:
        n = math.prod(shape)
        if optimizer == "adafactor":
            total += 4 * (_adafactor_elems(shape))
        elif optimizer in ("adamw8bit", "paged-adamw8bit", "lion8bit"):
            k = 1 if optimizer == "lion8bit" else 2
            total += k * n * 4 if n < BNB8_MIN_SIZE else k * (n + 4 * math.ceil(n / BNB8_BLOCK))
        else:
            total += n * optimizer_bytes_per_param(optimizer, param_bytes)
    return int(total)


def _adafactor_elems(shape: Shape) -> int:
    if len(shape) >= 2:
        return math.prod(shape[:-1]) + math.prod(shape[:-2]) * shape[-1]
    return math.prod(shape)


def step_transient_bytes(optimizer: str, shapes: list[Shape], param_bytes: int) -> int:
    """Temporaries alive inside ``optimizer.step()``.

    - torch AdamW, foreach (the CUDA default kohya gets): ``_foreach_sqrt(exp_avg_sq)``, one copy of
      every second moment at once (torch/optim/adamw.py ``_multi_tensor_adamw``);
    - Adafactor (transformers): per tensor, fp32 copies of the gradient and (for 16-bit weights) of
      the weight, ``grad**2 + eps``, and ``_approx_sq_grad``'s product with its two factors, one
      tensor at a time (the largest decides; traced: tests/data/calibration/diffusion);
    - Lion (lion-pytorch), Prodigy: per-tensor temporaries of the parameter's size;
    - bitsandbytes 8-bit and SGD: updated in place.
    """
    if not shapes:
        return 0
    largest = max(math.prod(s) for s in shapes)
    total = sum(math.prod(s) for s in shapes)
    if optimizer == "adamw":
        return total * param_bytes
    if optimizer == "adafactor":
        # grad.float(), p.float() (16-bit weights only), grad**2 + eps, and the new update from
        # _approx_sq_grad, whose row and column factors (n / shape[-1] each) are alive with it.
        copies = 3 if param_bytes == 4 else 4
        return max(
            4 * (copies * math.prod(s) + (2 * math.prod(s) // s[-1] if len(s) >= 2 else 0)) for s in shapes
        )
    if optimizer in ("lion", "prodigy"):
        return 2 * param_bytes * largest
    return 0
