"""docs/planner.md describes every rule, every emitter and every plan option (docs that test themselves)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fitcheck import emitters
from fitcheck.cli import app
from fitcheck.planner.rules import RULES
from fitcheck.planner.throughput import UTILISATION

DOCS = Path(__file__).resolve().parent.parent / "docs"
TEXT = (DOCS / "planner.md").read_text()


@pytest.mark.parametrize("rule", sorted(RULES))
def test_every_rule_is_documented(rule: str) -> None:
    assert f"`{rule}`" in TEXT


@pytest.mark.parametrize("fmt", sorted(emitters.REGISTRY))
def test_every_emitter_is_documented(fmt: str) -> None:
    assert f"`{fmt}`" in TEXT


def test_every_plan_option_is_documented() -> None:
    import typer.main

    cmd = typer.main.get_command(app).commands["plan"]  # type: ignore[attr-defined]
    for param in cmd.params:
        for opt in param.opts:
            if opt.startswith("--"):
                assert f"`{opt.split('/')[0]}" in TEXT or opt in TEXT, f"docs/planner.md lacks {opt}"


def test_utilisation_table_matches_the_code() -> None:
    for backend, (factor, _) in UTILISATION.items():
        assert f"| {factor:.2f} |" in TEXT, backend
