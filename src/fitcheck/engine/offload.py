"""Activation offload: saved activations (or checkpoints) kept in pinned CPU memory during the step.

* torchtune ``enable_activation_offloading`` wraps the model's forward in ``OffloadActivations``, a
  ``saved_tensors_hooks`` context that moves every saved tensor to the CPU on a side stream and
  prefetches it back for backward (torchtune training/_activation_offloading.py @e511d5a2); with
  checkpointing only the checkpoints remain to move.
* Unsloth's ``use_gradient_checkpointing="unsloth"`` saves each checkpointed layer's input with
  ``hidden_states.to("cpu", non_blocking=True)`` and brings it back in that layer's backward
  (``Unsloth_Offloaded_Gradient_Checkpointer``; axolotl vendors it as
  utils/gradient_checkpointing/unsloth.py).

The device keeps the layer in use and the one in flight (two layers' worth); the rest is host memory.
"""

from __future__ import annotations

from fitcheck.models import LlmSetup, Regime

#: Layers whose saved tensors are on the device at once while offloading: the one in use and the one
#: being copied (both implementations overlap the copy with compute on a side stream).
IN_FLIGHT_LAYERS = 2


def offloaded(setup: LlmSetup, regime: Regime) -> bool:
    """Whether saved activations / checkpoints live on the CPU between forward and backward."""
    return setup.offload_activations or (regime.offload_checkpoints and setup.grad_ckpt)


def device_share(setup: LlmSetup, regime: Regime, layers: int) -> float:
    """Fraction of the layers' saved tensors (or checkpoints) that stays on the device."""
    if not offloaded(setup, regime):
        return 1.0
    return min(layers, IN_FLIGHT_LAYERS) / layers


def rule(setup: LlmSetup, regime: Regime, layers: int) -> str:
    """The note a component gets when offloading moved most of it to the host."""
    if not offloaded(setup, regime) or layers <= IN_FLIGHT_LAYERS:
        return ""
    return f"; offloaded to the CPU, {IN_FLIGHT_LAYERS} layers' worth on the device"
