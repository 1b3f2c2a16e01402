"""What every reader shares: the typed result, key bookkeeping, bounded safe loading, name tables.

A reader is a pure function ``read(data, path) -> ReadResult``: a parsed mapping in, the model it
names, the setup values it sets (in fitcheck's vocabulary), the keys it did not use and notes out.
Loading text (bounded, safe YAML, ``tomllib``, ``json``) is the only I/O, and it lives here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from fitcheck.errors import FitcheckError, InputError
from fitcheck.units import MIB

#: A setup value as a trainer file gives it, already in fitcheck's vocabulary.
Value = str | int | float | bool
#: A parsed config document (YAML, JSON and TOML all load into this shape).
Doc = Mapping[str, object]

#: Trainer configs are a few kB; anything past this is not a config (bounded read).
MAX_BYTES = MIB
#: Values in a parsed config, counting each YAML alias use again (a real config has a few hundred).
#: A YAML file of a few hundred bytes can alias its way to billions of values ("billion laughs") or
#: refer to itself (``&a [*a]``): anything that walks such a document (unused keys, repr in an error
#: line) would run out of memory or never end, so the document is walked once, bounded, at parse time.
MAX_VALUES = 100_000

#: Setup fields fitcheck's setup model may not have yet (added by the multi-GPU and engine work):
#: read anyway, and reported as "read, not yet modelled" when the setup model lacks them.
PENDING_FIELDS = (
    "strategy",
    "offload",
    "nodes",
    "fsdp_version",
    "loss",
    "base_quant",
    "train_modules",
    "offload_activations",
)


@dataclass(frozen=True)
class ReadResult:
    """What one trainer file says about a run.

    Attributes:
        format: the reader that read it (``axolotl``, ``trl``, ...).
        path: the file.
        trainer: the fitcheck ``--trainer`` whose regime the file runs (``hf`` for TRL).
        model: the base model the file names (a Hub id, a local path, a preset id), or None.
        values: setup field -> value, in fitcheck's vocabulary (only what the file sets).
        keys: setup field -> the file key(s) it came from (provenance for the user).
        unused: file keys fitcheck does not use (dotted for nested ones), listed for the user.
        notes: what the reader inferred or could not model, one sentence each.
    """

    format: str
    path: str
    trainer: str
    model: str | None
    values: Mapping[str, Value]
    keys: Mapping[str, str]
    unused: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def origin(self) -> dict[str, str]:
        """Every value here came from the file."""
        return dict.fromkeys(self.values, "file")


class Keys:
    """A mapping whose reads are recorded, so the keys nobody read can be listed (never dropped)."""

    def __init__(self, data: Doc, prefix: str = "") -> None:
        self.data = data
        self.prefix = prefix
        self.used: set[str] = set()
        self.children: list[Keys] = []

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default: object = None) -> object:
        self.used.add(key)
        value = self.data.get(key)
        return default if value is None else value

    def sub(self, key: str) -> Keys | None:
        """A nested mapping, tracked key by key (``model.lora_rank``); None when absent or not a mapping.

        A value that is no mapping (``zero_optimization: "3"``, ``fsdp_config: yes``) is left unread, so
        the ``not understood`` line names it: the settings it stands for were not read, and the trainer
        would not read them from it either.
        """
        value = self.data.get(key)
        if not isinstance(value, Mapping):
            if value is None:
                self.used.add(key)
            return None
        self.used.add(key)
        child = Keys(value, f"{self.prefix}{key}.")
        self.children.append(child)
        return child

    def touch(self, *keys: str) -> None:
        """Mark keys read that matter only as a group (checked elsewhere)."""
        self.used.update(keys)

    def unused(self) -> list[str]:
        out = [
            f"{self.prefix}{k}"
            for k, v in self.data.items()
            if k not in self.used and v is not None and v != "" and not _is_empty(v)
        ]
        for child in self.children:
            out += child.unused()
        return out


def _is_empty(v: object) -> bool:
    return isinstance(v, (list, dict)) and not v


@dataclass
class Reading:
    """A reader's working state: the values set so far, where from, and notes."""

    format: str
    trainer: str
    keys: Keys
    path: str
    values: dict[str, Value] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    model: str | None = None

    def set(self, name: str, value: Value | None, key: str) -> None:
        """Record a setup value and the file key it came from (None: the file did not say)."""
        if value is None:
            return
        self.values[name] = value
        self.sources[name] = key

    def note(self, text: str) -> None:
        self.notes.append(text)

    def result(self) -> ReadResult:
        return ReadResult(
            format=self.format,
            path=self.path,
            trainer=self.trainer,
            model=self.model,
            values=dict(self.values),
            keys=dict(self.sources),
            unused=tuple(sorted(self.keys.unused())),
            notes=tuple(self.notes),
        )


