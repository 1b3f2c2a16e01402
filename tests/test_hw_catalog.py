"""The hardware catalog: every entry validates, ids and aliases resolve, detected names match."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fitcheck.errors import NotFoundError
from fitcheck.facts.context import HOPPER_CONTEXT_MIB
from fitcheck.hardware import catalog
from fitcheck.hardware.catalog import HardwareEntry, normalise_name
from fitcheck.presets import load_preset, preset_ids, presets_root

MIB = 1 << 20
GIB = 1 << 30
IDS = preset_ids("hardware")
DOCS = Path(__file__).resolve().parent.parent / "docs" / "hardware.md"
_REF_RE = re.compile(
    r"^(https?://\S+|derived: .+|convention: .+|rule: .+|measured: tests/data/measured/.+|"
    r"public code index: .+|[\w.-]+/[\w.-]+@\w+:\S+)"
)


def test_catalog_is_large_enough() -> None:
    entries = catalog.load_catalog()
    assert len(entries) >= 60
    assert {e.vendor for e in entries.values()} == {"nvidia", "amd", "apple"}
    assert {e.segment for e in entries.values() if e.vendor == "nvidia"} == {
        "consumer",
        "workstation",
        "datacenter",
    }


@pytest.mark.parametrize("preset_id", IDS)
def test_entry_validates(preset_id: str) -> None:
    raw = load_preset("hardware", preset_id)
    entry = HardwareEntry.model_validate(raw)
    assert entry.id == preset_id == (presets_root() / "hardware" / f"{preset_id}.yaml").stem
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9.]+)*", entry.id)
    # units sane: binary memory between 4 GiB and 1 TiB, bandwidth and TFLOPS in plausible ranges
    assert 4 <= entry.memory_gib <= 1024
    assert entry.bandwidth_gbps is None or 50 <= entry.bandwidth_gbps <= 10_000
    for tflops in (entry.bf16_tensor_tflops_dense, entry.fp16_tensor_tflops_dense, entry.fp32_tflops):
        assert tflops is None or 1 <= tflops <= 5_000
    if entry.fp32_tflops and entry.bf16_tensor_tflops_dense:
        assert entry.bf16_tensor_tflops_dense >= entry.fp32_tflops  # tensor cores never slower than FP32
    if entry.backend == "cuda" and str(entry.compute_capability).startswith("9."):
        assert entry.context_mib == HOPPER_CONTEXT_MIB  # measured on this project's H200 (test below)
    elif entry.backend == "cuda":
        assert 300 <= entry.context_mib <= 600  # the generation's bare CUDA context, ~0.3-0.6 GiB
    if entry.backend == "cuda":
        assert entry.bf16_supported == (float(entry.compute_capability or 0) >= 8.0)
    # every figure names its source, and every source reads as a reference
    for field in catalog.SOURCED_FIELDS:
        if getattr(entry, field) is not None:
            assert entry.sources.get(field), field
    for field, refs in entry.sources.items():
        assert field in HardwareEntry.model_fields, f"source for unknown field {field}"
        for ref in refs:
            assert _REF_RE.match(ref), ref


def test_aliases_are_unique_and_resolve() -> None:
    names = catalog.names()
    assert len(names) == len(set(names))
    for name in names:
        assert catalog.get_entry(name).id in catalog.load_catalog()


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("rtx-4090", "rtx-4090"),
        ("4090", "rtx-4090"),
        ("RTX-4090", "rtx-4090"),
        ("rtx-3060-12gb", "rtx-3060-12gb"),
        ("rtx-3060-8gb", "rtx-3060-8gb"),
        ("a100-pcie-80gb", "a100-pcie-80gb"),
        ("a100-sxm4-40gb", "a100-sxm4-40gb"),
        ("a100-80gb", "a100-sxm4-80gb"),  # alias of the common (SXM) part
        ("h100-80gb", "h100-sxm5-80gb"),
        ("apple-m3-max-36gb", "apple-m3-max-36gb"),
        ("apple-m1-pro-16gb", "apple-m1-pro-16gb"),
        ("apple-m2-ultra-192gb", "apple-m2-ultra-192gb"),
        ("apple-m1-16gb", "apple-m1-16gb"),
        ("mi300x", "mi300x"),
        ("rx-7900-xtx", "rx-7900-xtx"),
    ],
)
def test_lookup(name: str, expected: str) -> None:
    assert catalog.get_entry(name).id == expected


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("RTX 4090", "rtx-4090"),  # spaces and case
        ("rtx4090", "rtx-4090"),  # no hyphen
        ("NVIDIA GeForce RTX 4090", "rtx-4090"),  # as nvidia-smi prints it
        ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
        ("Tesla V100-SXM2-32GB", "v100-sxm2-32gb"),
        ("H100 NVL", "h100-nvl"),
        ("h100", None),  # PCIe 80 GB, SXM5 80 GB or NVL 94 GB: refused, not guessed
        ("a100", None),
        ("rtx 4090 laptop", None),  # another product, not a spelling
        ("---", None),
    ],
)
def test_lookup_forgives_spelling_not_ambiguity(name: str, expected: str | None) -> None:
    entry = catalog.find_entry(name)
    assert (entry.id if entry else None) == expected


def test_every_id_resolves_without_its_punctuation() -> None:
    for entry_id in catalog.load_catalog():
        assert catalog.find_entry(entry_id.replace("-", " ").upper()).id == entry_id  # type: ignore[union-attr]


def test_unknown_id_suggests_closest() -> None:
    with pytest.raises(NotFoundError, match=r"did you mean .*rtx-4090") as err:
        catalog.get_entry("rtx-4091")
    assert "\n" not in str(err.value)


APPLE_CHIPS = [
    f"Apple M{g}{tier}"
    for g in range(1, 5)
    for tier in ("", " Pro", " Max", " Ultra")
    if (g, tier) != (4, " Ultra")
]


@pytest.mark.parametrize("chip", APPLE_CHIPS)
def test_every_apple_chip_has_its_memory_options(chip: str) -> None:
    sizes = sorted(e.memory_gib for e in catalog.load_catalog().values() if e.chip == chip)
    assert sizes, chip
    for size in sizes:
        entry = catalog.match_apple(chip, int(size) * GIB)
        assert entry is not None and entry.id.endswith(f"-{int(size)}gb")


# Every smi_name_examples string of the research catalog (hardware_catalog.yaml), with the
# memory.total it was observed with where the catalog has one, and the entry it must match.
REFERENCE_SMI_NAMES = [
    ("GeForce GTX 1080 Ti", None, "gtx-1080-ti"),
    ("GeForce RTX 2080 Ti", None, "rtx-2080-ti"),
    ("NVIDIA GeForce RTX 2080 Ti", None, "rtx-2080-ti"),
    ("NVIDIA GeForce RTX 3060", 12288, "rtx-3060-12gb"),
    ("NVIDIA GeForce RTX 3090", 24576, "rtx-3090"),
    ("NVIDIA GeForce RTX 4070", 12282, "rtx-4070"),
    ("NVIDIA GeForce RTX 4080 SUPER", 16376, "rtx-4080-super"),
    ("NVIDIA GeForce RTX 4090", 24564, "rtx-4090"),
    ("NVIDIA GeForce RTX 5090", 32607, "rtx-5090"),
    ("NVIDIA RTX PRO 6000 Blackwell Workstation Edition", 97887, "rtx-pro-6000-blackwell"),
    ("Tesla V100-SXM2-32GB", None, "v100-sxm2-32gb"),
    ("NVIDIA A10G", 23028, "a10g"),
    ("NVIDIA L40S", 46068, "l40s"),
    ("NVIDIA A100-SXM4-40GB", 40960, "a100-sxm4-40gb"),
    ("NVIDIA H100 80GB HBM3", 81559, "h100-sxm5-80gb"),
    ("NVIDIA H100 NVL", 95330, "h100-nvl"),
    ("NVIDIA H200", 143771, "h200"),
    ("NVIDIA B200", 183359, "b200"),
    ("AMD Instinct MI300X OAM", None, "mi300x"),
]


@pytest.mark.parametrize(("name", "total_mib", "expected"), REFERENCE_SMI_NAMES)
def test_reference_smi_names_match(name: str, total_mib: int | None, expected: str) -> None:
    entry = catalog.match_gpu(name, None if total_mib is None else total_mib * MIB)
    assert entry is not None and entry.id == expected


@pytest.mark.parametrize("entry_id", [e.id for e in catalog.entries() if e.smi_name_examples])
def test_own_smi_names_match_own_entry(entry_id: str) -> None:
    entry = catalog.get_entry(entry_id)
    for name in entry.smi_name_examples:
        assert catalog.match_gpu(name, entry.total_bytes).id == entry_id  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "total_mib", "expected"),
    [
        ("NVIDIA GeForce RTX 3060", 12288, "rtx-3060-12gb"),  # same name, memory decides
        ("NVIDIA GeForce RTX 3060", 8192, "rtx-3060-8gb"),
        ("NVIDIA GeForce RTX 3060", None, None),  # ambiguous without memory
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-sxm4-80gb"),
        ("NVIDIA A100-SXM4-40GB", 40960, "a100-sxm4-40gb"),
        ("NVIDIA A100 80GB PCIe", 81920, "a100-pcie-80gb"),
        ("NVIDIA A100-PCIE-40GB", 40960, "a100-pcie-40gb"),
        ("NVIDIA GeForce RTX 3080", 10240, "rtx-3080-10gb"),
        ("NVIDIA GeForce RTX 3080", 12288, "rtx-3080-12gb"),
        ("NVIDIA GeForce RTX 4060 Ti", 16380, "rtx-4060-ti-16gb"),
        ("NVIDIA GeForce RTX 4060 Ti", 8188, "rtx-4060-ti-8gb"),
        ("Radeon RX 7900 XT", 20464, "rx-7900-xt"),  # not the XTX
        ("Radeon RX 7900 XTX", 24560, "rx-7900-xtx"),
        ("NVIDIA H200 NVL", 143771, None),  # another product: no loose match
        ("NVIDIA GeForce RTX 4090 Laptop GPU", 16376, None),
        ("NVIDIA GeForce RTX 4090", 8192, None),  # memory far off: not this card
    ],
)
def test_match_by_name_and_memory(name: str, total_mib: int | None, expected: str | None) -> None:
    entry = catalog.match_gpu(name, None if total_mib is None else total_mib * MIB)
    assert (entry.id if entry else None) == expected


def test_normalise_name() -> None:
    assert normalise_name("NVIDIA A100-SXM4-40GB") == "a100 sxm4"
    assert normalise_name("GeForce GTX 1080 Ti") == "gtx 1080 ti"
    assert normalise_name("NVIDIA GeForce RTX 4080 SUPER") == "rtx 4080 super"


def test_apple_match_needs_exact_memory() -> None:
    assert catalog.match_apple("Apple M3 Max", 36 * GIB).id == "apple-m3-max-36gb"  # type: ignore[union-attr]
    assert catalog.match_apple("Apple M3 Max", 40 * GIB) is None
    assert catalog.match_apple("Apple processor", 16 * GIB) is None  # early macOS 11 brand string


def test_every_field_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    for field in HardwareEntry.model_fields:
        assert f"`{field}`" in text, f"docs/hardware.md does not describe {field}"


def test_hopper_context_is_the_measured_one() -> None:
    """The Hopper context line is what this project's H200 runs read beyond torch's reserved peak: the
    median of NVML's used memory minus ``max_memory_reserved`` over their setups (bench/measured.py)."""
    import statistics
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import measured

    beyond = [
        r.outside_allocator for rows in measured.load_all().values() for r in rows if r.outside_allocator
    ]
    assert len(beyond) >= 20
    assert round(statistics.median(beyond) / 2**20) == HOPPER_CONTEXT_MIB
