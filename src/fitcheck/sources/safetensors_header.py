"""Read tensor names, shapes and dtypes from ``*.safetensors`` headers without loading tensors.

Format (safetensors spec): an 8-byte little-endian header length N, then N bytes of JSON mapping
tensor names to ``{dtype, shape, data_offsets}`` (plus ``__metadata__``). Nothing else is read, the
length is bounded and checked against the file size, and nothing is unpickled.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from fitcheck.errors import ModelSourceError

#: The reference implementation refuses headers over 100 MB (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
#: An index file maps tensors to shards; real ones are a few MB.
MAX_INDEX_BYTES = 50_000_000

DTYPES = {
    "F64": "fp64", "F32": "fp32", "F16": "fp16", "BF16": "bf16", "F8_E4M3": "fp8", "F8_E5M2": "fp8",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file.

    Raises:
        ModelSourceError: truncated file, absurd or oversized header length, non-JSON header.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise ModelSourceError(f"{path}: too short to be a safetensors file")
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER_BYTES or n + 8 > size:
                raise ModelSourceError(
                    f"{path}: header length {n:,} is larger than the file ({size:,} bytes) or the "
                    f"{MAX_HEADER_BYTES:,}-byte limit; the file is truncated or not safetensors"
                )
            text = fh.read(n)
    except OSError as exc:
        raise ModelSourceError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        header = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelSourceError(f"{path}: the safetensors header is not JSON") from None
    if not isinstance(header, dict):
        raise ModelSourceError(f"{path}: the safetensors header is not a JSON object")
    return header


def tensors(header: dict[str, Any], path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) for every tensor of a header."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = DTYPES.get(info["dtype"], info["dtype"].lower())
            shape = tuple(int(x) for x in info["shape"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ModelSourceError(f"{path}: tensor '{name}' has no valid dtype/shape") from None
        if any(x < 0 for x in shape):
            raise ModelSourceError(f"{path}: tensor '{name}' has a negative dimension")
        out[name] = (dtype, shape)
    return out


def shard_paths(path: Path) -> list[Path]:
    """The files behind a path: a single file, an index's shards, or a folder's safetensors files."""
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.exists():
            return shard_paths(index)
        return sorted(path.glob("*.safetensors"))
    if path.name.endswith(".index.json"):
        if path.stat().st_size > MAX_INDEX_BYTES:
            raise ModelSourceError(f"{path}: index file over {MAX_INDEX_BYTES:,} bytes")
        try:
            index = json.loads(path.read_text(encoding="utf-8"))
            names = sorted(set(index["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
            raise ModelSourceError(f"{path}: not a safetensors index (needs a 'weight_map' object)") from None
        files = [path.parent / n for n in names]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelSourceError(f"{path}: shard(s) missing beside the index: {', '.join(missing[:3])}")
        return files
    return [path]


def read_all(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensors of every shard behind ``path``."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for shard in shard_paths(path):
        out.update(tensors(read_header(shard), shard))
    if not out:
        raise ModelSourceError(f"{path}: no tensors found")
    return out
