"""Hostile inputs, fifth red-team pass (session 8): one test per class of failure the fourth pass left, each
failing before its fix.

- ``COLUMNS=0`` printed nothing at all with exit 0 (``check``: exit 1 and no word), and below 80 columns
  table cells were cut to "…" (the breakdown's GiB column at 40) (`fitcheck.render.MIN_COLUMNS`);
- ``--fsdp-version 1`` without an FSDP strategy (one GPU, ddp, ZeRO, a diffusion model) and
  ``--quant-storage`` without QLoRA on one GPU were dropped without a word (`fitcheck.engine.estimate._check`,
  `fitcheck.api.LLM_ONLY`); ``plan --fsdp-version 1`` on several GPUs searched every strategy and failed
  on device-map, a strategy nobody asked for; it now searches the FSDP ones (`fitcheck.planner.rules`); a
  trainer file's FSDP version is dropped when the command line replaces its strategy with another
  (`fitcheck.readers.merge`);
- ``--attn flash`` on Apple silicon or a CPU, or with ``--precision fp32``, was sized as if FlashAttention-2
  ran there (``xformers`` on Apple silicon was already refused) (`fitcheck.engine.estimate._check_flash`);
  the planner's grid held the fp32 + flash pair (axolotl full fine-tuning, whose fp16 is fp32) and now
  leaves it out (`fitcheck.planner.search.build_grid`);
- ``--on 2x4090`` with another script's digits (``２x4090``) counted two GPUs while ``٢٤GB`` was "not a
  usable size", and ``--on AUTO`` (read as ``auto``) lost the "no GPU detected" warning
  (`fitcheck.hardware.budget`, `fitcheck.api.estimate`);
- trainer configs: ``lora_target_modules: 5`` (any module list: plugins, lora_target, keys, fsdp) fell back to
  the default without a word, axolotl ``bf16: maybe`` / ``fp16: maybe`` were never read as flags, an
  unknown axolotl ``attention`` or ``fsdp`` word and ``deepspeed: 5`` were dropped
  (`fitcheck.readers.names.modules`, `fitcheck.readers.axolotl`, `fitcheck.readers.hfargs`);
- a config.json flag written as text (``"tie_word_embeddings": "false"``) read as true (a non-empty
  string), sizing a tied lm_head the model does not have (`fitcheck.sources.hf_config.check_flags`);
- ``--lora-dropout nan`` said "should be less than 1 (got nan)" (`fitcheck.models.LlmSetup.lora_dropout`);
- ``matrix --methods full,full`` drew the column twice in the table and once in the JSON document (keyed by
  method); a row or column named twice is refused (`fitcheck.commands.matrix._once`);
- ``plan --emit hf.yaml -o ""`` wrote into the working folder (`fitcheck.commands.plan.resolve_emits`);
- ``--from-format ""`` was read as not given (the format detected instead) (`fitcheck.readers.format_name`);
- ``--train-modules lm_head,lm_head`` counted two trained copies of the output layer; peft matches
  ``modules_to_save`` by name, one copy (`fitcheck.engine.lora.trained_modules`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.hardware.env import ProbeEnv
from fitcheck.readers import read_config
from fitcheck.sources.resolve import resolve
from hw_replay import env_from_fixture
from test_fuzz_cli import hold_contract, invoke

# --- narrow terminals --------------------------------------------------------------------------------------


@pytest.mark.parametrize("columns", ["0", "1", "40", "79"])
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "7B", "--on", "rtx-4090"],
        ["check", "7B", "--on", "rtx-4090"],
        ["matrix", "--on", "rtx-4090", "--models", "7B"],
        ["estimate", "7B", "--on", "2x4090", "--strategy", "zero3"],
    ],
    ids=["estimate", "check", "matrix", "zero3"],
)
def test_a_narrow_terminal_still_shows_every_figure(
    columns: str, argv: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "120")
    _, wide, _ = invoke(argv)
    monkeypatch.setenv("COLUMNS", columns)
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert "…" not in out, out
    assert "GiB" in out and "fit" in out, out
    for figure in ("26.86", "26.9") if argv[0] != "matrix" else ("26.86",):
        assert (figure in wide) == (figure in out), figure


# --- options that were dropped without a word --------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["estimate", "7B", "--fsdp-version", "1"], "--fsdp-version applies to an FSDP strategy"),
        (["estimate", "7B", "--gpus", "2", "--strategy", "zero2", "--fsdp-version", "1"], "not zero2"),
        (["estimate", "7B", "--gpus", "2", "--fsdp-version", "1"], "--fsdp-version applies"),
        (["check", "7B", "--on", "rtx-4090", "--fsdp-version", "1"], "--fsdp-version applies"),
        (["plan", "7B", "--on", "rtx-4090", "--fsdp-version", "1"], "--fsdp-version applies"),
        (["estimate", "sdxl", "--fsdp-version", "1"], "--fsdp-version applies to LLMs"),
        (["estimate", "7B", "--quant-storage", "fp16"], "--quant-storage applies to --method qlora"),
        (["estimate", "7B", "--method", "full", "--quant-storage", "bf16"], "--quant-storage applies"),
    ],
)
def test_an_option_the_run_cannot_use_is_refused(argv: list[str], words: str) -> None:
    if "--on" not in argv:
        argv = [*argv, "--on", "none"]
    rc, out, err = invoke(argv)
    hold_contract(argv[0], argv, rc, out, err)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "2", "--strategy", "fsdp", "--fsdp-version", "1"],
        ["--gpus", "2", "--strategy", "fsdp-no-shard", "--fsdp-version", "1"],
        ["--method", "qlora", "--quant-storage", "fp16"],
        ["--method", "qlora", "--gpus", "2", "--strategy", "fsdp", "--quant-storage", "bf16"],
    ],
)
def test_the_same_options_still_apply_where_they_mean_something(argv: list[str]) -> None:
    rc, _, err = invoke(["estimate", "7B", "--on", "none", *argv])
    assert rc == 0, err


# --- kernels that cannot run where they are asked to ------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--attn", "flash", "--on", "apple-m3-max-36gb"], "not mps"),
        (["--attn", "flash", "--on", "36GB-unified"], "not mps"),
        (["--attn", "flash", "--on", "cpu"], "not cpu"),
        (["--attn", "flash", "--trainer", "mlx", "--on", "apple-m3-max-36gb"], "not mps"),
        (["--attn", "flash", "--precision", "fp32", "--on", "rtx-4090"], "fp16 or bf16 only"),
        (["--attn", "flash", "--precision", "fp32", "--on", "none"], "fp16 or bf16 only"),
    ],
)
@pytest.mark.parametrize("command", ["estimate", "check"])
def test_flash_attention_where_it_cannot_run_is_refused(command: str, argv: list[str], words: str) -> None:
    args = [command, "7B", *argv]
    rc, out, err = invoke(args)
    if command == "check" and "none" in argv:
        assert rc == 2 and "--on" in err, err
        return
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and "--attn flash" in err and words in err, err


@pytest.mark.parametrize(
    "argv", [["--on", "rtx-4090"], ["--precision", "fp16", "--on", "none"], ["--on", "mi300x"]]
)
def test_flash_attention_on_a_gpu_in_16_bits_still_estimates(argv: list[str]) -> None:
    rc, _, err = invoke(["estimate", "7B", "--attn", "flash", *argv])
    assert rc == 0, err


# --- targets --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("on", ["２xrtx-4090", "٢xrtx-4090", "٢٤GB", "２４GB", "١٠٢٥", "2x٢٤GB"])
def test_a_target_with_digits_of_another_script_is_refused(on: str) -> None:
    args = ["estimate", "7B", "--on", on]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and "unknown hardware" in err, err


@pytest.mark.parametrize("on", ["auto", "AUTO", " Auto "])
def test_auto_in_any_case_keeps_the_no_gpu_warning(on: str, monkeypatch: pytest.MonkeyPatch) -> None:
    machine = env_from_fixture("container_cgroup")
    monkeypatch.setattr(ProbeEnv, "real", classmethod(lambda cls, use_torch=False: machine))
    rc, _, err = invoke(["estimate", "7B", "--on", on])
    assert rc == 0 and "no GPU detected" in err, err


@pytest.mark.parametrize(
    "argv",
    [
        ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--loss", "cce", "--emit", "axolotl.yaml"],
        ["plan", "qwen2.5-0.5b", "--on", "rtx-4090", "--method", "full", "--trainer", "axolotl"],
    ],
)
def test_the_planner_never_pairs_flash_with_fp32(argv: list[str], tmp_path: Path) -> None:
    args = (
        [*argv, "-o", str(tmp_path), "--format", "json"] if "--emit" in argv else [*argv, "--format", "json"]
    )
    rc, out, err = invoke(args)
    hold_contract("plan", args, rc, out, err)
    assert rc == 0, err
    doc = json.loads(out)
    setups = [r["candidate"]["setup"] for r in doc["runners_up"]] + [doc["chosen"]["setup"]]
    for s in setups:
        assert not (s["attn"] == "flash" and s["precision"] == "fp32"), s


def test_a_plan_asked_for_flash_in_fp32_is_one_clear_line() -> None:
    args = ["plan", "7B", "--on", "rtx-4090", "--precision", "fp32", "--attn", "flash"]
    rc, out, err = invoke(args)
    hold_contract("plan", args, rc, out, err)
    assert rc == 2 and "fp16 or bf16 only" in err, err


# --- trainer configs -------------------------------------------------------------------------------------

AXOLOTL = "base_model: meta-llama/Llama-3.1-8B\nadapter: lora\n"
LMF = "model_name_or_path: meta-llama/Llama-3.1-8B\nstage: sft\nfinetuning_type: lora\n"


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("axolotl.yaml", AXOLOTL + "lora_target_modules: 5\n", "lora_target_modules must be a list"),
        (
            "axolotl.yaml",
            AXOLOTL + "lora_target_modules: {q_proj: 1}\n",
            "lora_target_modules must be a list",
        ),
        (
            "axolotl.yaml",
            AXOLOTL + "lora_target_modules: [q_proj, 7]\n",
            "lora_target_modules must be a list",
        ),
        ("axolotl.yaml", AXOLOTL + "plugins: {a: 1}\n", "plugins must be a list"),
        ("axolotl.yaml", AXOLOTL + "lora_modules_to_save: -3\n", "lora_modules_to_save must be a list"),
        ("axolotl.yaml", AXOLOTL + "bf16: maybe\n", "bf16 must be true or false"),
        ("axolotl.yaml", AXOLOTL + "bf16: true\nfp16: [1]\n", "fp16 must be true or false"),
        ("axolotl.yaml", AXOLOTL + "fsdp: 5\n", "fsdp must be a list"),
        ("axolotl.yaml", AXOLOTL + "deepspeed: 5\n", "deepspeed must be the path"),
        ("lmf.yaml", LMF + "lora_target: 5\n", "lora_target must be a list"),
        ("lmf.yaml", LMF + "additional_target: {x: 1}\n", "additional_target must be a list"),
        ("lmf.yaml", LMF + "deepspeed: [1]\n", "deepspeed must be the path"),
    ],
)
def test_a_trainer_key_of_the_wrong_type_is_one_clear_line(
    name: str, text: str, words: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_text(text)
    args = ["estimate", "--from", str(path), "--on", "none"]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize(
    ("text", "words"),
    [
        (AXOLOTL + "attention: zzz\n", "attention 'zzz' has no fitcheck model"),
        # a list or mapping was an internal error (unhashable in the word table; found by the reader fuzz)
        (AXOLOTL + "attention: []\n", "attention [] has no fitcheck model"),
        (AXOLOTL + "attention: {flash: 1}\n", "has no fitcheck model"),
        (AXOLOTL + "fsdp: [no_shard, auto_wrap]\n", "fsdp: 'no_shard' is not read"),
    ],
)
def test_an_unknown_trainer_word_is_noted(text: str, words: str, tmp_path: Path) -> None:
    path = tmp_path / "axolotl.yaml"
    path.write_text(text)
    rc, _, err = invoke(["estimate", "--from", str(path), "--on", "none"])
    assert rc == 0 and words in err, err


@pytest.mark.parametrize(
    ("text", "precision"),
    [
        ("bf16: 'true'\n", "bf16"),
        ("bf16: 'false'\nfp16: 'false'\n", "fp32"),
        ("bf16: false\nfp16: 'yes'\n", "fp16"),
        ("bf16: auto\n", "bf16"),
        ("bf16: false\nfp16: false\nbfloat16: true\n", "bf16"),
    ],
)
def test_axolotl_precision_flags_written_as_text_are_read(text: str, precision: str, tmp_path: Path) -> None:
    path = tmp_path / "axolotl.yaml"
    path.write_text(AXOLOTL + text)
    assert read_config(str(path)).values.get("precision") == precision


# --- config.json flags -----------------------------------------------------------------------------------

LLAMA = {
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
}


@pytest.mark.parametrize(
    ("extra", "word"),
    [
        ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),
        ({"tie_word_embeddings": "true"}, "tie_word_embeddings"),
        ({"attention_bias": [True]}, "attention_bias"),
        ({"mlp_bias": 2}, "mlp_bias"),
        ({"text_config": {**LLAMA, "tie_word_embeddings": "no"}, "model_type": "llava"}, "text_config"),
    ],
)
def test_a_config_flag_that_is_no_boolean_is_one_clear_line(
    extra: dict[str, object], word: str, tmp_path: Path
) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **extra}))
    args = ["estimate", str(tmp_path), "--on", "none"]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and word in err and "must be true or false" in err, err


@pytest.mark.parametrize("tie", [True, False, 1, 0, None])
def test_a_config_flag_as_json_writes_it_still_reads(tie: object, tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "tie_word_embeddings": tie}))
    spec = resolve(str(tmp_path))
    assert spec.arch.tie_embeddings is bool(tie)  # type: ignore[union-attr]


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e309"])
def test_a_non_finite_dropout_is_named_as_such(value: str) -> None:
    args = ["estimate", "7B", "--on", "none", "--lora-dropout", value]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and "--lora-dropout" in err and "finite number" in err, err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--methods", "full,lora,full"], "--methods: 'full' is given twice"),
        (["--models", "7B,1B,7b"], "--models: '7b' is given twice"),
        (["--models", "a\x1b[2J,a\x1b[2J"], "is given twice"),
    ],
)
def test_a_matrix_row_or_column_named_twice_is_refused(argv: list[str], words: str) -> None:
    args = ["matrix", "--on", "none", *argv, "--format", "json"]
    rc, out, err = invoke(args)
    hold_contract("matrix", args, rc, out, err)
    assert rc == 2 and words in err, err


@pytest.mark.parametrize("folder", ["", "  "])
def test_an_empty_output_folder_is_refused_before_anything_is_written(
    folder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["plan", "llama-3.1-8b", "--on", "rtx-4090", "--emit", "hf.yaml", "-o", folder]
    rc, out, err = invoke(args)
    hold_contract("plan", args, rc, out, err)
    assert rc == 2 and "-o/--output-dir is empty" in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["estimate", "plan"])
@pytest.mark.parametrize("fmt", ["", "  "])
def test_an_empty_from_format_is_refused(command: str, fmt: str) -> None:
    sample = Path(__file__).parent / "data" / "from" / "axolotl" / "lora-8b.yml"
    args = [command, "7B", "--on", "rtx-4090", "--from", str(sample), "--from-format", fmt]
    rc, out, err = invoke(args)
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and "--from-format is empty" in err, err


@pytest.mark.parametrize(
    ("twice", "once"),
    [("lm_head,lm_head", "lm_head"), ("lm_head,embed_tokens,lm_head", "embed_tokens,lm_head")],
)
def test_a_module_named_twice_in_train_modules_is_trained_once(twice: str, once: str) -> None:
    def peak(modules: str) -> int:
        args = ["estimate", "7B", "--on", "none", "--train-modules", modules, "--format", "json"]
        rc, out, err = invoke(args)
        assert rc == 0, err
        return int(json.loads(out)["peak_allocated_bytes"])

    assert peak(twice) == peak(once)


def test_plan_with_fsdp_version_1_searches_fsdp(tmp_path: Path) -> None:
    args = ["plan", "llama-3.1-8b", "--on", "2x4090", "--fsdp-version", "1", "--format", "json"]
    rc, out, err = invoke(args)
    hold_contract("plan", args, rc, out, err)
    assert rc == 0, err
    doc = json.loads(out)
    setups = [r["candidate"]["setup"] for r in doc["runners_up"]] + [doc["chosen"]["setup"]]
    assert {s["strategy"] for s in setups} <= {"fsdp", "fsdp-grad-op", "fsdp-hybrid"}
    assert {s["fsdp_version"] for s in setups} == {1}


def test_a_files_fsdp_version_gives_way_to_a_strategy_the_command_line_replaces() -> None:
    sample = Path(__file__).parent / "data" / "from" / "accelerate" / "fsdp.yaml"
    base = ["estimate", "7B", "--on", "none", "--from", str(sample), "--format", "json"]
    rc, out, err = invoke([*base, "--strategy", "zero3"])
    assert rc == 0, err
    assert json.loads(out)["setup"]["strategy"] == "zero3"
    rc, _, err = invoke([*base, "--strategy", "zero3", "--fsdp-version", "1"])
    assert rc == 2 and "--fsdp-version applies to an FSDP strategy" in err, err


# --- a sequence past a learned position table (found by round five, left to the lead) ---------------------


#: roberta-base's published shape (FacebookAI/roberta-base config.json): 514 position rows, 2 of them offset
ROBERTA = {
    "model_type": "roberta", "architectures": ["RobertaForMaskedLM"], "hidden_size": 768,
    "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072, "vocab_size": 50265,
    "max_position_embeddings": 514, "type_vocab_size": 1, "hidden_act": "gelu", "layer_norm_eps": 1e-05,
}  # fmt: skip


@pytest.mark.parametrize(("model", "rows", "usable"), [("gpt2", 1024, 1024), ("roberta", 514, 512)])
def test_a_sequence_past_the_learned_positions_is_warned(
    model: str, rows: int, usable: int, tmp_path: Path
) -> None:
    """GPT-2's 1,024 and RoBERTa's 514 position rows (2 reserved): the 2,048-token default cannot run; the
    estimate is sized as asked and says so, with the length that can; at or under it, no word."""
    from fitcheck import api

    if model == "roberta":
        (tmp_path / "config.json").write_text(json.dumps(ROBERTA))
        model = str(tmp_path)
    spec = api.resolve(model)
    assert spec.arch.learned_positions == rows
    long = api.estimate(spec, method="full")
    said = [w for w in long.warnings if "learned positions" in w]
    assert len(said) == 1 and f"--seq-len {usable:,} or less" in said[0], long.warnings
    short = api.estimate(spec, method="full", seq_len=usable)
    assert not [w for w in short.warnings if "learned positions" in w]
    over = api.estimate(spec, method="full", seq_len=usable + 1)
    assert [w for w in over.warnings if "learned positions" in w]
    rope = api.estimate(api.resolve("llama-3.1-8b"), method="lora", seq_len=200_000)
    assert not [w for w in rope.warnings if "learned positions" in w]  # rotary positions: no table


def test_a_run_of_centuries_reads_in_years() -> None:
    """plan --dataset-tokens 1e22 printed '76322106481481.5 days'."""
    from fitcheck.render import _duration

    assert _duration(3 * 86400) == "3.0 days"
    assert _duration(1e22 / 1500) == f"{1e22 / 1500 / (365.25 * 86400):,.0f} years"
    assert "days" not in _duration(10 * 365.25 * 86400)
