"""Rendering: the only module that imports rich. Documents (json/yaml/markdown) and tables.

stdout carries the answer (exactly one document for --format json); warnings go to stderr.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from fitcheck.models import Estimate, ModelInfo, ModelSpec, Verdict
from fitcheck.terminal import printable, printable_lines, printable_tree
from fitcheck.units import GIB, MIB, fmt_count, fmt_gib

if TYPE_CHECKING:
    from rich.text import Text


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


def md_cell(value: object) -> str:
    """A Markdown table cell: shown inert (`printable`), its ``|`` escaped so a name from the user's files
    (a folder called ``a|b``) cannot add a column."""
    return printable(str(value)).replace("|", "\\|")


def to_markdown(data: Any) -> str:
    """Markdown for PR comments: the estimate's peak-phase table, or a list of rows."""
    if isinstance(data, list):
        if not data:
            return "(none)\n"
        keys = list(data[0])
        lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
        lines += ["| " + " | ".join(md_cell(r.get(k, "")) for k in keys) + " |" for r in data]
        return "\n".join(lines) + "\n"
    if "phases" in data:
        data = printable_tree(data)  # names from the user's files: shown as data, never as layout
        peak = next(p for p in data["phases"] if p["name"] == data["peak_phase"])
        s = data["setup"]
        shape = f"{s['resolution']} px" if s.get("resolution") else f"{s['seq_len']} tokens"
        out = [
            f"### fitcheck: {data['model_name']} ({s['method']}, batch {s['batch_size']} x {shape})",
            "",
            f"Assumes: trainer {data['regime']['name']} · {s['precision']} · {s['optimizer']} · "
            f"attn {s['attn']} · checkpointing {'on' if s['grad_ckpt'] else 'off'}.",
            "",
            "| component | GiB | share | rule |",
            "|---|---:|---:|---|",
        ]
        for c in peak["components"]:
            share = 100 * c["bytes"] / max(1, peak["total_bytes"])
            out.append(f"| {md_cell(c['name'])} | {_g(c['bytes'])} | {share:.1f}% | {md_cell(c['rule'])} |")
        out += [
            f"| **peak allocated ({data['peak_phase']})** | **{_g(data['peak_allocated_bytes'])}** | | |",
            f"| allocator reserve | {_g(data['allocator_reserve_bytes'])} | | |",
            f"| CUDA context | {_g(data['context_bytes'])} | | |",
            f"| **device total** | **{_g(data['device_bytes'])}** | | "
            f"{band_words(data['device_bytes'], data.get('band'))} |",
        ]
        if data.get("cache_history"):
            h = data["cache_history"]["bytes"]
            varying = (data.get("setup") or {}).get("lengths") == "varying"
            words = history_words(data["device_bytes"], h, _card_of(data), varying)
            out.append(f"| {history_label(varying)} | {_g(h)} | | {words} |")
        if data.get("thumb"):
            out.append(f"\nRule of thumb: {_g(data['thumb']['bytes'])} GiB ({data['thumb']['rule']}).")
        if data.get("target"):
            t = data["target"]
            out.append(
                f"\nOn **{t['hardware']}**: **{t['verdict']}**: {verdict_words(t)}; needs "
                f"{band_words(data['device_bytes'], data.get('band'))}; "
                f"{spare_words(t['spare_bytes'], t['spare_pct'])}."
            )
            out.append(f"\nBudget: {budget_sentence([_Line(**bl) for bl in t['budget_lines']])}.")
            for sug in useful([_Line(**x) for x in t["suggestions"]]):
                left = after_words(
                    sug.fits, getattr(sug, "verdict_after", None), getattr(sug, "high_bytes_after", None)
                )
                out.append(
                    f"- try `{sug.flag}`: {sug.change}, saves {_g(sug.saves_bytes)} GiB -> "
                    f"{_g(sug.device_bytes_after)} GiB, {left}"
                )
        # the caveats the table view writes to stderr belong in a PR comment too
        if data.get("warnings"):
            out += ["", *(f"> **warning:** {w}" for w in data["warnings"])]
        return "\n".join(out) + "\n"
    return "```\n" + json.dumps(data, indent=2) + "\n```\n"


def after_words(fits: bool, verdict_after: str | None, high_bytes_after: int | None) -> str:
    """What a suggestion leaves: ``fits``, ``tight: likely up to X GiB`` (its central estimate fits, its
    band's upper edge does not) or ``still too big`` (read back from JSON without the fields: by ``fits``)."""
    if fits:
        return "fits"
    if verdict_after == "tight" and high_bytes_after is not None:
        return f"tight: likely up to {_g(high_bytes_after)} GiB"
    return "still too big"


