"""--rule thumb reproduces the source documents' table (seeds/002) exactly."""

from __future__ import annotations

import pytest

from fitcheck.engine.thumb import thumb
from fitcheck.models import LlmSetup
from fitcheck.units import GIB

# seeds/002: model size -> (LoRA GB, full GB)
TABLE = {0.5: (4, 10), 1.5: (6, 22), 3: (9, 40), 7: (17, 88), 14: (31, 172)}


@pytest.mark.parametrize(("size", "lora", "full"), [(k, *v) for k, v in TABLE.items()])
def test_seed_table(size: float, lora: int, full: int) -> None:
    n = int(size * 1e9)
    assert thumb(n, LlmSetup(method="lora")).bytes == lora * GIB
    assert thumb(n, LlmSetup(method="full")).bytes == full * GIB


def test_master_weights_16_per_billion() -> None:
    assert thumb(7 * 10**9, LlmSetup(method="full", master_weights=True)).bytes == (16 * 7 + 4) * GIB


def test_qlora_seed_figures() -> None:
    assert abs(thumb(8 * 10**9, LlmSetup(method="qlora")).bytes / GIB - 9) < 0.5
    for b in (27, 32):
        assert 22 <= thumb(b * 10**9, LlmSetup(method="qlora")).bytes / GIB <= 26
