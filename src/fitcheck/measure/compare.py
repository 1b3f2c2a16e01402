"""Estimate vs measurement, per phase: the data document and its plain-text table (torch-free).

The error is ``(estimate - measured) / measured``: positive means the engine over-estimates. Both
sides are allocated tensor bytes (the estimate's ``total_bytes`` per phase, before allocator reserve
and CUDA context; the measurement's tensor-level peak).
"""

from __future__ import annotations

from typing import Any

from fitcheck.measure.result import MeasuredStep
from fitcheck.models import Estimate, LlmSetup
from fitcheck.units import GIB, fmt_count


def _err(est: int, meas: int) -> float | None:
    return None if meas == 0 else round(100.0 * (est - meas) / meas, 2)


def comparison_rows(est: Estimate | None, meas: MeasuredStep) -> list[dict[str, Any]]:
    """One row per phase and one for the peak: estimate bytes, measured bytes, error %."""
    rows: list[dict[str, Any]] = []
    for ph in meas.phases:
        e = est.phase(ph.name).total_bytes if est is not None else None
        rows.append(
            {
                "phase": ph.name,
                "estimate_bytes": e,
                "measured_bytes": ph.peak_bytes,
                "error_pct": None if e is None else _err(e, ph.peak_bytes),
            }
        )
    e_peak = est.peak_allocated_bytes if est is not None else None
    rows.append(
        {
            "phase": "peak",
            "estimate_bytes": e_peak,
            "measured_bytes": meas.peak_allocated_bytes,
            "error_pct": None if e_peak is None else _err(e_peak, meas.peak_allocated_bytes),
            "estimate_phase": est.peak_phase if est is not None else None,
            "measured_phase": meas.peak_phase,
        }
    )
    return rows


def measure_doc(model_id: str, est: Estimate | None, meas: MeasuredStep) -> dict[str, Any]:
    """The JSON document of ``fitcheck measure``."""
    return {
        "schema_version": meas.schema_version,
        "model": model_id,
        "comparison": comparison_rows(est, meas),
        "measured": meas.model_dump(mode="json"),
        "estimate": est.model_dump(mode="json") if est is not None else None,
    }


def _g(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:,.3f}"


#: Width of the phase column: "peak (optimizer_step)" and a space.
_NAME = 22


def measure_text(model_name: str, est: Estimate | None, meas: MeasuredStep, top: int = 6) -> str:
    """The human table: phases side by side, the breakdown at the measured peak, the largest tensors."""
    s = meas.setup
    dora = "+dora" if isinstance(s, LlmSetup) and s.dora else ""
    shape = str(s.seq_len) if isinstance(s, LlmSetup) else f"{s.resolution} px"
    lines = [
        f"{model_name} · {s.method}{dora} · batch {s.batch_size} x {shape} · "
        f"{s.precision} · {s.optimizer} · attn {s.attn}{' · grad-ckpt' if s.grad_ckpt else ''} · "
        f"trainer {meas.regime} · measured: {meas.mode} on {meas.device} (step {meas.measured_step})",
        "",
        f"{'phase':<{_NAME}}{'estimate GiB':>14}{'measured GiB':>14}{'error':>10}",
    ]
    for row in comparison_rows(est, meas):
        err = "-" if row["error_pct"] is None else f"{row['error_pct']:+.1f}%"
        name = row["phase"]
        if name == "peak":
            lines.append("-" * (_NAME + 38))
            name = f"peak ({meas.peak_phase})"
        lines.append(
            f"{name:<{_NAME}}{_g(row['estimate_bytes']):>14}{_g(row['measured_bytes']):>14}{err:>10}"
        )
    peak = meas.phase(meas.peak_phase)
    if peak.breakdown:
        lines += ["", f"alive at the measured peak ({meas.peak_phase}):"]
        for cat, nbytes in sorted(peak.breakdown.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {cat:<24}{_g(nbytes):>10} GiB")
    if peak.top_tensors and top:
        lines += ["", "largest tensors at the peak:"]
        for t in peak.top_tensors[:top]:
            where = f" in {t.module}" if t.module else ""
            lines.append(
                f"  {_g(t.bytes):>9} GiB  {t.dtype:<9} {'x'.join(map(str, t.shape)):<20} {t.category} "
                f"({t.op}{where}, {t.created_in})"
            )
    lines.append("")
    lines.append(
        f"params: {fmt_count(meas.total_params)} total, {fmt_count(meas.trainable_params)} trainable · "
        f"{meas.wall_seconds:.1f} s · torch {meas.tool_versions.get('torch', '?')}, transformers "
        f"{meas.tool_versions.get('transformers', '?')}, peft {meas.tool_versions.get('peft', '?')}"
    )
    lines.append(f"device semantics: {meas.device_semantics}")
    lines += [f"note: {n}" for n in meas.notes]
    return "\n".join(lines) + "\n"
