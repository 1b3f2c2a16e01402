"""The hardware catalog: one YAML file per device in ``presets/hardware/``, validated on load.

Each entry keeps the source of every figure (``sources:`` field -> URLs or references). Lookup is
by id or alias; `match_gpu` and `match_apple` map what a probe detected (nvidia-smi's name and
memory.total, a Mac's chip and hw.memsize) to an entry. Names alone are not enough: an RTX 3060
exists with 8 and 12 GB, an A100 with 40 and 80 GB, all under one nvidia-smi name family.
"""

from __future__ import annotations

import functools
import re
from typing import Literal

from pydantic import Field, model_validator

from fitcheck.errors import FitcheckError, NotFoundError, compact, suggest
from fitcheck.models import Backend, Frozen
from fitcheck.presets import load_preset, preset_ids
from fitcheck.units import GIB

Vendor = Literal["nvidia", "amd", "apple"]
Segment = Literal["consumer", "workstation", "datacenter", "mac"]
GpuBackend = Literal["cuda", "rocm", "mps"]

_ID_RE = r"^[a-z0-9]+(?:[.-][a-z0-9]+)*$"
_VENDOR_BACKEND = {"nvidia": "cuda", "amd": "rocm", "apple": "mps"}
#: Numeric fields that must name a source whenever they hold a value.
SOURCED_FIELDS = (
    "memory_gb_marketed",
    "memory_gib",
    "driver_total_mib",
    "bandwidth_gbps",
    "bf16_tensor_tflops_dense",
    "fp16_tensor_tflops_dense",
    "fp32_tflops",
    "bf16_supported",
    "compute_capability",
    "context_mib",
    "idle_used_mib",
    "working_set_observed_mib",
    "gfx_target",
)
#: A detected total within this fraction of an entry's memory counts as the same card. RTX 4090:
#: 24564 MiB vs 24 GiB is 0.1 %; B200: 183359 MiB vs 180 GB is 0.5 %; 8 vs 12 GB is 33 %.
MEMORY_MATCH_TOLERANCE = 0.08


class HardwareEntry(Frozen):
    """One device of the catalog. Units are in the field names; see docs/hardware.md."""

    id: str = Field(pattern=_ID_RE)
    name: str
    vendor: Vendor
    backend: GpuBackend
    segment: Segment
    architecture: str
    aliases: tuple[str, ...] = ()
    smi_name_examples: tuple[str, ...] = Field(default=(), description="names as the vendor tool prints them")
    chip: str | None = Field(default=None, description="Apple: sysctl machdep.cpu.brand_string")
    gpu_cores: tuple[int, ...] = Field(default=(), description="Apple: GPU core counts sold with this memory")
    memory_gb_marketed: float = Field(gt=0)
    memory_gib: float = Field(
        gt=0, description="what the driver gives: driver_total_mib / 1024 where observed"
    )
    driver_total_mib: int | None = Field(default=None, gt=0, description="nvidia-smi memory.total observed")
    memory_type: str | None = None
    bandwidth_gbps: float | None = Field(default=None, gt=0)
    bf16_tensor_tflops_dense: float | None = Field(default=None, gt=0)
    fp16_tensor_tflops_dense: float | None = Field(default=None, gt=0)
    fp32_tflops: float | None = Field(default=None, gt=0)
    bf16_supported: bool
    fp8_supported: bool | None = None
    compute_capability: str | None = Field(default=None, pattern=r"^\d+\.\d+$")
    gfx_target: str | None = Field(default=None, pattern=r"^gfx[0-9a-f]+$")
    context_mib: int = Field(ge=0, le=2048, description="CUDA/HIP context of this generation")
    idle_used_mib: int | None = Field(default=None, ge=0, description="total - free observed at idle")
    working_set_observed_mib: float | None = Field(
        default=None, gt=0, description="Apple recommendedMaxWorkingSetSize"
    )
    mig_profiles_mib: dict[str, int] = Field(default_factory=dict)
    notes: tuple[str, ...] = ()
    sources: dict[str, tuple[str, ...]]

    @model_validator(mode="after")
    def _check(self) -> HardwareEntry:
        if _VENDOR_BACKEND[self.vendor] != self.backend:
            raise ValueError(
                f"vendor {self.vendor} runs on {_VENDOR_BACKEND[self.vendor]}, not {self.backend}"
            )
        if self.backend == "cuda" and self.compute_capability is None:
            raise ValueError("a CUDA device needs its compute_capability")
        if self.backend == "mps" and (self.chip is None or not self.chip.startswith("Apple M")):
            raise ValueError("an Apple entry needs chip: the brand string, e.g. 'Apple M3 Max'")
        if self.driver_total_mib is not None and abs(self.driver_total_mib / 1024 - self.memory_gib) > 0.001:
            raise ValueError("memory_gib must equal driver_total_mib / 1024 when the driver total is known")
        if not 0.9 <= self.memory_gib / self.memory_gb_marketed <= 1.05:
            raise ValueError("memory_gib is not within 90-105 % of the marketed size: check the units")
        missing = [f for f in SOURCED_FIELDS if getattr(self, f) is not None and not self.sources.get(f)]
        if missing:
            raise ValueError(f"no source for {', '.join(missing)}")
        if any(not s.strip() for refs in self.sources.values() for s in refs):
            raise ValueError("empty source reference")
        return self

    @property
    def total_bytes(self) -> int:
        """Device memory as the driver reports it (observed MiB where known, else memory_gib)."""
        if self.driver_total_mib is not None:
            return self.driver_total_mib << 20
        return round(self.memory_gib * GIB)

    @property
    def match_keys(self) -> frozenset[str]:
        """Normalised names this entry answers to (its name and the tool's spellings of it)."""
        return frozenset(normalise_name(n) for n in (self.name, *self.smi_name_examples))


