"""Hostile inputs, seventh pass (session 24): one test per class of failure, each failing before its fix.

- ``--no-double-quant`` with ``--method lora`` or ``full`` changed nothing and said nothing (only QLoRA's NF4
  base has constants to quantize again: `fitcheck.api.refuse_inert`); a file's ``double_quant`` for a
  method the command line replaced is dropped, not refused (`fitcheck.readers.merge`);
- ``--epochs nan`` said "greater than or equal to 0" and ``--epochs 0`` was let through the CLI's range
  (the API refuses it): pydantic's own messages now (`fitcheck.commands.plan.EpochsO`);
- a kohya ``resolution = "1e3,1e3"`` was read as 1000 px, where sd-scripts' ``int()`` stops the run
  (`fitcheck.readers.kohya._resolution`);
- kohya_ss's ``sdxl_checkbox`` with a named model file was "not understood", ``hub_always_push`` "may change
  memory" (`fitcheck.readers.kohya.GUI_MODEL_KIND`, `fitcheck.readers.neutral`);
- on a machine without a GPU and no ``--on``, a file asking for FlashAttention-2 or a CUDA-only trainer was
  refused as if the run were for this CPU ("not cpu; use --attn sdpa"), not told to name its GPU
  (`fitcheck.api.refuse_gpu_run_here`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.hardware.env import ProbeEnv
from hw_replay import env_from_fixture
from test_fuzz_cli import hold_contract, invoke


@pytest.mark.parametrize("method", ["lora", "full"])
@pytest.mark.parametrize("command", ["estimate", "check", "plan"])
def test_no_double_quant_without_an_nf4_base_is_refused(command: str, method: str) -> None:
    args = [command, "llama-3.1-8b", "-m", method, "--no-double-quant", "--on", "rtx-4090"]
    rc, out, err = invoke(args)
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and f"--no-double-quant applies to QLoRA's NF4 base, not --method {method}" in err


@pytest.mark.parametrize("args", [["estimate", "-m", "qlora"], ["plan"], ["plan", "-m", "qlora"]])
def test_no_double_quant_is_taken_where_qlora_may_run(args: list[str]) -> None:
    rc, out, err = invoke([args[0], "llama-3.1-8b", *args[1:], "--no-double-quant", "--on", "rtx-4090",
                           "--format", "json"])  # fmt: skip
    assert rc in (0, 1) and json.loads(out)["schema_version"] == 2, err


def test_a_files_double_quant_is_dropped_for_the_method_the_command_line_gives(tmp_path: Path) -> None:
    cfg = tmp_path / "q.axolotl.yaml"
    cfg.write_text(
        "base_model: meta-llama/Llama-3.1-8B\nadapter: qlora\nload_in_4bit: true\n"
        "bnb_config_kwargs:\n  bnb_4bit_use_double_quant: false\nsequence_len: 1024\n"
    )
    rc, out, err = invoke(["estimate", "--from", str(cfg), "-m", "lora", "--on", "rtx-4090", "-f", "json"])
    assert rc in (0, 1) and json.loads(out)["setup"]["method"] == "lora", err
    rc, out, err = invoke(["estimate", "--from", str(cfg), "--on", "rtx-4090", "-f", "json"])
    assert rc in (0, 1) and json.loads(out)["setup"]["double_quant"] is False, err


@pytest.mark.parametrize(
    ("epochs", "said"),
    [("nan", "finite number"), ("inf", "finite number"), ("0", "greater than 0"), ("-1", "greater than 0")],
)
def test_epochs_out_of_range_says_why(epochs: str, said: str) -> None:
    args = ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--dataset-tokens", "1M", "--epochs", epochs]
    rc, out, err = invoke(args)
    hold_contract("plan", args, rc, out, err)
    assert rc == 2 and "--epochs" in err and said in err, err


@pytest.mark.parametrize("res", ["1e3,1e3", "1024.0", "1024,x", "0x400"])
def test_a_kohya_resolution_sd_scripts_cannot_read_is_refused(res: str, tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        'pretrained_model_name_or_path = "stabilityai/stable-diffusion-xl-base-1.0"\n'
        f'resolution = "{res}"\nnetwork_module = "networks.lora"\nsdxl = true\n'
    )
    args = ["estimate", "--from", str(cfg), "--on", "rtx-4090"]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and "resolution must be a size in pixels" in err, err


@pytest.mark.parametrize("res", ["1024,1024", " 1024 , 1024", "1024"])
def test_a_kohya_resolution_int_reads_is_taken(res: str, tmp_path: Path) -> None:
    cfg = tmp_path / "k.toml"
    cfg.write_text(
        'pretrained_model_name_or_path = "stabilityai/stable-diffusion-xl-base-1.0"\n'
        f'resolution = "{res}"\nnetwork_module = "networks.lora"\nsdxl = true\n'
    )
    rc, out, err = invoke(["estimate", "--from", str(cfg), "--on", "rtx-4090", "-f", "json"])
    assert rc in (0, 1) and json.loads(out)["setup"]["resolution"] == 1024, err


def test_kohya_gui_model_kind_and_hub_keys_are_understood(tmp_path: Path) -> None:
    cfg = tmp_path / "gui.json"
    cfg.write_text(
        json.dumps(
            {
                "pretrained_model_name_or_path": "stabilityai/stable-diffusion-xl-base-1.0",
                "sdxl_checkbox": True,
                "train_batch_size": 1,
                "max_resolution": "1024,1024",
                "mixed_precision": "bf16",
                "hub_always_push": False,
                "LoRA_type": "Standard",
            }
        )
    )
    rc, _, err = invoke(["estimate", "--from", str(cfg), "--on", "rtx-4090", "-f", "json"])
    assert rc in (0, 1) and "not understood" not in err, err
    assert "not used (no memory effect): hub_always_push" in err


@pytest.fixture
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    machine = env_from_fixture("container_cgroup")
    monkeypatch.setattr(ProbeEnv, "real", classmethod(lambda cls, use_torch=False: machine))


@pytest.mark.parametrize(
    ("command", "text", "said"),
    [
        (cmd, "adapter: lora\nflash_attention: true\n", "--attn flash: FlashAttention-2 runs on NVIDIA")
        for cmd in ("estimate", "check", "plan")
    ]
    # plan refuses a trainer that does not run here (estimate sizes its run in this machine's RAM)
    + [("plan", "adapter: lora\n", "--trainer axolotl runs on cuda and rocm")],
)
def test_a_gpu_run_read_on_a_machine_without_one_asks_for_its_gpu(
    command: str, text: str, said: str, no_gpu: None, tmp_path: Path
) -> None:
    cfg = tmp_path / "run.axolotl.yaml"
    cfg.write_text(f"base_model: meta-llama/Llama-3.1-8B\nsequence_len: 1024\n{text}")
    args = [command, "--from", str(cfg), *(["--on", "AUTO"] if command == "check" else [])]
    rc, out, err = invoke(args)
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and "this machine has no GPU: name the GPU the run trains on with --on" in err, err
    # plan searches the attention kernel (a file does not fix it): the trainer is what it refuses there
    assert said in err or (command == "plan" and "--trainer axolotl runs on cuda" in err), err


def test_a_cpu_named_with_on_keeps_the_cpu_refusal() -> None:
    rc, _, err = invoke(["estimate", "llama-3.1-8b", "--attn", "flash", "--on", "cpu"])
    assert rc == 2 and "not cpu; use --attn sdpa" in err, err


def test_mlx_read_on_a_machine_without_a_gpu_asks_for_a_mac(no_gpu: None) -> None:
    rc, _, err = invoke(["plan", "llama-3.1-8b", "--trainer", "mlx"])
    assert rc == 2 and "name the Mac the run trains on with --on" in err, err


TORCHTUNE = """model:
  _component_: torchtune.models.llama3_2.lora_llama3_2_3b
  lora_attn_modules: ['q_proj', 'v_proj']
  lora_rank: 8
  lora_alpha: 16
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/tokenizer.model
  max_seq_len: 2048
dataset:
  _component_: torchtune.datasets.alpaca_cleaned_dataset
  packed: {packed}
batch_size: {batch}
device: {device}
dtype: bf16
"""


@pytest.mark.parametrize(
    ("packed", "batch", "device", "said", "unsaid"),
    [
        ("False", 4, "cuda", "dataset not packed: each micro-batch of 4 is padded", "FlexAttention"),
        ("False", 1, "cuda:0", None, "padded"),
        ("True", 4, "cuda", "FlexAttention on an NVIDIA GPU of compute capability 7.5", "padded"),
        ("False", 1, "cpu", "device 'cpu': the recipe runs there; name that machine with --on", "padded"),
    ],
)
def test_torchtune_device_and_packing_are_read(
    packed: str, batch: int, device: str, said: str | None, unsaid: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "tt.yaml"
    cfg.write_text(TORCHTUNE.format(packed=packed, batch=batch, device=device))
    rc, _, err = invoke(["estimate", "llama-3.2-3b", "--from", str(cfg), "--on", "rtx-4090", "-f", "json"])
    assert rc in (0, 1) and "not understood" not in err, err
    assert (said is None or said in err) and unsaid not in err, err
