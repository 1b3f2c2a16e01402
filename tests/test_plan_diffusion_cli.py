"""`fitcheck plan` on diffusion models: kohya config + dataset beside it, refusals, exit codes."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from fitcheck.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_plan_sdxl_writes_config_and_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "sdxl", "--method", "lora", "--on", "rtx-3060-12gb", "--emit", "kohya.toml"]
    rc, _, err = run(capsys, *args, "-o", str(tmp_path))
    assert rc == 0, err
    config = tomllib.loads((tmp_path / "kohya.toml").read_text())
    dataset = tomllib.loads((tmp_path / "dataset.toml").read_text())
    flat = {k: v for table in config.values() for k, v in table.items()}
    assert flat["dataset_config"] == "dataset.toml"
    assert flat["network_module"] == "networks.lora"
    assert flat["sdpa"] is True and "xformers" not in flat
    assert "datasets" in dataset
    assert (tmp_path / "kohya.toml").read_text().startswith("# kohya sd-scripts training config")
    # never overwritten without --force, and nothing half-written
    before = (tmp_path / "kohya.toml").read_text()
    rc, _, err = run(
        capsys, "plan", "sdxl", "--on", "rtx-3060-12gb", "--emit", "kohya.toml", "-o", str(tmp_path)
    )
    assert rc == 2 and "--force" in err
    assert (tmp_path / "kohya.toml").read_text() == before


def test_plan_sd15_on_mac_never_xformers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(
        capsys, "plan", "sd15", "--method", "full", "--on", "apple-m1-pro-16gb", "--format", "json"
    )
    doc = json.loads(out)
    assert rc == (0 if doc["verdict"] in ("fits", "tight") else 1)
    assert doc["kind"] == "diffusion" and (doc["chosen"] or doc["smallest"])["setup"]["attn"] != "xformers"


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["plan", "sdxl", "--on", "rtx-4090", "--emit", "hf.yaml"], "--emit kohya.toml"),
        (["plan", "llama-3.1-8b", "--on", "rtx-4090", "--emit", "kohya.toml"], "diffusion models"),
        (["plan", "7B", "--on", "rtx-4090", "--min-resolution", "512"], "--min-seq-len"),
    ],
)
def test_plan_refusals(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    args: list[str],
    needle: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    rc, _, err = run(capsys, *args)
    assert rc == 2 and needle in err and not list(tmp_path.iterdir())
