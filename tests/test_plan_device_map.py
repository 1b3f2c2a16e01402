"""plan searches --strategy device-map (HF device_map="auto" in one process) for --trainer hf.

The ranking puts it after every data-parallel point (one GPU works at a time), so it is chosen only when
no ddp/ZeRO/FSDP point fits, even with CPU offload; hf.yaml writes what makes ``trl sft`` dispatch the
model and a single-process launch; the other formats refuse it (docs/planner.md, docs/distributed.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.cli import main
from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.engine.states import counts
from fitcheck.planner import rules as R
from fitcheck.planner.search import rank_key
from fitcheck.planner.throughput import throughput
from fitcheck.sources.resolve import resolve_model
from plan_helpers import plan_for

GOLDEN = Path(__file__).parent / "golden" / "device-map"
#: Llama 3.1 70B QLoRA at 1,024 tokens on two RTX 5090s with 32 GB of RAM: no data-parallel point fits on
#: the GPUs (fsdp needs 30.58 GiB, its band over the 30.84 GiB budget; zero3 needs 38.89 GiB), and the
#: offloaded ones need more host RAM.
CASE = [
    "llama-3.1-70b",
    "--on",
    "rtx-5090",
    "--gpus",
    "2",
    "--method",
    "qlora",
    "--trainer",
    "hf",
    "--seq-len",
    "1024",
]
LOW_RAM = ["--host-memory", "32GB"]


def plan_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    rc = main(["plan", *args, "--format", "json"])
    out = capsys.readouterr().out
    return rc, json.loads(out) if out.strip() else {}


def test_chosen_when_no_data_parallel_point_fits(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = plan_json([*CASE, *LOW_RAM], capsys)
    assert rc == 0
    c = doc["chosen"]
    s = c["setup"]
    assert s["strategy"] == "device-map" and s["offload"] == "none"
    # one process trains the whole effective batch: no GPU factor
    assert s["batch_size"] * s["grad_accum"] == c["effective_batch"] == 16
    assert c["high_bytes"] <= c["budget_bytes"]
    assert doc["estimate"]["distributed"]["bottleneck_gpu"] == 1
    why = next(r for r in doc["reasons"] if r["choice"] == "strategy")
    assert why["rule"] == "device-map"
    assert "no data-parallel strategy fits" in why["text"] and "one GPU's speed" in why["text"]
    assert "zero3 needs" in why["text"]
    # the offloaded points fit the GPUs; the node's 32 GB of RAM is what they lack
    assert "zero3 + offload all needs" in why["text"] and "of host memory per node" in why["text"]


def test_offload_is_preferred_when_the_host_holds_it(capsys: pytest.CaptureFixture[str]) -> None:
    """With RAM for the offload, a data-parallel point fits and trains on both GPUs at once: it wins."""
    rc, doc = plan_json(CASE, capsys)
    assert rc == 0
    s = doc["chosen"]["setup"]
    assert s["strategy"] != "device-map" and s["offload"] == "all"


def test_faster_strategy_wins_when_both_fit(capsys: pytest.CaptureFixture[str]) -> None:
    """Qwen2.5 32B QLoRA on two RTX 5090s: a data-parallel point fits without offload and device-map fits
    too; the data-parallel point is chosen, and device-map asked for is slower."""
    rc, doc = plan_json(["qwen2.5-32b", *CASE[1:]], capsys)
    assert rc == 0
    assert doc["chosen"]["setup"]["strategy"] != "device-map"
    rc_dm, dm = plan_json(["qwen2.5-32b", *CASE[1:], "--strategy", "device-map"], capsys)
    assert rc_dm == 0 and dm["chosen"]["setup"]["strategy"] == "device-map"
    assert dm["chosen"]["throughput"]["tokens_per_s"] < doc["chosen"]["throughput"]["tokens_per_s"]
    why = next(r for r in doc["reasons"] if r["choice"] == "strategy")
    assert "device-map also fits, at one GPU's speed" in why["text"]


def test_70b_qlora_on_two_4090s_does_not_fit_device_map(capsys: pytest.CaptureFixture[str]) -> None:
    """The brief's example: 80 layers at 4 bits split 36/44 with the bf16 lm_head on GPU 1 need more
    than a 4090's budget on that GPU, so device-map does not fit and offloaded ZeRO-3 is the plan."""
    args = ["llama-3.1-70b", "--on", "rtx-4090", "--gpus", "2", "--method", "qlora", "--trainer", "hf"]
    rc, _ = plan_json([*args, "--strategy", "device-map"], capsys)
    assert rc == 1
    rc, doc = plan_json(args, capsys)
    assert rc == 0 and doc["chosen"]["setup"]["offload"] == "all"


def test_ranked_after_every_data_parallel_point() -> None:
    plan = plan_for("qwen2.5-32b", "2xrtx-5090", trainer="hf", method="qlora")
    assert plan.chosen is not None
    for st in R.STRATEGY_ORDER:
        for off in R.OFFLOAD_ORDER:
            assert R.dist_rank(st, off) < R.dist_rank("device-map", "none")
    assert STRATEGY_FACTS["device-map"].engine == "accelerate-device-map"
    key = rank_key(plan.chosen, ("qlora",), "cuda")
    assert key[2:4] == R.dist_rank(plan.chosen.setup.effective_strategy, plan.chosen.setup.offload)


