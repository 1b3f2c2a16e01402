"""Hostile inputs, sixth sweep: one test per class of failure found, each failing before its fix.

- ``--on 8xh100-80gb --gpus 2`` judged 8 ranks and ``--on 2xh100-80gb --gpus 3`` three while the verdict
  named "2xh100-sxm5-80gb": two GPU counts that disagree were settled silently by the larger
  (`fitcheck.api.target`); a trainer file's count against ``--on NxGPU`` likewise;
- ``--on 24MiB`` said "'0.0234375GB' leaves no usable memory": the error quotes the size as typed
  (`fitcheck.hardware.budget.plain_cuda_target`); ``--on 0x1GB`` and ``0xh100`` named the device, not the
  count of 0 (`fitcheck.hardware.budget.resolve_target`);
- a trainer key that names something, given as a number, list or mapping (``optim: 5``, axolotl
  ``optimizer: 5``, kohya ``optimizer_type = 5`` / ``mixed_precision = 5``, accelerate ``mixed_precision: 5``
  or an unquoted ``no``, ``attn_implementation: [1]``, torchtune ``dtype: 5``, mlx ``optimizer: 5``) was
  dropped without a word and the default sized in its place, listed as "not set here"
  (`fitcheck.readers.base.as_word`); kohya's unknown ``mixed_precision`` word and torchtune's unknown
  ``dtype`` are noted;
- accelerate ``distributed_type: MEGATRON_LM`` (tensor / pipeline parallel), ``XLA`` or any unknown word was
  read as 8-GPU DDP without a word, and an unquoted ``distributed_type: NO`` (YAML's false, which the launcher
  runs as one process) as ``num_processes`` GPUs; the unposable types are refused, an unknown word is one
  error line, the other devices' data parallel types are read as DDP with a note, false is NO
  (`fitcheck.readers.accelerate.read`);
- a config.json's optional counts and probabilities (``type_vocab_size``, ``max_position_embeddings``,
  ``n_positions``, ``num_decoder_layers``, ``relative_attention_num_buckets``, ``num_labels``, the dropout
  keys, the MoE layer steps, ...) went through bare ``int()`` / ``float()``: 2.5 was truncated to 2, 10**12
  positions or labels or 10**9 decoder layers sized an absurd model with exit 0, and "x" or -2 was an error
  that named an internal field (``misc_params``, ``resid_dropout``, ``num_layers``) or none at all; each is
  now a whole number in range (or a probability from 0 to under 1), refused naming its own key
  (`fitcheck.sources.hf_config._opt_int`, `_opt_prob`);
- ``plan --dataset-tokens 1e400`` (or ``1e308T``) was an internal error (OverflowError: round() of
  infinity), and the count had no upper bound where ``--epochs`` has one; it is now at most 1000T tokens,
  on the command line and in the library (`fitcheck.commands.plan.parse_tokens`, `fitcheck.units`);
- ``--on auto`` with ``CUDA_VISIBLE_DEVICES`` set to ``""``, ``-1``, an ordinal no GPU has (``5``) or a
  repeated one (``0,0``), which leave a training process no GPU, sized every GPU of the machine;
  ``0,-1,1`` and ``0,5,1``, which CUDA cuts after ``0``, sized two. The variable is read as CUDA reads
  it (as torch mirrors it): no GPU visible sizes this machine's RAM with a note, or is one clear line
  when the RAM cannot be read (`fitcheck.hardware.budget.visible_ordinals`, `target_from_detection`);
- ``check ... --offload all --host-memory 1MB`` (or a node whose RAM cannot hold the offloaded states) exited
  0, "fits", with ``target.host_verdict: does_not_fit`` in its document, while ``plan`` judges the same node
  ``does_not_fit``; ``check`` exits 1 with one stderr line (`fitcheck.commands.check`);
- kohya ``network_args = ["conv_dim=abc"]`` or ``conv_dim=-4`` (which sd-scripts' ``int()`` refuses) were
  read as conv LoRA without a word, ``conv_dim=0`` (no conv LoRA in sd-scripts) sized conv adapters, and a
  conv_dim other than network_dim was sized at network_dim silently; refused, read as none, and noted
  (`fitcheck.readers.kohya._conv_dim`);
- ``--format markdown`` wrote names from the user's files into table cells unescaped: a model folder called
  ``a|b`` gave ``matrix`` (and every list document) an extra column; cells escape ``|``
  (`fitcheck.render.md_cell`), as ``hw``'s tables already did;
- mlx-lm ``num_layers: 0`` or ``-5`` was noted as "mlx-lm adapts only the last 0 (-5) blocks"; mlx-lm slices
  ``model.layers[-max(num_layers, 0):]``, every block, as for -1 (`fitcheck.readers.mlx._layers`);
- ``plan --emit - --format json`` printed the JSON document and the emitted file on stdout (not one JSON
  document); refused as ``-o - --format json`` already was (`fitcheck.commands.plan`);
- an error quoting a value whole made one stderr "line" of any length (``--lora-targets``, ``--on``,
  ``--headroom``, ``--train-modules``, ``--dataset-tokens`` or ``--from`` of 200,000 characters: a 200 KB
  line); every error line is cut in its middle past 1,000 characters (`fitcheck.terminal.error_line`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_fuzz_cli import hold_contract, invoke

# --- GPU counts ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "7B", "--on", "8xh100-80gb", "--gpus", "2"],
        ["estimate", "7B", "--on", "2xh100-80gb", "--gpus", "3", "--format", "json"],
        ["check", "7B", "--on", "2x4090", "--gpus", "4"],
        ["plan", "7B", "--on", "8xh100-80gb", "--gpus", "4"],
    ],
)
def test_two_gpu_counts_that_disagree_are_refused(argv: list[str]) -> None:
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert rc == 2 and "disagree" in err, err


def test_a_files_gpu_count_against_the_targets_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "accelerate.yaml"
    cfg.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n")
    argv = ["estimate", "7B", "--from", str(cfg), "--on", "2x4090"]
    rc, out, err = invoke(argv)
    hold_contract("estimate", argv, rc, out, err)
    assert rc == 2 and "disagree" in err and str(cfg) in err, err


@pytest.mark.parametrize("gpus", ["8", "1"])
def test_the_same_count_twice_or_the_default_still_estimates(gpus: str) -> None:
    rc, out, err = invoke(["estimate", "7B", "--on", "8xh100-80gb", "--gpus", gpus, "--format", "json"])
    assert rc == 0, err
    assert '"world_size": 8' in out


@pytest.mark.parametrize(
    ("on", "named"),
    [
        ("24MiB", "'24MiB' leaves no usable memory"),
        ("1GB", "'1GB' leaves no usable memory"),
        ("2x512MB", "'512mb' leaves no usable memory"),
        ("0x1GB", "'0x1GB': the device count must be"),
        ("0xh100", "'0xh100': the device count must be"),
    ],
)
def test_a_size_too_small_to_use_is_quoted_as_typed(on: str, named: str) -> None:
    argv = ["estimate", "7B", "--on", on]
    rc, out, err = invoke(argv)
    hold_contract("estimate", argv, rc, out, err)
    assert rc == 2 and named in err, err


# --- trainer keys that name something ------------------------------------------------------------------

LLAMA = "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\n"
KOHYA = "".join(
    (
        'pretrained_model_name_or_path = "stabilityai/stable-diffusion-xl-base-1.0"\n',
        'network_module = "networks.lora"\n',
    )
)
ACCEL = "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 2\n"
WORDS = {
    "axolotl-optimizer.yaml": (LLAMA + "optimizer: 5\n", "optimizer must be a name"),
    "axolotl-attn.yaml": (LLAMA + "attn_implementation: [1]\n", "attn_implementation must be a name"),
    "trl-optim.yaml": ("model_name_or_path: 7B\nuse_peft: true\noptim: 5\n", "optim must be a name"),
    "trl-attn.yaml": (
        "model_name_or_path: 7B\nuse_peft: true\nattn_implementation: 5\n",
        "attn_implementation",
    ),
    "lf-optim.yaml": (
        "model_name_or_path: 7B\nstage: sft\nfinetuning_type: lora\noptim: {a: 1}\n",
        "optim must",
    ),
    "kohya-optimizer.toml": (KOHYA + "optimizer_type = 5\n", "optimizer_type must be a name"),
    "kohya-mp.toml": (KOHYA + "mixed_precision = 5\n", "mixed_precision must be a name"),
    "accelerate-mp.yaml": (ACCEL + "mixed_precision: 5\n", "mixed_precision must be a name"),
    "accelerate-no.yaml": (ACCEL + "mixed_precision: no\n", "quote the word"),
    "mlx-optimizer.yaml": ("model: 7B\nfine_tune_type: lora\noptimizer: 5\n", "optimizer must be a name"),
    "torchtune-dtype.yaml": (
        "model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\nbatch_size: 1\ndtype: 5\n",
        "dtype must be a name",
    ),
}


@pytest.mark.parametrize("name", sorted(WORDS))
def test_a_name_key_of_another_type_is_one_clear_line(name: str, tmp_path: Path) -> None:
    text, words = WORDS[name]
    cfg = tmp_path / name
    cfg.write_text(text)
    model = [] if name.startswith("kohya") else ["7B"]
    argv = ["estimate", *model, "--from", str(cfg), "--on", "none"]
    rc, out, err = invoke(argv)
    hold_contract("estimate", argv, rc, out, err)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize(
    ("name", "text", "note"),
    [
        (
            "kohya-fp8.toml",
            KOHYA + 'mixed_precision = "fp8"\n',
            "mixed_precision 'fp8' has no fitcheck model",
        ),
        (
            "tt-dtype.yaml",
            "model:\n  _component_: torchtune.models.llama3_1.lora_llama3_1_8b\nbatch_size: 1\ndtype: int3\n",
            "dtype 'int3' is not a dtype",
        ),
    ],
)
def test_an_unknown_precision_word_is_noted(name: str, text: str, note: str, tmp_path: Path) -> None:
    cfg = tmp_path / name
    cfg.write_text(text)
    model = [] if name.startswith("kohya") else ["7B"]
    rc, _, err = invoke(["estimate", *model, "--from", str(cfg), "--on", "none"])
    assert rc == 0 and note in err, err


# --- accelerate distributed_type -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "rc", "words"),
    [
        ("MEGATRON_LM", 2, "Megatron-LM"),
        ("XLA", 2, "XLA"),
        ("MODEL_PARALLEL", 2, "model parallelism"),
        ("nonsense", 2, "is not one of accelerate's"),
        ("[1]", 2, "distributed_type must be a name"),
        ("MULTI_NPU", 0, "read as DDP"),
        ("NO", 0, "accelerate launches one process"),
        ("'NO'", 0, "accelerate launches one process"),
    ],
)
def test_accelerate_distributed_types_are_read_or_refused(
    kind: str, rc: int, words: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "accelerate.yaml"
    cfg.write_text(f"compute_environment: LOCAL_MACHINE\ndistributed_type: {kind}\nnum_processes: 8\n")
    argv = ["estimate", "7B", "--from", str(cfg), "--on", "none", "--format", "json"]
    got, out, err = invoke(argv)
    hold_contract("estimate", argv, got, out, err)
    assert got == rc and words in err, err
    if kind in ("NO", "'NO'"):
        assert '"gpus": 1' in out


# --- config.json optional fields -----------------------------------------------------------------------

BERT = {"model_type": "bert", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "vocab_size": 100}  # fmt: skip
T5 = {"model_type": "t5", "d_model": 64, "d_ff": 128, "num_layers": 2, "num_heads": 4, "d_kv": 16,
      "vocab_size": 100}  # fmt: skip
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100}


@pytest.mark.parametrize(
    ("base", "key", "value", "task"),
    [
        (BERT, "type_vocab_size", 2.5, "classification"),
        (BERT, "type_vocab_size", -2, "classification"),
        (BERT, "type_vocab_size", "x", "classification"),
        (BERT, "max_position_embeddings", 10**12, "classification"),
        (BERT, "num_labels", 10**12, "classification"),
        (BERT, "hidden_dropout_prob", 7, "classification"),
        (BERT, "attention_probs_dropout_prob", "x", "classification"),
        (T5, "num_decoder_layers", 10**9, "seq2seq"),
        (T5, "num_decoder_layers", 2.7, "seq2seq"),
        (T5, "relative_attention_num_buckets", -5, "seq2seq"),
        (GPT2, "n_positions", 10**13, None),
        (GPT2, "attn_pdrop", [0.1], None),
    ],
)
def test_an_optional_config_field_out_of_range_names_its_key(
    base: dict[str, object], key: str, value: object, task: str | None, tmp_path: Path
) -> None:
    import json

    (tmp_path / "config.json").write_text(json.dumps({**base, key: value}))
    argv = ["estimate", str(tmp_path), "--on", "none", *(["--task", task] if task else [])]
    rc, out, err = invoke(argv)
    hold_contract("estimate", argv, rc, out, err)
    assert rc == 2 and f"config.json: {key} must be" in err, err


def test_optional_config_fields_in_range_still_read(tmp_path: Path) -> None:
    import json

    cfg = {**BERT, "type_vocab_size": 2.0, "max_position_embeddings": 512, "hidden_dropout_prob": 0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, _, err = invoke(["estimate", str(tmp_path), "--on", "none", "--task", "classification"])
    assert rc == 0, err


# --- dataset tokens ------------------------------------------------------------------------------------


@pytest.mark.parametrize("tokens", ["1e400", "1e308T", "1001T", "99999999999999999999"])
def test_a_dataset_past_any_corpus_is_one_clear_line(tokens: str) -> None:
    argv = ["plan", "7B", "--on", "24GB", "--dataset-tokens", tokens, "--format", "json"]
    rc, out, err = invoke(argv)
    hold_contract("plan", argv, rc, out, err)
    assert rc == 2 and "--dataset-tokens" in err and "too large" in err, err


def test_the_library_bounds_dataset_tokens_too() -> None:
    from fitcheck import api
    from fitcheck.errors import InputError

    with pytest.raises(InputError, match="dataset-tokens"):
        api.plan("7B", on="24GB", dataset_tokens=10**16)


# --- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cvd", "gpus"), [("1", 1), ("1,0", 2), ("0,-1,1", 1), ("0,5,1", 1), ("1gpu", 1), ("GPU-x", 2)]
)
def test_cuda_visible_devices_is_read_as_cuda_reads_it(cvd: str, gpus: int) -> None:
    from fitcheck import api
    from hw_replay import env_from_fixture

    t = api.target("auto", probe_env=env_from_fixture("rtx4090_x2", environ={"CUDA_VISIBLE_DEVICES": cvd}))
    assert t is not None and t.backend == "cuda" and t.gpus == gpus


@pytest.mark.parametrize("cvd", ["", "-1", "5", "0,0"])
def test_cuda_visible_devices_that_hides_every_gpu_sizes_no_gpu(cvd: str) -> None:
    import dataclasses

    from fitcheck import api
    from fitcheck.errors import InputError
    from hw_replay import env_from_fixture, load_fixture

    env = env_from_fixture("rtx4090_x2", environ={"CUDA_VISIBLE_DEVICES": cvd})
    with pytest.raises(InputError, match="CUDA_VISIBLE_DEVICES"):
        api.target("auto", probe_env=env)
    ram = load_fixture("container_cgroup").get("files") or {}
    t = api.target("auto", probe_env=dataclasses.replace(env, read=lambda path: ram.get(path)))
    assert t is not None and t.backend == "cpu"
    assert any("CUDA_VISIBLE_DEVICES" in n and "RAM" in n for n in t.notes)


# --- check and the node's RAM --------------------------------------------------------------------------


@pytest.mark.parametrize(("ram", "rc"), [("1MB", 1), ("64GB", 0)])
def test_check_fails_when_the_node_cannot_hold_the_offload(ram: str, rc: int) -> None:
    argv = ["check", "7B", "--on", "2x4090", "--strategy", "zero3", "--offload", "all", "--host-memory", ram]
    got, out, err = invoke([*argv, "--format", "json"])
    hold_contract("check", [*argv, "--format", "json"], got, out, err)
    assert got == rc, err
    assert ("CPU RAM" in err) == (rc == 1)


# --- kohya conv_dim ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "rc", "targets", "words"),
    [
        ('["conv_dim=abc"]', 2, None, "conv_dim must be a whole number"),
        ('["conv_dim=-4"]', 2, None, "conv_dim must be a whole number"),
        ('["conv_dim=0"]', 0, "all-linear", "adds no LoRA to the 3x3 convolutions"),
        ('["conv_dim=8", "conv_alpha=1"]', 0, "conv", "sized at network_dim 16"),
        ('["conv_dim=16"]', 0, "conv", ""),
    ],
)
def test_kohya_conv_dim_is_read_as_sd_scripts_reads_it(
    args: str, rc: int, targets: str | None, words: str, tmp_path: Path
) -> None:
    cfg = tmp_path / "kohya.toml"
    cfg.write_text(KOHYA + f"network_dim = 16\nnetwork_args = {args}\n")
    argv = ["estimate", "--from", str(cfg), "--on", "none", "--format", "json"]
    got, out, err = invoke(argv)
    hold_contract("estimate", argv, got, out, err)
    assert got == rc and words in err, err
    if targets is not None:
        assert f'"lora_targets": "{targets}"' in out


# --- markdown cells ------------------------------------------------------------------------------------


def test_a_pipe_in_a_name_stays_in_its_markdown_cell(tmp_path: Path) -> None:
    import json

    folder = tmp_path / "a|b"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    argv = ["matrix", "--on", "24GB", "--models", str(folder), "--format", "markdown"]
    rc, out, err = invoke(argv)
    hold_contract("matrix", argv, rc, out, err)
    header, _, row = out.splitlines()[:3]
    assert rc == 0 and "a\\|b" in row
    assert row.replace("\\|", "").count("|") == header.count("|")


LLAMA_CONFIG = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip


# --- mlx-lm num_layers ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("layers", "noted"), [(0, False), (-5, False), (-1, False), (4, True)])
def test_mlx_num_layers_of_zero_or_less_is_every_block(layers: int, noted: bool, tmp_path: Path) -> None:
    cfg = tmp_path / "mlx.yaml"
    cfg.write_text(f"model: 7B\nfine_tune_type: lora\nnum_layers: {layers}\n")
    rc, _, err = invoke(["estimate", "7B", "--from", str(cfg), "--on", "apple-m3-max-36gb"])
    assert rc == 0, err
    assert ("adapts only the last" in err) == noted, err


# --- plan --emit - -------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["json", "yaml", "markdown"])
def test_emit_to_stdout_with_a_document_format_is_refused(fmt: str) -> None:
    argv = [
        "plan",
        "llama-3.1-8b",
        "--on",
        "24GB",
        "--emit",
        "-",
        "--emit-format",
        "hf.yaml",
        "--format",
        fmt,
    ]
    rc, out, err = invoke(argv)
    hold_contract("plan", argv, rc, out, err)
    assert rc == 2 and "--emit - puts the emitted file on stdout" in err, err


# --- error line length ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "7B", "--on", "none", "--lora-targets", "a" * 200_000],
        ["estimate", "7B", "--on", "a" * 200_000],
        ["estimate", "7B", "--on", "24GB", "--headroom", "a" * 200_000],
        ["estimate", "7B", "--on", "none", "--train-modules", "a" * 200_000],
        ["plan", "7B", "--on", "24GB", "--dataset-tokens", "a" * 200_000],
        ["estimate", "7B", "--from", "a" * 200_000],
    ],
    ids=["lora-targets", "on", "headroom", "train-modules", "dataset-tokens", "from"],
)
def test_an_error_quoting_a_huge_value_stays_one_bounded_line(argv: list[str]) -> None:
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert rc == 2 and len(err) < 1100 and "characters cut" in err, len(err)


@pytest.mark.parametrize("headroom", ["1e1%", "1E1%", "0x10%", "%", "1_0%"])
def test_headroom_percentage_is_a_plain_decimal(headroom: str) -> None:
    """--headroom 1e1% was read as 10% while memory sizes with an exponent are refused: one rule."""
    rc, _out, err = invoke(["check", "llama-3.2-1b", "--on", "rtx-4090", "--headroom", headroom])
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "--headroom" in err


def test_a_files_value_asks_about_model_only_when_it_names_the_models_parts(tmp_path: Path) -> None:
    """An error about a value the --from file set names the file; only a model-shaped value (LoRA targets,
    length, ...) asks whether MODEL is the file's model, and only when MODEL was typed: a GPU count does not
    depend on it, and without MODEL the file's own model was used."""
    acc = tmp_path / "accelerate.yaml"
    acc.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n")
    rc, _out, err = invoke(["check", "llama-3.1-8b", "--from", str(acc), "--on", "2x4090"])
    assert rc == 2 and f"(the value comes from {acc}, num_processes)" in err and "is MODEL" not in err
    ax = tmp_path / "axolotl.yaml"
    ax.write_text("base_model: meta-llama/Llama-3.1-8B\nadapter: lora\nlora_target_modules: [c_attn]\n")
    rc, _out, err = invoke(["estimate", "llama-3.2-1b", "--from", str(ax)])
    assert rc == 2 and "is MODEL the file's model?" in err and len(err.strip().splitlines()) == 1
    rc, _out, err = invoke(["estimate", "--from", str(ax)])  # no MODEL typed: the file's own model was used
    assert rc == 2 and f"comes from {ax}, lora_target_modules)" in err and "is MODEL" not in err
