"""The lines ``--from`` prints on stderr: where the setup came from, what was not used or modelled.

Pure text (the CLI writes it): one line per kind, so a CI log shows the whole story in a few lines.
"""

from __future__ import annotations

from collections.abc import Mapping

from fitcheck.readers.base import ReadResult, Value
from fitcheck.readers.merge import Resolved
from fitcheck.readers.neutral import is_neutral


def _pairs(values: Mapping[str, Value]) -> str:
    return ", ".join(f"{k}={_show(v)}" for k, v in values.items())


def _show(v: Value) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v == int(v):
        return str(int(v))
    return str(v)


def lines(read: ReadResult | None, merged: Resolved, model_note: str | None = None) -> list[str]:
    """The stderr lines (without the ``fitcheck:`` prefix) for a run with or without ``--from``."""
    out: list[str] = []
    if read is not None:
        order = [*read.values, *merged.values]  # the file's own order first
        got = {k: merged.values[k] for k in dict.fromkeys(order) if merged.origin.get(k) == "file"}
        out.append(f"from {read.path} ({read.format}): {_pairs(got) or 'no setup values'}")
        if model_note:
            out.append(model_note)
    defaulted = {
        k: merged.values[k] for k, o in merged.origin.items() if o == "trainer default" and k in merged.values
    }
    if defaulted:
        whose = read.format if read is not None else merged.values.get("trainer", "")
        out.append(f"{whose} defaults (not set here): {_pairs(defaulted)}")
    if read is not None and merged.origin.get("method") == "fitcheck default":
        # a launch config (accelerate, DeepSpeed) says how the run is spread, not what it trains
        method = merged.values.get("method", "lora")
        out.append(
            f"{read.path} does not say what is trained: sized as --method {_show(method)} (fitcheck's "
            "default); give --method full|lora|qlora"
        )
    if merged.pending:
        out.append(f"read, not yet modelled: {_pairs(merged.pending)}")
    if read is not None:
        out += [f"{read.path}: {n}" for n in (*read.notes, *merged.notes)]
        neutral = [k for k in read.unused if is_neutral(k)]
        unknown = [k for k in read.unused if not is_neutral(k)]
        if neutral:
            out.append(f"{read.path}: not used (no memory effect): {', '.join(neutral)}")
        if unknown:
            out.append(f"{read.path}: not understood, ignored (may change memory): {', '.join(unknown)}")
    return out
