"""Explanations and the host verdict for multi-GPU estimates (docs/distributed.md).

Users expect per-GPU memory to fall from DDP to ZeRO-1, ZeRO-2 and ZeRO-3 and with offload; on small
models, few GPUs or large buffers it does not (DeepSpeed#5305, DeepSpeedExamples#123). When the
chosen strategy needs more than a simpler one, the estimate says so and names the components that
outweigh the sharding.
"""

from __future__ import annotations

from collections.abc import Callable

from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.errors import FitcheckError
from fitcheck.models import Estimate, LlmSetup, ModelSpec, Strategy, Target, Verdict
from fitcheck.units import MIB, fmt_gib, parse_option_memory

#: The order users expect per-GPU memory to fall in, within one engine family.
#: Differences below this are not named when explaining an order flip.
NEGLIGIBLE = 5 * MIB
EXPECTED_ORDER: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "zero3")
FSDP_ORDER: tuple[Strategy, ...] = ("ddp", "fsdp-grad-op", "fsdp")


def _peak_parts(est: Estimate) -> dict[str, int]:
    return {c.name: c.bytes for c in est.phase(est.peak_phase).components}


def _why(mine: Estimate, other: Estimate) -> str:
    a, b = _peak_parts(mine), _peak_parts(other)
    more = sorted(((a.get(k, 0) - b.get(k, 0), k) for k in a.keys() | b.keys()), reverse=True)
    grew = [f"{k} +{fmt_gib(d)}" for d, k in more if d > NEGLIGIBLE][:3]
    fell = [f"{k} -{fmt_gib(-d)}" for d, k in more[::-1] if d < -NEGLIGIBLE][:2]
    return "; ".join(grew) + (f" outweigh {', '.join(fell)}" if fell else "")


def order_notes(
    spec: ModelSpec,
    setup: LlmSetup,
    est: Estimate,
    estimate_fn: Callable[[ModelSpec, LlmSetup], Estimate],
) -> list[str]:
    """Warnings where a simpler strategy (or no offload) needs less per GPU than the chosen one."""
    s = setup.effective_strategy
    order = FSDP_ORDER if STRATEGY_FACTS[s].engine == "fsdp" else EXPECTED_ORDER
    others: list[LlmSetup] = []
    if s in order:
        others += [
            setup.model_copy(update={"strategy": o, "offload": "none"}) for o in order[: order.index(s)]
        ]
    if setup.offload != "none":
        others.append(setup.model_copy(update={"offload": "none"}))
    notes: list[str] = []
    for other in others:
        try:
            alt = estimate_fn(spec, other)
        except FitcheckError:
            continue
        if alt.device_bytes < est.device_bytes:
            label = other.effective_strategy + (
                " without offload" if other.offload == "none" and setup.offload != "none" else ""
            )
            notes.append(
                f"{s}{'' if setup.offload == 'none' else ' --offload ' + setup.offload} needs "
                f"{fmt_gib(est.device_bytes)} per GPU, more than {label} ({fmt_gib(alt.device_bytes)}): "
                f"{_why(est, alt)} (with {setup.world_size} GPU(s) the sharded states are small next to "
                "the engine's buffers)"
            )
    return notes


def host_verdict(v: Verdict, est: Estimate, target: Target, host_memory: str | None) -> Verdict:
    """Add the host budget (--host-memory, the catalog's node RAM, or this machine's RAM) and whether
    the estimate's host_bytes fits it."""
    budget = parse_option_memory("--host-memory", host_memory) if host_memory else target.host_memory_bytes
    if budget is None or est.host_bytes is None:
        return v.model_copy(update={"host_budget_bytes": budget})
    fits = est.host_bytes <= budget
    notes = v.notes
    if not fits:
        notes = (
            *notes,
            f"host memory: the node needs {fmt_gib(est.host_bytes)} of CPU RAM "
            f"({max(est.host_phases, key=lambda h: h.total_bytes).name}) "
            f"but has {fmt_gib(budget)}",
        )
    return v.model_copy(
        update={
            "host_budget_bytes": budget,
            "host_verdict": "fits" if fits else "does_not_fit",
            "notes": notes,
        }
    )
