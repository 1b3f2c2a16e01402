"""A small module tree: parameters with shapes, LoRA attachment, forward functions over `ops`.

The tree is the single source of truth for a part: its exact parameter count (checked against the
diffusers/transformers classes built on the meta device), the modules kohya's LoRA wraps (matched by
the class names kohya looks for), and the step the simulator runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from fitcheck.diffusion.sim import ops
from fitcheck.diffusion.sim.core import Param, T, sim


class Module:
    """Like ``torch.nn.Module``: attributes that are `Param` or `Module` are registered in order."""

    #: The class name kohya's LoRA matches (``Transformer2DModel``, ``ResnetBlock2D``, ...).
    kohya: str = ""
    _params: dict[str, Param]
    _mods: dict[str, Module]

    def __init__(self) -> None:
        object.__setattr__(self, "_params", {})
        object.__setattr__(self, "_mods", {})

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, Param):
            self._params[name] = value
        elif isinstance(value, Module):
            self._mods[name] = value
        object.__setattr__(self, name, value)

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        call = cls.__dict__.get("__call__")
        if call is None:
            return

        def traced(self: Module, *a: Any, **k: Any) -> Any:
            s = sim()
            if not s.debug:
                return call(self, *a, **k)
            s.where.append(getattr(self, "_path", type(self).__name__))
            try:
                return call(self, *a, **k)
            finally:
                s.where.pop()

        cls.__call__ = traced  # type: ignore[method-assign]

    def name_paths(self) -> None:
        """Debugging: give every module its dotted path (used as the allocation site)."""
        for name, m in self.named_modules():
            object.__setattr__(m, "_path", name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} has no forward")

    def add(self, name: str, mod: Module) -> Module:
        self._mods[name] = mod
        return mod

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        yield prefix, self
        for name, m in self._mods.items():
            yield from m.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_params(self, prefix: str = "") -> Iterator[tuple[str, Param]]:
        for name, p in self._params.items():
            yield (f"{prefix}.{name}" if prefix else name), p
        for name, m in self._mods.items():
            yield from m.named_params(f"{prefix}.{name}" if prefix else name)

    def numel(self) -> int:
        """Parameters (what ``sum(p.numel() for p in m.parameters())`` counts)."""
        return sum(p.numel for _, p in self.named_params() if p.kind != "buffer")

    def buffer_numel(self) -> int:
        """Persistent buffers stored beside the weights (SD3's positional table)."""
        return sum(p.numel for _, p in self.named_params() if p.kind == "buffer")


class Seq(Module):
    """An indexed list of modules (``nn.ModuleList``)."""

    def __init__(self, mods: Sequence[Module]) -> None:
        super().__init__()
        self.items = list(mods)
        for i, m in enumerate(mods):
            self.add(str(i), m)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


@dataclass
class LoRA:
    """kohya's LoRAModule: ``org(x) + up(down(x)) * scale``; down keeps the wrapped layer's kernel."""

    down: Param
    up: Param
    conv: bool = False
    stride: int = 1
    padding: int = 0

    @property
    def numel(self) -> int:
        return self.down.numel + self.up.numel

    def apply(self, x: T, org: T) -> T:
        """``org + lora_up(lora_down(x)) * multiplier * scale`` (networks/lora.py LoRAModule.forward)."""
        if self.conv:
            lx = ops.conv2d(x, self.down, None, self.stride, self.padding)
            lx = ops.conv2d(lx, self.up, None)
        else:
            lx = ops.linear(x, self.down)
            lx = ops.linear(lx, self.up)
        return ops.add(org, ops.scale(ops.scale(lx)))


class Linear(Module):
    """``nn.Linear``; a LoRA may be attached (kohya replaces its forward)."""

    kohya = "Linear"

    def __init__(self, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        self.d_in, self.d_out = d_in, d_out
        self.weight = Param((d_out, d_in))
        self.bias = Param((d_out,), "bias") if bias else None
        self.lora: LoRA | None = None

    def attach(self, rank: int) -> LoRA:
        self.lora = LoRA(Param((rank, self.d_in), "lora"), Param((self.d_out, rank), "lora"))
        return self.lora

    def __call__(self, x: T) -> T:
        out = ops.linear(x, self.weight, self.bias)
        return out if self.lora is None else self.lora.apply(x, out)


class Conv2d(Module):
    """``nn.Conv2d`` (square kernel)."""

    kohya = "Conv2d"

    def __init__(self, c_in: int, c_out: int, k: int, stride: int = 1, padding: int = 0, bias: bool = True):
        super().__init__()
        self.c_in, self.c_out, self.k, self.stride, self.padding = c_in, c_out, k, stride, padding
        self.weight = Param((c_out, c_in, k, k))
        self.bias = Param((c_out,), "bias") if bias else None
        self.lora: LoRA | None = None

    def attach(self, rank: int) -> LoRA:
        k = self.k
        self.lora = LoRA(
            Param((rank, self.c_in, k, k), "lora"),
            Param((self.c_out, rank, 1, 1), "lora"),
            conv=True,
            stride=self.stride,
            padding=self.padding,
        )
        return self.lora

    def __call__(self, x: T) -> T:
        out = ops.conv2d(x, self.weight, self.bias, self.stride, self.padding)
        return out if self.lora is None else self.lora.apply(x, out)


class GroupNorm(Module):
    def __init__(self, groups: int, c: int, affine: bool = True) -> None:
        super().__init__()
        self.groups = groups
        self.weight = Param((c,), "norm") if affine else None
        self.bias = Param((c,), "norm") if affine else None

    def __call__(self, x: T) -> T:
        return ops.group_norm(x, self.weight, self.bias, self.groups)


class LayerNorm(Module):
    def __init__(self, d: int, affine: bool = True, bias: bool = True) -> None:
        super().__init__()
        self.weight = Param((d,), "norm") if affine else None
        self.bias = Param((d,), "norm") if affine and bias else None

    def __call__(self, x: T) -> T:
        return ops.layer_norm(x, self.weight, self.bias)


class Embedding(Module):
    """A lookup table (token and position embeddings); the lookup output is a new tensor."""

    def __init__(self, n: int, d: int) -> None:
        super().__init__()
        self.weight = Param((n, d), "embedding")


def lora_targets(root: Module, classes: tuple[str, ...]) -> Iterator[tuple[str, Module]]:
    """Linear and Conv2d layers inside modules whose kohya class is in ``classes``, each once."""
    seen: set[int] = set()
    for name, mod in root.named_modules():
        if mod.kohya in classes:
            for child_name, child in mod.named_modules(name):
                if isinstance(child, Linear | Conv2d) and id(child) not in seen:
                    seen.add(id(child))
                    yield child_name, child
