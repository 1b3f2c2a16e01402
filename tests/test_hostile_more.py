"""Hostile inputs, second red-team pass (session 5): one parametrized test per class that failed.

- a bound a request model declares (``PlanRequest.batch_size >= 1``) but no option validator checked
  reached the user as pydantic's internal error: ``plan 7B --batch-size 0`` (found by the CLI fuzz test,
  seed 7). Every request model is now built through `fitcheck.api.validated`;
- the JSON nesting bound was a pure-Python loop over every character (a 100 MB safetensors header: ~10 s
  before parsing began). `fitcheck.fileio.deeper_than` decides it with C-speed passes (`bytes.translate`,
  ``replace``, ``count``) or hands it to an iterative walk of the parsed document; the parser's own
  RecursionError is the backstop (bench/json_scan.py);
- ``measure`` with a config.json transformers refuses while building the model (an unknown ``hidden_act``
  or rope type, ``tie_word_embeddings: "yes"``) was an internal error; ``--steps 100000000`` ran without
  end; ``--top -1`` listed all but one tensor; ``--timeline pipe`` was refused naming ``--chart``.
"""

from __future__ import annotations

import json
import os
from contextlib import suppress
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fitcheck.errors import ModelSourceError
from fitcheck.fileio import MAX_JSON_DEPTH, deeper_than, loads, nested_deeper
from test_hostile_inputs import run


def assert_one_line(rc: int, out: str, err: str, word: str) -> None:
    assert rc == 2, err
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fitcheck: error:"), err
    assert "internal error" not in err and word in lines[0], err


@pytest.mark.parametrize(
    ("option", "value"),
    [("--batch-size", "0"), ("--batch-size", "-3"), ("--effective-batch", "0"), ("--min-seq-len", "0"),
     ("--epochs", "0"), ("--seq-len", "0")],
)  # fmt: skip
def test_a_plan_request_out_of_range_is_one_line_naming_its_flag(option: str, value: str) -> None:
    assert_one_line(*run(["plan", "7B", option, value, "--on", "rtx-4090"]), option)


# --- the JSON nesting bound, scanned at C speed ---------------------------------------------------------

JSON_LEAVES = st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n', max_size=6)
JSON_DOCS = st.recursive(
    JSON_LEAVES,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text('[]{}"\\k', max_size=4), inner, max_size=3)
    ),
    max_leaves=30,
)


def exact_depth(doc: object) -> int:
    if isinstance(doc, dict):
        return 1 + max(map(exact_depth, doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max(map(exact_depth, doc), default=0)
    return 0


def strings(doc: object) -> list[str]:
    if isinstance(doc, dict):
        return [*doc, *(s for v in doc.values() for s in strings(v))]
    if isinstance(doc, list):
        return [s for v in doc for s in strings(v)]
    return [doc] if isinstance(doc, str) else []


@settings(max_examples=400, deadline=None)
@given(JSON_DOCS, st.integers(0, 12), st.booleans())
def test_the_fast_depth_scan_is_exact_or_says_it_cannot_tell(doc: object, limit: int, indent: bool) -> None:
    text = json.dumps(doc, indent=1 if indent else None, ensure_ascii=False)
    told = deeper_than(text, limit)
    assert told in (None, exact_depth(doc) > limit), (text, limit)
    assert nested_deeper(doc, limit) == (exact_depth(doc) > limit)
    if not any(set(name) & set("[]{}") for name in strings(doc)):
        assert told is not None or limit > 8  # no bracket in a string: the scan decides within 8 passes


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='[]{}"\\ :,1ab', max_size=80))
def test_any_text_is_parsed_or_refused_in_one_clear_error(text: str) -> None:
    with suppress(ModelSourceError):
        loads(text, "x.json")


@pytest.mark.parametrize(
    "text",
    ["[" * 100_000, "[" * 100_000 + "]" * 100_000, '{"a":' * 50_000, "]" + "[" * 100_000,
     '["' + "[" * 100_000 + '"]' + "]", "[" * 65 + "]" * 65, '"\\\\"' + "[" * 3000],
)  # fmt: skip
def test_deep_or_unbalanced_json_is_one_clear_error(text: str) -> None:
    with pytest.raises(ModelSourceError, match=r"x\.json"):
        loads(text, "x.json")


def test_json_exactly_at_the_depth_bound_still_parses() -> None:
    text = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH
    assert deeper_than(text, MAX_JSON_DEPTH) is False
    assert nested_deeper(loads(text, "x.json"), MAX_JSON_DEPTH) is False
    with_strings = '["' + "[" * 200 + '", ' + "[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1) + "]"
    assert deeper_than(with_strings, MAX_JSON_DEPTH) is None  # a bracket in a string: the walk decides
    assert loads(with_strings, "x.json")[0] == "[" * 200


