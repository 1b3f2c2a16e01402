"""Every private torch and transformers internal the tracers rely on, in one place.

The tracers (`fitcheck.measure.trace` for LLMs, `fitcheck.measure.diffusion` for diffusers
denoisers) count storages under a dispatch mode, on fake tensors, with CUDA's autocast policy
registered on the CPU autocast key. That needs names PyTorch and transformers do not promise to
keep. They are all here, so an upgrade is checked in one module: ``tests/test_measure_internals.py``
resolves each of them and names the versions they were checked on (`CHECKED_ON`); the ``torch``
extra in pyproject.toml is pinned to the range around those versions.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

__all__ = [
    "CHECKED_ON",
    "FakeTensorMode",
    "TorchDispatchMode",
    "current_autograd_node",
    "destroy_library",
    "exclude_autocast_cpu",
    "fakeify",
    "grouped_mm_gate",
    "has_autocast_cpu_kernel",
    "param_bytes",
    "set_grouped_mm_gate",
    "storage_key",
    "tree_leaves",
    "tree_map",
    "unique_params",
]

#: Versions every internal below was checked on (the tests and the calibration records ran on them).
CHECKED_ON = {"torch": "2.13.0", "transformers": "5.24.0", "peft": "0.21.2", "diffusers": "0.42.1"}

_AUTOCAST_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastCPU)


def exclude_autocast_cpu() -> Any:
    """``torch._C._ExcludeDispatchKeyGuard`` for AutocastCPU: run an op below the autocast key."""
    return torch._C._ExcludeDispatchKeyGuard(_AUTOCAST_CPU)


def has_autocast_cpu_kernel(op: Any) -> bool:
    """Whether CPU autocast already has a kernel for ``op`` (``torch._C._dispatch_has_kernel...``)."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "AutocastCPU"))


def destroy_library(lib: Any) -> None:
    """Unregister the kernels a ``torch.library.Library`` added (``Library._destroy``)."""
    lib._destroy()


def current_autograd_node() -> Any:
    """The autograd node running now in backward, or None (``torch._C._current_autograd_node``)."""
    return torch._C._current_autograd_node()


def storage_key(t: Any) -> int:
    """Identity of a tensor's storage (``untyped_storage()._cdata``): tied weights share one."""
    return int(t.untyped_storage()._cdata)


def unique_params(model: Any) -> list[Any]:
    """Parameters of ``model``, each storage once (tied weights counted once)."""
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        key = storage_key(p)
        if key not in seen:
            seen.add(key)
            out.append(p)
    return out


def param_bytes(model: Any) -> int:
    return sum(p.untyped_storage().nbytes() for p in unique_params(model))


def _slots(module: Any) -> Iterator[dict[str, Any]]:
    yield module._parameters
    yield module._buffers


def fakeify(model: Any, fake: Any) -> None:
    """Replace meta parameters and buffers by fake CPU tensors of the same shape, dtype and sharing.

    The model is built on the meta device first: peft moves adapters with ``module.to()``, which
    swaps fake parameters and fails on the weak references FakeTensorMode keeps to them. Assigning
    into ``_parameters``/``_buffers`` directly keeps tied weights tied (one fake tensor per meta one).
    """
    memo: dict[int, Any] = {}
    with fake:
        for module in model.modules():
            for slot, is_param in zip(_slots(module), (True, False), strict=True):
                for name, t in list(slot.items()):
                    if t is None:
                        continue
                    if id(t) not in memo:
                        new = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cpu")
                        memo[id(t)] = (
                            torch.nn.Parameter(new, requires_grad=t.requires_grad) if is_param else new
                        )
                    slot[name] = memo[id(t)]
        _fake_prompt_tokens(model)


def _fake_prompt_tokens(model: Any) -> None:
    """peft's prompt-learning models keep their virtual token ids in a plain dict (``prompt_tokens``,
    peft_model.py ``_setup_prompt_encoder``: ``torch.arange(num_virtual_tokens)``), neither parameter nor
    buffer: rebuilt here as fake CPU tensors (call inside the fake mode)."""
    tokens = getattr(model, "prompt_tokens", None)
    if isinstance(tokens, dict):
        for name, t in list(tokens.items()):
            tokens[name] = torch.arange(t.numel(), dtype=t.dtype, device="cpu")


def grouped_mm_gate() -> Any:
    """transformers' private ``integrations.moe._can_use_grouped_mm`` (which MoE expert path runs)."""
    from transformers.integrations import moe

    return moe._can_use_grouped_mm


def set_grouped_mm_gate(fn: Any) -> None:
    from transformers.integrations import moe

    moe._can_use_grouped_mm = fn
