"""``--from`` on real example configs, round c: files of axolotl, LLaMA-Factory, TRL, torchtune and kohya
sd-scripts that rounds a and b did not hold (tests/data/from/real_c/README.md gives each file's source URL
and commit).

Each file is run as a user would: ``fitcheck check [MODEL] --from FILE --on TARGET --format json`` (MODEL is a
preset of the same shape when the file's Hub model is no preset: the tests never reach the network). A file
fitcheck can pose answers 0 or 1, and what it reads to (the reader's values, keys, notes, unused keys, and the
posed ``setup`` / ``setup_origin``) is compared with its golden in tests/golden/from_real_c/
(``FITCHECK_UPDATE_GOLDEN=1 pytest tests/test_from_real_c.py`` rewrites them after a deliberate change; read
the diff). A file it cannot pose is exit 2 with one ``fitcheck: error:`` line naming the key. The facts each
file is in the set for are written out by hand beside the goldens (``READS``, ``NOTES``, ``REFUSED``), each
checked against the trainer's own code (cited in the readers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fitcheck.errors import FitcheckError
from fitcheck.readers import read_config
from fitcheck.readers.neutral import is_neutral
from from_real_helpers import check_case_golden, posed, run_check

DATA = Path(__file__).parent / "data" / "from" / "real_c"
GOLDEN = Path(__file__).parent / "golden" / "from_real_c"
H100, H100X8 = "h100-80gb", "8xh100-80gb"
MOE = "qwen3-30b-a3b"  # the MoE preset standing in for MoE files whose Hub model is no preset

#: file -> (MODEL given on the command line, or None for the file's own; the target).
CASES: dict[str, tuple[str | None, str]] = {
    # axolotl @067b021c: newer models (stand-ins of the same shape where the Hub id is no preset)
    "axolotl/gpt-oss-20b-sft-lora-singlegpu.yaml": (MOE, H100),
    "axolotl/gpt-oss-120b-fft-fsdp2-offload.yaml": (MOE, H100X8),
    "axolotl/qwen3-32b-qlora.yaml": (None, H100),
    "axolotl/qwen3-8b-lora-fused-attn-compile.yaml": (None, H100),
    "axolotl/gemma-3-4b-qlora.yml": (None, H100),
    "axolotl/gemma-3n-e2b-qlora.yml": ("gemma-3-4b", H100),
    "axolotl/llama4-maverick-qlora-fsdp1.yaml": (MOE, H100X8),
    "axolotl/deepseek-v2-fft-fsdp-16b.yaml": (MOE, H100X8),
    "axolotl/deepseek-v4-flash-nvfp4-lora.yaml": (MOE, H100X8),
    "axolotl/qwen3-next-80b-a3b-qlora.yaml": (MOE, H100),
    "axolotl/glm47-flash-lora_fsdp.yaml": (MOE, H100X8),
    "axolotl/llama-2-loftq.yml": ("llama-2-7b", H100),
    "axolotl/pythia-12b-config.yml": ("llama-2-13b", H100),
    "axolotl/qwen2-muon-pretrain-fsdp2.yaml": (None, H100X8),
    "axolotl/falcon-e-3b-ft.yaml": ("llama-3.2-3b", H100),
    "axolotl/mixtral-8x22b-qlora-fsdp.yml": ("mixtral-8x7b", H100X8),
    "axolotl/jamba-qlora_deepspeed.yaml": ("mixtral-8x7b", H100X8),
    # LLaMA-Factory @ff6d4d12
    "llamafactory/qwen3vl_full_sft.yaml": ("gemma-3-4b", H100X8),
    "llamafactory/pissa_llama3_lora_sft.yaml": (None, H100),
    "llamafactory/qwen3_5moe_lora_sft_fsdp2.yaml": (MOE, H100X8),
    "llamafactory/llama3_lora_sft_awq.yaml": ("llama-3-8b", H100),
    "llamafactory/qwen3_lora_sft_ds3.yaml": ("qwen3-4b", H100X8),
    # LLaMA-Factory @7621526d (2024): a chat config and an evaluation config, neither with do_train
    "llamafactory/inference_llama3_2024.yaml": (None, H100),
    "llamafactory/llama3_lora_eval_2024.yaml": (None, H100),
    # TRL's accelerate configs @f2cd5771
    "accelerate/trl-single_gpu.yaml": ("llama-3.1-8b", H100),
    "accelerate/trl-deepspeed_zero2.yaml": ("llama-3.1-8b", H100X8),
    "accelerate/trl-alst_ulysses_4gpu.yaml": ("llama-3.1-8b", H100X8),
    "accelerate/trl-multi_gpu.yaml": ("llama-3.1-8b", H100X8),
    # TRL's CLI page @f2cd5771: keys trl hands to accelerate launch, a GRPO config
    "trl/clis-sft-num_processes.yaml": (None, "4xh100-80gb"),  # num_processes: 4
    "trl/clis-sft-accelerate_config.yaml": (None, H100X8),
    "trl/clis-grpo.yaml": (None, H100X8),
    # torchtune @bd2a0fc7
    "torchtune/dev-8B_full_experimental.yaml": (None, H100X8),
    "torchtune/gemma2-9B_qlora_single_device.yaml": (None, H100),
    "torchtune/llama3_1-70B_lora.yaml": (None, H100X8),
    "torchtune/qwen3-8B_full_single_device.yaml": (None, H100),
    "torchtune/llama3_1-8B_full_2024.yaml": (None, H100X8),  # @288ff443 (2024): optimizer.foreach False
    # kohya sd-scripts @48d368fa (docs/train_lllite_README.md)
    "kohya/lllite-sdxl.toml": ("sdxl", H100),
}

#: Files a case names (its DeepSpeed JSON), kept at the relative path the case gives.
COMPANIONS = {"axolotl/deepspeed_configs/zero2.json", "llamafactory/examples/deepspeed/ds_z3_config.json"}

#: file -> setup facts it is in the set for, as the trainer runs it (each from the file: origin "file").
READS: dict[str, dict[str, object]] = {
    "axolotl/gpt-oss-20b-sft-lora-singlegpu.yaml": {
        "method": "lora",
        "lora_rank": 8,
        "lora_targets": "linear-modules",
        "optimizer": "adamw8bit",  # adamw_torch_8bit
        "offload_activations": True,  # activation_offloading: true
        "attn": "flash",  # kernels-community/vllm-flash-attn3
        "loss": "cce",  # the CCE plugin's cut_cross_entropy defaults to true
    },
    "axolotl/gpt-oss-120b-fft-fsdp2-offload.yaml": {
        "method": "full",
        "strategy": "fsdp",
        "offload": "all",
        "fsdp_version": 2,
    },
    "axolotl/qwen3-32b-qlora.yaml": {"method": "qlora", "lora_rank": 16, "offload_activations": True},
    "axolotl/qwen3-8b-lora-fused-attn-compile.yaml": {"method": "lora", "compile": True, "seq_len": 4096},
    "axolotl/llama4-maverick-qlora-fsdp1.yaml": {"method": "qlora", "strategy": "fsdp", "offload": "all"},
    "axolotl/deepseek-v2-fft-fsdp-16b.yaml": {"method": "full", "strategy": "fsdp", "offload": "all"},
    "axolotl/deepseek-v4-flash-nvfp4-lora.yaml": {
        "lora_targets": "experts.gate_up_proj,experts.down_proj",
        "attn": "eager",
    },
    "axolotl/llama-2-loftq.yml": {"method": "lora", "lora_rank": 32},  # LoftQ: no 4-bit base in the step
    # float16: true with bf16 and fp16 off: loaded in fp16, trained without autocast (resolve_dtype)
    "axolotl/pythia-12b-config.yml": {"method": "full", "precision": "fp16", "autocast": False},
    "axolotl/falcon-e-3b-ft.yaml": {"method": "full", "seq_len": 32768, "strategy": "fsdp"},
    "axolotl/mixtral-8x22b-qlora-fsdp.yml": {"method": "qlora", "seq_len": 1024, "strategy": "fsdp"},
    "llamafactory/qwen3vl_full_sft.yaml": {"method": "full", "image_tokens": 256, "strategy": "zero3"},
    "llamafactory/qwen3_lora_sft_ds3.yaml": {
        "method": "lora",
        "strategy": "zero3",
        "zero_overlap_comm": False,
    },
    # deepspeed_configs/zero2.json: stage 2, offload_optimizer cpu, overlap_comm true
    "axolotl/jamba-qlora_deepspeed.yaml": {
        "strategy": "zero2",
        "offload": "optimizer",
        "zero_overlap_comm": True,
    },
    "llamafactory/pissa_llama3_lora_sft.yaml": {"method": "lora", "lora_targets": "llamafactory-all"},
    "llamafactory/qwen3_5moe_lora_sft_fsdp2.yaml": {"grad_ckpt": False, "attn": "flash"},
    # distributed_type NO: accelerate's simple_launcher starts one process whatever num_processes says
    "accelerate/trl-single_gpu.yaml": {"gpus": 1},
    "accelerate/trl-deepspeed_zero2.yaml": {"strategy": "zero2", "offload": "none"},
    "accelerate/trl-multi_gpu.yaml": {"strategy": "ddp", "gpus": 8},
    # trl sft hands num_processes to accelerate launch: 4 processes, DDP (no accelerate config)
    "trl/clis-sft-num_processes.yaml": {"strategy": "ddp", "method": "full"},
    # accelerate_config zero2: TRL's trl/accelerate_configs/zero2.yaml (ZeRO-2, no offload)
    "trl/clis-sft-accelerate_config.yaml": {"strategy": "zero2", "zero_overlap_comm": False},
    # ac_mode selective, ac_option 2 without enable_activation_checkpointing: every 2nd layer only
    "torchtune/dev-8B_full_experimental.yaml": {"method": "full", "grad_ckpt": False, "strategy": "fsdp"},
    "torchtune/gemma2-9B_qlora_single_device.yaml": {"method": "qlora", "lora_rank": 64},
    "torchtune/llama3_1-70B_lora.yaml": {"method": "lora", "strategy": "fsdp", "lora_rank": 16},
    "torchtune/qwen3-8B_full_single_device.yaml": {"optimizer": "paged-adamw", "optimizer_in_bwd": True},
}

#: file -> words one of its stderr notes must carry (a value read but not modelled, said so).
NOTES: dict[str, str] = {
    "axolotl/gpt-oss-20b-sft-lora-singlegpu.yaml": "Mxfp4Config (dequantize): the weights load in bf16",
    "axolotl/gpt-oss-120b-fft-fsdp2-offload.yaml": "dp_shard_size 16: FSDP shards each parameter over 16",
    "axolotl/llama-2-loftq.yml": "peft.loftq_config (loftq_bits 4)",
    "axolotl/qwen2-muon-pretrain-fsdp2.yaml": "optimizer 'muon' has no fitcheck memory model",
    "llamafactory/pissa_llama3_lora_sft.yaml": "pissa_init: PiSSA initialises the adapters",
    "llamafactory/qwen3_lora_sft_ds3.yaml": "deepspeed: read",
    "accelerate/trl-single_gpu.yaml": "distributed_type NO with num_processes 8: accelerate launches one",
    "llamafactory/inference_llama3_2024.yaml": "do_train is not true: llamafactory-cli train would not train",
    "torchtune/llama3_1-8B_full_2024.yaml": "optimizer.foreach False: torch's single-tensor AdamW step",
    "torchtune/dev-8B_full_experimental.yaml": "ac_mode selective, ac_option 2: one layer in 2",
}

#: file -> words the one error line must carry.
REFUSED: dict[str, tuple[str, ...]] = {
    # freeze_layers_except after the adapter is in: fitcheck has no model for a partly unfrozen base
    "axolotl/gemma-3-4b-qlora.yml": ("unfrozen_parameters",),
    "accelerate/trl-alst_ulysses_4gpu.yaml": ("parallelism_config_sp_size 2", "sequence parallelism"),
    "kohya/lllite-sdxl.toml": ("cond_emb_dim 32", "ControlNet-LLLite"),
    "trl/clis-grpo.yaml": ("reward_funcs", "GRPO"),
    # llamafactory-cli eval's layout (task, n_shot): no do_train
    "llamafactory/llama3_lora_eval_2024.yaml": ("task 'mmlu_test'", "evaluation config"),
}


def _rel(text: str) -> str:
    return text.replace(str(DATA) + "/", "")


def _run(name: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, str]:
    model, target = CASES[name]
    return run_check(DATA / name, model, target, capsys)


def _posed(name: str, doc: dict[str, Any]) -> dict[str, Any]:
    return posed(DATA / name, doc, _rel, not_understood=True)


def _golden(name: str, data: dict[str, Any]) -> None:
    check_case_golden(GOLDEN, name, data)


def test_every_file_has_a_source_row_and_a_case() -> None:
    rows = (DATA / "README.md").read_text().splitlines()
    listed = {r.split("|")[1].strip().strip("`") for r in rows if r.startswith("| `")}
    on_disk = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"}
    assert listed == on_disk == set(CASES) | COMPANIONS
    assert len(CASES) >= 20
    assert set(READS) | set(NOTES) | set(REFUSED) <= set(CASES)
    assert not (set(READS) | set(NOTES)) & set(REFUSED)
    orphans = {p.name for p in GOLDEN.glob("*.json")} - {n.replace("/", "__") + ".json" for n in CASES}
    assert not orphans, orphans


@pytest.mark.parametrize("name", sorted(CASES))
def test_real_config_poses_what_the_trainer_runs_or_refuses_in_one_line(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, doc, err = _run(name, capsys)
    assert "Traceback" not in err and "internal error" not in err
    if name in REFUSED:
        lines = err.strip().splitlines()
        assert rc == 2 and len(lines) == 1 and lines[0].startswith("fitcheck: error: "), err
        assert all(word in lines[0] for word in REFUSED[name]), lines[0]
        _golden(name, {"exit": 2, "error": _rel(lines[0])})
        return
    assert rc in (0, 1) and doc is not None, err
    for field, value in READS.get(name, {}).items():
        assert doc["setup"][field] == value, (field, doc["setup"][field])
        assert doc["setup_origin"][field] == "file", (field, doc["setup_origin"][field])
    if name in NOTES:
        assert NOTES[name] in err, err
    _golden(name, _posed(name, doc))


# ------------------------------------------------------------------------------- rules, one at a time


def _read(tmp_path: Path, text: str, name: str = "c.yaml") -> Any:
    path = tmp_path / name
    path.write_text(text)
    return read_config(str(path))


@pytest.mark.parametrize(
    ("kind", "procs", "gpus"),
    [('"NO"', 8, 1), ('"NO"', 1, 1), ("MULTI_GPU", 8, 8), ("FSDP", 4, 4)],
)
def test_accelerate_no_distribution_is_one_process(tmp_path: Path, kind: str, procs: int, gpus: int) -> None:
    """``distributed_type: NO`` runs accelerate's simple_launcher: one process, num_processes unused."""
    r = _read(tmp_path, f"distributed_type: {kind}\nnum_processes: {procs}\nmixed_precision: bf16\n")
    assert r.values["gpus"] == gpus
    assert any("launches one process" in n for n in r.notes) == (kind == '"NO"' and procs > 1)


