"""Hostile inputs found by the red-team pass (session 4), one parametrized test per class of failure.

Each class was a real failure before its fix:

- control characters in a name (a model folder, a Hub id, a ``--from`` value or key, ``--on``,
  ``--lora-targets``) reached the terminal raw: an ANSI escape recoloured or cleared it, a newline split
  the one ``fitcheck: error:`` line in two, a bidi override reordered it (`fitcheck.terminal`);
- a non-finite number in a trainer config (YAML ``.nan`` / ``.inf``, ``1e999``, JSON duplicate key
  holding ``1e999``) was an internal error (``int(nan)``) instead of exit 2 (`readers.base.as_int`);
- a YAML alias bomb ("billion laughs", 1 kB) or a self-referring alias under any key ran fitcheck out
  of memory or forever while the unused keys were listed (`readers.base.count_values`).
"""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck.cli import main
from fitcheck.terminal import is_unsafe, printable

LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip

#: Names that would act on a terminal if printed raw.
EVIL = {
    "esc": "m\x1b[31mred\x1b[2J",
    "newline": "m\nfitcheck: error: forged",
    "cr": "m\rforged",
    "bidi": "m\u202eevil",
    "c1": "m\x9b31m",
    "bell": "m\x07\x08",
}


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(argv)
    return rc, out.getvalue(), err.getvalue()


def assert_inert(rc: int, out: str, err: str) -> None:
    """No control or reordering character anywhere but the line breaks fitcheck writes itself."""
    assert rc in (0, 1, 2), err
    assert "internal error" not in err, err
    bad_err = [hex(ord(c)) for c in err.replace("\n", "") if is_unsafe(c)]
    bad_out = [hex(ord(c)) for c in out.replace("\n", "") if is_unsafe(c)]
    assert not bad_err, (bad_err, err[-300:])
    assert not bad_out, (bad_out, out[:300])
    if rc == 2:
        assert out == ""
        assert err.count("\n") == 1 and err.startswith("fitcheck: error:"), err


# ------------------------------------------------------------------------------ printable (unit)


@given(st.text())
def test_printable_leaves_nothing_a_terminal_obeys(text: str) -> None:
    shown = printable(text)
    assert not any(is_unsafe(c) for c in shown)
    assert "\n" not in shown


@pytest.mark.parametrize(
    ("raw", "shown"),
    [("plain-name", "plain-name"), ("a\nb", "a\\nb"), ("\x1b[2J", "\\x1b[2J"), ("r\u202el", "r\\u202el"),
     ("é 中 ü", "é 中 ü"), ("\x9b", "\\x9b")],
)  # fmt: skip
def test_printable_examples(raw: str, shown: str) -> None:
    assert printable(raw) == shown


# ------------------------------------------------------------------ control characters in names