def several_examples(r: Reading) -> int | None:
    """The file's micro-batch when it holds more than one example (what padding to the longest needs)."""
    batch = r.values.get("batch_size")
    return batch if isinstance(batch, int) and not isinstance(batch, bool) and batch > 1 else None


def unpacked_note(r: Reading, packing: str, hf_sampler: bool = True) -> None:
    """A micro-batch of more than one unpacked example: say what the estimate (every row full) leaves out
    of such a run and which option poses it (docs/from.md#padded-batches). ``hf_sampler``: the run takes
    HF Trainer's sampler, so a file's ``group_by_length`` runs the longest batch first (``--lengths
    longest-first``); it is read here for every reader of such files."""
    grouped = hf_sampler and as_bool(r.keys.get("group_by_length"), "group_by_length", r.path) is True
    batch = several_examples(r)
    if batch is None:
        return
    if grouped:
        r.note(
            f"no {packing}, group_by_length: each micro-batch of {batch} is padded to its longest example "
            "and the longest batch runs first; the estimate fills every row to the sequence length (the "
            "peak step), and --lengths longest-first adds the padding mask (under SDPA each layer's copy) "
            "without an allocator history, since no later step is longer than the first"
        )
        return
    r.note(
        f"no {packing}: each micro-batch of {batch} is padded to its longest example, so steps vary in "
        "length and carry a padding mask; the estimate fills every row to the sequence length (the "
        "peak step), and --lengths varying adds what such a run holds beside it (the caching "
        "allocator's history over its lengths; under SDPA each layer's copy of the mask)"
    )


# ------------------------------------------------------------------------------------ value checks


def _short(value: object) -> str:
    """A bounded repr for an error line: a value from a file may be huge or an alias bomb."""
    import reprlib

    shown = reprlib.Repr()
    shown.maxstring = shown.maxother = shown.maxlong = 60
    shown.maxlevel, shown.maxlist, shown.maxdict = 2, 4, 4
    return shown.repr(value)


def as_int(value: object, key: str, path: str) -> int | None:
    """An integer setting; ``"auto"`` (resolved by the trainer at run time) reads as unset.

    A whole float (``8.0``, ``"1e3"``) reads as its integer; NaN, infinities and fractions are refused.
    """
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"{path}: {key} must be a whole number (got {_short(value)})")
    if isinstance(value, int):
        return value
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise InputError(f"{path}: {key} must be a whole number (got {_short(value)})") from None
    if not math.isfinite(number) or number != int(number):
        raise InputError(f"{path}: {key} must be a whole number (got {_short(value)})")
    return int(number)


def as_float(value: object, key: str, path: str) -> float | None:
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InputError(f"{path}: {key} must be a number (got {_short(value)})")
    try:
        number = float(value)
    except (ValueError, OverflowError):  # OverflowError: an int past float's range (10**400)
        raise InputError(f"{path}: {key} must be a number (got {_short(value)})") from None
    if not math.isfinite(number):
        raise InputError(f"{path}: {key} must be a finite number (got {_short(value)})")
    return number


def as_word(value: object, key: str, path: str) -> str | None:
    """A setting that names something (an optimizer, a dtype, a kernel): text, or unset. A number, a list or a
    mapping is refused here rather than read as unset, which would size the default in its place without a
    word."""
    if value is None or isinstance(value, str):
        return value
    hint = (
        " (YAML reads an unquoted no, yes, off or on as a boolean: quote the word)"
        if isinstance(value, bool)
        else ""
    )
    raise InputError(f"{path}: {key} must be a name (got {_short(value)}){hint}")


def as_bool(value: object, key: str, path: str) -> bool | None:
    """A flag; YAML/TOML/JSON booleans, and the strings a hand-written file may carry."""
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.strip().lower() in ("true", "yes", "1")
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    raise InputError(f"{path}: {key} must be true or false (got {_short(value)})")


# ----------------------------------------------------------------------------------------- loading


def read_text(path: str) -> str:
    """The file's text: a regular file, bounded while reading (`fitcheck.fileio`), UTF-8; one clear error
    naming ``--from`` otherwise."""
    from fitcheck.errors import ModelSourceError
    from fitcheck.fileio import read_bytes

    try:
        raw = read_bytes(Path(path), MAX_BYTES, "trainer config")
    except ModelSourceError as exc:
        raise InputError(f"--from {exc}") from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise InputError(f"--from {path}: not a UTF-8 text file") from None


