"""``--from`` on litgpt fine-tuning configs (``litgpt finetune_lora --config FILE``): real config-hub files
(tests/data/from/litgpt/README.md gives each file's source and commit) read as litgpt's own code reads them
(readers/litgpt.py cites it), detection that takes no other trainer's file, refusals of what litgpt would not
run or fitcheck cannot pose, and the trainer defaults filled where the file is silent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_type_hints

import pytest

from fitcheck import api
from fitcheck.cli import main
from fitcheck.errors import FitcheckError
from fitcheck.readers import FORMATS, read_config
from fitcheck.readers.base import parse, read_text, syntax_of
from fitcheck.readers.detect import detect
from fitcheck.readers.merge import TRAINER_DEFAULT, resolve
from fitcheck.readers.neutral import is_neutral

DATA = Path(__file__).parent / "data" / "from"
LIT = DATA / "litgpt"
SETUP_FIELDS = tuple(get_type_hints(api.TrainingOptions))

_Q = {"method": "qlora", "double_quant": False, "optimizer": "paged-adamw", "gpus": 1, "seq_len": 512}
_L = {"method": "lora", "optimizer": "adamw", "optimizer_impl": "foreach", "gpus": 1, "seq_len": 512}
_F = {"method": "full", "optimizer": "adamw", "optimizer_impl": "foreach", "seq_len": 512}
_HEAD = "linear-modules,lm_head"  # every lora_* flag on, lora_head too

#: file -> (the model it names, the exact values it reads to).
EXPECTED: dict[str, tuple[str, dict[str, object]]] = {
    "llama-3.1-8b-qlora.yaml": (
        "meta-llama/Meta-Llama-3.1-8B",
        {**_Q, "lora_rank": 32, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": "q_proj,v_proj"}
        | {"batch_size": 2, "grad_accum": 4, "precision": "bf16"},  # global 8 // 1 device // micro 2
    ),
    "llama-3.2-1B-lora.yaml": (
        "meta-llama/Llama-3.2-1B",
        {**_L, "lora_rank": 32, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": "q_proj,v_proj"}
        | {"batch_size": 1, "grad_accum": 8, "precision": "bf16"},
    ),
    "tiny-llama-lora.yaml": (
        "TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
        {**_L, "lora_rank": 32, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": _HEAD}
        | {"batch_size": 8, "grad_accum": 1, "precision": "bf16"},
    ),
    "gemma2-9b-qlora.yaml": (
        "google/gemma-2-9b",
        {**_Q, "lora_rank": 16, "lora_alpha": 16.0, "lora_dropout": 0.1, "lora_targets": _HEAD}
        | {"batch_size": 1, "grad_accum": 6, "precision": "bf16"},
    ),
    "phi-3-qlora.yaml": (
        "microsoft/Phi-3-mini-4k-instruct",
        {**_Q, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": _HEAD}
        | {"batch_size": 4, "grad_accum": 2, "precision": "bf16"},
    ),
    "falcon-7b-lora.yaml": (
        "tiiuae/falcon-7b",
        {**_L, "lora_rank": 32, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": "q_proj,v_proj"}
        | {"batch_size": 1, "grad_accum": 8, "precision": "bf16"},
    ),
    "llama-3.2-3B-full.yaml": (
        "meta-llama/Llama-3.2-3B",
        {**_F, "gpus": 1, "batch_size": 4, "grad_accum": 16, "precision": "bf16"},
    ),
    # devices: 2 -> FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})
    "phi-2-full.yaml": (
        "microsoft/phi-2",
        {**_F, "gpus": 2, "batch_size": 4, "grad_accum": 1, "precision": "bf16"}
        | {"strategy": "fsdp", "fsdp_version": 1, "grad_ckpt": True},
    ),
    # 32-true with bnb.nf4 on a P100; an absolute checkpoint folder, handed on as given
    "mistral-7b-kaggle.yaml": (
        "/kaggle/temp/mistral/mistralai/Mistral-7B-Instruct-v0.3",
        {**_Q, "lora_rank": 32, "lora_alpha": 16.0, "lora_dropout": 0.05, "lora_targets": "q_proj,v_proj"}
        | {"batch_size": 2, "grad_accum": 4, "precision": "fp32"},
    ),
    # devices auto over num_nodes 2: FSDP2 (ModelParallelStrategy) with every Block checkpointed; bf16-mixed
    # is --master-weights (fp32 weights under autocast); the accumulation needs the GPU count (noted)
    "gemma3-27b-it-lora.yaml": (
        "/projects/data/teams/tts_team/agri_training/checkpoints/google/gemma-3-27b-it/google/gemma-3-27b-it/",
        {"method": "lora", "lora_rank": 16, "lora_alpha": 16.0, "lora_dropout": 0.1, "lora_targets": _HEAD}
        | {"nodes": 2, "strategy": "fsdp", "fsdp_version": 2, "grad_ckpt": True, "batch_size": 4}
        | {"seq_len": 512, "precision": "bf16", "master_weights": True, "optimizer": "adamw"}
        | {"optimizer_impl": "foreach"},
    ),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_hub_files_read_as_litgpt_reads_them(name: str) -> None:
    model, values = EXPECTED[name]
    got = read_config(str(LIT / name))
    assert (got.format, got.trainer, got.model) == ("litgpt", "litgpt", model)
    assert dict(got.values) == values
    assert set(got.keys) == set(values)  # every value names the key it came from
    # data, eval, logger and optimizer hyperparameters are listed as no memory effect, nothing else is left
    assert [k for k in got.unused if not is_neutral(k)] == []
    assert "data.class_path" in got.unused and "optimizer.init_args.lr" in got.unused


def test_every_file_here_has_a_readme_row() -> None:
    rows = (LIT / "README.md").read_text()
    files = {p.name for p in LIT.glob("*.yaml")}
    assert files == set(EXPECTED) | {"llama-2-7b-longlora.yaml"}
    assert all(f"`{f}`" in rows for f in files)


def test_notes_say_what_is_inferred() -> None:
    notes = " ".join(read_config(str(LIT / "gemma3-27b-it-lora.yaml")).notes)
    assert "bf16-mixed" in notes and "fp32 weights, gradients and AdamW states under autocast" in notes
    assert "FSDP2" in notes and "give --grad-accum" in notes
    hub = read_config(str(LIT / "llama-3.1-8b-qlora.yaml")).notes
    assert any("download folder of the Hub model meta-llama/Meta-Llama-3.1-8B" in n for n in hub)
    full = read_config(str(LIT / "phi-2-full.yaml")).notes
    assert any("FSDP1" in n for n in full)


def test_longlora_is_refused() -> None:
    with pytest.raises(FitcheckError, match="longlora_n_groups: LongLoRA"):
        read_config(str(LIT / "llama-2-7b-longlora.yaml"))


def test_detection_takes_litgpt_files_and_no_other() -> None:
    for path in LIT.glob("*.yaml"):
        assert detect(parse(read_text(str(path)), "yaml", str(path)), "yaml") == "litgpt", path.name
    for path in DATA.rglob("*"):
        if path.suffix not in (".yaml", ".yml", ".json", ".toml") or LIT in path.parents:
            continue
        try:
            doc = parse(read_text(str(path)), syntax_of(str(path)), str(path))
        except FitcheckError:
            continue
        assert detect(doc, syntax_of(str(path))) != "litgpt", path


def test_a_pretrain_config_is_refused(tmp_path: Path) -> None:
    """config_hub/pretrain/tinyllama.yaml @26857050, its keys that matter here."""
    path = tmp_path / "tinyllama.yaml"
    path.write_text("model_name: tiny-llama-1.1b\nprecision: bf16-mixed\ntrain:\n  micro_batch_size: 4\n")
    with pytest.raises(FitcheckError, match="a litgpt pretrain config"):
        read_config(str(path))


def _read(tmp_path: Path, text: str) -> object:
    path = tmp_path / "run.yaml"
    path.write_text("checkpoint_dir: checkpoints/meta-llama/Llama-2-7b-hf\n" + text)
    return read_config(str(path))


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("quantize: bnb.int8-training\nlora_r: 8\n", "int8-training"),
        ("quantize: bnb.nf4\nlora_r: 8\ndevices: 2\n", "NotImplementedError"),
        ("quantize: bnb.nf4\nlora_r: 8\nprecision: bf16-mixed\n", "Quantization and mixed precision"),
        ("quantize: bnb.nf4\nlora_r: 8\n", "unset: litgpt picks bf16-mixed"),
        ("quantize: bnb.nf4\nprecision: bf16-true\noptimizer: SGD\n", "only AdamW"),
        ("out_dir: out/finetune/adapter\nprecision: bf16-true\n", "finetune_adapter"),
        ("lora_r: 8\ntrain:\n  tie_embeddings: true\n", "tie_embeddings"),
        ("lora_query: false\nlora_value: false\n", "builds no adapter"),
        ("lora_r: 8\ndevices: 4\ntrain:\n  global_batch_size: 2\n", "no whole micro-batch"),
        ("lora_r: 8\nprecision: 64-true\n", "no fitcheck model"),
        ("quantize: nf4\nlora_r: 8\n", "not one litgpt takes"),
    ],
)
def test_what_litgpt_would_not_run_or_fitcheck_cannot_pose_is_refused(
    tmp_path: Path, text: str, match: str
) -> None:
    with pytest.raises(FitcheckError, match=match):
        _read(tmp_path, text)


@pytest.mark.parametrize(
    ("flags", "targets"),
    [
        ("lora_key: true\n", "q_proj,k_proj,v_proj"),
        ("lora_key: true\nlora_projection: true\n", "attn"),
        ("lora_key: true\nlora_projection: true\nlora_mlp: true\n", "all-linear"),
        ("lora_key: true\nlora_projection: true\nlora_mlp: true\nlora_head: true\n", _HEAD),
        ("lora_query: false\nlora_mlp: true\n", "v_proj,gate_proj,up_proj,down_proj"),
        ("lora_head: true\n", "q_proj,v_proj,lm_head"),
    ],
)
def test_lora_flags_read_as_targets(tmp_path: Path, flags: str, targets: str) -> None:
    got = _read(tmp_path, "precision: bf16-true\n" + flags)
    assert got.values["lora_targets"] == targets  # type: ignore[attr-defined]


def test_fp4_and_double_quant(tmp_path: Path) -> None:
    dq = _read(tmp_path, "quantize: bnb.nf4-dq\nprecision: bf16-true\nlora_r: 4\n")
    assert dq.values["double_quant"] is True  # type: ignore[attr-defined]
    fp4 = _read(tmp_path, "quantize: bnb.fp4\nprecision: bf16-true\nlora_r: 4\n")
    assert fp4.values["method"] == "qlora"  # type: ignore[attr-defined]
    assert any("FP4" in n for n in fp4.notes)  # type: ignore[attr-defined]


def test_silent_keys_take_litgpt_defaults(tmp_path: Path) -> None:
    """finetune/lora.py setup: lora_r 8, lora_alpha 16, lora_dropout 0.05, query + value, micro-batch 1 of a
    global 16 (accumulation 16 on one device); precision unset is litgpt's bf16-mixed."""
    read = _read(tmp_path, "quantize:\nlora_r:\ndevices: 1\n")
    merged = resolve({}, set(), read, SETUP_FIELDS)  # type: ignore[arg-type]
    assert merged.values["method"] == "lora" and merged.values["grad_accum"] == 16
    for field, value in {
        "lora_rank": 8,
        "lora_alpha": 16.0,
        "lora_dropout": 0.05,
        "lora_targets": "q_proj,v_proj",
        "batch_size": 1,
    }.items():
        assert (merged.values[field], merged.origin[field]) == (value, TRAINER_DEFAULT), field
    # unset: bf16-mixed, fp32 weights under autocast (noted)
    assert (merged.values["precision"], merged.values["master_weights"]) == ("bf16", True)


