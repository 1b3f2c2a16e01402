"""Readers: trainer config files -> model and setup values (``--from FILE``).

One module per format, each a pure function from a parsed mapping to a `ReadResult`; a detector
(`fitcheck.readers.detect`), the trainer defaults table (`fitcheck.readers.defaults`) and the
precedence merge (`fitcheck.readers.merge`). `read_config` is the one entry point that touches
the file system: a bounded read of the file (and, for kohya, of the dataset file it names).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from fitcheck.errors import FitcheckError, InputError, OptionError, suggest
from fitcheck.fileio import could_be_path, loads
from fitcheck.readers.base import Doc, ReadResult, parse, parse_noting, read_text, syntax_of
from fitcheck.readers.detect import detect, unread
from fitcheck.terminal import clipped

#: ``--from-format`` name -> (module, function, syntax of its files).
FORMATS: dict[str, tuple[str, str, str]] = {
    "axolotl": ("fitcheck.readers.axolotl", "read", "yaml"),
    "llamafactory": ("fitcheck.readers.llamafactory", "read", "yaml"),
    "trl": ("fitcheck.readers.trl", "read", "yaml"),
    "torchtune": ("fitcheck.readers.torchtune", "read", "yaml"),
    "mlx": ("fitcheck.readers.mlx", "read", "yaml"),
    "kohya": ("fitcheck.readers.kohya", "read", "toml"),
    "kohya_ss": ("fitcheck.readers.kohya", "read_gui", "json"),
    "deepspeed": ("fitcheck.readers.deepspeed", "read", "json"),
    "accelerate": ("fitcheck.readers.accelerate", "read", "yaml"),
    "litgpt": ("fitcheck.readers.litgpt", "read", "yaml"),
}
#: Other names users type for a format (fitcheck's own emitter names among them).
ALIASES = {
    "hf": "trl",
    "llama-factory": "llamafactory",
    "mlx-lm": "mlx",
    "ds": "deepspeed",
    "lit-gpt": "litgpt",
}


def format_name(name: str) -> str:
    """A ``--from-format`` value, checked."""
    if not name.strip():  # "" was read as not given: the format detected instead of the one asked
        raise OptionError(f"--from-format is empty: give one of {', '.join(FORMATS)}")
    key = ALIASES.get(name.strip().lower(), name.strip().lower())
    if key not in FORMATS:
        hint = suggest(name, [*FORMATS, *ALIASES])
        raise OptionError(
            f"unknown --from-format '{name}'"
            + (f"; {hint}" if hint else "")
            + f" (formats: {', '.join(FORMATS)})"
        )
    return key


def read_config(path: str, fmt: str | None = None) -> ReadResult:
    """Read a trainer config: detect (or take) its format and run that format's reader."""
    if not path.strip():  # Path("") is the current folder: "--from . is a folder" named no file typed
        raise InputError("--from is empty: name a trainer config file (e.g. --from run.yaml)")
    syntax = syntax_of(path)
    wanted = format_name(fmt) if fmt is not None else None
    if wanted is not None:
        syntax = FORMATS[wanted][2] if syntax_of(path) == "yaml" and Path(path).suffix == "" else syntax
    text = read_text(path)
    if wanted is None and syntax == "yaml" and Path(path).suffix.lower() not in YAML_SUFFIXES:
        # a JSON object under another name (allenai/open-instruct keeps its DeepSpeed configs as
        # configs/ds_configs/*.conf): detected as the JSON it is, not as YAML no YAML rule matches
        syntax = "json" if text.lstrip().startswith("{") else syntax
    data, duplicates = parse_noting(text, syntax, path)
    return _noting_duplicates(_read_parsed(data, text, syntax, wanted, path), duplicates)


#: Suffixes that say YAML; a file named otherwise that opens with ``{`` is read as JSON.
YAML_SUFFIXES = (".yaml", ".yml")


def _read_parsed(data: Doc, text: str, syntax: str, wanted: str | None, path: str) -> ReadResult:
    """Run the reader for a parsed trainer config (its format detected unless ``wanted``)."""
    why = unread(data, syntax)
    if why is not None:
        raise OptionError(f"--from {path}: {why}")
    found = wanted or detect(data, syntax)
    if found is None and syntax == "toml" and ("datasets" in data or "general" in data):
        raise OptionError(
            f"{path} is a kohya dataset config ([general], [[datasets]]), not a training config: "
            "give --from the sd-scripts TOML that names it as dataset_config"
        )
    if found is None:
        raise OptionError(
            f"cannot tell which trainer {path} is for; give --from-format ({', '.join(FORMATS)})"
        )
    module, func, _ = FORMATS[found]
    reader = getattr(importlib.import_module(module), func)
    if found in ("kohya", "kohya_ss"):
        if found == "kohya":  # a ControlNet run is refused before its dataset file is looked for
            from fitcheck.readers.kohya import refuse_controlnet

            refuse_controlnet(data, path)
        return reader(data, path, _kohya_dataset(data, path))
    if found == "mlx":
        return reader(data, path, _mlx_bits(data))
    if found == "accelerate":
        return reader(data, path, _accelerate_deepspeed(data, path))
    if found == "torchtune":
        from fitcheck.readers.torchtune import recipe_of

        return reader(data, path, recipe_of(text))
    result: ReadResult = reader(data, path)
    return _with_deepspeed(result, data, path)


