"""DeepSpeed ZeRO's own buffers from the config: ``--zero-bucket-size`` (reduce_bucket_size), read from a
DeepSpeed JSON or an accelerate config, and the step's flattened 16-bit gradient copy
(docs/distributed.md#buckets, #zero-optimizer)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.cli import main
from fitcheck.engine.distributed import hf_auto
from fitcheck.engine.estimate import estimate
from fitcheck.errors import OptionError
from fitcheck.facts.deepspeed import ZERO_DEFAULTS
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.readers import read_config
from fitcheck.sources.resolve import resolve_model

#: Qwen-1's finetune/ds_config_zero2.json (QwenLM/Qwen @e8e1596), the zero_optimization block as shipped.
QWEN_ZERO2 = {
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "none", "pin_memory": True},
        "allgather_partitions": True,
        "allgather_bucket_size": 2e8,
        "overlap_comm": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 2e8,
        "contiguous_gradients": True,
    },
}


@pytest.fixture(scope="module")
def spec7b() -> ModelSpec:
    return resolve_model("7B")


def run(spec: ModelSpec, **kw: object) -> Estimate:
    base: dict[str, object] = {"method": "lora", "grad_ckpt": True, "trainer": "hf"}
    base.update(kw)
    return estimate(spec, LlmSetup(**base))  # type: ignore[arg-type]


def comp(e: Estimate, name: str, phase: str) -> int:
    return sum(c.bytes for c in e.phase(phase).components if c.name == name)  # type: ignore[arg-type]


def test_zero2_ipg_buffers_are_the_stated_bucket_twice_under_overlap(spec7b: ModelSpec) -> None:
    """stage_1_and_2.py backward() (v0.12.3 L1935-1946): buf_0 and, under overlap_comm, buf_1, each
    reduce_bucket_size elements in the 16-bit dtype; the HF family's config has overlap_comm on."""
    e = run(spec7b, strategy="zero2", precision="fp16", zero_bucket_size=200_000_000)
    assert comp(e, "reduce_buckets", "backward") == 2 * 200_000_000 * 2
    assert e.distributed is not None and e.distributed.zero_config["reduce_bucket_size"] == 200_000_000
    auto = run(spec7b, strategy="zero2", precision="fp16")
    filled = hf_auto(spec7b.arch.hidden_size)["reduce_bucket_size"]
    assert comp(auto, "reduce_buckets", "backward") == 2 * filled * 2


def test_zero3_ipg_buffer_is_one_bucket(spec7b: ModelSpec) -> None:
    """stage3.py __init__ (v0.12.3 L482-485): one __ipg_bucket_flat_buffer of reduce_bucket_size, kept."""
    e = run(spec7b, strategy="zero3", gpus=2, zero_bucket_size=ZERO_DEFAULTS["reduce_bucket_size"])
    assert comp(e, "reduce_buckets", "forward") == 500_000_000 * 2


