"""Optimizer states and step temporaries of the denoiser's trainable tensors (N-D shapes).

The rules are the one optimizer table's (`fitcheck.facts.optimizers`), shared with the decoder engine;
this module only hands it the simulator's shapes. Adafactor's factoring applies to the last two
dimensions of every tensor of two or more dimensions: for a 3x3 convolution that is ``6 c_out c_in``
of ``9 c_out c_in`` weights, not a negligible ``rows + cols``.

State dtype: kohya builds ``torch.optim.AdamW`` (foreach on CUDA; and lion-pytorch, prodigyopt)
directly, whose states are ``zeros_like(param)``: fp32 for fp32 LoRA and AMP weights, bf16 with
``full_bf16``.
"""

from __future__ import annotations

from fitcheck.facts import optimizers as opt
from fitcheck.facts.optimizers import Shape


def state_bytes(optimizer: str, shapes: list[Shape], param_bytes: int) -> int:
    """Optimizer states kept between steps for trainable tensors of ``param_bytes`` per element."""
    return opt.state_bytes(optimizer, [(s, 1) for s in shapes], param_bytes)


def step_transient_bytes(optimizer: str, shapes: list[Shape], param_bytes: int) -> int:
    """Temporaries alive inside ``optimizer.step()`` (kohya's torch AdamW takes the foreach path)."""
    return opt.step_temporary_bytes(optimizer, [(s, 1) for s in shapes], param_bytes, "foreach")
