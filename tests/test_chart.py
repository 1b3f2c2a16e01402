"""Charts: what each chart says (pure specs), and the written SVG, HTML and PNG files read back."""

from __future__ import annotations

import json
import struct
import sys
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from fitcheck.chart import chart_format, write_chart
from fitcheck.chart.palette import CATEGORY_OF, category, colour
from fitcheck.chart.spec import BarChart, estimate_chart, matrix_chart
from fitcheck.errors import MissingExtraError, OptionError
from fitcheck.models import Estimate

SVG_NS = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def est() -> Estimate:
    from fitcheck import api

    return api.estimate("llama-3.1-8b", method="lora", grad_ckpt=True, on="rtx-4090")


def svg_texts(data: bytes) -> str:
    root = ET.fromstring(data)
    return " ".join("".join(t.itertext()) for t in root.iter(f"{SVG_NS}text"))


# --- specs -------------------------------------------------------------------------------------


def test_estimate_chart_bars_are_the_phases_and_the_device_total(est: Estimate) -> None:
    c = estimate_chart(est)
    assert [b.total_bytes for b in c.bars[:-1]] == [p.total_bytes for p in est.phases]
    assert c.bars[-1].total_bytes == est.device_bytes
    assert [b.marked for b in c.bars].count("peak") == 1
    assert est.target is not None
    assert {line.bytes for line in c.lines} >= {est.target.usable_bytes}
    assert "Llama 3.1 8B" in c.title and "lora" in c.subtitle and "ckpt" in c.subtitle


def test_every_component_has_one_stable_colour() -> None:
    for name in CATEGORY_OF:
        assert colour(name) == colour(name)
        assert colour(name).startswith("#") and len(colour(name)) == 7
    assert category("unet_weights") == "weights"
    assert category("something_new") == "other"
    # within a category the shades differ, so neighbouring segments stay apart
    weights = [n for n, c in CATEGORY_OF.items() if c == "weights"]
    assert len({colour(n) for n in weights}) == len(weights)


def test_categories_are_the_registry_ones() -> None:
    from fitcheck.chart.palette import CATEGORY_COLOUR
    from fitcheck.components import REGISTRY

    for row in REGISTRY.values():
        assert category(row.id) == row.category
        assert row.category in CATEGORY_COLOUR
    assert category("merged_expert_weights") == "temporaries"  # the registry's word, not the suffix
    assert category("cuda_context") == category("allocator_reserve") == "overhead"


def test_matrix_chart_from_rows() -> None:
    rows = [
        {
            "model": "7B",
            "lora_bytes": 10 << 30,
            "lora_verdict": "fits",
            "full_bytes": 90 << 30,
            "full_verdict": "does_not_fit",
            "budget_bytes": 24 << 30,
            "usable_bytes": 24 << 30,
        },
    ]
    c = matrix_chart(rows, ["lora", "full"], "rtx-4090", "batch 1, seq 2048")
    assert c.models == ("7B",) and c.methods == ("lora", "full")
    assert c.cells[0][1].verdict == "does_not_fit"


def test_chart_format_from_the_extension() -> None:
    assert chart_format(Path("a.SVG")) == "svg"
    assert chart_format(Path("a.html")) == "html"
    with pytest.raises(OptionError, match=r"\.svg, \.png or \.html"):
        chart_format(Path("a.pdf"))


def test_missing_extra_names_the_chart_extra(monkeypatch: pytest.MonkeyPatch, est: Estimate) -> None:
    from fitcheck.chart.draw import render

    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MissingExtraError, match=r"\[chart\]"):
        render(estimate_chart(est), "svg")


# --- files (the test extra installs the chart extra: these never skip in CI) ----------------------


def test_svg_holds_every_component_the_budget_and_the_title(est: Estimate, tmp_path: Path) -> None:
    c = estimate_chart(est)
    path = write_chart(c, tmp_path / "e.svg", force=False)
    text = svg_texts(path.read_bytes())
    for name in c.components:
        assert name in text
    assert "usable on rtx-4090" in text
    assert "Llama 3.1 8B" in text
    assert "(peak)" in text


