"""Trust at the edges: bounded reads, regular files only, honest exit codes whatever stdout does."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fitcheck.emitters.writer import WriteError, check_destinations, write_atomic
from fitcheck.errors import ModelSourceError
from fitcheck.fileio import MAX_JSON_DEPTH, deeper_than, loads, read_bytes, read_json

FITCHECK = [sys.executable, "-m", "fitcheck"]


# --- reading -----------------------------------------------------------------------------------


def test_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    with pytest.raises(ModelSourceError, match="is a FIFO"):
        read_bytes(fifo, 1000, "model config")


def test_safetensors_header_shares_the_regular_file_check(tmp_path: Path) -> None:
    """read_header opens through fileio.open_regular: a FIFO or /dev/zero is refused, never read."""
    from fitcheck.sources.safetensors_header import read_header

    fifo = tmp_path / "model.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(ModelSourceError, match="is a FIFO, not a safetensors file"):
        read_header(fifo)
    link = tmp_path / "zero.safetensors"
    link.symlink_to("/dev/zero")
    with pytest.raises(ModelSourceError, match="character device, not a safetensors file"):
        read_header(link)
    with pytest.raises(ModelSourceError, match="no such file"):
        read_header(tmp_path / "absent.safetensors")


def test_link_to_dev_zero_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    with pytest.raises(ModelSourceError, match="character device"):
        read_bytes(link, 1000, "model config")


def test_folder_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelSourceError, match="folder"):
        read_bytes(tmp_path, 1000)


def test_size_is_bounded_while_reading(tmp_path: Path) -> None:
    f = tmp_path / "big.json"
    f.write_bytes(b" " * 2001)
    with pytest.raises(ModelSourceError, match="over 2,000 bytes"):
        read_bytes(f, 2000)
    assert read_bytes(f, 2001) == b" " * 2001


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', "[-Infinity]"])
def test_json_without_non_finite_numbers(text: str) -> None:
    with pytest.raises(ModelSourceError, match="not a number JSON allows"):
        loads(text, "config.json")


def test_json_depth_is_bounded_before_parsing() -> None:
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ModelSourceError, match=f"deeper than {MAX_JSON_DEPTH}"):
        loads(deep, "config.json")
    assert deeper_than('{"a": "[[[[", "b": [1, {"c": 2}]}', 2) is None  # a bracket in a string
    assert deeper_than('{"a": "x", "b": [1, {"c": 2}]}', 2) is True
    assert deeper_than("[" * 100_000 + "]" * 100_000, MAX_JSON_DEPTH) is True  # told before parsing
    assert deeper_than('{"a": "x", "b": [1, {"c": 2}]}', 3) is False


def test_huge_integers_are_one_clear_line(tmp_path: Path) -> None:
    f = tmp_path / "c.json"
    f.write_text('{"hidden_size": ' + "9" * 5000 + "}")
    with pytest.raises(ModelSourceError, match=r"c\.json"):
        read_json(f, 1 << 20)


# --- writing -----------------------------------------------------------------------------------


def test_force_never_replaces_a_device_or_a_link_to_one(tmp_path: Path) -> None:
    link = tmp_path / "hf.yaml"
    link.symlink_to("/dev/null")
    with pytest.raises(WriteError, match="character device; fitcheck writes regular files only"):
        check_destinations([link], force=True)
    with pytest.raises(WriteError, match="regular files only"):
        write_atomic(link, "x", force=True)
    assert link.is_symlink()
    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    with pytest.raises(WriteError, match="FIFO"):
        check_destinations([fifo], force=True)


def test_dangling_link_and_long_names(tmp_path: Path) -> None:
    dangling = tmp_path / "d.yaml"
    dangling.symlink_to(tmp_path / "nowhere" / "x")
    with pytest.raises(WriteError, match="dangling"):
        check_destinations([dangling], force=True)
    long = tmp_path / ("x" * 5000 + ".yaml")
    with pytest.raises(WriteError, match="cannot write"):
        check_destinations([long], force=False)
    with pytest.raises(WriteError, match="cannot write"):
        write_atomic(tmp_path / ("y" * 300 + ".yaml"), "x", force=False)


def test_force_replaces_a_regular_file(tmp_path: Path) -> None:
    f = tmp_path / "a.yaml"
    f.write_text("old")
    write_atomic(f, "new", force=True)
    assert f.read_text() == "new"
    write_atomic(tmp_path / "b.png", b"\x89PNG", force=False)
    assert (tmp_path / "b.png").read_bytes() == b"\x89PNG"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_signal_while_writing_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    def killed(_fd: int) -> None:
        os.kill(os.getpid(), sig)

    monkeypatch.setattr(os, "fsync", killed)
    before = signal.getsignal(sig)
    with pytest.raises(SystemExit) as info:
        write_atomic(tmp_path / "a.yaml", "text", force=False)
    assert info.value.code == 128 + sig
    assert list(tmp_path.iterdir()) == []
    assert signal.getsignal(sig) == before  # the handler the process had is back


# --- exit codes --------------------------------------------------------------------------------


def test_debug_keeps_the_exit_code() -> None:
    proc = subprocess.run(
        [*FITCHECK, "estimate", "7Q", "--debug"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2
    assert "Traceback" in proc.stderr and "fitcheck: error:" in proc.stderr


def _early_reader(args: list[str]) -> subprocess.CompletedProcess[str]:
    """Run with a stdout pipe whose reader has gone before anything is written."""
    r, w = os.pipe()
    os.close(r)
    try:
        proc = subprocess.run(args, stdout=w, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(w)
    return proc


def test_reader_leaving_early_keeps_does_not_fit() -> None:
    proc = _early_reader([*FITCHECK, "check", "70B", "--method", "full", "--on", "rtx-3060-12gb"])
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == ""


def test_reader_leaving_early_keeps_success() -> None:
    proc = _early_reader([*FITCHECK, "models"])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_device_is_trouble() -> None:
    with open("/dev/full", "w") as full:
        proc = subprocess.run(
            [*FITCHECK, "estimate", "7B", "--on", "rtx-4090", "--format", "json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert (
        len(lines) == 1 and "No space left on device" in lines[0] and lines[0].startswith("fitcheck: error:")
    )


def test_closed_stdout_is_trouble() -> None:
    proc = subprocess.run(
        [*FITCHECK, "estimate", "7B", "--on", "rtx-4090"],
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        preexec_fn=lambda: os.close(1),
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("fitcheck: error:") and "stdout" in proc.stderr


def test_json_is_still_one_document(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*FITCHECK, "estimate", "7B", "--on", "rtx-4090", "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["model"]


def test_plan_writes_its_files_even_when_the_reader_leaves_early(tmp_path: Path) -> None:
    proc = _early_reader(
        [*FITCHECK, "plan", "llama-3.2-1b", "--on", "rtx-4090", "--method", "lora", "--emit", "hf.yaml",
         "--emit", "env.sh", "-o", str(tmp_path)]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "hf.yaml").is_file() and (tmp_path / "env.sh").is_file()


def test_plan_refuses_before_writing_or_printing(tmp_path: Path) -> None:
    (tmp_path / "hf.yaml").write_text("mine")
    proc = subprocess.run(
        [*FITCHECK, "plan", "llama-3.2-1b", "--on", "rtx-4090", "--method", "lora", "--emit", "env.sh",
         "--emit", "hf.yaml", "-o", str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2 and proc.stdout == "" and "exists; add --force" in proc.stderr
    assert not (tmp_path / "env.sh").exists() and (tmp_path / "hf.yaml").read_text() == "mine"


def test_a_config_in_the_working_folder_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`fitcheck estimate config.json` (or `.`) from inside the model's folder names the folder, never ''."""
    from fitcheck.sources.resolve import spec_from_path

    src = Path(__file__).parent / "data" / "arch" / "openai" / "gpt-oss-20b" / "config.json"
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_bytes(src.read_bytes())
    monkeypatch.chdir(folder)
    for ref in ("config.json", ".", "./"):
        assert spec_from_path(Path(ref)).name == "my-model", ref


