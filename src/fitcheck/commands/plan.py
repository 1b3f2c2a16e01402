"""``fitcheck plan MODEL``: the fastest configuration that fits, explained, and trainer configs for it.

Thin command: parse, call `fitcheck.api.plan` (model, target, device speed, search), render, write the
``--emit`` files, return the exit code (the verdict's, as ``check``'s: 0 a plan fits, 0 with a warning
when the plan is only tight, 1 with ``--strict``; 1 when nothing fits; 2 trouble). pydantic, yaml and
rich are imported inside the command only.

No ``from __future__ import annotations`` here: the command is defined inside `register` with the
option types of `fitcheck.cli`, and typer must see those annotations as objects.
"""

import os
import re
import shlex
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from fitcheck.errors import FitcheckError, InputError, OptionError

if TYPE_CHECKING:
    from fitcheck.models import Target
    from fitcheck.planner.models import Plan
from fitcheck.terminal import printable
from fitcheck.units import MAX_DATASET_TOKENS

_COUNT_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


class PlanMethod(StrEnum):
    """``auto`` tries full fine-tuning, then LoRA, then QLoRA."""

    auto = "auto"
    full = "full"
    lora = "lora"
    qlora = "qlora"


def parse_tokens(text: str) -> int:
    """``--dataset-tokens 250M``: a token count with an optional K/M/B/T suffix."""
    m = _COUNT_RE.match(text)
    if not m:
        raise InputError(f"--dataset-tokens '{text}' is not a count: use e.g. 250M, 1.5B or 2000000")
    number = float(m.group(1)) * _SCALE[m.group(2).upper()]
    if not number <= MAX_DATASET_TOKENS:  # also inf (1e400): round() of it raised OverflowError
        cap = f"{MAX_DATASET_TOKENS // _SCALE['T']:,}T"
        raise InputError(f"--dataset-tokens '{text}' is too large: up to {cap} tokens")
    value = round(number)
    if value < 1:
        raise InputError(f"--dataset-tokens '{text}' must be at least 1 token")
    return value


def _trl_loss_note(result: "Plan", files: list[tuple[str, str | None, str]]) -> list[str]:
    """hf.yaml is run by ``trl sft``, whose fused LM head holds less than the whole logits a plan asked for
    with ``--loss standard`` sizes (without ``--loss`` it plans the head; docs/planner.md): say so once the
    file is written."""
    from fitcheck.models import LlmSetup

    setup = result.chosen.setup if result.chosen is not None else None
    if not any(kind == "hf.yaml" for kind, _, _ in files) or not isinstance(setup, LlmSetup):
        return []
    if setup.loss != "standard":
        return []
    return [
        "hf.yaml runs TRL's fused LM head, which holds less than the whole logits this plan sized: the file "
        "needs less than its estimated peak (--loss trl plans what trl sft holds)"
    ]


def resolve_emits(emits: list[str], fmt: str | None, output_dir: str) -> list[tuple[str, str | None]]:
    """(format, destination path or None for stdout) per ``--emit``; ``-o -`` sends one file to stdout."""
    from fitcheck.emitters import format_for

    if fmt is not None and not emits:
        raise OptionError("--emit-format needs --emit FILE (or --emit - for stdout)")
    if emits and not output_dir.strip():  # "" would write into the working folder unasked
        raise OptionError("-o/--output-dir is empty: give a folder (. for this one) or - for stdout")
    to_stdout = output_dir == "-"
    out: list[tuple[str, str | None]] = []
    for name in emits:
        if name != "-" and os.path.basename(name) in ("", ".", ".."):  # "a/", "..", "": a folder or nothing
            raise OptionError(f"--emit '{name}' is no file name: give one, e.g. run.hf.yaml")
        kind = format_for(name, fmt)
        if name == "-" or to_stdout:
            out.append((kind, None))
        else:
            out.append((kind, str(Path(output_dir) / name)))
    if sum(dest is None for _, dest in out) > 1:
        raise OptionError("stdout takes one file: give -o DIR to write several")
    kinds = [kind for kind, _ in out]
    twice = next((k for k in kinds if kinds.count(k) > 1), None)
    if twice is not None:  # one file per format: the others' launch lines name it
        named = " and ".join(n for n, (k, _) in zip(emits, out, strict=True) if k == twice)
        raise OptionError(f"--emit {named}: {twice} is asked twice; emit each format once")
    return out


