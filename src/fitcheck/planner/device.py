"""The target's speed: dense TFLOPS per compute dtype and memory bandwidth.

From the hardware catalog entry when the target is a catalog device (each figure there has its
source); otherwise a per-backend assumption, labelled as such in the plan. Pure functions: the
command looks the entry up (`fitcheck.hardware.catalog.find_entry`) and passes it in.
"""

from __future__ import annotations

import re

from fitcheck.hardware.catalog import HardwareEntry
from fitcheck.models import Target
from fitcheck.planner.models import DevicePerf

#: Apple does not publish GPU TFLOPS. The catalog's measured M1 (8 cores) is 2.617 TFLOPS fp32
#: (philipturner/applegpuinfo#11): 0.327 per core, used for Macs without a figure (conservative for
#: later generations, which clock higher).
APPLE_FP32_TFLOPS_PER_CORE = 2.617 / 8
APPLE_SOURCE = "derived: GPU cores x 0.327 TFLOPS (M1 8-core 2.617 TFLOPS, philipturner/applegpuinfo#11)"
#: Apple GPUs run fp16 at the fp32 rate (no double-rate fp16 ALUs; philipturner/metal-benchmarks),
#: and bf16 on M1/M2 is emulated through fp32 (transformers PR #40458): one rate for every dtype.
APPLE_EMULATED_BF16 = ("Apple M1", "Apple M2")

#: (bf16, fp16, fp32 TFLOPS, GB/s, what is assumed) when the target is not a catalog device.
DEFAULTS: dict[str, tuple[float, float, float, float, str]] = {
    "cuda": (71.0, 71.0, 35.6, 936.0, "an RTX 3090 (catalog rtx-3090: GA102 whitepaper figures)"),
    "rocm": (122.8, 122.8, 61.4, 960.0, "an RX 7900 XTX (catalog rx-7900-xtx)"),
    "mps": (2.617, 2.617, 2.617, 68.25, "an 8-core M1 (catalog apple-m1-16gb), the slowest Mac"),
    "cpu": (
        1.0,
        1.0,
        1.0,
        51.2,
        "an 8-core AVX2 desktop at 4 GHz (8 x 2 FMA x 8 fp32 lanes x 2 FLOP x 4e9 = 1.0 TFLOPS) with "
        "dual-channel DDR4-3200 (51.2 GB/s)",
    ),
}


def catalog_id(target: Target) -> str:
    """The catalog id behind a target id (``2xrtx-4090`` -> ``rtx-4090``)."""
    m = re.match(r"^\d+x(.+)$", target.id)
    return m.group(1) if m and target.gpus > 1 else target.id


def perf_from_entry(entry: HardwareEntry) -> DevicePerf:
    """Speed figures of a catalog device; a missing figure falls back to the next slower one."""
    srcs = entry.sources
    assumed: list[str] = []
    fp32 = entry.fp32_tflops
    if entry.backend == "mps":
        return _apple(entry)
    fp16 = entry.fp16_tensor_tflops_dense or entry.bf16_tensor_tflops_dense
    if fp32 is None:
        fp32 = (fp16 or DEFAULTS[entry.backend][2] * 4) / 4
        assumed.append("fp32 TFLOPS: a quarter of the fp16 tensor rate")
    if fp16 is None:
        fp16 = fp32
        assumed.append("fp16 TFLOPS: no tensor figure, the fp32 rate")
    bf16_native = entry.bf16_supported and (
        entry.backend != "cuda" or float(entry.compute_capability or 0) >= 8.0
    )
    bf16 = entry.bf16_tensor_tflops_dense or (fp16 if bf16_native else fp32)
    bw = entry.bandwidth_gbps
    if bw is None:
        bw = DEFAULTS[entry.backend][3]
        assumed.append(f"bandwidth: {bw:g} GB/s as for {DEFAULTS[entry.backend][4]}")
    cited = [
        f"{field}: {srcs[field][0]}"
        for field in ("bf16_tensor_tflops_dense", "fp16_tensor_tflops_dense", "bandwidth_gbps")
        if srcs.get(field)
    ]
    return DevicePerf(
        id=entry.id,
        name=entry.name,
        backend=entry.backend,
        bf16_tflops=bf16,
        fp16_tflops=fp16,
        fp32_tflops=fp32,
        bandwidth_gbps=bw,
        compute_capability=entry.compute_capability,
        architecture=entry.architecture,
        bf16_native=bf16_native,
        memory_bytes=entry.total_bytes,
        sources=(f"catalog presets/hardware/{entry.id}.yaml", *cited),
        assumed=tuple(assumed),
    )


def _apple(entry: HardwareEntry) -> DevicePerf:
    assumed: list[str] = ["fp16 and bf16 at the fp32 rate (Apple GPUs have no faster half-precision path)"]
    if entry.fp32_tflops is not None:
        fp32 = entry.fp32_tflops
        src = f"fp32_tflops: {entry.sources['fp32_tflops'][0]}"
    else:
        cores = min(entry.gpu_cores) if entry.gpu_cores else 8
        fp32 = round(cores * APPLE_FP32_TFLOPS_PER_CORE, 3)
        src = f"fp32 TFLOPS {APPLE_SOURCE}, {cores} cores"
        assumed.append(src)
    chip = entry.chip or ""
    native = not chip.startswith(APPLE_EMULATED_BF16)
    if native:
        assumed.append(
            "bf16 native on M3 and later (no per-chip table; only M1/M2 are documented as emulated)"
        )
    bw = entry.bandwidth_gbps or DEFAULTS["mps"][3]
    return DevicePerf(
        id=entry.id,
        name=entry.name,
        backend="mps",
        bf16_tflops=fp32,
        fp16_tflops=fp32,
        fp32_tflops=fp32,
        bandwidth_gbps=bw,
        bf16_native=native,
        chip=entry.chip,
        memory_bytes=entry.total_bytes,
        sources=(f"catalog presets/hardware/{entry.id}.yaml", src),
        assumed=tuple(assumed),
    )


def default_perf(target: Target) -> DevicePerf:
    """A target that is not a catalog device (``24GB``, ``36GB-unified``, ``cpu``): assumed figures."""
    bf16, fp16, fp32, bw, what = DEFAULTS[target.backend]
    native = target.bf16 if target.backend != "mps" else False
    return DevicePerf(
        id=target.id,
        name=target.name,
        backend=target.backend,
        bf16_tflops=bf16 if native or target.backend == "mps" else fp32,
        fp16_tflops=fp16,
        fp32_tflops=fp32,
        bandwidth_gbps=bw,
        compute_capability=None,
        bf16_native=native,
        memory_bytes=target.memory_bytes,
        sources=(f"assumed: {what}",),
        assumed=(
            f"speed of {what}: name the device (--on a catalog id, see `fitcheck hw list`) for its "
            "own figures",
            *(
                ("compute capability unknown: FlashAttention-2 (Ampere or newer) is not assumed",)
                if target.backend == "cuda"
                else ("GPU unknown: FlashAttention-2 (Instinct MI200 / MI300) is not assumed",)
                if target.backend == "rocm"
                else ()
            ),
        ),
    )
