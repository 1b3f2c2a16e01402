"""Multi-GPU files: deepspeed.json through DeepSpeed's own DeepSpeedConfig, accelerate.yaml through
accelerate's own config loader and launch validator, and the launch line that ties them together."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.cli import main

pytest.importorskip("deepspeed")
pytest.importorskip("accelerate")

FIXED = ["--batch-size", "1", "--grad-ckpt", "--attn", "sdpa", "--optimizer", "adamw", "--precision", "bf16"]
#: Every (strategy, offload) the planner can choose (planner/rules.py offloads), plus FSDP1 and HSDP.
CASES: list[tuple[str, str, list[str]]] = [
    ("ddp", "none", []),
    ("zero1", "none", []),
    ("zero1", "optimizer", []),
    ("zero2", "none", []),
    ("zero2", "optimizer", []),
    ("zero3", "none", []),
    ("zero3", "optimizer", []),
    ("zero3", "all", []),
    ("fsdp", "none", []),
    ("fsdp", "all", []),
    ("fsdp-grad-op", "none", []),
    ("fsdp-grad-op", "all", []),
    ("fsdp", "none", ["--fsdp-version", "1"]),
    ("fsdp-hybrid", "none", ["--nodes", "2"]),
]


def plan_files(tmp: Path, strategy: str, offload: str, extra: list[str], emits: list[str]) -> dict[str, str]:
    args = ["plan", "llama-3.1-8b", "--method", "lora", "--on", "8xh100-80gb", *FIXED]
    args += ["--strategy", strategy, "--offload", offload, *extra, "-o", str(tmp), "--force"]
    for e in emits:
        args += ["--emit", e]
    assert main(args) == 0
    return {e: (tmp / e).read_text() for e in emits}


def resolve_auto(cfg: dict[str, Any], hf: dict[str, Any], hidden: int) -> dict[str, Any]:
    """Fill "auto" as transformers' HfTrainerDeepSpeedConfig does (integrations/deepspeed.py), on one rank."""
    micro, accum = hf["per_device_train_batch_size"], hf["gradient_accumulation_steps"]
    out = {k: v for k, v in cfg.items() if not k.startswith("_")}
    out.update(
        train_micro_batch_size_per_gpu=micro,
        gradient_accumulation_steps=accum,
        train_batch_size=micro * accum,
        gradient_clipping=1.0,
        bf16={"enabled": hf["bf16"]},
        fp16={"enabled": hf["fp16"]},
    )
    z = dict(out["zero_optimization"])
    auto = {
        "reduce_bucket_size": hidden * hidden,
        "stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
        "stage3_param_persistence_threshold": 10 * hidden,
    }
    for k, v in auto.items():
        if z.get(k) == "auto":
            z[k] = v
    out["zero_optimization"] = z
    assert "auto" not in json.dumps(out)
    return out


@pytest.mark.parametrize(("strategy", "offload", "extra"), [c for c in CASES if c[0].startswith("zero")])
def test_deepspeed_json_is_accepted_by_deepspeed(
    tmp_path: Path, strategy: str, offload: str, extra: list[str]
) -> None:
    from deepspeed.runtime.config import DeepSpeedConfig

    files = plan_files(tmp_path, strategy, offload, extra, ["deepspeed.json", "accelerate.yaml", "hf.yaml"])
    hf = yaml.safe_load(files["hf.yaml"])
    assert hf["deepspeed"] == "deepspeed.json"
    cfg = resolve_auto(json.loads(files["deepspeed.json"]), hf, hidden=4096)
    ds = DeepSpeedConfig(cfg)
    assert ds.zero_optimization_stage == int(strategy[-1])
    z = ds.zero_config
    assert (z.offload_optimizer is not None and str(z.offload_optimizer.device).endswith("cpu")) == (
        offload != "none"
    )
    assert (z.offload_param is not None and str(z.offload_param.device).endswith("cpu")) == (offload == "all")
    # the files launch together: every header names the same launch line, which names both files
    launch = {line for text in files.values() for line in text.splitlines() if "launch: " in line}
    assert len({line.split("launch: ", 1)[1].rstrip('",') for line in launch}) == 1
    line = next(iter(launch))
    assert "hf.yaml" in line and "accelerate.yaml" in line


