"""Fuzzing the real CLI in-process: the exit-code and output contract holds for any input.

Hypothesis builds command lines from the app's own option vocabulary (the options typer registers on
each command, so a new option is fuzzed the day it is added), with valid values, hostile ones
(negative, zero, huge, non-finite, unicode, overlong) and crafted files, runs ``fitcheck.cli.main``
and holds the contract of docs/cli.md:

- never an internal error; exit codes 0, 1 or 2 only;
- exit 1 only where the answer is "does not fit" (``check``) or "nothing fits" (``plan``), or, with
  ``--strict``, "tight" (both);
- exit 2: exactly one ``fitcheck: error:`` line on stderr, and nothing on stdout;
- exits 0 and 1 with ``--format json``: one strict JSON document (no NaN/Infinity) whose arithmetic
  is the one docs/json.md states.
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import pytest
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fitcheck.cli import app, main
from fitcheck.terminal import is_unsafe

#: Commands fuzzed (measure needs torch and seconds per call; its options are the shared ones).
COMMANDS = ("estimate", "check", "plan", "matrix", "hw", "models")

#: Values per option name: sensible ones and hostile ones; anything else gets generic hostile text.
HOSTILE_NUM = [
    "0",
    "-1",
    "-0",
    "1e400",
    "nan",
    "inf",
    "-inf",
    "99999999999999999999999",
    "abc",
    "",
    " 3",
    "٣",
]
VALUES: dict[str, list[str]] = {
    "--method": ["full", "lora", "qlora", "auto", "LoRA", "x"],
    "--batch-size": ["1", "2", "8", "1024", *HOSTILE_NUM],
    "--grad-accum": ["1", "4", *HOSTILE_NUM],
    "--seq-len": ["128", "2048", "32768", "10000000", *HOSTILE_NUM],
    "--resolution": ["512", "1024", "63", "100000", *HOSTILE_NUM],
    "--min-resolution": ["256", "-64", "4096", *HOSTILE_NUM],
    "--min-seq-len": ["512", "4096", *HOSTILE_NUM],
    "--precision": ["bf16", "fp16", "fp32", "int4"],
    "--optimizer": ["adamw", "adamw8bit", "adafactor", "lion", "sgd", "adam"],
    "--attn": ["eager", "sdpa", "flash", "xformers", "nope"],
    "--lora-rank": ["1", "16", "256", "100000", *HOSTILE_NUM],
    "--lora-alpha": ["16", "0.5", *HOSTILE_NUM],
    "--lora-dropout": ["0", "0.1", "1", "1.5", *HOSTILE_NUM],
    "--lora-targets": [
        "attn",
        "all-linear",
        "q_proj,v_proj",
        "lm_head",
        "conv",
        "",
        "ü",
        "a" * 500,
        "q\x1b[1m",
    ],
    "--trainer": ["generic", "hf", "torchtune", "axolotl", "llamafactory", "mlx", "kohya", "x"],
    "--gpus": ["1", "2", "8", *HOSTILE_NUM],
    "--on": [
        "rtx-4090",
        "24GB",
        "36GB-unified",
        "2x4090",
        "none",
        "cpu",
        "a100-80gb",
        "apple-m3-max-36gb",
        "0GB",
        "-24GB",
        "nanGB",
        "1e400GB",
        "bogus",
        "",
        "2x",
        "0x4090",
        "rtx-4090\x00",
        "rtx-4090\x1b[31m",
        "24G\udce9",
    ],
    "--headroom": ["2GB", "10%", "0", "abc", "-1GB", "200%", "nan%", "infGB", ""],
    "--format": ["table", "json", "yaml", "markdown", "xml"],
    "--rule": ["detailed", "thumb", "x"],
    "--effective-batch": ["1", "16", *HOSTILE_NUM],
    "--dataset-tokens": ["1000000", "1M", "2B", *HOSTILE_NUM],
    "--epochs": ["1", "0.5", *HOSTILE_NUM],
    "--models": ["7B", "0.5B,7B", "llama-3.1-8b,sdxl", "", ",", "nope"],
    "--methods": ["full,lora,qlora", "lora", "", "x"],
    "--emit-format": ["hf.yaml", "axolotl.yaml", "x"],
}
MODELS = [
    "7B",
    "1.5B",
    "350M",
    "llama-3.1-8b",
    "qwen2.5-7b",
    "gemma-2-9b",
    "mixtral-8x7b",
    "sd15",
    "sdxl",
    "0B",
    "-7B",
    "7Q",
    "nan",
    "1e400B",
    "",
    "ｍｏｄｅｌ",
    "a" * 300,
    "x" * 5000,
    "../../etc/passwd",
    "\x1b[2Jm",
    "org/na\nme",
    "lat\udce9n",
    "r\u202el",
]
#: Options that would write files or take long; fuzzed by the scripted suite instead.
SKIP = {"--emit", "--output-dir", "--force", "--chart", "--timeline", "--torch", "--help"}


def _vocabulary() -> dict[str, list[tuple[list[str], bool]]]:
    """command -> [(option names, is a flag)] as the app registers them."""
    group = typer.main.get_command(app)
    out: dict[str, list[tuple[list[str], bool]]] = {}
    for name in COMMANDS:
        cmd = group.commands[name]  # type: ignore[attr-defined]
        out[name] = [
            ([*p.opts, *getattr(p, "secondary_opts", [])], bool(getattr(p, "is_flag", False)))
            for p in cmd.params
            if p.param_type_name == "option" and not set(p.opts) & SKIP
        ]
    return out


VOCAB = _vocabulary()


@pytest.fixture(scope="module")
def crafted(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Hostile model files: zero and non-finite sizes, wrong types, deep nesting, not a file at all."""
    root = tmp_path_factory.mktemp("crafted")
    base = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    variants: dict[str, str] = {
        "ok": json.dumps(base),
        "zero": json.dumps({**base, "hidden_size": 0}),
        "inf": json.dumps(base).replace('"hidden_size": 256', '"hidden_size": Infinity'),
        "list": json.dumps({**base, "model_type": ["llama"]}),
        "float": json.dumps({**base, "num_hidden_layers": 2.5}),
        "huge": json.dumps({**base, "hidden_size": 10**30}),
        "neg": json.dumps({**base, "vocab_size": -5}),
        "deep": "[" * 100_000 + "]" * 100_000,
        "mamba": json.dumps({"model_type": "mamba", "hidden_size": 256}),
        "nottype": json.dumps({"hidden_size": 256}),
        "garbage": "\x00\xff not json",
    }
    paths = []
    for name, text in variants.items():
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(text, encoding="utf-8", errors="surrogateescape")
        paths.append(str(d / "config.json"))
    (root / "dir" / "config.json").mkdir(parents=True)
    paths.append(str(root / "dir"))
    fifo = root / "fifo" / "config.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    paths.append(str(fifo))
    return paths


