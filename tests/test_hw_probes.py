"""Probes replay recorded machines (tests/data/hw/): no GPU, no network, no subprocess (but one)."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace
from typing import Any

import pytest

from fitcheck.hardware import parse, probes
from fitcheck.hardware.env import RC_NOT_FOUND, RC_TIMEOUT, ProbeEnv, run_command
from fitcheck.hardware.probes import detect
from hw_replay import env_from_fixture, fixture_names, load_fixture

MIB = 1 << 20
GIB = 1 << 30


@pytest.mark.parametrize("name", fixture_names())
def test_every_fixture_declares_its_provenance(name: str) -> None:
    text = (fixture_names.__globals__["DATA"] / f"{name}.yaml").read_text(encoding="utf-8")
    kind = load_fixture(name)["provenance"]["kind"]
    assert kind in {"real", "derived", "synthetic"}
    assert text.startswith(f"# {kind}:"), "first line must say real / derived / synthetic"
    assert load_fixture(name)["provenance"]["source"]


def test_h100_idle() -> None:
    det = detect(env_from_fixture("h100_idle"))
    assert det.backend == "cuda" and det.warnings == ()
    (gpu,) = det.gpus
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert (gpu.total_bytes, gpu.used_bytes, gpu.free_bytes, gpu.reserved_bytes) == (
        81559 * MIB,
        0,
        81081 * MIB,
        479 * MIB,
    )
    assert gpu.compute_capability == "9.0" and gpu.driver_version == "590.48.01"
    assert gpu.bus_id == "00000000:00:09.0" and not gpu.mig_enabled and gpu.display_active is False


def test_h200() -> None:
    (gpu,) = detect(env_from_fixture("h200_idle")).gpus
    assert (gpu.total_bytes, gpu.free_bytes, gpu.reserved_bytes) == (143771 * MIB, 143158 * MIB, 614 * MIB)


def test_rtx_4080_super_with_display() -> None:
    (gpu,) = detect(env_from_fixture("rtx4080super_display")).gpus
    assert gpu.display_active is True
    assert gpu.used_bytes == 596 * MIB
    assert gpu.mig_enabled is False  # "[N/A]" on GeForce


def test_two_identical_gpus_with_na_reserved() -> None:
    gpus = detect(env_from_fixture("rtx4090_x2")).gpus
    assert [g.index for g in gpus] == [0, 1]
    assert [g.reserved_bytes for g in gpus] == [None, None]  # [N/A]
    assert [g.used_bytes for g in gpus] == [507 * MIB, 459 * MIB]


def test_mixed_gpus_listed_individually() -> None:
    gpus = detect(env_from_fixture("mixed_4090_3090")).gpus
    assert [g.name for g in gpus] == ["NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 3090"]


def test_mig_slices_from_q_and_l() -> None:
    calls: list[str] = []
    (gpu,) = detect(env_from_fixture("h100_mig", calls=calls)).gpus
    assert gpu.mig_enabled and gpu.total_bytes == 81559 * MIB  # the physical GPU
    assert [m.profile for m in gpu.mig_instances] == ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"]
    assert [m.total_bytes // MIB for m in gpu.mig_instances] == [40448, 20096, 9984, 9984]
    assert [m.free_bytes // MIB for m in gpu.mig_instances] == [40423, 20080, 9976, 9976]
    assert "nvidia-smi -q" in calls and "nvidia-smi -L" in calls


def test_no_mig_queries_without_mig() -> None:
    calls: list[str] = []
    detect(env_from_fixture("h100_idle", calls=calls))
    assert "nvidia-smi -q" not in calls


def test_driver_not_loaded_is_no_gpu_not_a_crash() -> None:
    det = detect(env_from_fixture("driver_not_loaded"))
    assert det.backend == "cpu" and det.gpus == ()
    assert any("driver not loaded" in w for w in det.warnings)
    assert det.cpu is not None and det.cpu.available_bytes == 30000000 * 1024


def test_nvidia_smi_missing_falls_back_to_cpu() -> None:
    det = detect(env_from_fixture("no_nvidia_smi"))
    assert det.backend == "cpu" and det.warnings == ()
    outcomes = {s.probe: s.outcome for s in det.steps}
    assert outcomes["nvidia-smi"] == "nvidia-smi not found: no NVIDIA GPU"
    assert outcomes["rocm-smi"] == "not found" and outcomes["amd-smi"] == "not found"
    assert det.cpu is not None
    assert det.cpu.cgroup_limit_bytes is None  # cgroup v1 "unlimited" (9223372036854771712)
    assert det.cpu.available_bytes == 24203536 * 1024


def test_old_driver_refused_fields_are_dropped() -> None:
    calls: list[str] = []
    det = detect(env_from_fixture("old_driver_no_reserved", calls=calls))
    queries = [c for c in calls if "--query-gpu" in c]
    assert len(queries) == 4  # full, then without memory.reserved, compute_cap, display_active
    assert "memory.reserved" not in queries[-1] and "compute_cap" not in queries[-1]
    (gpu,) = det.gpus
    assert gpu.reserved_bytes is None and gpu.compute_capability is None
    assert gpu.free_bytes == 40957 * MIB
    assert any("memory.reserved" in w for w in det.warnings)


def test_rc_2_without_a_field_name_retries_minimal_fields() -> None:
    def run(cmd: Any) -> tuple[int, str, str]:
        fields = cmd[1].split("=", 1)[1].split(",")
        if fields != list(probes.SMI_MINIMAL):
            return 2, "Invalid combination of input arguments.\n", ""
        return 0, "0, NVIDIA GeForce RTX 3090, 24576, 10, 24566\n", ""

    (gpu,) = probes.probe_nvidia_smi(ProbeEnv(run=run)).gpus
    assert gpu.free_bytes == 24566 * MIB


def test_rc_14_with_usable_output_is_kept() -> None:
    det = detect(env_from_fixture("rc14_inforom"))
    assert det.backend == "cuda" and det.gpus[0].name == "NVIDIA L40S"
    assert any("exited with 14" in w for w in det.warnings)


def test_timeout_is_no_gpu_with_a_warning() -> None:
    env = ProbeEnv(
        run=lambda cmd: (RC_TIMEOUT, "", "no answer") if cmd[0] == "nvidia-smi" else (RC_NOT_FOUND, "", "")
    )
    det = detect(env)
    assert det.gpus == () and any("did not answer" in w for w in det.warnings)


def test_rocm_smi_rx_7900_xt() -> None:
    det = detect(env_from_fixture("rocm_rx7900xt"))
    assert det.backend == "rocm"
    (gpu,) = det.gpus
    assert (gpu.name, gpu.total_bytes, gpu.used_bytes) == ("Radeon RX 7900 XT", 21458059264, 27856896)
    assert gpu.free_bytes == 21458059264 - 27856896 and gpu.gfx_target == "gfx1100"


def test_rocm_igpu_is_filtered() -> None:
    det = detect(env_from_fixture("rocm_with_igpu"))
    assert [g.name for g in det.gpus] == ["Radeon RX 7900 XT"]
    assert any("Raphael" in w for w in det.warnings)


def test_amd_smi_when_rocm_smi_is_missing() -> None:
    (gpu,) = detect(env_from_fixture("amd_smi_mi300x")).gpus
    assert gpu.total_bytes == 196592 * MIB and gpu.used_bytes == 283 * MIB and gpu.backend == "rocm"


def test_mac_m3_max_36gb() -> None:
    det = detect(env_from_fixture("mac_m3_max_36gb"))
    assert det.backend == "mps" and det.warnings == ()
    assert det.apple is not None
    assert (det.apple.chip, det.apple.memory_bytes, det.apple.wired_limit_mib) == (
        "Apple M3 Max",
        36 * GIB,
        0,
    )
    assert det.apple.rosetta is False and det.apple.recommended_max_bytes is None


def test_mac_m1_16gb() -> None:
    det = detect(env_from_fixture("mac_m1_16gb"))
    assert det.apple is not None and det.apple.memory_bytes == 16 * GIB and det.apple.chip == "Apple M1"


def test_rosetta_warns() -> None:
    det = detect(env_from_fixture("mac_rosetta"))
    assert det.apple is not None and det.apple.rosetta
    assert any("Rosetta" in w and "arm64" in w for w in det.warnings)


def test_intel_mac_is_not_apple_silicon() -> None:
    commands = {
        "sysctl -n hw.memsize": "17179869184\n",
        "sysctl -n machdep.cpu.brand_string": "Intel(R) Core(TM) i7-9750H CPU @ 2.60GHz\n",
        "sysctl -n hw.optional.arm64": "0\n",
    }
    env = ProbeEnv(run=lambda cmd: (0, commands.get(" ".join(cmd), ""), ""), system="darwin")
    det = detect(env)
    assert det.backend == "cpu" and det.apple is None


def test_container_cgroup_limit_applies() -> None:
    det = detect(env_from_fixture("container_cgroup"))
    assert det.backend == "cpu" and det.cpu is not None
    assert det.cpu.available_bytes == 60 * GIB
    assert det.cpu.cgroup_limit_bytes == 8 * GIB and det.cpu.cgroup_used_bytes == 1 * GIB
    assert det.cpu.usable_bytes == 7 * GIB
    assert "cgroup v2 /sys/fs/cgroup/memory.max" in det.cpu.method


def test_cgroup_v2_nested_path_is_preferred() -> None:
    files = {
        "/proc/meminfo": "MemTotal: 16777216 kB\nMemAvailable: 8388608 kB\n",
        "/proc/self/cgroup": "0::/user.slice/job.scope\n",
        "/sys/fs/cgroup/user.slice/job.scope/memory.max": "2147483648\n",
        "/sys/fs/cgroup/user.slice/job.scope/memory.current": "0\n",
        "/sys/fs/cgroup/memory.max": "max\n",
    }
    mem, _ = probes.probe_cpu(ProbeEnv(read=files.get))
    assert mem is not None and mem.usable_bytes == 2 * GIB


def test_psutil_when_no_proc_meminfo() -> None:
    psutil = SimpleNamespace(virtual_memory=lambda: SimpleNamespace(total=32 * GIB, available=20 * GIB))
    mem, _ = probes.probe_cpu(ProbeEnv(system="win32", import_module={"psutil": psutil}.get))
    assert mem is not None and (mem.total_bytes, mem.usable_bytes, mem.method) == (
        32 * GIB,
        20 * GIB,
        "psutil",
    )


# ------------------------------------------------------------------------------------------ NVML


class _NVMLError(Exception):
    pass


def fake_nvml(*, v2: bool = True, mig: bool = False, init_fails: bool = False) -> SimpleNamespace:
    """nvidia-ml-py shaped fake, with the H100 idle figures of the exporter capture."""
    total, reserved, used, free = 81559 * MIB, 479 * MIB, 0, 81081 * MIB

    def memory_info(handle: Any, version: Any = None) -> SimpleNamespace:
        if handle != "gpu0":
            slice_total = {"mig0": 40448, "mig1": 20096}[handle] * MIB
            return SimpleNamespace(total=slice_total, used=26 * MIB, free=slice_total - 26 * MIB)
        if version is not None:
            if not v2:
                raise TypeError("nvmlDeviceGetMemoryInfo() got an unexpected keyword argument 'version'")
            return SimpleNamespace(total=total, reserved=reserved, used=used, free=free)
        return SimpleNamespace(total=total, used=used + reserved, free=free)  # v1: reserved counted as used

    def init() -> None:
        if init_fails:
            raise _NVMLError("NVML Shared Library Not Found")

    def mig_handle(handle: Any, j: int) -> str:
        if j > 1:
            raise _NVMLError("Not Found")
        return f"mig{j}"

    return SimpleNamespace(
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: b"590.48.01",
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: "gpu0",
        nvmlDeviceGetName=lambda h: (
            "NVIDIA H100 80GB HBM3" + {"mig0": " MIG 3g.40gb", "mig1": " MIG 2g.20gb"}.get(h, "")
        ),
        nvmlDeviceGetMemoryInfo=memory_info,
        nvmlMemory_v2=0x02000028,
        nvmlDeviceGetCudaComputeCapability=lambda h: (9, 0),
        nvmlDeviceGetMigMode=lambda h: (1, 1) if mig else (0, 0),
        nvmlDeviceGetMaxMigDeviceCount=lambda h: 7,
        nvmlDeviceGetMigDeviceHandleByIndex=mig_handle,
    )


def test_nvml_v2_preferred_over_nvidia_smi() -> None:
    calls: list[str] = []
    env = env_from_fixture("no_nvidia_smi", modules={"pynvml": fake_nvml()}, calls=calls)  # type: ignore[dict-item]
    det = detect(env)
    (gpu,) = det.gpus
    assert (gpu.free_bytes, gpu.reserved_bytes, gpu.used_bytes) == (81081 * MIB, 479 * MIB, 0)
    assert "v2" in gpu.method and not any(c.startswith("nvidia-smi") for c in calls)


def test_nvml_v1_fallback_counts_reserved_as_used() -> None:
    (gpu,) = probes.probe_nvml(fake_nvml(v2=False)).gpus  # type: ignore[arg-type]
    assert gpu.reserved_bytes is None and gpu.used_bytes == 479 * MIB and "v1" in gpu.method


def test_nvml_mig_instances() -> None:
    (gpu,) = probes.probe_nvml(fake_nvml(mig=True)).gpus  # type: ignore[arg-type]
    assert gpu.mig_enabled and [(m.profile, m.total_bytes // MIB) for m in gpu.mig_instances] == [
        ("3g.40gb", 40448),
        ("2g.20gb", 20096),
    ]


def test_nvml_failure_falls_back_to_nvidia_smi() -> None:
    env = env_from_fixture("h100_idle", modules={"pynvml": fake_nvml(init_fails=True)})  # type: ignore[dict-item]
    det = detect(env)
    assert det.gpus[0].method.startswith("nvidia-smi")
    assert any(s.probe == "nvml" and "unavailable" in s.outcome for s in det.steps)


# ----------------------------------------------------------------------------------------- torch


def fake_torch(recommended: int) -> SimpleNamespace:
    return SimpleNamespace(
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: True)),
        mps=SimpleNamespace(recommended_max_memory=lambda: recommended),
        version=SimpleNamespace(hip=None, cuda=None),
        cuda=SimpleNamespace(is_available=lambda: False),
    )


def test_torch_is_not_touched_unless_asked() -> None:
    torch = fake_torch(28 * GIB)
    det = detect(env_from_fixture("mac_m3_max_36gb", modules={"torch": torch}))  # type: ignore[dict-item]
    assert det.apple is not None and det.apple.recommended_max_bytes is None


def test_torch_mps_working_set_when_asked() -> None:
    torch = fake_torch(28 * GIB)
    env = env_from_fixture("mac_m3_max_36gb", modules={"torch": torch}, use_torch=True)  # type: ignore[dict-item]
    det = detect(env)
    assert det.apple is not None and det.apple.recommended_max_bytes == 28 * GIB


def test_torch_cuda_when_asked() -> None:
    props = SimpleNamespace(name="NVIDIA GeForce RTX 4090", major=8, minor=9)
    torch = SimpleNamespace(
        version=SimpleNamespace(hip=None, cuda="12.8"),
        cuda=SimpleNamespace(
            is_available=lambda: True,
            device_count=lambda: 1,
            mem_get_info=lambda i: (23 * GIB, 24564 * MIB),
            get_device_properties=lambda i: props,
        ),
    )
    det = detect(env_from_fixture("no_nvidia_smi", modules={"torch": torch}, use_torch=True))  # type: ignore[dict-item]
    (gpu,) = det.gpus
    assert gpu.free_bytes == 23 * GIB and gpu.compute_capability == "8.9" and "torch" in gpu.method


# --------------------------------------------------------------------------------------- parsers


@pytest.mark.parametrize(
    "cell",
    [
        "[N/A]",
        "N/A",
        "[Not Supported]",
        "[Unknown Error]",
        "[Requested functionality has been deprecated]",
        "",
    ],
)
def test_placeholders_are_none(cell: str) -> None:
    assert parse.smi_value(cell) is None


def test_invalid_field_message_both_quote_styles() -> None:
    assert parse.invalid_smi_fields('Field "device_minor" is not a valid field to query.\n') == [
        "device_minor"
    ]
    assert parse.invalid_smi_fields("Field “encoder.stats.sessionCount” is not a valid field to query.") == [
        "encoder.stats.sessionCount"
    ]


def test_csv_rows_skip_warning_lines() -> None:
    rows = parse.parse_smi_csv(("index", "name"), "WARNING: something, odd, here\n0, NVIDIA T4\n")
    assert rows == [{"index": "0", "name": "NVIDIA T4"}]


def test_meminfo_and_cgroup_parsers() -> None:
    info = parse.parse_meminfo("MemTotal:       16 kB\nHugePages_Total:       0\nActive(anon):  2 kB\n")
    assert info == {"MemTotal": 16 * 1024, "HugePages_Total": 0, "Active(anon)": 2048}
    assert parse.parse_cgroup_bytes("max\n") is None
    assert parse.parse_cgroup_bytes("9223372036854771712\n") is None
    assert parse.parse_cgroup_bytes("1073741824\n") == 1 << 30
    assert parse.cgroup_v2_path("12:memory:/x\n0::/a/b/\n") == "/a/b"


def test_run_command_missing_binary_and_timeout() -> None:
    rc, _, err = run_command(["fitcheck-no-such-program-xyz"])
    assert rc == RC_NOT_FOUND and "not found" in err
    rc, _, _ = run_command([sys.executable, "-c", "import time; time.sleep(5)"], timeout_s=0.2)
    assert rc == RC_TIMEOUT


def test_probes_import_no_heavy_modules() -> None:
    code = (
        "import sys, fitcheck.hardware.probes, fitcheck.hardware.budget, fitcheck.hardware.report;"
        "bad = [m for m in ('torch', 'numpy', 'rich', 'pynvml', 'psutil') if m in sys.modules];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env=_subenv())


def _subenv() -> dict[str, str]:
    import os

    src = str(__import__("pathlib").Path(__file__).resolve().parent.parent / "src")
    return {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
