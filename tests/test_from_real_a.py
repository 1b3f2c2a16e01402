"""``--from`` on the trainers' own example configs: axolotl, LLaMA-Factory, the alignment-handbook's TRL
recipes and the accelerate / DeepSpeed files those repositories ship (tests/data/from, every row of
SOURCES.md from those repositories).

Each file has a golden of what it reads to (tests/golden/from_real_a/<file>.json: the reader's values, the
keys they came from, its notes and the keys it did not use, and the setup after the trainer's defaults),
or of the one line that refuses it. Every file also goes through ``fitcheck check --from FILE --on
h100-80gb``: a file that reads is answered (exit 0 or 1) with the file's values in the setup; a refused
file is exit 2 with exactly that line. Regenerate the goldens with ``FITCHECK_UPDATE_GOLDEN=1 pytest
tests/test_from_real_a.py`` after a deliberate reader change, and read the diff.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from fitcheck import api
from fitcheck.cli import main
from fitcheck.errors import FitcheckError
from fitcheck.readers import read_config
from fitcheck.readers.merge import resolve
from fitcheck.readers.neutral import is_neutral
from golden_helpers import check_golden

HERE = Path(__file__).parent
DATA = HERE / "data" / "from"
GOLDEN = HERE / "golden" / "from_real_a"
#: The repositories whose example configs this test owns (SOURCES.md's repository column).
MINE = (
    "axolotl-ai-cloud/axolotl",
    "hiyouga/LLaMA-Factory",
    "huggingface/alignment-handbook",
    "huggingface/trl",
)
SETUP_FIELDS = tuple(get_type_hints(api.TrainingOptions))
#: MODEL on the command line for files whose own model is no preset (the Hub is not reached in tests):
#: a preset of the same shape (MoE experts, module names), else a Llama-shaped 8B.
STAND_IN = {
    "axolotl/gemma4-26b-a4b-moe-qlora.yaml": "qwen3-30b-a3b",
    # image_max_pixels reads as image tokens, which only a model with a vision tower takes
    "llamafactory/qwen3vl_lora_sft.yaml": "gemma-3-4b",
    "llamafactory/qwen3vlmoe_lora_sft_fsdp.yaml": "gemma-3-4b",
}
#: Files that read but that the engine then refuses, with the reason (one line, exit 2): LoRA targets in a
#: vision adapter (fitcheck matches named targets in the language model only).
#: Files whose stand-in model lacks some of the named targets: peft ignores those beside ones that match,
#: and the estimate warns (engine/lora.py unmatched_targets).
ENGINE_WARNS = {"axolotl/scout-vision-qlora-fsdp2-flex.yaml": "this model has no module 'fc1'"}


def _files() -> list[str]:
    rows = (DATA / "SOURCES.md").read_text().splitlines()
    out = []
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[1] in MINE:
            out.append(cells[0].strip("`"))
    return out


FILES = _files()


def _shown(text: str) -> str:
    """A line with the data folder's absolute path made relative (goldens do not depend on the checkout)."""
    return text.replace(str(DATA) + "/", "")


def _reading(name: str) -> dict[str, Any]:
    """What the file reads to, as the golden stores it."""
    try:
        read = read_config(str(DATA / name))
    except FitcheckError as exc:
        return {"file": name, "error": _shown(str(exc))}
    merged = resolve({}, set(), read, SETUP_FIELDS)
    return {
        "file": name,
        "format": read.format,
        "trainer": read.trainer,
        "model": read.model,
        "values": dict(read.values),
        "keys": dict(read.keys),
        "notes": [_shown(n) for n in read.notes],
        "unused": list(read.unused),
        "not_understood": [k for k in read.unused if not is_neutral(k)],
        "setup": merged.values,
        "setup_origin": merged.origin,
        "pending": merged.pending,
    }


def _golden(name: str) -> Path:
    return GOLDEN / (name.replace("/", "__") + ".json")


def test_every_file_of_these_repositories_is_here_once() -> None:
    assert len(FILES) >= 30 and len(set(FILES)) == len(FILES)
    assert all((DATA / f).is_file() for f in FILES)
    orphans = {p.name for p in GOLDEN.glob("*.json")} - {_golden(f).name for f in FILES}
    assert not orphans, f"goldens without a SOURCES.md row: {sorted(orphans)}"


@pytest.mark.parametrize("name", FILES)
def test_file_reads_to_its_golden(name: str) -> None:
    got = _reading(name)
    path = _golden(name)
    check_golden(path, json.dumps(got, indent=2, sort_keys=True) + "\n", name)


