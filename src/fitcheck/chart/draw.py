"""Draw chart specs with matplotlib (the optional ``chart`` extra) into SVG, PNG or HTML bytes.

Only this module imports matplotlib, and only when a chart is asked for. Figures are built with
the object API (`matplotlib.figure.Figure`, no pyplot state) on the Agg canvas, at a fixed size:
1000 x 560 pixels for PNG (10 x 5.6 inches at 100 dpi), readable in a README or a pull-request
comment. SVG keeps its text as text (searchable, testable) and carries no date, so the same
chart gives the same file. HTML is one self-contained page: the SVG inline and the numbers as a
table, no script and nothing fetched.
"""

from __future__ import annotations

import html
import io
from typing import TYPE_CHECKING

from fitcheck.chart.palette import CATEGORY_COLOUR, CATEGORY_ORDER, colour
from fitcheck.chart.spec import BarChart, Chart, MatrixChart, PlanChart, Timeline
from fitcheck.errors import MissingExtraError
from fitcheck.units import gib as _gib

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

CHART_HINT = (
    "charts need the chart extra: pip install -e '.[chart]' (from a checkout)"
    " or pip install 'fitcheck-train[chart]'"
)
WIDTH_IN, HEIGHT_IN, DPI = 10.0, 5.6, 100
VERDICT_COLOUR = {"fits": "#009E73", "tight": "#E69F00", "does_not_fit": "#D55E00"}
FORMATS = ("svg", "png", "html")


