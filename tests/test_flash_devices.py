"""FlashAttention-2 by GPU: NVIDIA from compute capability 8.0, AMD Instinct MI200 / MI300 with head
dimensions up to 128 (Dao-AILab/flash-attention README @014c349e). One fact table
(`planner.kernels.flash_device_refusal`) answers the planner, estimate / check and the verdict's remedies."""

from __future__ import annotations

import pytest

from fitcheck import api
from fitcheck.cli import main
from fitcheck.errors import OptionError
from fitcheck.hardware.catalog import entries
from fitcheck.planner.kernels import FLASH_ROCM_ARCHS, flash_device_refusal
from plan_helpers import plan_for


@pytest.mark.parametrize(
    ("backend", "cc", "gpu_arch", "head_dim", "runs"),
    [
        ("cuda", 7.5, None, 128, False),  # Turing
        ("cuda", 8.0, None, 256, True),  # Ampere: head dims up to 256
        ("cuda", None, None, 128, True),  # unknown GPU: not judged here (the planner does not assume it)
        ("rocm", None, "CDNA3", 128, True),
        ("rocm", None, "CDNA2", 64, True),
        ("rocm", None, "CDNA3", 256, False),  # ROCm's backward: head dims up to 128
        ("rocm", None, "RDNA3 (Navi 31)", 128, False),
        ("rocm", None, None, 128, True),
    ],
)
def test_flash_by_gpu(
    backend: str, cc: float | None, gpu_arch: str | None, head_dim: int, runs: bool
) -> None:
    assert (flash_device_refusal(backend, cc, gpu_arch, head_dim) is None) is runs


def test_every_amd_catalog_gpu_is_placed_by_the_table() -> None:
    """The table reads the catalog's architecture names: each AMD GPU is CDNA (listed) or RDNA (not)."""
    amd = entries("rocm")
    assert amd
    for e in amd:
        assert e.architecture.startswith((*FLASH_ROCM_ARCHS, "RDNA")), e.id
    assert {e.id for e in amd if e.architecture.startswith(FLASH_ROCM_ARCHS)} >= {"mi300x", "mi250x"}


@pytest.mark.parametrize(
    ("device", "attn"), [("mi300x", "flash"), ("mi250x", "flash"), ("rx-7900-xtx", "sdpa")]
)
def test_plan_chooses_flash_on_instinct_only(device: str, attn: str) -> None:
    plan = plan_for("qwen2.5-0.5b", device, method="lora")
    assert plan.chosen is not None and plan.chosen.setup.attn == attn
    texts = " ".join(r.text for r in plan.reasons if r.choice == "attention")
    assert ("Instinct MI200 / MI300" in texts) is (attn == "sdpa")


def test_plan_refuses_flash_where_it_cannot_train() -> None:
    with pytest.raises(OptionError, match="RDNA3"):
        plan_for("qwen2.5-0.5b", "rx-7900-xtx", method="lora", attn="flash")
    with pytest.raises(OptionError, match=r"head dimensions up to 128.*256"):
        plan_for("gemma-3-4b", "mi300x", method="lora", attn="flash")


@pytest.mark.parametrize(
    ("device", "code"), [("t4", 2), ("rx-7900-xtx", 2), ("mi300x", 0), ("rtx-4090", 0), ("16GB", 0)]
)
def test_check_with_flash_on_a_gpu_that_cannot_run_it_is_an_error(
    device: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["check", "qwen2.5-0.5b", "--method", "lora", "--attn", "flash", "--on", device])
    err = capsys.readouterr().err
    assert rc == code, err
    if code == 2:
        assert "--attn flash:" in err and len(err.strip().splitlines()) == 1


def test_the_flash_remedy_is_offered_only_where_the_gpu_runs_it() -> None:
    """Mistral 7B at 8192 tokens under SDPA keeps a mask copy per windowed layer: flash would save it,
    on an RTX 3090; on a T4 (compute capability 7.5) the remedy is not offered."""
    opts = {"method": "lora", "seq_len": 8192, "attn": "sdpa"}
    flags = {
        on: [s.flag for s in api.estimate("mistral-7b", on=on, **opts).target.suggestions]  # type: ignore[union-attr, arg-type]
        for on in ("rtx-3090", "t4")
    }
    assert "--attn flash" in flags["rtx-3090"]
    assert "--attn flash" not in flags["t4"] and flags["t4"]