#: Formats whose ``deepspeed`` key names a DeepSpeed JSON the trainer loads (axolotl and the HF Trainer
#: open the path as given, relative to the working folder: TrainingArguments ``deepspeed``); what that
#: JSON decides for the run (the ZeRO stage, offload, reduce bucket and overlap_comm; the main file keeps the
#: rest).
DEEPSPEED_KEY = ("axolotl", "llamafactory", "trl")
DEEPSPEED_FIELDS = ("strategy", "offload", "zero_bucket_size", "zero_overlap_comm")


def _with_deepspeed(result: ReadResult, data: Doc, path: str) -> ReadResult:
    """The run's ZeRO stage and offload from the DeepSpeed JSON the file names, when it is found (in the
    working folder, as the trainer looks, then beside the file); otherwise the reader's note stands."""
    from dataclasses import replace

    name = data.get("deepspeed")
    if result.format not in DEEPSPEED_KEY or not isinstance(name, str) or not name:
        return result
    ds = _named_deepspeed((Path(name), Path(path).parent / name))
    read_note = f"deepspeed: read {ds.path}" if ds is not None else ""
    if ds is None:
        ds = _shipped_deepspeed(result.format, name)
        read_note = f"deepspeed: {name} is not here; read as the trainer ships it ({ds.path})" if ds else ""
    if ds is None:
        return result
    got = {f: ds.values[f] for f in DEEPSPEED_FIELDS if f in ds.values and f not in result.values}
    notes = [n for n in result.notes if not n.startswith("deepspeed:")]
    return replace(
        result,
        values={**result.values, **got},
        keys={**result.keys, **{f: f"deepspeed ({ds.path}: {ds.keys[f]})" for f in got}},
        notes=(*notes, read_note, *ds.notes),
    )


def _shipped_deepspeed(fmt: str, name: str) -> ReadResult | None:
    """The ZeRO block of the trainer's own DeepSpeed file that ``name`` names (`fitcheck.readers.shipped`)."""
    from fitcheck.readers.deepspeed import read as read_deepspeed
    from fitcheck.readers.shipped import shipped

    found = shipped(fmt, name)
    return read_deepspeed(found[1], found[0]) if found is not None else None


def _named_deepspeed(candidates: tuple[Path, ...]) -> ReadResult | None:
    """The first of ``candidates`` that is a file, read as a DeepSpeed JSON (None when none is)."""
    from fitcheck.readers.deepspeed import read as read_deepspeed

    for candidate in candidates:
        where = str(candidate)
        if could_be_path(where) and candidate.is_file():
            data, duplicates = parse_noting(read_text(where), "json", where)
            return _noting_duplicates(read_deepspeed(data, where), duplicates)
    return None


def _noting_duplicates(result: ReadResult, duplicates: list[str]) -> ReadResult:
    """The reader's result with a first note naming the keys its file repeats (none: unchanged)."""
    if not duplicates:
        return result
    from dataclasses import replace

    from fitcheck.fileio import duplicate_note

    return replace(result, notes=(duplicate_note(duplicates), *result.notes))


def _kohya_dataset(data: Doc, path: str) -> Doc | None:
    """The ``dataset_config`` file beside the training TOML (sd-scripts reads it from the working
    folder; a relative path is tried beside the config first)."""
    from fitcheck.readers.kohya import dataset_file

    name = dataset_file(data)
    if name is None:
        return None
    for candidate in (Path(path).parent / name, Path(name)):
        if could_be_path(str(candidate)) and candidate.exists():  # a FIFO or folder: read_text says which
            try:
                text = read_text(str(candidate))
            except InputError as exc:
                raise InputError(
                    f"--from {path}: its dataset_config {str(exc).removeprefix('--from ')}"
                ) from None
            return parse(text, syntax_of(str(candidate)), str(candidate))
    from fitcheck.errors import NotFoundError

    shown = clipped(name, 80)
    raise NotFoundError(f"--from {path}: its dataset_config {shown} is not beside it (nor in this folder)")


def _accelerate_deepspeed(data: Doc, path: str) -> ReadResult | None:
    """The DeepSpeed JSON an accelerate config names (``deepspeed_config.deepspeed_config_file``), read
    when it is beside the config or in the working folder (where ``accelerate launch`` opens it)."""
    block = data.get("deepspeed_config")
    name = block.get("deepspeed_config_file") if isinstance(block, dict) else None
    if not isinstance(name, str) or not name:
        return None
    return _named_deepspeed((Path(path).parent / name, Path(name)))


def _mlx_bits(data: Doc) -> int | None:
    """Bits of a local MLX model folder's ``quantization`` block (mlx_lm/utils.py load_model)."""
    model = data.get("model")
    if not isinstance(model, str):
        return None
    config = Path(model) / "config.json"
    if not could_be_path(str(config)) or not config.is_file():
        return None
    try:
        doc = loads(read_text(str(config)), str(config))
    except (ValueError, OSError, FitcheckError):
        return None  # an unreadable model folder is MODEL's problem, reported when it is resolved
    quant = doc.get("quantization") if isinstance(doc, dict) else None
    bits = quant.get("bits") if isinstance(quant, dict) else None
    return bits if isinstance(bits, int) else 0


__all__ = ["FORMATS", "ReadResult", "format_name", "read_config"]
