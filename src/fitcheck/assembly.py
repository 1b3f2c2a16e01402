"""The one assembly both estimators end in: phases -> peak -> allocator reserve -> context -> device.

An estimator (the decoder engine's closed form, the diffusion simulator) names what is alive at the
peak of each phase; everything after that is workload-independent and lives here, so a term added to
an estimate (an uncertainty band, host memory) is added once.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from fitcheck.engine.band import band
from fitcheck.engine.overhead import context_bytes, reserve_bytes
from fitcheck.models import AnySetup, Component, Estimate, ParamCounts, Phase, Regime, Thumb
from fitcheck.vocab import PhaseName


def phase(name: PhaseName, comps: Iterable[Component]) -> Phase:
    """A phase from its components: zero-byte lines dropped, lines of the same id summed."""
    merged: dict[str, Component] = {}
    for c in comps:
        if c.bytes <= 0:
            continue
        if c.name in merged:
            old = merged[c.name]
            c = old.model_copy(update={"bytes": old.bytes + c.bytes})
        merged[c.name] = c
    kept = tuple(merged.values())
    return Phase(name=name, components=kept, total_bytes=sum(c.bytes for c in kept))


def assemble(
    *,
    model: str,
    model_name: str,
    model_source: str,
    setup: AnySetup,
    regime: Regime,
    params: ParamCounts,
    phases: Sequence[Phase],
    steady_bytes: int,
    live_tensors: int,
    target_context: int | None,
    thumb: Thumb | None = None,
    warnings: tuple[str, ...] = (),
    stranded_bytes: int = 0,
) -> Estimate:
    """The estimate from its phases.

    Args:
        steady_bytes: bytes alive through the whole step (model states and gradients); what the peak
            holds beyond them is short-lived and fragments the caching allocator.
        live_tensors: tensors alive at the peak (each loses about 1 MiB to the allocator's rounding).
        target_context: the target GPU's context bytes, when one is known.
        stranded_bytes: how far the reading at the loss, with the checkpointed forward's layer blocks
            cached beside it, stands above the allocated peak (engine/overhead.py `stranded_layer_blocks`).
    """
    peak = max(phases, key=lambda p: p.total_bytes)
    transient = max(0, peak.total_bytes - steady_bytes)
    reserve = reserve_bytes(setup.backend, live_tensors, transient, stranded_bytes)
    context = context_bytes(setup.backend, target_context)
    return Estimate(
        model=model,
        model_name=model_name,
        model_source=model_source,
        setup=setup,
        regime=regime,
        params=params,
        phases=tuple(phases),
        peak_phase=peak.name,
        peak_allocated_bytes=peak.total_bytes,
        allocator_reserve_bytes=reserve,
        peak_reserved_bytes=peak.total_bytes + reserve,
        context_bytes=context,
        device_bytes=peak.total_bytes + reserve + context,
        thumb=thumb,
        band=band(peak, reserve, context),
        warnings=warnings,
    )


def reassemble(
    est: Estimate, phases: Sequence[Phase], steady_bytes: int, live_tensors: int, stranded_bytes: int = 0
) -> Estimate:
    """``est`` with other phases (one GPU's share of a multi-GPU run), through the same assembly: peak,
    reserve, context, device bytes and band are recomputed; model, setup, regime and notes are kept.
    ``stranded_bytes``: the reserve's floor at the loss on this GPU (`assemble`)."""
    return assemble(
        model=est.model,
        model_name=est.model_name,
        model_source=est.model_source,
        setup=est.setup,
        regime=est.regime,
        params=est.params,
        phases=phases,
        steady_bytes=steady_bytes,
        live_tensors=live_tensors,
        target_context=est.context_bytes,
        thumb=est.thumb,
        warnings=est.warnings,
        stranded_bytes=stranded_bytes,
    )
