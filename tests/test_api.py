"""The library API (`fitcheck.api`) and the seams the CLI meets through it (issue 9)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fitcheck import api
from fitcheck.cli import main
from fitcheck.errors import InputError, OptionError
from fitcheck.models import DiffusionSetup, Estimate, LlmSetup

SRC = Path(__file__).resolve().parents[1] / "src" / "fitcheck"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


def test_estimate_example_of_the_docs() -> None:
    e = api.estimate("llama-3.1-8b", method="lora", seq_len=4096, grad_ckpt=True, on="rtx-4090")
    assert isinstance(e, Estimate) and isinstance(e.setup, LlmSetup)
    assert e.setup.seq_len == 4096 and e.setup.grad_ckpt
    assert e.target is not None and e.target.verdict in ("fits", "tight", "does_not_fit")
    assert e.peak_allocated_bytes == max(p.total_bytes for p in e.phases)


def test_no_target_means_no_verdict() -> None:
    assert api.estimate("7B").target is None
    assert api.estimate("7B", on="none").target is None


def test_a_misspelt_option_is_an_error_not_ignored() -> None:
    with pytest.raises(OptionError, match="seqlen"):
        api.estimate("7B", seqlen=4096)  # type: ignore[call-arg]
    with pytest.raises(InputError, match="--batch-size"):
        api.estimate("7B", batch_size=0)


def test_setup_is_a_union_on_kind_and_echoes_only_what_applies() -> None:
    llm = api.estimate("7B").model_dump(mode="json")["setup"]
    diff = api.estimate("sd15").model_dump(mode="json")["setup"]
    assert llm["kind"] == "llm" and "resolution" not in llm and "cache_latents" not in llm
    assert diff["kind"] == "diffusion" and "seq_len" not in diff and "double_quant" not in diff
    # gpus applies to both kinds since issue 14 (kohya runs data-parallel through accelerate)
    assert diff["trainer"] == "kohya" and diff["gpus"] == 1 and "quant_storage" not in diff
    # the JSON reads back into the right model
    doc = api.estimate("sd15").model_dump(mode="json")
    assert isinstance(Estimate.model_validate(doc).setup, DiffusionSetup)
    assert doc["schema_version"] == 2


def test_resolved_model_and_target_can_be_passed_back() -> None:
    spec, target = api.resolve("qwen2.5-0.5b"), api.target("24GB")
    assert target is not None
    a = api.check(spec, target, method="qlora")
    b = api.check("qwen2.5-0.5b", "24GB", method="qlora")
    assert a == b


def test_models_and_hardware() -> None:
    rows = api.models()
    kinds = {r.kind for r in rows}
    assert kinds == {"llm", "diffusion"} and any(r.id == "sdxl" for r in rows)
    assert any(d.id == "rtx-4090" for d in api.hardware().devices)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["estimate", "7B", "--trainer", "kohya", "--on", "none"], "--trainer kohya trains diffusion"),
        (["check", "7B", "--trainer", "kohya", "--on", "24GB"], "--trainer kohya trains diffusion"),
        (["estimate", "7B", "--resolution", "512", "--on", "none"], "--resolution applies to diffusion"),
        (["estimate", "sd15", "--seq-len", "512", "--on", "none"], "--seq-len applies to LLMs"),
        (["estimate", "sd15", "--dora", "--on", "none"], "--dora applies to LLMs"),
        (["estimate", "sd15", "--master-weights", "--on", "none"], "--master-weights applies to LLMs"),
        (["check", "sd15", "--no-double-quant", "--on", "24GB"], "--double-quant applies to LLMs"),
        (["estimate", "sd15", "--trainer", "hf", "--on", "none"], "use --trainer kohya"),
        (["plan", "sd15", "--gpus", "2", "--on", "24GB"], "diffusion plans are for one GPU"),
        (["plan", "sd15", "--trainer", "hf", "--on", "24GB"], "use --trainer kohya"),
        (["plan", "sd15", "--seq-len", "512", "--on", "24GB"], "--seq-len applies to LLMs"),
        (["plan", "sd15", "--no-double-quant", "--on", "24GB"], "--double-quant applies to LLMs"),
        (["plan", "sd15", "--lora-targets", "q_proj", "--on", "24GB"], "--lora-targets for diffusion"),
        (["plan", "7B", "--trainer", "kohya", "--on", "24GB"], "--trainer kohya trains diffusion"),
        (["check", "7B", "--on", "none"], "name the training GPU"),
    ],
)
def test_a_flag_that_does_not_apply_is_one_error_line(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    rc, out, err = run(capsys, *args)
    assert rc == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("fitcheck: error: ")
    assert needle in err, err


def test_diffusion_plan_keeps_the_effective_batch_asked() -> None:
    """`plan sdxl --effective-batch 16` planned an effective batch of 1 (a sentinel comparison)."""
    p = api.plan("sd15", "rtx-4090", effective_batch=16)
    assert p.fits and p.chosen is not None and p.kind == "diffusion"
    assert p.chosen.setup.batch_size * p.chosen.setup.grad_accum >= 16 == p.chosen.effective_batch


def test_diffusion_plan_honours_lora_targets() -> None:
    p = api.plan("sd15", "rtx-4090", lora_targets="conv")
    assert p.chosen is not None and p.chosen.setup.lora_targets == "conv"


def test_on_none_answers_without_a_verdict(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "estimate", "7B", "--on", "none", "--format", "json")
    assert rc == 0 and json.loads(out)["target"] is None
    rc, out, _ = run(capsys, "matrix", "--on", "none", "--models", "1.5B,7B", "--format", "json")
    rows = json.loads(out)
    assert rc == 0 and rows[0]["lora_verdict"] is None and rows[0]["budget_bytes"] is None
    assert rows[1]["lora_bytes"] > rows[0]["lora_bytes"]
    rc, out, _ = run(capsys, "plan", "qwen2.5-0.5b", "--on", "none", "--format", "json")
    doc = json.loads(out)
    assert rc == 0 and doc["fits"] and doc["target"]["id"] == "none"
    assert doc["min_device_bytes"] <= doc["chosen"]["device_bytes"]


def test_plan_on_none_still_checks_the_request(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(capsys, "plan", "qwen2.5-0.5b", "--on", "none", "--trainer", "mlx")
    assert rc == 2 and "not on NVIDIA" in err  # no memory limit, but the assumed device is a CUDA GPU


def test_matrix_probes_the_machine_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fitcheck.hardware import budget

    real = budget.resolve_target
    calls: list[str] = []

    def counting(spec: str, headroom: str | None = None, probe_env: object = None) -> object:
        calls.append(spec)
        return real("24GB", headroom)

    monkeypatch.setattr(budget, "resolve_target", counting)
    rc, _, _ = run(capsys, "matrix", "--on", "auto", "--models", "0.5B,1.5B,3B", "--format", "json")
    assert rc == 0 and calls == ["auto"]


def test_commands_call_the_api_not_cli_internals() -> None:
    for path in sorted((SRC / "commands").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"\bc\._[a-z]", text), f"{path.name} uses a private name of cli"
        assert not re.search(r"from fitcheck\.cli import _", text), path.name
        for core in ("plan_diffusion(", "estimate_diffusion(", "engine.estimate import", "resolve_model("):
            assert core not in text, f"{path.name} calls {core} instead of fitcheck.api"
        assert "make_plan(" not in text and "resolve_target(" not in text, path.name


def test_the_example_in_docs_api_md_runs(capsys: pytest.CaptureFixture[str]) -> None:
    text = (SRC.parents[1] / "docs" / "api.md").read_text()
    code = re.search(r"```python\n(.*?)```", text, re.S)
    assert code is not None
    exec(compile(code.group(1), "docs/api.md", "exec"), {})  # our own documentation
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[0] in ("forward", "backward", "optimizer_step")
    assert [line.split()[0] for line in out[1:4]] == ["full", "lora", "qlora"]
    assert out[4].startswith("diffusion ") and out[5].startswith("True ")


def test_layering_render_and_hardware_import_nothing_from_engine() -> None:
    """Shared facts live in fitcheck.facts; render and hardware read them, never the engine; diffusion
    estimates without measure/ (all torch lives there)."""
    for path in [SRC / "render.py", *sorted((SRC / "hardware").glob("*.py"))]:
        text = path.read_text()
        assert "fitcheck.engine" not in text, f"{path.name} imports from fitcheck.engine"
    for path in sorted((SRC / "diffusion").rglob("*.py")):
        text = path.read_text()
        assert "fitcheck.measure" not in text and "import torch" not in text, f"diffusion/{path.name}"
    for path in sorted((SRC / "facts").glob("*.py")):
        text = path.read_text()
        for layer in ("engine", "diffusion", "planner", "hardware", "render", "api"):
            assert f"fitcheck.{layer}" not in text, f"facts/{path.name} imports fitcheck.{layer}"


def test_component_registry_and_docs_json_agree() -> None:
    """One registry of component ids (id, rule's docs anchor) used by both estimators and docs/json.md."""
    from fitcheck.components import REGISTRY

    text = (SRC.parents[1] / "docs" / "json.md").read_text()
    table = text.split("| id | counts |", 1)[1].split("\n\n", 1)[0]
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", table, re.M))
    assert documented == set(REGISTRY)
    for row in REGISTRY.values():
        assert row.llm or row.diffusion or row.multi, row.id
        docs = (("methodology.md", row.llm), ("diffusion.md", row.diffusion), ("distributed.md", row.multi))
        for doc, anchor in docs:
            if anchor:
                page = (SRC.parents[1] / "docs" / doc).read_text()
                heads = re.findall(r"^#+ (.*)$", page, re.M)
                slugs = {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in heads}
                slugs |= set(re.findall(r'<a id="([^"]+)">', page))
                missing = [] if anchor in slugs else [f"{row.id}: {doc}#{anchor}"]
                assert not missing, f"{missing} is not a heading or anchor"


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("llama-3.1-8b", {"method": "qlora", "grad_ckpt": True}),
        ("mixtral-8x7b", {"method": "lora"}),
        ("gemma-2-9b", {"method": "full", "master_weights": True}),
        ("sd15", {"method": "full", "optimizer": "adafactor"}),
        ("sdxl", {"train_text_encoder": True}),
        ("llama-3.1-8b", {"method": "qlora", "gpus": 4, "strategy": "zero3"}),
        ("llama-3.1-8b", {"method": "full", "gpus": 8, "strategy": "fsdp", "offload": "all"}),
        ("llama-3.1-8b", {"method": "lora", "gpus": 2}),
        ("sdxl", {"gpus": 2}),
    ],
)
def test_every_component_an_estimator_names_is_registered(model: str, options: dict) -> None:
    from fitcheck.components import REGISTRY

    est = api.estimate(model, **options)
    kind = est.setup.kind
    for ph in (*est.phases, *est.host_phases):
        for c in ph.components:
            assert c.source == REGISTRY[c.name].source(kind)