@pytest.fixture(scope="module")
def evil_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A valid model folder per hostile name: the name reaches the table, markdown and plan."""
    root = tmp_path_factory.mktemp("evil")
    out = {}
    for key, name in EVIL.items():
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(LLAMA))
        out[key] = str(d)
    return out


@pytest.mark.parametrize("key", sorted(EVIL))
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "@", "--on", "24GB"],
        ["estimate", "@", "--on", "24GB", "--format", "markdown"],
        ["estimate", "@", "--on", "24GB", "--rule", "thumb"],
        ["check", "@", "--on", "24GB"],
        ["plan", "@", "--on", "24GB"],
        ["plan", "@", "--on", "24GB", "--format", "markdown"],
        ["plan", "@", "--on", "0.5GB", "--method", "full"],
        ["matrix", "--on", "24GB", "--models", "@"],
    ],
    ids=lambda a: "-".join(x for x in a if x != "@")[:40],
)
def test_a_hostile_folder_name_prints_inert(key: str, argv: list[str], evil_models: dict[str, str]) -> None:
    assert_inert(*run([evil_models[key] if a == "@" else a for a in argv]))


@pytest.mark.parametrize("key", sorted(EVIL))
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "@", "--on", "none"],
        ["estimate", "org/@", "--on", "none"],
        ["estimate", "7B", "--on", "@"],
        ["estimate", "7B", "--on", "none", "--method", "lora", "--lora-targets", "@"],
        ["estimate", "7B", "--on", "none", "--from-format", "@", "--from", "x.yaml"],
        ["matrix", "--on", "24GB", "--models", "@"],
        ["plan", "7B", "--on", "24GB", "--emit", "@"],
    ],
    ids=lambda a: "-".join(x for x in a if "@" not in x)[:40],
)
def test_a_hostile_argument_is_one_inert_error_line(key: str, argv: list[str]) -> None:
    rc, out, err = run([a.replace("@", EVIL[key]) for a in argv])
    assert rc == 2, err
    assert_inert(rc, out, err)


@pytest.mark.parametrize("fmt", ["table", "markdown", "json"])
@pytest.mark.parametrize("key", sorted(EVIL))
def test_a_hostile_unmatched_target_is_warned_inert(key: str, fmt: str) -> None:
    """A named target that matches nothing beside one that does is ignored with a warning (as peft
    ignores it); the warning shows the name inert."""
    argv = ["estimate", "7B", "--on", "none", "--lora-targets", f"q_proj,{EVIL[key]}", "--format", fmt]
    rc, out, err = run(argv)
    assert rc == 0, err
    assert_inert(rc, out, err)
    assert "no module" in out + err


# ----------------------------------------------------------------------------- --from files

#: (file name, text, a word the one error line names): a non-finite number in each reader's keys.
NON_FINITE: list[tuple[str, str, str]] = [
    *[
        (f"axolotl-{v}.yaml", f"base_model: 7B\nadapter: lora\nlora_r: {v}\n", "lora_r")
        for v in (".nan", ".inf", "-.inf", "1e999", '"nan"', '"inf"')
    ],
    ("axolotl-alpha.yaml", "base_model: 7B\nadapter: lora\nlora_alpha: .nan\n", "lora_alpha"),
    ("axolotl-dropout.yaml", "base_model: 7B\nadapter: lora\nlora_dropout: .inf\n", "lora_dropout"),
    ("axolotl-mbs.yaml", "base_model: 7B\nmicro_batch_size: .inf\n", "micro_batch_size"),
    ("axolotl-bigfloat.yaml", "base_model: 7B\nadapter: lora\nlora_alpha: " + "9" * 400 + "\n", "lora_alpha"),
    ("lf.yaml", "model_name_or_path: 7B\nfinetuning_type: lora\nlora_rank: .nan\n", "lora_rank"),
    (
        "trl.yaml",
        "model_name_or_path: 7B\nper_device_train_batch_size: .nan\n",
        "per_device_train_batch_size",
    ),
    (
        "tt.yaml",
        "model:\n  _component_: torchtune.models.llama3.lora_llama3_8b\n  lora_rank: .inf\n",
        "lora_rank",
    ),
    ("mlx.yaml", "model: 7B\nlora_parameters: {rank: .nan}\n", "rank"),
    ("kohya.toml", 'pretrained_model_name_or_path = "sd15"\nresolution = "nan,nan"\n', "resolution"),
    (
        "kohya-alpha.toml",
        'pretrained_model_name_or_path = "sd15"\nnetwork_module = "networks.lora"\nnetwork_alpha = nan\n',
        "network_alpha",
    ),
    (
        "ds.json",  # a duplicate key: JSON's last one wins, and it is 1e999 (inf)
        '{"train_micro_batch_size_per_gpu": 1, "train_micro_batch_size_per_gpu": 1e999}',
        "train_micro_batch_size_per_gpu",
    ),
    (
        "acc.yaml",
        "compute_environment: LOCAL_MACHINE\ndistributed_type: FSDP\nnum_processes: .inf\n",
        "num_processes",
    ),
]


def _laughs(levels: int, tail: str) -> str:
    lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        prev, cur = chr(ord("a") + i - 1), chr(ord("a") + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n" + tail.replace("@", chr(ord("a") + levels - 1)) + "\n"


#: Documents whose expansion is unbounded: under an unknown key, under a key a reader reads, or itself.
BOMBS: list[tuple[str, str, str]] = [
    ("laughs-unused.yaml", _laughs(12, "base_model: 7B\nadapter: lora"), "alias"),
    ("laughs-targets.yaml", _laughs(12, "base_model: 7B\nadapter: lora\nlora_target_modules: *@"), "alias"),
    ("laughs-datasets.yaml", _laughs(12, "base_model: 7B\ndatasets: *@"), "alias"),
    ("laughs-merge.yaml", _laughs(12, "base_model: 7B\nx: {<<: {k: *@}}"), "alias"),
    ("self-list.yaml", "a: &a [*a]\nbase_model: 7B\n", "self-referring"),
    ("self-map.yaml", "a: &a {b: *a}\nbase_model: 7B\n", "self-referring"),
    ("self-model.yaml", "base_model: &m [*m]\n", "self-referring"),
]


@pytest.mark.parametrize(("name", "text", "word"), NON_FINITE + BOMBS, ids=[c[0] for c in NON_FINITE + BOMBS])
def test_a_hostile_trainer_config_is_one_clear_line(name: str, text: str, word: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.write_text(text)
    rc, out, err = run(["estimate", "--from", str(path), "--on", "24GB"])
    assert rc == 2, err[-400:]
    assert_inert(rc, out, err)
    assert word in err, err
    assert len(err) < 400, err


def test_a_real_config_with_aliases_still_reads(tmp_path: Path) -> None:
    """The bound counts values, not aliases: a config that shares a block by alias reads as before."""
    path = tmp_path / "shared.yaml"
    path.write_text("base: &b {adapter: lora, lora_r: 8}\n<<: *b\nbase_model: 7B\nother: *b\n")
    rc, _, err = run(["estimate", "--from", str(path), "--on", "24GB", "--format", "json"])
    assert rc == 0, err
    assert "lora_rank=8" in err


def test_a_unused_key_with_an_escape_is_reported_inert(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text('base_model: 7B\nadapter: lora\n"\\e]52;c;ZXZpbA==\\a": 1\n')
    rc, out, err = run(["estimate", "--from", str(path), "--on", "24GB"])
    assert rc == 0, err
    assert_inert(rc, out, err)
    assert "\\x1b]52" in err  # named, escaped: the user sees the key the file really has


# ------------------------------------------------------------------- vision towers' config.json

#: (vision_config of a LLaVA / Qwen2-VL model, the key the error names): each was an internal error
#: (ZeroDivisionError on patch_size 0, ValueError on int("x"), OverflowError on int(1e300)) or a
#: silently negative parameter count.
VISION: list[tuple[str, dict[str, object], str]] = [
    ("llava", {"patch_size": 0}, "patch_size"),
    ("llava", {"hidden_size": -1, "image_size": -5}, "hidden_size"),
    ("llava", {"hidden_size": "x"}, "hidden_size"),
    ("llava", {"image_size": 1e300}, "image_size"),
    ("llava", {"num_hidden_layers": [1]}, "num_hidden_layers"),
    ("llava", {"intermediate_size": True}, "intermediate_size"),
    ("qwen2_vl", {"mlp_ratio": "x"}, "mlp_ratio"),
    ("qwen2_vl", {"mlp_ratio": 0}, "mlp_ratio"),
    ("qwen2_vl", {"spatial_merge_size": 10**9}, "spatial_merge_size"),
    ("qwen2_vl", {"depth": -3}, "depth"),
]


@pytest.mark.parametrize(("kind", "vision", "key"), VISION, ids=[f"{k}-{key}" for k, _, key in VISION])
def test_a_hostile_vision_config_is_one_clear_line(
    kind: str, vision: dict[str, object], key: str, tmp_path: Path
) -> None:
    cfg = {"model_type": kind, "text_config": LLAMA, "vision_config": vision}
    if kind == "qwen2_vl":  # Qwen2-VL publishes the language model's keys at the top level
        cfg = {**LLAMA, "model_type": kind, "vision_config": vision}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, out, err = run(["estimate", str(tmp_path), "--on", "none"])
    assert rc == 2, err
    assert_inert(rc, out, err)
    assert f"vision_config: {key}" in err, err


def test_a_whole_float_in_a_vision_config_still_reads(tmp_path: Path) -> None:
    cfg = {"model_type": "llava", "text_config": LLAMA, "vision_config": {"image_size": 336.0}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, _, err = run(["estimate", str(tmp_path), "--on", "none"])
    assert rc == 0, err


# ----------------------------------------------------------------------------- --emit targets

TRL_IN = "model_name_or_path: qwen2.5-0.5b\nuse_peft: true\nlora_r: 8\nper_device_train_batch_size: 1\n"
FROM_IN = ["plan", "--from", "@/in.hf.yaml", "--on", "rtx-4090"]


def _emit_in(tmp_path: Path, argv: list[str]) -> tuple[int, str, str]:
    return run([a.replace("@", str(tmp_path)) for a in argv])


@pytest.mark.parametrize(
    "argv",
    [
        # the --from input itself, by its name, a symlink to it and a hard link to it (with --force)
        [*FROM_IN, "--emit", "in.hf.yaml", "-o", "@", "--force"],
        [*FROM_IN, "--emit", "link.hf.yaml", "-o", "@", "--force"],
        [*FROM_IN, "--emit", "hard.hf.yaml", "-o", "@", "--force"],
        # the model's own config.json
        ["plan", "@/model", "--on", "rtx-4090", "--emit", "config.json", "--emit-format", "hf.yaml",
         "-o", "@/model", "--force"],
    ],
    ids=["from-itself", "from-symlink", "from-hardlink", "model-config"],
)  # fmt: skip
def test_a_file_the_command_read_is_never_written(tmp_path: Path, argv: list[str]) -> None:
    """Before: ``--force`` replaced the user's trainer config (or the model's config.json) with the plan."""
    (tmp_path / "in.hf.yaml").write_text(TRL_IN)
    (tmp_path / "link.hf.yaml").symlink_to(tmp_path / "in.hf.yaml")
    (tmp_path / "hard.hf.yaml").hardlink_to(tmp_path / "in.hf.yaml")
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(LLAMA))
    rc, _, err = _emit_in(tmp_path, argv)
    assert rc == 2, err
    assert "this command read" in err.splitlines()[-1], err
    assert (tmp_path / "in.hf.yaml").read_text() == TRL_IN
    assert json.loads((tmp_path / "model" / "config.json").read_text()) == LLAMA


def test_emitting_beside_the_input_still_writes(tmp_path: Path) -> None:
    (tmp_path / "in.hf.yaml").write_text(TRL_IN)
    rc, _, err = _emit_in(tmp_path, [*FROM_IN, "--emit", "out.hf.yaml", "-o", "@"])
    assert rc == 0, err
    assert (tmp_path / "out.hf.yaml").read_text().startswith("# TRL SFT config")


def test_one_file_by_two_names_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Before: the names differed as strings (a linked folder), so the first was written, then the second
    refused as existing: exit 2 with a file left behind. (One format asked twice is now refused first;
    the writer's own check is held below.)"""
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    argv = ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--emit-format", "hf.yaml",
            "--emit", "@/real/x.yaml", "--emit", "@/link/x.yaml"]  # fmt: skip
    rc, _, err = _emit_in(tmp_path, argv)
    assert rc == 2 and "hf.yaml is asked twice" in err, err
    assert list((tmp_path / "real").iterdir()) == []


