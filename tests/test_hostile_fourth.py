"""Hostile inputs, fourth red-team pass (session 7): one test per class of failure the third pass left, each
failing before its fix.

- a key repeated in a YAML/JSON trainer config or a config.json: the last value won without a word
  (`fitcheck.readers.base.parse_noting`, `fitcheck.fileio.loads`,
  `fitcheck.sources.resolve.read_config_noting`);
- a memory size with an exponent (``--on 1e30GB``) was looked up as a hardware id, one below 1 MiB echoed
  ``9.96515e-08GB``, ``--headroom 1e30GB`` was "not a size" and a 400-digit size was an internal error
  (`fitcheck.units.parse_memory`);
- a config.json with only ``model_type`` was sized with the transformers class defaults (Llama: 6.7B)
  (`fitcheck.sources.resolve.check_shaped`);
- accelerate ``num_processes: 0`` was dropped and ``-1`` read as one GPU (`fitcheck.readers.accelerate`);
- DeepSpeed's deprecated ``"zero_optimization": true`` was "not understood" (`fitcheck.readers.deepspeed`);
- the matrix ``assumes`` line said "2048 tokens" for a diffusion row (`fitcheck.render._matrix_samples`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.errors import InputError, ModelSourceError
from fitcheck.readers import read_config
from fitcheck.sources.resolve import resolve
from test_fuzz_cli import hold_contract, invoke

ACCELERATE = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\n"

# --- duplicate keys ---------------------------------------------------------------------------------------


def test_a_repeated_yaml_key_is_named_and_the_last_value_read(tmp_path: Path) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text(ACCELERATE + "num_processes: 2\nnum_processes: 4\n")
    read = read_config(str(path))
    assert read.values["gpus"] == 4
    assert [n for n in read.notes if "duplicate key 'num_processes'" in n], read.notes


def test_a_yaml_merge_override_is_no_duplicate(tmp_path: Path) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text(ACCELERATE + "base: &b {x: 1, y: 2}\nblock:\n  <<: *b\n  x: 3\nnum_processes: 2\n")
    assert not [n for n in read_config(str(path)).notes if "duplicate" in n]


def test_a_repeated_json_key_is_named_and_the_last_value_read(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, "stage": 3}}')
    read = read_config(str(path))
    assert read.values["strategy"] == "zero3"
    assert [n for n in read.notes if "duplicate key 'stage'" in n], read.notes
    rc, _, err = invoke(["estimate", "7B", "--on", "none", "--from", str(path)])
    assert rc == 0 and f"{path}: duplicate key 'stage'" in err, err


def test_a_repeated_config_json_key_is_a_warning(tmp_path: Path) -> None:
    cfg = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    text = json.dumps({**cfg, "intermediate_size": 128, "vocab_size": 1000})[:-1] + ', "vocab_size": 2000}'
    (tmp_path / "config.json").write_text(text)
    spec = resolve(str(tmp_path / "config.json"))
    assert [n for n in spec.notes if "duplicate key 'vocab_size'" in n], spec.notes
    assert spec.arch.vocab_size == 2000  # type: ignore[union-attr]


# --- memory sizes out of range ---------------------------------------------------------------------------

HUGE = "1" + "0" * 400 + "GB"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--on", "1e30GB"], "--on '1e30GB' has an exponent"),
        (["--on", "2x1e3GB"], "has an exponent"),
        (["--on", "0.0000001GB"], "--on '0.0000001GB' is out of range"),
        (["--on", HUGE], "is out of range"),
        (["--on", "24GB", "--headroom", "1e30GB"], "--headroom '1e30GB' has an exponent"),
        (["--on", "24GB", "--headroom", "5000TB"], "--headroom '5000TB' is out of range"),
    ],
)
def test_a_size_out_of_range_is_one_clear_line(args: list[str], words: str) -> None:
    full = ["estimate", "7B", *args]
    rc, out, err = invoke(full)
    hold_contract("estimate", full, rc, out, err)
    assert rc == 2 and words in err, err
    assert "unknown hardware" not in err and "e-08" not in err


# --- a config.json without a shape -----------------------------------------------------------------------


def test_a_config_json_with_only_model_type_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    with pytest.raises(ModelSourceError, match="no hidden_size or num_hidden_layers"):
        resolve(str(tmp_path / "config.json"))
    args = ["estimate", str(tmp_path / "config.json"), "--on", "none"]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2


# --- accelerate num_processes ----------------------------------------------------------------------------


@pytest.mark.parametrize("count", ["0", "-3"])
def test_accelerate_no_processes_is_refused(count: str, tmp_path: Path) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text(ACCELERATE + f"num_processes: {count}\n")
    with pytest.raises(InputError, match=f"num_processes must be 1 or more, or -1 \\(got {count}\\)"):
        read_config(str(path))


def test_accelerate_minus_one_processes_is_unset(tmp_path: Path) -> None:
    path = tmp_path / "acc.yaml"
    path.write_text(ACCELERATE + "num_processes: -1\n")
    read = read_config(str(path))
    assert "gpus" not in read.values
    assert [n for n in read.notes if "num_processes -1" in n], read.notes


# --- DeepSpeed's bool zero_optimization ------------------------------------------------------------------


@pytest.mark.parametrize(("flag", "strategy"), [("true", "zero1"), ("false", "ddp")])
def test_deepspeed_bool_zero_optimization_is_read_as_deepspeed_does(
    flag: str, strategy: str, tmp_path: Path
) -> None:
    path = tmp_path / "ds.json"
    path.write_text(f'{{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {flag}}}')
    read = read_config(str(path))
    assert read.values["strategy"] == strategy
    assert "zero_optimization" not in read.unused


# --- the matrix caption ----------------------------------------------------------------------------------


def _caption(out: str) -> str:
    """The matrix's caption lines (before the table), unwrapped."""
    head = out.split("┏")[0]
    return " ".join(line.strip() for line in head.splitlines())


