"""Fuzzing the ``--from`` readers: every known key of every trainer format, with hostile values.

Starting from the real trainer configs in tests/data/from/ (one or more per format), hypothesis sets keys
the reader modules name (any string literal in the module that looks like a key: a superset of what each
reader consults) to values of any type (null, bool, huge and negative integers, NaN/inf floats, text with
control characters, lists, nested mappings), at the top level or inside any table/section the file has,
writes the file in its own syntax (YAML, JSON, TOML; for kohya also a fuzzed dataset TOML it names) and
runs the CLI in-process. The contract of tests/test_fuzz_cli.py holds: exit 0/1 with an answer, or exit 2
with exactly one ``fitcheck: error:`` line; never a traceback or an internal error.

``FITCHECK_FUZZ_EXAMPLES`` sets the number of examples (default 150).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
import tomli_w
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from fitcheck.readers.base import parse
from test_fuzz_cli import hold_contract, invoke

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "tests" / "data" / "from"
READERS = ROOT / "src" / "fitcheck" / "readers"
#: format folder -> (reader modules whose key names are fuzzed, the model given on the command line)
FORMATS: dict[str, tuple[tuple[str, ...], str]] = {
    "axolotl": (("axolotl", "hfargs"), "7B"),
    "llamafactory": (("llamafactory", "hfargs"), "7B"),
    "trl": (("trl", "hfargs"), "7B"),
    "torchtune": (("torchtune",), "1B"),
    "mlx": (("mlx",), "1B"),
    "deepspeed": (("deepspeed",), "7B"),
    "accelerate": (("accelerate", "deepspeed"), "7B"),
    "kohya": (("kohya",), "sdxl"),
    "kohya_ss": (("kohya",), "sdxl"),
}


def _key_names(modules: tuple[str, ...]) -> list[str]:
    words: set[str] = set()
    for module in modules:
        words |= set(re.findall(r'"([a-z][a-z0-9_]{1,40})"', (READERS / f"{module}.py").read_text()))
    return sorted(words)


def _samples() -> list[tuple[str, Path]]:
    out = []
    for fmt in FORMATS:
        out += [
            (fmt, p)
            for p in sorted((SAMPLES / fmt).iterdir())
            if p.suffix in (".yaml", ".yml", ".json", ".toml")
        ]
    return [(fmt, p) for fmt, p in out if not p.name.endswith("data_config.toml")]


SAMPLE_FILES = _samples()
KEYS = {fmt: _key_names(modules) for fmt, (modules, _) in FORMATS.items()}
ALL_KEYS = sorted({k for keys in KEYS.values() for k in keys})

TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.sampled_from([0, -1, 1, 2, 3, 8, 4096, 2**31, 2**63, 10**30])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0.5, 1e-300, 1e308, -0.0, 2.5])
    | TEXT
    | st.sampled_from(["auto", "true", "no", "bf16", "fp16", "fp32", "adamw_8bit", "paged_adamw_8bit", "1e3",
                       "nan", "", "\x1b[2J", "-1", "all-linear", "q_proj,v_proj", "flash_attention_2", "lora",
                       "qlora", "zero3", "FULL_SHARD", "cpu", "none", "512,512", "[1024, 1024]"])
)  # fmt: skip
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)


def _tables(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The document and every mapping inside it (the sections a key may be set in)."""
    out, stack = [], [doc]
    while stack:
        item = stack.pop()
        out.append(item)
        stack += [v for v in item.values() if isinstance(v, dict)]
    return out


def _no_none(value: Any) -> Any:
    """TOML has no null: drop them (a key set to null is a key not set)."""
    if isinstance(value, dict):
        return {k: _no_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_no_none(v) for v in value if v is not None]
    return value


def _write(doc: dict[str, Any], path: Path) -> None:
    if path.suffix == ".toml":
        path.write_text(tomli_w.dumps(_no_none(doc)), encoding="utf-8")
    elif path.suffix == ".json":
        path.write_text(json.dumps(doc, allow_nan=True), encoding="utf-8")
    else:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True, sort_keys=False), encoding="utf-8")


@st.composite
def mutated(draw: st.DrawFn, doc: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    doc = json.loads(json.dumps(doc))  # a deep copy (the samples are plain data)
    for _ in range(draw(st.integers(1, 6))):
        table = draw(st.sampled_from(_tables(doc)))
        key = draw(st.sampled_from(keys) | st.sampled_from(ALL_KEYS) | TEXT)
        if draw(st.integers(0, 9)) == 0:
            table.pop(key, None)
        else:
            table[key] = draw(VALUES)
    return doc


@pytest.fixture(scope="module")
def parsed() -> dict[Path, dict[str, Any]]:
    from fitcheck.readers.base import syntax_of

    return {p: dict(parse(p.read_text(encoding="utf-8"), syntax_of(str(p)), str(p))) for _, p in SAMPLE_FILES}


def test_every_format_has_a_sample() -> None:
    assert {fmt for fmt, _ in SAMPLE_FILES} == set(FORMATS)


def test_fuzz_the_readers(
    parsed: dict[Path, dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    dataset = SAMPLES / "kohya" / "flux_data_config.toml"
    dataset_doc = dict(parse(dataset.read_text(encoding="utf-8"), "toml", str(dataset)))

    @settings(
        max_examples=int(os.environ.get("FITCHECK_FUZZ_EXAMPLES", "150")),
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=os.environ.get("CI") is not None,
    )
    @given(st.data())
    def run(data: st.DataObject) -> None:
        fmt, sample = data.draw(st.sampled_from(SAMPLE_FILES))
        doc = data.draw(mutated(parsed[sample], KEYS[fmt]))
        folder = tmp_path_factory.mktemp(fmt)
        path = folder / sample.name
        if fmt == "kohya":  # the dataset TOML a training TOML names, fuzzed or as it was
            fuzz_dataset = data.draw(st.booleans())
            _write(
                data.draw(mutated(dataset_doc, KEYS["kohya"])) if fuzz_dataset else dataset_doc,
                folder / dataset.name,
            )
            if data.draw(st.booleans()):
                doc["dataset_config"] = dataset.name
        _write(doc, path)
        command = data.draw(st.sampled_from(["estimate", "check"]))
        model = FORMATS[fmt][1]
        args = [command, model, "--from", str(path), "--on", "none" if command == "estimate" else "rtx-4090"]
        if data.draw(st.booleans()):
            args += ["--from-format", fmt]
        if data.draw(st.booleans()):
            args += ["--format", "json"]
        rc, out, err = invoke(args)
        event(f"{fmt} exit {rc}")
        hold_contract(command, args, rc, out, err)

    run()
