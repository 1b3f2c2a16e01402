"""``fitcheck matrix --on HW``: what fits, model sizes x methods (like the seeds' 36 GB table).

No ``from __future__ import annotations``: typer must see the option types as objects.
"""

from typing import Annotated, Any

import typer

DEFAULT_MODELS = "0.5B,1.5B,3B,7B,14B,32B,70B"


def register(app: typer.Typer) -> None:
    """Add the ``matrix`` command."""
    from fitcheck import cli as c

    @app.command()
    def matrix(
        on: Annotated[
            str, typer.Option("--on", help="target: catalog id, 24GB, 36GB-unified, 2x4090, auto, none")
        ],
        models: Annotated[
            str, typer.Option("--models", help="comma-separated sizes or preset ids")
        ] = DEFAULT_MODELS,
        methods: Annotated[
            str, typer.Option("--methods", help="comma-separated methods")
        ] = "full,lora,qlora",
        rule: c.RuleO = c.RuleOpt.detailed,
        batch_size: c.BatchO = 1,
        seq_len: c.SeqO = None,
        grad_ckpt: c.CkptO = False,
        optimizer: c.OptO = c.OptimizerOpt.adamw,
        trainer: c.TrainerO = c.TrainerOpt.generic,
        headroom: c.HeadroomO = None,
        fmt: c.FmtO = c.Fmt.table,
        chart: c.ChartO = None,
        force: c.ChartForceO = False,
    ) -> None:
        """Which model sizes fit with which method, in GiB (--rule thumb: the seeds' rule of thumb)."""
        from fitcheck.errors import InputError

        chosen = [m.strip() for m in methods.split(",") if m.strip()]
        bad = [m for m in chosen if m not in ("full", "lora", "qlora")]
        if bad or not chosen:
            raise InputError(
                f"--methods: '{','.join(bad) or methods}' is not a method; use full, lora, qlora"
            )
        names = [m.strip() for m in models.split(",") if m.strip()]
        if not names:
            raise InputError("--models is empty: give sizes (7B) or preset ids, comma-separated")
        _once("--methods", chosen)
        _once("--models", names)
        base = c.plain(
            batch_size=batch_size, seq_len=seq_len, grad_ckpt=grad_ckpt, optimizer=optimizer, trainer=trainer
        )
        from fitcheck import api, render

        target = api.target(on, headroom)  # probed once for every cell
        rows = build(names, chosen, base, target, rule.value)
        if chart and target is None:
            raise InputError("--chart draws what fits on a target: name one with --on (not none)")
        c.write_chart(chart, force, lambda: _chart(rows, chosen, target, base, rule.value))
        c.print_doc(fmt, rows, lambda: render.matrix_table(rows, chosen, on, rule.value, base))
        c.print_chart_link(fmt, chart)


def _once(flag: str, items: list[str]) -> None:
    """A row or column named twice is an error: the table drew it twice, the JSON document (keyed by
    method) kept one."""
    from fitcheck.errors import InputError
    from fitcheck.terminal import clipped

    seen: set[str] = set()
    for item in items:
        if item.lower() in seen:
            raise InputError(f"{flag}: {clipped(item)!r} is given twice")
        seen.add(item.lower())


def _chart(
    rows: list[dict[str, Any]], methods: list[str], target: Any, base: dict[str, Any], rule: str
) -> Any:
    from fitcheck.chart.spec import matrix_chart
    from fitcheck.models import LlmSetup

    seq = base.get("seq_len") or LlmSetup.model_fields["seq_len"].default
    words = (
        "the seeds' rule of thumb"
        if rule == "thumb"
        else f"batch {base['batch_size']}, seq {seq}, {'ckpt' if base['grad_ckpt'] else 'no ckpt'}, "
        f"{base['optimizer']}, {base['trainer']} regime"
    )
    return matrix_chart(rows, methods, target.name, words)


def build(
    names: list[str], methods: list[str], base: dict[str, Any], target: Any, rule: str
) -> list[dict[str, Any]]:
    """One row per model: for each method, GiB needed and the verdict (None without a target)."""
    from fitcheck import api
    from fitcheck.engine.verdict import high_bytes, judge_bytes, paged_bytes

    rows: list[dict[str, Any]] = []
    for name in names:
        spec = api.resolve(name)
        if "qlora" in methods and api.kind_of(spec) == "diffusion":
            from fitcheck.errors import OptionError

            raise OptionError(
                f"--methods qlora: {name} is a diffusion model (QLoRA is for LLMs); give --methods full,lora"
            )
        _check_stored(name, spec, methods)
        row: dict[str, Any] = {"model": name}
        for method in methods:
            est = api.estimate(spec, on=target, **{**base, "method": method})
            thumb = rule == "thumb" and est.thumb is not None
            need = est.thumb.bytes if thumb and est.thumb else est.device_bytes
            high = need if thumb else high_bytes(est)  # the rule of thumb has no spread
            row[f"{method}_bytes"] = need
            row[f"{method}_high_bytes"] = high
            row[f"{method}_verdict"] = (
                judge_bytes(need, high, target.budget_bytes, 0 if thumb else paged_bytes(est))
                if target is not None
                else None
            )
        row["shape"] = _shape(est.setup)  # the same for every method of the row
        row["regime"] = _regime(est.setup)
        row["usable_bytes"] = target.usable_bytes if target is not None else None
        row["budget_bytes"] = target.budget_bytes if target is not None else None
        rows.append(row)
    return rows


def _check_stored(name: str, spec: Any, methods: list[str]) -> None:
    """A pre-quantized checkpoint trains only with adapters on its stored base (`sources.prequant`): the
    methods that cannot run on it are refused up front, naming ``--methods``."""
    from fitcheck.errors import OptionError
    from fitcheck.sources.prequant import read_prequant

    stored = read_prequant(spec.hf_config) if getattr(spec, "hf_config", None) else None
    if stored is None or stored.dequantized:
        return
    runs = {"lora", stored.method}
    off = [m for m in methods if m not in runs]
    if off:
        raise OptionError(
            f"--methods {off[0]}: {name} is a pre-quantized checkpoint ({stored.read}) that trains only with "
            f"adapters on its stored base; give --methods {','.join(sorted(runs))}"
        )


def _regime(setup: Any) -> str:
    """How the row's model trains: the trainer whose regime was modelled, the precision and attention
    (``generic · bf16 · attn sdpa``; a diffusion row trains under kohya's regime, fp32 weights under bf16
    autocast unless full_bf16: ``kohya · bf16 mixed · attn sdpa``)."""
    if setup.kind == "diffusion":
        prec = f"{setup.precision} {'weights' if setup.full_bf16 else 'mixed'}"
        return f"{setup.trainer} · {prec} · attn {setup.attn}"
    return f"{setup.trainer} · {setup.precision} · attn {setup.attn}"


def _shape(setup: Any) -> str:
    """What one sample is for the row: ``2048 tokens`` (an LLM) or ``1024 px`` (a diffusion model)."""
    return f"{setup.resolution} px" if setup.kind == "diffusion" else f"{setup.seq_len} tokens"
