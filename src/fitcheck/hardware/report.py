"""The data behind ``fitcheck hw`` and ``fitcheck hw list``: pydantic models, no printing.

`detect_report` probes the machine and says, for every figure, which tool measured it;
`catalog_table` lists the catalog with each device's default budget.
"""

from __future__ import annotations

from fitcheck.errors import FitcheckError, InputError
from fitcheck.hardware import catalog
from fitcheck.hardware.budget import apply_headroom, entry_target, target_from_detection
from fitcheck.hardware.detected import AppleFacts, CpuMemory, GpuDevice, ProbeStep
from fitcheck.hardware.env import ProbeEnv
from fitcheck.hardware.probes import detect
from fitcheck.models import SCHEMA_VERSION, Backend, Frozen, Target

CATALOG_BACKENDS = ("cuda", "rocm", "mps")


class HwReport(Frozen):
    """This machine: devices found, their memory, the usable budget and how each number was measured."""

    schema_version: int = SCHEMA_VERSION
    backend: Backend
    gpus: tuple[GpuDevice, ...] = ()
    apple: AppleFacts | None = None
    cpu: CpuMemory | None = None
    target: Target | None = None
    probes: tuple[ProbeStep, ...] = ()
    warnings: tuple[str, ...] = ()


class CatalogRow(Frozen):
    """One catalog device with the budget fitcheck would use for it (default headroom)."""

    id: str
    name: str
    vendor: str
    backend: Backend
    segment: str
    aliases: tuple[str, ...]
    memory_gib: float
    usable_bytes: int
    budget_bytes: int
    bandwidth_gbps: float | None
    bf16_tensor_tflops_dense: float | None
    fp32_tflops: float | None
    bf16_supported: bool


class HwCatalog(Frozen):
    """``fitcheck hw list``: the catalog, optionally filtered by backend."""

    schema_version: int = SCHEMA_VERSION
    backend: Backend | None = None
    devices: tuple[CatalogRow, ...]


def detect_report(probe_env: ProbeEnv | None = None, headroom: str | None = None) -> HwReport:
    """Probe the machine (or the injected one) and describe what was found and what is usable.

    Raises:
        InputError: a ``headroom`` that is no size or percentage (bad input is an error, not a warning).
    """
    if headroom is not None:
        from fitcheck.hardware.budget import parse_headroom

        parse_headroom(headroom, 1 << 50)  # syntax only; what the machine has is checked below
    env = probe_env or ProbeEnv.real()
    det = detect(env)
    gpus = tuple(g.model_copy(update={"catalog_id": _gpu_id(g)}) for g in det.gpus)
    apple = det.apple
    if apple is not None:
        entry = catalog.match_apple(apple.chip, apple.memory_bytes)
        apple = apple.model_copy(update={"catalog_id": entry.id if entry else None})
    warnings = list(det.warnings)
    try:
        target: Target | None = apply_headroom(target_from_detection(det, dict(env.environ)), headroom)
    except FitcheckError as exc:
        target = None
        warnings.append(f"no usable budget: {exc}")
    return HwReport(
        backend=det.backend,
        gpus=gpus,
        apple=apple,
        cpu=det.cpu,
        target=target,
        probes=det.steps,
        warnings=tuple(warnings),
    )


def _gpu_id(gpu: GpuDevice) -> str | None:
    entry = catalog.match_gpu(gpu.name, gpu.total_bytes, gpu.vendor)
    return entry.id if entry else None


def catalog_table(backend: str | None = None) -> HwCatalog:
    """The hardware catalog as rows (``fitcheck hw list [--backend cuda|rocm|mps]``, in any case)."""
    if backend is not None:
        backend = backend.strip().lower()
    if backend is not None and backend not in CATALOG_BACKENDS:
        raise InputError(f"--backend '{backend}' is not one of {', '.join(CATALOG_BACKENDS)}")
    rows = []
    for entry in catalog.entries(backend):  # type: ignore[arg-type]
        target = apply_headroom(entry_target(entry), None)
        rows.append(
            CatalogRow(
                id=entry.id,
                name=entry.name,
                vendor=entry.vendor,
                backend=entry.backend,
                segment=entry.segment,
                aliases=entry.aliases,
                memory_gib=entry.memory_gib,
                usable_bytes=target.usable_bytes,
                budget_bytes=target.budget_bytes,
                bandwidth_gbps=entry.bandwidth_gbps,
                bf16_tensor_tflops_dense=entry.bf16_tensor_tflops_dense,
                fp32_tflops=entry.fp32_tflops,
                bf16_supported=entry.bf16_supported,
            )
        )
    return HwCatalog(backend=backend, devices=tuple(rows))  # type: ignore[arg-type]
