"""What the probes observed, as data: devices, memory figures and how each was measured.

Every byte count is an integer ending in ``_bytes``; ``None`` means the tool did not report it
(``[N/A]``, an older driver without the field). ``method`` says which tool or file a figure came
from, so ``fitcheck hw`` can show how each number was measured.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from fitcheck.models import Backend, Frozen

Vendor = Literal["nvidia", "amd", "apple", "cpu"]


class ProbeStep(Frozen):
    """One thing a probe tried, and what came of it (shown by ``fitcheck hw``)."""

    probe: str
    command: str
    outcome: str


class MigInstance(Frozen):
    """One MIG device of a GPU (a CUDA process sees only its slice)."""

    index: int
    profile: str = ""
    total_bytes: int = Field(ge=0)
    used_bytes: int | None = None
    free_bytes: int | None = None


class GpuDevice(Frozen):
    """A discrete accelerator (NVIDIA or AMD) as reported by its driver tool."""

    index: int
    vendor: Vendor
    backend: Backend
    name: str
    bus_id: str | None = None
    total_bytes: int = Field(ge=0)
    used_bytes: int | None = None
    free_bytes: int | None = None
    reserved_bytes: int | None = Field(default=None, description="driver/firmware reservation")
    compute_capability: str | None = None
    gfx_target: str | None = None
    driver_version: str | None = None
    mig_enabled: bool = False
    mig_instances: tuple[MigInstance, ...] = ()
    display_active: bool | None = None
    catalog_id: str | None = None
    method: str


class AppleFacts(Frozen):
    """An Apple-silicon Mac: chip, unified memory and the GPU working-set limit when known."""

    chip: str
    memory_bytes: int = Field(gt=0)
    wired_limit_mib: int | None = Field(default=None, description="iogpu.wired_limit_mb; 0 = macOS default")
    recommended_max_bytes: int | None = Field(default=None, description="torch.mps.recommended_max_memory()")
    arm64_hardware: bool = True
    python_machine: str = "arm64"
    catalog_id: str | None = None
    method: str

    @property
    def rosetta(self) -> bool:
        """An x86_64 Python on Apple-silicon hardware: runs under Rosetta and cannot use MPS."""
        return self.arm64_hardware and self.python_machine == "x86_64"


class CpuMemory(Frozen):
    """System RAM available to this process, with a container's cgroup limit applied."""

    total_bytes: int = Field(gt=0)
    available_bytes: int = Field(ge=0, description="MemAvailable (psutil: available)")
    cgroup_limit_bytes: int | None = None
    cgroup_used_bytes: int | None = None
    method: str

    @property
    def usable_bytes(self) -> int:
        """Available RAM, capped by what the cgroup still allows (limit minus current use)."""
        if self.cgroup_limit_bytes is None:
            return self.available_bytes
        room = max(0, self.cgroup_limit_bytes - (self.cgroup_used_bytes or 0))
        return min(self.available_bytes, room)


class Detection(Frozen):
    """The result of probing this machine: the first backend found, in the order NVIDIA, AMD, Apple, CPU."""

    backend: Backend
    gpus: tuple[GpuDevice, ...] = ()
    apple: AppleFacts | None = None
    cpu: CpuMemory | None = None
    steps: tuple[ProbeStep, ...] = ()
    warnings: tuple[str, ...] = ()