def test_throughput_is_one_gpus() -> None:
    """device-map on 2 GPUs runs the same micro-steps as one GPU holding the model: same tokens/s."""
    plan = plan_for("llama-3.1-70b", "2xrtx-5090", trainer="hf", method="qlora", strategy="device-map")
    assert plan.chosen is not None
    s = plan.chosen.setup
    one = s.model_copy(update={"strategy": None, "gpus": 1})
    spec = resolve_model("llama-3.1-70b")
    n = counts(spec.arch, s).trainable
    split, alone = throughput(spec.arch, s, plan.device, n), throughput(spec.arch, one, plan.device, n)
    assert (split.tokens_per_s, split.step_s, split.micro_step_s) == (
        alone.tokens_per_s,
        alone.step_s,
        alone.micro_step_s,
    )
    assert split.mfu == pytest.approx(alone.mfu / 2, abs=1e-4)  # counted over both GPUs held
    assert s.data_ranks == 1 and s.world_size == 2


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--trainer", "axolotl", "--strategy", "device-map"], "plan does not search --strategy device-map"),
        (["--trainer", "llamafactory", "--strategy", "device-map"], "for --trainer llamafactory"),
        (["--gpus", "1", "--strategy", "device-map"], "use --gpus 2 or more"),
        (["--nodes", "2", "--strategy", "device-map"], "GPUs of one node"),
        (
            ["--strategy", "fsdp-no-shard", "--fsdp-version", "1"],
            "plan does not search --strategy fsdp-no-shard",
        ),
    ],
)
def test_refusals_are_one_line(args: list[str], needle: str, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--method", "qlora"]
    if "--gpus" not in args:
        base += ["--gpus", "2"]
    rc = main([*base, *args])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("fitcheck: error:") and needle in err and err.count("\n") == 1


def test_other_trainers_are_not_offered_device_map() -> None:
    plan = plan_for("llama-3.1-70b", "2xrtx-5090", trainer="axolotl", method="qlora")
    assert plan.chosen is None or plan.chosen.setup.strategy != "device-map"
    assert all(r.candidate.setup.strategy != "device-map" for r in plan.runners_up)


@pytest.mark.parametrize(
    ("fmt", "needle"),
    [
        ("accelerate.yaml", "accelerate.yaml: device-map runs one process"),
        ("deepspeed.json", "device-map runs one process without it"),
    ],
)
def test_other_formats_refuse(
    fmt: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["plan", *CASE, "--strategy", "device-map", "--emit", fmt, "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and err.count("\n") == 1
    assert not (tmp_path / fmt).exists()


def emit_hf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(["plan", *CASE, *LOW_RAM, "--emit", "hf.yaml", "-o", str(tmp_path), "--format", "json"])
    capsys.readouterr()
    assert rc == 0
    return (tmp_path / "hf.yaml").read_text()


def test_hf_yaml_golden(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = emit_hf(tmp_path, capsys)
    golden = GOLDEN / "hf.yaml"
    if os.environ.get("FITCHECK_UPDATE_GOLDEN"):
        golden.parent.mkdir(exist_ok=True)
        golden.write_text(text)
    assert text == golden.read_text(), "FITCHECK_UPDATE_GOLDEN=1 regenerates tests/golden/device-map/"
    head = [line for line in text.splitlines() if line.startswith("#")]
    # one process without a launcher: accelerate launch / torchrun would make TRL drop the device map
    assert "# run: python -m trl.scripts.sft --config hf.yaml" in head
    assert not any(w in line for line in head for w in ("trl sft", "accelerate", "torchrun", "num_processes"))


def test_hf_yaml_builds_with_trls_parser(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """TRL's own parser takes the file whole and SFTConfig carries the device map to from_pretrained."""
    trl_sft = pytest.importorskip("trl.scripts.sft")
    data = yaml.safe_load(emit_hf(tmp_path, capsys))
    assert data["model_init_kwargs"] == {"device_map": "auto"}
    data["output_dir"] = str(tmp_path / "out")
    path = tmp_path / "cfg.yaml"
    path.write_text(json.dumps(data))
    _script, sft, model_cfg, _data, *rest = trl_sft.make_parser().parse_args_and_config(
        ["--config", str(path), "--use_cpu", "True"],
        return_remaining_strings=True,
        separate_remaining_strings=True,
    )
    assert sft.model_init_kwargs == {"device_map": "auto"}
    assert model_cfg.load_in_4bit is True
    assert rest == [[], []]  # nothing left over for accelerate launch


def test_estimate_from_the_file_gives_the_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Round trip: the reader notes device_map (the file does not say how many GPUs); with --gpus 2
    --strategy device-map the estimate is the plan's (planned with TRL's fused LM head, the loss `trl sft`
    runs)."""
    rc, doc = plan_json([*CASE, *LOW_RAM, "--loss", "trl", "--emit", "hf.yaml", "-o", str(tmp_path)], capsys)
    assert rc == 0
    args = ["estimate", "--from", str(tmp_path / "hf.yaml"), "--on", "rtx-5090", "--format", "json"]
    assert main([*args, "--gpus", "2", "--strategy", "device-map"]) == 0
    captured = capsys.readouterr()
    est = json.loads(captured.out)
    assert "model_init_kwargs.device_map 'auto'" in captured.err
    assert est["device_bytes"] == doc["chosen"]["device_bytes"]
    assert est["setup"]["strategy"] == "device-map"


def test_the_run_line_names_a_runnable_trl_script() -> None:
    """``python -m trl.scripts.sft`` is the script ``trl sft`` launches, with its own ``__main__``."""
    import importlib.util

    spec = importlib.util.find_spec("trl.scripts.sft")
    if spec is None or spec.origin is None:
        pytest.skip("trl not installed")
    assert 'if __name__ == "__main__":' in Path(spec.origin).read_text()