@functools.cache
def _noting_loader() -> type:
    """The safe YAML loader (C-speed when built) that names each key a mapping repeats; the value kept
    is the last, as PyYAML's own loader (and so every trainer that reads YAML with it) keeps it. A key a
    ``<<`` merge brings in and the mapping then sets is an override, not a repeat: only a mapping's own
    keys are compared, before the merge is flattened."""
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class Loader(base):  # type: ignore[misc,valid-type]
        def __init__(self, stream: str) -> None:
            super().__init__(stream)
            self.duplicates: list[str] = []

        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[object, object]:
            seen: set[str] = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if key.value in seen and key.value not in self.duplicates:
                        self.duplicates.append(key.value)
                    seen.add(key.value)
            return dict(super().construct_mapping(node, deep))

    return Loader


def _load_yaml(text: str, duplicates: list[str]) -> object:
    loader = _noting_loader()(text)
    try:
        data: object = loader.get_single_data()
    finally:
        loader.dispose()
    duplicates += loader.duplicates
    return data


def parse(text: str, syntax: str, path: str) -> Doc:
    """Parse YAML (safe loader), JSON or TOML (``tomllib``) into a mapping; malformed -> InputError."""
    return parse_noting(text, syntax, path)[0]


def parse_noting(text: str, syntax: str, path: str) -> tuple[Doc, list[str]]:
    """`parse`, with the keys the file repeats (TOML refuses a repeat itself; YAML and JSON keep the
    last value, as the trainers' loaders do)."""
    duplicates: list[str] = []
    try:
        if syntax == "toml":
            import tomllib

            data: object = tomllib.loads(text)
        elif syntax == "json":
            from fitcheck.fileio import loads

            data = loads(text, path, duplicates)  # strict: no NaN, bounded nesting
        else:
            data = _load_yaml(text, duplicates)
    except FitcheckError as exc:  # fileio.loads's own line already names the file and the fault
        raise InputError(f"--from {exc}") from None
    except Exception as exc:  # every parser's own error type, reported as one line
        raise InputError(f"--from {path}: not valid {syntax.upper()}: {_first_line(exc)}") from None
    if not isinstance(data, Mapping):
        raise InputError(f"--from {path}: expected a mapping of settings, got {type(data).__name__}")
    if count_values(data, MAX_VALUES) > MAX_VALUES:
        raise InputError(
            f"--from {path}: over {MAX_VALUES:,} values once YAML aliases are expanded "
            "(an alias bomb or a self-referring document is no trainer config)"
        )
    return data, duplicates


def count_values(data: object, limit: int) -> int:
    """The values in a parsed document, each alias use counted again; stops past ``limit``."""
    seen, stack = 0, [data]
    while stack and seen <= limit:
        item = stack.pop()
        seen += 1
        if isinstance(item, Mapping):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return seen


def _first_line(exc: Exception) -> str:
    from fitcheck.fileio import parser_error

    return parser_error(exc)


def syntax_of(path: str) -> str:
    """yaml, json or toml, from the file name (YAML by default: most trainer configs are YAML)."""
    suffix = Path(path).suffix.lower()
    return {".json": "json", ".toml": "toml"}.get(suffix, "yaml")


def ray_gpus(r: Reading, k: Keys, on: bool) -> None:
    """Ray workers (axolotl ``use_ray``; LLaMA-Factory under ``USE_RAY=1``): ``ray_num_workers`` workers of
    ``resources_per_worker.GPU`` GPUs each (both trainers default to 1 and ``{"GPU": 1}``:
    trainer_keys/axolotl_keys.txt, llamafactory_keys.txt), read as one node of that many GPUs; ``on``
    False (axolotl's ``use_ray`` off) leaves them unused, with a note."""
    workers = as_int(k.get("ray_num_workers"), "ray_num_workers", r.path)
    res = k.sub("resources_per_worker")
    per = as_float(res.get("GPU"), "resources_per_worker.GPU", r.path) if res is not None else None
    if workers is None or workers < 1:
        return
    if not on:
        r.note("ray_num_workers is set but use_ray is off: one process, as axolotl runs it")
        return
    gpus = max(1, round(workers * (per if per is not None else 1.0)))
    r.set("gpus", gpus, "ray_num_workers")
    r.note(
        f"ray_num_workers {workers}: {gpus} GPU(s) over the Ray workers, sized as one node (--nodes to "
        "split them)"
    )
