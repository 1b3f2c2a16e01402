"""Hostile inputs, third red-team pass (session 7): one test per class of failure found, each failing before
its fix.

- a diffusers pipeline fetched into the Hugging Face cache did not resolve offline: the client was asked
  for ``config.json`` first, which a pipeline has none of at its root, and offline that reads as "not in
  the cache" (`fitcheck.sources.hub._cached_pipeline`);
- a trainer-config section given as no mapping (DeepSpeed ``zero_optimization: "3"``,
  ``offload_optimizer: "cpu"``, accelerate ``fsdp_config: yes``) was dropped without a word: the run was
  sized without ZeRO, offload or FSDP settings and the stderr lines did not say so
  (`fitcheck.readers.base.Keys.sub` leaves it unread, so the ``not understood`` line names it);
- the library took a bool for a number: ``estimate("7B", seq_len=True)`` sized a one-token sequence
  (pydantic's lax mode; `fitcheck.api.refuse_bool_numbers`);
- an integer of over 4,300 digits in a config (JSON, YAML, TOML, config.json) was reported with Python's
  own advice to call ``sys.set_int_max_str_digits()`` (`fitcheck.fileio.parser_error`), and a malformed
  ``--from`` JSON named its path twice ("--from X: not valid JSON: X is not valid JSON").
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fitcheck.api as api
from fitcheck.diffusion.bounds import BOUNDS
from fitcheck.errors import InputError
from fitcheck.readers.base import Keys
from test_fuzz_cli import hold_contract, invoke
from test_hub import FakeHub, _env, hub, run_cli  # noqa: F401  (hub: the fixture)

# --- a cached diffusers pipeline, offline ---------------------------------------------------------------


def test_a_cached_diffusers_pipeline_resolves_offline(hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    from test_diffusion_sources import write_folder

    folder = write_folder(tmp_path / "snap", "sd15")
    hub.repos["acme/tiny-sd"] = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*.json")}
    args = ["estimate", "acme/tiny-sd", "--on", "none", "--format", "json"]
    online = run_cli(args, _env(hub, tmp_path / "hf"))
    assert online.returncode == 0, online.stderr
    offline = run_cli(args, {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert offline.returncode == 0, offline.stderr
    assert json.loads(offline.stdout)["device_bytes"] == json.loads(online.stdout)["device_bytes"]


def test_a_pipeline_component_missing_offline_names_its_file(hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    from test_diffusion_sources import write_folder

    folder = write_folder(tmp_path / "snap", "sd15")
    hub.repos["acme/tiny-sd"] = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*.json")}
    assert run_cli(["estimate", "acme/tiny-sd", "--on", "none"], _env(hub, tmp_path / "hf")).returncode == 0
    unet = next((tmp_path / "hf").rglob("unet/config.json"))
    unet.unlink()  # the snapshot's link: the component is no longer cached
    proc = run_cli(
        ["estimate", "acme/tiny-sd", "--on", "none"], {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "hf download acme/tiny-sd unet/config.json" in lines[0]


# --- a section that is no mapping -----------------------------------------------------------------------

DS = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}}
ACC = {"compute_environment": "LOCAL_MACHINE", "num_processes": 2}


@pytest.mark.parametrize(
    ("name", "doc", "key"),
    [
        ("ds.json", {**DS, "zero_optimization": "3"}, "zero_optimization"),
        ("ds.json", {**DS, "zero_optimization": [3]}, "zero_optimization"),
        ("ds.json", {**DS, "zero_optimization": {"stage": 3, "offload_optimizer": "cpu"}},
         "zero_optimization.offload_optimizer"),
        ("ds.json", {**DS, "bf16": "true"}, "bf16"),
        ("accelerate.yaml", {**ACC, "distributed_type": "FSDP", "fsdp_config": "yes"}, "fsdp_config"),
        ("accelerate.yaml", {**ACC, "distributed_type": "DEEPSPEED", "deepspeed_config": "z3.json"},
         "deepspeed_config"),
    ],
)  # fmt: skip
def test_a_section_that_is_no_mapping_is_named_as_not_understood(
    name: str, doc: dict[str, object], key: str, tmp_path: Path
) -> None:
    path = tmp_path / name
    path.write_text(json.dumps(doc), encoding="utf-8")  # JSON is YAML too
    args = ["estimate", "7B", "--from", str(path), "--on", "none", "--gpus", "2"]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 0, err
    line = next(line for line in err.splitlines() if "not understood" in line)
    assert key in line.split(": ")[-1].split(", "), line


def test_keys_leaves_a_non_mapping_section_unread() -> None:
    k = Keys({"a": "x", "b": None, "c": {"d": 1}, "e": []})
    assert k.sub("a") is None and k.sub("b") is None and k.sub("e") is None
    child = k.sub("c")
    assert child is not None and child.get("d") == 1
    assert k.unused() == ["a"]


# --- a bool for a number in the library -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "flag"),
    [
        (lambda: api.estimate("7B", seq_len=True), "--seq-len"),
        (lambda: api.estimate("7B", batch_size=True), "--batch-size"),
        (lambda: api.estimate("7B", lora_alpha=False), "--lora-alpha"),
        (lambda: api.estimate("7B", lora_rank=True), "--lora-rank"),
        (lambda: api.estimate("7B", method=True), "--method"),
        (lambda: api.plan("7B", "rtx-4090", epochs=True), "--epochs"),
        (lambda: api.plan("7B", "rtx-4090", effective_batch=True), "--effective-batch"),
    ],
)  # fmt: skip
def test_a_bool_for_a_number_is_refused(call: object, flag: str) -> None:
    with pytest.raises(InputError, match=f"^{flag}: .*not a bool"):
        call()  # type: ignore[operator]


def test_a_bool_for_a_flag_still_passes() -> None:
    with_dora = api.estimate("7B", dora=True, grad_ckpt=False, double_quant=False)
    assert with_dora.device_bytes > api.estimate("7B").device_bytes


# --- parser messages ------------------------------------------------------------------------------------

DIGITS = "9" * 5000


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("ds.json", f'{{"train_micro_batch_size_per_gpu": {DIGITS}}}'),
        ("run.yaml", f"base_model: x\nsequence_len: {DIGITS}\n"),
        ("run.toml", f"network_dim = {DIGITS}\n"),
        ("model/config.json", f'{{"model_type": "llama", "hidden_size": {DIGITS}}}'),
    ],
)
def test_an_endless_integer_is_one_plain_line(name: str, text: str, tmp_path: Path) -> None:
    path = tmp_path / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    args = (
        ["estimate", str(path.parent)]
        if name.startswith("model/")
        else ["estimate", "7B", "--from", str(path)]
    )
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and "over 4,300 digits" in err and "set_int_max_str_digits" not in err, err


def test_malformed_from_json_names_its_path_once(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text('{"zero_optimization": ', encoding="utf-8")
    rc, _, err = invoke(["estimate", "7B", "--from", str(path)])
    assert rc == 2 and err.count(str(path)) == 1 and "not valid JSON" in err, err


# --- the plan's default effective batch on a world it does not divide -----------------------------------


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--on", "3xrtx-4090"], 18),
        (["--on", "8xh100-80gb", "--nodes", "4"], 32),
        (["--on", "rtx-4090", "--gpus", "24"], 24),
        (["--on", "2xrtx-4090"], 16),
    ],
)
def test_the_default_effective_batch_divides_over_every_rank(argv: list[str], expected: int) -> None:
    args = ["plan", "qwen2.5-0.5b", *argv, "--format", "json"]
    rc, out, err = invoke(args)
    hold_contract("plan", args, rc, out, err)
    assert rc == 0, err
    assert json.loads(out)["chosen"]["effective_batch"] == expected


def test_an_effective_batch_the_user_gives_is_still_held_to_the_ranks() -> None:
    rc, _, err = invoke(["plan", "qwen2.5-0.5b", "--on", "3xrtx-4090", "--effective-batch", "16"])
    assert rc == 2 and "--effective-batch 16 is not a multiple of the 3 GPUs; use 15" in err, err


# --- matrix with a diffusion model under the default methods --------------------------------------------


def test_matrix_names_the_methods_a_diffusion_model_cannot_take() -> None:
    args = ["matrix", "--on", "rtx-4090", "--models", "7B,sdxl"]
    rc, out, err = invoke(args)
    hold_contract("matrix", args, rc, out, err)
    assert rc == 2 and "--methods qlora: sdxl is a diffusion model" in err, err
    rc, out, err = invoke([*args, "--methods", "full,lora", "--format", "json"])
    assert rc == 0 and [row["model"] for row in json.loads(out)] == ["7B", "sdxl"], err


# --- a diffusers component config with sizes no model has -----------------------------------------------


def _pipeline(root: Path, model: str, component: str, key: str, value: object) -> str:
    from test_diffusion_sources import write_folder

    folder = write_folder(root, model)
    path = folder / component / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**config, key: value}), encoding="utf-8")
    return str(folder)


@pytest.mark.parametrize(
    ("model", "component", "key", "value", "word"),
    [
        ("sd15", "unet", "layers_per_block", "2", "layers_per_block"),  # int('2') in range(): TypeError
        ("sd15", "unet", "layers_per_block", 1_000_000, "layers_per_block"),  # a million blocks: ran for ever
        ("sd15", "unet", "block_out_channels", [], "block_out_channels"),  # IndexError
        ("sd15", "unet", "attention_head_dim", 0, "attention_head_dim"),  # ZeroDivisionError
        ("sd15", "unet", "attention_head_dim", 7, "does not split"),  # AssertionError in the reshape
        ("sd15", "unet", "norm_num_groups", 7, "does not split"),
        ("sd15", "vae", "block_out_channels", [0], "block_out_channels"),  # ZeroDivisionError
        ("sd15", "text_encoder", "hidden_size", -768, "hidden_size"),  # pydantic error on negative params
        ("sd15", "text_encoder", "hidden_size", "x", "hidden_size"),  # int('x')
        ("sd15", "text_encoder", "num_hidden_layers", 1_000_000, "num_hidden_layers"),  # ran for ever
        ("flux.1-schnell", "transformer", "num_attention_heads", "x", "num_attention_heads"),  # int('x')
        ("flux.1-schnell", "transformer", "num_layers", -1, "num_layers"),
        ("sdxl", "unet", "down_block_types", ["CrossAttnDownBlock2D"] * 10, "is not a UNet2DConditionModel"),
    ],
)  # fmt: skip
def test_a_diffusers_component_out_of_shape_is_one_clear_line(
    model: str, component: str, key: str, value: object, word: str, tmp_path: Path
) -> None:
    args = ["estimate", _pipeline(tmp_path / "pipe", model, component, key, value), "--on", "none"]
    rc, out, err = invoke(args)
    hold_contract("estimate", args, rc, out, err)
    assert rc == 2 and f"component {component}: " in err and word in err, err


def test_every_diffusion_preset_is_within_the_component_bounds() -> None:
    from fitcheck.diffusion.bounds import check_component, check_shapes
    from fitcheck.diffusion.sources import diffusion_ids, spec_from_preset

    for pid in diffusion_ids():
        for part in spec_from_preset(pid).parts:
            check_component(part.name, part.config)
            check_shapes(part.name, part.class_name, part.config)


SIZES = (
    st.integers(-(10**12), 10**12)
    | st.sampled_from([0, 1, 7, 10**6, 2**63])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=4)
    | st.none()
    | st.booleans()
    | st.lists(st.integers(-4, 10**7) | st.text(max_size=2), max_size=5)
)


@settings(max_examples=int(os.environ.get("FITCHECK_FUZZ_EXAMPLES", "40")), deadline=None,
          suppress_health_check=list(HealthCheck), derandomize=os.environ.get("CI") is not None)  # fmt: skip
@given(
    model=st.sampled_from(["sd15", "sdxl", "flux.1-schnell"]),
    edits=st.lists(st.tuples(st.sampled_from(sorted(BOUNDS)), SIZES), min_size=1, max_size=3),
    data=st.data(),
)
def test_fuzz_diffusers_component_configs(
    model: str, edits: list[tuple[str, object]], data: st.DataObject
) -> None:
    """Any size field of any component set to anything: an answer or one error line, in bounded time."""
    from test_diffusion_sources import write_folder

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_folder(Path(tmp) / "pipe", model)
        component = data.draw(st.sampled_from(sorted(p.parent.name for p in folder.glob("*/config.json"))))
        path = folder / component / "config.json"
        config = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**config, **dict(edits)}), encoding="utf-8")
        args = ["estimate", str(folder), "--on", "none"]
        started = time.monotonic()
        rc, out, err = invoke(args)
        hold_contract("estimate", args, rc, out, err)
        assert time.monotonic() - started < 60, (component, edits)


def test_the_headroom_percentage_message_states_the_rule_it_checks() -> None:
    rc, _, err = invoke(["check", "7B", "--on", "rtx-4090", "--headroom", "100%"])
    assert rc == 2 and "from 0% to under 100%" in err, err
    rc, _, err = invoke(["check", "7B", "--on", "rtx-4090", "--headroom", "99.5%"])  # under 100: taken
    assert rc in (0, 1), err


@pytest.mark.parametrize("command", ["estimate", "check", "plan", "matrix"])
@pytest.mark.parametrize("chart", ["", "  "])
def test_an_empty_chart_name_is_refused_not_ignored(command: str, chart: str) -> None:
    args = [command, *([] if command == "matrix" else ["qwen2.5-0.5b"]), "--on", "rtx-4090", "--chart", chart]
    rc, out, err = invoke(args)
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and "--chart is empty" in err, err


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_an_empty_from_is_named_as_empty(command: str) -> None:
    args = [command, "7B", "--from", "", "--on", "rtx-4090"]
    rc, out, err = invoke(args)
    hold_contract(command, args, rc, out, err)
    assert rc == 2 and "--from is empty" in err, err  # it said "--from . is a folder"
