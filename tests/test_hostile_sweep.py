"""Hostile inputs, sixth sweep: one test per class of failure found, each failing before its fix.

- ``--on 8xh100-80gb --gpus 2`` judged 8 ranks and ``--on 2xh100-80gb --gpus 3`` three while the verdict
  named "2xh100-sxm5-80gb": two GPU counts that disagree were settled silently by the larger
  (`fitcheck.api.target`); a trainer file's count against ``--on NxGPU`` likewise;
- ``--on 24MiB`` said "'0.0234375GB' leaves no usable memory": the error quotes the size as typed
  (`fitcheck.hardware.budget.plain_cuda_target`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_fuzz_cli import hold_contract, invoke

# --- GPU counts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "7B", "--on", "8xh100-80gb", "--gpus", "2"],
        ["estimate", "7B", "--on", "2xh100-80gb", "--gpus", "3", "--format", "json"],
        ["check", "7B", "--on", "2x4090", "--gpus", "4"],
        ["plan", "7B", "--on", "8xh100-80gb", "--gpus", "4"],
    ],
)
def test_two_gpu_counts_that_disagree_are_refused(argv: list[str]) -> None:
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert rc == 2 and "disagree" in err, err


def test_a_files_gpu_count_against_the_targets_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "accelerate.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n")
    argv = ["estimate", "7B", "--from", str(cfg), "--on", "2x4090"]
    rc, out, err = invoke(argv)
    hold_contract("estimate", argv, rc, out, err)
    assert rc == 2 and "disagree" in err and str(cfg) in err, err


@pytest.mark.parametrize("gpus", ["8", "1"])
def test_the_same_count_twice_or_the_default_still_estimates(gpus: str) -> None:
    rc, out, err = invoke(["estimate", "7B", "--on", "8xh100-80gb", "--gpus", gpus, "--format", "json"])
    assert rc == 0, err
    assert '"world_size": 8' in out


@pytest.mark.parametrize(("on", "named"), [("24MiB", "'24MiB'"), ("1GB", "'1GB'"), ("2x512MB", "'512mb'")])
def test_a_size_too_small_to_use_is_quoted_as_typed(on: str, named: str) -> None:
    argv = ["estimate", "7B", "--on", on]
    rc, out, err = invoke(argv)
    hold_contract("estimate", argv, rc, out, err)
    assert rc == 2 and named in err and "no usable memory" in err, err
