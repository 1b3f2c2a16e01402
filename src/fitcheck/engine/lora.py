"""Which projections LoRA wraps, and how many adapter parameters that makes.

``attn``: the attention projections; ``all-linear``: every projection inside the decoder layers
(peft's ``all-linear`` excludes the output layer; with transformers >= 5 and peft >= 0.18 it also
reaches MoE routers and the 3-D expert parameters, through ``ParamWrapper``); otherwise a
comma-separated list of module names as peft matches them (a name matches a module whose name ends
with it).
"""

from __future__ import annotations

from fitcheck.engine.params import LayerKind, Linear, layer_kinds
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup


def _names(a: DecoderArch) -> list[str]:
    seen: list[str] = []
    for kind in layer_kinds(a):
        for lin in kind.linears(a):
            if lin.name not in seen:
                seen.append(lin.name)
    return seen


def targeted(a: DecoderArch, targets: str, lin: Linear) -> bool:
    """Whether LoRA wraps this projection under the targets spec."""
    if targets == "all-linear":
        return lin.all_linear
    if targets == "attn":
        return lin.role == "attn"
    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    short = lin.name.split(".")[-1]
    return any(lin.name == w or short == w or lin.name.endswith("." + w) for w in wanted)


def validate_targets(a: DecoderArch, targets: str) -> None:
    """Raise `OptionError` when a named target matches no projection of this model."""
    if targets in ("all-linear", "attn"):
        return
    names = _names(a)
    wanted = [t.strip() for t in targets.split(",") if t.strip()]
    if not wanted:
        raise OptionError("--lora-targets is empty: use attn, all-linear or module names")
    for w in wanted:
        if not any(n == w or n.split(".")[-1] == w or n.endswith("." + w) for n in names):
            raise OptionError(
                f"--lora-targets: this model has no module '{w}'; it has {', '.join(names)} "
                "(or use attn / all-linear)"
            )


def adapter_params_per_layer(a: DecoderArch, setup: LlmSetup, kind: LayerKind) -> int:
    """LoRA parameters in one layer: r(d_in + d_out) per wrapped projection, + d_out with DoRA."""
    total = 0
    for lin in kind.linears(a):
        if targeted(a, setup.lora_targets, lin):
            r = setup.lora_rank * lin.lora_factor
            per = r * (lin.d_in + lin.d_out) + (lin.d_out if setup.dora else 0)
            total += lin.copies * per
    return total


def adapter_params(a: DecoderArch, setup: LlmSetup) -> int:
    """All LoRA (and DoRA magnitude) parameters of the model."""
    return sum(k.count * adapter_params_per_layer(a, setup, k) for k in layer_kinds(a))