_TT = (
    "# Config for multi-device full finetuning in {recipe}.py\n"
    "model:\n  _component_: torchtune.models.llama3.llama3_8b\n"
    "optimizer:\n  _component_: torch.optim.AdamW\n"
)


@pytest.mark.parametrize(
    ("recipe", "flags", "ckpt", "note"),
    [
        ("full_finetune_distributed", "ac_mode: full\n", True, None),
        ("full_finetune_distributed", "ac_mode: selective\nac_option: 1\n", True, None),
        ("full_finetune_distributed", "ac_mode: selective\nac_option: 3\n", False, "one layer in 3"),
        ("full_finetune_distributed", "ac_mode: none\n", False, None),
        # both set: neither branch of the recipe applies (selective needs the flag off, full needs no mode)
        (
            "full_finetune_distributed",
            "enable_activation_checkpointing: True\nac_mode: full\n",
            False,
            "no layer is checkpointed",
        ),
        ("full_finetune_distributed", "enable_activation_checkpointing: True\n", True, None),
        # a LoRA recipe does not read ac_mode: the flag alone decides
        (
            "lora_finetune_distributed",
            "enable_activation_checkpointing: True\nac_mode: selective\nac_option: 2\n",
            True,
            "does not read it",
        ),
    ],
)
def test_torchtune_ac_mode_follows_the_recipe(
    tmp_path: Path, recipe: str, flags: str, ckpt: bool, note: str | None
) -> None:
    r = _read(tmp_path, _TT.format(recipe=recipe) + flags)
    assert bool(r.values.get("grad_ckpt")) is ckpt
    assert "ac_mode" not in r.unused and "ac_option" not in r.unused
    assert note is None or any(note in n for n in r.notes), r.notes