def choose_trainer(explicit: str | None, kinds: list[str]) -> str:
    """``--trainer``, else the one trainer the emitted configs run, else hf (the TRL file)."""
    from fitcheck.emitters import DIFFUSION_ONLY, TRAINERS

    for kind in kinds:
        if kind in DIFFUSION_ONLY:
            raise OptionError(
                f"{kind} is a kohya sd-scripts config for diffusion models; for a language model emit "
                "hf.yaml, axolotl.yaml, llamafactory.yaml or mlx.yaml"
            )
    wanted = sorted({t for k in kinds if (t := TRAINERS[k]) is not None})
    if len(wanted) > 1:
        raise OptionError(
            f"{' and '.join(k for k in kinds if TRAINERS[k])} run different trainers, and one plan is "
            "estimated for one trainer: run fitcheck plan once per trainer"
        )
    if explicit is not None and wanted and wanted[0] != explicit:
        raise OptionError(f"--trainer {explicit} does not run {kinds[0]}; it needs --trainer {wanted[0]}")
    return explicit or (wanted[0] if wanted else "hf")


def _check_format_backend(kinds: list[str], trainer: str, backend: str) -> None:
    """A format whose trainer does not run on the target, named as the user wrote it (``--emit``)."""
    from fitcheck.planner.rules import TRAINER_BACKENDS

    kind = next((k for k in kinds if k != "env.sh"), None)
    if kind is None or backend in TRAINER_BACKENDS[trainer]:
        return
    from fitcheck.emitters import TRAINERS

    where = {"mps": "Apple silicon", "cpu": "a CPU", "cuda": "NVIDIA GPUs", "rocm": "AMD GPUs"}[backend]
    fit = [
        k
        for k in ("hf.yaml", "axolotl.yaml", "llamafactory.yaml", "mlx.yaml")
        if k != kind and backend in TRAINER_BACKENDS[TRAINERS[k] or "hf"]
    ]
    runs = " and ".join(TRAINER_BACKENDS[trainer])
    raise OptionError(f"{kind} is a config for {runs} only, not for {where}; emit {' or '.join(fit)}")


def reproduce(model: str, opts: dict[str, Any], emit_name: str) -> str:
    """The ``fitcheck plan`` line that writes the same file (non-default options only)."""
    parts = ["fitcheck", "plan", model]
    for flag, value in opts.items():
        if value is None or value is False:
            continue
        parts += [flag] if value is True else [flag, str(value)]
    parts += ["--emit", emit_name]
    return shlex.join(parts)


def model_reference(model: str, spec: Any) -> str | None:
    """What a trainer loads: the preset's Hugging Face id, or the local folder the model came from."""
    if spec.source_kind == "preset":
        return spec.hf_id if spec.hf_id else None
    if spec.source_kind == "size":
        return None
    path = Path(model)
    folder = path if path.is_dir() else path.parent
    return str(folder)


def plan_options(kw: dict[str, Any]) -> dict[str, Any]:
    """The command's values as `fitcheck.api.plan` options (``--dataset-tokens 250M`` counted)."""
    opts = {k: v for k, v in kw.items() if k not in ("on", "headroom", "canonical")}
    if opts.get("dataset_tokens") is not None:
        opts["dataset_tokens"] = parse_tokens(opts["dataset_tokens"])
    return opts


def emit_files(
    plan: Any,
    spec: Any,
    model: str,
    wanted: list[tuple[str, str | None]],
    canonical: dict[str, Any],
    implied_trainer: str | None = None,
) -> list[tuple[str, str | None, str]]:
    """Every ``--emit`` through the one emitter protocol: (format, destination or None, text) per file.

    ``implied_trainer``: the trainer the other emitted configs fixed (no ``--trainer`` given); the
    reproduce line of a trainer-neutral file (env.sh) names it, since alone it would be planned for hf.
    """
    from fitcheck import emitters
    from fitcheck.emitters.common import EmitContext

    ref = model_reference(model, spec)
    files: list[tuple[str, str | None, str]] = []
    names = {kind: (Path(dest).name if dest else kind) for kind, dest in wanted}  # the launch line's
    for kind, dest in wanted:
        em = emitters.get(kind)
        name = names[kind]
        flags = canonical
        if emitters.TRAINERS[kind] is None and implied_trainer is not None:
            flags = {**canonical, "--trainer": implied_trainer}
        command = reproduce(model, flags, name)
        ctx = EmitContext(spec=spec, model_ref=ref, command=command, filename=name, files=names)
        em.check(plan, ctx)
        folder = Path(dest).parent if dest else None
        for fname, text in em.emit(plan, ctx).items():
            files.append((kind, str(folder / fname) if folder is not None else None, text))
    return files


