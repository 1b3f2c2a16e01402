"""Rendering: the only module that imports rich. Documents (json/yaml/markdown) and tables.

stdout carries the answer (exactly one document for --format json); warnings go to stderr.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from fitcheck.models import SCHEMA_VERSION, Estimate, ModelInfo, ModelSpec
from fitcheck.units import GIB, MIB, fmt_count, fmt_gib


def _g(n: int | float) -> str:
    return f"{n / GIB:,.2f}"


def dump(data: Any, fmt: str) -> str:
    """Serialise a document (dict or list) as json, yaml or markdown."""
    if fmt == "json":
        return json.dumps(data, indent=2) + "\n"
    if fmt == "yaml":
        import yaml

        return str(yaml.safe_dump(data, sort_keys=False, width=110))
    if fmt == "markdown":
        return to_markdown(data)
    raise ValueError(fmt)


def to_markdown(data: Any) -> str:
    """Markdown for PR comments: the estimate's peak-phase table, or a list of rows."""
    if isinstance(data, list):
        if not data:
            return "(none)\n"
        keys = list(data[0])
        lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(str(r.get(k, "")) for k in keys) + " |" for r in data]
        return "\n".join(lines) + "\n"
    if "phases" in data:
        peak = next(p for p in data["phases"] if p["name"] == data["peak_phase"])
        s = data["setup"]
        shape = f"{s['resolution']} px" if s.get("resolution") else f"{s['seq_len']} tokens"
        out = [
            f"### fitcheck: {data['model_name']} ({s['method']}, batch {s['batch_size']} x {shape})",
            "",
            "| component | GiB | share | rule |",
            "|---|---:|---:|---|",
        ]
        for c in peak["components"]:
            share = 100 * c["bytes"] / max(1, peak["total_bytes"])
            out.append(f"| {c['name']} | {_g(c['bytes'])} | {share:.1f}% | {c['rule']} |")
        out += [
            f"| **peak allocated ({data['peak_phase']})** | **{_g(data['peak_allocated_bytes'])}** | | |",
            f"| allocator reserve | {_g(data['allocator_reserve_bytes'])} | | |",
            f"| CUDA context | {_g(data['context_bytes'])} | | |",
            f"| **device total** | **{_g(data['device_bytes'])}** | | "
            f"{band_words(data['device_bytes'], data.get('band'))} |",
        ]
        if data.get("thumb"):
            out.append(f"\nRule of thumb: {_g(data['thumb']['bytes'])} GiB ({data['thumb']['rule']}).")
        if data.get("target"):
            t = data["target"]
            out.append(
                f"\nOn **{t['hardware']}**: **{t['verdict']}**: {verdict_words(t)}; needs "
                f"{band_words(data['device_bytes'], data.get('band'))}, spare {_g(t['headroom_bytes'])} GiB."
            )
        return "\n".join(out) + "\n"
    return "```\n" + json.dumps(data, indent=2) + "\n```\n"


def band_words(device_bytes: int, band: dict[str, Any] | None) -> str:
    """The estimate with its band, in words: "20.1 GiB, likely 19.4-21.8"."""
    if not band or band["low_bytes"] == band["high_bytes"]:
        return f"{device_bytes / GIB:.1f} GiB"
    low, high = band["low_bytes"] / GIB, band["high_bytes"] / GIB
    return f"{device_bytes / GIB:.1f} GiB, likely {low:.1f}\u2013{high:.1f}"


def verdict_words(v: dict[str, Any]) -> str:
    """Why the verdict is what it is, against the budget."""
    budget = f"{_g(v['budget_bytes'])} GiB budget"
    if v["verdict"] == "fits":
        return f"the likely range fits the {budget}"
    if v["verdict"] == "tight":
        return (
            f"the estimate fits the {budget} but the likely range reaches {_g(v['high_bytes'])} GiB: "
            "it may run out of memory"
        )
    return f"the estimate is over the {budget}"


