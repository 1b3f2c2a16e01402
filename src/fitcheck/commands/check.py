"""``fitcheck check MODEL --on HW``: the fit question for scripts and CI.

Exit 0 when the run fits (also ``tight`` unless ``--strict``), 1 when it does not fit, 2 for trouble.
``--on`` is required: a CI runner without a GPU would otherwise be sized against its own RAM.
``--format json`` prints the same document as ``estimate``.

No ``from __future__ import annotations``: typer must see the option types as objects.
"""

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add the ``check`` command."""
    from fitcheck import cli as c

    @app.command()
    def check(
        model: c.ModelArg,
        on: Annotated[
            str, typer.Option("--on", help="target (required): catalog id, 24GB, 36GB-unified, 2x4090, auto")
        ],
        strict: Annotated[bool, typer.Option("--strict", help="exit 1 for 'tight' too")] = False,
        method: c.MethodO = c.MethodOpt.lora,
        dora: c.DoraO = False,
        batch_size: c.BatchO = 1,
        grad_accum: c.AccumO = 1,
        seq_len: c.SeqO = 2048,
        resolution: c.ResO = None,
        precision: c.PrecO = c.PrecisionOpt.bf16,
        master_weights: c.MasterO = False,
        optimizer: c.OptO = c.OptimizerOpt.adamw,
        grad_ckpt: c.CkptO = False,
        attn: c.AttnO = c.AttnOpt.sdpa,
        lora_rank: c.RankO = None,
        lora_alpha: c.AlphaO = None,
        lora_targets: c.TargetsO = None,
        lora_dropout: c.DropO = None,
        double_quant: c.DQO = True,
        trainer: c.TrainerO = c.TrainerOpt.generic,
        gpus: c.GpusO = 1,
        headroom: c.HeadroomO = None,
        fmt: c.FmtO = c.Fmt.table,
    ) -> int:
        """Does it fit? Exit 0 fits (and tight unless --strict), 1 does not fit, 2 trouble."""
        kw = c._common(
            method=method, dora=dora, batch_size=batch_size, grad_accum=grad_accum, seq_len=seq_len,
            resolution=resolution, precision=precision, master_weights=master_weights, optimizer=optimizer,
            grad_ckpt=grad_ckpt, attn=attn, lora_rank=lora_rank, lora_alpha=lora_alpha,
            lora_targets=lora_targets, lora_dropout=lora_dropout, double_quant=double_quant,
            trainer=trainer, gpus=gpus,
        )  # fmt: skip
        spec, est = c.run_estimate(model, kw, on, headroom)
        from fitcheck import render

        c._emit(fmt, render.estimate_doc(est), lambda: render.estimate_table(est, spec))
        return exit_code(est.target.verdict, strict)


def exit_code(verdict: str, strict: bool) -> int:
    """0 fits (tight too unless strict), 1 does not fit."""
    if verdict == "fits" or (verdict == "tight" and not strict):
        return 0
    return 1