@dataclass(frozen=True)
class Output:
    """Where the plan goes: the ``--emit`` files, the format, the chart."""

    emit: list[str]
    emit_format: str | None
    output_dir: str
    force: bool
    fmt: str
    chart: str | None
    verbose: bool
    strict: bool = False


def _check_emits(spec: Any, kinds: list[str], trainer: str | None, out: Output) -> str:
    """The trainer the plan is estimated for, after refusing formats the model's kind cannot use."""
    from fitcheck import api

    if api.kind_of(spec) == "llm":
        return choose_trainer(trainer, kinds)
    for kind in kinds:
        if kind != "kohya.toml":
            raise OptionError(
                f"{kind} is a config for LLM trainers; for {spec.id} (a diffusion model) use "
                "--emit kohya.toml"
            )
    if "-" in out.emit or (out.emit and out.output_dir == "-"):
        raise OptionError(
            "kohya.toml is two files (the config names its dataset.toml by path): give -o DIR, not stdout"
        )
    return trainer or "kohya"


def run_plan(
    model: str, spec: Any, kw: dict[str, Any], out: Output, tgt: "Target | None"
) -> tuple[Any, list[Any]]:
    """Plan any model on ``tgt`` (resolved once, by `run_command`) and (when it chose a configuration: it
    fits, or is tight) render the emitted files; returns (plan, [(kind, dest, text)])."""
    from fitcheck import api
    from fitcheck.progress import StderrProgress, reporting

    wanted = resolve_emits(out.emit, out.emit_format, out.output_dir)
    kinds = [k for k, _ in wanted]
    trainer = _check_emits(spec, kinds, kw["trainer"], out)
    llm = api.kind_of(spec) == "llm"
    if llm and kw["trainer"] is None and tgt is not None:
        _check_format_backend(kinds, trainer, tgt.backend)
    opts = {**plan_options(kw), "trainer": trainer if llm else kw["trainer"]}
    if llm and "hf.yaml" in kinds and opts.get("loss") is None:
        from fitcheck.emitters.hf import OWN_LOSS

        opts["loss"] = OWN_LOSS["hf"]  # the file is run by trl sft: plan what its loss holds
    where = tgt.id if tgt is not None else "no memory limit"
    with StderrProgress(f"planning {spec.id} on {where}") as progress, reporting(progress):
        plan = api.plan(spec, tgt, headroom=kw["headroom"], **opts)
    implied = trainer if llm and kw["trainer"] is None and trainer != "hf" else None
    chose = plan.chosen is not None
    files = emit_files(plan, spec, model, wanted, kw["canonical"], implied) if chose else []
    return plan, files


#: Options of the ``plan`` command beyond `fitcheck.api.PlanOptions` that shape the plan; the others say
#: where the answer goes (`Output`).
PLAN_TARGET_KW = ("on", "headroom")

OnPlanO = Annotated[
    str,
    typer.Option("--on", help="target: auto (this machine), catalog id (rtx-4090), 24GB, 36GB-unified, cpu"),
]
MethodPO = Annotated[
    PlanMethod, typer.Option("--method", "-m", help="auto: full if it fits, then LoRA, then QLoRA")
]
EffO = Annotated[
    int | None,
    typer.Option(
        "--effective-batch",
        help="examples per optimizer step: micro-batch x accumulation x GPUs [default: 16 for LLMs, "
        "1 for diffusion]",
        min=1,
    ),
]
MinResO = Annotated[
    int | None,
    typer.Option(
        "--min-resolution", help="diffusion: lowest resolution to fall back to [default: --resolution]"
    ),
]
MinSeqO = Annotated[
    int | None,
    typer.Option("--min-seq-len", help="shortest length to fall back to [default: --seq-len, never shorter]"),
]
MicroO = Annotated[
    int | None, typer.Option("--batch-size", "-b", help="fix the micro-batch [default: searched]")
]
CkptPO = Annotated[
    bool | None, typer.Option("--grad-ckpt/--no-grad-ckpt", help="fix checkpointing [default: searched]")
]
EmitO = Annotated[
    list[str] | None,
    typer.Option(
        "--emit",
        help="write a config: hf.yaml, axolotl.yaml, llamafactory.yaml, mlx.yaml, env.sh (LLMs); "
        "kohya.toml (diffusion: writes dataset.toml beside it)",
    ),
]
EmitFmtO = Annotated[
    str | None, typer.Option("--emit-format", help="format of --emit files whose names do not say it")
]
OutO = Annotated[str, typer.Option("--output-dir", "-o", help="folder for --emit files, or - for stdout")]
ForceO = Annotated[bool, typer.Option("--force", help="overwrite existing files")]
TokensO = Annotated[
    str | None, typer.Option("--dataset-tokens", help="tokens in the dataset (250M, 1.5B): time per run")
]
EpochsO = Annotated[float | None, typer.Option("--epochs", help="passes over the dataset [default: 1]")]


