"""resolve_target: exact budget arithmetic in bytes, catalog and detected targets, bad inputs."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck.errors import FitcheckError, InputError, NotFoundError
from fitcheck.facts.context import HOPPER_CONTEXT_MIB
from fitcheck.hardware import catalog
from fitcheck.hardware.budget import resolve_target
from fitcheck.hardware.env import ProbeEnv
from fitcheck.models import Target
from hw_replay import env_from_fixture, fixture_names

MIB = 1 << 20
GIB = 1 << 30


def lines(t: Target) -> dict[str, int]:
    return {line.name: line.bytes for line in t.budget_lines}


def assert_consistent(t: Target) -> None:
    """Lines before 'usable' sum to it; usable - headroom = budget; the context is never a line."""
    names = [line.name for line in t.budget_lines]
    cut = names.index("usable")
    assert sum(line.bytes for line in t.budget_lines[:cut]) == t.usable_bytes == t.budget_lines[cut].bytes
    assert names[cut + 1 :] == ["headroom", "budget"]
    assert t.usable_bytes - t.headroom_bytes == t.budget_bytes == lines(t)["budget"]
    assert -lines(t)["headroom"] == t.headroom_bytes
    assert not any("context" in n for n in names)


def test_seeds_mac_rule_36gb_unified_is_27_gib() -> None:
    t = resolve_target("36GB-unified")
    assert t.backend == "mps" and t.memory_bytes == 36 * GIB
    assert t.usable_bytes == 27 * GIB
    assert lines(t)["os_and_apps"] == -9 * GIB
    assert t.headroom_bytes == 0  # default: none (the estimate's band carries the margin)
    assert t.budget_bytes == 27 * GIB
    assert t.context_bytes == 0
    assert_consistent(t)


def test_catalog_mac_matches_the_plain_size() -> None:
    t = resolve_target("apple-m3-max-36gb")
    assert t.id == "apple-m3-max-36gb" and t.usable_bytes == 27 * GIB


@pytest.mark.parametrize("spec", ["24GB", "24GiB", "24", "24 gb", "24576MB"])
def test_plain_size_is_binary_and_minus_idle(spec: str) -> None:
    t = resolve_target(spec)
    assert t.backend == "cuda" and t.id == "cuda-24gib"
    assert t.memory_bytes == 24 * GIB == 25769803776
    assert lines(t)["idle_use"] == -1028 * MIB
    assert t.usable_bytes == 24 * GIB - 1028 * MIB == 24691867648
    assert t.headroom_bytes == 0
    assert t.context_bytes == 400 * MIB
    assert_consistent(t)


def test_rtx_4090_uses_the_driver_total() -> None:
    t = resolve_target("rtx-4090")
    assert t.memory_bytes == 24564 * MIB
    assert t.usable_bytes == (24564 - 1028) * MIB
    assert t.context_bytes == 400 * MIB and t.bf16 is True and not t.detected
    assert_consistent(t)


def test_h100_alias_uses_observed_idle_use() -> None:
    t = resolve_target("h100-80gb")
    assert t.id == "h100-sxm5-80gb"
    assert t.usable_bytes == (81559 - 478) * MIB  # free at idle in the exporter capture
    assert_consistent(t)


def test_a100_alias_is_the_sxm_part() -> None:
    assert resolve_target("a100-80gb").id == "a100-sxm4-80gb"


@pytest.mark.parametrize(("spec", "context_mib"), [("rtx-5090", 555), ("mi300x", 457), ("t4", 400)])
def test_context_by_generation(spec: str, context_mib: int) -> None:
    t = resolve_target(spec)
    assert t.context_bytes == context_mib * MIB
    assert_consistent(t)


def test_turing_has_no_bf16() -> None:
    assert resolve_target("rtx-2080-ti").bf16 is False


def test_default_headroom_is_none_and_a_given_one_comes_off() -> None:
    t = resolve_target("rtx-3060-8gb")
    assert t.usable_bytes == (8192 - 1028) * MIB
    assert t.headroom_bytes == 0 and t.budget_bytes == t.usable_bytes
    given = resolve_target("rtx-3060-8gb", "512MB")
    assert given.headroom_bytes == 512 * MIB and given.budget_bytes == t.usable_bytes - 512 * MIB


@pytest.mark.parametrize("spec", ["2x4090", "2xrtx-4090", "2 x rtx-4090", "2X4090"])
def test_count_times_device(spec: str) -> None:
    t = resolve_target(spec)
    one = resolve_target("rtx-4090")
    assert t.gpus == 2 and t.id == "2xrtx-4090"
    assert (t.usable_bytes, t.budget_bytes, t.context_bytes) == (
        one.usable_bytes,
        one.budget_bytes,
        one.context_bytes,
    )
    assert any("--strategy" in n for n in t.notes)


def test_count_times_plain_size() -> None:
    t = resolve_target("4x24GB")
    assert t.gpus == 4 and t.usable_bytes == 24 * GIB - 1028 * MIB


@pytest.mark.parametrize(
    ("headroom", "expected"),
    [("2GB", 2 * GIB), ("2GiB", 2 * GIB), ("512MB", 512 * MIB), ("10%", 2899102925), ("0", 0), ("0%", 0)],
)
def test_headroom(headroom: str, expected: int) -> None:
    t = resolve_target("36GB-unified", headroom)
    assert t.headroom_bytes == expected
    assert t.budget_bytes == 27 * GIB - expected
    assert_consistent(t)


@pytest.mark.parametrize("headroom", ["abc", "150%", "-5%", "-2GB", "40GB"])
def test_bad_headroom(headroom: str) -> None:
    with pytest.raises(InputError) as err:
        resolve_target("36GB-unified", headroom)
    assert "\n" not in str(err.value) and "headroom" in str(err.value)


@pytest.mark.parametrize(
    ("spec", "error", "says"),
    [
        ("0GB", InputError, "above zero"),
        ("-24GB", InputError, "above zero"),
        ("0GB-unified", InputError, "above zero"),
        ("36GB-unfied", InputError, "36GB-unified"),
        ("", InputError, "catalog id"),
        ("0x4090", InputError, "between 1 and"),
        ("2x36GB-unified", InputError, "not modelled"),
        ("2xcpu", InputError, "not modelled"),
        ("rtx-4091", NotFoundError, "rtx-4090"),
        ("2xrtx-4091", NotFoundError, "rtx-4090"),
        ("h100", NotFoundError, "h100-"),
        ("0.5GB", InputError, "no usable memory"),
        ("3060", InputError, "rtx-3060"),  # a card model, not 3060 GiB
    ],
)
def test_bad_targets_say_what_works(spec: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error) as err:
        resolve_target(spec)
    message = str(err.value)
    assert says in message and "\n" not in message
    assert isinstance(err.value, FitcheckError) and err.value.exit_code == 2


@pytest.mark.parametrize("entry_id", [e.id for e in catalog.entries()])
def test_every_catalog_entry_gives_a_consistent_budget(entry_id: str) -> None:
    t = resolve_target(entry_id)
    assert 0 < t.budget_bytes == t.usable_bytes <= t.memory_bytes
    assert_consistent(t)


# ------------------------------------------------------------------------------------------ auto


def test_auto_h100_is_free_memory_exactly() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("h100_idle"))
    assert t.detected and t.id == "h100-sxm5-80gb" and t.backend == "cuda"
    assert t.memory_bytes == 81559 * MIB
    assert lines(t)["driver_reserved"] == -478 * MIB  # reports 479; 1 MiB is nvidia-smi's rounding
    assert lines(t)["other_processes"] == 0
    assert t.usable_bytes == 81081 * MIB
    assert t.context_bytes == HOPPER_CONTEXT_MIB * MIB  # the Hopper line measured on an H200
    assert_consistent(t)


def test_auto_two_identical_gpus_sized_by_the_fuller_one() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("rtx4090_x2"))
    assert t.gpus == 2 and t.id == "rtx-4090"
    assert t.usable_bytes == 24057 * MIB  # GPU 0 has less free memory
    assert lines(t)["other_processes"] == -507 * MIB
    assert_consistent(t)


def test_auto_mixed_gpus_pick_the_most_free() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("mixed_4090_3090"))
    assert t.gpus == 1 and t.id == "rtx-3090" and t.usable_bytes == 24165 * MIB
    assert any("mixed GPUs" in n and "RTX 4090" in n for n in t.notes)


def test_auto_respects_cuda_visible_devices() -> None:
    env = env_from_fixture("mixed_4090_3090", environ={"CUDA_VISIBLE_DEVICES": "0"})
    t = resolve_target("auto", probe_env=env)
    assert t.id == "rtx-4090" and t.usable_bytes == 22920 * MIB
    assert any("display" in n for n in t.notes)


def test_auto_display_gpu_note() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("rtx4080super_display"))
    assert t.usable_bytes == 15348 * MIB and any("drives a display" in n for n in t.notes)


def test_auto_mig_sizes_against_the_slice() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("h100_mig"))
    assert t.memory_bytes == 40448 * MIB  # 3g.40gb, not the 81559 MiB physical GPU
    assert t.usable_bytes == 40423 * MIB
    assert any("MIG" in n and "3g.40gb" in n for n in t.notes)
    assert_consistent(t)


def test_auto_old_driver_without_reserved() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("old_driver_no_reserved"))
    assert t.id == "a100-sxm4-40gb" and t.usable_bytes == 40957 * MIB
    assert t.bf16 is True  # from the catalog: compute_cap was refused by this driver


def test_auto_rocm() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("rocm_rx7900xt"))
    assert t.backend == "rocm" and t.id == "rx-7900-xt"
    assert t.usable_bytes == 21458059264 - 27856896
    assert t.context_bytes == 457 * MIB


def test_auto_mac_uses_75_percent_without_a_measurement() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("mac_m3_max_36gb"))
    assert t.detected and t.id == "apple-m3-max-36gb" and t.usable_bytes == 27 * GIB
    notes = " ".join(t.notes)
    assert "2/3" in notes and "0.84" in notes
    assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0" in notes and "1.7" in notes and "O(s^2)" in notes


def test_auto_mac_m1_16gb() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("mac_m1_16gb"))
    assert t.id == "apple-m1-16gb" and t.usable_bytes == 12 * GIB


def test_auto_mac_wired_limit_replaces_the_rule() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("mac_wired_limit"))
    assert t.usable_bytes == 12000 * MIB and "iogpu.wired_limit_mb=12000" in lines_notes(t)


def test_auto_mac_measured_working_set() -> None:
    torch = SimpleNamespace(
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: True)),
        mps=SimpleNamespace(recommended_max_memory=lambda: 28 * GIB),
    )
    env = env_from_fixture("mac_m3_max_36gb", modules={"torch": torch}, use_torch=True)  # type: ignore[dict-item]
    t = resolve_target("auto", probe_env=env)
    assert t.usable_bytes == 28 * GIB and "recommendedMaxWorkingSetSize" in lines_notes(t)


def test_auto_rosetta_note() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("mac_rosetta"))
    assert "Rosetta" in t.notes[0]


def test_cpu_in_a_container() -> None:
    t = resolve_target("cpu", probe_env=env_from_fixture("container_cgroup"))
    assert t.backend == "cpu" and t.usable_bytes == 7 * GIB
    assert lines(t) == {
        "ram_total": 64 * GIB,
        "in_use": -4 * GIB,
        "cgroup_limit": -53 * GIB,
        "usable": 7 * GIB,
        "headroom": 0,
        "budget": 7 * GIB,
    }


def test_auto_without_gpu_is_cpu() -> None:
    t = resolve_target("auto", probe_env=env_from_fixture("driver_not_loaded"))
    assert t.backend == "cpu" and t.usable_bytes == 30000000 * 1024


def test_auto_with_nothing_readable_is_an_error() -> None:
    with pytest.raises(FitcheckError, match="give --on a size"):
        resolve_target("auto", probe_env=ProbeEnv())


@pytest.mark.parametrize("name", fixture_names())
def test_every_fixture_resolves_consistently(name: str) -> None:
    t = resolve_target("auto", probe_env=env_from_fixture(name))
    assert_consistent(t)


def lines_notes(t: Target) -> str:
    return " ".join(line.note for line in t.budget_lines)


# ------------------------------------------------------------------------------------ properties


@given(st.integers(min_value=2, max_value=2048))
def test_plain_sizes_property(size_gib: int) -> None:
    t = resolve_target(f"{size_gib}GB")
    assert t.usable_bytes == size_gib * GIB - 1028 * MIB
    assert t.headroom_bytes == 0
    assert_consistent(t)


@given(st.integers(min_value=1, max_value=1024))
def test_unified_sizes_property(size_gib: int) -> None:
    t = resolve_target(f"{size_gib}GB-unified")
    assert t.usable_bytes == size_gib * GIB * 3 // 4
    assert_consistent(t)


def test_mlx_run_gets_mlx_notes_not_pytorch_mps_ones() -> None:
    """`--trainer mlx` on a Mac: PyTorch's MPS watermark / SDPA notes do not apply to MLX (its own memory
    limit does), and the estimate's warnings speak of MLX's unfused training attention, not bitsandbytes."""
    from fitcheck import api

    torch_run = api.estimate("qwen3-8b", method="qlora", seq_len=2048, grad_ckpt=True, on="m1-max-32gb")
    mlx_run = api.estimate(
        "qwen3-8b", method="qlora", trainer="mlx", seq_len=2048, grad_ckpt=True, on="m1-max-32gb"
    )
    assert torch_run.target is not None and mlx_run.target is not None
    torch_notes, mlx_notes = " ".join(torch_run.target.notes), " ".join(mlx_run.target.notes)
    assert "PYTORCH_MPS_HIGH_WATERMARK_RATIO" in torch_notes and "mx.set_memory_limit" not in torch_notes
    assert "PYTORCH_MPS" not in mlx_notes and "O(s^2)" not in mlx_notes and "mx.set_memory_limit" in mlx_notes
    assert "recommendedMaxWorkingSetSize" in mlx_notes  # the Mac's own facts stay
    mlx_warn = " ".join(mlx_run.warnings)
    assert "bitsandbytes" not in mlx_warn and "MLX: mx.fast.scaled_dot_product_attention" in mlx_warn
    assert "bitsandbytes 4-bit weights work on MPS" in " ".join(torch_run.warnings)
