"""Hostile inputs, sixth red-team pass (session 23): one test per class of failure it found, each failing
before its fix.

- a model folder named with a newline (or a YAML line break, U+2028) broke the emitted files' comment lines
  (the header's model name, the ``reproduce:`` line): ``source env.sh`` ran the name's next line as a
  command, and hf.yaml read it as a key (`fitcheck.emitters.common.comment_block`, the kohya header);
- ``plan --offload`` on one GPU (no strategy offloads there) and ``--strategy ddp --offload optimizer``
  were an internal error, "the search space is empty" (`fitcheck.planner.rules.strategies`); a diffusion
  plan with ``--offload`` too (`fitcheck.api._plan_diffusion`);
- a Hub id the Hub's rules refuse (``org/name--x``, ``org/name.``, a name over 96 characters) was
  huggingface_hub's ``HFValidationError``, an internal error (now that validator is called first, before
  any request: `fitcheck.sources.hub.spec_from_hub`);
- ``hw --format json|yaml|markdown`` into a full device exited 0 with the answer lost (click's echo wrote
  around the guarded stdout: `fitcheck.commands.hw._emit`);
- ``measure --device cpu`` on a model larger than the machine's RAM ran into the allocator, reported as
  "config.json: transformers cannot build ..." (`fitcheck.commands.measure._check_ram`,
  `fitcheck.measure.build.OUT_OF_MEMORY`);
- model reach: ``"shared_expert_intermediate_size": 0`` (Qwen3-Coder-480B's published config) and MiniCPM's
  ``num_experts: 0`` were refused as sizes below 1 (`fitcheck.sources.hf_config.ZERO_IS_NONE`);
- ``--from`` a launch config: the method it was sized as went unsaid, and accelerate's ``mixed_precision:
  'no'`` read as an fp32 run (`fitcheck.readers.report`, `fitcheck.readers.accelerate`); values accelerate or
  DeepSpeed would refuse (ZeRO stage 7, an offload device 5, FSDP sharding 99, ``num_machines: 0``, bf16 and
  fp16 both on), torchtune LoRA on no module and a kohya ``dataset_config = 5`` were read as defaults
  without a word (`fitcheck.readers.accelerate`, `.deepspeed`, `.torchtune`, `.kohya`); a file value out
  of range named only the flag (`fitcheck.cli.FromFile.blame`, which plan now runs too);
- ``--chart`` / ``--timeline`` ``out/a.svg/`` wrote the file ``out/a.svg`` (`fitcheck.chart.chart_path`); one
  format emitted twice said a file was "named twice" (`fitcheck.commands.plan.resolve_emits`).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from fitcheck.cli import main

CONFIG = {
    "model_type": "llama",
    "hidden_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "intermediate_size": 1024,
    "vocab_size": 32000,
}


@pytest.mark.parametrize("brk", ["\n", "\r", "\u2028", "\x85"])
def test_a_line_break_in_a_model_name_stays_inside_the_comment(
    brk: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    name = f"m{brk}touch PWNED{brk}pwned_key: 99{brk}#"
    (tmp_path / name).mkdir()
    (tmp_path / name / "config.json").write_text(json.dumps(CONFIG))
    rc = main(["plan", f"./{name}", "--on", "24GB", "--emit", "env.sh", "--emit", "hf.yaml", "-o", "out"])
    capsys.readouterr()
    assert rc == 0
    for f in ("env.sh", "hf.yaml"):
        text = (tmp_path / "out" / f).read_text()
        assert not any(line.startswith(("touch", "pwned_key")) for line in text.splitlines()), f
    assert "pwned_key" not in yaml.safe_load((tmp_path / "out" / "hf.yaml").read_text())
    subprocess.run(["bash", "-c", "source out/env.sh"], cwd=tmp_path, check=True, capture_output=True)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["7B", "--on", "24GB", "--offload", "optimizer"], "--offload optimizer needs a sharded strategy"),
        (["7B", "--on", "24GB", "--offload", "all"], "(fsdp, zero3); name one with --strategy"),
        (
            ["7B", "--on", "2x4090", "--strategy", "ddp", "--offload", "optimizer"],
            "--strategy ddp offloads none",
        ),
        (["sdxl", "--on", "24GB", "--offload", "optimizer"], "kohya sd-scripts offloads nothing"),
    ],
)
def test_an_offload_no_strategy_takes_is_refused_in_one_line(
    args: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["plan", *args]) == 2
    err = capsys.readouterr().err
    assert words in err and "internal error" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("repo", ["org/name--x", "org/name.", "org/" + "n" * 97, "org/name.git", "o..g/name"])
def test_an_impossible_hub_id_is_bad_input(repo: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["estimate", "--on", "24GB", "--", repo]) == 2
    err = capsys.readouterr().err
    assert "internal error" not in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("fmt", ["json", "yaml", "markdown"])
def test_hw_reports_a_failed_write(fmt: str, tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        r = subprocess.run(["fitcheck", "hw", "-f", fmt], stdout=full, stderr=subprocess.PIPE, text=True)
    assert r.returncode == 2 and "cannot write the answer to stdout" in r.stderr, r.stderr


def test_measure_on_the_cpu_refuses_a_model_over_the_ram(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("torch")
    from fitcheck.hardware import probes
    from fitcheck.hardware.detected import CpuMemory

    small = CpuMemory(total_bytes=2**30, available_bytes=2**29, method="test")
    monkeypatch.setattr(probes, "probe_cpu", lambda env: (small, probes.Found()))
    assert main(["measure", "qwen2.5-0.5b", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "runs the step for real" in err and "0.5 GiB available" in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_allocator_failure_is_named_as_such() -> None:
    pytest.importorskip("transformers")
    from fitcheck.errors import ModelSourceError
    from fitcheck.measure.build import transformers_call

    def boom() -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")

    with pytest.raises(ModelSourceError, match="out of memory building the llama model"):
        transformers_call("llama", boom)


QWEN3_MOE = {
    "model_type": "qwen3_moe",
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    ("base", "key", "refused"),
    [
        (QWEN3_MOE, "shared_expert_intermediate_size", False),  # Qwen3-Coder-480B publishes 0
        ({**CONFIG, "model_type": "minicpm"}, "num_experts", False),  # MiniCPM: 0 is the dense MLP
        (QWEN3_MOE, "num_experts", True),  # a MoE without experts stays refused
    ],
)
def test_a_zero_that_means_none_is_read_as_none(
    base: dict[str, object], key: str, refused: bool, tmp_path: Path
) -> None:
    """A size key whose 0 the model code reads as "none" (`hf_config.ZERO_IS_NONE`) counts as absent; the
    check had refused it ("must be a whole number from 1")."""
    from fitcheck.errors import ModelSourceError
    from fitcheck.sources.resolve import resolve_model

    def total(cfg: dict[str, object], name: str) -> int:
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        from fitcheck import api

        return api.estimate(resolve_model(str(tmp_path / name)), method="full").params.total

    without = {k: v for k, v in base.items() if k != key}
    if refused:
        with pytest.raises(ModelSourceError, match=f"{key} must be a whole number"):
            total({**base, key: 0}, "zero")
        return
    assert total({**base, key: 0}, "zero") == total(without, "absent")


def test_a_launch_config_names_what_it_does_not_say(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An accelerate file says how the run is spread, not what it trains: the method fitcheck sized is named
    (it was LoRA without a word); ``mixed_precision: 'no'`` turns autocast off and leaves the weights in the
    load dtype (it was read as an fp32 run, up to three times the memory of the bf16 one)."""
    path = tmp_path / "acc.yaml"
    path.write_text("distributed_type: MULTI_GPU\nnum_processes: 2\nmixed_precision: 'no'\n")
    assert main(["estimate", "qwen2.5-0.5b", "--from", str(path), "--on", "none", "--format", "json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert "does not say what is trained: sized as --method lora" in err
    assert doc["setup"]["autocast"] is False and doc["setup"]["precision"] == "bf16"
    assert main(["estimate", "qwen2.5-0.5b", "--from", str(path), "--method", "full", "--on", "none"]) == 0
    assert "does not say what is trained" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        (
            "a.yaml",
            "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 7\n",
            "zero_stage must be 0, 1, 2 or 3",
        ),
        (
            "b.yaml",
            "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  zero_stage: 2\n"
            "  offload_optimizer_device: 5\n",
            "offload_optimizer_device is one of none, cpu, nvme",
        ),
        (
            "c.yaml",
            "distributed_type: FSDP\nnum_processes: 2\nfsdp_config:\n  fsdp_sharding_strategy: 99\n",
            "is not a sharding strategy",
        ),
        (
            "d.yaml",
            "distributed_type: MULTI_GPU\nnum_processes: 2\nnum_machines: 0\n",
            "num_machines must be 1",
        ),
        (
            "e.json",
            '{"bf16": {"enabled": true}, "fp16": {"enabled": true}, "train_micro_batch_size_per_gpu": 1}',
            "both true, which DeepSpeed refuses",
        ),
        (
            "f.json",
            '{"zero_optimization": {"stage": 2, "offload_optimizer": {"device": 5}}, '
            '"train_micro_batch_size_per_gpu": 1}',
            "an offload device is one of none, cpu, nvme",
        ),
    ],
)
def test_a_launch_config_value_nothing_reads_is_refused(
    name: str, text: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Values accelerate or DeepSpeed would refuse were read as their defaults without a word (a ZeRO stage
    7 as DDP, a numeric offload device as no offload, both 16-bit modes as fp16)."""
    path = tmp_path / name
    path.write_text(text)
    assert main(["estimate", "llama-3.1-8b", "--from", str(path), "--on", "80GB"]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


def test_torchtune_lora_on_no_module_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``lora_attn_modules: []`` without MLP LoRA trains nothing; it was sized as all-linear."""
    path = tmp_path / "tt.yaml"
    path.write_text(
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: []\n"
        "  apply_lora_to_mlp: False\n  lora_rank: 8\nbatch_size: 2\n"
    )
    assert main(["estimate", "--from", str(path), "--on", "80GB"]) == 2
    err = capsys.readouterr().err
    assert "no adapter to train" in err, err


def test_kohya_dataset_config_is_a_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "train.toml"
    path.write_text(
        'pretrained_model_name_or_path = "/x/sdxl.safetensors"\nnetwork_module = "networks.lora"\n'
        "dataset_config = 5\n"
    )
    assert main(["estimate", "sdxl", "--from", str(path), "--on", "24GB"]) == 2
    assert "dataset_config is a file name" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", [["estimate", "7B", "--chart"], ["plan", "7B", "--chart"]])
def test_a_chart_name_ending_in_a_folder_is_refused(
    cmd: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--chart out/a.svg/`` wrote a regular file ``out/a.svg`` (Path drops the slash); --emit refuses it."""
    name = str(tmp_path / "a.svg") + "/"
    assert main([*cmd, name, "--on", "24GB"]) == 2
    assert "names a folder" in capsys.readouterr().err
    assert not (tmp_path / "a.svg").exists()


def test_one_format_emitted_twice_is_named_as_such(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "out/b.hf.yaml is named twice" though each name was given once."""
    args = ["plan", "llama-3.1-8b", "--on", "24GB", "--emit", "a.hf.yaml", "--emit", "b.hf.yaml"]
    assert main([*args, "-o", str(tmp_path)]) == 2
    assert "a.hf.yaml and b.hf.yaml: hf.yaml is asked twice" in capsys.readouterr().err


@pytest.mark.parametrize("cmd", ["estimate", "check", "plan"])
def test_a_file_value_out_of_range_names_the_file_and_its_key(
    cmd: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bound broken by a file's value named only the flag the user never typed (and plan printed the
    file report first, so the error was not one line)."""
    path = tmp_path / "ax.yaml"
    path.write_text(
        "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_dropout: 5\nsequence_len: 1024\n"
    )
    assert main([cmd, "llama-3.1-8b", "--from", str(path), "--on", "24GB"]) == 2
    err = capsys.readouterr().err
    assert f"the value comes from {path}, lora_dropout" in err and len(err.strip().splitlines()) == 1, err


def test_a_size_may_start_with_its_point_and_shows_without_an_exponent() -> None:
    """``--on .5GB`` said "memory must be a number above zero"; ``--on 1024TB`` showed
    ``cuda-1.04858e+06gib``."""
    from fitcheck import api

    assert api.target("1024TB").id == "cuda-1048576gib"  # type: ignore[union-attr]
    assert api.target("36GB-unified").id == "mac-36gib-unified"  # type: ignore[union-attr]
    assert api.target("1.5GB").id == "cuda-1.5gib"  # type: ignore[union-attr]
    from fitcheck.units import parse_memory

    assert parse_memory(".5GB") == parse_memory("0.5GB")


def test_an_accelerate_config_in_json_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """accelerate loads a .json config as well (ms-swift ships examples/train/multi-gpu/fsdp_qlora/
    fsdp_offload.json): it was 'cannot tell which trainer'."""
    path = tmp_path / "fsdp_offload.json"
    path.write_text(
        json.dumps(
            {
                "compute_environment": "LOCAL_MACHINE",
                "distributed_type": "FSDP",
                "fsdp_config": {"fsdp_offload_params": True, "fsdp_sharding_strategy": "FULL_SHARD"},
                "mixed_precision": "bf16",
                "num_machines": 1,
                "num_processes": 2,
            }
        )
    )
    args = [
        "estimate",
        "qwen2.5-0.5b",
        "--method",
        "full",
        "--from",
        str(path),
        "--on",
        "none",
        "--format",
        "json",
    ]
    assert main(args) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["setup"]["strategy"], doc["setup"]["offload"], doc["setup"]["gpus"]) == ("fsdp", "all", 2)


def test_hw_list_takes_a_backend_in_any_case(capsys: pytest.CaptureFixture[str]) -> None:
    """``--on`` is case-blind; ``hw list --backend CUDA`` was refused."""
    assert main(["hw", "list", "--backend", "CUDA", "-f", "json"]) == 0
    devices = json.loads(capsys.readouterr().out)["devices"]
    assert devices and all(d["backend"] == "cuda" for d in devices)


@pytest.mark.parametrize(
    ("name", "text", "gpus"),
    [
        ("ax.yaml", "base_model: x\nadapter: lora\nuse_ray: true\nray_num_workers: 4\n", 4),
        ("ax2.yaml", "base_model: x\nadapter: lora\nuse_ray: false\nray_num_workers: 4\n", 1),
        (
            "ax3.yaml",
            "base_model: x\nadapter: lora\nuse_ray: true\nray_num_workers: 2\n"
            "resources_per_worker:\n  GPU: 2\n",
            4,
        ),
        ("lmf.yaml", "model_name_or_path: x\nstage: sft\nfinetuning_type: lora\nray_num_workers: 4\n", 4),
    ],
)
def test_ray_workers_are_the_runs_gpus(
    name: str, text: str, gpus: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """axolotl's use_ray and LLaMA-Factory's Ray runs spread over ray_num_workers workers; they were
    sized on one GPU (the key listed as not understood)."""
    path = tmp_path / name
    path.write_text(text)
    args = ["estimate", "llama-3.2-1b", "--from", str(path), "--on", "none", "--format", "json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["gpus"] == gpus


def test_mlx_lm_reads_its_old_lora_layers_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``lora_layers`` (mlx-lm's name before ``num_layers``, mlx-examples lora_config.yaml @39084e81) was
    "not understood" while the note said "num_layers unset ... 16"."""
    path = tmp_path / "lora_config.yaml"
    path.write_text("model: mlx-community/x\ntrain: true\nbatch_size: 4\nlora_layers: 8\n")
    assert (
        main(["estimate", "qwen2.5-0.5b", "--from", str(path), "--from-format", "mlx", "--on", "none"]) == 0
    )
    err = capsys.readouterr().err
    assert "lora_layers 8: mlx-lm adapts only the last 8 blocks" in err and "num_layers unset" not in err
