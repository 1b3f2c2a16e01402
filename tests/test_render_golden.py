"""Golden renders of the tables at 80 and 120 columns: no line over the width, no value split.

The machine is replayed (tests/hw_replay.py), so the renders are deterministic. Regenerate after an
intended change with ``FITCHECK_REGEN_GOLDEN=1 pytest tests/test_render_golden.py`` and read the diff.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from rich.cells import cell_len

from fitcheck import cli
from fitcheck.commands import hw
from fitcheck.hardware.env import ProbeEnv
from hw_replay import env_from_fixture

GOLDEN = Path(__file__).parent / "golden" / "render"
REGEN = os.environ.get("FITCHECK_REGEN_GOLDEN") == "1"

#: name -> (argv, replayed machine, expected exit code)
CASES: dict[str, tuple[list[str], str, int]] = {
    "estimate": (["estimate", "llama-3.1-8b", "--method", "lora", "--on", "rtx-4090"], "h100_idle", 0),
    "estimate_full": (["estimate", "gemma-3-1b", "--method", "full", "--on", "4GB"], "h100_idle", 0),
    "estimate_no_gpu": (["estimate", "qwen2.5-0.5b", "--method", "lora"], "container_cgroup", 0),
    "check": (
        ["check", "llama-3.1-8b", "--method", "lora", "--seq-len", "4096", "--on", "rtx-4090"],
        "h100_idle",
        1,
    ),
    "check_thumb": (["check", "llama-3.1-8b", "--rule", "thumb", "--on", "rtx-4090"], "h100_idle", 0),
    "plan": (["plan", "llama-3.1-8b", "--on", "rtx-4090"], "h100_idle", 0),
    # only tight (docs/planner.md#tight): chosen with its likely upper edge, exit 0 with a warning; a 22 GB
    # card's 21 GiB budget lies between the best central estimate (19.95 GiB) and its likely range's edge
    "plan_tight": (["plan", "qwen2.5-7b", "--method", "lora", "--on", "22GB"], "h100_idle", 0),
    "hw": (["hw"], "h100_idle", 0),
    "hw_no_gpu": (["hw"], "container_cgroup", 0),
    "hw_list": (["hw", "list"], "h100_idle", 0),
    "matrix": (["matrix", "--on", "rtx-4090"], "h100_idle", 0),
}
WIDTHS = (80, 120)

_UNIT = r"(?:GiB|MiB|GB/s|GB|B/token|B/param|tokens/s|tokens|tok|px|%)"
#: a number, with its unit when it has one: what must never be split across lines
VALUE = re.compile(rf"\d[\d,.]*(?:%|(?: {_UNIT})(?![\w/]))?")


def render(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, width: int) -> str:
    argv, machine, code = CASES[name]
    monkeypatch.setenv("COLUMNS", str(width))
    monkeypatch.setattr(ProbeEnv, "real", classmethod(lambda cls, use_torch=False: env_from_fixture(machine)))
    monkeypatch.setattr(hw, "probe_env_factory", lambda use_torch: env_from_fixture(machine))
    capsys.readouterr()
    assert cli.main(argv) == code
    return capsys.readouterr().out


def values(text: str) -> set[str]:
    return set(VALUE.findall(text))


def split_values(narrow: str, wide: str) -> set[str]:
    """Values in ``narrow`` that are not whole: a number torn apart, or one torn from its unit.

    A value shown with its unit is whole (a folded layout may add a unit a table column header
    carried); a value shown without one must appear without one in the render nothing could wrap.
    """
    narrow = "\n".join(line for line in narrow.splitlines() if not line.startswith("not shown at "))
    whole = values(wide)
    numbers = {v.split(" ")[0].rstrip("%") for v in whole}
    return {
        v
        for v in values(narrow)
        if v.split(" ")[0].rstrip("%") not in numbers or (" " not in v and "%" not in v and v not in whole)
    }


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_render(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str, width: int
) -> None:
    out = render(monkeypatch, capsys, name, width)
    path = GOLDEN / f"{name}_{width}.txt"
    if REGEN:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(out, encoding="utf-8")
    assert out == path.read_text(encoding="utf-8"), f"{path.name} differs (FITCHECK_REGEN_GOLDEN=1)"
    too_long = [line for line in out.splitlines() if cell_len(line) > width]
    assert not too_long, f"{name} at {width}: lines over {width} columns: {too_long}"
    # every value shown at this width is whole: it also appears, as is, when nothing can wrap
    wide = render(monkeypatch, capsys, name, 1000)
    split = split_values(out, wide)
    assert not split, f"{name} at {width}: values split across lines: {sorted(split)}"


def test_the_issue_command_fits_80_columns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = render(monkeypatch, capsys, "estimate", 80)
    assert max(cell_len(line) for line in out.splitlines()) <= 80
    assert "33.0 GiB" in out or "GiB" in out


def test_value_check_catches_a_split() -> None:
    """The no-split check is not vacuous: a number torn from its unit is caught."""
    wide = "needs 33.00 GiB of 22.98 GiB"
    narrow = "needs 33.00\nGiB of 22.98 GiB"
    assert split_values(narrow, wide) == {"33.00"}
    assert split_values("1,3\n67 tokens", "1,367 tokens") == {"1,3", "67 tokens"}
    assert not split_values(wide, wide)


def test_deductions_read_as_minus(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = render(monkeypatch, capsys, "hw_no_gpu", 120)
    assert "minus in use" in out and "-2." not in out and "+" not in out.split("Budget on")[1]
    assert out.lstrip().startswith("No GPU found on this machine")


def test_no_gpu_is_said_first(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = render(monkeypatch, capsys, "estimate_no_gpu", 120)
    assert out.startswith("No GPU found on this machine: sizing its RAM.")
    assert "--on rtx-4090" in out.splitlines()[0]


def test_provenance_only_with_verbose(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = render(monkeypatch, capsys, "estimate", 120)
    assert "https://" not in out and "seeds/" not in out and "La regola" not in out
    monkeypatch.setitem(CASES, "v", ([*CASES["estimate"][0], "--verbose"], "h100_idle", 0))
    verbose = render(monkeypatch, capsys, "v", 200)
    assert "https://" in verbose and "seeds/002" in verbose


def test_spare_and_short_by_words(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    short = render(monkeypatch, capsys, "check", 120)
    assert "short by " in short and "spare -" not in short
    monkeypatch.setitem(CASES, "j", ([*CASES["check"][0], "--format", "json"], "h100_idle", 1))
    doc = json.loads(render(monkeypatch, capsys, "j", 120))["target"]
    assert doc["spare_bytes"] == doc["budget_bytes"] - doc["device_bytes"] < 0
    assert doc["spare_pct"] == round(100 * doc["spare_bytes"] / doc["usable_bytes"], 1)
    assert doc["headroom_bytes"] == 0 and "headroom_pct" not in doc
    assert f"short by {-doc['spare_bytes'] / 2**30:.2f} GiB" in short


def test_suggestions_save_memory_and_combine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(CASES, "j", ([*CASES["check"][0], "--format", "json"], "h100_idle", 1))
    sugs = json.loads(render(monkeypatch, capsys, "j", 120))["target"]["suggestions"]
    singles = [s for s in sugs if s["changes"] == 1]
    assert singles and not any(s["fits"] for s in singles)
    combos = [s for s in sugs if s["changes"] > 1]
    assert len(combos) == 1 and combos[0]["fits"] and combos[0]["saves_bytes"] > 0
    text = render(monkeypatch, capsys, "check", 120)
    assert combos[0]["flag"] in text


def test_a_suggestion_is_judged_by_the_verdicts_one_rule(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each suggestion's verdict_after is judge_bytes on its own re-estimate: fits <=> its upper edge fits,
    tight <=> only its central estimate does; a tight one reads "tight: likely up to X GiB", not "fits"."""
    from fitcheck.engine.verdict import judge_bytes

    monkeypatch.setitem(CASES, "j", ([*CASES["check"][0], "--format", "json"], "h100_idle", 1))
    target = json.loads(render(monkeypatch, capsys, "j", 120))["target"]
    budget = target["budget_bytes"]
    for sug in target["suggestions"]:
        assert sug["verdict_after"] == judge_bytes(sug["device_bytes_after"], sug["high_bytes_after"], budget)
        assert sug["fits"] == (sug["verdict_after"] == "fits")
    # the golden estimate on a 22 GB card (21 GiB budget): --grad-ckpt leaves 19.93 GiB, likely more
    monkeypatch.setitem(CASES, "e22", ([*CASES["estimate"][0][:-1], "22GB"], "h100_idle", 0))
    text = render(monkeypatch, capsys, "e22", 200)
    tight = [line for line in text.splitlines() if "try --grad-ckpt:" in line]
    assert tight and "tight: likely up to " in tight[0] and "still too big" not in tight[0]