@pytest.mark.parametrize(("strategy", "offload", "extra"), CASES)
def test_accelerate_yaml_is_accepted_by_accelerate(
    tmp_path: Path, strategy: str, offload: str, extra: list[str]
) -> None:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    emits = ["accelerate.yaml"] + (["deepspeed.json"] if strategy.startswith("zero") else [])
    files = plan_files(tmp_path, strategy, offload, extra, emits)
    path = tmp_path / "accelerate.yaml"
    cfg = load_config_from_file(str(path))
    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    _validate_launch_command(args)
    nodes = 2 if "--nodes" in extra else 1
    assert args.num_processes == 8 * nodes and cfg.num_machines == nodes
    if strategy.startswith("zero"):
        assert args.use_deepspeed and cfg.deepspeed_config["deepspeed_config_file"] == "deepspeed.json"
        assert "mixed_precision" not in yaml.safe_load(files["accelerate.yaml"])
    elif strategy.startswith("fsdp"):
        assert args.use_fsdp
        fsdp = cfg.fsdp_config
        version = 1 if "--fsdp-version" in extra else 2
        assert fsdp["fsdp_version"] == version
        assert fsdp["fsdp_offload_params"] == (offload == "all")
        if version == 2:
            assert fsdp["fsdp_reshard_after_forward"] == (strategy != "fsdp-grad-op")
    else:
        assert args.multi_gpu


def test_inline_deepspeed_plugin_without_deepspeed_json(tmp_path: Path) -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    plan_files(tmp_path, "zero3", "optimizer", [], ["accelerate.yaml"])
    cfg = load_config_from_file(str(tmp_path / "accelerate.yaml"))
    ds = cfg.deepspeed_config
    assert ds["zero_stage"] == 3 and ds["offload_optimizer_device"] == "cpu" and ds["zero3_init_flag"] is True


def test_trainer_file_without_its_engine_config_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["plan", "llama-3.1-8b", "--method", "lora", "--on", "8xh100-80gb", *FIXED, "--strategy", "zero3"]
    rc = main([*args, "--emit", "hf.yaml", "-o", str(tmp_path)])
    assert rc == 2 and "--emit deepspeed.json" in capsys.readouterr().err


def test_axolotl_writes_its_own_fsdp_keys(tmp_path: Path) -> None:
    files = plan_files(tmp_path, "fsdp", "none", [], ["axolotl.yaml"])
    doc = yaml.safe_load(files["axolotl.yaml"])
    assert doc["fsdp_version"] == 2 and doc["fsdp_config"]["reshard_after_forward"] is True
    assert doc["gradient_checkpointing"] is False and doc["fsdp_config"]["activation_checkpointing"] is True
    assert "accelerate launch --num_processes 8 -m axolotl.cli.train axolotl.yaml" in files["axolotl.yaml"]


def test_acceptance_plan_70b_full_writes_files_that_launch_together(tmp_path: Path) -> None:
    args = ["plan", "llama-3.1-70b", "--method", "full", "--on", "8xh100-80gb", "--format", "json"]
    rc = main([*args, "--emit", "deepspeed.json", "--emit", "hf.yaml", "-o", str(tmp_path)])
    assert rc == 0
    ds = json.loads((tmp_path / "deepspeed.json").read_text())
    hf_text = (tmp_path / "hf.yaml").read_text()
    assert yaml.safe_load(hf_text)["deepspeed"] == "deepspeed.json"
    line = "trl sft --config hf.yaml --deepspeed deepspeed.json --num_processes 8"
    assert f"# launch: {line}" in hf_text and f"launch: {line}" in ds["_fitcheck"]
    assert ds["zero_optimization"]["stage"] == 3
