"""Charts: memory per phase, plans, what fits, and memory over a traced step (the ``chart`` extra).

`fitcheck.chart.spec` turns fitcheck's models into plain chart data (no plotting library);
`fitcheck.chart.draw` draws it with matplotlib, imported only here and only when a chart is asked
for; `write_chart` picks the format from the file's extension and writes atomically, refusing to
overwrite without ``force`` like ``--emit``.
"""

from __future__ import annotations

import os
from pathlib import Path

from fitcheck.chart.spec import Chart
from fitcheck.errors import OptionError

SUFFIXES = (".svg", ".png", ".html")


def chart_format(path: Path, option: str = "--chart") -> str:
    """The format a chart file is written in, from its extension (exit 2 for any other, naming ``option``)."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise OptionError(f"{option} {path}: name a .svg, .png or .html file")
    return suffix[1:]


def chart_path(text: str, option: str = "--chart") -> Path:
    """The chart file a typed name means: a name that ends in a folder (``out/a.svg/``, ``..``) is refused,
    as ``--emit`` refuses it (``Path`` would drop the trailing slash and write a file named like the
    folder); then its format (`chart_format`)."""
    if os.path.basename(text) in ("", ".", ".."):
        raise OptionError(f"{option} {text}: names a folder; give a .svg, .png or .html file name")
    path = Path(text)
    chart_format(path, option)
    return path


def write_chart(spec: Chart, path: Path, force: bool) -> Path:
    """Draw ``spec`` and write it to ``path`` (atomically; existing files only with ``force``)."""
    from fitcheck.chart.draw import render
    from fitcheck.emitters.writer import check_destinations, write_atomic

    fmt = chart_format(path)
    check_destinations([path], force)
    write_atomic(path, render(spec, fmt), force)
    return path
