"""Hostile inputs, fifth red-team pass (session 8): one test per class of failure the fourth pass left, each
failing before its fix.

- ``COLUMNS=0`` printed nothing at all with exit 0 (``check``: exit 1 and no word), and below 80 columns
  table cells were cut to "…" (the breakdown's GiB column at 40) (`fitcheck.render.MIN_COLUMNS`).
"""

from __future__ import annotations

import pytest

from test_fuzz_cli import hold_contract, invoke

# --- narrow terminals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("columns", ["0", "1", "40", "79"])
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "7B", "--on", "rtx-4090"],
        ["check", "7B", "--on", "rtx-4090"],
        ["matrix", "--on", "rtx-4090", "--models", "7B"],
        ["estimate", "7B", "--on", "2x4090", "--strategy", "zero3"],
    ],
    ids=["estimate", "check", "matrix", "zero3"],
)
def test_a_narrow_terminal_still_shows_every_figure(
    columns: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    _, wide, _ = invoke(argv)
    monkeypatch.setenv("COLUMNS", columns)
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert "…" not in out, out
    assert "GiB" in out and "fit" in out, out
    for figure in ("26.86", "26.9") if argv[0] != "matrix" else ("26.86",):
        assert (figure in wide) == (figure in out), figure