def test_hub_ids_and_from_format(tmp_path: Path) -> None:
    assert "litgpt" in FORMATS
    path = tmp_path / "run.yaml"
    path.write_text("checkpoint_dir: meta-llama/Llama-2-7b-hf\nlora_r: 4\nprecision: bf16-true\n")
    assert read_config(str(path), "lit-gpt").model == "meta-llama/Llama-2-7b-hf"


def _total(args: list[str], capsys: pytest.CaptureFixture[str]) -> float:
    assert main(["estimate", *args, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    return float(doc["device_bytes"])


@pytest.mark.parametrize(
    ("name", "model", "flags"),
    [
        (
            "llama-3.2-1B-lora.yaml",
            "llama-3.2-1b",
            "--method lora --lora-rank 32 --lora-alpha 16 --lora-dropout 0.05 --lora-targets q_proj,v_proj "
            "--batch-size 1 --grad-accum 8 --precision bf16 --optimizer adamw --optimizer-impl foreach",
        ),
        (
            "llama-3.1-8b-qlora.yaml",
            "llama-3.1-8b",
            "--method qlora --no-double-quant --lora-rank 32 --lora-alpha 16 --lora-dropout 0.05 "
            "--lora-targets q_proj,v_proj --batch-size 2 --grad-accum 4 --precision bf16 "
            "--optimizer paged-adamw",
        ),
        (  # all-linear + lora_head, spelled as bench/published.py _with_head spells it under litgpt
            "phi-3-qlora.yaml",
            "phi-3-mini",
            "--method qlora --no-double-quant --lora-rank 8 --lora-alpha 16 --lora-dropout 0.05 "
            "--lora-targets "
            "q_proj,k_proj,v_proj,o_proj,gate_up_proj,down_proj,lm_head --batch-size 4 --grad-accum 2 "
            "--precision bf16 --optimizer paged-adamw",
        ),
        (
            "tiny-llama-lora.yaml",
            "tinyllama-1.1b",
            "--method lora --lora-rank 32 --lora-alpha 16 --lora-dropout 0.05 --lora-targets "
            "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head --batch-size 8 --grad-accum 1 "
            "--precision bf16 --optimizer adamw --optimizer-impl foreach",
        ),
    ],
)
def test_the_file_estimates_as_the_published_record_is_posed(
    name: str, model: str, flags: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config-hub records (tests/data/published/litgpt-config-hub.yaml) pose these files by hand; the
    reader gives the same estimate."""
    common = [model, "--on", "a10g"]
    from_file = _total([*common, "--from", str(LIT / name)], capsys)
    by_hand = _total(
        [*common, "--trainer", "litgpt", "--seq-len", "512", "--gpus", "1", *flags.split()], capsys
    )
    assert from_file == by_hand


@pytest.mark.parametrize(
    ("precision", "dtype", "master"),
    [
        ("bf16-mixed", "bf16", True),
        ("16-mixed", "fp16", True),
        ("bf16", "bf16", True),
        ("16", "fp16", True),
        ("bf16-true", "bf16", None),
        ("32-true", "fp32", None),
    ],
)
def test_mixed_precisions_are_fp32_weights_under_autocast(
    tmp_path: Path, precision: str, dtype: str, master: bool | None
) -> None:
    """Lightning's mixed precisions (and their legacy aliases) keep the module fp32 under autocast in the
    compute dtype: --master-weights with --trainer litgpt; the -true ones are the model in that dtype."""
    got = _read(tmp_path, f"lora_r: 8\nprecision: {precision}\n")
    assert got.values["precision"] == dtype  # type: ignore[attr-defined]
    assert got.values.get("master_weights") is master  # type: ignore[attr-defined]