def test_the_writer_refuses_one_file_by_two_names(tmp_path: Path) -> None:
    from fitcheck.emitters.writer import WriteError, check_destinations

    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(WriteError, match="named twice"):
        check_destinations([tmp_path / "real" / "x.yaml", tmp_path / "link" / "x.yaml"], force=False)


@pytest.mark.parametrize("name", ["a/", "..", ".", "x/.", "", "sub/"])
def test_an_emit_name_that_is_no_file_name_is_refused(name: str, tmp_path: Path) -> None:
    """Before: ``--emit a/`` wrote a file named ``a``."""
    rc, out, err = _emit_in(tmp_path, ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--emit", name,
                                       "--emit-format", "hf.yaml", "-o", "@"])  # fmt: skip
    assert rc == 2 and "no file name" in err, err
    assert_inert(rc, out, err)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------------- the library API

#: (function, args, kwargs): a value of the wrong type was an AttributeError / TypeError from deep inside
#: (``'int' object has no attribute 'strip'``); now the library's own InputError names the argument.
API_CASES: list[tuple[str, tuple[object, ...], dict[str, object]]] = [
    ("estimate", (None,), {}),
    ("estimate", (7,), {}),
    ("estimate", (b"7B",), {}),
    ("estimate", (["7B"],), {}),
    ("estimate", ("7B",), {"on": 24}),
    ("estimate", ("7B",), {"on": b"24GB"}),
    ("estimate", ("7B",), {"headroom": 5}),
    ("estimate", ("7B",), {"headroom": ["1GB"]}),
    ("check", ("7B",), {"on": 5}),
    ("plan", (5,), {"on": "24GB"}),
    ("plan", ("7B",), {"on": 24}),
    ("resolve", (None,), {}),
    ("target", (5,), {}),
    ("target", ("24GB",), {"headroom": 5}),
    ("target", ("24GB",), {"gpus": "x"}),
    ("target", ("24GB",), {"gpus": 0}),
    ("target", ("24GB",), {"gpus": True}),
    ("detect", (5,), {}),
]


