"""``--from`` readers on real trainer configs (tests/data/from, sources in SOURCES.md): each field read
as the trainer's own code reads it, the format detected, unused keys listed, bad files refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck.errors import FitcheckError
from fitcheck.readers import FORMATS, read_config
from fitcheck.readers.defaults import TABLE
from fitcheck.readers.merge import resolve

DATA = Path(__file__).parent / "data" / "from"

#: file -> (format, trainer, model, the exact setup values the file gives).
EXPECTED: dict[str, tuple[str, str, str | None, dict[str, object]]] = {
    "axolotl/qlora.yml": (
        "axolotl",
        "axolotl",
        "NousResearch/Meta-Llama-3-8B",
        {
            "method": "qlora",
            "lora_rank": 32,
            "lora_alpha": 16.0,
            "lora_dropout": 0.05,
            "lora_targets": "linear-modules",  # lora_target_linear: find_all_linear_names
            "seq_len": 4096,
            "batch_size": 2,
            "grad_accum": 4,
            "grad_ckpt": True,
            "precision": "bf16",
            "optimizer": "paged-adamw",  # paged_adamw_32bit: two fp32 states, paged
            "attn": "flash",  # legacy flash_attention: true
        },
    ),
    "axolotl/fft-8b-liger-fsdp.yaml": (
        "axolotl",
        "axolotl",
        "NousResearch/Meta-Llama-3.1-8B",
        {
            "method": "full",
            "seq_len": 4096,
            "batch_size": 2,
            "grad_accum": 4,
            "grad_ckpt": True,
            "ckpt_reentrant": False,  # read; the merge sets it aside (a full run, not QLoRA)
            "precision": "bf16",
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "attn": "flash",
            "loss": "liger",  # LigerPlugin + liger_fused_linear_cross_entropy
            "strategy": "fsdp",  # fsdp: [full_shard, auto_wrap]
            "offload": "all",  # fsdp_offload_params
            "fsdp_version": 1,  # unset: axolotl pins FSDP1 (check_fsdp_version_in_fsdp_config)
        },
    ),
    "llamafactory/llama3_lora_sft_otfq.yaml": (
        "llamafactory",
        "llamafactory",
        "meta-llama/Meta-Llama-3-8B-Instruct",
        {
            "method": "qlora",  # quantization_bit 4, bitsandbytes
            "lora_targets": "llamafactory-all",  # lora_target: all (find_all_linear_modules)
            "seq_len": 2048,
            "batch_size": 1,
            "grad_accum": 8,
            "precision": "bf16",
        },
    ),
    "trl/example_config.yaml": ("trl", "hf", "Qwen/Qwen2.5-0.5B", {"method": "full"}),  # no use_peft
    "torchtune/1B_qlora_single_device.yaml": (
        "torchtune",
        "torchtune",
        "llama-3.2-1b",  # from the builder qlora_llama3_2_1b
        {
            "method": "qlora",
            "lora_targets": "q_proj,v_proj,o_proj,gate_proj,down_proj,up_proj",
            "lora_rank": 64,
            "lora_alpha": 128.0,
            "lora_dropout": 0.0,
            "batch_size": 4,
            "grad_accum": 8,
            "grad_ckpt": False,
            "precision": "bf16",
            "optimizer": "adamw",
            "optimizer_impl": "fused",
            "loss": "chunked",  # LinearCrossEntropyLoss
            "compile": False,  # compile: False
        },
    ),
    "mlx/lora_config.yaml": (
        "mlx",
        "mlx",
        "mlx_model",
        {
            "method": "lora",
            "dora": False,
            "lora_rank": 8,
            "lora_alpha": 160.0,  # scale 20 x rank 8
            "lora_dropout": 0.0,
            "lora_targets": "q_proj,v_proj",
            "batch_size": 4,
            "seq_len": 2048,
            "grad_ckpt": False,
            "optimizer": "adamw",
        },
    ),
    "kohya/sdxl_inpainting_test_lora.toml": (
        "kohya",
        "kohya",
        None,
        {
            "method": "lora",
            "lora_rank": 4,
            "lora_alpha": 1.0,
            "resolution": 1024,
            "batch_size": 1,
            "grad_accum": 1,
            "grad_ckpt": True,
            "precision": "bf16",
            "attn": "sdpa",
        },
    ),
    "kohya/flux_lora_with_dataset.toml": (
        "kohya",
        "kohya",
        "/path/to/flux1-dev.safetensors",
        {
            "method": "lora",
            "lora_rank": 16,
            "train_text_encoder": False,
            "resolution": 1024,  # the dataset file's 1024 wins over the config's "512,512"
            "batch_size": 2,  # the dataset file's batch_size wins over train_batch_size 1
            "grad_ckpt": True,
            "precision": "bf16",
            "fp8_base": True,
            "cache_latents": True,  # cache_latents_to_disk turns it on
            "cache_text_encoder_outputs": True,
            "attn": "sdpa",
            "optimizer": "adamw8bit",  # matched case-insensitively
        },
    ),
    "kohya_ss/sdxl-lora-ai_now-adamw-v1.0.json": (
        "kohya_ss",
        "kohya",
        "sdxl",
        {
            "method": "lora",
            "lora_rank": 32,
            "lora_alpha": 32.0,
            "lora_dropout": 0.0,
            "train_text_encoder": True,  # text_encoder_lr 1e-4
            "resolution": 1024,
            "batch_size": 4,
            "grad_accum": 1,
            "grad_ckpt": True,
            "precision": "bf16",
            "cache_latents": True,
            "attn": "xformers",
            "optimizer": "adamw",
        },
    ),
    "deepspeed/zero3_bf16_cpuoffload_all.json": (
        "deepspeed",
        "hf",
        None,
        # "auto" batch values: unset
        {"precision": "bf16", "strategy": "zero3", "offload": "all", "zero_overlap_comm": True},
    ),
    "accelerate/fsdp.yaml": (
        "accelerate",
        "hf",
        None,
        {"gpus": 2, "precision": "bf16", "strategy": "fsdp", "fsdp_version": 1},  # unset: accelerate's FSDP1
    ),
    "accelerate/deepspeed.yaml": ("accelerate", "hf", None, {"gpus": 2}),
    # litgpt config hub @26857050 (more in tests/test_from_litgpt.py)
    "litgpt/llama-3.1-8b-qlora.yaml": (
        "litgpt",
        "litgpt",
        "meta-llama/Meta-Llama-3.1-8B",  # checkpoint_dir checkpoints/meta-llama/Meta-Llama-3.1-8B
        {
            "method": "qlora",  # quantize: bnb.nf4 with lora_* keys
            "double_quant": False,  # nf4, not nf4-dq
            "lora_rank": 32,
            "lora_alpha": 16.0,
            "lora_dropout": 0.05,
            "lora_targets": "q_proj,v_proj",  # lora_query + lora_value
            "gpus": 1,
            "batch_size": 2,
            "grad_accum": 4,  # global_batch_size 8 // 1 device // micro_batch_size 2
            "seq_len": 512,
            "precision": "bf16",  # bf16-true
            "optimizer": "paged-adamw",  # instantiate_bnb_optimizer: bitsandbytes PagedAdamW
        },
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_configs_read_as_their_trainer_reads_them(name: str) -> None:
    fmt, trainer, model, values = EXPECTED[name]
    got = read_config(str(DATA / name))
    assert (got.format, got.trainer, got.model) == (fmt, trainer, model)
    assert dict(got.values) == values
    assert set(got.keys) == set(values)  # every value names the file key it came from
    assert got.origin == dict.fromkeys(values, "file")


def test_every_format_has_a_real_example() -> None:
    assert {fmt for fmt, *_ in EXPECTED.values()} == set(FORMATS)


@pytest.mark.parametrize(
    ("name", "unused"),
    [
        ("axolotl/qlora.yml", {"learning_rate", "datasets", "special_tokens", "strict"}),
        ("torchtune/1B_qlora_single_device.yaml", {"profiler", "lr_scheduler", "metric_logger"}),
        ("trl/example_config.yaml", {"dataset_name", "learning_rate", "lr_scheduler_type", "report_to"}),
        ("deepspeed/zero3_bf16_cpuoffload_all.json", {"wall_clock_breakdown"}),
    ],
)
def test_unused_keys_are_listed_never_dropped(name: str, unused: set[str]) -> None:
    got = read_config(str(DATA / name))
    assert unused <= set(got.unused)
    assert not set(got.unused) & set(got.keys.values())  # a key is used or listed, not both
    assert "lora_target_modules" not in got.unused  # null keys (axolotl writes many) set nothing


def test_notes_say_what_is_inferred_or_not_modelled() -> None:
    mlx = read_config(str(DATA / "mlx/lora_config.yaml"))
    assert any("num_layers 16" in n for n in mlx.notes)
    tt = read_config(str(DATA / "torchtune/1B_qlora_single_device.yaml"))
    assert any("max_seq_len is null" in n for n in tt.notes)
    acc = read_config(str(DATA / "accelerate/deepspeed.yaml"))
    assert any("zero_stage1_config.json" in n for n in acc.notes)


@pytest.mark.parametrize(
    ("text", "noted"),
    [
        ("base_model: x/y\nadapter: lora\nmicro_batch_size: 4\nsequence_len: 512\n", True),
        ("base_model: x/y\nadapter: lora\nmicro_batch_size: 4\nsample_packing: true\n", False),
        ("base_model: x/y\nadapter: lora\nmicro_batch_size: 1\n", False),  # nothing to pad against
        (
            "model_name_or_path: x/y\nstage: sft\nfinetuning_type: lora\nper_device_train_batch_size: 4\n",
            True,
        ),
        (
            "model_name_or_path: x/y\nstage: pt\nfinetuning_type: lora\nper_device_train_batch_size: 4\n",
            False,
        ),
        ("model_name_or_path: x/y\nstage: sft\nper_device_train_batch_size: 4\nneat_packing: true\n", False),
    ],
)
def test_unpacked_batches_point_at_varying_lengths(tmp_path: Path, text: str, noted: bool) -> None:
    """More than one unpacked example per micro-batch: the note names --lengths varying (docs/from.md,
    "Padded batches"); packing (LLaMA-Factory's pt stage packs by default) or one example says nothing."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    notes = read_config(str(cfg)).notes
    assert any("--lengths varying" in n for n in notes) is noted, notes


@pytest.mark.parametrize(
    "text",
    [
        "base_model: x/y\nadapter: lora\nmicro_batch_size: 4\ngroup_by_length: true\n",
        "model_name_or_path: x/y\nstage: sft\nfinetuning_type: lora\nper_device_train_batch_size: 4\n"
        "group_by_length: true\n",
        "model_name_or_path: x/y\nper_device_train_batch_size: 4\nuse_peft: true\ngroup_by_length: true\n",
    ],
)
def test_group_by_length_points_at_longest_first(tmp_path: Path, text: str) -> None:
    """HF Trainer's group_by_length runs the longest batch first: the note names --lengths longest-first
    (no allocator history), not varying."""
    cfg = tmp_path / "run.yaml"
    cfg.write_text(text)
    notes = read_config(str(cfg)).notes
    assert any("--lengths longest-first" in n for n in notes), notes
    assert not any("--lengths varying" in n for n in notes), notes


def test_from_format_overrides_detection(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model_name_or_path: x/y\nper_device_train_batch_size: 2\nuse_peft: true\n")
    assert read_config(str(cfg)).format == "trl"
    got = read_config(str(cfg), "llamafactory")
    assert got.format == "llamafactory" and got.values["batch_size"] == 2
    assert read_config(str(cfg), "hf").format == "trl"  # fitcheck's emitter name is an alias


@pytest.mark.parametrize(
    ("text", "name", "fmt", "says"),
    [
        ("base_model: [unclosed\n", "a.yaml", None, "not valid YAML"),
        ("- just\n- a list\n", "a.yaml", None, "expected a mapping"),
        ('{"zero_optimization": ', "ds.json", None, "not valid JSON"),
        ("network_dim = \n", "k.toml", None, "not valid TOML"),
        ("foo: 1\n", "a.yaml", None, "cannot tell which trainer"),
        ("base_model: x\nmicro_batch_size: two\n", "a.yaml", None, "micro_batch_size must be a whole number"),
        ("base_model: x\n", "a.yaml", "nemo", "unknown --from-format"),
        ('{"zero_optimization": {"stage": 5}}', "ds.json", None, "stage must be 0, 1, 2 or 3"),
        ('dataset_config = "missing.toml"\nnetwork_dim = 4\n', "k.toml", None, "dataset_config missing.toml"),
        ('resolution = "0,0"\nnetwork_dim = 4\n', "k.toml", None, "resolution must be a size in pixels"),
    ],
)
def test_bad_files_are_one_clear_error(
    tmp_path: Path, text: str, name: str, fmt: str | None, says: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(FitcheckError) as info:
        read_config(str(path), fmt)
    assert says in str(info.value) and "\n" not in str(info.value)
    assert int(info.value.exit_code) == 2


def test_reads_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("base_model: x\n" + "# padding\n" * 200_000)
    with pytest.raises(FitcheckError, match="too large"):
        read_config(str(path))
    with pytest.raises(FitcheckError, match="no such file"):
        read_config(str(tmp_path / "absent.yaml"))


def test_yaml_is_read_safely(tmp_path: Path) -> None:
    path = tmp_path / "evil.yaml"
    path.write_text("base_model: !!python/object/apply:os.system ['true']\n")
    with pytest.raises(FitcheckError, match="not valid YAML"):
        read_config(str(path))


def test_mlx_quantized_model_folder_is_qlora(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text('{"quantization": {"group_size": 64, "bits": 4}}')
    cfg = tmp_path / "mlx.yaml"
    cfg.write_text(f"model: {model}\nfine_tune_type: lora\n")
    assert read_config(str(cfg)).values["method"] == "qlora"
    (model / "config.json").write_text("{}")
    assert read_config(str(cfg)).values["method"] == "lora"


def test_precedence_command_line_file_trainer_default_fitcheck_default() -> None:
    got = read_config(str(DATA / "llamafactory/llama3_lora_sft_otfq.yaml"))
    fields = ("method", "batch_size", "seq_len", "grad_ckpt", "lora_rank", "optimizer", "attn", "trainer")
    cli = {"batch_size": 4, "seq_len": None, "grad_ckpt": False, "attn": "sdpa", "trainer": "generic"}
    merged = resolve(cli, {"batch_size"}, got, fields)
    assert merged.values["batch_size"] == 4 and merged.origin["batch_size"] == "command line"
    assert merged.values["seq_len"] == 2048 and merged.origin["seq_len"] == "file"
    # LLaMA-Factory checkpoints unless disable_gradient_checkpointing: the file is silent
    assert merged.values["grad_ckpt"] is True and merged.origin["grad_ckpt"] == "trainer default"
    assert merged.values["lora_rank"] == 8 and merged.origin["lora_rank"] == "trainer default"
    assert "checkpointing.py" in merged.sources["grad_ckpt"]
    assert merged.origin["attn"] == "fitcheck default"
    assert merged.values["trainer"] == "llamafactory" and merged.origin["trainer"] == "file"


def test_trainer_defaults_apply_to_a_named_trainer_without_a_file() -> None:
    fields = ("grad_ckpt", "optimizer", "precision", "batch_size", "trainer")
    cli = {"grad_ckpt": False, "optimizer": "adamw", "precision": "bf16", "batch_size": 1, "trainer": "kohya"}
    merged = resolve(cli, {"trainer"}, None, fields)
    assert merged.values["precision"] == "fp32" and merged.origin["precision"] == "trainer default"
    # a batch size is a file-scope default: --trainer alone keeps fitcheck's
    assert merged.values["batch_size"] == 1 and merged.origin["batch_size"] == "fitcheck default"
    plain = resolve({**cli, "trainer": "generic"}, set(), None, fields)
    assert set(plain.origin.values()) == {"fitcheck default"}


def test_full_fine_tuning_drops_lora_defaults() -> None:
    got = read_config(str(DATA / "trl/example_config.yaml"))
    fields = ("method", "lora_rank", "lora_alpha", "lora_targets", "grad_ckpt", "trainer")
    merged = resolve({}, set(), got, fields)
    # TRL's SFTConfig checkpoints by default; its LoRA defaults (r 16) do not apply to a full run
    assert merged.values == {"method": "full", "grad_ckpt": True, "trainer": "hf"}
    assert merged.origin["lora_rank"] == "fitcheck default"


def test_fields_the_setup_lacks_are_pending_not_dropped() -> None:
    got = read_config(str(DATA / "deepspeed/zero3_bf16_cpuoffload_all.json"))
    merged = resolve({}, set(), got, ("precision",))
    assert merged.pending == {"strategy": "zero3", "offload": "all", "zero_overlap_comm": True}


@pytest.mark.parametrize("row", sorted(TABLE))
def test_every_trainer_default_is_cited(row: str) -> None:
    for d in TABLE[row]:
        assert ".py" in d.source, d  # names the trainer's file that decides it


def test_docs_list_every_trainer_default() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "from.md").read_text()
    rows = [line for line in doc.splitlines() if line.startswith("| ")]
    for row, defaults in TABLE.items():
        for d in defaults:
            assert any(line.startswith(f"| {row}") and d.field in line for line in rows), (row, d.field)


_FIELDS = ("batch_size", "grad_accum", "seq_len", "lora_rank", "grad_ckpt", "optimizer")


@given(
    typed=st.sets(st.sampled_from(_FIELDS)),
    in_file=st.sets(st.sampled_from(_FIELDS)),
)
def test_precedence_holds_for_any_mix(typed: set[str], in_file: set[str]) -> None:
    """A typed flag always wins; else the file; else the trainer default; else fitcheck's."""
    from fitcheck.readers.base import ReadResult

    cli: dict[str, object] = {f: f"cli-{f}" for f in _FIELDS}
    values: dict[str, str | int | float | bool] = {f: f"file-{f}" for f in in_file}
    read = ReadResult("axolotl", "x.yaml", "axolotl", None, values, dict.fromkeys(values, "k"))
    merged = resolve(cli, typed, read, _FIELDS)
    trainer_defaults = {d.field for d in TABLE["axolotl"]}
    for f in _FIELDS:
        want = (
            "command line"
            if f in typed
            else "file"
            if f in in_file
            else "trainer default"
            if f in trainer_defaults
            else "fitcheck default"
        )
        assert merged.origin[f] == want
        assert merged.values[f] == {"command line": f"cli-{f}", "file": f"file-{f}"}.get(
            want, merged.values[f]
        )


def test_the_python_example_in_the_docs_runs() -> None:
    """docs/from.md, "From Python": readers + merge + fitcheck.api, as the CLI does it."""
    from typing import get_type_hints

    from fitcheck import api

    read = read_config(str(DATA / "axolotl" / "qlora.yml"))
    merged = resolve({}, set(), read, tuple(get_type_hints(api.TrainingOptions)))
    est = api.estimate("llama-3.1-8b", on="rtx-4090", **merged.values)  # type: ignore[arg-type]
    assert est.setup.seq_len == 4096 and merged.origin["seq_len"] == "file"
    assert est.setup.trainer == "axolotl" and est.setup.method == "qlora"
    doc = (Path(__file__).parents[1] / "docs" / "from.md").read_text()
    assert 'api.estimate("llama-3.1-8b", on="rtx-4090", **merged.values)' in doc


#: The values of the setup fields the multi-GPU and engine work add (their models.py Literals:
#: Strategy, Offload on branch multi; Loss, BaseQuant on branch engine), which readers already produce.
PENDING_VOCAB = {
    "strategy": {"ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "fsdp-hybrid"},
    "offload": {"none", "optimizer", "all"},
    "loss": {"standard", "chunked", "liger", "cce"},
    "base_quant": {"none", "int8", "gptq", "awq"},
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_values_for_fields_not_modelled_yet_use_their_vocabulary(name: str) -> None:
    got = read_config(str(DATA / name))
    for field, allowed in PENDING_VOCAB.items():
        if field in got.values:
            assert got.values[field] in allowed, (field, got.values[field])


@pytest.mark.parametrize(
    ("name", "text", "values"),
    [
        (  # trainer_formats.md section 6's minimal ZeRO-2 config
            "ds.json",
            '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 8,'
            ' "bf16": {"enabled": true}, "zero_optimization": {"stage": 2,'
            ' "offload_optimizer": {"device": "cpu", "pin_memory": true}, "reduce_bucket_size": 5e8}}',
            {"batch_size": 2, "grad_accum": 8, "precision": "bf16"}
            | {"strategy": "zero2", "offload": "optimizer", "zero_bucket_size": 500_000_000},
        ),
        (
            "acc.yaml",
            "distributed_type: DEEPSPEED\nnum_processes: 8\nnum_machines: 2\nmixed_precision: fp16\n"
            "deepspeed_config: {zero_stage: 3, offload_optimizer_device: cpu, offload_param_device: cpu,"
            " gradient_accumulation_steps: 4}\n",
            {"gpus": 4, "nodes": 2, "precision": "fp16", "grad_accum": 4}
            | {"strategy": "zero3", "offload": "all", "zero_bucket_size": 500_000_000},
        ),
        (
            "acc.yaml",
            "distributed_type: FSDP\nnum_processes: 2\nfsdp_config: {fsdp_version: 2,"
            " fsdp_reshard_after_forward: false, fsdp_activation_checkpointing: true}\n",
            {"gpus": 2, "fsdp_version": 2, "strategy": "fsdp-grad-op", "grad_ckpt": True},
        ),
        ("acc.yaml", "distributed_type: MULTI_GPU\nnum_processes: 4\n", {"gpus": 4, "strategy": "ddp"}),
    ],
)
def test_distributed_configs(tmp_path: Path, name: str, text: str, values: dict[str, object]) -> None:
    path = tmp_path / name
    path.write_text(text)
    got = read_config(str(path))
    assert dict(got.values) == values
    if name == "ds.json":  # a stated reduce_bucket_size is a setup value now (--zero-bucket-size)
        assert got.keys["zero_bucket_size"] == "zero_optimization.reduce_bucket_size"


def test_reader_names_invert_the_emitters_names() -> None:
    """What fitcheck writes for an optimizer, it reads back as that optimizer (one naming per trainer)."""
    from fitcheck.emitters import hf, kohya, mlx
    from fitcheck.readers import names

    for ours, theirs in hf.OPTIM.items():
        assert names.HF_OPTIM[theirs] == ours
    for ours, theirs in kohya.OPTIMIZERS.items():
        assert names.KOHYA_OPTIM[theirs.lower()] == ours
    for ours, theirs in mlx.OPTIM.items():
        assert names.MLX_OPTIM[theirs] == ours
    for ours, theirs in hf.ATTN.items():
        assert names.HF_ATTN[theirs] == ours


def test_a_fifo_or_device_is_refused_without_blocking(tmp_path: Path) -> None:
    import os

    fifo = tmp_path / "axolotl.yaml"
    os.mkfifo(fifo)
    with pytest.raises(FitcheckError, match=r"--from .*FIFO"):
        read_config(str(fifo))
    link = tmp_path / "zero.yaml"
    link.symlink_to("/dev/zero")
    with pytest.raises(FitcheckError, match=r"--from .*character device"):
        read_config(str(link))


@pytest.mark.parametrize(
    ("body", "impl"),
    [
        ("model_name_or_path: x/y\nuse_peft: true\noptim: adamw_torch\n", "foreach"),
        ("model_name_or_path: x/y\nuse_peft: true\noptim: adamw_torch_fused\n", "fused"),
        ("model_name_or_path: x/y\nuse_peft: true\noptim: paged_adamw_8bit\n", None),
    ],
)
def test_hf_optim_names_the_adamw_step(tmp_path: Path, body: str, impl: str | None) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text(body)
    assert read_config(str(cfg)).values.get("optimizer_impl") == impl


def test_torchtune_adamw_without_fused_is_torchs_foreach_step(tmp_path: Path) -> None:
    text = (DATA / "torchtune/1B_qlora_single_device.yaml").read_text()
    assert "  fused: True\n" in text
    cfg = tmp_path / "1B_qlora_single_device.yaml"
    cfg.write_text(text.replace("  fused: True\n", ""))
    assert read_config(str(cfg)).values["optimizer_impl"] == "foreach"


def test_a_command_line_optimizer_drops_the_files_adamw_step(tmp_path: Path) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model_name_or_path: x/y\nuse_peft: true\noptim: adamw_torch\n")
    read = read_config(str(cfg))
    fields = ("optimizer", "optimizer_impl", "trainer")
    kept = resolve({}, (), read, fields)
    assert kept.values["optimizer_impl"] == "foreach"
    replaced = resolve({"optimizer": "lion"}, ("optimizer",), read, fields)
    assert "optimizer_impl" not in replaced.values and replaced.values["optimizer"] == "lion"


def test_training_arguments_json_is_trl_not_deepspeed(tmp_path: Path) -> None:
    """A TrainingArguments / SFTConfig JSON (HfArgumentParser.parse_json_file) carries bf16 as DeepSpeed's
    JSON does, but names a model or a per-device batch, which DeepSpeed's never does."""
    cfg = tmp_path / "args.json"
    cfg.write_text(
        '{"model_name_or_path": "meta-llama/Llama-3.1-8B", "per_device_train_batch_size": 2, '
        '"gradient_accumulation_steps": 4, "bf16": true, "gradient_checkpointing": true, "use_peft": true}'
    )
    got = read_config(str(cfg))
    assert got.format == "trl" and got.values["batch_size"] == 2 and got.values["grad_accum"] == 4
    ds = tmp_path / "ds.json"
    ds.write_text('{"bf16": {"enabled": true}, "zero_optimization": {"stage": 2}}')
    assert read_config(str(ds)).format == "deepspeed"