def test_svg_is_reproducible(est: Estimate, tmp_path: Path) -> None:
    c = estimate_chart(est)
    a = write_chart(c, tmp_path / "a.svg", force=False).read_bytes()
    b = write_chart(c, tmp_path / "b.svg", force=False).read_bytes()
    assert a == b


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: object) -> None:
        self.tags.append(tag)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def test_html_is_one_page_with_the_svg_and_the_numbers(est: Estimate, tmp_path: Path) -> None:
    c = estimate_chart(est)
    page = write_chart(c, tmp_path / "e.html", force=False).read_text()
    p = _Collect()
    p.feed(page)
    assert "svg" in p.tags and "table" in p.tags and "script" not in p.tags
    text = " ".join(p.text)
    assert c.title in text
    for name in c.components:
        assert name in text


def test_png_has_the_expected_size(est: Estimate, tmp_path: Path) -> None:
    data = write_chart(estimate_chart(est), tmp_path / "e.png", force=False).read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1000, 560)


def test_no_overwrite_without_force(est: Estimate, tmp_path: Path) -> None:
    from fitcheck.emitters.writer import WriteError

    path = tmp_path / "e.svg"
    path.write_text("keep")
    with pytest.raises(WriteError, match="--force"):
        write_chart(estimate_chart(est), path, force=False)
    assert path.read_text() == "keep"
    write_chart(estimate_chart(est), path, force=True)
    assert path.read_bytes().startswith(b"<?xml")


def test_band_is_drawn_when_the_estimate_has_one(est: Estimate, tmp_path: Path) -> None:
    from fitcheck.chart.spec import Range

    c = estimate_chart(est)
    banded = BarChart(
        c.title, c.subtitle, c.bars, c.lines, Range(len(c.bars) - 1, 1 << 30, 2 << 30, "likely"), ""
    )
    text = svg_texts(write_chart(banded, tmp_path / "b.svg", force=False).read_bytes())
    assert "likely: 1.0-2.0 GiB" in text


def test_matrix_svg(tmp_path: Path) -> None:
    rows = [
        {
            "model": m,
            "lora_bytes": 10 << 30,
            "lora_verdict": "fits",
            "full_bytes": 30 << 30,
            "full_verdict": "tight",
            "budget_bytes": 24 << 30,
            "usable_bytes": 24 << 30,
        }
        for m in ("7B", "13B")
    ]
    c = matrix_chart(rows, ["lora", "full"], "rtx-4090", "batch 1, seq 2048, no ckpt")
    text = svg_texts(write_chart(c, tmp_path / "m.svg", force=False).read_bytes())
    for word in (
        "7B",
        "13B",
        "lora",
        "full",
        "10.0 GiB",
        "30.0 GiB",
        "What fits on rtx-4090",
        "budget 24.0 GiB",
    ):
        assert word in text


def test_plan_chart_chosen_against_runners_up(tmp_path: Path) -> None:
    from tests.plan_helpers import plan_for

    from fitcheck.chart.spec import plan_chart

    plan = plan_for("llama-3.2-3b", "rtx-4090", method="lora")
    c = plan_chart(plan)
    assert c.rows[0].chosen and sum(r.chosen for r in c.rows) == 1
    assert len(c.rows) == 1 + len(plan.runners_up)
    text = svg_texts(write_chart(c, tmp_path / "p.svg", force=False).read_bytes())
    assert "tokens/s" in text and "budget" in text and c.title in text
    nothing = plan_chart(plan_for("llama-3.1-70b", "rtx-4090", method="full"))
    assert not nothing.rows or not any(r.chosen for r in nothing.rows)
    assert "nothing fits" in nothing.title
    tight = plan_chart(plan_for("qwen2.5-7b", "22GB", method="lora"))  # docs/planner.md#tight
    assert tight.title.endswith("plan (tight)") and tight.rows[0].chosen and tight.rows[0].verdict == "tight"


