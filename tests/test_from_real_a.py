"""``--from`` on the trainers' own example configs: axolotl, LLaMA-Factory, the alignment-handbook's TRL
recipes and the accelerate / DeepSpeed files those repositories ship (tests/data/from, every row of
SOURCES.md from those repositories).

Each file has a golden of what it reads to (tests/golden/from_real_a/<file>.json: the reader's values, the
keys they came from, its notes and the keys it did not use, and the setup after the trainer's defaults),
or of the one line that refuses it. Every file also goes through ``fitcheck check --from FILE --on
h100-80gb``: a file that reads is answered (exit 0 or 1) with the file's values in the setup; a refused
file is exit 2 with exactly that line. Regenerate the goldens with ``FITCHECK_UPDATE_GOLDEN=1 pytest
tests/test_from_real_a.py`` after a deliberate reader change, and read the diff.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from fitcheck import api
from fitcheck.cli import main
from fitcheck.errors import FitcheckError
from fitcheck.readers import read_config
from fitcheck.readers.merge import resolve

HERE = Path(__file__).parent
DATA = HERE / "data" / "from"
GOLDEN = HERE / "golden" / "from_real_a"
#: The repositories whose example configs this test owns (SOURCES.md's repository column).
MINE = (
    "axolotl-ai-cloud/axolotl",
    "hiyouga/LLaMA-Factory",
    "huggingface/alignment-handbook",
    "huggingface/trl",
)
SETUP_FIELDS = tuple(get_type_hints(api.TrainingOptions))
#: MODEL on the command line for files whose own model is no preset (the Hub is not reached in tests):
#: a preset of the same shape (MoE experts, module names), else a Llama-shaped 8B.
STAND_IN = {"axolotl/gemma4-26b-a4b-moe-qlora.yaml": "qwen3-30b-a3b"}
#: Files that read but that the engine then refuses, with the reason (one line, exit 2): LoRA targets in a
#: vision adapter (fitcheck matches named targets in the language model only).
ENGINE_REFUSES = {"axolotl/scout-vision-qlora-fsdp2-flex.yaml": "this model has no module 'fc1'"}


def _files() -> list[str]:
    rows = (DATA / "SOURCES.md").read_text().splitlines()
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1] in MINE:
            out.append(cells[0].strip("`"))
    return out


FILES = _files()


def _shown(text: str) -> str:
    """A line with the data folder's absolute path made relative (goldens do not depend on the checkout)."""
    return text.replace(str(DATA) + "/", "")


def _reading(name: str) -> dict[str, Any]:
    """What the file reads to, as the golden stores it."""
    try:
        read = read_config(str(DATA / name))
    except FitcheckError as exc:
        return {"file": name, "error": _shown(str(exc))}
    merged = resolve({}, set(), read, SETUP_FIELDS)
    return {
        "file": name,
        "format": read.format,
        "trainer": read.trainer,
        "model": read.model,
        "values": dict(read.values),
        "keys": dict(read.keys),
        "notes": [_shown(n) for n in read.notes],
        "unused": list(read.unused),
        "setup": merged.values,
        "setup_origin": merged.origin,
        "pending": merged.pending,
    }


def _golden(name: str) -> Path:
    return GOLDEN / (name.replace("/", "__") + ".json")


def test_every_file_of_these_repositories_is_here_once() -> None:
    assert len(FILES) >= 30 and len(set(FILES)) == len(FILES)
    assert all((DATA / f).is_file() for f in FILES)
    orphans = {p.name for p in GOLDEN.glob("*.json")} - {_golden(f).name for f in FILES}
    assert not orphans, f"goldens without a SOURCES.md row: {sorted(orphans)}"


@pytest.mark.parametrize("name", FILES)
def test_file_reads_to_its_golden(name: str) -> None:
    got = _reading(name)
    path = _golden(name)
    text = json.dumps(got, indent=2, sort_keys=True) + "\n"
    if os.environ.get("FITCHECK_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no golden for {name}; FITCHECK_UPDATE_GOLDEN=1 writes it"
    assert text == path.read_text(), f"{name} reads differently; FITCHECK_UPDATE_GOLDEN=1 regenerates"


def _model(name: str, golden: dict[str, Any]) -> list[str]:
    """MODEL for the command line: none when the file's model is a preset's Hub id (no network), else a
    stand-in preset (the reader must still read the file)."""
    model = golden.get("model")
    hub = {m.hf_id for m in api.models() if m.hf_id}
    if model in hub and name not in STAND_IN:
        return []
    return [STAND_IN.get(name, "llama-3.1-8b")]


@pytest.mark.parametrize("name", FILES)
def test_check_answers_or_refuses_in_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    golden = json.loads(_golden(name).read_text())
    model = _model(name, golden)
    rc = main(["check", *model, "--from", str(DATA / name), "--on", "h100-80gb", "--format", "json"])
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err
    if "error" in golden:
        assert rc == 2 and out == ""
        assert _shown(err.strip()) == f"fitcheck: error: {golden['error']}"
        return
    if name in ENGINE_REFUSES:
        assert rc == 2 and out == "" and ENGINE_REFUSES[name] in err.splitlines()[-1]
        return
    assert rc in (0, 1), err
    doc = json.loads(out)
    for field, origin in golden["setup_origin"].items():
        if origin == "file" and field in golden["setup"]:
            assert doc["setup"][field] == golden["setup"][field], field
