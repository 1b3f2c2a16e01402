"""Command-line interface: parse, call the core, render, return an exit code. No arithmetic here.

Start-up is kept lean: ``fitcheck --help`` imports typer (click) and nothing heavier; pydantic, yaml
and rich are imported inside the commands that need them, torch only by ``measure``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import Enum, StrEnum
from typing import Annotated, Any

import typer

from fitcheck.errors import ExitCode, FitcheckError

app = typer.Typer(
    name="fitcheck",
    help=(
        "How much memory will a training run need, will it fit, and what settings should I use?\n\n"
        "Memory is shown in GiB. Sizes you type (24GB, 24GiB) both mean GiB, because GPU and Mac memory "
        "is sold in binary units (an RTX 4090's 24 GB is 24,564 MiB as the driver reports it).\n\n"
        "Exit codes: 0 answered / fits, 1 does not fit (check, plan), 2 trouble. Add --debug for a traceback."
    ),
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


class Fmt(StrEnum):
    table = "table"
    json = "json"
    yaml = "yaml"
    markdown = "markdown"


class MethodOpt(StrEnum):
    full = "full"
    lora = "lora"
    qlora = "qlora"


class PrecisionOpt(StrEnum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class OptimizerOpt(StrEnum):
    adamw = "adamw"
    adamw8bit = "adamw8bit"
    paged_adamw8bit = "paged-adamw8bit"
    adafactor = "adafactor"
    lion = "lion"
    lion8bit = "lion8bit"
    prodigy = "prodigy"
    sgd = "sgd"


class AttnOpt(StrEnum):
    eager = "eager"
    sdpa = "sdpa"
    flash = "flash"
    xformers = "xformers"


class TrainerOpt(StrEnum):
    generic = "generic"
    hf = "hf"
    torchtune = "torchtune"
    axolotl = "axolotl"
    llamafactory = "llamafactory"
    mlx = "mlx"
    kohya = "kohya"


class RuleOpt(StrEnum):
    detailed = "detailed"
    thumb = "thumb"


ModelArg = Annotated[
    str,
    typer.Argument(
        help="a size (7B, 1.5B, 350M), a preset id, a HF model or diffusers folder, config.json or "
        "*.safetensors"
    ),
]
MethodO = Annotated[MethodOpt, typer.Option("--method", "-m", help="full (also pre-training), lora, qlora")]
DoraO = Annotated[
    bool, typer.Option("--dora", help="DoRA on top of LoRA (adds a magnitude vector per module)")
]
BatchO = Annotated[int, typer.Option("--batch-size", "-b", help="micro-batch size")]
AccumO = Annotated[int, typer.Option("--grad-accum", help="gradient accumulation steps (no memory cost)")]
SeqO = Annotated[int | None, typer.Option("--seq-len", "-s", help="tokens per example (LLM) [default: 2048]")]
ResO = Annotated[
    int | None, typer.Option("--resolution", help="image side in pixels (diffusion models only)")
]
PrecO = Annotated[PrecisionOpt, typer.Option("--precision", help="compute dtype")]
MasterO = Annotated[
    bool, typer.Option("--master-weights", help="keep an fp32 master copy of trainable weights")
]
OptO = Annotated[OptimizerOpt, typer.Option("--optimizer", help="optimizer")]
CkptO = Annotated[bool, typer.Option("--grad-ckpt/--no-grad-ckpt", help="gradient checkpointing")]
AttnO = Annotated[AttnOpt, typer.Option("--attn", help="attention kernel")]
RankO = Annotated[
    int | None, typer.Option("--lora-rank", help="LoRA rank (kohya's network_dim) [default: 16]")
]
AlphaO = Annotated[float | None, typer.Option("--lora-alpha", help="LoRA alpha [default: 2 x rank]")]
TargetsO = Annotated[
    str | None, typer.Option("--lora-targets", help="attn, all-linear, or module names [default: all-linear]")
]
DropO = Annotated[float | None, typer.Option("--lora-dropout", help="LoRA dropout [default: 0]")]
DQO = Annotated[bool, typer.Option("--double-quant/--no-double-quant", help="QLoRA double quantization")]
TrainerO = Annotated[TrainerOpt, typer.Option("--trainer", help="whose implementation details to model")]
OnO = Annotated[
    str,
    typer.Option(
        "--on",
        help="target: catalog id (rtx-4090), 24GB, 36GB-unified, 2x4090, auto (detect this machine), cpu, "
        "or none (no verdict)",
    ),
]
GpusO = Annotated[int, typer.Option("--gpus", help="data-parallel GPUs (each holds a full replica)")]
HeadroomO = Annotated[
    str | None, typer.Option("--headroom", help="safety margin kept free, e.g. 2GB or 10% (default none)")
]
FmtO = Annotated[Fmt, typer.Option("--format", "-f", help="output format")]
CacheLatO = Annotated[
    bool, typer.Option("--cache-latents", help="diffusion: VAE encodes before training (off the GPU)")
]
CacheTEO = Annotated[
    bool, typer.Option("--cache-text-encoder-outputs", help="diffusion: text encoders off the GPU")
]
TrainTEO = Annotated[
    bool, typer.Option("--train-text-encoder", help="diffusion: train the text encoder(s) too")
]
Fp8O = Annotated[
    bool, typer.Option("--fp8-base", help="diffusion: frozen base weights in fp8 (kohya fp8_base)")
]
FullBf16O = Annotated[bool, typer.Option("--full-bf16", help="diffusion: bf16 weights and grads (kohya)")]
FullFp16O = Annotated[bool, typer.Option("--full-fp16", help="diffusion: fp16 weights and grads (kohya)")]
VerboseO = Annotated[
    bool, typer.Option("--verbose", "-v", help="also show sources, capture notes and the band's basis")
]
RuleO = Annotated[
    RuleOpt, typer.Option("--rule", help="detailed engine or the source documents' rule of thumb")
]


def print_doc(fmt: Fmt, data: Any, table: Callable[[], None]) -> None:
    """Print a command's answer: the rich table, or exactly one JSON/YAML/markdown document."""
    from fitcheck import render

    if fmt is Fmt.table:
        table()
    else:
        sys.stdout.write(render.dump(data, fmt.value))


