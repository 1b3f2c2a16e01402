"""``fitcheck check MODEL --on HW``: the fit question for scripts and CI.

Exit 0 when the run fits, 0 with a warning on stderr when it is ``tight`` (the estimate fits, the
upper edge of its band does not; 1 with ``--strict``), 1 when it does not fit, or when the node's
CPU RAM cannot hold what it needs there (``target.host_verdict``: offload, loading), as ``plan`` judges a
node; 2 for trouble.
``--on`` is required: a CI runner without a GPU would otherwise be sized against its own RAM; ``--on
none`` is trouble (exit 2), since ``check`` exists to give a verdict.
``--format json`` prints the same document as ``estimate``.

No ``from __future__ import annotations``: typer must see the option types as objects.
"""

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fitcheck.errors import FitcheckError

if TYPE_CHECKING:
    from fitcheck.models import Estimate


def register(app: typer.Typer) -> None:
    """Add the ``check`` command."""
    from fitcheck import cli as c

    @app.command()
    @c.training_options()
    def check(
        model: c.ModelOptArg = None,
        *,
        on: Annotated[
            str, typer.Option("--on", help="target (required): catalog id, 24GB, 36GB-unified, 2x4090, auto")
        ],
        strict: c.StrictO = False,
        from_file: c.FromO = None,
        from_format: c.FromFmtO = None,
        headroom: c.HeadroomO = None,
        rule: c.RuleO = c.RuleOpt.detailed,
        fmt: c.FmtO = c.Fmt.table,
        chart: c.ChartO = None,
        force: c.ChartForceO = False,
        verbose: c.VerboseO = False,
        training: dict[str, Any],
    ) -> int:
        """Does it fit? Exit 0 fits (and tight unless --strict), 1 does not fit, 2 trouble."""
        from fitcheck import api, render
        from fitcheck._clicompat import given_parameters

        given = given_parameters()
        prov = c.merge_from(model, training, from_file, from_format, given)
        spec = api.resolve(prov.model)
        try:
            est = api.check(spec, on, headroom=headroom, **prov.values)
        except FitcheckError as exc:
            raise prov.blame(exc) from None
        assert est.target is not None
        prov.say()
        if rule is c.RuleOpt.thumb:  # design.md: --rule thumb judges the rule of thumb's figure
            from fitcheck.engine.verdict import thumb_verdict
            from fitcheck.errors import OptionError

            if est.thumb is None:
                raise OptionError(
                    "--rule thumb: the source documents give no rule of thumb for diffusion models"
                )
            judged = thumb_verdict(est)
            assert judged is not None
            c.print_doc(fmt, render.thumb_doc(est, judged), lambda: render.thumb_table(est, judged, verbose))
            return c.verdict_exit(judged.verdict, strict)
        c.write_chart(chart, force, lambda: c.estimate_chart(est))
        doc = c.with_origin(render.estimate_doc(est), est, prov, given)
        c.print_doc(fmt, doc, lambda: render.estimate_table(est, spec, verbose))
        c.print_chart_link(fmt, chart)
        if _host_short(est):
            return 1
        if est.target.verdict == "tight":
            c.warn_tight(render.verdict_words(est.target.model_dump()), strict)
        return c.verdict_exit(est.target.verdict, strict)


def _host_short(est: "Estimate") -> bool:
    """Whether the node's CPU RAM cannot hold what the run keeps there (``target.host_verdict``), said in
    one stderr line: ``plan`` judges such a node ``does_not_fit`` (planner.loop.fit_verdict), never tight."""
    target = est.target
    if target is None or target.host_verdict != "does_not_fit":
        return False
    from fitcheck.units import fmt_gib

    need, have = fmt_gib(est.host_bytes or 0), fmt_gib(target.host_budget_bytes or 0)
    sys.stderr.write(
        f"fitcheck: does not fit: the node's CPU RAM cannot hold what the run keeps there ({need} "
        f"needed, {have} there; --host-memory sets it)\n"
    )
    return True