def test_timeline_of_a_traced_step(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from fitcheck.chart.spec import timeline_chart
    from fitcheck.engine.estimate import estimate
    from fitcheck.measure.trace import trace_step
    from fitcheck.models import LlmSetup
    from fitcheck.sources.resolve import resolve_model

    cfg = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    }
    setup = LlmSetup(method="lora", batch_size=2, seq_len=128)
    measured = trace_step(cfg, setup, timeline_points=200)
    line = measured.timeline
    assert line is not None and len(line.x) <= 202
    assert max(line.totals()) == measured.peak_allocated_bytes  # thinning keeps the peak
    assert [p.name for p in line.phases] == ["forward", "backward", "optimizer_step"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    est = estimate(resolve_model(str(tmp_path / "config.json")), setup)
    c = timeline_chart(measured, est, "tiny llama")
    assert c.peak is not None and c.peak[1] == measured.peak_allocated_bytes
    text = svg_texts(write_chart(c, tmp_path / "t.svg", force=False).read_bytes())
    for word in (
        "weights",
        "gradients",
        "optimizer states",
        "activations",
        "forward",
        "backward",
        "optimizer step",
        "estimate",
        "peak",
        "tiny llama",
    ):
        assert word in text


# --- the commands ------------------------------------------------------------------------------


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    from fitcheck.cli import main

    rc = main(list(args))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("command", ["estimate", "check"])
def test_chart_option_on_estimate_and_check(
    command: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "mem.svg"
    rc, _out, err = _run(
        capsys,
        command,
        "llama-3.1-8b",
        "--method",
        "qlora",
        "--grad-ckpt",
        "--on",
        "rtx-4090",
        "--chart",
        str(path),
    )
    assert rc == 0, err
    text = svg_texts(path.read_bytes())
    assert "Llama 3.1 8B" in text and "usable on rtx-4090" in text and "weights_4bit" in text
    assert f"wrote {path}" in err
    rc, _, err = _run(capsys, command, "llama-3.1-8b", "--on", "rtx-4090", "--chart", str(path))
    assert rc == 2 and "exists; add --force" in err
    rc, _, err = _run(
        capsys, command, "7B", "--method", "qlora", "--on", "rtx-4090", "--chart", str(path), "--force"
    )
    assert rc == 0


def test_chart_markdown_embeds_the_path(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "mem.png"
    rc, out, _ = _run(
        capsys, "estimate", "7B", "--on", "rtx-4090", "--format", "markdown", "--chart", str(path)
    )
    assert rc == 0 and f"![memory chart]({path})" in out and path.read_bytes()[:4] == b"\x89PNG"


def test_chart_wrong_extension_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, out, err = _run(capsys, "estimate", "7B", "--on", "rtx-4090", "--chart", str(tmp_path / "x.pdf"))
    assert rc == 2 and out == "" and err.count("\n") == 1 and ".svg, .png or .html" in err
    assert not (tmp_path / "x.pdf").exists()


def test_chart_without_the_extra_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    rc, _, err = _run(capsys, "estimate", "7B", "--on", "rtx-4090", "--chart", str(tmp_path / "x.svg"))
    assert rc == 2 and err.count("\n") == 1 and "pip install -e '.[chart]'" in err


def test_matrix_chart_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "m.html"
    rc, _, err = _run(capsys, "matrix", "--on", "rtx-4090", "--models", "1.5B,7B", "--chart", str(path))
    assert rc == 0, err
    page = path.read_text()
    assert "What fits on" in page and "1.5B" in page and "7B" in page and "qlora" in page
    rc, _, err = _run(capsys, "matrix", "--on", "none", "--models", "7B", "--chart", str(tmp_path / "n.svg"))
    assert rc == 2 and "--on" in err


def test_measure_timeline_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pytest.importorskip("torch")
    cfg = {
        "model_type": "llama",
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    path = tmp_path / "step.svg"
    rc, _out, err = _run(
        capsys,
        "measure",
        str(tmp_path / "config.json"),
        "--method",
        "lora",
        "--seq-len",
        "64",
        "--timeline",
        str(path),
    )
    assert rc == 0, err
    text = svg_texts(path.read_bytes())
    assert "memory over one training step" in text and "estimate" in text and "peak" in text
    rc, _, err = _run(
        capsys,
        "measure",
        str(tmp_path / "config.json"),
        "--device",
        "cpu",
        "--timeline",
        str(tmp_path / "x.svg"),
    )
    assert rc == 2 and "traced step" in err


def test_plan_chart_command(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "plan.svg"
    rc, _out, err = _run(capsys, "plan", "llama-3.1-8b", "--on", "rtx-4090", "--chart", str(path))
    assert rc == 0, err
    text = svg_texts(path.read_bytes())
    assert "tokens/s" in text and "Llama 3.1 8B" in text
    rc, out, err = _run(
        capsys, "plan", "llama-3.1-8b", "--on", "rtx-4090", "--chart", str(tmp_path / "p.gif")
    )
    assert rc == 2 and out == "" and ".svg, .png or .html" in err
