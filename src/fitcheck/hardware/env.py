"""The machine as the probes see it: commands, files, environment variables, optional modules.

Probes never call ``subprocess``, ``open`` or ``importlib`` themselves; they go through a
`ProbeEnv`. Tests build one from recorded tool output (``tests/data/hw/``) and replay real
captures without the hardware; `ProbeEnv.real` is the live machine.
"""

from __future__ import annotations

import importlib
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from fitcheck.units import MIB

#: (return code, stdout, stderr) of one command.
RunResult = tuple[int, str, str]
Runner = Callable[[Sequence[str]], RunResult]
FileReader = Callable[[str], "str | None"]
Importer = Callable[[str], "ModuleType | None"]

#: nvidia-smi can hang for many seconds on a wedged driver; ollama gives its probe 15 s.
COMMAND_TIMEOUT_S = 15.0
#: exit status reported for a command that is not installed (what a shell returns).
RC_NOT_FOUND = 127
#: exit status reported for a command that ran past the timeout (what coreutils timeout returns).
RC_TIMEOUT = 124
#: files read by probes are small (/proc/meminfo, cgroup files); cap reads defensively.
MAX_READ_BYTES = MIB


def run_command(cmd: Sequence[str], timeout_s: float = COMMAND_TIMEOUT_S) -> RunResult:
    """Run a command without a shell and with a timeout; never raises for a missing binary.

    A missing program is reported as rc 127 and a timeout as rc 124, so callers handle every
    outcome as data ("no NVIDIA GPU") instead of catching exceptions.
    """
    try:
        done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, check=False)
    except FileNotFoundError:
        return RC_NOT_FOUND, "", f"{cmd[0]}: command not found"
    except subprocess.TimeoutExpired:
        return RC_TIMEOUT, "", f"{cmd[0]}: no answer after {timeout_s:.0f} s"
    except OSError as exc:
        return RC_NOT_FOUND, "", f"{cmd[0]}: {exc}"
    return done.returncode, done.stdout or "", done.stderr or ""


def read_text(path: str) -> str | None:
    """Read a small text file; ``None`` when it is missing or unreadable."""
    try:
        with Path(path).open("r", encoding="utf-8", errors="replace") as fh:
            return fh.read(MAX_READ_BYTES)
    except OSError:
        return None


def import_optional(name: str) -> ModuleType | None:
    """Import a module if it is installed; ``None`` otherwise (never raises ImportError)."""
    try:
        return importlib.import_module(name)
    except Exception:  # a broken optional package must not break detection
        return None


def _no_import(name: str) -> ModuleType | None:
    return None


@dataclass(frozen=True)
class ProbeEnv:
    """Everything a probe may touch. All fields are injectable; the defaults describe no machine.

    Attributes:
        run: runs a command, returns (rc, stdout, stderr); rc 127 for a missing program.
        read: reads a text file, ``None`` when absent.
        environ: environment variables (``CUDA_VISIBLE_DEVICES``, ...).
        system: ``sys.platform`` of the machine (``linux``, ``darwin``, ``win32``).
        machine: ``platform.machine()`` of this Python (``x86_64`` under Rosetta on a Mac).
        import_module: imports an optional module (nvidia-ml-py, psutil, torch) or returns None.
        use_torch: allow in-process torch probes; off by default because torch.cuda creates a
            CUDA context (hundreds of MiB) in this process.
    """

    run: Runner = field(default=lambda cmd: (RC_NOT_FOUND, "", f"{cmd[0]}: command not found"))
    read: FileReader = field(default=lambda path: None)
    environ: Mapping[str, str] = field(default_factory=dict)
    system: str = "linux"
    machine: str = "x86_64"
    import_module: Importer = field(default=_no_import)
    use_torch: bool = False

    @classmethod
    def real(cls, use_torch: bool = False) -> ProbeEnv:
        """The live machine."""
        return cls(
            run=run_command,
            read=read_text,
            environ=dict(os.environ),
            system=sys.platform,
            machine=platform.machine(),
            import_module=import_optional,
            use_torch=use_torch,
        )

    def module(self, name: str) -> ModuleType | None:
        """An optional module; torch only when `use_torch` allows it."""
        if name.split(".")[0] == "torch" and not self.use_torch:
            return None
        return self.import_module(name)