def invoke(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


def _strict_json(text: str) -> Any:
    def refuse(name: str) -> Any:
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def check_estimate_doc(doc: dict[str, Any]) -> None:
    """The arithmetic docs/json.md states for an estimate document."""
    for phase in doc["phases"]:
        assert sum(c["bytes"] for c in phase["components"]) == phase["total_bytes"]
    assert doc["peak_allocated_bytes"] == max(p["total_bytes"] for p in doc["phases"])
    assert doc["peak_reserved_bytes"] == doc["peak_allocated_bytes"] + doc["allocator_reserve_bytes"]
    assert doc["device_bytes"] == doc["peak_reserved_bytes"] + doc["context_bytes"]


def hold_contract(command: str, args: list[str], rc: int, out: str, err: str) -> None:
    assert "internal error" not in err, (args, err)
    assert "Traceback" not in err, (args, err)
    # names are shown inert: no control, reordering or lone-surrogate character reaches the terminal
    assert not [c for c in out.replace("\n", "") + err.replace("\n", "") if is_unsafe(c)], (args, err[-300:])
    assert rc in (0, 1, 2), (args, rc)
    if rc == 2:
        lines = [line for line in err.splitlines() if line.startswith("fitcheck: error:")]
        assert len(lines) == 1, (args, err)
        assert out == "", (args, out[:200])
        return
    if rc == 1:
        assert command in ("check", "plan"), (args, err)
    if "json" in args and out.strip():
        doc = _strict_json(out)
        if command in ("estimate", "check") and isinstance(doc, dict) and "phases" in doc:
            check_estimate_doc(doc)
            if command == "check":
                verdict = doc["target"]["verdict"]
                host_short = doc["target"].get("host_verdict") == "does_not_fit"  # as plan judges a node
                assert (rc == 1) == (
                    verdict == "does_not_fit" or host_short or ("--strict" in args and verdict == "tight")
                )
        if command == "plan" and isinstance(doc, dict) and "verdict" in doc:
            verdict = doc["verdict"]
            assert doc["fits"] == (verdict == "fits")
            assert (doc["chosen"] is None) == (verdict == "does_not_fit")
            assert (rc == 1) == (verdict == "does_not_fit" or ("--strict" in args and verdict == "tight"))


@st.composite
def command_lines(draw: st.DrawFn, crafted: list[str]) -> tuple[str, list[str]]:
    command = draw(st.sampled_from(COMMANDS))
    args = [command]
    if command in ("estimate", "check", "plan"):
        args.append(draw(st.sampled_from(MODELS + crafted) | st.text(max_size=20)))
    options = draw(st.lists(st.sampled_from(VOCAB[command]), max_size=4, unique_by=lambda o: o[0][0]))
    for names, is_flag in options:
        name = draw(st.sampled_from(names))
        if is_flag:
            args.append(name)
            continue
        pool = VALUES.get(name.split("=")[0], HOSTILE_NUM)
        value = draw(st.sampled_from(pool) | st.text(max_size=12) | st.integers(-(10**20), 10**20).map(str))
        args += [name, value]
    if command == "check" and "--on" not in args:
        args += ["--on", draw(st.sampled_from(VALUES["--on"]))]
    if command == "matrix" and "--on" not in args:
        args += ["--on", draw(st.sampled_from(["rtx-4090", "none", "24GB"]))]
    if command == "plan" and "--on" not in args:
        args += ["--on", "rtx-4090"]  # plan --on auto would size this machine: slow on a big RAM box
    if draw(st.booleans()):
        args += ["--format", "json"]
    return command, args


def test_fuzz_the_cli_contract(crafted: list[str]) -> None:
    @settings(
        max_examples=int(os.environ.get("FITCHECK_FUZZ_EXAMPLES", "120")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=os.environ.get("CI") is not None,
    )
    @given(command_lines(crafted))
    def run(case: tuple[str, list[str]]) -> None:
        command, args = case
        rc, out, err = invoke(args)
        hold_contract(command, args, rc, out, err)

    run()


def test_vocabulary_is_read_from_the_app() -> None:
    assert any("--seq-len" in names for names, _ in VOCAB["estimate"])
    assert any("--effective-batch" in names for names, _ in VOCAB["plan"])
    assert any("--strict" in names for names, _ in VOCAB["check"])  # check's and plan's (cli.StrictO)
    assert any("--strict" in names for names, _ in VOCAB["plan"])