def require_chart() -> None:
    """Raise `MissingExtraError` with the install hint unless matplotlib imports."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MissingExtraError(CHART_HINT) from None


def _figure() -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI, layout="constrained")


def _titles(fig: Figure, title: str, subtitle: str) -> None:
    fig.suptitle(f"{title}\n{subtitle}" if subtitle else title, fontsize=12, x=0.02, ha="left")


def _bars(ax: Axes, spec: BarChart) -> None:
    """Stacked bars, reference lines and the band, then one legend (lines first, then components)."""
    seen = _stacks(ax, spec)
    _reference_lines(ax, spec)
    if spec.band is not None:
        b = spec.band
        lo, hi = _gib(b.low_bytes), _gib(b.high_bytes)
        ax.errorbar(
            [b.bar + 0.38],
            [(lo + hi) / 2],
            yerr=[[(hi - lo) / 2], [(hi - lo) / 2]],
            fmt="none",
            ecolor="#000000",
            capsize=5,
            linewidth=1.5,
            label=f"{b.label}: {lo:.1f}-{hi:.1f} GiB",
        )
    ax.set_xticks(list(range(len(spec.bars))), [b.label for b in spec.bars])
    ax.set_ylabel("GiB")
    _legend(ax, seen)
    ax.spines[["top", "right"]].set_visible(False)
    if spec.note:
        ax.set_xlabel(spec.note, fontsize=8, color="#555555")


def _stacks(ax: Axes, spec: BarChart) -> set[str]:
    """One stacked bar per entry, its total above it; returns the component names drawn."""
    seen: set[str] = set()
    for i, bar in enumerate(spec.bars):
        bottom = 0.0
        for name, nbytes in bar.segments:
            h = _gib(nbytes)
            label = name if name not in seen else None
            seen.add(name)
            ax.bar(
                i,
                h,
                bottom=bottom,
                color=colour(name),
                edgecolor="white",
                linewidth=0.5,
                label=label,
                width=0.62,
            )
            bottom += h
        ax.annotate(
            f"{_gib(bar.total_bytes):.1f} GiB" + (" (peak)" if bar.marked else ""),
            (i, bottom),
            xytext=(0, 3),
            textcoords="offset points",
            ha="center",
            fontsize=9,
            fontweight="bold" if bar.marked else "normal",
        )
    return seen


def _reference_lines(ax: Axes, spec: BarChart) -> None:
    styles = {"solid": "-", "dashed": "--", "dotted": ":"}
    for line in spec.lines:
        ax.axhline(
            _gib(line.bytes),
            color="#333333",
            linestyle=styles[line.style],
            linewidth=1.2,
            label=f"{line.label}: {_gib(line.bytes):.1f} GiB",
        )


def _legend(ax: Axes, components: set[str]) -> None:
    """Reference lines first, then components from the top of the stack down."""
    handles, labels = ax.get_legend_handles_labels()
    parts = [(h, lab) for h, lab in zip(handles, labels, strict=True) if lab in components]
    rest = [(h, lab) for h, lab in zip(handles, labels, strict=True) if lab not in components]
    order = rest + parts[::-1]
    ax.legend(
        [h for h, _ in order],
        [lab for _, lab in order],
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
    )


def _plan(fig: Figure, spec: PlanChart) -> None:
    mem, speed = fig.subplots(1, 2, sharey=True, gridspec_kw={"width_ratios": [3, 2]})
    labels = [("> " if r.chosen else "") + r.label for r in spec.rows]
    ys = list(range(len(spec.rows)))[::-1]
    for y, r in zip(ys, spec.rows, strict=True):
        c = VERDICT_COLOUR.get(r.verdict, "#999999")
        mem.barh(
            y,
            _gib(r.device_bytes),
            color=c,
            edgecolor="black" if r.chosen else "white",
            linewidth=1.5 if r.chosen else 0.5,
        )
        mem.annotate(
            f"{_gib(r.device_bytes):.1f}",
            (_gib(r.device_bytes), y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
        speed.barh(
            y,
            r.speed,
            color=c,
            edgecolor="black" if r.chosen else "white",
            linewidth=1.5 if r.chosen else 0.5,
        )
        speed.annotate(
            f"{r.speed:,.0f}" if r.speed >= 10 else f"{r.speed:.2f}",
            (r.speed, y),
            xytext=(3, 0),
            textcoords="offset points",
            va="center",
            fontsize=8,
        )
    mem.axvline(
        _gib(spec.budget_bytes),
        color="#333333",
        linestyle="--",
        label=f"budget: {_gib(spec.budget_bytes):.1f} GiB",
    )
    mem.set_yticks(ys, labels, fontsize=8)
    mem.set_xlabel("GiB on the device")
    speed.set_xlabel(f"estimated {spec.speed_unit}")
    from matplotlib.patches import Patch

    handles = [Patch(color=v, label=k.replace("_", " ")) for k, v in VERDICT_COLOUR.items()]
    mem.legend(handles=[*handles, *mem.get_legend_handles_labels()[0]], fontsize=8, loc="lower right")
    for ax in (mem, speed):
        ax.spines[["top", "right"]].set_visible(False)


def _matrix(ax: Axes, spec: MatrixChart) -> None:
    from matplotlib.patches import Patch, Rectangle

    n, m = len(spec.models), len(spec.methods)
    for i, row in enumerate(spec.cells):
        for j, cell in enumerate(row):
            y = n - 1 - i
            ax.add_patch(
                Rectangle(
                    (j, y),
                    1,
                    1,
                    facecolor=VERDICT_COLOUR.get(cell.verdict, "#999999"),
                    edgecolor="white",
                    linewidth=2,
                )
            )
            ax.text(
                j + 0.5,
                y + 0.5,
                f"{_gib(cell.bytes):.1f} GiB",
                ha="center",
                va="center",
                fontsize=9,
                color="white",
                fontweight="bold",
            )
    ax.set_xlim(0, m)
    ax.set_ylim(0, n)
    ax.set_xticks([j + 0.5 for j in range(m)], list(spec.methods))
    ax.set_yticks([n - 1 - i + 0.5 for i in range(n)], list(spec.models), fontsize=8)
    ax.tick_params(length=0)
    ax.xaxis.tick_top()
    for side in ("top", "right", "bottom", "left"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=v, label=k.replace("_", " ")) for k, v in VERDICT_COLOUR.items()]
    ax.legend(
        handles=handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=8,
        frameon=False,
        title=f"budget {_gib(spec.budget_bytes):.1f} GiB",
    )


def _timeline(ax: Axes, spec: Timeline) -> None:
    names = [c for c in CATEGORY_ORDER if c in dict(spec.series)]
    data = dict(spec.series)
    ax.stackplot(
        list(spec.x),
        *[[_gib(v) for v in data[c]] for c in names],
        labels=names,
        colors=[CATEGORY_COLOUR[c] for c in names],
        alpha=0.9,
        linewidth=0,
    )
    top = max((sum(vals) for vals in zip(*data.values(), strict=True)), default=0)
    for name, start, end in spec.phases:
        ax.axvline(start, color="#333333", linewidth=0.8, linestyle=":")
        ax.text((start + end) / 2, _gib(top) * 1.07, name.replace("_", " "), ha="center", fontsize=9)
    for name, nbytes in spec.estimate:
        spans = [(s, e) for n, s, e in spec.phases if n == name]
        for s, e in spans:
            ax.hlines(_gib(nbytes), s, e, colors="#000000", linestyles="--", linewidth=1.4)
        if spans:
            ax.annotate(
                f"estimate {_gib(nbytes):.2f}",
                (spans[0][0], _gib(nbytes)),
                xytext=(2, 3),
                textcoords="offset points",
                fontsize=8,
            )
    if spec.peak is not None:
        x, nbytes = spec.peak
        ax.annotate(
            f"peak {_gib(nbytes):.2f} GiB",
            (x, _gib(nbytes)),
            xytext=(10, -18),
            textcoords="offset points",
            arrowprops={"arrowstyle": "->"},
            fontsize=9,
            fontweight="bold",
        )
    ax.plot([], [], color="#000000", linestyle="--", label="estimate per phase")
    ax.set_ylim(0, _gib(top) * 1.15 if top else 1)
    ax.set_xlabel("allocator events (allocations and frees) in the measured step")
    ax.set_ylabel("GiB live")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax.spines[["top", "right"]].set_visible(False)


def figure(spec: Chart) -> Figure:
    """The matplotlib figure for a chart spec."""
    require_chart()
    fig = _figure()
    _titles(fig, spec.title, spec.subtitle)
    if isinstance(spec, PlanChart):
        _plan(fig, spec)
        return fig
    ax = fig.subplots()
    if isinstance(spec, BarChart):
        _bars(ax, spec)
    elif isinstance(spec, MatrixChart):
        _matrix(ax, spec)
    else:
        _timeline(ax, spec)
    return fig


def _svg(fig: Figure) -> bytes:
    import matplotlib

    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "fitcheck"}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    return buf.getvalue()


def _rows(spec: Chart) -> list[tuple[str, ...]]:
    """The chart's numbers as table rows (for the HTML page)."""
    if isinstance(spec, BarChart):
        out: list[tuple[str, ...]] = [("bar", "component", "GiB")]
        for bar in spec.bars:
            out += [(bar.label, name, f"{_gib(b):.2f}") for name, b in bar.segments]
        out += [("line", line.label, f"{_gib(line.bytes):.2f}") for line in spec.lines]
        if spec.band is not None:
            out.append(
                ("band", spec.band.label, f"{_gib(spec.band.low_bytes):.2f}-{_gib(spec.band.high_bytes):.2f}")
            )
        return out
    if isinstance(spec, PlanChart):
        head: list[tuple[str, ...]] = [("configuration", "GiB", spec.speed_unit, "verdict")]
        return head + [
            (
                ("chosen: " if r.chosen else "") + r.label,
                f"{_gib(r.device_bytes):.2f}",
                f"{r.speed:.6g}",
                r.verdict,
            )
            for r in spec.rows
        ]
    if isinstance(spec, MatrixChart):
        first: list[tuple[str, ...]] = [("model", *spec.methods)]
        return first + [
            (model, *(f"{_gib(c.bytes):.1f} ({c.verdict})" for c in row))
            for model, row in zip(spec.models, spec.cells, strict=True)
        ]
    top: list[tuple[str, ...]] = [("phase", "estimate GiB")]
    return top + [(n, f"{_gib(b):.2f}") for n, b in spec.estimate]


def _html(spec: Chart, svg: bytes) -> bytes:
    rows = _rows(spec)
    head = "".join(f"<th>{html.escape(c)}</th>" for c in rows[0])
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows[1:])
    svg_text = svg.decode("utf-8")
    svg_text = svg_text[svg_text.index("<svg") :]
    page = (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{html.escape(spec.title)}</title>"
        "<style>body{font-family:sans-serif;margin:1.5em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 8px;text-align:left}</style></head><body>\n"
        f"<h1>{html.escape(spec.title)}</h1><p>{html.escape(spec.subtitle)}</p>\n{svg_text}\n"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n</body></html>\n"
    )
    return page.encode("utf-8")


def render(spec: Chart, fmt: str) -> bytes:
    """The chart as ``svg``, ``png`` or ``html`` bytes."""
    fig = figure(spec)
    if fmt == "png":
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
        return buf.getvalue()
    svg = _svg(fig)
    return _html(spec, svg) if fmt == "html" else svg
