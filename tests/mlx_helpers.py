"""MLX CPU-proxy runs (tests/data/mlx_cpu/runs.jsonl) and fitcheck's estimate at their shapes, shared by the
tests that hold the MLX rule to them (test_mlx_eval.py) and the docs' figures to both (test_docs_truth.py)."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any
from unittest import mock

from bench_helpers import bench_module

ROOT = Path(__file__).resolve().parent.parent
#: What the MLX probes' ``active_before`` already holds (the marginal is measured above it).
RESIDENT = ("weights_4bit", "weights_unquantized", "adapters")
#: The fields of a bench/mlx_cpu_step.py run that its config.json is written from.
SHAPE_KEYS = ("seq_len", "heads", "kv_heads", "head_dim", "hidden", "intermediate", "layers", "vocab")
MLX_RUNS = ROOT / "tests/data/mlx_cpu/runs.jsonl"


def runs() -> list[dict[str, Any]]:
    return [json.loads(line) for line in MLX_RUNS.read_text(encoding="utf-8").splitlines()]


def step_runs() -> list[dict[str, Any]]:
    """bench/mlx_cpu_step.py's runs (mlx-lm's compiled LoRA step)."""
    return [r for r in runs() if r["script"] == "bench/mlx_cpu_step.py"]


def mlx_setup(model: str, seq_len: int, dtype: str = "bf16", grad_ckpt: bool = True) -> tuple[Any, Any]:
    """The spec and estimate fitcheck makes for an mlx-lm QLoRA step of ``model`` (the records' settings)."""
    from fitcheck import api

    est = api.estimate(
        model, method="qlora", trainer="mlx", precision=dtype, lora_rank=8, seq_len=seq_len, batch_size=1,
        grad_ckpt=grad_ckpt, on="m1-max-32gb",
    )  # fmt: skip
    return api.resolve(model), est


def probe_model(folder: Path, run: dict[str, Any]) -> str:
    """A folder holding bench/mlx_cpu_step.py's config.json of a probe's shape, for fitcheck to read."""
    config = bench_module("mlx_cpu_step").hf_config(argparse.Namespace(**{k: run[k] for k in SHAPE_KEYS}))
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return str(folder)


def with_torch_rules() -> Any:
    """The mlx regime as it was before its own rule (sessions 16-17's figures): torch's loss and attention."""
    from fitcheck.engine import regimes

    own = regimes._mlx

    def before(setup: Any) -> Any:
        return own(setup).model_copy(
            update={"name": "mlx (torch rules)", "loss_kernel": "standard", "evaluation": "torch"}
        )

    return mock.patch.object(regimes, "_mlx", before)


def regime_marginal(folder: Path, run: dict[str, Any], torch_rules: bool = False) -> int:
    """fitcheck's mlx estimate at a probe's shape, less the resident weights and adapters: the side of the
    probe's marginal that fitcheck estimates (the same with 4-bit weights or without: the regime dequantizes
    nothing). ``torch_rules``: as the regime sized it before MLX's own rule (the docs' historical figures)."""
    model = probe_model(folder, run)
    dtype = "fp32" if run.get("dtype") == "float32" else "bf16"
    with with_torch_rules() if torch_rules else contextlib.nullcontext():
        _, est = mlx_setup(model, run["seq_len"], dtype, run["grad_ckpt"])
    peak = next(p for p in est.phases if p.name == est.peak_phase)
    return est.peak_allocated_bytes - sum(c.bytes for c in peak.components if c.name in RESIDENT)


def solve(rows: list[list[float]], ys: list[int]) -> list[float]:
    """The exact solution of n linear equations in n unknowns (Gaussian elimination, no pivoting: the
    probes' systems are well conditioned)."""
    n = len(rows)
    m = [[*r, float(y)] for r, y in zip(rows, ys, strict=True)]
    for i in range(n):
        for j in range(i + 1, n):
            f = m[j][i] / m[i][i]
            m[j] = [x - f * y for x, y in zip(m[j], m[i], strict=True)]
    out = [0.0] * n
    for i in reversed(range(n)):
        out[i] = (m[i][n] - sum(m[i][k] * out[k] for k in range(i + 1, n))) / m[i][i]
    return out


def fit(rows: list[dict[str, Any]]) -> tuple[float, float, float]:
    """(c, a, b): three runs' marginal as c + a per token + b U."""
    c, a, b = solve([[1.0, r["seq_len"], r["U"]] for r in rows], [r["marginal"] for r in rows])
    return c, a, b


def layer_tokens(spec: Any, setup: Any, seq_len: int) -> int:
    """One layer's activations a token as the mlx regime counts them, its scores aside."""
    from fitcheck.engine import activations as act
    from fitcheck.engine.regimes import regime_for

    acts = act.layer_activations(spec.arch, setup, regime_for(setup))
    return round(acts.total(seq_len) - acts.scores * seq_len)


def layer_bytes_per_token(folder: Path, run: dict[str, Any]) -> int:
    spec, est = mlx_setup(probe_model(folder, run), run["seq_len"])
    return layer_tokens(spec, est.setup, run["seq_len"])