def estimate_doc(est: Estimate) -> dict[str, Any]:
    """The JSON contract (docs/json.md)."""
    doc = est.model_dump(mode="json")
    doc["rule"] = "detailed"
    return doc


def thumb_doc(est: Estimate) -> dict[str, Any]:
    """The --rule thumb document: the seeds' figure, with the detailed one for comparison."""
    assert est.thumb is not None
    return {
        "schema_version": est.schema_version,
        "rule": "thumb",
        "model": est.model,
        "method": est.setup.method,
        "params": est.params.total - est.params.adapter,
        "thumb_bytes": est.thumb.bytes,
        "thumb_rule": est.thumb.rule,
        "source": est.thumb.source,
        "detailed_device_bytes": est.device_bytes,
        "band": {
            "low_bytes": est.thumb.bytes,
            "high_bytes": est.thumb.bytes,
            "basis": "rule of thumb: no measured spread",
        },
        "target": est.target.model_dump(mode="json") if est.target else None,
    }


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal and "COLUMNS" not in __import__("os").environ:
        # CI logs and pipes: rich would wrap at 80 columns; the tables need about 120
        con = Console(stderr=stderr, highlight=False, width=120)
    return con


def _warn(est: Estimate) -> None:
    if est.warnings:
        err = _console(stderr=True)
        for w in est.warnings:
            err.print(f"[yellow]warning:[/] {w}")


def estimate_table(est: Estimate, spec: ModelSpec | Any) -> None:
    """The human view: components of the peak phase, totals, thumb, phases, verdict."""
    from rich.table import Table

    con = _console()
    s = est.setup
    peak = est.phase(est.peak_phase)
    shape = f"{s.resolution} px" if s.kind == "diffusion" else f"{s.seq_len} tokens"
    dora = s.kind == "llm" and s.dora
    title = (
        f"{spec.name} · {s.method}{'+dora' if dora else ''} · batch {s.batch_size} x {shape} · "
        f"{s.precision} · {s.optimizer} · attn {s.attn}{' · grad-ckpt' if s.grad_ckpt else ''} · "
        f"trainer {est.regime.name}"
    )
    t = Table(title=title, title_justify="left", show_lines=False)
    t.add_column("component")
    t.add_column("GiB", justify="right")
    t.add_column("share", justify="right")
    t.add_column("rule")
    t.add_column("source", style="dim")
    for c in peak.components:
        t.add_row(
            c.name,
            _g(c.bytes),
            f"{100 * c.bytes / max(1, peak.total_bytes):.1f}%",
            c.rule,
            c.source.split("#")[-1],
        )
    t.add_section()
    t.add_row(
        f"[bold]peak allocated[/] ({est.peak_phase})", f"[bold]{_g(est.peak_allocated_bytes)}[/]", "", "", ""
    )
    t.add_row(
        "allocator reserve",
        _g(est.allocator_reserve_bytes),
        "",
        "caching-allocator rounding and fragmentation",
        "overhead",
    )
    t.add_row(
        "CUDA context" if s.backend in ("cuda", "rocm") else "context",
        _g(est.context_bytes),
        "",
        "",
        "overhead",
    )
    band = est.band.model_dump() if est.band else None
    t.add_row(
        "[bold]device total[/]",
        f"[bold]{_g(est.device_bytes)}[/]",
        "",
        f"what nvidia-smi would show: {band_words(est.device_bytes, band)}",
        "",
    )
    con.print(t)
    p = est.params
    con.print(
        f"params: {fmt_count(p.total)} total, {fmt_count(p.trainable)} trainable"
        + (f", {fmt_count(p.quantized)} in 4-bit" if p.quantized else "")
        + " · phases: "
        + ", ".join(
            f"{ph.name} {_g(ph.total_bytes)}" + (" (peak)" if ph.name == est.peak_phase else "")
            for ph in est.phases
        )
        + " GiB"
    )
    if est.distributed is not None:
        _distributed_lines(con, est)
    if est.thumb:
        th = est.thumb
        con.print(
            f"rule of thumb: {fmt_gib(th.bytes, 1)} ({th.rule}; source documents) · detailed: "
            f"{fmt_gib(est.device_bytes, 1)}"
        )
    if est.target:
        _verdict(con, est)
    _warn(est)