_VENDOR_WORDS = {"nvidia", "geforce", "tesla", "amd", "quadro", "apple"}


def normalise_name(name: str) -> str:
    """A device name reduced to its model tokens: vendor words, memory sizes and punctuation dropped.

    ``NVIDIA A100-SXM4-40GB`` -> ``a100 sxm4``; ``NVIDIA GeForce RTX 3060`` -> ``rtx 3060``;
    ``GeForce GTX 1080 Ti`` (older drivers print no NVIDIA prefix) -> ``gtx 1080 ti``.
    """
    tokens = re.split(r"[^a-z0-9]+", name.lower().replace("(", " ").replace(")", " "))
    kept = [t for t in tokens if t and t not in _VENDOR_WORDS and not re.fullmatch(r"\d+gb", t)]
    return " ".join(kept)


@functools.cache
def load_catalog() -> dict[str, HardwareEntry]:
    """Every catalog entry by id, validated (cached: the files do not change while we run)."""
    entries: dict[str, HardwareEntry] = {}
    for preset_id in preset_ids("hardware"):
        raw = load_preset("hardware", preset_id)
        try:
            entries[preset_id] = HardwareEntry.model_validate(raw)
        except ValueError as exc:
            first = str(exc).splitlines()
            raise FitcheckError(f"hardware preset {preset_id}: {' '.join(first[:3])}") from None
    return entries


@functools.cache
def _alias_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for entry in load_catalog().values():
        for name in (entry.id, *entry.aliases):
            if index.setdefault(name, entry.id) != entry.id:
                raise FitcheckError(f"hardware alias '{name}' is used by {index[name]} and {entry.id}")
    return index


def names() -> list[str]:
    """All ids and aliases (for suggestions)."""
    return sorted(_alias_index())


@functools.cache
def _compact_index() -> dict[str, str]:
    """Ids and aliases by their compact spelling; a spelling two entries share is left out."""
    index: dict[str, str] = {}
    shared: set[str] = set()
    for name, entry_id in _alias_index().items():
        key = compact(name)
        if index.setdefault(key, entry_id) != entry_id:
            shared.add(key)
    return {k: v for k, v in index.items() if k not in shared}


def find_entry(name: str) -> HardwareEntry | None:
    """The entry with this id or alias, or None.

    Case, spaces and punctuation do not matter (``RTX 4090``, ``rtx4090``), and a product name as
    nvidia-smi prints it (``NVIDIA GeForce RTX 4090``) finds its entry when only one has that name;
    a name several entries share (``h100``: PCIe, SXM5, NVL) finds none.
    """
    entry_id = _alias_index().get(name.strip().lower()) or _compact_index().get(compact(name))
    if entry_id:
        return load_catalog()[entry_id]
    return match_gpu(name, None) if compact(name) else None