# --- measure: hostile models, options and --timeline paths (before any long trace) ----------------------

TINY = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256}  # fmt: skip

#: (config.json changes, a word of the one error line): values transformers refuses while it builds the model
#: were internal errors (KeyError, its strict-dataclass error) before `measure.build.transformers_call`.
MEASURE_CONFIGS = [
    ({"hidden_act": "nope"}, "KeyError"),
    ({"rope_scaling": {"rope_type": "bogus", "factor": 2.0}}, "bogus"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),  # held already (fitcheck's own config reader)
]


@pytest.fixture
def tiny_model(tmp_path: Path) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    folder = tmp_path / "tiny"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


@pytest.mark.parametrize(("change", "word"), MEASURE_CONFIGS, ids=[w for _, w in MEASURE_CONFIGS])
def test_measure_a_config_transformers_refuses_is_one_line(
    tiny_model: Path, change: dict[str, object], word: str
) -> None:
    (tiny_model / "config.json").write_text(json.dumps({**TINY, **change}))
    rc, out, err = run(["measure", str(tiny_model), "--seq-len", "16"])
    errors = [line for line in err.splitlines() if line.startswith("fitcheck: error:")]
    assert rc == 2 and out == "" and len(errors) == 1 and word in errors[0], err
    assert "internal error" not in err and "Traceback" not in err


def _timeline_target(tmp_path: Path, kind: str) -> str:
    target = tmp_path / f"{kind}.svg"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    elif kind == "existing":
        target.write_text("mine")
    elif kind == "devnull":
        target.symlink_to("/dev/null")
    elif kind == "fifo-named":
        target = tmp_path / "pipe"
        os.mkfifo(target)
    return str(target)


#: (argument kind, extra options, a word of the one error line); each is refused before the trace starts.
MEASURE_ARGS = [
    ("timeline:existing", [], "--force"),
    ("timeline:devnull", ["--force"], "regular files only"),
    ("timeline:fifo", ["--force"], "FIFO"),
    ("timeline:folder", ["--force"], "folder"),
    ("timeline:fifo-named", ["--force"], "--timeline"),  # said --chart before
    ("steps", ["--steps", "0"], "--steps"),
    ("steps", ["--steps", "100000000"], "--steps"),  # ran without end before
    ("top", ["--top", "-1"], "--top"),  # listed all but the last tensor before
    ("model:fifo", [], "FIFO"),
    ("model:folder", [], "no config.json"),
]


@pytest.mark.parametrize(
    ("kind", "extra", "word"), MEASURE_ARGS, ids=[f"{k}{''.join(e)}" for k, e, _ in MEASURE_ARGS]
)
def test_measure_a_hostile_argument_is_refused_before_tracing(
    tiny_model: Path, tmp_path: Path, kind: str, extra: list[str], word: str
) -> None:
    model = str(tiny_model)
    if kind.startswith("timeline:"):
        extra = ["--timeline", _timeline_target(tmp_path, kind.split(":")[1]), *extra]
    elif kind == "model:fifo":
        model = str(tmp_path / "m")
        os.mkfifo(model)
    elif kind == "model:folder":
        model = str(tmp_path / "empty")
        os.mkdir(model)
    rc, out, err = run(["measure", model, "--seq-len", "16", *extra])
    errors = [line for line in err.splitlines() if line.startswith("fitcheck: error:")]
    assert rc == 2 and out == "" and len(errors) == 1 and word in errors[0], err
    assert "tracing" not in err, "refused only after the trace"
    if kind == "timeline:existing":
        assert (tmp_path / "existing.svg").read_text() == "mine"


# --- kohya's dataset_config naming something that is no file -------------------------------------------

KOHYA = Path(__file__).parent / "data" / "from" / "kohya" / "flux_lora_with_dataset.toml"


@pytest.mark.parametrize(
    ("kind", "word"), [("fifo", "FIFO"), ("folder", "folder"), ("/dev/zero", "character device")]
)
def test_a_dataset_config_that_is_no_file_is_named_as_such(tmp_path: Path, kind: str, word: str) -> None:
    """It was refused as "not beside it" (it was), now as what it is, naming the training TOML too."""
    target = tmp_path / "data.toml"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    name = kind if kind.startswith("/") else "data.toml"
    text = KOHYA.read_text().replace('dataset_config = "flux_data_config.toml"', f'dataset_config = "{name}"')
    assert name in text
    config = tmp_path / "train.toml"
    config.write_text(text)
    assert_one_line(*run(["estimate", "sdxl", "--from", str(config), "--on", "none"]), word)
    assert (
        "train.toml: its dataset_config"
        in run(["estimate", "sdxl", "--from", str(config), "--on", "none"])[2]
    )
