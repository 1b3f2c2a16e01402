"""``fitcheck plan`` end to end: exit codes, one JSON document, runners-up, files written safely."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from fitcheck.cli import main


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["plan", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_fits_exit_0_with_one_json_document(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["llama-3.1-8b", "--on", "rtx-4090", "--format", "json"], capsys)
    assert rc == 0
    doc = json.loads(out)
    assert doc["fits"] is True and doc["chosen"]["verdict"] == "fits"
    assert doc["chosen"]["device_bytes"] <= doc["target"]["usable_bytes"] - doc["target"]["headroom_bytes"]
    assert doc["runners_up"] and all(r["reason"] for r in doc["runners_up"])
    assert {r["rule"] for r in doc["reasons"]} >= {"effective-batch", "flash-ampere", "bf16-hw", "throughput"}
    assert doc["estimate"]["device_bytes"] == doc["chosen"]["device_bytes"]
    assert doc["grid_points"] >= doc["estimates_run"] > 0


@pytest.mark.parametrize("fmt", ["table", "markdown"])
def test_only_tight_plans_the_tight_configuration(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A 7B LoRA on a 22 GB card: no configuration's band fits, the fastest whose central estimate fits is
    chosen (verdict tight, as `check` judges it), exit 0 with check's warning; 1 with --strict."""
    args = ["qwen2.5-7b", "--on", "22GB", "--method", "lora", "--format"]
    rc, out, err = run([*args, fmt], capsys)
    doc_rc, doc_out, _ = run([*args, "json"], capsys)
    doc = json.loads(doc_out)
    assert rc == doc_rc == 0 and doc["verdict"] == "tight" and doc["fits"] is False
    c = doc["chosen"]
    assert c["verdict"] == "tight" and c["device_bytes"] <= c["budget_bytes"] < c["high_bytes"]
    assert doc["smallest"] is None and doc["changes"]  # what would make the likely range fit
    assert all(ch["high_bytes"] <= ch["budget_bytes"] for ch in doc["changes"])
    assert doc["reasons"][0]["rule"] == "tight-fallback"
    assert err.count("fitcheck: warning: tight: the estimate fits") == 1 and "--strict makes it 1" in err
    flat = " ".join(out.split())
    assert "nothing fits" not in flat and "tight" in flat and "likely up to" in flat
    strict_rc, _, strict_err = run([*args, fmt, "--strict"], capsys)
    assert strict_rc == 1 and "(--strict: exit 1)" in strict_err


def test_nothing_fits_exit_1_names_the_smallest_change(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["llama-3.1-70b", "--on", "rtx-4090", "--method", "lora"], capsys)
    assert rc == 1
    assert "nothing fits" in out and "smallest change" in out
    rc, out, _ = run(["llama-3.1-70b", "--on", "rtx-4090", "--method", "lora", "--format", "json"], capsys)
    doc = json.loads(out)
    assert rc == 1 and doc["fits"] is False and doc["chosen"] is None and doc["changes"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--on", "apple-m1-16gb", "--attn", "xformers"], "xformers is CUDA-only"),
        (["--on", "apple-m1-16gb", "--optimizer", "adamw8bit"], "bitsandbytes"),
        (["--on", "rtx-4090", "--emit", "kohya.toml"], "diffusion"),
        (["--on", "rtx-4090", "--emit", "train.yaml"], "cannot tell the format"),
        (
            ["--on", "rtx-4090", "--emit", "hf.yaml", "--emit", "axolotl.yaml"],
            "one plan is estimated for one",
        ),
        (["--on", "rtx-4090", "--trainer", "axolotl", "--emit", "hf.yaml"], "needs --trainer hf"),
        (["--on", "rtx-4090", "--emit", "hf.yaml", "--attn", "xformers"], "cannot select --attn xformers"),
        (["--on", "rtx-4090", "--resolution", "512"], "--resolution applies to diffusion"),
        (["--on", "rtx-4090", "--method", "full", "--lora-rank", "8"], "--lora-rank applies"),
        (["--on", "rtx-4090", "--dataset-tokens", "lots"], "is not a count"),
        (["--on", "rtx-4090", "--trainer", "axolotl", "--master-weights"], "decides its own precision"),
        (["--on", "rtx-4090", "--emit-format", "hf.yaml"], "needs --emit"),
        (["--on", "rtx-4090", "--emit", "hf.yaml", "--emit", "env.sh", "-o", "-"], "stdout takes one file"),
        (["--on", "rtx-4090", "--emit", "hf.yaml", "-o", "-", "--format", "json"], "cannot also carry"),
    ],
)
def test_trouble_exit_2_with_one_line(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["llama-3.2-1b", *args], capsys)
    assert rc == 2
    assert says in err and err.count("\n") == 1 and "Traceback" not in err
    assert out == ""


