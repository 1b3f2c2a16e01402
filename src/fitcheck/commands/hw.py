"""``fitcheck hw`` (detect this machine) and ``fitcheck hw list`` (the hardware catalog).

Thin commands: parse options, call `fitcheck.hardware.report`, render, return. Everything heavy
(pydantic models, yaml, rich) is imported inside the functions, so ``fitcheck --help`` stays fast.
Errors are raised as `FitcheckError`; the CLI prints them as one line and exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fitcheck.units import GIB

if TYPE_CHECKING:
    from fitcheck.hardware.env import ProbeEnv
    from fitcheck.hardware.report import HwCatalog, HwReport
    from fitcheck.models import Frozen


class OutputFormat(StrEnum):
    """What a data command prints on stdout (json: exactly one document)."""

    table = "table"
    json = "json"
    yaml = "yaml"
    markdown = "markdown"


#: Builds the machine to probe; tests replace it to replay recorded tool output.
probe_env_factory: Callable[[bool], ProbeEnv] | None = None

_FORMAT_HELP = "table, json, yaml or markdown (json prints exactly one document)"
_HEADROOM_HELP = "safety margin kept free: 2GB or 10% of usable memory (default none); GB means GiB"
_VERBOSE_HELP = "also show where each figure comes from (sources, capture notes)"
_TORCH_HELP = "also ask PyTorch in this process (exact, but creates a CUDA context of ~0.4 GiB)"


def register(app: typer.Typer) -> None:
    """Add the ``hw`` command group (``fitcheck hw``, ``fitcheck hw list``) to the CLI."""
    group = typer.Typer(
        name="hw",
        help="Detect this machine's GPU/Mac/RAM and its usable training memory; `hw list` shows the catalog.",
        invoke_without_command=True,
        no_args_is_help=False,
    )
    group.callback(invoke_without_command=True)(hw_command)
    group.command("list")(hw_list_command)
    app.add_typer(group, name="hw")


def hw_command(
    ctx: typer.Context,
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help=_FORMAT_HELP)] = OutputFormat.table,
    headroom: Annotated[str | None, typer.Option("--headroom", help=_HEADROOM_HELP)] = None,
    use_torch: Annotated[bool, typer.Option("--torch", help=_TORCH_HELP)] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=_VERBOSE_HELP)] = False,
) -> None:
    """Detect this machine (NVIDIA, AMD, Apple silicon, else CPU RAM) and its usable memory, in GiB."""
    if ctx.invoked_subcommand is not None:
        return
    from fitcheck.hardware.env import ProbeEnv
    from fitcheck.hardware.report import detect_report

    env = probe_env_factory(use_torch) if probe_env_factory else ProbeEnv.real(use_torch=use_torch)
    report = detect_report(env, headroom=headroom)
    for warning in report.warnings:
        typer.echo(f"warning: {warning}", err=True)
    _emit(report, output, render_report_markdown, lambda r: render_report_table(r, verbose))


def hw_list_command(
    backend: Annotated[
        str | None, typer.Option("--backend", "-b", help="only cuda, rocm or mps devices")
    ] = None,
    output: Annotated[OutputFormat, typer.Option("--format", "-f", help=_FORMAT_HELP)] = OutputFormat.table,
) -> None:
    """List the hardware catalog: ids and aliases for --on, memory, usable budget, bandwidth, bf16."""
    from fitcheck.hardware.report import catalog_table

    _emit(catalog_table(backend), output, render_catalog_markdown, render_catalog_table)


def _emit(
    data: Frozen,
    output: OutputFormat,
    markdown: Callable[[Any], str],
    table: Callable[[Any], None],
) -> None:
    # sys.stdout, which the CLI guards (a failed write is exit 2, `fitcheck.output.GuardedStdout`); click's
    # echo writes around it to its own stream, whose failure no one would see
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(data.model_dump(mode="json"), indent=2) + "\n")
    elif output is OutputFormat.yaml:
        import yaml

        sys.stdout.write(yaml.safe_dump(data.model_dump(mode="json"), sort_keys=False, allow_unicode=True))
    elif output is OutputFormat.markdown:
        sys.stdout.write(markdown(data))
    else:
        table(data)


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _device_rows(report: HwReport) -> list[list[str]]:
    rows = [
        [
            str(g.index),
            g.name,
            g.catalog_id or "-",
            _gib(g.total_bytes),
            _gib(g.used_bytes),
            _gib(g.free_bytes),
            g.method,
        ]
        for g in report.gpus
    ]
    if report.apple is not None:
        a = report.apple
        rows.append(["-", a.chip, a.catalog_id or "-", _gib(a.memory_bytes), "-", "-", a.method])
    if report.cpu is not None:
        c = report.cpu
        rows.append(["-", "system RAM", "-", _gib(c.total_bytes), "-", _gib(c.usable_bytes), c.method])
    return rows


_DEVICE_HEADER = ["#", "device", "catalog id", "total GiB", "used GiB", "free GiB", "measured by"]
_BUDGET_HEADER = ["step", "GiB", "how"]


def _budget_rows(target: Any) -> list[list[str]]:
    """Deductions read as "minus 0.97 GiB", subtotals as "= ..." (render.budget_steps)."""
    from fitcheck.render import budget_steps

    return [
        [f"{op} {label}".strip(), f"{amount / GIB:.2f}", line.note]
        for (op, amount, label), line in zip(
            budget_steps(target.budget_lines), target.budget_lines, strict=True
        )
    ]


def render_report_markdown(report: HwReport) -> str:
    """``fitcheck hw --format markdown``."""
    parts = [f"## This machine: {report.backend}\n\n", _md_table(_DEVICE_HEADER, _device_rows(report))]
    if report.target is not None:
        t = report.target
        parts += [f"\n### Budget on {t.name} ({t.id}): {_gib(t.budget_bytes)} GiB\n\n"]
        parts += [_md_table(_BUDGET_HEADER, _budget_rows(t))]
        parts += ["\n" + "".join(f"- {note}\n" for note in t.notes)] if t.notes else []
    return "".join(parts)


def render_report_table(report: HwReport, verbose: bool = False) -> None:
    """``fitcheck hw``: devices, then the budget arithmetic and its notes (render.py draws it)."""
    from fitcheck import render

    render.hw_report_table(report, _DEVICE_HEADER, _device_rows(report), verbose=verbose)


_CATALOG_HEADER = [
    "id",
    "name",
    "backend",
    "memory GiB",
    "budget GiB",
    "GB/s",
    "bf16 TFLOPS",
    "bf16",
    "aliases",
]


def _catalog_rows(cat: HwCatalog) -> list[list[str]]:
    return [
        [
            d.id,
            d.name,
            d.backend,
            f"{d.memory_gib:.2f}",
            _gib(d.budget_bytes),
            _num(d.bandwidth_gbps),
            _num(d.bf16_tensor_tflops_dense),
            "yes" if d.bf16_supported else "no",
            ", ".join(d.aliases),
        ]
        for d in cat.devices
    ]


def render_catalog_markdown(cat: HwCatalog) -> str:
    """``fitcheck hw list --format markdown``."""
    return _md_table(_CATALOG_HEADER, _catalog_rows(cat))


def render_catalog_table(cat: HwCatalog) -> None:
    """``fitcheck hw list`` (render.py draws it)."""
    from fitcheck import render

    render.hw_catalog_table(cat, _CATALOG_HEADER, _catalog_rows(cat))
