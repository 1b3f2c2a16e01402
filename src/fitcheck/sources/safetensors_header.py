"""Read tensor names, shapes and dtypes from ``*.safetensors`` headers without loading tensors.

Format (safetensors spec): an 8-byte little-endian header length N, then N bytes of JSON mapping
tensor names to ``{dtype, shape, data_offsets}`` (plus ``__metadata__``). Nothing else is read, the
length is bounded and checked against the file size, and nothing is unpickled.
"""

from __future__ import annotations

import math
import struct
from pathlib import Path
from typing import Any

from fitcheck.errors import ModelSourceError

#: The reference implementation refuses headers over 100 MB (safetensors MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
#: An index file maps tensors to shards; real ones are a few MB.
MAX_INDEX_BYTES = 50_000_000
#: Released checkpoints are split into at most a few hundred shards; each shard costs the Hub client one
#: request or more, so an index naming more than this is refused before any shard is read.
MAX_SHARDS = 2_000
#: No tensor dimension of a real model comes near this (the largest vocabularies are ~10^6).
MAX_DIM = 10**9

#: Every dtype of the safetensors format (its Rust ``Dtype`` enum) -> fitcheck's name of the same width;
#: unsigned integers count as the signed type of their width (bytes are what matter here).
DTYPES = {
    "F64": "fp64", "F32": "fp32", "F16": "fp16", "BF16": "bf16", "F8_E4M3": "fp8", "F8_E5M2": "fp8",
    "F8_E8M0": "fp8", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "int64",
    "U32": "int32", "U16": "int16", "U8": "uint8", "BOOL": "bool",
}  # fmt: skip
#: Bytes per element of each dtype (safetensors ``Dtype::size``, safetensors/src/tensor.rs at
#: huggingface/safetensors 000a16f; F8_E8M0 is one byte like the other fp8 formats).
ITEMSIZE = {
    "F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I64": 8, "I32": 4,
    "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1,
}  # fmt: skip


def read_header(path: Path) -> dict[str, Any]:
    """The JSON header of one safetensors file."""
    return read_header_sized(path)[0]


def read_header_sized(path: Path) -> tuple[dict[str, Any], int]:
    """The JSON header of one safetensors file and the size of the data buffer after it.

    Raises:
        ModelSourceError: truncated file, absurd or oversized header length, non-JSON header.
    """
    from fitcheck.fileio import loads, open_regular, read_upto

    with open_regular(path, "safetensors file") as (fd, size):
        raw = read_upto(fd, 8)
        if len(raw) < 8:
            raise ModelSourceError(f"{path}: too short to be a safetensors file")
        (n,) = struct.unpack("<Q", raw)
        if n > MAX_HEADER_BYTES or n + 8 > size:
            raise ModelSourceError(
                f"{path}: header length {n:,} is larger than the file ({size:,} bytes) or the "
                f"{MAX_HEADER_BYTES:,}-byte limit; the file is truncated or not safetensors"
            )
        text = read_upto(fd, n)
        buffer = size - 8 - n
    try:
        decoded = text.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelSourceError(f"{path}: the safetensors header is not JSON") from None
    try:
        header = loads(decoded, f"{path}: the safetensors header")
    except ModelSourceError as exc:
        if "not valid JSON" in str(exc):
            raise ModelSourceError(f"{path}: the safetensors header is not JSON") from None
        raise
    if not isinstance(header, dict):
        raise ModelSourceError(f"{path}: the safetensors header is not a JSON object")
    return header, buffer