def plain(**kw: Any) -> dict[str, Any]:
    """Option values as plain data (enum members as their strings)."""
    return {k: (v.value if isinstance(v, Enum) else v) for k, v in kw.items()}


def _training_template(
    method: MethodO = MethodOpt.lora,
    dora: DoraO = False,
    batch_size: BatchO = 1,
    grad_accum: AccumO = 1,
    seq_len: SeqO = None,
    resolution: ResO = None,
    cache_latents: CacheLatO = False,
    cache_text_encoder_outputs: CacheTEO = False,
    train_text_encoder: TrainTEO = False,
    fp8_base: Fp8O = False,
    full_bf16: FullBf16O = False,
    full_fp16: FullFp16O = False,
    precision: PrecO = PrecisionOpt.bf16,
    master_weights: MasterO = False,
    optimizer: OptO = OptimizerOpt.adamw,
    grad_ckpt: CkptO = False,
    attn: AttnO = AttnOpt.sdpa,
    lora_rank: RankO = None,
    lora_alpha: AlphaO = None,
    lora_targets: TargetsO = None,
    lora_dropout: DropO = None,
    double_quant: DQO = True,
    trainer: TrainerO = TrainerOpt.generic,
    gpus: GpusO = 1,
) -> None:
    """The training options every command that sizes a run takes (one vocabulary, design.md s.2)."""