def test_llamafactory_freeze_language_model_true_is_refused_false_is_the_default(tmp_path: Path) -> None:
    base = "model_name_or_path: x\nstage: sft\nfinetuning_type: full\n"
    off = _read(tmp_path, base + "freeze_language_model: false\n")
    assert "freeze_language_model" not in off.unused and off.values["method"] == "full"
    with pytest.raises(FitcheckError, match="freeze_language_model: True means a frozen language model"):
        _read(tmp_path, base + "freeze_language_model: true\n")


def test_llamafactory_pissa_keys_are_read_as_lora_with_a_note(tmp_path: Path) -> None:
    keys = "pissa_init: true\npissa_iter: 16\npissa_convert: true\n"
    r = _read(tmp_path, "model_name_or_path: x\nstage: sft\n" + keys)
    assert r.values["method"] == "lora" and not {"pissa_init", "pissa_iter", "pissa_convert"} & set(r.unused)
    assert any("PiSSA" in n for n in r.notes)


@pytest.mark.parametrize(
    ("block", "words"),
    [
        ("model_quantization_config_kwargs:\n  dequantize: true\n", "load in bf16, as sized"),
        ("", "without dequantize: true"),
    ],
)
def test_axolotl_mxfp4_load_is_noted(tmp_path: Path, block: str, words: str) -> None:
    r = _read(tmp_path, "base_model: x\nmodel_quantization_config: Mxfp4Config\n" + block)
    assert any(words in n for n in r.notes), r.notes
    assert not {"model_quantization_config", "model_quantization_config_kwargs"} & set(r.unused)