def test_markup_in_a_name_prints_literally(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "[bold]model[red]"
    folder.mkdir()
    (folder / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "hidden_size": 512,
                "intermediate_size": 1376,
                "num_hidden_layers": 4,
                "num_attention_heads": 8,
                "num_key_value_heads": 8,
                "vocab_size": 32000,
                "architectures": ["LlamaForCausalLM"],
            }
        ),
        encoding="utf-8",
    )
    monkeypatch.setitem(CASES, "m", (["estimate", str(folder), "--on", "rtx-4090"], "h100_idle", 0))
    out = render(monkeypatch, capsys, "m", 200)
    assert "[bold]model[red]" in out


@pytest.mark.parametrize(
    ("count", "shown"),
    [(999_885_952, "1.00B"), (8_030_261_248, "8.03B"), (494_032_768, "494M"), (41_943_040, "41.9M"),
     (999_500, "1.00M"), (99_950, "100K"), (999, "999"), (70_553_706_496, "70.6B")],
)  # fmt: skip
def test_counts_have_three_significant_figures(count: int, shown: str) -> None:
    from fitcheck.units import fmt_count

    assert fmt_count(count) == shown


def test_install_hint_names_the_extra_and_a_checkout_command() -> None:
    from fitcheck.commands.measure import EXTRA_HINT

    assert "'torch' extra" in EXTRA_HINT
    assert "pip install torch==2.13.0 && pip install -e '.[torch]'" in EXTRA_HINT


