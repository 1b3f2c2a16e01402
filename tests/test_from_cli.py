"""``--from`` on the command line: setup and setup_origin in the JSON, precedence, stderr reports,
exit codes of ``check``, ``plan`` from a file, and ``--trainer`` defaults without a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli import main
from fitcheck.models import LlmSetup

DATA = Path(__file__).parent / "data" / "from"
AXOLOTL = str(DATA / "axolotl" / "qlora.yml")
ORIGINS = {"file", "trainer default", "fitcheck default", "command line"}


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(args)
    out, err = capsys.readouterr()
    return rc, out, err


def doc(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, Any], str]:
    rc, out, err = run([*args, "--format", "json"], capsys)
    assert rc == 0, err
    return json.loads(out), err


def test_setup_and_setup_origin_show_what_was_read_and_from_where(capsys: pytest.CaptureFixture[str]) -> None:
    d, err = doc(
        ["estimate", "llama-3.1-8b", "--from", AXOLOTL, "--on", "rtx-4090", "--batch-size", "1"], capsys
    )
    s, o = d["setup"], d["setup_origin"]
    assert list(d)[list(d).index("setup") + 1] == "setup_origin"  # beside setup, which stays plain values
    assert set(o) == set(s) - {"kind"} and set(o.values()) <= ORIGINS  # kind: the model decides it
    assert (s["method"], s["seq_len"], s["lora_rank"], s["grad_accum"]) == ("qlora", 4096, 32, 4)
    assert (s["attn"], s["grad_ckpt"], s["trainer"]) == ("flash", True, "axolotl")
    assert {o[k] for k in ("method", "seq_len", "lora_rank", "grad_accum", "attn", "trainer")} == {"file"}
    assert s["batch_size"] == 1 and o["batch_size"] == "command line"  # the flag beats the file's 2
    assert o["backend"] == "command line" and o["dora"] == "fitcheck default"
    lines = err.splitlines()
    assert any("overrides the file's base model NousResearch/Meta-Llama-3-8B" in x for x in lines)
    unused = [x for x in lines if "not used" in x]
    assert len(unused) == 1 and "learning_rate" in unused[0] and "datasets" in unused[0]


def test_model_comes_from_the_file_when_not_given(capsys: pytest.CaptureFixture[str]) -> None:
    tt = str(DATA / "torchtune" / "1B_qlora_single_device.yaml")
    d, err = doc(["estimate", "--from", tt, "--on", "rtx-4090", "--seq-len", "1024"], capsys)
    assert d["model"] == "llama-3.2-1b" and "overrides" not in err
    assert d["setup"]["seq_len"] == 1024 and d["setup_origin"]["seq_len"] == "command line"
    assert d["setup"]["method"] == "qlora" and d["setup"]["trainer"] == "torchtune"


def test_diffusion_preset_from_a_kohya_ss_preset(capsys: pytest.CaptureFixture[str]) -> None:
    js = str(DATA / "kohya_ss" / "sdxl-lora-ai_now-adamw-v1.0.json")
    d, err = doc(["estimate", "--from", js, "--on", "rtx-4090"], capsys)
    assert d["model"] == "sdxl" and d["setup"]["resolution"] == 1024 and d["setup"]["batch_size"] == 4
    assert d["setup"]["attn"] == "xformers" and d["setup_origin"]["attn"] == "file"
    assert "sized as sdxl" in err


def test_values_fitcheck_cannot_model_yet_are_reported(capsys: pytest.CaptureFixture[str]) -> None:
    ds = str(DATA / "deepspeed" / "zero3_bf16_cpuoffload_all.json")
    d, err = doc(["estimate", "llama-3.1-8b", "--from", ds, "--on", "h100-80gb"], capsys)
    if "strategy" in LlmSetup.model_fields:  # once the multi-GPU setup fields exist
        assert d["setup"]["strategy"] == "zero3" and d["setup_origin"]["strategy"] == "file"
    else:
        assert "read, not yet modelled: strategy=zero3, offload=all" in err
    assert d["setup"]["precision"] == "bf16" and d["setup_origin"]["precision"] == "file"


def test_check_from_file_exit_codes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, _ = run(["check", "llama-3.1-8b", "--from", AXOLOTL, "--on", "a100-80gb"], capsys)
    assert rc == 0
    rc, _, _ = run(["check", "llama-3.1-8b", "--from", AXOLOTL, "--on", "rtx-4090"], capsys)
    assert rc == 1  # micro-batch 2 x 4096 tokens needs about 25 GiB
    rc, _, _ = run(["check", "llama-3.1-8b", "--from", AXOLOTL, "--on", "rtx-4090", "-b", "1"], capsys)
    assert rc == 0  # the command line overrides the file (about 16.5 GiB)
    bad = tmp_path / "bad.yaml"
    bad.write_text("base_model: [oops\n")
    rc, out, err = run(["check", "llama-3.1-8b", "--from", str(bad), "--on", "rtx-4090"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("fitcheck: error: --from")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["estimate", "--on", "none"], "give MODEL"),
        (["estimate", "7B", "--from-format", "axolotl"], "--from-format needs --from"),
        (["estimate", "--from", str(DATA / "accelerate" / "fsdp.yaml")], "names no base model"),
        (["estimate", "7B", "--from", AXOLOTL, "--from-format", "nemo"], "unknown --from-format"),
        (["estimate", "7B", "--from", "/no/such.yaml"], "no such file"),
        (["check", "7B", "--from", AXOLOTL, "--on", "none"], "name the training GPU"),
    ],
)
def test_trouble_is_exit_2_with_one_line(
    args: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, _, err = run(args, capsys)
    assert rc == 2
    errors = [x for x in err.splitlines() if x.startswith("fitcheck: error:")]
    assert len(errors) == 1 and says in errors[0]


def test_trainer_defaults_without_a_file(capsys: pytest.CaptureFixture[str]) -> None:
    d, err = doc(["estimate", "llama-3.1-8b", "--on", "none", "--trainer", "llamafactory"], capsys)
    assert d["setup"]["grad_ckpt"] is True and d["setup_origin"]["grad_ckpt"] == "trainer default"
    assert d["setup_origin"]["trainer"] == "command line" and "llamafactory defaults" in err
    d, _ = doc(
        ["estimate", "llama-3.1-8b", "--on", "none", "--trainer", "llamafactory", "--no-grad-ckpt"], capsys
    )
    assert d["setup"]["grad_ckpt"] is False and d["setup_origin"]["grad_ckpt"] == "command line"
    plain, err = doc(["estimate", "llama-3.1-8b", "--on", "none"], capsys)
    assert "setup_origin" not in plain and err == ""  # the JSON is unchanged without --from/--trainer


def test_plan_from_file_keeps_its_method_and_shape(capsys: pytest.CaptureFixture[str]) -> None:
    d, _ = doc(["plan", "llama-3.1-8b", "--from", AXOLOTL, "--on", "rtx-4090"], capsys)
    s = d["chosen"]["setup"]
    assert (s["method"], s["seq_len"], s["lora_rank"], s["lora_alpha"], s["trainer"]) == (
        "qlora",
        4096,
        32,
        16.0,
        "axolotl",
    )
    assert d["chosen"]["effective_batch"] == 8  # micro-batch 2 x accumulation 4


def test_plan_from_file_multiplies_the_batch_over_every_rank(capsys: pytest.CaptureFixture[str]) -> None:
    """The file's batch is per process: the effective batch counts every GPU of every node."""
    args = ["plan", "llama-3.1-8b", "--from", AXOLOTL, "--on", "2xh100-80gb", "--gpus", "2", "--nodes", "3"]
    d, _ = doc(args, capsys)
    assert d["chosen"]["effective_batch"] == 8 * 2 * 3
    d, _ = doc(["plan", "llama-3.1-8b", "--from", AXOLOTL, "--on", "2xh100-80gb"], capsys)
    assert d["chosen"]["effective_batch"] == 8 * 2  # the target's two GPUs, not given as --gpus


def test_table_output_reports_the_file_on_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = run(["estimate", "llama-3.1-8b", "--from", AXOLOTL, "--on", "rtx-4090"], capsys)
    assert rc == 0 and "from " in err and "(axolotl): method=qlora" in err and "fitcheck:" not in out


def test_a_refused_value_from_the_file_names_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    kohya = str(DATA / "kohya" / "sdxl_inpainting_test_lora.toml")
    rc, out, err = run(["estimate", "llama-3.1-8b", "--from", kohya, "--on", "none"], capsys)
    assert rc == 2 and out == "" and err.count("\n") == 1
    assert "--resolution applies to diffusion models" in err and f"comes from {kohya}" in err
    rc, _, err = run(["estimate", "sd15", "--seq-len", "512", "--on", "none"], capsys)
    assert rc == 2 and "comes from" not in err  # a typed flag is the user's own
