"""``fitcheck plan`` takes the setup options of ``estimate`` that the api's plan takes, and keeps them fixed:
--loss, --offload-activations, --optimizer-in-backward, --optimizer-impl (docs/cli.md)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from fitcheck import api
from fitcheck.cli import main


def _plan(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    rc = main(["plan", *args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


def test_loss_and_offloaded_activations_stay_as_asked(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["qwen2.5-0.5b", "--on", "24GB", "--trainer", "torchtune"]
    rc, doc = _plan([*base, "--loss", "chunked", "--offload-activations"], capsys)
    assert rc == 0
    setup = doc["chosen"]["setup"]
    assert (setup["loss"], setup["offload_activations"]) == ("chunked", True)
    _, plain = _plan(base, capsys)
    assert (plain["chosen"]["setup"]["loss"], plain["chosen"]["setup"]["offload_activations"]) == (
        None,
        False,
    )


def test_optimizer_impl_fixes_adamw_and_its_step(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _plan(
        ["qwen2.5-0.5b", "--on", "24GB", "--trainer", "hf", "--optimizer-impl", "foreach"], capsys
    )
    assert rc == 0
    setup = doc["chosen"]["setup"]
    assert (setup["optimizer"], setup["optimizer_impl"]) == ("adamw", "foreach")
    assert "foreach AdamW step" in doc["estimate"]["regime"]["description"]
    plan = api.plan("qwen2.5-0.5b", "24GB", trainer="hf", optimizer_impl="fused")
    assert plan.chosen is not None and plan.chosen.setup.optimizer_impl == "fused"


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--optimizer", "adamw8bit"], "--optimizer-impl: picks torch AdamW's step"),
        (["--trainer", "generic"], "--optimizer-impl: generic does not train with torch.optim.AdamW"),
    ],
)
def test_optimizer_impl_refusals_are_one_line(
    extra: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["plan", "qwen2.5-0.5b", "--on", "24GB", "--optimizer-impl", "fused", *extra])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"fitcheck: error: {says}") and len(err.splitlines()) == 1


#: torchtune's published 4090 run (tests/data/published/torchtune.yaml) on a 32 GB card: on the 4090 itself
#: the band's upper edge less the paged states is 0.01 GiB over the budget since the fixed +2 GiB term
#: (session 5), so the planner, which plans on high_bytes, no longer picks it there; same paging logic.
TORCHTUNE_PAGED = [
    "llama-3.1-8b",
    "--on",
    "rtx-5090",
    "--trainer",
    "torchtune",
    "--optimizer",
    "paged-adamw8bit",
]


def test_optimizer_in_backward_plans_full_without_accumulation(capsys: pytest.CaptureFixture[str]) -> None:
    # the paged states page to the host
    rc, doc = _plan([*TORCHTUNE_PAGED, "--optimizer-in-backward", "--effective-batch", "1"], capsys)
    assert rc == 0 and doc["chosen"]["verdict"] == "fits"
    setup = doc["chosen"]["setup"]
    assert setup["optimizer_in_bwd"] is True and setup["method"] == "full"
    assert (setup["batch_size"], setup["grad_accum"]) == (1, 1)
    assert doc["chosen"]["device_bytes"] > doc["target"]["usable_bytes"]  # paged bytes counted, then paged
    assert doc["chosen"]["paged_bytes"] > doc["chosen"]["device_bytes"] - doc["target"]["usable_bytes"]
    objective = next(r["text"] for r in doc["reasons"] if r["choice"] == "objective")
    assert "paged optimizer states on the host" in objective


def test_optimizer_in_backward_offers_one_example_per_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _plan([*TORCHTUNE_PAGED, "--optimizer-in-backward"], capsys)  # effective batch 16: no fit
    assert rc == 1
    flags = [c["flag"] for c in doc["changes"]]
    assert flags[0] == "--effective-batch 1" and not any(f.startswith("--method") for f in flags)


def test_the_reproduce_line_keeps_the_options(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["plan", "qwen2.5-0.5b", "--on", "24GB", "--trainer", "hf", "--loss", "trl"]
    args += ["--offload-activations", "--optimizer-impl", "fused", "--emit", "-", "--emit-format", "hf.yaml"]
    assert main(args) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("# reproduce: fitcheck plan"))
    for flag in ("--loss trl", "--offload-activations", "--optimizer-impl fused"):
        assert flag in line, flag


def test_every_llm_trainer_has_a_row_in_each_planner_table() -> None:
    """A trainer estimate accepts is one plan can search: backends, optimizers and kernels per trainer."""
    from typing import get_args

    from fitcheck.planner.kernels import TRAINER_KERNELS
    from fitcheck.planner.rules import TRAINER_BACKENDS, TRAINER_OPT
    from fitcheck.vocab import LlmTrainer

    for trainer in get_args(LlmTrainer):
        assert trainer in TRAINER_BACKENDS and trainer in TRAINER_OPT and trainer in TRAINER_KERNELS, trainer


@pytest.mark.parametrize("trainer", ["litgpt", "unsloth"])
def test_plan_for_litgpt_and_unsloth(trainer: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _plan(["llama-3.1-8b", "--on", "rtx-4090", "--trainer", trainer, "--method", "qlora"], capsys)
    assert rc == 0 and doc["chosen"]["setup"]["trainer"] == trainer
    assert main(["plan", "llama-3.1-8b", "--on", "apple-m2-max-64gb", "--trainer", "unsloth"]) == 2


def test_every_plan_parameter_shapes_the_plan_or_says_where_it_goes() -> None:
    """The plan command passes on what `api.PlanOptions` names (and --on, --headroom); every other parameter
    is the model, --from, or an `Output` field: an option outside all of these would be dropped silently."""
    import dataclasses

    import typer.main

    from fitcheck.cli import app
    from fitcheck.commands.plan import PLAN_TARGET_KW, Output

    group = typer.main.get_command(app)
    plan = group.commands["plan"]  # type: ignore[attr-defined]
    known = {*api.PlanOptions.__annotations__, *PLAN_TARGET_KW, "model", "from_file", "from_format"}
    known |= {f.name for f in dataclasses.fields(Output)}
    assert {p.name for p in plan.params} <= known