@pytest.mark.parametrize(
    ("name", "args", "kwargs"), API_CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(API_CASES)]
)
def test_a_wrong_type_in_the_api_is_the_librarys_own_error(
    name: str, args: tuple[object, ...], kwargs: dict[str, object]
) -> None:
    from fitcheck import api
    from fitcheck.errors import InputError

    with pytest.raises(InputError, match="must be"):
        getattr(api, name)(*args, **kwargs)


def test_a_resolved_spec_and_target_still_pass_through() -> None:
    from fitcheck import api

    spec, tgt = api.resolve("7B"), api.target("24GB")
    assert api.estimate(spec, on=tgt).device_bytes > 0


# ---------------------------------------------------------------- safetensors headers that lie


def _st(tensors: dict[str, dict[str, object]], data: int) -> bytes:
    import struct

    raw = json.dumps(tensors).encode()
    return struct.pack("<Q", len(raw)) + raw + b"\0" * data


#: (header tensors, bytes of data after the header, a word the one error line has). Before, fitcheck
#: counted parameters from the shapes alone: a 100-byte file could claim any size. The reference loader
#: refuses each of these (safetensors/src/tensor.rs, Metadata::validate and read_metadata).
LYING: list[tuple[str, dict[str, dict[str, object]], int, str]] = [
    ("short-span", {"w": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 8]}}, 8, "lies"),
    ("huge-shape", {"w": {"dtype": "BF16", "shape": [10**9, 10**9], "data_offsets": [0, 32]}}, 32, "lies"),
    ("truncated", {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}, 10, "truncated"),
    ("no-offsets", {"w": {"dtype": "F32", "shape": [4, 4]}}, 64, "data_offsets"),
    ("str-offsets", {"w": {"dtype": "F32", "shape": [4, 4], "data_offsets": "0-64"}}, 64, "data_offsets"),
    ("neg-offsets", {"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}}, 4, "data_offsets"),
    (
        "overlap",
        {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
         "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}},
        24,
        "overlapping",
    ),
    ("gap", {"w": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]}}, 32, "overlapping or gapped"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "tensors", "data", "word"), LYING, ids=[c[0] for c in LYING])