def _model(name: str, golden: dict[str, Any]) -> list[str]:
    """MODEL for the command line: none when the file's model is a preset's Hub id (no network), else a
    stand-in preset (the reader must still read the file)."""
    model = golden.get("model")
    hub = {m.hf_id for m in api.models() if m.hf_id}
    if model in hub and name not in STAND_IN:
        return []
    return [STAND_IN.get(name, "llama-3.1-8b")]


@pytest.mark.parametrize("name", FILES)
def test_check_answers_or_refuses_in_one_line(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    golden = json.loads(_golden(name).read_text())
    model = _model(name, golden)
    rc = main(["check", *model, "--from", str(DATA / name), "--on", "h100-80gb", "--format", "json"])
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err
    if "error" in golden:
        assert rc == 2 and out == ""
        assert _shown(err.strip()) == f"fitcheck: error: {golden['error']}"
        return
    assert rc in (0, 1), err
    doc = json.loads(out)
    if name in ENGINE_WARNS:
        assert any(ENGINE_WARNS[name] in w for w in doc["warnings"]), doc["warnings"]
    for field, origin in golden["setup_origin"].items():
        if origin == "file" and field in golden["setup"]:
            assert doc["setup"][field] == golden["setup"][field], field


# ------------------------------------------------------------------------------- rules, one at a time


def _read(tmp_path: Path, text: str, name: str = "c.yaml") -> Any:
    path = tmp_path / name
    path.write_text(text)
    return read_config(str(path))


def test_a_regex_target_reads_as_the_projections_it_matches(tmp_path: Path) -> None:
    base = "base_model: x\nadapter: lora\n"
    every = _read(tmp_path, base + "lora_target_modules: 'model.layers.[\\d]+.self_attn.(q|v)_proj'\n")
    assert every.values["lora_targets"] == "q_proj,v_proj"
    assert not any("some layers" in n for n in every.notes)
    some = _read(tmp_path, base + "lora_target_modules: '.*\\.layers\\.(3|7)\\.self_attn\\.q_proj'\n")
    assert some.values["lora_targets"] == "q_proj" and any("upper bound" in n for n in some.notes)
    with pytest.raises(FitcheckError, match="matches no decoder projection"):
        _read(tmp_path, base + "lora_target_modules: 'vision_tower\\..*'\n")


def test_a_named_list_is_not_widened_to_all_linear(tmp_path: Path) -> None:
    mods = "[q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]"
    r = _read(tmp_path, f"base_model: x\nadapter: lora\nlora_target_modules: {mods}\n")
    assert r.values["lora_targets"] == "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    assert (
        _read(tmp_path, "base_model: x\nadapter: lora\nlora_target_linear: true\n").values["lora_targets"]
        == "linear-modules"
    )


def test_the_cce_plugin_switches_its_loss_on_unless_the_key_says_false(tmp_path: Path) -> None:
    plugin = "plugins: [axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin]\n"
    assert _read(tmp_path, "base_model: x\n" + plugin).values["loss"] == "cce"
    off = _read(tmp_path, "base_model: x\n" + plugin + "cut_cross_entropy: false\n")
    assert "loss" not in off.values
    liger = "plugins: [axolotl.integrations.liger.LigerPlugin]\n"  # LigerArgs default None: off
    assert "loss" not in _read(tmp_path, "base_model: x\n" + liger).values


def test_fsdp_config_keys_read_with_or_without_the_fsdp_prefix(tmp_path: Path) -> None:
    for prefix in ("", "fsdp_"):
        r = _read(
            tmp_path,
            "base_model: x\nfsdp_version: 1\nfsdp_config:\n"
            f"  {prefix}sharding_strategy: SHARD_GRAD_OP\n  {prefix}activation_checkpointing: true\n"
            f"  {prefix}offload_params: true\n",
        )
        assert (r.values["strategy"], r.values["grad_ckpt"], r.values["offload"]) == (
            "fsdp-grad-op",
            True,
            "all",
        )


@pytest.mark.parametrize(
    ("flags", "want"),
    [
        ("bf16: false\nfp16: false\nfloat16: true\n", ("fp16", False)),
        ("bf16: false\nfp16: false\nbfloat16: true\n", ("bf16", False)),
        ("bf16: false\nfp16: false\n", ("fp32", None)),
        ("bf16: true\nbfloat16: true\n", ("bf16", None)),
    ],
)
def test_axolotl_load_dtype_without_autocast(
    tmp_path: Path, flags: str, want: tuple[str, bool | None]
) -> None:
    r = _read(tmp_path, "base_model: x\n" + flags)
    assert (r.values["precision"], r.values.get("autocast")) == want