def test_the_matrix_caption_names_a_diffusion_rows_resolution_and_regime() -> None:
    """Each row's sample, trainer regime, precision and attention come from its own setup: a diffusion
    row trains under kohya (fp32 weights, bf16 autocast), not the LLM rows' generic bf16, and its full
    column counts kohya's fp32 weights and gradients, not the seeds' 12 B/param."""
    rc, out, err = invoke(["matrix", "--on", "rtx-4090", "--models", "7B,sdxl", "--methods", "full,lora"])
    cap = _caption(out)
    assert "7B: trainer generic · bf16 · attn sdpa · batch 1 x 2048 tokens" in cap, cap
    assert "sdxl: trainer kohya · bf16 mixed · attn sdpa · batch 1 x 1024 px" in cap, cap
    assert "7B: the source documents' 12 B/param" in cap and "sdxl: kohya's fp32 weights" in cap, cap
    rc, out, err = invoke(["matrix", "--on", "rtx-4090", "--models", "3B,7B", "--methods", "full,lora"])
    cap = _caption(out)
    assert "assumes: trainer generic · bf16 · attn sdpa · batch 1 x 2048 tokens · adamw" in cap, cap
    assert "kohya" not in cap and "full: the source documents' 12 B/param" in cap, cap
    rc, out, err = invoke(
        ["matrix", "--on", "none", "--models", "sd15", "--methods", "lora", "--format", "json"]
    )
    assert rc == 0, err
    row = json.loads(out)[0]
    assert row["shape"] == "512 px" and row["regime"] == "kohya · bf16 mixed · attn sdpa", row


def test_a_repeated_key_in_the_deepspeed_json_a_config_names_is_named(tmp_path: Path) -> None:
    (tmp_path / "ds.json").write_text('{"zero_optimization": {"stage": 2, "stage": 3}}')
    path = tmp_path / "acc.yaml"
    path.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 2\n"
        f"deepspeed_config:\n  deepspeed_config_file: {tmp_path / 'ds.json'}\n"
    )
    read = read_config(str(path))
    assert read.values["strategy"] == "zero3"
    assert [n for n in read.notes if "ds.json: duplicate key 'stage'" in n], read.notes


@pytest.mark.parametrize("size", ["1e3GB", "abc", "0GB"])
@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_a_bad_host_memory_names_its_option(
    size: str, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--host-memory's error line starts with the option, as --on's and --headroom's do."""
    from fitcheck.cli import main

    assert main([command, "7B", "--on", "24GB", "--host-memory", size]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"fitcheck: error: --host-memory '{size}'")