def tensors(
    header: dict[str, Any], path: Path | str, buffer: int | None = None
) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (dtype, shape) for every tensor of a header whose sizes agree with its data offsets.

    ``buffer``: the bytes after the header, when the file is here (a Hub header read by range has none).
    """
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(info, dict):
            raise ModelSourceError(f"{path}: tensor '{name}' is not an object with dtype and shape")
        raw_dtype, raw_shape = info.get("dtype"), info.get("shape")
        if not isinstance(raw_dtype, str) or raw_dtype not in DTYPES:
            known = ", ".join(sorted(DTYPES))
            raise ModelSourceError(f"{path}: tensor '{name}' has dtype {raw_dtype!r}, not one of {known}")
        if not isinstance(raw_shape, list) or not all(type(x) is int for x in raw_shape):
            raise ModelSourceError(f"{path}: tensor '{name}' has no valid shape (a list of integers)")
        if any(x < 0 for x in raw_shape):
            raise ModelSourceError(f"{path}: tensor '{name}' has a negative dimension")
        if any(x > MAX_DIM for x in raw_shape):
            raise ModelSourceError(f"{path}: tensor '{name}' has a dimension over {MAX_DIM:,}")
        dtype, shape = DTYPES[raw_dtype], tuple(raw_shape)
        spans.append(_span(info.get("data_offsets"), ITEMSIZE[raw_dtype] * math.prod(shape), name, path))
        out[name] = (dtype, shape)
    _check_layout(spans, path, buffer)
    return out


def _span(offsets: object, nbytes: int, name: str, path: Path | str) -> tuple[int, int, str]:
    """A tensor's ``data_offsets`` [begin, end], which must span exactly what its shape and dtype need."""
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(type(x) is int and x >= 0 for x in offsets)
    ):
        raise ModelSourceError(f"{path}: tensor '{name}' has no valid data_offsets (two byte offsets)")
    begin: int = offsets[0]
    end: int = offsets[1]
    if end - begin != nbytes:
        raise ModelSourceError(
            f"{path}: tensor '{name}' has data_offsets spanning {end - begin:,} bytes but its shape and "
            f"dtype need {nbytes:,}: the header lies about the tensor's size"
        )
    return begin, end, name


def _check_layout(spans: list[tuple[int, int, str]], path: Path | str, buffer: int | None) -> None:
    """The tensors tile the data buffer from byte 0 with no gap or overlap, and end where the file does.

    The rule of the reference implementation (``Metadata::validate`` and ``read_metadata``,
    safetensors/src/tensor.rs at huggingface/safetensors 000a16f), which refuses any other file.
    """
    at = 0
    for begin, end, name in sorted(spans):
        if begin != at:
            raise ModelSourceError(
                f"{path}: tensor '{name}' starts at byte {begin:,}, not {at:,}: overlapping or gapped data"
            )
        at = end
    if buffer is not None and at != buffer:
        raise ModelSourceError(
            f"{path}: the header describes {at:,} bytes of tensor data but the file holds {buffer:,}; "
            "the file is truncated or the header lies"
        )


def index_shards(index: object, path: Path | str) -> list[str]:
    """The shard file names a safetensors index names: plain names beside it, at most `MAX_SHARDS`.

    The same rule for a local index and one on the Hub (whose shards the client would otherwise fetch,
    one range request or more each, for every name the index lists).
    """
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ModelSourceError(
            f"{path}: not a safetensors index (needs a 'weight_map' object of tensor -> file name)"
        )
    names = sorted(set(weight_map.values()))
    bad = [n for n in names if Path(n).name != n or n in ("", ".", "..") or "\\" in n]
    if bad:
        raise ModelSourceError(f"{path}: the index names a shard outside its folder: {bad[0]!r}")
    if len(names) > MAX_SHARDS:
        raise ModelSourceError(
            f"{path}: the index names {len(names):,} shards; over {MAX_SHARDS:,} is no released checkpoint"
        )
    return names


def shard_paths(path: Path) -> list[Path]:
    """The files behind a path: a single file, an index's shards, or a folder's safetensors files."""
    if path.is_dir():
        index = path / "model.safetensors.index.json"
        if index.exists():
            return shard_paths(index)
        return sorted(path.glob("*.safetensors"))
    if path.name.endswith(".index.json"):
        from fitcheck.fileio import read_json

        files = [
            path.parent / n for n in index_shards(read_json(path, MAX_INDEX_BYTES, "safetensors index"), path)
        ]
        missing = [f.name for f in files if not f.exists()]
        if missing:
            raise ModelSourceError(f"{path}: shard(s) missing beside the index: {', '.join(missing[:3])}")
        return files
    return [path]


def read_all(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensors of every shard behind ``path``."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for shard in shard_paths(path):
        header, buffer = read_header_sized(shard)
        out.update(tensors(header, shard, buffer))
    if not out:
        raise ModelSourceError(f"{path}: no tensors found")
    return out