def get_entry(name: str) -> HardwareEntry:
    """The entry with this id or alias; `NotFoundError` naming the closest ids otherwise."""
    entry = find_entry(name)
    if entry is None:
        hint = suggest(name.strip().lower(), load_catalog()) or suggest(name.strip().lower(), names())
        raise NotFoundError(
            f"unknown hardware '{name}'"
            + (f"; {hint}" if hint else "")
            + " (see `fitcheck hw list`; or give a size: 24GB, 36GB-unified)"
        )
    return entry


def entries(backend: Backend | None = None) -> list[HardwareEntry]:
    """Catalog entries, optionally of one backend, in a stable order (vendor, segment, memory, id)."""
    order = {"nvidia": 0, "amd": 1, "apple": 2}
    chosen = [e for e in load_catalog().values() if backend is None or e.backend == backend]
    return sorted(chosen, key=lambda e: (order[e.vendor], e.segment, e.memory_gib, e.id))


def match_gpu(name: str, total_bytes: int | None, vendor: str | None = None) -> HardwareEntry | None:
    """The catalog entry for a detected GPU: normalised name first, then memory size decides.

    Exact name matches come first (``NVIDIA H100 80GB HBM3`` is an example of the SXM5 entry);
    otherwise an entry whose model tokens all appear in the detected name, in order. Among the
    candidates the one whose memory is nearest to the detected total (or to a size in the name)
    wins, within `MEMORY_MATCH_TOLERANCE`; with neither, only an unambiguous candidate is returned.
    """
    key = normalise_name(name)
    pool = [
        e for e in load_catalog().values() if e.backend != "mps" and (vendor is None or e.vendor == vendor)
    ]
    exact = [e for e in pool if key in e.match_keys]
    candidates = exact or [e for e in pool if any(_contains(key, k) for k in e.match_keys)]
    if total_bytes is None:  # the name may carry the size: "Tesla V100-SXM2-32GB"
        size = re.search(r"(\d+)\s*GB", name, re.IGNORECASE)
        total_bytes = int(size.group(1)) << 30 if size else None
    return _by_memory(candidates, total_bytes)


#: Tokens a tool may add to a catalog name without making it another product (form factor, memory
#: type). Anything else ("laptop", "nvl", "max-q") is a different card and must not match loosely.
_NEUTRAL_TOKENS = frozenset({"pcie", "sxm", "sxm2", "sxm4", "sxm5", "oam", "hbm2", "hbm2e", "hbm3", "hbm3e"})


def _contains(detected: str, key: str) -> bool:
    """``key``'s tokens appear in ``detected`` as a contiguous run, the rest being neutral tokens.

    So 'rx 7900 xt' is not in 'rx 7900 xtx', and 'h200' is not 'h200 nvl' (another product).
    """
    d, k = detected.split(), key.split()
    for i in range(len(d) - len(k) + 1):
        if k and d[i : i + len(k)] == k and set(d[:i] + d[i + len(k) :]) <= _NEUTRAL_TOKENS:
            return True
    return False


def _by_memory(candidates: list[HardwareEntry], total_bytes: int | None) -> HardwareEntry | None:
    if not candidates:
        return None
    if total_bytes is None:
        return candidates[0] if len({c.id for c in candidates}) == 1 else None
    best = min(candidates, key=lambda e: abs(e.total_bytes - total_bytes))
    if abs(best.total_bytes - total_bytes) > MEMORY_MATCH_TOLERANCE * best.total_bytes:
        return None
    return best


def match_apple(chip: str, memory_bytes: int) -> HardwareEntry | None:
    """The Apple entry for a chip brand string (``Apple M3 Max``) and hw.memsize in bytes."""
    want = chip.strip().lower()
    same_chip = [e for e in load_catalog().values() if e.chip and e.chip.lower() == want]
    exact = [e for e in same_chip if e.total_bytes == memory_bytes]
    return exact[0] if exact else None