def test_a_deepspeed_json_the_file_names_is_read_when_found(tmp_path: Path) -> None:
    ds = tmp_path / "ds" / "z3.json"
    ds.parent.mkdir()
    ds.write_text('{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}')
    r = _read(tmp_path, "base_model: x\ndeepspeed: ds/z3.json\n")
    assert (r.values["strategy"], r.values["offload"]) == ("zero3", "optimizer")
    assert r.keys["strategy"].startswith("deepspeed (") and not any("separate file" in n for n in r.notes)
    missing = _read(tmp_path, "base_model: x\ndeepspeed: nowhere.json\n")
    assert "strategy" not in missing.values and any("separate file" in n for n in missing.notes)


def test_alignment_handbook_sft_recipes_are_trl_not_mlx(tmp_path: Path) -> None:
    r = _read(tmp_path, "model_name_or_path: x\nmax_seq_length: 2048\nbf16: true\n")
    assert r.format == "trl" and r.values["seq_len"] == 2048
    mlx = _read(tmp_path, "model: mlx_model\nmax_seq_length: 2048\n")
    assert mlx.format == "mlx"


def test_every_refusal_row_cites_its_source_and_refuses_in_one_line(tmp_path: Path) -> None:
    from fitcheck.readers.unposed import TABLE

    base = {"axolotl": "base_model: x\n", "llamafactory": "stage: sft\n", "trl": "model_name_or_path: x\n"}
    base["accelerate"] = "distributed_type: FSDP\n"
    value = {"stage": "dpo", "finetuning_type": None, "parallelism_config": "{parallelism_config_cp_size: 2}"}
    value |= dict.fromkeys(("freeze_vision_tower", "freeze_multi_modal_projector"), "false")
    for fmt, rows in TABLE.items():
        for row in rows:
            assert "@" in row.source and row.what
            if row.key == "finetuning_type":
                continue  # two rows, covered by the goldens (freeze, oft)
            shown = value.get(row.key) or "2"
            with pytest.raises(FitcheckError) as err:
                _read(tmp_path, base[fmt] + f"{row.key}: {shown}\n", f"{fmt}.yaml")
            assert f"{row.key}: " in str(err.value) and "\n" not in str(err.value)


def test_docs_name_every_refused_key() -> None:
    from fitcheck.readers.unposed import TABLE

    doc = (HERE.parent / "docs" / "from.md").read_text()
    for rows in TABLE.values():
        for row in rows:
            assert f"`{row.key}" in doc, row.key


def test_target_parameters_keep_their_expert_names(tmp_path: Path) -> None:
    r = _read(
        tmp_path,
        "base_model: x\nadapter: lora\nlora_target_modules: [q_proj]\n"
        "lora_target_parameters: [mlp.experts.gate_up_proj, experts.down_proj]\n",
    )
    assert r.values["lora_targets"] == "q_proj,experts.gate_up_proj,experts.down_proj"


def test_the_report_tells_keys_without_memory_effect_from_keys_not_understood(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = str(DATA / "axolotl" / "gemma4-26b-a4b-moe-qlora.yaml")
    main(["check", "qwen3-30b-a3b", "--from", path, "--on", "h100-80gb"])
    lines = capsys.readouterr().err.splitlines()
    neutral = [x for x in lines if "not used (no memory effect)" in x]
    unknown = [x for x in lines if "not understood, ignored (may change memory)" in x]
    assert len(neutral) == len(unknown) == 1
    assert "learning_rate" in neutral[0] and "lora_mlp_kernel" not in neutral[0]
    assert "lora_mlp_kernel" in unknown[0] and "learning_rate" not in unknown[0]


def test_an_adapter_other_than_lora_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FitcheckError, match="adapter: 'llama-adapter' has no fitcheck memory model"):
        _read(tmp_path, "base_model: x\nadapter: llama-adapter\n")