def _distributed_lines(con: Any, est: Estimate) -> None:
    """Per GPU of how many, and the node's host memory by phase (docs/distributed.md)."""
    d = est.distributed
    assert d is not None
    off = "" if d.offload == "none" else f", offload {d.offload}"
    con.print(
        f"per GPU: {d.strategy} ({d.engine}{off}) on {d.world_size} GPU(s) = {d.gpus_per_node} per node x "
        f"{d.nodes} node(s); states sharded over {d.shard_group}"
    )
    if est.host_bytes is not None:
        parts = ", ".join(
            f"{h.name} {_g(h.total_bytes)} ("
            + (" + ".join(f"{c.name} {_g(c.bytes)}" for c in h.components) or "nothing")
            + ")"
            for h in est.host_phases
        )
        line = f"host memory per node: {_g(est.host_bytes)} GiB · {parts}"
        v = est.target
        if v is not None and v.host_budget_bytes is not None:
            line += f" · node RAM {_g(v.host_budget_bytes)} GiB: {v.host_verdict or 'unknown'}"
        con.print(line)


_SEGMENT_COLORS = (
    "cyan", "magenta", "green", "yellow", "blue", "bright_red", "bright_cyan", "bright_magenta",
)  # fmt: skip


def _segments(est: Estimate) -> list[tuple[str, int]]:
    """The peak phase's components, then reserve and context: what fills the device."""
    peak = est.phase(est.peak_phase)
    parts = [(c.name, c.bytes) for c in peak.components if c.bytes >= MIB]
    parts += [("allocator_reserve", est.allocator_reserve_bytes), ("context", est.context_bytes)]
    return [(n, b) for n, b in parts if b > 0]


def _verdict(con: Any, est: Estimate) -> None:
    from rich.text import Text

    v = est.target
    assert v is not None
    color = {"fits": "green", "tight": "yellow", "does_not_fit": "red"}[v.verdict]
    width = 60
    scale = width / max(1, v.usable_bytes, v.device_bytes)
    bar, legend = Text(), Text()
    used = 0
    for i, (name, nbytes) in enumerate(_segments(est)):
        style = _SEGMENT_COLORS[i % len(_SEGMENT_COLORS)]
        cells = round((used + nbytes) * scale) - round(used * scale)
        used += nbytes
        bar.append("█" * cells, style=style)
        legend.append("■ ", style=style)
        legend.append(f"{name} {_g(nbytes)}  ")
    budget_col = round(v.budget_bytes * scale)
    usable_col = round(v.usable_bytes * scale)
    filled = round(used * scale)
    bar.append("░" * max(0, usable_col - filled), style="dim")
    marks = [" "] * (max(usable_col, filled) + 1)
    marks[min(budget_col, len(marks) - 1)] = "^"
    marks[min(usable_col, len(marks) - 1)] = "|"
    where = f"  {_g(v.device_bytes)} GiB of {_g(v.usable_bytes)} usable on {v.hardware}"
    con.print(Text.assemble(bar, where))
    con.print(Text("".join(marks) + "  ^ budget (usable minus headroom)  | usable memory", style="dim"))
    con.print(legend)
    band = est.band.model_dump() if est.band else None
    con.print(
        f"[bold {color}]{v.verdict.replace('_', ' ')}[/]: needs {band_words(est.device_bytes, band)}; "
        f"{verdict_words(v.model_dump())} (usable minus headroom); spare {_g(v.headroom_bytes)} GiB "
        f"({v.headroom_pct:+.1f}% of usable)"
    )
    if est.band:
        con.print(f"  [dim]band: {est.band.basis}[/]")
    for line in v.budget_lines:
        con.print(f"  [dim]{line.name}: {_g(line.bytes)} GiB {line.note}[/]")
    for sug in v.suggestions:
        mark = "[green]fits[/]" if sug.fits else "[red]still too big[/]"
        con.print(
            f"  try {sug.flag}: {sug.change}, saves {_g(sug.saves_bytes)} GiB -> "
            f"{_g(sug.device_bytes_after)} GiB, {mark}"
        )
    for note in v.notes:
        con.print(f"  [dim]note: {note}[/]")


