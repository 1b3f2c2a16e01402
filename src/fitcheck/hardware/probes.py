"""Detect this machine's accelerators and memory, in the order NVIDIA, AMD, Apple, CPU.

Every probe does I/O only through a `ProbeEnv` (commands, files, optional modules), so tests
replay real captured tool output with no hardware. A missing tool, an unloaded driver or a
broken optional package means "not this backend", never a crash. torch is used only when the
caller asks (``ProbeEnv.use_torch``): ``torch.cuda.mem_get_info`` creates a CUDA context of
hundreds of MiB in this process, and importing torch takes seconds.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from fitcheck.hardware import parse
from fitcheck.hardware.detected import AppleFacts, CpuMemory, Detection, GpuDevice, MigInstance, ProbeStep
from fitcheck.hardware.env import RC_NOT_FOUND, RC_TIMEOUT, ProbeEnv

#: Fields asked of nvidia-smi. memory.reserved (newer drivers) makes used + free + reserved = total;
#: mig.mode.current says whether to size against a MIG slice; display_active flags a desktop GPU.
SMI_FIELDS: tuple[str, ...] = (
    "index",
    "pci.bus_id",
    "name",
    "memory.total",
    "memory.reserved",
    "memory.used",
    "memory.free",
    "compute_cap",
    "driver_version",
    "mig.mode.current",
    "display_active",
)
#: What every nvidia-smi that has --query-gpu understands; the last resort on an unknown rc 2.
SMI_MINIMAL: tuple[str, ...] = ("index", "name", "memory.total", "memory.used", "memory.free")
SMI_FORMAT = "--format=csv,noheader,nounits"
#: nvidia-smi exit codes (man page): 9 driver not loaded, 12 NVML library missing, 14 infoROM corrupted.
RC_DRIVER_NOT_LOADED = 9
RC_INFOROM = 14
RC_INVALID_ARGUMENT = 2
_DRIVER_DOWN = ("couldn't communicate with the NVIDIA driver", "Failed to initialize NVML")

#: AMD integrated GPUs (APUs) that rocm-smi lists beside discrete cards; filtered like llmfit does.
#: gfx1036 = Raphael (LocalAI PR #7761 shows it at 64 MiB); the others are Rembrandt/Phoenix/Strix
#: Point APUs and the Vega-based gfx90c. Strix Halo (gfx1151) is kept: it is a real training target.
AMD_IGPU_GFX = frozenset({"gfx90c", "gfx1035", "gfx1036", "gfx1037", "gfx1103", "gfx1150", "gfx1152"})
#: A carve-out this small is an iGPU whatever its name.
AMD_IGPU_MAX_BYTES = 2 << 30


@dataclass
class Found:
    """What one probe found, with the steps it took and warnings for the user."""

    gpus: list[GpuDevice] = field(default_factory=list)
    steps: list[ProbeStep] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def extend(self, other: Found) -> None:
        self.steps += other.steps
        self.warnings += other.warnings


# --------------------------------------------------------------------------------------------- NVIDIA


def probe_nvidia(env: ProbeEnv) -> Found:
    """NVIDIA GPUs: torch (only when asked), else NVML (nvidia-ml-py, if installed), else nvidia-smi."""
    found = Found()
    if env.use_torch:
        torch_found = probe_torch_cuda(env, want_hip=False)
        found.extend(torch_found)
        if torch_found.gpus:
            found.gpus = torch_found.gpus
            return found
    nvml = env.module("pynvml")
    if nvml is not None:
        nvml_found = probe_nvml(nvml)
        found.extend(nvml_found)
        if nvml_found.gpus:
            found.gpus = nvml_found.gpus
            return found
    smi = probe_nvidia_smi(env)
    found.extend(smi)
    found.gpus = smi.gpus
    return found


def run_smi_query(env: ProbeEnv) -> tuple[tuple[str, ...], int, str, str, list[ProbeStep]]:
    """Run ``nvidia-smi --query-gpu``, retrying without the fields an older driver refuses.

    nvidia-smi answers an unknown field with ``Field "X" is not a valid field to query.`` and
    exit code 2 (e.g. ``memory.reserved`` before it existed, ``compute_cap`` on driver 470);
    those fields are dropped and the query repeated. An rc 2 naming no field falls back to the
    minimal field set.
    """
    fields = SMI_FIELDS
    steps: list[ProbeStep] = []
    rc, out, err = RC_NOT_FOUND, "", ""
    for _ in range(len(SMI_FIELDS)):
        cmd = ["nvidia-smi", "--query-gpu=" + ",".join(fields), SMI_FORMAT]
        rc, out, err = env.run(cmd)
        refused = [f for f in parse.invalid_smi_fields(out + "\n" + err) if f in fields]
        if refused and not set(refused) & set(SMI_MINIMAL[:3]):
            steps.append(
                ProbeStep(probe="nvidia-smi", command=" ".join(cmd), outcome=f"refused {', '.join(refused)}")
            )
            fields = tuple(f for f in fields if f not in refused)
            continue
        if rc == RC_INVALID_ARGUMENT and not refused and fields != SMI_MINIMAL:
            steps.append(
                ProbeStep(probe="nvidia-smi", command=" ".join(cmd), outcome="rc 2; retrying minimal fields")
            )
            fields = SMI_MINIMAL
            continue
        steps.append(ProbeStep(probe="nvidia-smi", command=" ".join(cmd), outcome=f"rc {rc}"))
        break
    return fields, rc, out, err, steps


def probe_nvidia_smi(env: ProbeEnv) -> Found:
    """NVIDIA GPUs from nvidia-smi; a missing binary or unloaded driver is "no NVIDIA GPU"."""
    fields, rc, out, err, steps = run_smi_query(env)
    found = Found(steps=steps)
    rows = parse.parse_smi_csv(fields, out)
    gpus = [g for g in (_smi_row_to_gpu(r) for r in rows) if g is not None]
    last = steps[-1]
    if not gpus:
        found.steps[-1] = last.model_copy(update={"outcome": _smi_failure(rc, out, err)})
        if rc not in (0, RC_NOT_FOUND) or _driver_down(out + err):
            found.warnings.append(f"nvidia-smi is installed but gave no GPU: {_smi_failure(rc, out, err)}")
        return found
    found.steps[-1] = last.model_copy(update={"outcome": f"rc {rc}: {len(gpus)} GPU(s)"})
    if rc != 0:
        why = "infoROM is corrupted" if rc == RC_INFOROM else parse.first_line(out + "\n" + err)
        found.warnings.append(f"nvidia-smi exited with {rc} ({why}) but its output parsed; figures kept")
    if any(g.mig_enabled for g in gpus):
        gpus = _with_mig(env, gpus, found)
    if "memory.reserved" not in fields:
        found.warnings.append("this driver does not report memory.reserved; free memory is taken as reported")
    found.gpus = gpus
    return found


def _smi_failure(rc: int, out: str, err: str) -> str:
    if rc == RC_NOT_FOUND:
        return "nvidia-smi not found: no NVIDIA GPU"
    if rc == RC_TIMEOUT:
        return "nvidia-smi did not answer in time"
    if rc == RC_DRIVER_NOT_LOADED or _driver_down(out + err):
        return "NVIDIA driver not loaded: " + (parse.first_line(out + "\n" + err) or f"rc {rc}")
    return f"rc {rc}: " + (parse.first_line(out + "\n" + err) or "no GPU listed")


def _driver_down(text: str) -> bool:
    return any(marker in text for marker in _DRIVER_DOWN)


def _smi_row_to_gpu(row: dict[str, str | None]) -> GpuDevice | None:
    total = parse.mib_to_bytes(row.get("memory.total"))
    index = row.get("index")
    if total is None or row.get("name") is None or index is None or not index.isdigit():
        return None
    display = row.get("display_active")
    return GpuDevice(
        index=int(index),
        vendor="nvidia",
        backend="cuda",
        name=str(row["name"]),
        total_bytes=total,
        used_bytes=parse.mib_to_bytes(row.get("memory.used")),
        free_bytes=parse.mib_to_bytes(row.get("memory.free")),
        reserved_bytes=parse.mib_to_bytes(row.get("memory.reserved")),
        compute_capability=row.get("compute_cap"),
        driver_version=row.get("driver_version"),
        mig_enabled=(row.get("mig.mode.current") or "").lower() == "enabled",
        display_active=None if display is None else display.lower() == "enabled",
        bus_id=row.get("pci.bus_id"),
        method="nvidia-smi --query-gpu (MiB)",
    )


def _with_mig(env: ProbeEnv, gpus: list[GpuDevice], found: Found) -> list[GpuDevice]:
    """Attach MIG instances (memory from ``nvidia-smi -q``, profile names from ``-L``)."""
    rc_q, out_q, _ = env.run(["nvidia-smi", "-q"])
    rc_l, out_l, _ = env.run(["nvidia-smi", "-L"])
    found.steps.append(
        ProbeStep(probe="nvidia-smi", command="nvidia-smi -q", outcome=f"rc {rc_q} (MIG devices)")
    )
    found.steps.append(
        ProbeStep(probe="nvidia-smi", command="nvidia-smi -L", outcome=f"rc {rc_l} (MIG profiles)")
    )
    by_bus = parse.parse_smi_q_mig(out_q)
    names = parse.parse_smi_list_mig(out_l)
    result = []
    for gpu in gpus:
        bus = (gpu.bus_id or "").upper()
        blocks = by_bus.get(bus) or (list(by_bus.values())[gpu.index] if len(by_bus) > gpu.index else [])
        instances = tuple(
            MigInstance(
                index=b["index"] if b["index"] is not None else i,
                profile=names.get((gpu.index, b["index"] if b["index"] is not None else i), ""),
                total_bytes=b["total"] or 0,
                used_bytes=b["used"],
                free_bytes=b["free"],
            )
            for i, b in enumerate(blocks)
            if b["total"]
        )
        if gpu.mig_enabled and not instances:
            found.warnings.append(f"GPU {gpu.index} is in MIG mode but no MIG device was listed")
        result.append(gpu.model_copy(update={"mig_instances": instances}))
    return result


def probe_nvml(nvml: ModuleType) -> Found:
    """NVIDIA GPUs through NVML (nvidia-ml-py): no CUDA context, v2 memory info when available."""
    found = Found()
    try:
        nvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        found.steps.append(ProbeStep(probe="nvml", command="nvmlInit", outcome=f"unavailable: {exc}"))
        return found
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        count = int(nvml.nvmlDeviceGetCount())
        gpus = [_nvml_device(nvml, i, driver) for i in range(count)]
    except Exception as exc:  # any NVML failure: fall back to nvidia-smi
        found.steps.append(ProbeStep(probe="nvml", command="nvmlDeviceGet*", outcome=f"failed: {exc}"))
        return found
    finally:
        _quietly(nvml.nvmlShutdown)
    found.steps.append(
        ProbeStep(probe="nvml", command="nvmlDeviceGetMemoryInfo", outcome=f"{len(gpus)} GPU(s)")
    )
    found.gpus = gpus
    return found


def _nvml_device(nvml: ModuleType, index: int, driver: str) -> GpuDevice:
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    total, used, free, reserved, version = _nvml_memory(nvml, handle)
    major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
    mig = _nvml_mig(nvml, handle)
    return GpuDevice(
        index=index,
        vendor="nvidia",
        backend="cuda",
        name=_text(nvml.nvmlDeviceGetName(handle)),
        total_bytes=total,
        used_bytes=used,
        free_bytes=free,
        reserved_bytes=reserved,
        compute_capability=f"{major}.{minor}",
        driver_version=driver,
        mig_enabled=mig is not None,
        mig_instances=mig or (),
        method=f"NVML nvmlDeviceGetMemoryInfo {version} (bytes)",
    )


def _nvml_memory(nvml: ModuleType, handle: Any) -> tuple[int, int, int, int | None, str]:
    """(total, used, free, reserved, version). v1 counts the driver's reservation as used."""
    try:
        info = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
        return int(info.total), int(info.used), int(info.free), int(info.reserved), "v2"
    except Exception:  # old bindings (TypeError) or NotSupported (GB10)
        info = nvml.nvmlDeviceGetMemoryInfo(handle)
        return int(info.total), int(info.used), int(info.free), None, "v1"


