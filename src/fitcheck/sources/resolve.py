"""Resolve the MODEL argument: a path, a preset id or alias, a size, or a Hugging Face Hub id."""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from fitcheck.errors import InputError, ModelSourceError, NotFoundError, suggest
from fitcheck.fileio import could_be_path, user_path
from fitcheck.models import ModelSpec, TensorGroup
from fitcheck.presets import load_preset, preset_ids
from fitcheck.sources.hf_config import (
    UnsupportedTypeError,
    arch_from_hf_config,
    defaulted_shape,
    inferred_model_type,
)
from fitcheck.sources.prequant import PreQuant, note, read_prequant, unpacked
from fitcheck.sources.safetensors_header import read_all
from fitcheck.units import looks_like_size

if TYPE_CHECKING:
    from fitcheck.diffusion.spec import DiffusionSpec

MAX_CONFIG_BYTES = 4_000_000


def read_config(path: Path) -> dict[str, Any]:
    """Parse a config.json: a regular file, bounded while reading, JSON of bounded depth (with Python's
    NaN and Infinity, as transformers writes and reads them)."""
    return read_config_noting(path)[0]


def read_config_noting(path: Path) -> tuple[dict[str, Any], tuple[str, ...]]:
    """`read_config` and its warnings: a repeated key (transformers' ``json.load`` keeps the last value,
    so does fitcheck, and says so)."""
    from fitcheck.fileio import duplicate_note, read_json

    duplicates: list[str] = []
    # transformers writes config.json with Python's json.dumps, which spells a float infinity `Infinity`
    # (Mamba-2 mixers' "time_step_limit": [0.0, Infinity] in Granite 4.0-H, Falcon-H1, Nemotron-H), and
    # reads it back with json.loads: so does fitcheck, for this file only
    data = read_json(path, MAX_CONFIG_BYTES, "model config", duplicates, python_floats=True)
    if not isinstance(data, dict):
        raise ModelSourceError(f"{path} must hold a JSON object")
    key = nonfinite_setting(data)
    if key is not None:
        raise ModelSourceError(f"{path}: {key} is not a finite number")
    return data, ((f"{path}: {duplicate_note(duplicates)}",) if duplicates else ())


