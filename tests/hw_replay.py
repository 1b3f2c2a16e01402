"""Replay recorded machines (tests/data/hw/*.yaml) through a `ProbeEnv`: no hardware, no network.

A fixture records what a machine's tools printed. ``commands`` maps an exact command line to
{rc, stdout, stderr}; ``files`` maps a path to its text. ``nvidia_smi`` records the GPUs as
field -> value (what ``--query-gpu`` printed for each field); the replayer answers any field list
the way nvidia-smi does: one ``csv,noheader,nounits`` line per GPU, ``[N/A]`` for values not
recorded, and ``Field "X" is not a valid field to query.`` with exit code 2 for fields listed
under ``unsupported`` (an older driver). Anything not recorded is a missing program (rc 127) or
a missing file.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

from fitcheck.hardware.env import RC_NOT_FOUND, ProbeEnv, RunResult

DATA = Path(__file__).parent / "data" / "hw"


def fixture_names() -> list[str]:
    return sorted(p.stem for p in DATA.glob("*.yaml"))


def load_fixture(name: str) -> dict[str, Any]:
    return yaml.safe_load((DATA / f"{name}.yaml").read_text(encoding="utf-8"))


def _smi_query(smi: dict[str, Any], cmd: Sequence[str]) -> RunResult:
    if "gpus" not in smi:
        return int(smi.get("rc", 0)), smi.get("stdout", ""), smi.get("stderr", "")
    fields = next(a for a in cmd if a.startswith("--query-gpu=")).split("=", 1)[1].split(",")
    for f in fields:
        if f in smi.get("unsupported", []):
            return 2, f'Field "{f}" is not a valid field to query.\n\n', ""
    lines = list(smi.get("prefix_lines", []))
    lines += [", ".join(str(gpu.get(f, "[N/A]")) for f in fields) for gpu in smi["gpus"]]
    return int(smi.get("rc", 0)), "\n".join(lines) + "\n", ""


def make_runner(fixture: dict[str, Any], calls: list[str] | None = None):
    commands = fixture.get("commands") or {}
    smi = fixture.get("nvidia_smi")

    def run(cmd: Sequence[str]) -> RunResult:
        line = " ".join(cmd)
        if calls is not None:
            calls.append(line)
        if smi is not None and cmd[0] == "nvidia-smi" and any(a.startswith("--query-gpu=") for a in cmd):
            return _smi_query(smi, cmd)
        if line in commands:
            rec = commands[line]
            return int(rec.get("rc", 0)), rec.get("stdout", ""), rec.get("stderr", "")
        return RC_NOT_FOUND, "", f"{cmd[0]}: command not found"

    return run


def env_from_fixture(
    name: str,
    *,
    modules: dict[str, ModuleType] | None = None,
    use_torch: bool = False,
    environ: dict[str, str] | None = None,
    calls: list[str] | None = None,
) -> ProbeEnv:
    """A `ProbeEnv` that answers from the named fixture; ``modules`` fakes optional imports."""
    fx = load_fixture(name)
    files = fx.get("files") or {}
    mods = modules or {}
    return ProbeEnv(
        run=make_runner(fx, calls),
        read=lambda path: files.get(path),
        environ=environ or fx.get("environ") or {},
        system=fx.get("system", "linux"),
        machine=fx.get("machine", "x86_64"),
        import_module=lambda mod: mods.get(mod),
        use_torch=use_torch,
    )
