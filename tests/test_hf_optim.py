"""transformers' optimizer names: one table (fitcheck.facts.hf_optim) read by the readers and the emitters."""

from __future__ import annotations

import re
from pathlib import Path

from fitcheck.emitters import hf
from fitcheck.facts.hf_optim import HF_OPTIM, HF_OPTIM_WRITTEN
from fitcheck.facts.optimizers import OPTIMIZERS
from fitcheck.readers import names

KEYS = Path(__file__).parent / "data" / "trainer_keys" / "hf_training_arguments.txt"
AXOLOTL = Path(__file__).parent / "data" / "trainer_keys" / "axolotl_keys.txt"


def _optimizer_names() -> dict[str, set[str]]:
    """transformers version -> its OptimizerNames, from the recorded TrainingArguments listing."""
    found = {}
    for m in re.finditer(r"^# OptimizerNames(?: in)? \(?([\d.]+)\)?: (\S+)$", KEYS.read_text(), re.M):
        found[m.group(1)] = set(m.group(2).split("|"))
    return found


def test_both_sides_read_the_one_table() -> None:
    assert names.HF_OPTIM is HF_OPTIM
    assert hf.OPTIM is HF_OPTIM_WRITTEN


def test_written_names_run_the_optimizer_and_exist_in_every_recorded_release() -> None:
    releases = _optimizer_names()
    assert len(releases) >= 3
    for ours, theirs in HF_OPTIM_WRITTEN.items():
        assert HF_OPTIM[theirs] == ours
        assert all(theirs in known for known in releases.values()), theirs


def _axolotl_extra() -> set[str]:
    """axolotl's CustomSupportedOptimizers (its ``optimizer`` takes these beside transformers' names)."""
    m = re.search(r"CustomSupportedOptimizers: (\S+)", AXOLOTL.read_text())
    assert m
    return set(m.group(1).split("|"))


def test_every_name_is_a_trainer_name_for_a_modelled_optimizer() -> None:
    known = set().union(*_optimizer_names().values()) | _axolotl_extra()
    assert set(HF_OPTIM) <= known
    assert set(HF_OPTIM.values()) <= set(OPTIMIZERS)