def _nvml_mig(nvml: ModuleType, handle: Any) -> tuple[MigInstance, ...] | None:
    """MIG instances, or None when MIG is off or unsupported (GeForce)."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except Exception:  # NotSupported on GPUs without MIG
        return None
    if int(current) != 1:
        return None
    instances = []
    for j in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
        except Exception:  # an empty slot (NVML_ERROR_NOT_FOUND)
            continue
        info = nvml.nvmlDeviceGetMemoryInfo(mig)
        m = re.search(r"MIG\s+(\S+)$", _text(nvml.nvmlDeviceGetName(mig)))
        instances.append(
            MigInstance(
                index=j,
                profile=m.group(1) if m else "",
                total_bytes=int(info.total),
                used_bytes=int(info.used),
                free_bytes=int(info.free),
            )
        )
    return tuple(instances)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _quietly(fn: Any) -> None:
    with contextlib.suppress(Exception):  # shutdown failures do not matter
        fn()


def probe_torch_cuda(env: ProbeEnv, want_hip: bool) -> Found:
    """GPUs seen by torch in this process (only when asked: it creates a CUDA context here)."""
    found = Found()
    torch = env.module("torch")
    if torch is None:
        found.steps.append(ProbeStep(probe="torch", command="import torch", outcome="not installed"))
        return found
    try:
        is_hip = bool(getattr(torch.version, "hip", None))
        if is_hip != want_hip or not torch.cuda.is_available():
            found.steps.append(
                ProbeStep(probe="torch", command="torch.cuda.is_available()", outcome="no device")
            )
            return found
        found.gpus = [_torch_device(torch, i, is_hip) for i in range(torch.cuda.device_count())]
    except Exception as exc:  # a broken CUDA/HIP install must not break detection
        found.steps.append(ProbeStep(probe="torch", command="torch.cuda", outcome=f"failed: {exc}"))
        found.gpus = []
        return found
    found.steps.append(
        ProbeStep(probe="torch", command="torch.cuda.mem_get_info", outcome=f"{len(found.gpus)} GPU(s)")
    )
    return found


def _torch_device(torch: Any, i: int, is_hip: bool) -> GpuDevice:
    free, total = torch.cuda.mem_get_info(i)
    props = torch.cuda.get_device_properties(i)
    return GpuDevice(
        index=i,
        vendor="amd" if is_hip else "nvidia",
        backend="rocm" if is_hip else "cuda",
        name=str(props.name),
        total_bytes=int(total),
        used_bytes=int(total) - int(free),
        free_bytes=int(free),
        compute_capability=None if is_hip else f"{props.major}.{props.minor}",
        gfx_target=getattr(props, "gcnArchName", None) if is_hip else None,
        method="torch.cuda.mem_get_info (bytes; this process now holds a CUDA context)",
    )


# ------------------------------------------------------------------------------------------------ AMD


def probe_amd(env: ProbeEnv) -> Found:
    """AMD GPUs: rocm-smi, else amd-smi, else torch.version.hip (when asked); iGPUs filtered."""
    found = Found()
    cmd = ["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"]
    rc, out, err = env.run(cmd)
    cards = parse.parse_rocm_smi_json(out)
    method = "rocm-smi --showmeminfo vram --json (bytes)"
    found.steps.append(
        ProbeStep(probe="rocm-smi", command=" ".join(cmd), outcome=_amd_outcome(rc, cards, out, err))
    )
    if not cards:
        cmd = ["amd-smi", "metric", "--mem-usage", "--json"]
        rc, out, err = env.run(cmd)
        cards = parse.parse_amd_smi_json(out)
        method = "amd-smi metric --mem-usage --json (MB)"
        found.steps.append(
            ProbeStep(probe="amd-smi", command=" ".join(cmd), outcome=_amd_outcome(rc, cards, out, err))
        )
    if not cards and env.use_torch:
        torch_found = probe_torch_cuda(env, want_hip=True)
        found.extend(torch_found)
        found.gpus = torch_found.gpus
        return found
    for card in cards:
        if _is_igpu(card):
            found.warnings.append(f"ignored integrated GPU {card['name']} ({card['gfx'] or 'unknown gfx'})")
            continue
        total, used = card["total"], card["used"]
        found.gpus.append(
            GpuDevice(
                index=card["index"],
                vendor="amd",
                backend="rocm",
                name=card["name"],
                total_bytes=total,
                used_bytes=used,
                free_bytes=None if used is None else max(0, total - used),
                gfx_target=card["gfx"],
                method=method,
            )
        )
    return found


def _amd_outcome(rc: int, cards: list[dict[str, Any]], out: str, err: str) -> str:
    if rc == RC_NOT_FOUND:
        return "not found"
    if cards:
        return f"rc {rc}: {len(cards)} device(s)"
    return f"rc {rc}: " + (parse.first_line(out + "\n" + err) or "no device")


def _is_igpu(card: dict[str, Any]) -> bool:
    return card.get("gfx") in AMD_IGPU_GFX or int(card["total"]) < AMD_IGPU_MAX_BYTES


# ---------------------------------------------------------------------------------------------- Apple


def _sysctl(env: ProbeEnv, name: str) -> str | None:
    rc, out, _ = env.run(["sysctl", "-n", name])
    return out.strip() if rc == 0 and out.strip() else None


def probe_apple(env: ProbeEnv) -> tuple[AppleFacts | None, Found]:
    """An Apple-silicon Mac from sysctl; the Metal working set from torch only when asked."""
    found = Found()
    if env.system != "darwin":
        return None, found
    memsize = parse.parse_sysctl_int(_sysctl(env, "hw.memsize"))
    brand = _sysctl(env, "machdep.cpu.brand_string") or ""
    arm64 = parse.parse_sysctl_int(_sysctl(env, "hw.optional.arm64")) == 1
    wired = parse.parse_sysctl_int(_sysctl(env, "iogpu.wired_limit_mb"))
    found.steps.append(
        ProbeStep(
            probe="sysctl", command="sysctl -n hw.memsize machdep.cpu.brand_string ...", outcome=brand or "?"
        )
    )
    if memsize is None or not (arm64 or brand.startswith("Apple")):
        found.steps.append(
            ProbeStep(probe="sysctl", command="hw.optional.arm64", outcome="not Apple silicon")
        )
        return None, found
    facts = AppleFacts(
        chip=brand or "Apple silicon",
        memory_bytes=memsize,
        wired_limit_mib=wired,
        recommended_max_bytes=_mps_recommended(env, found),
        arm64_hardware=arm64,
        python_machine=env.machine,
        method="sysctl hw.memsize (bytes), iogpu.wired_limit_mb (MiB)",
    )
    if facts.rosetta:
        found.warnings.append(
            "this Python is x86_64 running under Rosetta on Apple silicon: PyTorch cannot use MPS here; "
            "install an arm64 Python (python3 -c 'import platform; print(platform.machine())' must say arm64)"
        )
    return facts, found


def _mps_recommended(env: ProbeEnv, found: Found) -> int | None:
    torch = env.module("torch")
    if torch is None:
        return None
    try:
        if not torch.backends.mps.is_available():
            return None
        value = int(torch.mps.recommended_max_memory())
    except Exception as exc:  # old torch without the API, or an MPS init failure
        found.steps.append(
            ProbeStep(probe="torch", command="torch.mps.recommended_max_memory()", outcome=str(exc))
        )
        return None
    found.steps.append(
        ProbeStep(probe="torch", command="torch.mps.recommended_max_memory()", outcome=str(value))
    )
    return value


# ------------------------------------------------------------------------------------------------ CPU


def probe_cpu(env: ProbeEnv) -> tuple[CpuMemory | None, Found]:
    """System RAM: /proc/meminfo MemAvailable with the cgroup limit applied, else psutil."""
    found = Found()
    text = env.read("/proc/meminfo")
    if text:
        info = parse.parse_meminfo(text)
        if "MemTotal" in info:
            avail = info.get("MemAvailable")
            if avail is None:  # kernels before 3.14
                avail = info.get("MemFree", 0) + info.get("Buffers", 0) + info.get("Cached", 0)
            limit, used, where = _cgroup_limit(env)
            method = "/proc/meminfo MemAvailable" + (f", capped by {where}" if limit is not None else "")
            found.steps.append(ProbeStep(probe="cpu", command="read /proc/meminfo", outcome=method))
            mem = CpuMemory(
                total_bytes=info["MemTotal"],
                available_bytes=avail,
                cgroup_limit_bytes=limit,
                cgroup_used_bytes=used,
                method=method,
            )
            return mem, found
    psutil = env.module("psutil")
    if psutil is not None:
        vm = psutil.virtual_memory()
        found.steps.append(ProbeStep(probe="cpu", command="psutil.virtual_memory()", outcome="ok"))
        return CpuMemory(total_bytes=int(vm.total), available_bytes=int(vm.available), method="psutil"), found
    memsize = parse.parse_sysctl_int(_sysctl(env, "hw.memsize")) if env.system == "darwin" else None
    if memsize:
        how = "sysctl hw.memsize (total; install psutil for available RAM)"
        found.steps.append(ProbeStep(probe="cpu", command="sysctl -n hw.memsize", outcome=how))
        return CpuMemory(total_bytes=memsize, available_bytes=memsize, method=how), found
    found.steps.append(ProbeStep(probe="cpu", command="read /proc/meminfo", outcome="unavailable"))
    return None, found


def _cgroup_limit(env: ProbeEnv) -> tuple[int | None, int | None, str]:
    """(limit, current use, which file) of this process's memory cgroup; v2 first, then v1."""
    path = parse.cgroup_v2_path(env.read("/proc/self/cgroup"))
    for base in dict.fromkeys((f"/sys/fs/cgroup{path}", "/sys/fs/cgroup")):
        limit = parse.parse_cgroup_bytes(env.read(f"{base}/memory.max"))
        if limit is not None:
            used = parse.parse_cgroup_bytes(env.read(f"{base}/memory.current"))
            return limit, used, f"cgroup v2 {base}/memory.max"
    base = "/sys/fs/cgroup/memory"
    limit = parse.parse_cgroup_bytes(env.read(f"{base}/memory.limit_in_bytes"))
    if limit is not None:
        used = parse.parse_cgroup_bytes(env.read(f"{base}/memory.usage_in_bytes"))
        return limit, used, f"cgroup v1 {base}/memory.limit_in_bytes"
    return None, None, ""


# ------------------------------------------------------------------------------------------- detection


def detect(env: ProbeEnv) -> Detection:
    """Probe in the order NVIDIA, AMD, Apple, CPU; the first that finds a device decides the backend.

    System RAM is always reported too (``cpu``), because it bounds CPU offload and data loading.
    """
    steps: list[ProbeStep] = []
    warnings: list[str] = []
    cpu, cpu_found = probe_cpu(env)
    gpus: list[GpuDevice] = []
    backend = "cpu"
    apple = None
    for probe, name in ((probe_nvidia, "cuda"), (probe_amd, "rocm")):
        found = probe(env)
        steps += found.steps
        warnings += found.warnings
        if found.gpus:
            gpus, backend = found.gpus, name
            break
    if not gpus:
        apple, apple_found = probe_apple(env)
        steps += apple_found.steps
        warnings += apple_found.warnings
        if apple is not None:
            backend = "mps"
    steps += cpu_found.steps
    warnings += cpu_found.warnings
    return Detection(
        backend=backend,  # type: ignore[arg-type]
        gpus=tuple(gpus),
        apple=apple,
        cpu=cpu,
        steps=tuple(steps),
        warnings=parse.dedupe(warnings),
    )