def test_axolotl_fsdp_mesh_sizes(tmp_path: Path) -> None:
    fsdp = "base_model: x\nfsdp_version: 2\nfsdp_config:\n  reshard_after_forward: true\n"
    hsdp = _read(tmp_path, fsdp + "dp_shard_size: 8\ndp_replicate_size: 2\n")
    assert hsdp.values["strategy"] == "fsdp-hybrid" and hsdp.keys["strategy"] == "dp_replicate_size"
    assert any("dp_shard_size 8" in n for n in hsdp.notes)
    ones = _read(tmp_path, fsdp + "tensor_parallel_size: 1\ncontext_parallel_size: 1\ndp_replicate_size: 1\n")
    assert ones.values["strategy"] == "fsdp"
    assert not {"tensor_parallel_size", "context_parallel_size", "dp_replicate_size"} & set(ones.unused)


def test_axolotl_loftq_and_gptq_off_are_read(tmp_path: Path) -> None:
    r = _read(tmp_path, "base_model: x\nadapter: lora\npeft:\n  loftq_config:\n    loftq_bits: 4\n")
    assert r.values["method"] == "lora" and "base_quant" not in r.values
    assert any("LoftQ" in n for n in r.notes) and "peft" not in r.unused
    full = _read(tmp_path, "base_model: x\ngptq: false\n")
    assert full.values["method"] == "full" and "gptq" not in full.unused


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('cond_emb_dim = 32\nnetwork_dim = 64\ndataset_config = "nowhere.toml"\n', "ControlNet-LLLite"),
        ('controlnet_model_name_or_path = "cn.safetensors"\n', "ControlNet training"),
    ],
)
def test_kohya_controlnet_runs_are_refused_before_the_dataset_is_looked_for(
    tmp_path: Path, text: str, words: str
) -> None:
    with pytest.raises(FitcheckError, match=words):
        _read(tmp_path, 'pretrained_model_name_or_path = "sdxl.safetensors"\n' + text, "c.toml")
    # a LoRA beside a ControlNet (flux_train_network.py --controlnet_model_name_or_path) is still a LoRA
    r = _read(
        tmp_path,
        'pretrained_model_name_or_path = "flux.safetensors"\nnetwork_module = "networks.lora_flux"\n'
        'controlnet_model_name_or_path = "cn.safetensors"\n',
        "c.toml",
    )
    assert r.values["method"] == "lora"