def test_config_json_reads_python_infinity_inside_lists(tmp_path: Path) -> None:
    """transformers writes config.json with Python's json.dumps (``[0.0, Infinity]``, a Mamba-2 mixer's
    time_step_limit) and reads it back with json.loads: such a file reaches the model's own verdict."""
    from fitcheck.sources.resolve import read_config

    llama = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
             "num_attention_heads": 4, "vocab_size": 1000}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**llama, "time_step_limit": [0.0, float("inf")]}))
    assert "Infinity" in path.read_text()
    assert read_config(path)["time_step_limit"] == [0.0, float("inf")]
    for setting, where in (("rope_theta", "rope_theta"), ("text_config", "text_config.hidden_size")):
        value: object = float("inf") if setting == "rope_theta" else {"hidden_size": float("nan")}
        path.write_text(json.dumps({**llama, setting: value}))
        with pytest.raises(ModelSourceError, match=f"{re.escape(where)} is not a finite number"):
            read_config(path)


def test_hybrid_config_with_infinity_gets_the_hybrid_verdict(tmp_path: Path) -> None:
    """Granite 4.0-H's shape (transformers' granitemoehybrid defaults, written as transformers writes
    them: ``Infinity`` in time_step_limit) is refused as a Mamba-2 hybrid, not as bad JSON."""
    tf = pytest.importorskip("transformers")
    pytest.importorskip("torch")

    cfg = {**tf.AutoConfig.for_model("granitemoehybrid").to_dict(), "model_type": "granitemoehybrid"}
    text = json.dumps(cfg)
    assert "Infinity" in text
    (tmp_path / "config.json").write_text(text)
    proc = subprocess.run(
        [sys.executable, "-m", "fitcheck", "estimate", str(tmp_path), "--method", "lora"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Mamba-2 layers" in proc.stderr and "JSON" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
