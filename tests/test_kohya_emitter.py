"""kohya emitter: every key of every file is an option of the chosen script, in the right TOML type.

References (copied into tests/data with the sd-scripts commit they were generated from):
``kohya_args.tsv`` (every script's argparse options: dest, action, type, nargs, choices, scripts)
and ``kohya_dataset_schema.md`` (ConfigSanitizer's key sets and types per level and mode). Golden
files under ``tests/data/golden/kohya/`` pin the exact text; they are parsed back with tomllib.
Regenerate them with ``FITCHECK_UPDATE_GOLDEN=1 pytest tests/test_kohya_emitter.py``.
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from fitcheck.diffusion.estimate import estimate_diffusion
from fitcheck.diffusion.sources import spec_from_preset
from fitcheck.emitters.kohya import CONFIG, DATASET, SCRIPTS, emit_kohya, script_for, to_toml
from fitcheck.models import DiffusionSetup

DATA = Path(__file__).parent / "data"
GOLDEN = DATA / "golden" / "kohya"
COMMIT = "48d368fa557731ad0488c07304dfeba8c07910eb"


def load_options() -> dict[str, dict[str, Any]]:
    lines = (DATA / "kohya_args.tsv").read_text(encoding="utf-8").splitlines()
    assert COMMIT in lines[0], "the option list must name its sd-scripts commit"
    rows = [line.split("\t") for line in lines if not line.startswith("#")]
    header, body = rows[0], rows[1:]
    out = {}
    for row in body:
        rec = dict(zip(header, row, strict=False))
        rec["scripts"] = set(rec["scripts"].split(","))
        rec["choices"] = [c for c in rec["choices"].split("|") if c] if rec["choices"] else []
        out[rec["key"]] = rec
    return out


OPTIONS = load_options()


def check_config(script: str, flat: dict[str, Any]) -> None:
    """Key by key, type by type, against the script's parser (what kohya_validate.py checks)."""
    name = script.removesuffix(".py")
    for key, value in flat.items():
        opt = OPTIONS.get(key)
        assert opt is not None, f"{key}: not an sd-scripts option (it would be silently ignored)"
        assert name in opt["scripts"], f"{key}: {script} has no such option"
        action, typ, nargs = opt["action"], opt["type"], opt["nargs"]
        if action in ("storetrue", "storefalse"):
            assert isinstance(value, bool), f"{key}: a flag needs true/false"
        elif nargs in ("*", "+"):
            assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{key}: array of str"
        elif typ == "int":
            assert isinstance(value, int) and not isinstance(value, bool), f"{key}: TOML integer"
        elif typ == "float":
            assert isinstance(value, float), f"{key}: TOML float"
        elif typ == "int_or_float":
            assert isinstance(value, int | float) and not isinstance(value, bool), key
        else:  # str, Path, or a choices-only option
            assert isinstance(value, str), f"{key}: TOML string (sd-scripts splits/compares it)"
        if opt["choices"] and not isinstance(value, bool):
            assert str(value) in opt["choices"], f"{key}: {value!r} not in {opt['choices']}"


def check_train_time_rules(script: str, flat: dict[str, Any], data: dict[str, Any], backend: str) -> None:
    """The checks sd-scripts only makes in train() (trainer_formats.md 1.2), done here."""
    if flat.get("full_bf16"):
        assert flat["mixed_precision"] == "bf16"
    if flat.get("full_fp16"):
        assert flat["mixed_precision"] == "fp16"
    if flat.get("cache_text_encoder_outputs"):
        assert not data.get("general", {}).get("shuffle_caption", False)
        if script == "sdxl_train_network.py":
            assert flat["network_train_unet_only"] is True
    if backend == "mps":
        assert not flat.get("xformers"), "never xformers on MPS"
    steps = data["datasets"][0]["bucket_reso_steps"]
    need = 64 if script == "fine_tune.py" else 16 if script == "flux_train.py" else 32
    assert steps % need == 0
    res = [int(x) for x in flat["resolution"].split(",")]
    ds = data["datasets"][0]
    if ds.get("bucket_no_upscale"):  # sd-scripts ignores the limits then (train_util.make_buckets)
        assert "min_bucket_reso" not in ds and "max_bucket_reso" not in ds
    else:
        assert ds["min_bucket_reso"] <= min(res) <= max(res) <= ds["max_bucket_reso"]
    if script.startswith(("sd3_", "flux_")):  # their models run their own attention, no flag read
        assert not {"sdpa", "xformers", "mem_eff_attn"} & set(flat)