def test_kohya_implements_the_emitter_protocol() -> None:
    """One protocol, emit(plan, ctx) -> {filename: text}: kohya writes its config and dataset files."""
    from fitcheck import emitters
    from fitcheck.emitters.common import EmitContext
    from fitcheck.emitters.kohya import emit_kohya

    spec = api.resolve("sd15")
    p = api.plan(spec, "rtx-4090")
    ctx = EmitContext(spec=spec, model_ref=None, command="fitcheck plan sd15", filename="sd15.kohya.toml")
    em = emitters.get("kohya.toml")
    assert (em.NAME, em.TRAINER) == ("kohya.toml", "kohya")
    files = em.emit(p, ctx)
    assert list(files) == ["sd15.kohya.toml", "sd15.dataset.toml"]
    assert p.chosen is not None and isinstance(p.chosen.setup, DiffusionSetup) and p.estimate is not None
    assert files == emit_kohya(spec, p.chosen.setup, p.estimate, p.target, names=tuple(files))
    with pytest.raises(OptionError, match="diffusion"):
        em.check(p, EmitContext(spec=api.resolve("7B"), model_ref=None, command="x"))


def test_diffusion_plan_json_carries_schema_version_2(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(capsys, "plan", "sd15", "--on", "rtx-4090", "--format", "json")
    assert rc == 0 and json.loads(out)["schema_version"] == 2


def test_units_are_defined_only_in_units_py() -> None:
    pattern = re.compile(r"^(GIB|MIB|KIB|GB)\s*=|1 << (10|20|30)\b|2\s*\*\*\s*(20|30)\b", re.M)
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "units.py":
            continue
        text = "\n".join(line for line in path.read_text().splitlines() if "le=1 << 20" not in line)
        assert not pattern.search(text), f"{path.relative_to(SRC)} defines a unit; import it from units.py"


def test_llamafactory_runs_default_to_its_own_lora_target_rule() -> None:
    """Without --lora-targets, a LLaMA-Factory run gets LLaMA-Factory's `lora_target: all` (its default),
    other trainers peft's all-linear; a target the user gives is kept."""
    spec = api.resolve("qwen3-30b-a3b")
    lmf = api.setup_for(spec, {"method": "qlora", "trainer": "llamafactory"})
    assert isinstance(lmf, LlmSetup) and lmf.lora_targets == "llamafactory-all"
    hf = api.setup_for(spec, {"method": "qlora", "trainer": "hf"})
    assert isinstance(hf, LlmSetup) and hf.lora_targets == "all-linear"
    opts = {"method": "lora", "trainer": "llamafactory", "lora_targets": "q_proj,v_proj"}
    given = api.setup_for(spec, opts)
    assert isinstance(given, LlmSetup) and given.lora_targets == "q_proj,v_proj"