def test_writes_files_and_never_overwrites_without_force(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["llama-3.2-1b", "--on", "rtx-4090", "--method", "lora", "--emit", "hf.yaml", "--emit", "env.sh"]
    rc, _, err = run([*args, "-o", str(tmp_path)], capsys)
    assert rc == 0 and "wrote" in err
    hf = tmp_path / "hf.yaml"
    assert yaml.safe_load(hf.read_text())["per_device_train_batch_size"] >= 1
    hf.write_text("mine\n")
    rc, out, err = run([*args, "-o", str(tmp_path)], capsys)
    assert rc == 2 and "exists; add --force" in err and out == ""
    assert hf.read_text() == "mine\n"
    rc, _, _ = run([*args, "-o", str(tmp_path), "--force"], capsys)
    assert rc == 0 and hf.read_text().startswith("# TRL SFT config")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.sh", "hf.yaml"]


def test_a_refusal_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "env.sh").write_text("keep\n")
    args = ["llama-3.2-1b", "--on", "rtx-4090", "--emit", "hf.yaml", "--emit", "env.sh", "-o", str(tmp_path)]
    rc, _, _ = run(args, capsys)
    assert rc == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["env.sh"]


def test_a_failed_write_leaves_no_partial_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", broken)
    rc, _, err = run(["llama-3.2-1b", "--on", "rtx-4090", "--emit", "hf.yaml", "-o", str(tmp_path)], capsys)
    assert rc == 2 and "No space left on device" in err
    assert list(tmp_path.iterdir()) == []


def test_stdout_carries_the_file_and_the_table_goes_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["llama-3.2-1b", "--on", "rtx-4090", "--emit", "hf.yaml", "-o", "-"], capsys)
    assert rc == 0
    assert yaml.safe_load(out)["model_name_or_path"] == "meta-llama/Llama-3.2-1B-Instruct"
    assert "fits" in err
    rc, out, _ = run(["llama-3.2-1b", "--on", "rtx-4090", "--emit", "-", "--emit-format", "env.sh"], capsys)
    assert rc == 0 and "written by fitcheck" in out


def test_nothing_fits_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["llama-3.1-70b", "--on", "rtx-4090", "--method", "lora", "--emit", "hf.yaml", "-o", str(tmp_path)]
    rc, _, err = run(args, capsys)
    assert rc == 1 and "nothing written" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["yaml", "markdown", "table"])
def test_other_formats(fmt: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["qwen2.5-0.5b", "--on", "rtx-4090", "--format", fmt], capsys)
    assert rc == 0 and out
    if fmt == "yaml":
        assert yaml.safe_load(out)["fits"] is True
    if fmt == "markdown":
        assert out.startswith("### fitcheck plan")


def test_dataset_time_and_data_parallel(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["qwen2.5-0.5b", "--on", "2x4090", "--dataset-tokens", "100M", "--epochs", "2", "--format", "json"]
    rc, out, _ = run(args, capsys)
    doc = json.loads(out)
    assert rc == 0 and doc["target"]["gpus"] == 2
    s = doc["chosen"]["setup"]
    assert s["batch_size"] * s["grad_accum"] * 2 == 16
    tp = doc["chosen"]["throughput"]
    tokens_per_step = 16 * s["seq_len"]
    assert tp["optimizer_steps"] == -(-200_000_000 // tokens_per_step)
    assert tp["dataset_s"] == pytest.approx(tp["optimizer_steps"] * tp["step_s"], rel=1e-4)


def test_a_size_target_warns_that_speed_is_assumed(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["qwen2.5-0.5b", "--on", "24GB", "--format", "json"], capsys)
    assert rc == 0 and "speed figures assumed" in err


@pytest.mark.parametrize("model", ["gemma-3-4b", "qwen3-30b-a3b"])
def test_plan_emits_llamafactory_for_multimodal_and_moe_models(
    model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Planning for LLaMA-Factory poses its own `lora_target: all` (vision tower and routers as it leaves
    them), so the emitted file is the run that was sized, not a refusal."""
    code, _, err = run(
        [model, "--method", "qlora", "--on", "a100-80gb", "--emit", "llamafactory.yaml", "-o", str(tmp_path)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    data = yaml.safe_load((tmp_path / "llamafactory.yaml").read_text())
    assert data["lora_target"] == "all"
