"""CLI contract: outputs, exit codes, one-line errors, lazy imports."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from fitcheck.cli import main


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_table(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "estimate", "7B", "--method", "lora")
    assert rc == 0
    assert "peak allocated" in out and "rule of thumb" in out and "17.0 GiB" in out


def test_estimate_json_contract(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(
        capsys,
        "estimate",
        "7B",
        "--method",
        "qlora",
        "--seq-len",
        "4096",
        "--batch-size",
        "2",
        "--grad-ckpt",
        "--format",
        "json",
    )
    assert rc == 0
    doc = json.loads(out)
    assert doc["schema_version"] == 2
    assert doc["setup"]["method"] == "qlora" and doc["setup"]["seq_len"] == 4096
    assert [p["name"] for p in doc["phases"]] == ["load", "forward", "backward", "optimizer_step"]
    for p in doc["phases"]:
        assert sum(c["bytes"] for c in p["components"]) == p["total_bytes"]
        assert all({"name", "bytes", "rule", "source"} <= set(c) for c in p["components"])
    assert doc["peak_allocated_bytes"] == max(p["total_bytes"] for p in doc["phases"])
    assert doc["peak_reserved_bytes"] >= doc["peak_allocated_bytes"]
    assert doc["device_bytes"] == doc["peak_reserved_bytes"] + doc["context_bytes"]
    assert doc["params"]["total"] > 7e9


@pytest.mark.parametrize("fmt", ["yaml", "markdown"])
def test_other_formats(capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    rc, out, _ = run(capsys, "estimate", "1.5B", "--format", fmt)
    assert rc == 0 and "peak" in out


def test_thumb_rule(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "estimate", "7B", "--method", "full", "--rule", "thumb", "--format", "json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["thumb_bytes"] == 88 * 2**30


def test_models_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "models", "--format", "json")
    assert rc == 0
    assert isinstance(json.loads(out), list)


BAD = [
    (["estimate", "7Q"], "not a model size"),
    (["estimate", "-3B"], ""),
    (["estimate", "0B"], "too small"),
    (["estimate", "1e40"], "too large"),
    (["estimate", "7B", "--batch-size", "0"], "--batch-size"),
    (["estimate", "7B", "--seq-len", "-1"], "--seq-len"),
    (["estimate", "7B", "--lora-rank", "0"], "--lora-rank"),
    (["estimate", "llama-9.9-8b"], "unknown model"),
    (["estimate", "./does/not/exist"], "no such file"),
    (["estimate", "7B", "--resolution", "1024"], "diffusion"),
    (["estimate", "7B", "--method", "full", "--lora-rank", "8"], "not --method full"),
    (["estimate", "7B", "--lora-targets", "wq,wk"], "has no module 'wq'"),
    (["estimate", "7B", "--trainer", "nemo"], "--trainer"),
    (["estimate", "7B", "--format", "xml"], "--format"),
    (["estimate", "7B", "--method", "dpo"], "--method"),
]


@pytest.mark.parametrize(("args", "needle"), BAD)
def test_bad_input_one_line_exit_2(capsys: pytest.CaptureFixture[str], args: list[str], needle: str) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2
    assert out == ""
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert needle in err


def test_bad_config_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    rc, _, err = run(capsys, "estimate", str(bad))
    assert rc == 2 and "not valid JSON" in err
    # a remote-code family has no class defaults to fill in what the file leaves out
    bad.write_text(json.dumps({"model_type": "chatglm", "num_layers": 2}))
    rc, _, err = run(capsys, "estimate", str(bad))
    assert rc == 2 and "lacks" in err
    bad.write_text(json.dumps({"model_type": "no_such_family"}))
    rc, _, err = run(capsys, "estimate", str(bad))
    assert rc == 2 and "not read natively" in err and "llama" in err


def test_bad_safetensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 64,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "intermediate_size": 128,
                "vocab_size": 100,
            }
        )
    )
    f = tmp_path / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 10**9) + b"{}")
    rc, _, err = run(capsys, "estimate", str(f))
    assert rc == 2 and "header length" in err
    f.write_bytes(struct.pack("<Q", 5) + b"nope!")
    rc, _, err = run(capsys, "estimate", str(f))
    assert rc == 2 and "not JSON" in err


def test_debug_shows_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fitcheck", "estimate", "7Q", "--debug"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0 and "Traceback" in proc.stderr


def test_cli_import_is_light() -> None:
    code = (
        "import sys, fitcheck.cli; heavy = {'torch','transformers','numpy','rich','yaml','pydantic',"
        "'matplotlib','huggingface_hub'}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]"


def test_estimate_imports_no_torch_or_numpy() -> None:
    code = (
        "import sys; from fitcheck.cli import main; main(['estimate','7B','--format','json']); "
        "heavy = {'torch','transformers','numpy','matplotlib','huggingface_hub'}; "
        "sys.stderr.write(repr(sorted({m.split('.')[0] for m in sys.modules} & heavy)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stderr.strip().endswith("[]")


def test_no_direct_click_import() -> None:
    # typer >= 0.25 vendors click and no longer installs it: a bare `pip install -e .` has no click,
    # while the test extras pull it in through other packages, so only this check catches a regression.
    src = Path(__file__).parents[1] / "src" / "fitcheck"
    offenders = [
        str(p.relative_to(src))
        for p in src.rglob("*.py")
        if any(
            line.strip().startswith(("import click", "from click"))
            for line in p.read_text(encoding="utf-8").splitlines()
        )
    ]
    assert offenders == []