# --- dataset schema from kohya_dataset_schema.md -------------------------------------------------


def _schema_tables() -> dict[str, list[list[str]]]:
    text = (DATA / "kohya_dataset_schema.md").read_text(encoding="utf-8")
    assert COMMIT in text
    tables: dict[str, list[list[str]]] = {}
    heading = ""
    for line in text.splitlines():
        if line.startswith("### "):
            heading = line[4:].strip()
        elif line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            tables.setdefault(heading, []).append(cells)
    return tables


TABLES = _schema_tables()
TYPE_OK = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "float": lambda v: isinstance(v, float),
}


def _schema(db: bool, ft: bool) -> dict[str, tuple[set[str], str]]:
    """key -> (levels G/D/S where accepted, type text) for a script's ConfigSanitizer flags."""
    out: dict[str, tuple[set[str], str]] = {}
    for cells in TABLES["Dataset-level keys (G, D)"]:
        out[cells[0].strip("`")] = ({"G", "D"}, cells[1])
    for cells in TABLES["Subset-level keys accepted at every level (G, D, S)"]:
        out[cells[0].strip("`")] = ({"G", "D", "S"}, cells[1])
    if db:
        for cells in TABLES["DreamBooth-style keys"]:
            out[cells[0].strip("`")] = (set(cells[1].replace(" ", "").split(",")), cells[2])
    if ft:
        for cells in TABLES["Fine-tuning-style keys"]:
            key = cells[0].strip("`")
            levels = set(cells[1].replace(" ", "").split(","))
            out[key] = (out[key][0] | levels if key in out else levels, cells[2])
    return out