def test_trl_cli_launch_keys_are_read_not_taken_for_an_accelerate_file(tmp_path: Path) -> None:
    """``trl sft --config`` hands the keys its parser does not know to ``accelerate launch``."""
    base = "model_name_or_path: Qwen/Qwen2.5-0.5B\n"
    procs = _read(tmp_path, base + "num_processes: 2\n")
    assert procs.format == "trl" and (procs.values["gpus"], procs.values["strategy"]) == (2, "ddp")
    assert _read(tmp_path, "num_processes: 2\ndistributed_type: MULTI_GPU\n").format == "accelerate"
    fsdp = _read(tmp_path, base + "accelerate_config: fsdp2\nnum_processes: 4\n")
    assert (fsdp.values["strategy"], fsdp.values["fsdp_version"], fsdp.values["gpus"]) == ("fsdp", 2, 4)
    one = _read(tmp_path, base + "accelerate_config: single_gpu\n")
    assert one.values["gpus"] == 1 and "strategy" not in one.values
    path = _read(tmp_path, base + "accelerate_config: my/acc.yaml\n")
    assert "strategy" not in path.values and any("--from my/acc.yaml" in n for n in path.notes)


def test_trl_num_processes_below_one_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FitcheckError, match="num_processes must be 1 or more"):
        _read(tmp_path, "model_name_or_path: x\nnum_processes: 0\n")


