"""Speed facts (fitcheck.facts.speed): every optimizer's step traffic adds up from its state table."""

from __future__ import annotations

import pytest

from fitcheck.facts.optimizers import EIGHT_BIT, OPTIMIZERS
from fitcheck.facts.speed import STEP_BYTES, UTILISATION, step_bytes

#: fp32 weight read and written, fp32 gradient read (the rows' common 12 B).
WEIGHT_AND_GRAD = 4 + 4 + 4


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_traffic_adds_up_from_the_optimizer_states(name: str) -> None:
    states = OPTIMIZERS[name].states
    if name == "adafactor":  # factored states (negligible) + the fp32 update tensor written once
        expected = WEIGHT_AND_GRAD + 4
    elif name in EIGHT_BIT:  # uint8 states, each read and written
        expected = WEIGHT_AND_GRAD + states * 2
    else:  # fp32 states, each read and written
        expected = WEIGHT_AND_GRAD + states * 2 * 4
    assert STEP_BYTES[name].bytes_per_param == expected == step_bytes(name)
    assert STEP_BYTES[name].source


def test_every_row_is_an_optimizer_and_sourced() -> None:
    assert set(STEP_BYTES) == set(OPTIMIZERS)
    assert step_bytes("not-listed") == STEP_BYTES["adamw"].bytes_per_param
    assert all(0 < f <= 1 and why for f, why in UTILISATION.values())
