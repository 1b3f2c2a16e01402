"""README.md and docs/ say what the code does (docs that test themselves).

- docs/json.md names every field the JSON documents carry (`estimate`, `check`, `plan`, `matrix`, `hw`,
  `hw list`, `models`), read from the models' schemas and from real documents, and every field its tables
  list is in a real document;
- docs/cli.md documents every option of every command (plan's are in docs/planner.md) and its estimate
  table lists each option once, naming only options that exist;
- the counts README.md and docs/status.md quote (presets, catalog devices, model types) are the code's;
- the commands README.md shows run offline with the exit codes it states.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest

import mlx_helpers as mh
from fitcheck.cli import app, main

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
JSON_MD = (DOCS / "json.md").read_text(encoding="utf-8")
CLI_MD = (DOCS / "cli.md").read_text(encoding="utf-8")
README = (ROOT / "README.md").read_text(encoding="utf-8")
STATUS = (DOCS / "status.md").read_text(encoding="utf-8")

#: Every identifier docs/json.md writes in code spans (`{name, bytes, rule}` names three).
DOCUMENTED = {w for span in re.findall(r"`([^`]+)`", JSON_MD) for w in re.findall(r"[A-Za-z_]\w*", span)}
#: matrix rows name their fields after the methods asked for (`<method>_bytes`).
METHOD_FIELD = re.compile(r"(full|lora|qlora)_(bytes|high_bytes|verdict)")


def _run_json(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, Any]:
    rc = main([*args, "--format", "json"])
    return rc, json.loads(capsys.readouterr().out)


def _keys(doc: Any, path: str = "") -> set[str]:
    """Every key of a JSON document, as `path.key`."""
    out: set[str] = set()
    if isinstance(doc, dict):
        for k, v in doc.items():
            out.add(f"{path}.{k}")
            out |= _keys(v, f"{path}.{k}")
    elif isinstance(doc, list):
        for v in doc:
            out |= _keys(v, f"{path}[]")
    return out


def _undocumented(keys: set[str]) -> list[str]:
    last = {k: k.rsplit(".", 1)[1] for k in keys}
    return sorted(
        k for k, name in last.items() if name not in DOCUMENTED and not METHOD_FIELD.fullmatch(name)
    )


def _schema_fields(model: Any) -> set[str]:
    found: set[str] = set()

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            found.update((node.get("properties") or {}).keys())
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(model.model_json_schema(mode="validation"))
    return found


def test_every_model_field_is_in_docs_json_md() -> None:
    from fitcheck import api
    from fitcheck.hardware.report import HwCatalog, HwReport
    from fitcheck.models import Estimate
    from fitcheck.planner.models import Plan

    for model in (Estimate, Plan, HwReport, HwCatalog, type(api.models()[0])):
        fields = _schema_fields(model)
        assert fields, model.__name__
        missing = sorted(f for f in fields if f not in DOCUMENTED)
        assert not missing, f"docs/json.md does not name {model.__name__}'s {missing}"


#: Documents whose fields only a real run shows (dict fields, fields added at dump time).
CASES = {
    "estimate-hf": "estimate llama-3.1-8b --trainer hf --on rtx-4090",
    "zero3": "estimate llama-3.1-8b --method full --gpus 4 --strategy zero3 --offload optimizer --on 80GB",
    "estimate-device-map": "estimate llama-3.1-8b --gpus 2 --strategy device-map --on rtx-4090",
    "estimate-varying": "estimate llama-3.1-8b --lengths varying --on rtx-4090",
    "estimate-diffusion": "estimate sdxl --on rtx-4090",
    "thumb": "check 7B --rule thumb --on rtx-4090",
    "plan": "plan llama-3.1-8b --on rtx-4090",
    "matrix": "matrix --on rtx-4090 --models 7B,sdxl --methods full,lora",
    "hw": "hw",
    "hw-list": "hw list",
    "models": "models",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_emitted_field_is_in_docs_json_md(case: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc, doc = _run_json(CASES[case].split(), capsys)
    assert rc in (0, 1), case
    assert not _undocumented(_keys(doc)), f"{case}: docs/json.md does not name {_undocumented(_keys(doc))}"


def _table_fields(heading: str) -> list[str]:
    """The plain field names of the first column of the first table after `heading`."""
    body = JSON_MD.split(heading, 1)[1]
    table = body[body.index("| field |") :].split("\n\n", 1)[0]
    names = []
    for cell in re.findall(r"^\| ([^|]+) \|", table, re.M):
        names += [n for n in re.findall(r"`([^`]+)`", cell) if re.fullmatch(r"[a-z_]+", n)]
    return names


@pytest.mark.parametrize(
    ("heading", "args"),
    [
        ("# JSON contract", ["estimate", "llama-3.1-8b", "--trainer", "hf", "--on", "rtx-4090"]),
        ("## `fitcheck plan --format json`", ["plan", "llama-3.1-8b", "--on", "rtx-4090"]),
        ("## `fitcheck hw --format json`", ["hw"]),
    ],
)
def test_every_listed_field_exists(heading: str, args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    _, doc = _run_json(args, capsys)
    listed = _table_fields(heading)
    assert len(listed) > 5, heading
    optional = {"cache_history"}  # present only with --lengths varying or ZeRO's step segments
    assert not [f for f in listed if f not in doc and f not in optional], heading


# --- docs/cli.md -------------------------------------------------------------------------------


def _commands() -> dict[str, Any]:
    import typer.main

    out: dict[str, Any] = {}

    def walk(cmd: Any, path: list[str]) -> None:
        if path:
            out[" ".join(path)] = cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, [*path, name])

    walk(typer.main.get_command(app), [])
    return out


def _long_opts(cmd: Any) -> list[str]:
    return [o for p in cmd.params for o in (*p.opts, *getattr(p, "secondary_opts", ())) if o.startswith("--")]


def _mentions(text: str, opt: str) -> bool:
    return re.search(re.escape(opt) + r"(?![\w-])", text) is not None


def test_every_option_of_every_command_is_in_docs_cli_md() -> None:
    planner = (DOCS / "planner.md").read_text(encoding="utf-8")
    missing = []
    for name, cmd in _commands().items():
        for opt in _long_opts(cmd):
            where = CLI_MD + planner if name == "plan" else CLI_MD  # plan's options table: docs/planner.md
            if not _mentions(where, opt):
                missing.append(f"{name} {opt}")
    assert not missing, f"docs/cli.md does not document {missing}"


def test_the_estimate_options_table_lists_each_option_once() -> None:
    section = CLI_MD.split("## `fitcheck estimate` options", 1)[1].split("\n## ", 1)[0]
    first_cells = re.findall(r"^\| ([^|]+) \|", section.replace("\\|", "/"), re.M)[1:]  # past the header
    rows = [tuple(re.findall(r"--[\w-]+", cell)) for cell in first_cells]
    named = [o for row in rows for o in row]
    assert len(named) == len(set(named)), sorted({o for o in named if named.count(o) > 1})
    real = set(_long_opts(_commands()["estimate"]))
    assert not [o for o in named if o not in real], "the estimate table names an option that is gone"
    assert not [o for o in real if o not in named and not o.startswith("--no-")], "estimate table misses one"


# --- counts quoted in README.md and docs/status.md ----------------------------------------------


def test_the_counts_readme_and_status_quote_are_the_codes() -> None:
    from fitcheck import api
    from fitcheck.hardware import catalog
    from fitcheck.sources.hf_config import supported_types

    kinds = [m.kind for m in api.models()]
    llm, diffusion = kinds.count("llm"), kinds.count("diffusion")
    devices = len(catalog.load_catalog())
    types = len(supported_types())
    assert f"({llm} LLMs, {diffusion} diffusion)" in README
    assert f"(the hardware catalog ({devices} devices)" in README or f"catalog ({devices} devices)" in README
    assert f"# {types} model types" in README
    assert f"{llm} LLM presets" in STATUS
    assert f"{types} `model_type`s" in STATUS
    assert f"{devices}-device catalog" in STATUS
    assert f"`model_type`s read natively from `config.json` ({types};" in CLI_MD


# --- the commands README.md shows ---------------------------------------------------------------

#: README lines that need what a test may not use, with the reason; every other `fitcheck` line runs.
NOT_RUN = {
    "./my-model/": "a placeholder folder",
    "allenai/OLMo-2-1124-7B@main": "the Hub (network)",
    "FacebookAI/roberta-base": "the Hub (network)",
    "openai/gpt-oss-20b": "the Hub (network)",
    "unsloth/llama-3-8b-bnb-4bit": "the Hub (network)",
    "--from axolotl.yaml": "a placeholder file (docs/ci.md's recipes are tested in tests/test_from_cli.py)",
    "fitcheck measure": "the torch extra and a ~10 s trace (tests/test_measure_*.py)",
}


def _readme_commands() -> list[str]:
    block = README.split("```\n", 2)[1]
    lines = [re.split(r"\s#", line, maxsplit=1)[0].strip() for line in block.splitlines()]
    return [line for line in lines if line.startswith("fitcheck ")]


def test_the_readme_shows_commands() -> None:
    assert len(_readme_commands()) >= 15


@pytest.mark.parametrize("line", _readme_commands())
def test_a_readme_command_runs_as_documented(
    line: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    if any(marker in line for marker in NOT_RUN):
        pytest.skip(next(why for marker, why in NOT_RUN.items() if marker in line))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # plan --emit writes here
    args = shlex.split(line)[1:]
    rc = main(args)
    out, err = capsys.readouterr()
    assert "internal error" not in err and "Traceback" not in err, err
    # README: check is the CI gate (exit 0 fits / 1 does not / 2 trouble), plan exits 1 when nothing fits;
    # every other command answers with 0 (docs/cli.md, "Exit codes")
    assert rc in ((0, 1) if args[0] in ("check", "plan") else (0,)), (line, rc, err)
    assert out.strip()
    if "--format" in args and args[args.index("--format") + 1] == "json":
        assert json.loads(out)["schema_version"] == 2
    if "--emit" in args:
        for i, a in enumerate(args):
            if a == "--emit":
                assert (tmp_path / args[i + 1]).is_file(), args[i + 1]


def test_docs_presets_md_lists_every_llm_preset() -> None:
    from fitcheck import api

    text = (DOCS / "presets.md").read_text(encoding="utf-8")
    rows = {
        m[0]: (m[1], int(m[2].replace(",", "")))
        for m in re.findall(r"^\| `([^`]+)` \| `([^`]*)` \| ([\d,]+) \|", text, re.M)
    }
    for preset in api.models():
        if preset.kind == "llm":  # diffusion presets: docs/diffusion.md, "Models and parts"
            assert rows.get(preset.id) == (preset.hf_id, preset.params), f"docs/presets.md: {preset.id}"


def test_the_readme_library_example_runs() -> None:
    code = README.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), scope)  # the example as printed
    e = scope["e"]
    assert e.peak_allocated_bytes > 0 and e.target.verdict in ("fits", "tight", "does_not_fit")


def test_the_band_sentence_readme_quotes_is_the_tables(capsys: pytest.CaptureFixture[str]) -> None:
    """README: 'The table says it in words (Llama 3.1 8B, LoRA, batch 1 x 2048, no checkpointing): "..."'."""
    quoted = re.search(r'no checkpointing\): "([\d.]+ GiB, likely [\d.]+–[\d.]+)"', README.replace("\n", " "))
    assert quoted, "README's band example moved: update this test"
    main(["estimate", "llama-3.1-8b", "--method", "lora", "--on", "rtx-4090"])
    assert f"needs {quoted.group(1)}" in capsys.readouterr().out


def test_readme_names_every_trainer() -> None:
    from fitcheck.cli import TrainerOpt

    listed = re.search(r"`--trainer\s+(generic\|[a-z|]+)`", README)
    assert listed, "README's --trainer list moved: update this test"
    named = set(listed.group(1).split("|")) | {"kohya"}  # kohya: named beside it, for diffusion models
    assert named == {t.value for t in TrainerOpt}


def _paper_marginals() -> dict[int, tuple[int, int]]:
    """mlx-train-perf-qwen3-8b.yaml's marginal records (the paper's section 1): tokens -> (the marginal peak,
    the resident state it was measured above), bytes."""
    import yaml

    from bench_helpers import bench_module

    pub = bench_module("published")
    data = yaml.safe_load((pub.DATA / "mlx-train-perf-qwen3-8b.yaml").read_text(encoding="utf-8"))

    def size(figure: dict[str, Any]) -> int:
        return int(pub.measured_bytes(float(figure["value"]), figure["unit"], "peak"))

    return {
        r["setup"]["seq_len"]: (size(r["measured"]), size(r["measured_above"]))
        for r in data["records"]
        if "measured_above" in r
    }


def _mlx_hand_count_error(seq_len: int, layers: float, per_u: float) -> float:
    """The methodology's hand count of an MLX rule from the deep probes at Qwen3-8B against the paper's
    marginal record at ``seq_len`` (both above the record's resident state): the regime's checkpoints,
    ``layers`` of its layer activations a token, ``per_u`` U, the 1 LG of logits the loss keeps, the adapters
    and their Adam states."""
    spec, est = mh.mlx_setup("qwen3-8b", seq_len)
    lines = {c.name: c.bytes for p in est.phases for c in p.components}
    a = spec.arch
    u = a.num_heads * seq_len**2 * 2
    hand = (
        lines["checkpoints"] + layers * mh.layer_tokens(spec, est.setup, seq_len) * seq_len + per_u * u
        + seq_len * a.vocab_size * 2 + lines["optimizer_states"] + lines["adapters"]
    )  # fmt: skip
    marginal, resident = _paper_marginals()[seq_len]
    return (hand + resident) / (marginal + resident) - 1


def test_mlx_proxy_figures_in_methodology_are_the_recorded_runs(tmp_path: Path) -> None:
    """The MLX CPU-proxy figures docs/methodology.md quotes are tests/data/mlx_cpu/runs.jsonl's lines, and the
    mlx regime's figures beside them are what fitcheck estimates for those shapes today."""
    text = " ".join((DOCS / "methodology.md").read_text(encoding="utf-8").split())
    runs = mh.runs()
    sdpa = [r for r in runs if r["script"] == "bench/mlx_sdpa_op.py"]
    for limit, words in (("0", "at limit 0"), ("default", "at the default")):
        ratios = [r["fwdbwd_marginal_over_U"] for r in sdpa if r["limit"] == limit]
        assert f"{min(ratios):.2f}-{max(ratios):.2f} U {words}" in text
    step_runs = [r for r in runs if r["script"] == "bench/mlx_cpu_step.py"]
    # session 16's 4-bit bf16 runs at hidden 1,024 (session 17's unquantized and fp32 ones carry `quantized`)
    four_bit = {r["layers"]: r for r in step_runs if "quantized" not in r and r["hidden"] == 1024}
    for layers in (1, 2, 4):
        run = four_bit[layers]
        assert f"{run['marginal']:,} B" in text, layers
        ours = mh.regime_marginal(tmp_path / str(layers), run, torch_rules=True)
        assert f"{ours:,} B ({(ours - run['marginal']) / run['marginal']:+.0%})" in text, layers
    two = four_bit[2]
    assert f"MLX holds {two['marginal']:,} B of marginal ({two['marginal_over_U']:.2f} U)" in text


def test_mlx_deep_probe_figures_in_methodology_are_the_recorded_runs(tmp_path: Path) -> None:
    """Session 17's deep MLX probes (16-36 layers, two widths, three lengths, both memory limits) as
    docs/methodology.md, README.md and docs/status.md quote them, with fitcheck's side and the hand counts."""
    text = " ".join((DOCS / "methodology.md").read_text(encoding="utf-8").split())
    step_runs = [r for r in mh.runs() if r["script"] == "bench/mlx_cpu_step.py"]
    # unquantized bf16 sweeps over depth (to 36 layers) and length at hidden 1,024 and 512, the
    # 16-layer step in depth-first order, and a larger vocabulary
    bf16 = [
        r
        for r in step_runs
        if r.get("quantized") is False and r.get("dtype") == "bfloat16" and r["grad_ckpt"]
    ]

    def one(
        hidden: int,
        layers: int,
        seq_len: int = 1024,
        vocab: int = 2048,
        width: str | None = None,
        limit: str = "0",
    ) -> Any:
        (r,) = [
            r
            for r in bf16
            if (r["hidden"], r["layers"], r["seq_len"], r["vocab"], r["MLX_BFS_MAX_WIDTH"], r["limit"])
            == (hidden, layers, seq_len, vocab, width, limit)
        ]
        return r

    depths = [one(1024, n)["marginal"] for n in (1, 2, 4, 8, 16, 36)]
    assert " / ".join(f"{m:,}" for m in depths) + " B" in text
    assert (
        " / ".join(f"{one(512, n)['marginal']:,}" for n in (1, 16, 36)) + " B at 1 / 16 / 36 layers" in text
    )
    for hidden in (1024, 512):
        ckpt = 1024 * hidden * 2  # one layer's checkpoint: 1,024 tokens x hidden, bf16
        shallow, deep = one(hidden, 1)["marginal"], one(hidden, 36)["marginal"]
        assert abs(deep - one(hidden, 16)["marginal"] - 20 * ckpt) <= 1024  # "the checkpoint a layer"
        assert f"{(deep - 36 * ckpt - shallow + ckpt) / 1e6:.1f} MB" in text, hidden
    wide, narrow = one(1024, 16)["marginal"], one(1024, 16, width="1")["marginal"]
    assert f"holds {narrow:,} B, {(wide - narrow) / 1e6:.1f} MB less" in text
    for n in (16, 36):
        assert f"{mh.regime_marginal(tmp_path / f'sweep{n}', one(1024, n), torch_rules=True):,} B" in text
    under = [
        1
        - mh.regime_marginal(tmp_path / f"under{h}-{n}", one(h, n), torch_rules=True) / one(h, n)["marginal"]
        for h in (512, 1024)
        for n in (16, 36)
    ]
    for doc in (ROOT / "README.md", DOCS / "status.md"):  # their summary of the deep probes
        assert f"{min(under):.0%}-{max(under):.0%} under MLX".replace("%-", "-") in doc.read_text(
            encoding="utf-8"
        )
    big = one(1024, 16, vocab=32768)
    grown_by = big["marginal"] - wide
    assert f"adds {grown_by:,} B ({grown_by / big['logits_bf16']:.2f} LG) to MLX's {wide:,} B" in text
    # 16 layers at 2,048 tokens, and what each side grows by between the two lengths (a U + b per token)
    for hidden in (1024, 512):
        short, long = one(hidden, 16), one(hidden, 16, seq_len=2048)
        ours_short = mh.regime_marginal(tmp_path / f"short{hidden}", short, torch_rules=True)
        ours_long = mh.regime_marginal(tmp_path / f"long{hidden}", long, torch_rules=True)
        assert f"{long['marginal']:,} B" in text and f"{ours_long:,} B" in text, hidden
        assert f"({(ours_long - long['marginal']) / long['marginal']:+.0%})" in text, hidden
        for a, b in ((short["marginal"], long["marginal"]), (ours_short, ours_long)):
            per_u = (b - 2 * a) / (long["U"] - 2 * short["U"])
            per_token = (a - per_u * short["U"]) / 1024
            assert f"{per_u:.2f} U and {per_token / 1000:.0f} KB a token" in text, hidden
    # three lengths fix c + a per token + b U; a less the checkpoints in the regime's layers; a hand count
    ratios, per_u = {}, []
    for hidden in (512, 1024):
        rows = [one(hidden, 16, seq_len=n) for n in (512, 1024, 2048)]
        c, a, b = mh.fit(rows)
        assert f"hidden {hidden:,} c = {c / 1e6:.1f} MB, a = {a / 1e3:.1f} KB, b = {b:.2f} U" in text
        layer = mh.layer_bytes_per_token(tmp_path / f"layer{hidden}", rows[1])
        ratios[hidden] = ((a - 16 * hidden * 2) / layer, layer)  # less 16 checkpoints a token
        per_u.append(b)
    (r512, l512), (r1024, l1024) = ratios[512], ratios[1024]
    assert f"a is {r512:.2f} and {r1024:.2f} times" in text and f"{l512:,} and {l1024:,} B a token" in text
    layers = (r512 + r1024) / 2
    assert f"{layers:.2f} layers of its" in text and f"{max(per_u):.2f} U (the larger)" in text
    spec, est = mh.mlx_setup("qwen3-8b", 1024)
    assert f"{layers:.2f} layers of its {mh.layer_tokens(spec, est.setup, 1024):,} B a token" in text
    errors = [_mlx_hand_count_error(n, layers, max(per_u)) for n in (1024, 2048, 4096, 8192)]
    assert " / ".join(f"{e:+.1%}" for e in errors[:3]) + " at 1,024 / 2,048 / 4,096 tokens" in text
    assert f"{errors[3]:+.1%} at 8,192" in text
    # the same at MLX's default limit (the CPU backend's queue)
    queued = [one(1024, 16, seq_len=n, limit="default") for n in (512, 1024, 2048)]
    assert " / ".join(f"{r['marginal']:,}" for r in queued) + " B at 512 / 1,024 / 2,048 tokens" in text
    extra = [q["marginal"] / one(1024, 16, seq_len=q["seq_len"])["marginal"] - 1 for q in queued]
    assert " / ".join(f"{e:.0%}" for e in extra) + " more than at limit 0" in text
    c, a, b = mh.fit(queued)
    assert f"c = {c / 1e6:.1f} MB, a = {a / 1e3:.1f} KB, b = {b:.2f} U" in text
    deep = (a - 16 * 1024 * 2) / ratios[1024][1]
    assert f"{deep:.2f} layers beyond the checkpoints" in text
    errors = [_mlx_hand_count_error(n, deep, b) for n in (1024, 2048, 4096, 8192)]
    tokens = " at 1,024 / 2,048 / 4,096 tokens and "
    assert " / ".join(f"{e:+.1%}" for e in errors[:3]) + tokens + f"{errors[3]:+.1%}" in text
    small = {
        (r["seq_len"], r["limit"]): r["marginal"]
        for r in step_runs
        if r["hidden"] == 256 and r["steps"] == 2 and r["layers"] == 2 and r["vocab"] == 512
    }
    more = [small[(n, "default")] / small[(n, "0")] - 1 for n in (2048, 4096)]
    assert f"held {min(more):.0%}-{max(more):.0%} more".replace("%-", "-") in text