def thumb_table(est: Estimate) -> None:
    con = _console()
    assert est.thumb is not None
    th = est.thumb
    con.print(
        f"{est.model_name}, {est.setup.method}: rule of thumb [bold]{fmt_gib(th.bytes, 1)}[/] "
        f"({th.rule}; {th.source})"
    )
    con.print(f"detailed engine for comparison: {fmt_gib(est.device_bytes, 1)}")
    if est.target:
        v = est.target
        fits = th.bytes <= v.budget_bytes
        con.print(f"on {v.hardware} (budget {_g(v.budget_bytes)} GiB): {'fits' if fits else 'too big'}")


def models_table(rows: Sequence[ModelInfo]) -> None:
    """``fitcheck models``: one row per preset."""
    from rich.table import Table

    t = Table(title=f"{len(rows)} model presets")
    for col in ("id", "kind", "params", "type", "layers", "hidden", "vocab", "hf_id"):
        t.add_column(col, justify="right" if col in ("params", "layers", "hidden", "vocab") else "left")
    for r in rows:
        t.add_row(
            r.id,
            r.kind,
            fmt_count(r.params),
            r.model_type + (f" ({r.experts}E)" if r.experts else ""),
            "" if r.layers is None else str(r.layers),
            "" if r.hidden is None else str(r.hidden),
            "" if r.vocab is None else str(r.vocab),
            r.hf_id or "",
        )
    _console().print(t)


def matrix_table(rows: list[dict[str, Any]], methods: list[str], on: str, rule: str) -> None:
    """Model sizes x methods: GiB and whether it fits."""
    from rich.table import Table

    if not rows:
        return
    r0 = rows[0]
    how = "rule of thumb" if rule == "thumb" else "detailed estimate"
    title = f"Memory needed, GiB ({how}; --on a device for a verdict)"
    if r0.get("budget_bytes") is not None:
        usable, budget = _g(r0["usable_bytes"]), _g(r0["budget_bytes"])
        title = f"What fits on {on}: usable {usable} GiB, budget {budget} GiB ({how})"
    t = Table(title=title, title_justify="left")
    t.add_column("model")
    for m in methods:
        t.add_column(m, justify="right")
    style = {"fits": "green", "tight": "yellow", "does_not_fit": "red"}
    word = {"fits": "fits", "tight": "tight", "does_not_fit": "too big"}
    for r in rows:
        cells = []
        for m in methods:
            v = r[f"{m}_verdict"]
            need = _g(r[f"{m}_bytes"])
            cells.append(need if v is None else f"[{style[v]}]{need} {word[v]}[/]")
        t.add_row(r["model"], *cells)
    _console().print(t)


def diffusion_plan_doc(plan: Any, spec: Any, target: Any) -> dict[str, Any]:
    """``fitcheck plan --format json`` for a diffusion model."""
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "diffusion",
        "model": spec.id,
        "target": target.model_dump(mode="json"),
        "fits": plan.fits,
        "chosen": plan.setup.model_dump(mode="json"),
        "images_per_second": plan.images_per_second,
        "estimate": estimate_doc(plan.estimate),
        "reasons": list(plan.reasons),
        "notes": list(plan.notes),
        "considered": plan.considered,
    }