def training_options(*, exclude: tuple[str, ...] = ()) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the shared training options (`_training_template`), minus ``exclude``.

    The command declares its own parameters plus ``training: dict`` and receives the shared options
    there (enum values as plain strings); its own parameters of the same name win. typer reads the
    combined signature, so ``--help`` lists every option once.
    """
    import functools
    import inspect

    shared = list(inspect.signature(_training_template, eval_str=True).parameters.values())

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        own = [p for n, p in sig.parameters.items() if n != "training"]
        own_names = {p.name for p in own}
        extra = [
            p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
            for p in shared
            if p.name not in own_names and p.name not in exclude
        ]
        positional = [p for p in own if p.default is inspect.Parameter.empty]
        optional = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in own if p not in positional]
        extra_names = {p.name for p in extra}

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            training = plain(**{k: v for k, v in kwargs.items() if k in extra_names})
            rest = {k: v for k, v in kwargs.items() if k not in extra_names}
            return fn(*args, **rest, training=training)

        wrapper.__signature__ = sig.replace(parameters=[*positional, *extra, *optional])  # type: ignore[attr-defined]
        return wrapper

    return deco


@app.command()
@training_options()
def estimate(
    model: ModelArg,
    on: OnO = "auto",
    headroom: HeadroomO = None,
    rule: RuleO = RuleOpt.detailed,
    fmt: FmtO = Fmt.table,
    verbose: VerboseO = False,
    *,
    training: dict[str, Any],
) -> None:
    """Memory breakdown of one training step, with the rule of thumb beside it (and a verdict with --on)."""
    from fitcheck import api, render

    spec = api.resolve(model)
    est = api.estimate(spec, on=on, headroom=headroom, **training)
    if rule is RuleOpt.thumb:
        if est.thumb is None:
            from fitcheck.errors import OptionError

            raise OptionError("--rule thumb: the source documents give no rule of thumb for diffusion models")
        from fitcheck.engine.verdict import thumb_verdict

        judged = thumb_verdict(est)
        data = render.thumb_doc(est, judged)
        print_doc(fmt, data, lambda: render.thumb_table(est, judged, verbose))
        return
    print_doc(fmt, render.estimate_doc(est), lambda: render.estimate_table(est, spec, verbose))


@app.command()
def models(fmt: FmtO = Fmt.table) -> None:
    """List the model presets (LLMs and diffusion pipelines)."""
    from fitcheck import api, render

    rows = api.models()
    print_doc(fmt, [r.model_dump(mode="json") for r in rows], lambda: render.models_table(rows))


def _register_optional() -> None:
    """Commands that live in their own modules (hardware, measure, planner)."""
    import importlib

    for name in ("hw", "check", "matrix", "measure", "plan"):
        try:
            mod = importlib.import_module(f"fitcheck.commands.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"fitcheck.commands.{name}":
                raise
            continue
        mod.register(app)


_register_optional()


def main(argv: list[str] | None = None) -> int:
    """Entry point: run the app, turn errors into one stderr line and an exit code."""
    from fitcheck._clicompat import click_exceptions

    Exit, ClickException, Abort = click_exceptions()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    try:
        result = app(args=args, prog_name="fitcheck", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except FitcheckError as exc:
        if debug:
            raise
        sys.stderr.write(f"fitcheck: error: {exc}\n")
        return int(exc.exit_code)
    except Exit as exc:
        return int(exc.exit_code)
    except ClickException as exc:
        if debug:
            raise
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `fitcheck`: the help, not an error line
            sys.stderr.write(exc.format_message() + "\n")
            return int(ExitCode.TROUBLE)
        sys.stderr.write(f"fitcheck: error: {exc.format_message()}\n")
        return int(ExitCode.TROUBLE)
    except Abort:
        sys.stderr.write("fitcheck: aborted\n")
        return int(ExitCode.TROUBLE)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # a bug: one line unless --debug
        if debug:
            raise
        sys.stderr.write(f"fitcheck: internal error: {exc.__class__.__name__}: {exc} (rerun with --debug)\n")
        return int(ExitCode.TROUBLE)