def nonfinite_setting(cfg: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first setting of ``cfg`` (nested sections included, as ``text_config.hidden_size``) whose value
    is NaN or an infinity. Inside a list such a value is a range's open end (``time_step_limit``) and
    stays; a setting itself is a size, a count or a flag, never infinite."""
    for key, value in cfg.items():
        if isinstance(value, float) and not math.isfinite(value):
            return f"{prefix}{key}"
        if isinstance(value, Mapping):
            found = nonfinite_setting(value, f"{prefix}{key}.")
            if found is not None:
                return found
    return None


def check_shaped(cfg: Mapping[str, Any], source: str) -> None:
    """Refuse a config.json that names a ``model_type`` but neither a width nor a depth key (nor a nested
    sub-config that could hold them): transformers would build its configuration class's defaults (a
    ``{"model_type": "llama"}`` is LlamaConfig's 6.7B), a model the user did not mean, and a figure for
    it would look like an answer."""
    from fitcheck.sources.hf_config import KEYS

    wanted = (*KEYS["hidden_size"], *KEYS["num_layers"])
    if any(k in cfg for k in wanted) or any(isinstance(v, Mapping) for v in cfg.values()):
        return
    raise ModelSourceError(
        f"{source}: no hidden_size or num_hidden_layers (nor {', '.join(wanted[1:3])}, ...): a config.json "
        "without the model's shape would be sized with the transformers class defaults; give the "
        "model's full config.json"
    )


def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for pid in preset_ids("models"):
        for alias in load_preset("models", pid).get("aliases", []) or []:
            out[str(alias).lower()] = pid
    return out


def spec_from_preset(preset_id: str) -> ModelSpec:
    """A model preset by id or alias."""
    pid = preset_id.lower()
    ids = preset_ids("models")
    if pid not in ids:
        pid = _aliases().get(pid, pid)
    data = load_preset("models", pid)
    arch = arch_from_hf_config(data["config"])
    return ModelSpec(
        id=data["id"],
        name=data.get("name", data["id"]),
        source_kind="preset",
        hf_id=data.get("hf_id"),
        source=data.get("source"),
        arch=arch,
        declared_params=data.get("params"),
        hf_config=dict(data["config"]),
    )


class ModelOption(NamedTuple):
    """A model preset as the planner offers it ("a smaller model", docs/planner.md#tight-changes)."""

    id: str
    name: str
    #: The preset's ``family`` (qwen2 holds Qwen2 and Qwen2.5, llama every Llama).
    family: str
    model_type: str
    #: The id without its size: ``llama-3.1-70b`` and ``llama-3.1-8b`` are the series ``llama-3.1``.
    series: str
    params: int


#: A size at the end of a preset id (``-70b``, ``-1.5b``, ``-135m``, ``-8x7b``) and what follows it.
_SIZE_TAIL = re.compile(r"-(\d+x)?\d+(\.\d+)?[bm](-.*)?$")


@functools.cache
def model_options() -> tuple[ModelOption, ...]:
    """Every language-model preset with its family and parameter count (the preset's ``params``)."""
    out = []
    for pid in preset_ids("models"):
        data = load_preset("models", pid)
        out.append(
            ModelOption(
                id=pid,
                name=str(data.get("name", pid)),
                family=str(data.get("family", data["config"]["model_type"])),
                model_type=str(data["config"]["model_type"]),
                series=_SIZE_TAIL.sub("", pid),
                params=int(data["params"]),
            )
        )
    return tuple(out)


#: An MXFP4 checkpoint (gpt-oss: ``quantization_config.quant_method`` "mxfp4") stores each expert weight as
#: ``<name>_blocks`` (uint8, two 4-bit values per byte) and ``<name>_scales`` (one uint8 exponent per block
#: of 32 values; not a parameter of the dequantized model): transformers integrations/mxfp4.py
#: ``convert_moe_packed_tensors``. transformers cannot train the MXFP4 form (quantizer_mxfp4.py
#: ``is_trainable`` is false and asks for ``Mxfp4Config(dequantize=True)``), so fine-tuning loads bf16.
MXFP4_NOTE = (
    "MXFP4 checkpoint: transformers trains it only dequantized to bf16 (Mxfp4Config(dequantize=True); its "
    "MXFP4 layers are not trainable), so the weights are estimated at the training precision"
)


#: A fine-grained FP8 checkpoint (DeepSeek-V3, ``quant_method`` "fp8"): ``FineGrainedFP8HfQuantizer``'s
#: ``is_trainable`` is False (transformers quantizers/quantizer_finegrained_fp8.py @0095b976); its config
#: takes ``dequantize=True`` (``FineGrainedFP8Config``) to load bf16 weights, the form a fine-tune trains.
FP8_NOTE = (
    "FP8 checkpoint: transformers trains it only dequantized to bf16 (FineGrainedFP8Config(dequantize=True); "
    "its FP8 layers are not trainable), so the weights are estimated at the training precision"
)


#: A compressed-tensors checkpoint (llm-compressor's FP8 / W4A16 / NVFP4 uploads): transformers trains it
#: decompressed (``CompressedTensorsConfig(run_compressed=False)``: the quantizer decompresses it after
#: loading and reports ``is_qat_trainable``; quantizers/quantizer_compressed_tensors.py @01e9ca7a).
CT_NOTE = (
    "compressed-tensors checkpoint: sized decompressed at the training precision, as transformers trains it "
    "(CompressedTensorsConfig(run_compressed=False)); a run that keeps the compressed layers is not modelled"
)


def _groups(
    tensors: dict[str, tuple[str, tuple[int, ...]]], pq: PreQuant | None = None
) -> tuple[TensorGroup, ...]:
    """Parameters per part of the model, read from the headers; a quantized checkpoint's packed weights
    count the values they hold and its quantization state none (`fitcheck.sources.prequant.unpacked`)."""
    by: Counter[tuple[str, str]] = Counter()
    names = frozenset(tensors)
    for name, (stored, dims) in tensors.items():
        n, dtype = math.prod(dims), stored
        if pq is not None:
            n, dtype = unpacked(pq, name, stored, n, names)
        kind = (
            "embedding"
            if "embed" in name or name.endswith("wte.weight")
            else (
                "lm_head" if "lm_head" in name else ("norm" if "norm" in name or ".ln_" in name else "layers")
            )
        )
        by[(kind, dtype)] += n
    return tuple(TensorGroup(name=k, numel=n, dtype=d) for (k, d), n in sorted(by.items()) if n)


def spec_from_config(
    cfg: dict[str, Any],
    *,
    id: str,
    name: str,
    source: str,
    tensors: dict[str, tuple[str, tuple[int, ...]]] | None = None,
    hf_id: str | None = None,
    warnings: tuple[str, ...] = (),
) -> ModelSpec:
    """A `ModelSpec` from a parsed config.json and, when known, the safetensors tensors beside it.

    A ``model_type`` without a table row is sized from transformers on the meta device when the torch
    extra is installed (`fitcheck.sources.meta_fallback`), with a warning; without it the error names
    the supported types and the extra.
    """
    notes: tuple[str, ...] = ()
    if not cfg.get("model_type") and (found := inferred_model_type(cfg)) is not None:
        cfg = {**cfg, "model_type": found[0]}
        warnings = (*warnings, f"config.json names no model_type: read as '{found[0]}' from {found[1]}")
    try:
        arch = arch_from_hf_config(cfg)
        if defaulted := defaulted_shape(cfg):
            warnings = (
                *warnings,
                f"config.json states no {', '.join(d.split()[0] for d in defaulted)}: the configuration "
                f"class's defaults are used ({', '.join(defaulted)}), as transformers would; check that the "
                "file is the model's Hub config",
            )
    except UnsupportedTypeError as exc:
        from fitcheck.sources.meta_fallback import arch_from_meta

        arch, notes = arch_from_meta(cfg, exc)
    check_shaped(cfg, source)  # after the model_type's own checks: an unknown type is named first
    notes = (*warnings, *notes)
    pq = read_prequant(cfg)
    if pq is not None:
        notes = (
            *notes,
            {"mxfp4": MXFP4_NOTE, "fp8": FP8_NOTE, "compressed-tensors": CT_NOTE}.get(pq.scheme) or note(pq),
        )
    groups = _groups(tensors, pq) if tensors else ()
    return ModelSpec(
        id=id,
        name=str(cfg.get("_name_or_path") or name),
        source_kind="safetensors" if groups else "hf_config",
        hf_id=hf_id,
        source=source,
        arch=arch,
        declared_params=sum(g.numel for g in groups) if groups else None,
        file_groups=groups,
        hf_config=cfg,
        notes=notes,
    )


def spec_from_path(path: Path) -> ModelSpec:
    """A local Hugging Face folder, a config.json, or safetensors files (with a config.json beside)."""
    if not path.exists():
        raise NotFoundError(f"{short(str(path))}: no such file or folder")
    if not path.is_dir() and not path.is_file():
        from fitcheck.fileio import file_kind

        raise ModelSourceError(f"{path} is {file_kind(path.stat().st_mode)}, not a model file or folder")
    if path.is_file() and path.suffix not in (".json", ".safetensors"):
        raise ModelSourceError(
            f"{short(str(path))}: not a model file; fitcheck reads a model folder, its config.json or its "
            "*.safetensors files"
        )
    folder = path if path.is_dir() else path.parent
    cfg_path = (
        path if path.suffix == ".json" and not path.name.endswith("index.json") else folder / "config.json"
    )
    if not cfg_path.exists():
        raise ModelSourceError(
            f"{folder}: no config.json; fitcheck needs the model's config.json beside its weights"
        )
    cfg, warnings = read_config_noting(cfg_path)
    weights: Path | None = None
    if (
        (
            path.is_dir()
            and (any(path.glob("*.safetensors")) or (path / "model.safetensors.index.json").exists())
        )
        or path.suffix == ".safetensors"
        or path.name.endswith(".index.json")
    ):
        weights = path
    tensors = read_all(weights) if weights is not None else None
    return spec_from_config(
        cfg,
        id=str(path),
        name=folder.absolute().name or str(path),  # `config.json` or `.` in the working folder
        source=str(cfg_path),
        tensors=tensors,
        warnings=warnings,
    )


@functools.cache
def _hf_ids() -> dict[str, str]:
    """Hub repo id (lower case) -> model preset id, from each preset's ``hf_id`` and ``hf_ids``."""
    out: dict[str, str] = {}
    for pid in preset_ids("models"):
        data = load_preset("models", pid)
        for repo in [data.get("hf_id"), *(data.get("hf_ids") or [])]:
            if repo:
                out[str(repo).lower()] = pid
    return out


def _diffusion_hf_ids() -> dict[str, str]:
    from fitcheck.diffusion.sources import diffusion_ids

    out: dict[str, str] = {}
    for pid in diffusion_ids():
        data = load_preset("diffusion", pid)
        for repo in [data.get("hf_id"), *(data.get("hf_ids") or [])]:
            if repo:
                out[str(repo).lower()] = pid
    return out


def resolve(text: str) -> ModelSpec | DiffusionSpec:
    """Turn the MODEL argument into a spec: the one resolver behind the CLI and the library.

    Order (docs/cli.md, "Which model"): a local path (a diffusers pipeline folder or checkpoint, a
    transformers folder, config.json or safetensors); a preset id or alias (LLM or diffusion); a size
    string; a preset whose ``hf_id`` / ``hf_ids`` lists the Hub id (no network); then the Hub
    through ``huggingface_hub`` (`fitcheck.sources.hub`).
    """
    from fitcheck.diffusion.sources import resolve_diffusion

    if not text.strip():
        raise InputError("MODEL is empty: give a preset id, a size like 7B, a Hub id or a path")
    if not could_be_path(text.replace("\0", "")):  # a NUL alone is an unknown name, said below
        raise InputError(f"'{short(text)}' is longer than any model name or path can be")
    try:
        dspec = resolve_diffusion(text)
        if dspec is not None:
            return dspec
        return _resolve_llm_or_hub(text)
    except OSError as exc:  # a path the system refuses (permissions, a loop of links, ...)
        raise ModelSourceError(f"{short(text)}: cannot read it ({exc.strerror or exc})") from None


def short(text: str, n: int = 80) -> str:
    """A name as an error line shows it: at most ``n`` characters."""
    return text if len(text) <= n else text[: n - 3] + "..."


def _resolve_llm_or_hub(text: str) -> ModelSpec | DiffusionSpec:
    from fitcheck.sources.hub import parse_hub_id, spec_from_hub
    from fitcheck.sources.size import spec_from_size

    p = user_path(text)
    hub = parse_hub_id(text) if not p.exists() else None
    if hub is None and (p.exists() or text.endswith((".json", ".safetensors")) or "/" in text):
        return spec_from_path(p)
    low = text.lower()
    if low in preset_ids("models"):
        return spec_from_preset(low)
    if looks_like_size(text):  # before the aliases, which need every preset file read
        return spec_from_size(text)
    if low in _aliases():
        return spec_from_preset(low)
    if hub is not None:
        repo, rev = hub
        if rev is None and repo.lower() in _hf_ids():
            return spec_from_preset(_hf_ids()[repo.lower()])
        if rev is None and repo.lower() in _diffusion_hf_ids():
            from fitcheck.diffusion.sources import spec_from_preset as diffusion_preset

            return diffusion_preset(_diffusion_hf_ids()[repo.lower()])
        return spec_from_hub(repo, rev)
    hint = suggest(text, [*preset_ids("models"), *_aliases()])
    raise NotFoundError(
        f"unknown model '{short(text)}'"
        + (f"; {hint}" if hint else "")
        + " (a preset id from `fitcheck models`, a size like 7B, a Hub id like org/name, or a path to a "
        "model folder)"
    )


def resolve_model(text: str) -> ModelSpec:
    """`resolve` for the commands that size language models only (plan, measure)."""
    spec = _resolve_llm_or_hub(text)
    if not isinstance(spec, ModelSpec):
        raise ModelSourceError(f"'{text}' is a diffusion pipeline; this command sizes language models")
    return spec