def diffusion_plan_table(plan: Any, spec: Any, target: Any, stderr: bool = False) -> None:
    """The human view of a diffusion plan: headline, chosen settings, reasons, notes."""
    from rich.table import Table

    con = _console(stderr=stderr)
    s, est = plan.setup, plan.estimate
    head = "fits" if plan.fits else "[red]nothing fits[/] (the smallest setup found)"
    con.print(
        f"[bold]{spec.name}[/] on {target.name} ({target.backend}): {head} — {_g(est.device_bytes)} of "
        f"{_g(target.budget_bytes)} GiB budget, about {plan.images_per_second:.2f} images/s"
    )
    t = Table(show_header=False, box=None)
    rows = [
        ("method", f"{s.method} (kohya sd-scripts)" + ("" if s.method == "full" else f", r{s.lora_rank}")),
        ("resolution", f"{s.resolution or spec.native_resolution} px (bucketing keeps about res^2 pixels)"),
        ("micro-batch", f"{s.batch_size} x accumulation {s.grad_accum}"),
        ("precision", s.precision + (" · full_bf16" if s.full_bf16 else "")
         + (" · fp8 base" if s.fp8_base else "")),
        ("optimizer", s.optimizer),
        ("attention", s.attn),
        ("checkpointing", "on" if s.grad_ckpt else "off"),
        ("caching", ", ".join(x for x, on in (("latents", s.cache_latents),
                                             ("text-encoder outputs", s.cache_text_encoder_outputs)) if on)
         or "none"),
    ]  # fmt: skip
    for k, v in rows:
        t.add_row(k, v)
    con.print(t)
    for r in plan.reasons:
        con.print(f"  · {r}")
    for n in plan.notes:
        con.print(f"  [dim]note: {n}[/]")


def note(msg: str) -> None:
    sys.stderr.write(msg + "\n")


# ------------------------------------------------------------------------------------------ plan