def test_a_lying_safetensors_header_is_one_clear_line(
    name: str, tensors: dict[str, dict[str, object]], data: int, word: str, tmp_path: Path
) -> None:
    path = tmp_path / f"{name}.safetensors"
    path.write_bytes(_st(tensors, data))
    rc, out, err = run(["estimate", str(path), "--on", "none"])
    assert rc == 2, err
    assert_inert(rc, out, err)
    assert word in err, err


def test_an_honest_header_with_its_tensors_out_of_order_still_reads(tmp_path: Path) -> None:
    """Offsets are checked in offset order, not the header's key order (the reference loader sorts too)."""
    (tmp_path / "config.json").write_text(json.dumps(LLAMA))
    h, v = 256, 1000
    emb = {"dtype": "F32", "shape": [v, h], "data_offsets": [4 * h, 4 * h * (v + 1)]}
    norm = {"dtype": "F32", "shape": [h], "data_offsets": [0, 4 * h]}
    header = {"model.embed_tokens.weight": emb, "model.norm.weight": norm}
    (tmp_path / "model.safetensors").write_bytes(_st(header, 4 * h * (v + 1)))
    rc, _, err = run(["estimate", str(tmp_path / "model.safetensors"), "--on", "none"])
    assert rc == 0, err


# --------------------------------------------------- file names that are not UTF-8 (surrogateescape)

#: A Latin-1 byte in a file name reaches Python's argv as a lone surrogate ("\udce9"); printing or
#: encoding it as UTF-8 raised UnicodeEncodeError (an internal error) on every command.
LATIN1 = "lat\udce9n"


