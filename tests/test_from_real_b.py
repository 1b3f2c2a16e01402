"""``--from`` on real example configs: torchtune, mlx-lm, kohya sd-scripts / kohya_ss, accelerate, DeepSpeed.

Every file below is copied from its trainer's own repository (tests/data/from/SOURCES.md). Each is run as a
user would: ``fitcheck check [MODEL] --from FILE --on TARGET --format json``. A file fitcheck can pose answers
0 or 1 and its posed setup (the reader's result, ``setup`` and ``setup_origin``) is compared with its golden
in tests/golden/from_real_b/ (``FITCHECK_UPDATE_GOLDEN=1 pytest tests/test_from_real_b.py`` regenerates them
after a deliberate change); a file it cannot pose is exit 2 with one ``fitcheck: error:`` line naming the key.
The facts each file is in the set for are asserted by hand beside the goldens (``READS``, ``REFUSED``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fitcheck.readers import read_config
from from_real_helpers import check_case_golden, posed, run_check

DATA = Path(__file__).parent / "data" / "from"
GOLDEN = Path(__file__).parent / "golden" / "from_real_b"
H100, H100X8, MAC = "h100-80gb", "8xh100-80gb", "apple-m3-max-36gb"

#: file -> (MODEL given on the command line, or None for the file's own; the target).
CASES: dict[str, tuple[str | None, str]] = {
    # torchtune: method and preset from the builder, recipes, memory knobs
    "torchtune/llama3_2-1B_lora_single_device.yaml": (None, H100),
    "torchtune/llama3-8B_qdora_single_device.yaml": (None, H100),
    "torchtune/llama3_1-8B_full_single_device.yaml": (None, H100),
    "torchtune/llama2-7B_full_low_memory.yaml": (None, H100),
    "torchtune/llama3_1-8B_lora.yaml": (None, H100X8),
    "torchtune/llama3_3-70B_full.yaml": (None, H100X8),
    "torchtune/llama3_1-405B_qlora.yaml": (None, H100X8),
    "torchtune/qwen3-0.6B_lora_single_device.yaml": (None, H100),
    "torchtune/qwen2_5-1.5B_full_single_device.yaml": (None, H100),
    "torchtune/mistral-7B_lora_single_device.yaml": (None, H100),
    "torchtune/gemma-2B_lora_single_device.yaml": (None, H100),  # gemma.lora_gemma_2b -> gemma-2b
    "torchtune/phi3-mini_lora_single_device.yaml": (None, H100),
    "torchtune/llama3_1-8B_lora_dpo_single_device.yaml": (None, H100),
    "torchtune/llama3_2-8B_to_1B_KD_lora_single_device.yaml": (None, H100),
    "torchtune/llama2-1B_full_ppo_low_memory_single_device.yaml": (None, H100),
    "torchtune/llama3_2-3B_qat_lora.yaml": (None, H100X8),
    "torchtune/llama3_2_vision-11B_lora_single_device.yaml": (None, H100),
    "torchtune/llama3_3-70B_full_multinode.yaml": (None, H100X8),
    "torchtune/generation.yaml": (None, H100),
    "torchtune/dev-3B_full_grpo.yaml": (None, H100X8),
    # mlx-lm
    "mlx/lora_config.yaml": ("llama-3.2-1b", MAC),
    "mlx/merge_config.yaml": (None, MAC),
    # kohya sd-scripts TOML (+ its dataset file)
    "kohya/hunyuan_lora.toml": ("sdxl", H100),
    "kohya/sdxl_lora_multires.toml": (None, H100),
    "kohya/dataset-multires.toml": ("sdxl", H100),
    # kohya_ss GUI presets and saved configs
    "kohya_ss/sdxl-lora-adafactor-v1.0.json": (None, H100),
    "kohya_ss/sdxl-loha-ai_characters-v1.0.json": (None, H100),
    "kohya_ss/sd15-edg_loconoptisettings.json": ("sd15", H100),
    "kohya_ss/sdxl-lora-kudou-reira-dadaptadam-v1.1.json": (None, H100),
    "kohya_ss/flux1d-adamw8bit-fp8.json": ("flux.1-dev", H100),
    "kohya_ss/sd15-lokr-v1.0.json": ("sd15", H100),
    "kohya_ss/finetune-lion.json": ("sdxl", H100),
    "kohya_ss/finetune-sdxl-ai_now-pagedadamw8bit-v1.0.json": (None, H100),
    "kohya_ss/dreambooth-adamw8bit.json": ("sd15", H100),
    "kohya_ss/dreambooth-sd3_bdsqlsz_v1.json": ("sd35-medium", H100),
    "kohya_ss/ti-adamw8bit.json": ("sd15", H100),
    "kohya_ss/sdxl-standard-adamw8bit.json": (None, H100),
    "kohya_ss/locon-adamw8bit-toml.json": ("sd15", H100),
    "kohya_ss/locon-prodigy.json": ("sd15", H100),
    # accelerate
    # the target's GPU count is the file's: two counts that disagree are refused (test_hostile_sweep)
    "accelerate/config_yaml_templates/deepspeed.yaml": ("llama-3.1-8b", "2xh100-80gb"),
    "accelerate/multi_node.yaml": ("llama-3.1-8b", "4xh100-80gb"),  # 8 processes over 2 machines
    "accelerate/fp8.yaml": ("llama-3.1-8b", H100X8),
    "accelerate/cp.yaml": ("llama-3.1-8b", H100X8),
    "accelerate/latest_fsdp.yaml": ("llama-3.1-8b", H100),
    # DeepSpeed JSON
    "deepspeed/zero_stage2_offload_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/zero_stage3_offload_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/ds_offload_nvme_aio.json": ("llama-3.1-8b", H100X8),
    "deepspeed/autosp_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/autotp_ds_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/bf16_full.json": ("llama-3.1-8b", H100X8),
    "deepspeed/zenflow_zf_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/onebitadam_bsz96_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/imagenet_ds_fp16_z1_config.json": ("llama-3.1-8b", H100X8),
    "deepspeed/zero2_torch_compile.json": ("llama-3.1-8b", H100X8),
}

#: file -> the setup facts it is in the set for (each checked against the posed setup, by hand).
READS: dict[str, dict[str, object]] = {
    # torchtune builds Phi-3 with q/k/v and gate/up/down apart (engine/regimes.py UNFUSED_TRAINERS)
    "torchtune/phi3-mini_lora_single_device.yaml": {
        "lora_targets": "q_proj,v_proj,o_proj,gate_proj,down_proj,up_proj",
        "trainer": "torchtune",
    },
    "torchtune/llama3_2-1B_lora_single_device.yaml": {
        "method": "lora",
        "lora_rank": 64,
        "trainer": "torchtune",
    },
    # lora_llama3_8b with quantize_base: True and use_dora: True is QDoRA (read as plain LoRA before)
    "torchtune/llama3-8B_qdora_single_device.yaml": {"method": "qlora", "dora": True, "lora_rank": 8},
    "torchtune/llama3_1-8B_full_single_device.yaml": {
        "method": "full",
        "optimizer": "paged-adamw8bit",
        "optimizer_in_bwd": True,
    },
    "torchtune/llama2-7B_full_low_memory.yaml": {"offload_activations": True, "optimizer": "paged-adamw"},
    # header: lora_finetune_distributed.py -> FSDP2
    "torchtune/llama3_1-8B_lora.yaml": {"strategy": "fsdp", "fsdp_version": 2, "method": "lora"},
    "torchtune/llama3_3-70B_full.yaml": {"strategy": "fsdp", "offload": "all", "fsdp_embedding_units": True},
    # header: lora_finetune_fsdp2.py; the old ``fsdp: {cpu_offload: False}`` block
    "torchtune/llama3_1-405B_qlora.yaml": {"strategy": "fsdp", "method": "qlora"},
    "torchtune/qwen3-0.6B_lora_single_device.yaml": {"method": "lora"},  # qwen3_0_6b_instruct -> qwen3-0.6b
    "torchtune/qwen2_5-1.5B_full_single_device.yaml": {"method": "full", "optimizer_in_bwd": True},
    "torchtune/mistral-7B_lora_single_device.yaml": {"method": "lora", "lora_rank": 64},
    "torchtune/gemma-2B_lora_single_device.yaml": {"method": "lora", "batch_size": 4},
    "mlx/lora_config.yaml": {"method": "lora", "lora_rank": 8, "seq_len": 2048, "trainer": "mlx"},
    "kohya/hunyuan_lora.toml": {
        "method": "lora",
        "lora_rank": 32,
        "precision": "fp16",
        "optimizer": "adamw8bit",
    },
    # three datasets (1024, 768, 512, batch 1 each): the largest per step sizes the run
    "kohya/sdxl_lora_multires.toml": {"resolution": 1024, "batch_size": 1, "attn": "sdpa"},
    "kohya_ss/sdxl-lora-adafactor-v1.0.json": {"optimizer": "adafactor", "lora_rank": 128, "batch_size": 5},
    "kohya_ss/sdxl-loha-ai_characters-v1.0.json": {"method": "lora", "batch_size": 8},
    "kohya_ss/sd15-edg_loconoptisettings.json": {"lora_targets": "conv", "resolution": 576},
    "kohya_ss/sdxl-lora-kudou-reira-dadaptadam-v1.1.json": {"lora_rank": 64, "batch_size": 6},
    "kohya_ss/flux1d-adamw8bit-fp8.json": {"fp8_base": True, "optimizer": "adamw8bit"},
    "kohya_ss/finetune-lion.json": {"method": "full", "optimizer": "lion", "train_text_encoder": True},
    # the finetune tab's sdxl_checkbox names the family; its train_text_encoder checkbox is off
    "kohya_ss/finetune-sdxl-ai_now-pagedadamw8bit-v1.0.json": {
        "method": "full",
        "optimizer": "paged-adamw8bit",
        "train_text_encoder": False,
    },
    # DreamBooth on SD 1.5 runs train_db.py: the text encoder trains (stop_text_encoder_training 0 = unset)
    "kohya_ss/dreambooth-adamw8bit.json": {"method": "full", "train_text_encoder": True, "batch_size": 4},
    "kohya_ss/dreambooth-sd3_bdsqlsz_v1.json": {"method": "full", "cache_text_encoder_outputs": True},
    "kohya_ss/sdxl-standard-adamw8bit.json": {
        "cache_text_encoder_outputs": True,
        "train_text_encoder": False,
    },
    # dataset_config ./test/config/dataset.toml (resolution 512, batch 4) read as sd-scripts reads it
    "kohya_ss/locon-adamw8bit-toml.json": {"resolution": 512, "batch_size": 4, "optimizer": "adamw8bit"},
    # the DeepSpeed JSON the YAML names (ZeRO-1) fills what the YAML leaves unset
    "accelerate/config_yaml_templates/deepspeed.yaml": {"strategy": "zero1"},
    "accelerate/multi_node.yaml": {"nodes": 2, "strategy": "ddp"},
    # mixed_precision no: no autocast, the weights in the load dtype
    "accelerate/latest_fsdp.yaml": {"strategy": "fsdp", "fsdp_version": 1, "autocast": False},
    "deepspeed/zero_stage2_offload_config.json": {"strategy": "zero2", "offload": "optimizer"},
    "deepspeed/zero_stage3_offload_config.json": {"strategy": "zero3", "offload": "all"},
    "deepspeed/ds_offload_nvme_aio.json": {"strategy": "zero3", "offload": "all"},
    "deepspeed/zenflow_zf_config.json": {"strategy": "zero2", "offload": "optimizer", "precision": "bf16"},
    "deepspeed/onebitadam_bsz96_config.json": {"precision": "fp16"},
    "deepspeed/imagenet_ds_fp16_z1_config.json": {"strategy": "zero1", "precision": "fp16"},
    "deepspeed/zero2_torch_compile.json": {"strategy": "zero2", "offload": "optimizer"},
}

#: file -> words the one error line must carry (the key that decides, or what cannot be posed).
REFUSED: dict[str, tuple[str, ...]] = {
    "torchtune/llama3_1-8B_lora_dpo_single_device.yaml": ("loss._component_ DPOLoss",),
    "torchtune/llama3_2-8B_to_1B_KD_lora_single_device.yaml": ("teacher_model", "knowledge distillation"),
    "torchtune/llama2-1B_full_ppo_low_memory_single_device.yaml": ("policy_model", "PPO"),
    "torchtune/llama3_2-3B_qat_lora.yaml": ("quantizer", "quantization-aware"),
    "torchtune/llama3_2_vision-11B_lora_single_device.yaml": ("model._component_", "multimodal"),
    "torchtune/llama3_3-70B_full_multinode.yaml": ("tensor_parallel_dim 8",),
    "torchtune/generation.yaml": ("no optimizer",),
    "torchtune/dev-3B_full_grpo.yaml": ("grpo_samples", "GRPO"),
    "mlx/merge_config.yaml": ("cannot tell which trainer",),
    "kohya/dataset-multires.toml": ("a kohya dataset config", "dataset_config"),
    "kohya_ss/sd15-lokr-v1.0.json": ("network_dim 100000", "LoKr"),
    "kohya_ss/ti-adamw8bit.json": ("token_string", "textual-inversion"),
    "kohya_ss/locon-prodigy.json": ("--lora-dropout", "network_dropout"),
    "accelerate/fp8.yaml": ("mixed_precision fp8",),
    "accelerate/cp.yaml": ("parallelism_config_cp_size 8", "context parallelism"),
    "deepspeed/autosp_config.json": ("sequence_parallel_size 2",),
    "deepspeed/autotp_ds_config.json": ("tensor_parallel.autotp_size 4",),
    "deepspeed/bf16_full.json": ("bf16.bf16_master_weights_and_grads",),
}


def _rel(text: str) -> str:
    return text.replace(str(DATA), "tests/data/from")


def _run(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, str]:
    model, target = CASES[name]
    return run_check(DATA / name, model, target, capsys)


def _posed(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    return posed(DATA / name, doc, _rel)


def _golden(name: str, data: dict[str, Any]) -> None:
    check_case_golden(GOLDEN, name, data)


def test_every_case_is_a_read_or_a_refusal() -> None:
    assert set(READS) | set(REFUSED) <= set(CASES)
    assert not set(READS) & set(REFUSED)
    assert all((DATA / name).is_file() for name in CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_config_poses_its_setup_or_refuses_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc, err = _run(name, capsys)
    if name in REFUSED:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("fitcheck: error: "), err
        assert all(word in lines[0] for word in REFUSED[name]), lines[0]
        _golden(name, {"exit": 2, "error": _rel(lines[0])})
        return
    assert rc in (0, 1) and doc is not None, err
    assert "Traceback" not in err
    for field, value in READS.get(name, {}).items():
        assert doc["setup"][field] == value, (field, doc["setup"][field])
        assert doc["setup_origin"][field] == "file" or field == "trainer", field
    _golden(name, _posed(name, doc))


def test_multires_dataset_sizes_the_largest_step(tmp_path: Path) -> None:
    """The dataset with the most pixels per step sizes the run, wherever it is in the file."""
    (tmp_path / "data.toml").write_text(
        "[general]\nbatch_size = 2\n[[datasets]]\nresolution = 512\n"
        "[[datasets]]\nresolution = [1024, 1024]\nbatch_size = 1\n[[datasets]]\nresolution = 768\n"
    )
    cfg = tmp_path / "lora.toml"
    cfg.write_text('network_module = "networks.lora"\ndataset_config = "data.toml"\ntrain_batch_size = 8\n')
    r = read_config(str(cfg))
    # 512^2 x 2 = 0.52 Mpx, 1024^2 x 1 = 1.05 Mpx, 768^2 x 2 = 1.18 Mpx: the third
    assert (r.values["resolution"], r.values["batch_size"]) == (768, 2)
    assert any("sized with dataset 3" in n for n in r.notes)


def test_torchtune_distributed_header_and_fsdp_keys(tmp_path: Path) -> None:
    """The header's recipe or a key only the FSDP recipes read makes the run FSDP2; neither: one GPU."""
    body = (
        "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n"
        "optimizer:\n  _component_: torch.optim.AdamW\n"
    )
    single = tmp_path / "single.yaml"
    single.write_text("# Config for single device LoRA in lora_finetune_single_device.py\n" + body)
    assert "strategy" not in read_config(str(single)).values
    dist = tmp_path / "dist.yaml"
    dist.write_text("# Config for multi-device LoRA in lora_finetune_distributed.py\n" + body)
    assert read_config(str(dist)).values["strategy"] == "fsdp"
    keyed = tmp_path / "keyed.yaml"
    keyed.write_text(body + "fsdp_reshard_after_forward: False\n")
    r = read_config(str(keyed))
    assert (r.values["strategy"], r.keys["strategy"]) == ("fsdp-grad-op", "fsdp_reshard_after_forward")


def test_accelerate_without_its_deepspeed_file_says_so(tmp_path: Path) -> None:
    cfg = tmp_path / "acc.yaml"
    cfg.write_text("distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: missing.json\n")
    r = read_config(str(cfg))
    assert "strategy" not in r.values
    assert any("missing.json is not beside this file" in n for n in r.notes)
