"""Optimizers as each regime builds them, including two small ones torch does not ship.

- ``generic`` AdamW: moments in fp32 while weights and grads stay in the compute dtype (the seeds'
  12 B/param), optionally an fp32 master copy (16 B/param). torch's AdamW keeps moments in the param
  dtype, so a small for-loop AdamW stands in; its transients are one fp32 copy of one parameter's
  grad (and update) at a time, like torch's for-loop implementation.
- ``hf`` / ``torchtune`` AdamW: ``torch.optim.AdamW(fused=True)``, states in the param dtype.
- SGD (momentum 0.9, foreach as torch picks on CUDA), Lion (one state, param dtype, as lion-pytorch),
  Adafactor (``transformers.optimization.Adafactor`` with HF Trainer's arguments).
- 8-bit bitsandbytes optimizers and Prodigy are not measured (no CPU/fake path here).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from fitcheck.errors import OptionError
from fitcheck.models import AnySetup, Regime

LR = 1e-4
UNSUPPORTED = {
    "adamw8bit": "bitsandbytes 8-bit AdamW",
    "paged-adamw8bit": "bitsandbytes paged 8-bit AdamW",
    "lion8bit": "bitsandbytes 8-bit Lion",
    "prodigy": "Prodigy",
}


class Fp32MomentAdamW(torch.optim.Optimizer):
    """AdamW with fp32 moments (and optionally an fp32 master copy) for low-precision parameters."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = LR, master_weights: bool = False) -> None:
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0})
        self.master_weights = master_weights

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                    if self.master_weights and p.dtype != torch.float32:
                        state["master"] = p.detach().to(torch.float32)
                state["step"] += 1
                grad = p.grad.to(torch.float32)
                state["exp_avg"].mul_(b1).add_(grad, alpha=1 - b1)
                state["exp_avg_sq"].mul_(b2).addcmul_(grad, grad, value=1 - b2)
                del grad
                denom = state["exp_avg_sq"].sqrt().add_(group["eps"])
                update = state["exp_avg"] / denom
                del denom
                target = state.get("master")
                if target is None:
                    p.add_(update.to(p.dtype), alpha=-group["lr"])
                else:
                    target.add_(update, alpha=-group["lr"])
                    p.copy_(target)


class Lion(torch.optim.Optimizer):
    """Lion (Chen et al. 2023) as lion-pytorch steps it: one momentum state in the parameter dtype, and
    its update expression (github.com/lucidrains/lion-pytorch, lion_pytorch.py ``update_fn``)."""

    def __init__(self, params: Iterable[torch.Tensor], lr: float = LR) -> None:
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.99), "weight_decay": 0.0})

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["exp_avg"] = torch.zeros_like(p)
                m = state["exp_avg"]
                # lion-pytorch update_fn: clone, then an out-of-place add (two tensors briefly alive)
                update = m.clone().mul_(b1).add(p.grad, alpha=1 - b1).sign_()
                p.add_(update, alpha=-group["lr"])
                m.mul_(b2).add_(p.grad, alpha=1 - b2)


def make_optimizer(params: list[torch.nn.Parameter], setup: AnySetup, regime: Regime) -> Any:
    """The optimizer the regime's trainer builds for ``setup.optimizer``.

    Raises:
        OptionError: an optimizer fitcheck cannot measure.
    """
    name = setup.optimizer
    if name in UNSUPPORTED:
        raise OptionError(
            f"{UNSUPPORTED[name]} cannot be measured here (bitsandbytes/third-party kernels have no "
            "fake-tensor path on this build); measure adamw and scale the states (docs/measure.md)"
        )
    if name == "adamw":
        if regime.optimizer_state_dtype == "fp32":
            return Fp32MomentAdamW(params, master_weights=regime.master_weights)
        if regime.fused_optimizer:
            return torch.optim.AdamW(params, lr=LR, fused=True)
        if regime.foreach_denom:
            raise OptionError(
                f"--optimizer-impl foreach-2.0 is torch 2.0's AdamW step; this torch ({torch.__version__}) "
                "runs its own: measure with foreach"
            )
        return torch.optim.AdamW(params, lr=LR, foreach=True)
    if name == "sgd":
        return torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=True)
    if name == "lion":
        return Lion(params)
    if name == "adafactor":
        from transformers.optimization import Adafactor

        # HF Trainer's optim="adafactor": scale_parameter=False, relative_step=False, fixed lr.
        return Adafactor(params, lr=LR, scale_parameter=False, relative_step=False, warmup_init=False)
    raise OptionError(f"unknown optimizer '{name}'")


def state_tensors(optimizer: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """(state key, tensor) for every tensor the optimizer keeps between steps."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                yield key, value