class _Line:
    """A JSON object read back with attribute access (budget lines and suggestions in markdown)."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)


def band_words(device_bytes: int, band: dict[str, Any] | None) -> str:
    """The estimate with its band, in words: "20.1 GiB, likely 19.4-21.8"."""
    if not band or band["low_bytes"] == band["high_bytes"]:
        return f"{device_bytes / GIB:.1f} GiB"
    low, high = band["low_bytes"] / GIB, band["high_bytes"] / GIB
    return f"{device_bytes / GIB:.1f} GiB, likely {low:.1f}\u2013{high:.1f}"


def verdict_words(v: dict[str, Any]) -> str:
    """Why the verdict is what it is, against the budget."""
    budget = f"{_g(v['budget_bytes'])} GiB budget"
    host = v.get("paged_host_bytes") or 0
    paging = f" once {_g(host)} GiB of paged optimizer states page to the host" if host else ""
    if v["verdict"] == "fits":
        return f"the likely range fits the {budget}{paging}"
    paged = v.get("paged_bytes") or 0
    if v["verdict"] == "tight":
        without = f", {_g(v['high_bytes'] - paged)} GiB without its paged optimizer states" if paged else ""
        return (
            f"the estimate fits the {budget}{paging} but the likely range reaches {_g(v['high_bytes'])} "
            f"GiB{without}: it may run out of memory"
        )
    even = f" even with its {_g(paged)} GiB of paged optimizer states on the host" if paged else ""
    return f"the estimate is over the {budget}{even}"


def estimate_doc(est: Estimate) -> dict[str, Any]:
    """The JSON contract (docs/json.md)."""
    doc = est.model_dump(mode="json")
    doc["rule"] = "detailed"
    return doc


def thumb_doc(est: Estimate, judged: Verdict | None = None) -> dict[str, Any]:
    """The --rule thumb document: the seeds' figure, with the detailed one for comparison.

    ``judged`` is the thumb figure's verdict (engine/verdict.py, thumb_verdict), None without a target.
    """
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
        "target": judged.model_dump(mode="json") if judged else None,
    }


#: The narrowest layout drawn. The golden renders (tests/test_render_golden.py, 80 and 120 columns) hold
#: every figure whole from 80 up; narrower, rich cuts table cells to "…" (the GiB column of the breakdown
#: at 40 columns) and draws nothing at all at ``COLUMNS=0``. A narrower terminal wraps the 80-column lines.
MIN_COLUMNS = 80


def _console(stderr: bool = False) -> Any:
    """A console: the terminal's width, $COLUMNS when set, else 120 (CI logs and pipes); never narrower
    than `MIN_COLUMNS`."""
    import os

    from rich.console import Console

    con = Console(stderr=stderr, highlight=False)
    if not con.is_terminal and "COLUMNS" not in os.environ:
        # rich would fall back to 80 columns; a pipe or a CI log reads better at 120
        con = Console(stderr=stderr, highlight=False, width=120)
    elif con.width < MIN_COLUMNS:
        con = Console(stderr=stderr, highlight=False, width=MIN_COLUMNS)
    return con


# ------------------------------------------------------------------------------------------ layout
#
# Nothing wraps mid-value: a number and its unit ("33.0 GiB", "192,640 B/token", "2048 tokens") never
# split across lines. Prose is wrapped here, at the spaces outside values, and printed with soft_wrap so
# rich adds no breaks of its own; tables that do not fit drop or fold columns (`_table`).

_UNIT = (
    r"(?:GiB|MiB|KiB|GB/s|GB|MB|B/token|B/param|B|tokens/s|tokens|tok|px|params|layers|TFLOPS|"
    r"images/s|min|s|h|days|steps)"
)
#: A value: a number with its unit, or "1 x 2048" (a shape), or "minus 0.97 GiB".
_VALUE = re.compile(rf"(?:minus |plus |short by )?[-+]?\d[\d,.]*%?(?: x \d[\d,.]*)*(?: {_UNIT}(?![\w/]))?")


def _glued(plain: str) -> set[int]:
    """Offsets of the spaces inside values: no line may break there."""
    return {m.start() + i for m in _VALUE.finditer(plain) for i, ch in enumerate(m.group()) if ch == " "}


def _wrap(text: str | Text, width: int, indent: int = 0) -> list[Text]:
    """Greedy word wrap at spaces outside values; continuation lines indented by ``indent`` + 2."""
    from rich.cells import cell_len
    from rich.text import Text

    txt = text if isinstance(text, Text) else Text(printable_lines(text))
    plain = txt.plain
    glued = _glued(plain)
    cuts = [i for i, ch in enumerate(plain) if ch == " " and i not in glued]
    words, pos = [], 0
    for cut in [*cuts, len(plain)]:
        if cut > pos:
            words.append((pos, cut))
        pos = cut + 1
    out: list[Text] = []
    if not words:
        return [Text(" " * indent) + txt]
    start, end = words[0]
    for ws, we in words[1:]:
        avail = max(20, width) - (indent if not out else indent + 2)
        if cell_len(plain[start:we]) > avail:
            out.append(txt[start:end])
            start = ws
        end = we
    out.append(txt[start:end])
    return [Text(" " * (indent if n == 0 else indent + 2)) + line for n, line in enumerate(out)]


def _say(con: Any, text: str | Text, indent: int = 0, style: str | None = None) -> None:
    """Print prose wrapped to the console, never inside a value."""
    from rich.text import Text

    txt = text if isinstance(text, Text) else Text.from_markup(text)
    if style:
        txt.stylize(style)
    for line in _wrap(txt, con.width, indent):
        con.print(line, soft_wrap=True)


def _cell_width(cell: str | Text) -> int:
    from rich.cells import cell_len

    plain = cell.plain if not isinstance(cell, str) else printable_lines(cell)
    return max((cell_len(x) for x in plain.split("\n")), default=0)


def _table(
    con: Any,
    header: list[str],
    rows: list[list[str | Text]],
    *,
    right: Collection[str] = (),
    flex: str | None = None,
    drop: tuple[str, ...] = (),
    dim: Collection[str] = (),
    sections: Collection[int] = (),
    box: bool = True,
) -> None:
    """A table that fits the console: drop columns in ``drop`` order, then fold ``flex`` at words.

    Cells given as ``str`` are plain text (never rich markup: names print as typed).
    """
    from rich import box as boxes
    from rich.table import Table
    from rich.text import Text

    cols = list(header)

    def widths(keep: list[str]) -> dict[str, int]:
        return {h: max([_cell_width(h)] + [_cell_width(r[header.index(h)]) for r in rows]) for h in keep}

    overhead = (lambda n: 3 * n + 1) if box else (lambda n: 2 * (n - 1))
    w = widths(cols)
    for name in drop:  # drop columns until the table fits as it is, then fold the flexible one
        if sum(w.values()) + overhead(len(cols)) <= con.width:
            break
        if name in cols:
            cols.remove(name)
            w = widths(cols)
    flex_width = None
    if flex in w:
        fixed = sum(v for k, v in w.items() if k != flex)
        room = con.width - fixed - overhead(len(cols))
        if room < w[flex]:
            flex_width = max(12, room)
    if box:
        t = Table(box=boxes.HEAVY_HEAD, pad_edge=True)
    else:
        t = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2, 0, 0))
    for h in cols:
        t.add_column(
            h,
            justify="right" if h in right else "left",
            no_wrap=True,
            style="dim" if h in dim else None,
            width=flex_width if h == flex and flex_width else None,
        )
    for n, r in enumerate(rows):
        if n in sections:
            t.add_section()
        cells: list[str | Text] = []
        for h in cols:
            cell = r[header.index(h)]
            if h == flex and flex_width:
                cell = Text("\n").join(_wrap(cell, flex_width))
            cells.append(cell if isinstance(cell, Text) else Text(printable_lines(cell)))
        t.add_row(*cells)
    con.print(t)
    dropped = [h for h in header if h not in cols]
    if dropped:
        _say(
            con,
            f"not shown at {con.width} columns: {', '.join(dropped)} (a wider terminal or --format json "
            "shows every column)",
            style="dim",
        )


def _warn(est: Estimate) -> None:
    if est.warnings:
        err = _console(stderr=True)
        for w in est.warnings:
            _say(err, f"[yellow]warning:[/] {_escape(w)}")


_PROVENANCE = re.compile(r"\s*\((?:https?://|seeds/|see )[^)]*\)|\s*https?://\S+")


def plain_note(note: str) -> str:
    """A note without its provenance (URLs, seeds/ citations): what the default view shows."""
    return _PROVENANCE.sub("", note).strip()


def budget_steps(lines: Sequence[Any]) -> list[tuple[str, int, str]]:
    """The budget arithmetic as read aloud: ("", total), ("minus", deduction), ("=", subtotal).

    Deductions are stored negative (`BudgetLine.bytes`); they are shown as "minus" a positive amount.
    """
    out: list[tuple[str, int, str]] = []
    for n, line in enumerate(lines):
        label = line.name.replace("_", " ")
        if line.name in ("usable", "budget"):
            out.append(("=", line.bytes, label))
        elif n and line.bytes <= 0:  # a deduction (stored negative), zero included
            out.append(("minus", -line.bytes, label))
        else:
            out.append(("plus" if n else "", line.bytes, label))
    return out


def budget_sentence(lines: Sequence[Any]) -> str:
    """Read aloud: "24.00 GiB device memory minus 1.00 GiB idle use = 23.00 GiB usable ... budget"."""
    return " ".join(
        (f"{op} " if op else "") + f"{_g(amount)} GiB {label}" for op, amount, label in budget_steps(lines)
    )


def spare_words(spare_bytes: int, spare_pct: float) -> str:
    """In words: "spare 1.20 GiB (5.0% of usable)" or "short by 3.20 GiB (13.9% of usable)"."""
    if spare_bytes < 0:
        return f"short by {_g(-spare_bytes)} GiB ({-spare_pct:.1f}% of usable)"
    return f"spare {_g(spare_bytes)} GiB ({spare_pct:.1f}% of usable)"


def method_suffix(s: Any) -> str:
    """What rides on the method in captions: ``+dora``, ``+lora-fa`` (an LLM setup's flags), a prefix's
    virtual tokens (`` p64``, ``+projection``)."""
    prefix = getattr(s, "prefix_tokens", None)
    if s.method == "prefix-tuning" and prefix:
        return f" p{prefix}" + ("+projection" if getattr(s, "prefix_projection", False) else "")
    return ("+dora" if s.dora else "") + ("+lora-fa" if getattr(s, "lora_fa", False) else "")


def assumptions(s: Any) -> str:
    """The caption every sizing table carries: regime, batch, sequence, precision, checkpointing."""
    shape = f"{s.resolution} px" if s.kind == "diffusion" else f"{s.seq_len} tokens"
    dora = method_suffix(s) if s.kind == "llm" else ""
    return (
        f"assumes: {s.method}{dora} · trainer {s.trainer} · batch {s.batch_size} x {shape} · "
        f"{s.precision}{' + fp32 master weights' if getattr(s, 'master_weights', False) else ''} · "
        f"{s.optimizer} · attn {s.attn} · checkpointing {'on' if s.grad_ckpt else 'off'}"
        + (" · gradients kept between steps" if getattr(s, "keep_grads", False) else "")
    )


def master_copy_note(s: Any, regime: Any = None) -> str | None:
    """Full fine-tuning with 16-bit weights and no master copy: say the fp32 copy is not counted."""
    if s.kind != "llm" or s.method != "full" or s.master_weights or s.precision == "fp32":
        return None
    if regime is not None and (regime.master_weights or regime.weight_dtype == "fp32"):
        return None
    return (
        "full fine-tuning with 16-bit weights: no fp32 master copy is counted (the source documents' "
        "12 B/param omits it too); trainers that keep one need 4 B/param more: --master-weights"
    )


def no_gpu_first(con: Any, v: Any) -> None:
    """On a machine without a GPU (detected, not asked for): say first that RAM is being sized."""
    if v is not None and v.backend == "cpu" and v.detected:
        _say(
            con,
            "[bold]No GPU found on this machine: sizing its RAM.[/] To size for a GPU, name it: "
            "--on rtx-4090, --on 24GB, ... (fitcheck hw list)",
        )


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(printable(text))


def estimate_table(est: Estimate, spec: ModelSpec | Any, verbose: bool = False) -> None:
    """The human view: components of the peak phase, totals, thumb, phases, verdict."""
    from rich.text import Text

    con = _console()
    no_gpu_first(con, est.target)
    _say(
        con,
        Text(printable(spec.name), style="bold") + Text(f" · peak of one training step ({est.peak_phase})"),
    )
    _say(con, assumptions(est.setup).replace("trainer generic", f"trainer {est.regime.name}"), style="dim")
    _peak_table(con, est, verbose)
    _say(con, _params_line(est))
    if est.distributed is not None:
        _distributed_lines(con, est)
    if est.thumb:
        th = est.thumb
        _say(
            con,
            f"rule of thumb: {fmt_gib(th.bytes, 1)} ({th.rule}"
            + (f"; {th.source}" if verbose else "; the source documents")
            + f") · detailed: {fmt_gib(est.device_bytes, 1)}",
        )
    master = master_copy_note(est.setup, est.regime)
    if master:
        _say(con, f"note: {master}", style="dim")
    if est.target:
        _verdict(con, est, verbose)
    _warn(est)


def _peak_table(con: Any, est: Estimate, verbose: bool) -> None:
    """The peak phase's components, then the totals down to the device (source column with -v)."""
    peak = est.phase(est.peak_phase)
    header = ["component", "GiB", "share", "rule", "source"]
    rows: list[list[str | Text]] = [
        [
            c.name,
            _g(c.bytes),
            f"{100 * c.bytes / max(1, peak.total_bytes):.1f}%",
            c.rule,
            c.source.split("#")[-1],
        ]
        for c in peak.components
    ]
    rows += _total_rows(est)
    if not verbose:
        header, rows = header[:4], [r[:4] for r in rows]
    _table(
        con, header, rows, right={"GiB", "share"}, flex="rule", drop=("share",), dim={"source"},
        sections={len(peak.components)},
    )  # fmt: skip


def _total_rows(est: Estimate) -> list[list[str | Text]]:
    """Peak allocated, allocator reserve, context and device total rows of the estimate table."""
    from rich.text import Text

    band = est.band.model_dump() if est.band else None
    return [
        [Text(f"peak allocated ({est.peak_phase})", style="bold"), Text(_g(est.peak_allocated_bytes), "bold"),
         "", "", ""],
        ["allocator reserve", _g(est.allocator_reserve_bytes), "",
         "caching-allocator rounding and fragmentation", "overhead"],
        [_context_label(est), _g(est.context_bytes), "", "", "overhead"],
        [Text("device total", style="bold"), Text(_g(est.device_bytes), "bold"), "",
         f"{_device_reader(est)}: {band_words(est.device_bytes, band)}", ""],
        *_history_rows(est),
    ]  # fmt: skip


def _history_rows(est: Estimate) -> list[list[str | Text]]:
    """The allocator history (``--lengths varying``, DeepSpeed's step segments) beside the device total."""
    h = est.cache_history
    if h is None:
        return []
    lines = est.target.budget_lines if est.target else ()
    varying = getattr(est.setup, "lengths", "fixed") == "varying"
    words = history_words(est.device_bytes, h.bytes, lines[0].bytes if lines else None, varying)
    return [[history_label(varying), _g(h.bytes), "", words, "overhead"]]


def history_label(varying: bool) -> str:
    """The allocator history's row: over a varying-length run, or beside the optimizer step's segments."""
    return "allocator history (varying lengths)" if varying else "allocator history (step segments)"


def _card_of(doc: dict[str, Any]) -> int | None:
    """The target's memory in an estimate's JSON (its first budget line), when there is a target."""
    target: dict[str, Any] = doc.get("target") or {}
    lines: list[dict[str, Any]] = target.get("budget_lines") or []
    return int(lines[0]["bytes"]) if lines else None


def history_words(
    device_bytes: int, history_bytes: int, card_bytes: int | None = None, varying: bool = True
) -> str:
    """What the allocator history means for a reading and for the fit; ``card_bytes``: the target's memory
    (the first budget line), which a reading never passes (the allocator frees cached segments first);
    ``varying``: cut for shorter steps, else beside the optimizer step's flat copies (DeepSpeed ZeRO)."""
    shown = device_bytes + history_bytes
    cap = "never more than the card"
    if card_bytes is not None and shown > card_bytes:
        shown, cap = card_bytes, "the whole card: the allocator frees cached segments before it runs out"
    together = "the step's flat copies and the activations' blocks, cached together"
    cut = "cached from shorter steps" if varying else together
    return (
        f"{cut}: a whole-run reading shows up to {_g(shown)} GiB ({cap}); released when "
        "memory runs short, so not in the total"
    )


def _device_reader(est: Estimate) -> str:
    """Who reads the device total: nvidia-smi (rocm-smi) on a GPU; Activity Monitor's process memory on
    Apple silicon; the process's resident memory on a CPU."""
    return {
        "cuda": "what nvidia-smi would show",
        "rocm": "what rocm-smi would show",
        "mps": "the process's unified memory",
    }.get(est.setup.backend, "the process's memory")


def _context_label(est: Estimate) -> str:
    return "CUDA context" if est.setup.backend in ("cuda", "rocm") else "context"


def _params_line(est: Estimate) -> str:
    """Parameter totals and every phase's total, the peak marked."""
    p = est.params
    return (
        f"params: {fmt_count(p.total)} total, {fmt_count(p.trainable)} trainable"
        + (f", {fmt_count(p.quantized)} in 4-bit" if p.quantized else "")
        + " · phases: "
        + ", ".join(
            f"{ph.name} {_g(ph.total_bytes)} GiB" + (" (peak)" if ph.name == est.peak_phase else "")
            for ph in est.phases
        )
    )


def _distributed_lines(con: Any, est: Estimate) -> None:
    """Per GPU of how many, and the node's host memory by phase (docs/distributed.md)."""
    d = est.distributed
    assert d is not None
    off = "" if d.offload == "none" else f", offload {d.offload}"
    if d.per_gpu:
        con.print(
            f"per GPU: {d.strategy} (one process, layers split over {d.gpus_per_node} GPUs); "
            f"shown: GPU {d.bottleneck_gpu}"
        )
        for g in d.per_gpu:
            held = ", ".join(g.modules) or "no module"
            con.print(
                f"  GPU {g.gpu}: {_g(g.device_bytes)} GiB at {g.peak_phase} · {held}"
                + (" (bottleneck)" if g.gpu == d.bottleneck_gpu else "")
            )
    else:
        con.print(
            f"per GPU: {d.strategy} ({d.engine}{off}) on {d.world_size} GPU(s) = {d.gpus_per_node} per node "
            f"x {d.nodes} node(s); states sharded over {d.shard_group}"
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


def useful(suggestions: Sequence[Any]) -> list[Any]:
    """The suggestions worth showing: those that save memory."""
    return [sug for sug in suggestions if sug.saves_bytes > 0]


def _verdict(con: Any, est: Estimate, verbose: bool = False) -> None:
    """The device bar, its legend, the verdict line and what to try."""
    from rich.text import Text

    v = est.target
    assert v is not None
    color = {"fits": "green", "tight": "yellow", "does_not_fit": "red"}[v.verdict]
    legend = _device_bar(con, est, v)
    _say(
        con,
        f"{_g(v.device_bytes)} GiB of {_g(v.usable_bytes)} GiB usable on {_escape(v.hardware)} "
        "[dim](^ budget: usable minus headroom; | usable memory)[/]",
    )
    _legend_lines(con, legend)
    band = est.band.model_dump() if est.band else None
    _say(
        con,
        Text(v.verdict.replace("_", " "), style=f"bold {color}")
        + Text(
            f": needs {band_words(est.device_bytes, band)}; {verdict_words(v.model_dump())}; "
            f"{spare_words(v.spare_bytes, v.spare_pct)}"
        ),
    )
    _say(con, f"budget: {budget_sentence(v.budget_lines)}", indent=2, style="dim")
    if verbose:
        if est.band:
            _say(con, f"band: {_escape(est.band.basis)}", indent=2, style="dim")
        for bl in v.budget_lines:
            _say(con, f"{bl.name}: {_escape(bl.note)}", indent=2, style="dim")
    _suggestion_lines(con, v)
    for note_ in v.notes:
        shown = note_ if verbose else plain_note(note_)
        if shown:
            _say(con, f"note: {_escape(shown)}", indent=2, style="dim")


def _device_bar(con: Any, est: Estimate, v: Verdict) -> list[Text]:
    """Print the device as a bar of the peak's segments with budget (^) and usable (|) marks.

    Returns the legend items, one per segment, in the bar's colours.
    """
    from rich.text import Text

    width = max(20, min(60, con.width - 2))
    scale = width / max(1, v.usable_bytes, v.device_bytes)
    bar, legend = Text(), []
    used = 0
    for i, (name, nbytes) in enumerate(_segments(est)):
        style = _SEGMENT_COLORS[i % len(_SEGMENT_COLORS)]
        cells = round((used + nbytes) * scale) - round(used * scale)
        used += nbytes
        bar.append("█" * cells, style=style)
        legend.append(Text("■ ", style=style) + Text(f"{name} {_g(nbytes)}"))
    budget_col = round(v.budget_bytes * scale)
    usable_col = round(v.usable_bytes * scale)
    filled = round(used * scale)
    bar.append("░" * max(0, usable_col - filled), style="dim")
    marks = [" "] * (max(usable_col, filled) + 1)
    marks[min(budget_col, len(marks) - 1)] = "^"
    marks[min(usable_col, len(marks) - 1)] = "|"
    con.print(bar, soft_wrap=True)
    con.print(Text("".join(marks).rstrip(), style="dim"), soft_wrap=True)
    return legend


def _legend_lines(con: Any, legend: list[Text]) -> None:
    """The bar's legend, whole items per line."""
    from rich.text import Text

    line = Text()
    for item in legend:
        if line.plain and line.cell_len + 2 + item.cell_len > con.width:
            con.print(line, soft_wrap=True)
            line = Text()
        line += (Text("  ") if line.plain else Text()) + item
    if line.plain:
        con.print(line, soft_wrap=True)


def _suggestion_lines(con: Any, v: Verdict) -> None:
    """The changes that save memory, each with whether it then fits."""
    for sug in useful(v.suggestions):
        colour = {"fits": "green", "tight": "yellow"}.get(str(sug.verdict_after), "red")
        mark = f"[{colour}]{_escape(after_words(sug.fits, sug.verdict_after, sug.high_bytes_after))}[/]"
        _say(
            con,
            f"try [bold]{_escape(sug.flag)}[/]: {_escape(sug.change)}, saves {_g(sug.saves_bytes)} GiB "
            f"-> {_g(sug.device_bytes_after)} GiB, {mark}",
            indent=2,
        )
    if v.suggestions and not any(sug.fits for sug in v.suggestions):
        _say(
            con,
            "no single change fits, nor any combination of two or three of them: try a smaller model or "
            "a device with more memory (fitcheck plan searches more settings)",
            indent=2,
        )


def thumb_table(est: Estimate, judged: Verdict | None = None, verbose: bool = False) -> None:
    """``--rule thumb``: the seeds' figure, judged on its own when there is a target."""
    from rich.text import Text

    con = _console()
    assert est.thumb is not None
    th = est.thumb
    v = judged
    no_gpu_first(con, v)
    _say(
        con,
        Text(printable(est.model_name), style="bold")
        + Text(f", {est.setup.method}: rule of thumb ")
        + Text(fmt_gib(th.bytes, 1), style="bold")
        + Text(f" ({th.rule}" + (f"; {th.source})" if verbose else "; the source documents)")),
    )
    _say(con, assumptions(est.setup) + " (the rule of thumb itself depends on size and method only)",
         style="dim")  # fmt: skip
    master = master_copy_note(est.setup, est.regime)
    if master:
        _say(con, f"note: {master}", style="dim")
    _say(con, f"detailed engine for comparison: {fmt_gib(est.device_bytes, 1)}")
    if v is not None:
        color = {"fits": "green", "tight": "yellow", "does_not_fit": "red"}[v.verdict]
        _say(
            con,
            Text(v.verdict.replace("_", " "), style=f"bold {color}")
            + Text(f" on {printable(v.hardware)} (rule of thumb {fmt_gib(th.bytes, 1)} against the "
                   f"{_g(v.budget_bytes)} GiB budget); {spare_words(v.spare_bytes, v.spare_pct)}"),
        )  # fmt: skip
        _say(con, f"budget: {budget_sentence(v.budget_lines)}", indent=2, style="dim")


def models_table(rows: Sequence[ModelInfo]) -> None:
    """``fitcheck models``: one row per preset."""
    con = _console()
    _say(con, f"{len(rows)} model presets", style="bold")
    header = ["id", "kind", "params", "type", "layers", "hidden", "vocab", "hf_id"]
    body: list[list[str | Text]] = [
        [
            r.id,
            r.kind,
            fmt_count(r.params),
            r.model_type + (f" ({r.experts}E)" if r.experts else ""),
            "" if r.layers is None else str(r.layers),
            "" if r.hidden is None else str(r.hidden),
            "" if r.vocab is None else str(r.vocab),
            r.hf_id or "",
        ]
        for r in rows
    ]
    _table(con, header, body, right={"params", "layers", "hidden", "vocab"},
           drop=("hf_id", "vocab", "hidden", "layers", "type"))  # fmt: skip


def _matrix_samples(rows: list[dict[str, Any]], batch: int) -> str:
    """The regime (trainer, precision, attention) and sample each row was sized at: once when the rows
    share them (``trainer generic · bf16 · attn sdpa · batch 1 x 2048 tokens``), else per group of rows
    (``7B: trainer generic · ... x 2048 tokens; sdxl: trainer kohya · ... x 1024 px``)."""
    by: dict[tuple[str, str], list[str]] = {}
    for r in rows:
        by.setdefault((str(r.get("regime", "")), str(r.get("shape", ""))), []).append(str(r["model"]))
    said = [f"trainer {g} · batch {batch} x {shape}" for g, shape in by]
    if len(said) == 1:
        return said[0]
    return "; ".join(f"{', '.join(ms)}: {w}" for ms, w in zip(by.values(), said, strict=True))


def _matrix_full_note(rows: list[dict[str, Any]], b: dict[str, Any], rule: str) -> str:
    """What the full column counts: the seeds' 12 B/param for the language-model rows (16-bit weights
    and gradients, two fp32 Adam moments, no master copy) and, for diffusion rows, kohya's fp32 weights
    and gradients under autocast (docs/diffusion.md)."""
    llm = [r for r in rows if not str(r.get("shape", "")).endswith("px")]
    diff = [str(r["model"]) for r in rows if str(r.get("shape", "")).endswith("px")]
    parts = []
    if llm:
        seeds = b.get("trainer", "generic") == "generic" and b.get("optimizer", "adamw") == "adamw"
        lead = "the source documents' 12 B/param (16-bit weights and gradients, two fp32 Adam moments), "
        who = f"{', '.join(str(r['model']) for r in llm)}: " if diff and rule != "thumb" else ""
        parts.append(
            who
            + (lead if seeds or rule == "thumb" else "16-bit weights, ")
            + "no fp32 master copy counted (trainers that keep one need 4 B/param more)"
        )
    if diff and rule != "thumb":
        kohya = "kohya's fp32 weights and gradients under bf16 autocast (no full_bf16)"
        parts.append(f"{', '.join(diff)}: {kohya}")
    return "full: " + "; ".join(parts)


def matrix_table(
    rows: list[dict[str, Any]], methods: list[str], on: str, rule: str, base: dict[str, Any] | None = None
) -> None:
    """Model sizes x methods: GiB and whether it fits, with the assumptions in a caption."""
    from rich.text import Text

    if not rows:
        return
    con = _console()
    r0 = rows[0]
    how = "rule of thumb" if rule == "thumb" else "detailed estimate"
    title = f"Memory needed, GiB ({how}; --on a device for a verdict)"
    if r0.get("budget_bytes") is not None:
        usable, budget = _g(r0["usable_bytes"]), _g(r0["budget_bytes"])
        title = f"What fits on {on}: usable {usable} GiB, budget {budget} GiB ({how})"
    _say(con, Text(title, style="bold"))
    b = base or {}
    _say(
        con,
        f"assumes: {_matrix_samples(rows, b.get('batch_size', 1))} · {b.get('optimizer', 'adamw')} · "
        f"checkpointing {'on' if b.get('grad_ckpt') else 'off'}"
        + (" · the rule of thumb depends on size and method only" if rule == "thumb" else ""),
        style="dim",
    )
    if "full" in methods:
        _say(con, _matrix_full_note(rows, b, rule), style="dim")
    style = {"fits": "green", "tight": "yellow", "does_not_fit": "red"}
    word = {"fits": "fits", "tight": "tight", "does_not_fit": "too big"}
    body: list[list[str | Text]] = []
    for r in rows:
        cells: list[str | Text] = [r["model"]]
        for m in methods:
            v = r[f"{m}_verdict"]
            need = _g(r[f"{m}_bytes"])
            cells.append(need if v is None else Text(f"{need} {word[v]}", style=style[v]))
        body.append(cells)
    _table(con, ["model", *methods], body, right=set(methods))


def diffusion_plan_table(plan: Any, stderr: bool = False) -> None:
    """The human view of a diffusion plan with a choice (fits, or tight): headline, chosen settings,
    reasons, runners-up."""
    con = _console(stderr=stderr)
    c, t = plan.chosen, plan.target
    s = c.setup
    _say(
        con,
        f"[bold]{_escape(plan.model_name)}[/] on {_escape(t.name)} ({t.backend}): {_plan_verdict(c, True)} — "
        f"{_g(c.device_bytes)}{_likely(c)} of {_g(t.budget_bytes)} GiB budget, about "
        f"{c.throughput.images_per_s:.2f} images/s",
    )
    rows = [
        ("method", f"{s.method} (kohya sd-scripts)" + ("" if s.method == "full" else f", r{s.lora_rank}")),
        ("resolution", f"{s.resolution} px (bucketing keeps about res^2 pixels)"),
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
    _table(con, ["setting", "value"], [[k, v] for k, v in rows], flex="value", dim={"setting"}, box=False)
    for r in plan.reasons:
        _say(con, f"· {_escape(r.text)}", indent=2)
    if plan.runners_up:
        _say(con, "[bold]runners-up[/]")
    for r in plan.runners_up:
        x = r.candidate
        _say(con, f"{_escape(_setup_line(x.setup))}: {_g(x.device_bytes)} GiB, {_speed(x)}", indent=2)
        _say(con, f"why not: {_escape(r.reason)}", indent=4, style="dim")
    _plan_tight_changes(con, plan)
    for n in plan.notes:
        _say(con, f"note: {_escape(n)}", indent=2, style="dim")


def note(msg: str) -> None:
    sys.stderr.write(printable(msg) + "\n")


# ------------------------------------------------------------------------------------------ plan


def _setup_line(s: Any) -> str:
    """A configuration in one line: method, micro-batch x accumulation, length, dtype, kernel, ..."""
    if s.kind == "diffusion":
        return (
            f"{s.method} · {s.batch_size}x{s.grad_accum} · {s.resolution} px · {s.precision}"
            + (" · full_bf16" if s.full_bf16 else "")
            + (" · fp8 base" if s.fp8_base else "")
            + f" · {s.attn} · {s.optimizer}{' · ckpt' if s.grad_ckpt else ''}"
        )
    return (
        f"{s.method}{method_suffix(s)} · {s.batch_size}x{s.grad_accum} · {s.seq_len} tok · "
        f"{s.precision} · {s.attn} · {s.optimizer}{' · ckpt' if s.grad_ckpt else ''}"
        + (f" · {s.effective_strategy}" if s.distributed else "")
        + (f"+offload-{s.offload}" if s.offload != "none" else "")
    )


def _speed(c: Any) -> str:
    """A candidate's estimated speed in its workload's unit."""
    tp = c.throughput
    if hasattr(tp, "images_per_s"):
        return f"{tp.images_per_s:.2f} images/s"
    return f"{tp.tokens_per_s:,.0f} tokens/s"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    if seconds < 2 * 365.25 * 86400:
        return f"{seconds / 86400:.1f} days"
    return f"{seconds / (365.25 * 86400):,.0f} years"  # a dataset no one trains on one device: said plainly


def plan_doc(plan: Any) -> dict[str, Any]:
    """The JSON contract of ``fitcheck plan`` (docs/planner.md): the Plan model's dump."""
    return dict(plan.model_dump(mode="json"))


def plan_markdown(plan: Any) -> str:
    """Markdown for a PR comment: the chosen configuration, its reasons, the runners-up."""
    t = plan.target
    if plan.chosen is None:
        out = [
            f"### fitcheck plan: {plan.model_name} on {t.name}: **nothing fits**",
            "",
            f"The least any configuration needs is {_g(plan.min_device_bytes)} GiB; the budget is "
            f"{_g(t.budget_bytes)} GiB.",
            "",
        ]
        out += _md_changes(plan.changes)
        return "\n".join(printable(line) for line in out) + "\n"
    c = plan.chosen
    unit = _speed(c).split(" ")[1]
    tight = " (**tight**)" if c.verdict == "tight" else ""
    out = [
        f"### fitcheck plan: {plan.model_name} on {t.name}{tight}",
        "",
        f"`{_setup_line(c.setup)}`: {_g(c.device_bytes)}{_likely(c)} of {_g(c.budget_bytes)} GiB, about "
        f"{_speed(c)}",
        "",
    ]
    if c.verdict == "tight":
        out += [f"**Tight**: {_tight_sentence(c)}.", ""]
        fixes = _md_changes(plan.changes)
        out += ["To fit the likely range:", "", *fixes, ""] if fixes else []
    out += [
        "| choice | reason | rule |",
        "|---|---|---|",
    ]
    out += [f"| {md_cell(r.choice)} | {md_cell(r.text)} | {md_cell(r.rule)} |" for r in plan.reasons]
    out += ["", f"| runner-up | GiB | {unit} | why not |", "|---|---:|---:|---|"]
    for r in plan.runners_up:
        x = r.candidate
        speed = _speed(x).split(" ")[0]
        out.append(
            f"| {md_cell(_setup_line(x.setup))} | {_g(x.device_bytes)} | {speed} | {md_cell(r.reason)} |"
        )
    return "\n".join(printable(line) for line in out) + "\n"


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


def _plan_verdict(c: Any, markup: bool = False) -> str:
    """A chosen configuration's verdict in the headline: "fits", or "tight" (the fallback)."""
    word, color = ("fits", "green") if c.verdict == "fits" else ("tight", "yellow")
    return f"[bold {color}]{word}[/]" if markup else word


def _likely(c: Any) -> str:
    """After a tight choice's need: its band's upper edge, in GiB (a fitting one's is within the budget)."""
    return f" GiB (likely up to {_g(c.high_bytes)} GiB)" if c.verdict == "tight" else ""


def _tight_sentence(c: Any) -> str:
    """Why a tight plan is tight, in the words `check` uses (`verdict_words`)."""
    return (
        f"no configuration's likely range fits; this one's estimate fits the {_g(c.budget_bytes)} GiB "
        f"budget but its likely range reaches {_g(c.high_bytes)} GiB: it may run out of memory"
    )


def _plan_nothing_fits(con: Any, plan: Any) -> None:
    """The least any configuration needs, and the changes that would fit (any workload)."""
    t = plan.target
    _say(
        con,
        f"[bold red]nothing fits[/] {_escape(plan.model_name)} on {_escape(t.name)}: the least any of "
        f"the {plan.grid_points} configurations needs is {_g(plan.min_device_bytes)} GiB, "
        f"budget {_g(t.budget_bytes)} GiB",
    )
    _table_changes(con, plan.changes)
    if not plan.changes:
        _say(con, "no single change found: try a smaller model or a device with more memory", indent=2)


def _table_changes(con: Any, changes: Any) -> None:
    """The changes, smallest first, in `Change.words`' wording (the emitted files' TIGHT header too)."""
    for i, ch in enumerate(changes):
        lead = "smallest change" if i == 0 else "or"
        _say(con, f"{lead}: [bold]{_escape(ch.flag)}[/] — {_escape(ch.change)} ({ch.need_words()})", indent=2)


def _md_changes(changes: Any) -> list[str]:
    """The changes as a markdown list, with the table's figures (`Change.need_words`)."""
    return [f"- `{ch.flag}`: {ch.change} ({ch.need_words()})" for ch in changes]


def _plan_tight_changes(con: Any, plan: Any) -> None:
    """Beside a tight plan: the changes whose likely range fits (docs/planner.md#tight), smallest first."""
    if plan.chosen is None or plan.chosen.verdict != "tight":
        return
    _say(con, "[bold]to fit the likely range[/]")
    _table_changes(con, plan.changes)
    if not plan.changes:
        _say(con, "no single change found: try a smaller model or a device with more memory", indent=2)


def _plan_runners_up(con: Any, plan: Any) -> None:
    """An LLM plan's runners-up: a table when it fits the width, else one folded entry each."""
    from rich.text import Text

    if not plan.runners_up:
        return
    _say(con, Text("runners-up", style="bold"))
    ru: list[list[str | Text]] = []
    for r in plan.runners_up:
        x = r.candidate
        ru.append([_setup_line(x.setup), _g(x.device_bytes), f"{x.throughput.tokens_per_s:,.0f}", r.reason])
    widest = max(_cell_width(r[0]) for r in ru) + 5 + 9 + 3 * 4 + 1 + 30
    if widest <= con.width:
        _table(con, ["configuration", "GiB", "tokens/s", "why not"], ru, right={"GiB", "tokens/s"},
               flex="why not")  # fmt: skip
    else:  # folded: each runner-up on its own line, the reason below it
        for cfg, gib_, tps, why_not in ru:
            _say(con, Text(printable(f"{cfg}: {gib_} GiB, {tps} tokens/s")), indent=2)
            _say(con, Text(printable(f"why not: {why_not}")), indent=4, style="dim")


def plan_table(plan: Any, stderr: bool = False, verbose: bool = False) -> None:
    """The human view of a plan (on stderr when stdout carries an emitted file)."""
    from rich.text import Text

    if plan.kind == "diffusion" and plan.chosen is not None:
        diffusion_plan_table(plan, stderr=stderr)
        return
    con = _console(stderr=stderr)
    t = plan.target
    if plan.chosen is None:
        _plan_nothing_fits(con, plan)
        return
    c = plan.chosen
    s, tp = c.setup, c.throughput
    _say(
        con,
        Text(printable(plan.model_name), style="bold") + Text(" on ") + Text(printable(t.name), style="bold")
        + Text(f" ({t.backend}): ")
        + Text(_plan_verdict(c), style="bold green" if c.fits else "bold yellow")
        + Text(f" — {_g(c.device_bytes)}{_likely(c)} of {_g(c.budget_bytes)} GiB budget, about "
               f"{tp.tokens_per_s:,.0f} tokens/s"),
    )  # fmt: skip
    _table(con, ["setting", "value"], _plan_setting_rows(plan), flex="value", dim={"setting"}, box=False)
    chosen_est = getattr(plan, "estimate", None)
    master = master_copy_note(s, chosen_est.regime if chosen_est is not None else None)
    if master:
        _say(con, f"note: {master}", style="dim")
    _say(con, Text("why", style="bold"))
    why: list[list[str | Text]] = [[r.choice, r.text, r.rule] for r in plan.reasons]
    header = ["choice", "reason", "rule"]
    if not verbose:
        header, why = header[:2], [r[:2] for r in why]
    _table(con, header, why, flex="reason", dim={"rule"})
    _plan_runners_up(con, plan)
    _plan_tight_changes(con, plan)
    for e in plan.env:
        state = "[green]set[/]" if e.active else "[dim]left off[/]"
        _say(con, f"env {state} {_escape(e.name)}={_escape(e.value)}: {_escape(e.why)}")


def _plan_setting_rows(plan: Any) -> list[list[str | Text]]:
    """The chosen configuration as setting/value rows, speed and dataset time last."""
    c = plan.chosen
    s, tp = c.setup, c.throughput
    dist_rows: list[list[str | Text]] = [[name, value] for name, value in _plan_dist_rows(plan)]
    rows: list[list[str | Text]] = [
        ["method", s.method + method_suffix(s) + f" (trainer {s.trainer})"],
        ["micro-batch", f"{s.batch_size} x accumulation {s.grad_accum} = {c.effective_batch}"],
        ["sequence", f"{s.seq_len} tokens"],
        ["precision", s.precision],
        ["attention", s.attn],
        ["optimizer", s.optimizer],
        ["checkpointing", "on" if s.grad_ckpt else "off"],
        *dist_rows,
        [
            "speed",
            f"{tp.tokens_per_s:,.0f} tokens/s · step {_duration(tp.step_s)} · MFU {100 * tp.mfu:.0f}% · "
            f"{tp.bound}-bound",
        ],
    ]
    if tp.dataset_s is not None:
        rows.append(["dataset", f"{tp.optimizer_steps:,} optimizer steps, about {_duration(tp.dataset_s)}"])
    return rows


# ------------------------------------------------------------------------------------------ hw


def hw_report_table(report: Any, device_header: list[str], device_rows: list[list[str]],
                    verbose: bool = False) -> None:  # fmt: skip
    """``fitcheck hw``: no-GPU notice first, devices, then the budget arithmetic read as minus/equals."""
    from rich.text import Text

    con = _console()
    t = report.target
    if report.backend == "cpu":
        _say(
            con,
            "[bold]No GPU found on this machine: the budget below is its RAM.[/] To size for a GPU, name "
            "it: fitcheck estimate MODEL --on rtx-4090 (fitcheck hw list shows the ids)",
        )
    _say(con, Text(f"This machine: {report.backend}", style="bold"))
    rows: list[list[str | Text]] = [[*r[:-1], r[-1] if verbose else plain_note(r[-1])] for r in device_rows]
    _table(con, device_header, rows, right={h for h in device_header if "GiB" in h},
           flex="measured by", drop=("used GiB", "catalog id", "#"))  # fmt: skip
    if t is None:
        return
    _say(con, Text(printable(f"Budget on {t.name} ({t.id})") + f": {_g(t.budget_bytes)} GiB", style="bold"))
    steps = budget_steps(t.budget_lines)
    body: list[list[str | Text]] = [
        [f"{op} {label}".strip(), _g(amount), line.note if verbose else plain_note(line.note)]
        for (op, amount, label), line in zip(steps, t.budget_lines, strict=True)
    ]
    _table(con, ["step", "GiB", "how"], body, right={"GiB"}, flex="how")
    for note_ in t.notes:
        shown = note_ if verbose else plain_note(note_)
        if shown:
            _say(con, f"- {_escape(shown)}")


def hw_catalog_table(cat: Any, header: list[str], rows: list[list[str]]) -> None:
    """``fitcheck hw list``: drops columns (aliases first) and folds names to fit; 120 wide when piped."""
    from rich.text import Text

    con = _console()
    # wide (120, a pipe): fold long names rather than lose columns; narrow: keep the ids and memory
    drops = ("aliases",) if con.width >= 110 else ("aliases", "bf16 TFLOPS", "bf16", "backend", "GB/s")
    _say(con, Text(f"Hardware catalog ({len(cat.devices)} devices); budget = default headroom (none)",
                   style="bold"))  # fmt: skip
    _table(con, header, [list(r) for r in rows], right={"memory GiB", "budget GiB", "GB/s", "bf16 TFLOPS"},
           flex="name", drop=drops)  # fmt: skip
