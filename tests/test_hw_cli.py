"""`fitcheck hw` and `fitcheck hw list` through typer's CliRunner, on recorded machines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from fitcheck.commands import hw
from fitcheck.errors import InputError
from hw_replay import env_from_fixture

SRC = Path(__file__).resolve().parent.parent / "src"
GIB = 1 << 30


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """fitcheck (test shell: the real CLI owns cli.py)."""

    hw.register(app)
    return app


@pytest.fixture
def machine(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Replay a fixture; append its name to the list to choose it (default h100_idle)."""
    chosen: list[str] = []
    monkeypatch.setattr(
        hw, "probe_env_factory", lambda use_torch: env_from_fixture(chosen[-1] if chosen else "h100_idle")
    )
    yield chosen


def invoke(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(make_app(), list(args))


def test_hw_json_is_one_document(machine: list[str]) -> None:
    result = invoke("hw", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # fails on anything but exactly one JSON document
    assert doc["backend"] == "cuda"
    assert doc["gpus"][0]["catalog_id"] == "h100-sxm5-80gb"
    assert doc["target"]["usable_bytes"] == 81081 << 20
    assert doc["probes"] and all("command" in s for s in doc["probes"])


def test_hw_warnings_go_to_stderr(machine: list[str]) -> None:
    machine.append("mac_rosetta")
    result = invoke("hw", "--format", "json")
    assert result.exit_code == 0
    assert "Rosetta" in result.stderr
    assert json.loads(result.stdout)["backend"] == "mps"


def test_hw_yaml_and_markdown(machine: list[str]) -> None:
    machine.append("mac_m3_max_36gb")
    doc = yaml.safe_load(invoke("hw", "--format", "yaml").stdout)
    assert doc["target"]["usable_bytes"] == 27 * GIB and doc["apple"]["catalog_id"] == "apple-m3-max-36gb"
    md = invoke("hw", "--format", "markdown").stdout
    assert md.startswith("## This machine: mps") and "| = usable | 27.00 |" in md


def test_hw_table_shows_budget(machine: list[str]) -> None:
    machine.append("container_cgroup")
    result = invoke("hw")
    assert result.exit_code == 0
    assert "Budget on CPU" in result.stdout and "cgroup limit" in result.stdout


def test_hw_headroom_option(machine: list[str]) -> None:
    doc = json.loads(invoke("hw", "--format", "json", "--headroom", "2GB").stdout)
    assert doc["target"]["headroom_bytes"] == 2 * GIB


def test_hw_list_backend_filter() -> None:
    doc = json.loads(invoke("hw", "list", "--backend", "mps", "--format", "json").stdout)
    assert doc["backend"] == "mps" and len(doc["devices"]) >= 30
    assert {d["backend"] for d in doc["devices"]} == {"mps"}
    ids = {d["id"] for d in doc["devices"]}
    assert {"apple-m3-max-36gb", "apple-m1-16gb", "apple-m2-ultra-192gb"} <= ids


def test_hw_list_all_formats() -> None:
    table = invoke("hw", "list").stdout
    assert "rtx-4090" in table and "Hardware catalog" in table
    md = invoke("hw", "list", "--format", "markdown").stdout
    assert md.splitlines()[0].startswith("| id | name |") and "| rtx-4090 |" in md
    rows = yaml.safe_load(invoke("hw", "list", "--format", "yaml").stdout)["devices"]
    assert any(r["id"] == "mi300x" and r["backend"] == "rocm" for r in rows)


def test_hw_list_bad_backend_is_a_fitcheck_error() -> None:
    result = invoke("hw", "list", "--backend", "tpu")
    assert isinstance(result.exception, InputError) and "cuda, rocm, mps" in str(result.exception)


def test_bad_format_is_rejected_by_typer() -> None:
    assert invoke("hw", "--format", "xml").exit_code == 2


def test_command_module_imports_nothing_heavy() -> None:
    code = (
        "import sys, typer, fitcheck.commands.hw as hw; app = typer.Typer(); hw.register(app);"
        "bad = [m for m in ('torch', 'numpy', 'rich', 'yaml', 'pydantic', 'fitcheck.hardware.probes')"
        " if m in sys.modules]; assert not bad, bad"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