def test_check_rule_thumb_judges_the_thumb_figure(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """8B LoRA: the detailed estimate does not fit a 4090, the rule of thumb (19 GiB) does: exit 0."""
    monkeypatch.setitem(CASES, "j", ([*CASES["check_thumb"][0], "--format", "json"], "h100_idle", 0))
    doc = json.loads(render(monkeypatch, capsys, "j", 120))
    t = doc["target"]
    assert doc["rule"] == "thumb" and t["device_bytes"] == t["high_bytes"] == doc["thumb_bytes"]
    assert t["verdict"] == "fits" and t["spare_bytes"] == t["budget_bytes"] - doc["thumb_bytes"]
    assert doc["detailed_device_bytes"] > t["budget_bytes"]  # the detailed figure would not fit
    monkeypatch.setitem(CASES, "k", (["check", "70B", "--rule", "thumb", "--on", "rtx-4090"], "h100_idle", 1))
    assert "does not fit" in render(monkeypatch, capsys, "k", 120)


def test_a_suggestion_that_saves_nothing_is_not_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fitcheck import api, render
    from fitcheck.models import Suggestion

    monkeypatch.setenv("COLUMNS", "120")
    spec = api.resolve("llama-3.1-8b")
    est = api.check(spec, "rtx-4090", method="lora")
    assert est.target is not None
    idle = Suggestion(change="a change that saves nothing", flag="--noop", saves_bytes=0,
                      device_bytes_after=est.device_bytes, fits=False)  # fmt: skip
    est = est.model_copy(
        update={"target": est.target.model_copy(update={"suggestions": (*est.target.suggestions, idle)})}
    )
    capsys.readouterr()
    render.estimate_table(est, spec)
    out = capsys.readouterr().out
    assert "--noop" not in out and "try --grad-ckpt" in out


def test_hw_list_piped_is_120_columns_wide(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Not a terminal and no $COLUMNS (a pipe, a CI log): 120 columns, not rich's squashed 80."""
    monkeypatch.delenv("COLUMNS", raising=False)
    capsys.readouterr()
    assert cli.main(["hw", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert 100 < max(cell_len(line) for line in lines) <= 120
    assert any("rtx-4090" in line and "23.99" in line for line in lines)