@pytest.mark.parametrize("fmt", ["table", "json", "yaml", "markdown"])
def test_a_model_folder_whose_name_is_not_utf8_prints(fmt: str, tmp_path: Path) -> None:
    folder = tmp_path / LATIN1
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA))
    rc, out, err = run(["estimate", str(folder), "--on", "none", "--format", fmt])
    assert rc == 0, err
    assert_inert(rc, out, err)
    assert "udce9" in out.lower()  # shown as its escape, never dropped


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "@/no-such-\udce9", "--on", "none"],
        ["estimate", "7\udce9B", "--on", "none"],
        ["estimate", "7B", "--on", "24G\udce9"],
        ["estimate", "7B", "--on", "none", "--method", "lora", "--lora-targets", "q\udce9"],
        ["estimate", "--from", "@/nope\udce9.yaml", "--on", "none"],
        ["hw", "--headroom", "1\udce9"],
    ],
    ids=lambda a: "-".join(x for x in a if "\udce9" not in x)[:40],
)
def test_a_non_utf8_argument_is_one_inert_error_line(argv: list[str], tmp_path: Path) -> None:
    rc, out, err = run([a.replace("@", str(tmp_path)) for a in argv])
    assert rc == 2, err
    assert_inert(rc, out, err)


def test_an_emit_name_that_is_not_utf8_is_written_as_valid_utf8(tmp_path: Path) -> None:
    rc, _, err = run(["plan", "qwen2.5-0.5b", "--on", "24GB", "--emit", f"out{LATIN1}.yaml",
                      "--emit-format", "hf.yaml", "-o", str(tmp_path)])  # fmt: skip
    assert rc == 0, err
    (written,) = tmp_path.iterdir()
    text = written.read_bytes().decode("utf-8")  # valid UTF-8: the trainer's YAML parser reads it
    assert "\\udce9" in text


# ------------------------------------------- names no file can have, taken from a file or argv

LONG = "x" * 5000
PARTS = "a/" * 3000 + "b"


@pytest.mark.parametrize(
    ("name", "text", "word"),
    [
        # Path.exists / is_file raise on these (ENAMETOOLONG, a NUL) instead of answering False
        (
            "k-long.toml",
            f'pretrained_model_name_or_path = "sd15"\ndataset_config = "{LONG}"\n',
            "dataset_config",
        ),
        (
            "k-nul.toml",
            'pretrained_model_name_or_path = "sd15"\ndataset_config = "a\\u0000b.toml"\n',
            "dataset_config",
        ),
        ("ax-long.yaml", f"base_model: {PARTS}\nadapter: lora\n", "longer"),
        ("ax-nul.yaml", 'base_model: "a\\0b"\nadapter: lora\n', "unknown model"),
        ("mlx-long.yaml", f"model: {'y' * 300}\nfine_tune_type: lora\n", "longer"),
    ],
    ids=[
        "kohya-dataset-long",
        "kohya-dataset-nul",
        "axolotl-model-long",
        "axolotl-model-nul",
        "mlx-model-long",
    ],
)
def test_a_name_no_file_can_have_is_one_clear_line(name: str, text: str, word: str, tmp_path: Path) -> None:
    """Before: an internal error (OSError 'File name too long', ValueError 'embedded null byte')."""
    path = tmp_path / name
    path.write_text(text)
    rc, out, err = run(["estimate", "--from", str(path), "--on", "none"])
    assert rc == 2, err
    assert_inert(rc, out, err)
    assert word in err and len(err) < 400, err


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--from", "a\0b.yaml", "--on", "none"],
        ["estimate", "7B", "--on", "none", "--chart", "a\0b.svg"],
        [
            "plan",
            "qwen2.5-0.5b",
            "--on",
            "24GB",
            "--emit",
            "a\0b.yaml",
            "--emit-format",
            "hf.yaml",
            "-o",
            "@",
        ],
    ],
    ids=["from", "chart", "emit"],
)
def test_a_nul_in_a_file_name_is_one_clear_line(argv: list[str], tmp_path: Path) -> None:
    """Real argv cannot carry a NUL, but ``main([...])`` and the fuzz test can: it was a ValueError."""
    rc, out, err = run([a.replace("@", str(tmp_path)) for a in argv])
    assert rc == 2, err
    assert_inert(rc, out, err)
    assert list(tmp_path.iterdir()) == []