def _shaping() -> set[str]:
    """The plan options that shape the search: `api.PlanOptions` and the target's keywords."""
    from fitcheck.api import PlanOptions

    return {*PlanOptions.__annotations__, *PLAN_TARGET_KW}


#: Shared training options (cli._training_template) that plan does not take: the search decides the
#: accumulation, and these setups are estimated, not planned.
NOT_PLANNED = (
    "grad_accum", "cache_latents", "cache_text_encoder_outputs", "train_text_encoder", "full_bf16",
    "full_fp16", "base_quant", "train_modules", "task", "num_labels", "target_len", "image_tokens",
    "bnb_keeps_input", "ckpt_reentrant", "keep_grads",
)  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add ``fitcheck plan`` to the CLI, with the setup options of ``estimate`` that make sense."""
    from fitcheck import cli as c

    @app.command()
    @c.training_options(exclude=NOT_PLANNED)
    def plan(
        model: c.ModelOptArg = None,
        on: OnPlanO = "auto",
        from_file: c.FromO = None,
        from_format: c.FromFmtO = None,
        method: MethodPO = PlanMethod.auto,
        effective_batch: EffO = None,
        min_seq_len: MinSeqO = None,
        min_resolution: MinResO = None,
        batch_size: MicroO = None,
        precision: Annotated[c.PrecisionOpt | None, typer.Option(help="fix the compute dtype")] = None,
        optimizer: Annotated[c.OptimizerOpt | None, typer.Option(help="fix the optimizer")] = None,
        grad_ckpt: CkptPO = None,
        attn: Annotated[c.AttnOpt | None, typer.Option(help="fix the attention kernel")] = None,
        trainer: c.TrainerPO = None,
        offload: c.OffloadPO = None,
        headroom: c.HeadroomO = None,
        emit: EmitO = None,
        emit_format: EmitFmtO = None,
        output_dir: OutO = ".",
        force: ForceO = False,
        dataset_tokens: TokensO = None,
        epochs: EpochsO = None,
        fmt: c.FmtO = c.Fmt.table,
        chart: c.ChartO = None,
        verbose: c.VerboseO = False,
        strict: c.StrictO = False,
        training: dict[str, Any] | None = None,
    ) -> None:
        """The fastest configuration that fits (exit 0), else the tight one whose likely range reaches
        least (exit 0 with a warning; 1 with --strict); 1 when none fits. With reasons and configs."""
        _dispatch({**(training or {}), **locals()})


def _dispatch(args: dict[str, Any]) -> None:
    """Run ``fitcheck plan`` from its parsed arguments: the shaping options (api.PlanOptions and the
    target's), the output settings, then the command; exit with its code."""
    from fitcheck import cli as c

    kw = c.plain(**{k: v for k, v in args.items() if k in _shaping()})
    a = args
    out = Output(
        list(a["emit"] or []),
        a["emit_format"],
        a["output_dir"],
        a["force"],
        a["fmt"].value,
        a["chart"],
        a["verbose"],
        a["strict"],
    )
    if code := run_command(a["model"], kw, a["from_file"], a["from_format"], out):
        raise typer.Exit(code=code)


def run_command(model: str | None, kw: dict[str, Any], from_file: str | None, from_format: str | None,
                out: Output) -> int:  # fmt: skip
    """``fitcheck plan`` after parsing: resolve, plan, write the files, render; the exit code."""
    from fitcheck import api
    from fitcheck import cli as c

    model, prov, per_process = plan_from(model, kw, from_file, from_format)
    spec = api.resolve(model)
    api.refuse_foreign(spec, kw)
    tgt = api.target(kw["on"], kw["headroom"], kw["gpus"])
    if api.is_auto(kw["on"]):
        api.refuse_gpu_run_here(tgt, kw, trainer_too=True)
    if per_process is not None:
        kw["effective_batch"] = per_process * _ranks(kw, tgt)
    kw["canonical"] = _canonical(kw)
    if (out.output_dir == "-" or "-" in out.emit) and out.fmt != "table":
        how = "-o -" if out.output_dir == "-" else "--emit -"
        raise OptionError(f"{how} puts the emitted file on stdout; it cannot also carry --format {out.fmt}")
    try:
        result, files = run_plan(model, spec, kw, out, tgt)
    except FitcheckError as exc:  # one line, naming the file a value came from
        raise (prov.blame(exc) if prov is not None else exc) from None
    if prov is not None:  # the report once the plan was made (an error stays one line)
        prov.say()
    _check_destinations(files, out.force, out.chart)
    _write(files, out.force)  # files first: a reader leaving early never stops them being written
    c.write_chart(out.chart, out.force, lambda: _plan_chart(result))
    _render(result, out.fmt, to_stderr=any(dest is None for _, dest, _ in files), verbose=out.verbose)
    _print_files(files)
    c.print_chart_link(c.Fmt(out.fmt), out.chart)
    for w in [*result.warnings, *_trl_loss_note(result, files)]:
        sys.stderr.write(f"fitcheck: warning: {printable(w)}\n")
    if result.verdict == "tight" and result.estimate is not None and result.estimate.target is not None:
        from fitcheck import render

        c.warn_tight(render.verdict_words(result.estimate.target.model_dump()), out.strict)
    if out.emit and result.chosen is None:
        sys.stderr.write("fitcheck: nothing written: no configuration fits\n")
    return c.verdict_exit(result.verdict, out.strict)


#: What a ``--from`` file fixes for the planner; the rest (micro-batch, checkpointing, optimizer,
#: attention, precision) stays searched unless given on the command line.
PLAN_FIXED = ("method", "dora", "lora_fa", "lora_rank", "lora_alpha", "lora_targets", "lora_dropout",
              "double_quant", "master_weights", "autocast", "compile", "kbit_prep", "kbit_path",
              "keep_logits", "padding_free", "lengths", "seq_len", "resolution", "trainer", "gpus",
              "zero_bucket_size",
              "zero_overlap_comm")  # fmt: skip


def plan_from(
    model: str | None, kw: dict[str, Any], path: str | None, fmt: str | None
) -> tuple[str, Any, int | None]:
    """Apply a ``--from`` file to the plan options in ``kw`` (command line first): MODEL, the merge, and
    the file's batch per process (micro-batch x accumulation; None when the file sets none or
    ``--effective-batch`` is given).

    The file fixes the model, method, LoRA shape, sequence length or resolution, trainer and GPUs,
    and the effective batch (its batch per process x every rank: `_ranks`); the planner searches the rest.
    """
    from fitcheck import cli as c
    from fitcheck._clicompat import given_parameters

    if path is None and fmt is None:
        if model is None:
            raise InputError("give MODEL (or --from FILE naming one)")
        return model, None, None
    given = given_parameters()
    setup_kw = {k: v for k, v in kw.items() if k in PLAN_FIXED or k in ("batch_size", "grad_accum")}
    if setup_kw.get("method") == "auto":
        setup_kw["method"] = None
    prov = c.merge_from(model, setup_kw, path, fmt, given)
    for name in PLAN_FIXED:
        if name not in given and prov.origin.get(name) in ("file", "trainer default") and name in prov.values:
            kw[name] = prov.values[name]
    per_process = None
    if "effective_batch" not in given and prov.origin.get("batch_size") == "file":
        per_process = int(prov.values["batch_size"]) * int(prov.values.get("grad_accum", 1))
    return prov.model, prov, per_process


def _ranks(kw: dict[str, Any], tgt: "Target | None") -> int:
    """The processes a plan runs: the target's GPUs (``--on 2xh100-80gb``, ``--gpus`` or a ``--from``
    file's) times ``--nodes`` (the command line's; a file's are not fixed)."""
    gpus = tgt.gpus if tgt is not None else int(kw.get("gpus") or 1)
    return gpus * int(kw.get("nodes") or 1)


def _canonical(kw: dict[str, Any]) -> dict[str, Any]:
    """The options that shape the plan, as flags, in a stable order (for the reproduce line)."""
    ckpt = {True: "--grad-ckpt", False: "--no-grad-ckpt", None: None}[kw["grad_ckpt"]]
    flags: dict[str, Any] = {
        "--on": kw["on"],
        "--method": kw["method"] if kw["method"] != "auto" else None,
        "--effective-batch": kw["effective_batch"],
        "--seq-len": kw["seq_len"],
        "--min-seq-len": kw["min_seq_len"],
        "--batch-size": kw["batch_size"],
        "--precision": kw["precision"],
        "--optimizer": kw["optimizer"],
        "--attn": kw["attn"],
        "--dora": kw["dora"],
        "--lora-fa": kw.get("lora_fa", False),
        "--master-weights": kw["master_weights"],
        "--lora-rank": kw["lora_rank"],
        "--lora-alpha": kw["lora_alpha"],
        "--lora-targets": kw["lora_targets"],
        "--lora-dropout": kw["lora_dropout"],
        "--no-double-quant": not kw["double_quant"],
        "--autocast": kw.get("autocast") is True,
        "--no-autocast": kw.get("autocast") is False,
        "--compile": kw.get("compile") is True,
        "--no-compile": kw.get("compile") is False,
        "--kbit-prep": kw.get("kbit_prep") is True,
        "--no-kbit-prep": kw.get("kbit_prep") is False,
        "--kbit-path": kw.get("kbit_path"),
        "--keep-logits": kw.get("keep_logits", False),
        "--padding-free": kw.get("padding_free", False),
        "--lengths": kw.get("lengths") if kw.get("lengths", "fixed") != "fixed" else None,
        "--loss": kw.get("loss"),
        "--offload-activations": kw.get("offload_activations", False),
        "--optimizer-in-backward": kw.get("optimizer_in_bwd", False),
        "--optimizer-impl": kw.get("optimizer_impl"),
        "--trainer": kw["trainer"],
        "--fp8-base": kw.get("fp8_base", False),
        "--gpus": kw["gpus"] if kw["gpus"] != 1 else None,
        "--strategy": kw["strategy"],
        "--offload": kw["offload"],
        "--nodes": kw["nodes"] if kw["nodes"] != 1 else None,
        "--fsdp-version": kw["fsdp_version"] if kw["fsdp_version"] != 2 else None,
        "--device-map-version": kw["device_map_version"] if kw["device_map_version"] != 5 else None,
        "--moe-layout": kw.get("moe_layout") if kw.get("moe_layout", "fused") != "fused" else None,
        "--fsdp-embedding-units": kw.get("fsdp_embedding_units", False),
        "--zero-bucket-size": kw.get("zero_bucket_size"),
        "--zero-overlap-comm": kw.get("zero_overlap_comm") is True,
        "--no-zero-overlap-comm": kw.get("zero_overlap_comm") is False,
        "--quant-storage": kw["quant_storage"],
        "--host-memory": kw["host_memory"],
        "--headroom": kw["headroom"],
        "--dataset-tokens": kw["dataset_tokens"],
        "--epochs": kw["epochs"],
    }
    if ckpt:
        flags[ckpt] = True
    return flags


def _render(plan: Any, fmt: str, to_stderr: bool, verbose: bool = False) -> None:
    from fitcheck import render

    if fmt == "table":
        render.plan_table(plan, stderr=to_stderr, verbose=verbose)
    elif fmt == "markdown":
        sys.stdout.write(render.plan_markdown(plan))
    else:
        sys.stdout.write(render.dump(render.plan_doc(plan), fmt))


def _plan_chart(result: Any) -> Any:
    """The plan's chart: the chosen configuration against its runners-up (or the changes)."""
    from fitcheck.chart.spec import plan_chart

    return plan_chart(result)


def _check_destinations(
    files: list[tuple[str, str | None, str]], force: bool, chart: str | None = None
) -> None:
    """Refuse before writing or printing anything: an existing file without --force, a folder in the way."""
    from fitcheck.cli import chart_given
    from fitcheck.emitters.writer import check_destinations

    paths = [Path(dest) for _, dest, _ in files if dest is not None]
    if chart_given(chart) and chart is not None:
        from fitcheck.chart import chart_path

        paths.append(chart_path(chart))
    check_destinations(paths, force)


def _write(files: list[tuple[str, str | None, str]], force: bool) -> None:
    from fitcheck.emitters.writer import write_all

    on_disk = [(Path(dest), text) for _, dest, text in files if dest is not None]
    for path in write_all(on_disk, force):
        sys.stderr.write(f"fitcheck: wrote {printable(str(path))}\n")


def _print_files(files: list[tuple[str, str | None, str]]) -> None:
    """``-o -``: the emitted file is the answer on stdout (after every file on disk is written)."""
    from fitcheck.emitters.writer import write_stdout

    for _, dest, text in files:
        if dest is None:
            write_stdout(text)