def _setup_line(s: Any) -> str:
    """A configuration in one line: method, micro-batch x accumulation, length, dtype, kernel, ..."""
    return (
        f"{s.method}{'+dora' if s.dora else ''} · {s.batch_size}x{s.grad_accum} · {s.seq_len} tok · "
        f"{s.precision} · {s.attn} · {s.optimizer}{' · ckpt' if s.grad_ckpt else ''}"
        + (f" · {s.effective_strategy}" if s.distributed else "")
        + (f"+offload-{s.offload}" if s.offload != "none" else "")
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def plan_doc(plan: Any) -> dict[str, Any]:
    """The JSON contract of ``fitcheck plan`` (docs/planner.md): the Plan model's dump."""
    return dict(plan.model_dump(mode="json"))


def plan_markdown(plan: Any) -> str:
    """Markdown for a PR comment: the chosen configuration, its reasons, the runners-up."""
    t = plan.target
    if not plan.fits:
        out = [
            f"### fitcheck plan: {plan.model_name} on {t.name}: **nothing fits**",
            "",
            f"The least any configuration needs is {_g(plan.min_device_bytes)} GiB; the budget is "
            f"{_g(t.budget_bytes)} GiB.",
            "",
        ]
        out += [f"- `{c.flag}`: {c.change} ({_g(c.device_bytes)} GiB)" for c in plan.changes]
        return "\n".join(out) + "\n"
    c = plan.chosen
    tp = c.throughput
    out = [
        f"### fitcheck plan: {plan.model_name} on {t.name}",
        "",
        f"`{_setup_line(c.setup)}`: {_g(c.device_bytes)} of {_g(c.budget_bytes)} GiB, "
        f"about {tp.tokens_per_s:,.0f} tokens/s",
        "",
        "| choice | reason | rule |",
        "|---|---|---|",
    ]
    out += [f"| {r.choice} | {r.text} | {r.rule} |" for r in plan.reasons]
    out += ["", "| runner-up | GiB | tokens/s | why not |", "|---|---:|---:|---|"]
    for r in plan.runners_up:
        x = r.candidate
        tps = f"{x.throughput.tokens_per_s:,.0f}"
        out.append(f"| {_setup_line(x.setup)} | {_g(x.device_bytes)} | {tps} | {r.reason} |")
    return "\n".join(out) + "\n"


def _plan_dist_rows(plan: Any) -> list[tuple[str, str]]:
    """The strategy row of a multi-GPU plan: strategy, offload, GPUs, host memory per node."""
    c = plan.chosen
    s = c.setup
    if not s.distributed:
        return []
    off = "" if s.offload == "none" else f" + offload {s.offload}"
    host = f" · host {_g(c.host_bytes)} GiB per node" if c.host_bytes else ""
    gpus = f"{s.world_size} GPUs ({s.gpus} per node x {s.nodes})"
    return [("strategy", f"{s.effective_strategy}{off} on {gpus}; memory per GPU{host}")]


def plan_table(plan: Any, stderr: bool = False) -> None:
    """The human view of a plan (on stderr when stdout carries an emitted file)."""
    from rich.table import Table

    con = _console(stderr=stderr)
    t = plan.target
    if not plan.fits:
        con.print(
            f"[bold red]nothing fits[/] {plan.model_name} on {t.name}: the least any of the "
            f"{plan.grid_points} configurations needs is {_g(plan.min_device_bytes)} GiB, "
            f"budget {_g(t.budget_bytes)} GiB"
        )
        for i, ch in enumerate(plan.changes):
            lead = "smallest change" if i == 0 else "or"
            con.print(f"  {lead}: [bold]{ch.flag}[/] — {ch.change} ({_g(ch.device_bytes)} GiB)")
        if not plan.changes:
            con.print("  no single change found: try a smaller model or a device with more memory")
        return
    c = plan.chosen
    s, tp = c.setup, c.throughput
    con.print(
        f"[bold]{plan.model_name}[/] on [bold]{t.name}[/] ({t.backend}): [bold green]fits[/] — "
        f"{_g(c.device_bytes)} of {_g(c.budget_bytes)} GiB budget, about {tp.tokens_per_s:,.0f} tokens/s"
    )
    run = Table(show_header=False, box=None, pad_edge=False)
    run.add_column(style="dim")
    run.add_column()
    rows = [
        ("method", s.method + ("+dora" if s.dora else "") + f" (trainer {s.trainer})"),
        ("micro-batch", f"{s.batch_size} x accumulation {s.grad_accum} = {c.effective_batch}"),
        ("sequence", f"{s.seq_len} tokens"),
        ("precision", s.precision),
        ("attention", s.attn),
        ("optimizer", s.optimizer),
        ("checkpointing", "on" if s.grad_ckpt else "off"),
        *_plan_dist_rows(plan),
        (
            "speed",
            f"{tp.tokens_per_s:,.0f} tokens/s · step {_duration(tp.step_s)} · MFU {100 * tp.mfu:.0f}% · "
            f"{tp.bound}-bound",
        ),
    ]
    if tp.dataset_s is not None:
        rows.append(("dataset", f"{tp.optimizer_steps:,} optimizer steps, about {_duration(tp.dataset_s)}"))
    for k, v in rows:
        run.add_row(k, v)
    con.print(run)
    why = Table(title="why", title_justify="left")
    for col in ("choice", "reason", "rule"):
        why.add_column(col, style="dim" if col == "rule" else None)
    for r in plan.reasons:
        why.add_row(r.choice, r.text, r.rule)
    con.print(why)
    if plan.runners_up:
        ru = Table(title="runners-up", title_justify="left")
        for col in ("configuration", "GiB", "tokens/s", "why not"):
            ru.add_column(col, justify="right" if col in ("GiB", "tokens/s") else "left")
        for r in plan.runners_up:
            x = r.candidate
            ru.add_row(
                _setup_line(x.setup), _g(x.device_bytes), f"{x.throughput.tokens_per_s:,.0f}", r.reason
            )
        con.print(ru)
    for e in plan.env:
        state = "[green]set[/]" if e.active else "[dim]left off[/]"
        con.print(f"env {state} {e.name}={e.value}: {e.why}")