def test_step_gradient_counts_its_flattened_16bit_source(spec7b: ModelSpec) -> None:
    """flatten(averaged_gradients).to(fp32): the 16-bit concatenation and its fp32 copy are both alive;
    under ZeRO-3 for one sub_group; an fp32 run converts a tensor to itself (no second copy)."""
    full = {"method": "full", "gpus": 4}
    z2 = run(spec7b, strategy="zero2", **full)
    n = 4
    assert comp(z2, "fp32_grad_partition", "optimizer_step") == round((4 + 2) * z2.params.trainable / n)
    z3 = run(spec7b, strategy="zero3", **full)
    sub = min(ZERO_DEFAULTS["sub_group_size"], z3.params.trainable // n)
    assert comp(z3, "fp32_grad_partition", "optimizer_step") == (4 + 2) * sub
    fp32 = run(spec7b, strategy="zero2", precision="fp32", **full)
    assert comp(fp32, "fp32_grad_partition", "optimizer_step") == round(4 * fp32.params.trainable / n)


def test_bucket_size_needs_a_zero_strategy(spec7b: ModelSpec) -> None:
    with pytest.raises(OptionError, match="--zero-bucket-size"):
        run(spec7b, zero_bucket_size=200_000_000)
    with pytest.raises(OptionError, match="--zero-bucket-size"):
        run(spec7b, gpus=2, strategy="fsdp", zero_bucket_size=200_000_000)


def test_cli_refuses_in_one_line_and_echoes_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "qwen2.5-7b", "--method", "lora", "--on", "a100-80gb"]
    args += ["--zero-bucket-size", "200000000"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("fitcheck: error: --zero-bucket-size") and err.count("\n") == 1
    assert main([*args, "--strategy", "zero2", "-f", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["setup"]["zero_bucket_size"] == 200_000_000
    assert out["distributed"]["zero_config"]["reduce_bucket_size"] == 200_000_000
    assert main([*args[:-1], "0", "--strategy", "zero2"]) == 2
    assert capsys.readouterr().err.startswith("fitcheck: error: --zero-bucket-size")


def test_plan_with_a_bucket_size_searches_zero_and_emits_it(tmp_path: Path) -> None:
    args = ["plan", "llama-3.1-8b", "--method", "lora", "--on", "4xa100-80gb", "--seq-len", "2048"]
    args += ["--zero-bucket-size", "200000000", "--emit", "deepspeed.json", "-o", str(tmp_path), "--force"]
    assert main(args) == 0
    cfg = json.loads((tmp_path / "deepspeed.json").read_text())
    assert cfg["zero_optimization"]["reduce_bucket_size"] == 200_000_000


def test_deepspeed_reader_takes_a_stated_reduce_bucket_size(tmp_path: Path) -> None:
    path = tmp_path / "ds_config_zero2.json"
    path.write_text(json.dumps(QWEN_ZERO2))
    r = read_config(str(path))
    assert r.values["zero_bucket_size"] == 200_000_000
    assert r.keys["zero_bucket_size"] == "zero_optimization.reduce_bucket_size"
    assert any("allgather_bucket_size=200000000" in n for n in r.notes)
    zero = {**QWEN_ZERO2["zero_optimization"], "reduce_bucket_size": "auto"}
    auto = {**QWEN_ZERO2, "zero_optimization": zero}
    path.write_text(json.dumps(auto))
    assert "zero_bucket_size" not in read_config(str(path)).values
    stage0 = {"zero_optimization": {"stage": 0, "reduce_bucket_size": 2e8}}
    path.write_text(json.dumps(stage0))
    assert "zero_bucket_size" not in read_config(str(path)).values


ACCELERATE = """compute_environment: LOCAL_MACHINE
deepspeed_config:
  offload_optimizer_device: none
  offload_param_device: none
  zero3_init_flag: true
  zero_stage: {stage}
distributed_type: DEEPSPEED
mixed_precision: bf16
num_machines: 1
num_processes: 2
"""


def test_accelerate_inline_config_gets_deepspeeds_defaults(tmp_path: Path) -> None:
    """accelerate's DeepSpeedPlugin builds zero_optimization without a bucket or overlap_comm key (v0.28.0
    utils/dataclasses.py L785-803), so DeepSpeed's 5e8 applies, with overlap_comm off below stage 3
    (zero/config.py overlap_comm_valid): one 5e8 buffer at ZeRO-2."""
    path = tmp_path / "z3.yaml"
    path.write_text(ACCELERATE.format(stage=3))
    r = read_config(str(path))
    assert r.values["zero_bucket_size"] == 500_000_000 and "zero_overlap_comm" not in r.values
    path.write_text(ACCELERATE.format(stage=2))
    r = read_config(str(path))
    assert (r.values["zero_bucket_size"], r.values["zero_overlap_comm"]) == (500_000_000, False)


def test_overlap_comm_off_keeps_one_zero2_buffer(spec7b: ModelSpec) -> None:
    e = run(spec7b, strategy="zero2", gpus=2, zero_bucket_size=500_000_000, zero_overlap_comm=False)
    assert comp(e, "reduce_buckets", "backward") == 500_000_000 * 2
    with pytest.raises(OptionError, match="--zero-overlap-comm"):
        run(spec7b, gpus=2, strategy="ddp", zero_overlap_comm=False)


def test_deepspeed_reader_takes_overlap_comm(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps(QWEN_ZERO2))
    assert read_config(str(path)).values["zero_overlap_comm"] is True
    off = {"zero_optimization": {"stage": 1, "overlap_comm": False}}
    path.write_text(json.dumps(off))
    assert read_config(str(path)).values["zero_overlap_comm"] is False