def _type_ok(type_text: str, value: Any) -> bool:
    if type_text.startswith("int, or"):
        return TYPE_OK["int"](value) or (isinstance(value, list) and len(value) == 2)
    if type_text.startswith("float or int"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    return TYPE_OK.get(type_text, lambda v: True)(value)


def check_dataset(script: str, data: dict[str, Any]) -> None:
    flags = {"fine_tune.py": (False, True), "train_db.py": (True, False)}.get(script, (True, True))
    schema = _schema(*flags)
    assert set(data) <= {"general", "datasets"}
    levels = [("G", data.get("general", {}))]
    for ds in data["datasets"]:
        levels.append(("D", {k: v for k, v in ds.items() if k != "subsets"}))
        levels += [("S", sub) for sub in ds["subsets"]]
        subs = ds["subsets"]
        if script == "fine_tune.py":
            assert all("metadata_file" in s for s in subs), "fine-tuning subsets need metadata_file"
        else:
            assert all("image_dir" in s for s in subs), "DreamBooth subsets need image_dir"
    for level, table in levels:
        for key, value in table.items():
            assert key in schema, f"{key}: extra keys not allowed ({script})"
            where, typ = schema[key]
            assert level in where, f"{key} not accepted at level {level}"
            assert _type_ok(typ, value), f"{key}: expected {typ}, got {value!r}"


# --- the cases: every supported script, and the options that change keys -------------------------

CASES: list[tuple[str, str, dict[str, Any], bool]] = [
    ("sd15_lora", "sd15", {"grad_ckpt": True, "cache_latents": True}, False),
    ("sd15_lora_conv_adafactor", "sd15", {"lora_targets": "conv", "optimizer": "adafactor"}, False),
    ("sd15_finetune", "sd15", {"method": "full", "full_bf16": True, "grad_ckpt": True}, False),
    ("sd15_dreambooth", "sd15", {"method": "full", "optimizer": "adamw8bit", "precision": "fp16"}, True),
    ("sd21_lora", "sd21", {"attn": "xformers", "train_text_encoder": True}, False),
    (
        "sdxl_lora",
        "sdxl",
        {
            "grad_ckpt": True,
            "cache_latents": True,
            "cache_text_encoder_outputs": True,
            "optimizer": "adamw8bit",
        },
        False,
    ),
    (
        "sdxl_finetune",
        "sdxl",
        {
            "method": "full",
            "optimizer": "adafactor",
            "full_bf16": True,
            "grad_ckpt": True,
            "cache_latents": True,
        },
        False,
    ),
    ("sd35_medium_lora", "sd35-medium", {"cache_text_encoder_outputs": True, "grad_ckpt": True}, False),
    (
        "sd35_large_finetune",
        "sd35-large",
        {"method": "full", "optimizer": "adafactor", "full_bf16": True},
        False,
    ),
    (
        "flux_dev_lora",
        "flux.1-dev",
        {"fp8_base": True, "grad_ckpt": True, "cache_text_encoder_outputs": True},
        False,
    ),
    (
        "flux_schnell_finetune",
        "flux.1-schnell",
        {"method": "full", "full_bf16": True, "optimizer": "adafactor"},
        False,
    ),
    ("sdxl_lora_mps", "sdxl", {"backend": "mps", "attn": "xformers", "optimizer": "lion"}, False),
]


def emit(model: str, kw: dict[str, Any], dreambooth: bool) -> tuple[str, dict[str, str], DiffusionSetup]:
    spec = spec_from_preset(model)
    setup = DiffusionSetup(**kw)
    if setup.attn == "xformers" and setup.backend == "mps":
        setup = setup.model_copy(update={"attn": "sdpa"})  # the engine refuses xformers on MPS
    est = estimate_diffusion(spec, setup)
    return script_for(spec, setup, dreambooth), emit_kohya(spec, setup, est, None, dreambooth), setup


def flatten(doc: dict[str, Any]) -> dict[str, Any]:
    """``read_config_from_file``: tables are ignored, keys merged."""
    out: dict[str, Any] = {}
    for k, v in doc.items():
        if isinstance(v, dict):
            out.update(v)
        else:
            out[k] = v
    return out


def test_every_script_is_covered() -> None:
    scripts = {emit(m, kw, db)[0] for _, m, kw, db in CASES}
    assert set(SCRIPTS.values()) | {"train_db.py"} <= scripts


@pytest.mark.parametrize(("case", "model", "kw", "db"), CASES, ids=[c[0] for c in CASES])
def test_config_keys_and_types(case: str, model: str, kw: dict[str, Any], db: bool) -> None:
    script, files, setup = emit(model, kw, db)
    cfg = tomllib.loads(files[CONFIG])
    data = tomllib.loads(files[DATASET])
    flat = flatten(cfg)
    check_config(script, flat)
    check_dataset(script, data)
    check_train_time_rules(script, flat, data, setup.backend)
    assert (
        f"accelerate launch --num_cpu_threads_per_process 1 {script} --config_file {CONFIG}" in files[CONFIG]
    )
    # the plan's choices are in the file
    assert flat["train_batch_size"] == setup.batch_size == data["datasets"][0]["batch_size"]
    assert flat["gradient_accumulation_steps"] == setup.grad_accum
    assert flat["gradient_checkpointing"] is setup.grad_ckpt
    assert flat["mixed_precision"] == {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[setup.precision]
    res = setup.resolution or spec_from_preset(model).native_resolution
    assert flat["resolution"] == f"{res},{res}" and data["datasets"][0]["resolution"] == res
    assert flat.get("fp8_base", False) is setup.fp8_base
    assert flat.get("cache_latents", False) is setup.cache_latents
    if setup.method == "lora":
        assert flat["network_dim"] == setup.lora_rank and flat["network_alpha"] == setup.alpha
        assert flat["network_module"].startswith("networks.lora")
    else:
        assert "network_module" not in flat


@pytest.mark.parametrize(("case", "model", "kw", "db"), CASES, ids=[c[0] for c in CASES])
def test_golden_files(case: str, model: str, kw: dict[str, Any], db: bool) -> None:
    _, files, _ = emit(model, kw, db)
    folder = GOLDEN / case
    if os.environ.get("FITCHECK_UPDATE_GOLDEN"):
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text, encoding="utf-8")
    for name, text in files.items():
        golden = (folder / name).read_text(encoding="utf-8")
        tomllib.loads(golden)
        assert text == golden, f"{case}/{name} changed; regenerate with FITCHECK_UPDATE_GOLDEN=1"


def test_attention_flags() -> None:
    _, files, _ = emit("sdxl", {"attn": "xformers"}, False)
    assert flatten(tomllib.loads(files[CONFIG])).get("xformers") is True
    _, files, _ = emit("sdxl", {"backend": "mps", "attn": "xformers"}, False)
    flat = flatten(tomllib.loads(files[CONFIG]))
    assert "xformers" not in flat and flat["sdpa"] is True


def test_toml_arrays_hold_one_type() -> None:
    with pytest.raises(ValueError, match="one type"):
        to_toml({"t": {"text_encoder_lr": [1e-5, 0]}})
    assert re.search(r"^x = 8.0$", to_toml({"t": {"x": 8.0}}), re.M)