def test_lora_scaling_keys_are_no_memory_effect() -> None:
    """rsLoRA and the init scheme change the adapters' scale and start, not their size."""
    for key in ("peft_use_rslora", "use_rslora", "peft_init_lora_weights", "eval_max_new_tokens"):
        assert is_neutral(key), key
    for key in ("lora_rank_pattern", "peft_layer_replication", "device", "profiler"):
        assert not is_neutral(key), key
    # kohya: captions, noise and loss weighting, saving are not; text length, VAE precision, buckets may be
    for key in ("caption_dropout_rate", "min_snr_gamma", "noise_offset", "save_every_n_epochs", "flip_aug"):
        assert is_neutral(key), key
    for key in ("max_token_length", "sdxl_no_half_vae", "vae_batch_size", "max_bucket_reso", "num_processes"):
        assert not is_neutral(key), key


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("base_model: x\ndeepspeed: deepspeed_configs/zero3_bf16_cpuoffload_params.json\n", ("zero3", "all")),
        ("base_model: x\ndeepspeed: ./deepspeed_configs/zero2.json\n", ("zero2", "optimizer")),
        (
            "model_name_or_path: x\nstage: sft\ndo_train: true\n"
            "deepspeed: examples/deepspeed/ds_z2_offload_config.json\n",
            ("zero2", "optimizer"),
        ),
        ("base_model: x\ndeepspeed: deepspeed_configs/my_zero3.json\n", (None, None)),  # not axolotl's
        ("base_model: x\ndeepspeed: examples/deepspeed/ds_z3_config.json\n", (None, None)),  # LLaMA-Factory's
    ],
)
def test_a_trainers_own_deepspeed_file_reads_as_shipped_when_absent(
    tmp_path: Path, text: str, want: tuple[str | None, str | None]
) -> None:
    r = _read(tmp_path, text)
    assert (r.values.get("strategy"), r.values.get("offload")) == want
    shipped = any("read as the trainer ships it" in n for n in r.notes)
    assert shipped == (want[0] is not None)


def test_axolotl_layers_to_transform_is_noted_as_an_upper_bound(tmp_path: Path) -> None:
    r = _read(tmp_path, "base_model: x\nadapter: lora\npeft_layers_to_transform: [30, 31]\n")
    assert "peft_layers_to_transform" not in r.unused
    assert any("[30, 31]: adapters in those layers only" in n for n in r.notes), r.notes
