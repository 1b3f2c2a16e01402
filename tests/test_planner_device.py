"""Device speed: every catalog entry yields figures; gaps are filled and labelled as assumptions."""

from __future__ import annotations

import pytest

from fitcheck.hardware.budget import resolve_target
from fitcheck.hardware.catalog import entries, get_entry
from fitcheck.planner.device import APPLE_FP32_TFLOPS_PER_CORE, catalog_id, default_perf, perf_from_entry


@pytest.mark.parametrize("entry", entries(), ids=lambda e: e.id)
def test_every_catalog_entry_has_speed_figures(entry) -> None:  # type: ignore[no-untyped-def]
    perf = perf_from_entry(entry)
    assert perf.bf16_tflops > 0 and perf.fp16_tflops > 0 and perf.fp32_tflops > 0 and perf.bandwidth_gbps > 0
    assert perf.sources[0] == f"catalog presets/hardware/{entry.id}.yaml"
    if entry.backend == "cuda":
        assert perf.bf16_native == (float(entry.compute_capability or 0) >= 8.0)


def test_catalog_figures_are_used_as_is() -> None:
    perf = perf_from_entry(get_entry("rtx-4090"))
    assert (perf.bf16_tflops, perf.bandwidth_gbps, perf.compute_capability) == (165.2, 1008, "8.9")
    assert perf.assumed == ()


def test_turing_bf16_is_not_native() -> None:
    perf = perf_from_entry(get_entry("rtx-2080-ti"))
    assert not perf.bf16_native and perf.bf16_tflops == perf.fp32_tflops


def test_apple_without_a_figure_is_derived_from_cores() -> None:
    e = get_entry("apple-m3-max-36gb")
    perf = perf_from_entry(e)
    assert perf.fp32_tflops == round(min(e.gpu_cores) * APPLE_FP32_TFLOPS_PER_CORE, 3)
    assert perf.bf16_native and any("derived" in a for a in perf.assumed)
    m1 = perf_from_entry(get_entry("apple-m1-16gb"))
    assert m1.fp32_tflops == 2.617 and not m1.bf16_native


def test_targets_outside_the_catalog_are_assumptions() -> None:
    perf = default_perf(resolve_target("24GB"))
    assert perf.compute_capability is None and perf.assumed
    mac = default_perf(resolve_target("36GB-unified"))
    assert not mac.bf16_native
    assert catalog_id(resolve_target("2x4090")) == "rtx-4090"
