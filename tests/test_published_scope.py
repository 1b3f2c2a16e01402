"""bench/published.py: figures summed over GPUs, runs over several nodes, a ZeRO stage on one GPU."""

from __future__ import annotations

from types import ModuleType

import pytest

from bench_helpers import bench_module


def _pub() -> ModuleType:
    return bench_module("published")


pub = _pub()


def test_a_figure_summed_over_gpus_is_compared_per_gpu() -> None:
    assert pub.per_gpu_figure(100, "gpu", {"gpus": 4}) == 100
    assert pub.per_gpu_figure(100, "all-gpus", {"gpus": 4, "nodes": 2}) == 25
    with pytest.raises(ValueError, match="measured_scope"):
        pub.per_gpu_figure(100, "node", {"gpus": 4})


def test_the_qwen_sums_are_read_per_gpu() -> None:
    """The Qwen README prints 139.2G for 7B full-parameter on two 80 GB cards: a sum."""
    _src, recs = pub.load_source(pub.DATA / "qwen-finetune-profiling.yaml")
    rec = next(r for r in recs if r.id == "qwen-7b-full-2gpu-s256")
    assert rec.measured_bytes == round(139.2e9 / 2)
    single = next(r for r in recs if r.id == "qwen-7b-lora-s256")
    assert single.measured_bytes == round(20.1e9)


def test_a_run_over_nodes_splits_its_gpus() -> None:
    kw, notes = pub._multi_gpu({"gpus": 4, "nodes": 2, "strategy": "zero2"})
    assert (kw["gpus"], kw["nodes"]) == (2, 2)
    assert notes[0].startswith("4 GPUs, zero2")
    assert "do not split" in pub._multi_gpu({"gpus": 3, "nodes": 2, "strategy": "zero2"})


def test_a_zero_stage_on_one_gpu_is_posed() -> None:
    _src, recs = pub.load_source(pub.DATA / "qwen-finetune-profiling.yaml")
    rec = next(r for r in recs if r.id == "qwen-1.8b-full-s256")
    assert rec.gpus == 1
    _spec, setup, notes = pub.pose(rec)
    assert setup.strategy == "zero3" and setup.gpus == 1
    assert notes[0].startswith("1 GPU, zero3")


def test_a_records_target_length_reaches_the_setup() -> None:
    """A seq2seq record's label length is posed as stated (bench/published.py _DIRECT), not left to the
    setup's default (the decoder side as long as the encoder's)."""
    import dataclasses

    _src, recs = pub.load_source(pub.DATA / "qwen-finetune-profiling.yaml")
    rec = next(r for r in recs if r.id == "qwen-7b-lora-s256")
    _spec, setup, _notes = pub.pose(dataclasses.replace(rec, setup={**rec.setup, "target_len": 16}))
    assert setup.target_len == 16
    _spec, plain, _notes = pub.pose(rec)
    assert plain.target_len is None