def test_lora_target_linear_on_mixtral_is_axolotls_list_not_peft_all_linear(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """axolotl's example Mixtral QLoRA (lora_target_linear, lora_dropout 0.05): find_all_linear_names finds
    only the attention projections on transformers 5 (the experts are 3-D parameters, the router no
    nn.Linear), so the adapters are the attention's, and the dropout does not meet peft's ParamWrapper."""
    name = str(DATA / "axolotl/mixtral-qlora.yml")
    rc = main(["estimate", "--from", name, "--on", "h100-80gb", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["setup"]["lora_targets"] == "linear-modules"
    attn = api.estimate("mixtral-8x7b", method="qlora", lora_rank=32, lora_targets="attn", seq_len=64)
    assert (
        doc["params"]["trainable"]
        == attn.params.trainable
        == 32 * 32 * (2 * (4096 + 4096) + 2 * (4096 + 1024))
    )
    peft_all = api.estimate("mixtral-8x7b", method="qlora", lora_rank=32, seq_len=64)
    assert peft_all.params.trainable > 10 * attn.params.trainable  # all-linear adds experts and router


def test_axolotl_lets_lora_dropout_through_converted_expert_targets() -> None:
    """On a converted MoE type whose dense MLP names reach the experts (Qwen3-MoE with mlp_only_layers),
    axolotl patches ParamWrapper to take lora_dropout; a plain peft run (--trainer hf) refuses it, and so
    does axolotl when the file names the expert parameters itself (lora_target_parameters)."""
    from fitcheck.engine.lora import validate_parameter_targets
    from fitcheck.errors import OptionError
    from fitcheck.models import LlmSetup
    from fitcheck.sources.hf_config import arch_from_hf_config
    from test_architectures import CASES

    a = arch_from_hf_config({"model_type": "qwen3_moe", **CASES["qwen3_moe"][1]})
    kw = {"method": "lora", "lora_dropout": 0.05}
    validate_parameter_targets(a, LlmSetup(trainer="axolotl", lora_targets="linear-modules", **kw))
    with pytest.raises(OptionError, match="ParamWrapper"):
        validate_parameter_targets(a, LlmSetup(trainer="hf", lora_targets="linear-modules", **kw))
    named = "linear-modules,experts.down_proj"  # lora_target_parameters: no patch, peft refuses
    with pytest.raises(OptionError, match="ParamWrapper"):
        validate_parameter_targets(a, LlmSetup(trainer="axolotl", lora_targets=named, **kw))
    with pytest.raises(OptionError, match="ParamWrapper"):  # DoRA is not patched
        validate_parameter_targets(a, LlmSetup(trainer="axolotl", lora_targets="linear-modules", dora=True))


@pytest.mark.parametrize(
    ("template", "pixels"),
    [(t, p) for t in ("qwen2_vl", "qwen3_vl") for p in (65536, 262144, 768 * 768, 4_000_000, 1 << 24)],
)
def test_image_tokens_follow_llamafactory_and_the_qwen_vl_processor(template: str, pixels: int) -> None:
    """LLaMA-Factory's resize to the cap, then transformers' own smart_resize, then the merge."""
    from fitcheck.readers import mmtokens

    qwen = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    grid = mmtokens.TEMPLATES[template]
    side = mmtokens.square_side(pixels)
    cap = grid.max_pixels if grid.max_pixels is not None else 1 << 40
    h, w = qwen.smart_resize(side, side, factor=grid.factor, max_pixels=cap)
    assert mmtokens.image_tokens(pixels, grid) == (h // grid.patch) * (w // grid.patch) // grid.merge**2


def test_image_max_pixels_reads_as_image_tokens_for_qwen_vl_templates(tmp_path: Path) -> None:
    base = "model_name_or_path: x\nstage: sft\nfinetuning_type: lora\nimage_max_pixels: 262144\n"
    assert _read(tmp_path, base + "template: qwen3_vl\n").values["image_tokens"] == 256  # 512 / 32 = 16 x 16
    assert _read(tmp_path, base + "template: qwen2_vl\n").values["image_tokens"] == 324  # 504 / 28 = 18 x 18
    other = _read(tmp_path, base + "template: llava\n")
    assert "image_tokens" not in other.values
    assert any("give --image-tokens" in n for n in other.notes)


def test_lora_target_linear_joins_the_named_modules_and_parameters(tmp_path: Path) -> None:
    """_build_peft_lora_config: ``list(set(lora_target_modules + find_all_linear_names(model)))``, and
    ``lora_target_parameters`` beside them."""
    base = "base_model: x\nadapter: lora\nlora_target_linear: true\n"
    named = _read(tmp_path, base + "lora_target_modules: [lm_head]\n")
    assert named.values["lora_targets"] == "linear-modules,lm_head"
    params = _read(tmp_path, base + "lora_target_parameters: [mlp.experts.down_proj]\n")
    assert params.values["lora_targets"] == "linear-modules,experts.down_proj"
