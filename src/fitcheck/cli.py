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
from fitcheck.terminal import error_line, printable

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
    prefix_tuning = "prefix-tuning"


class PrecisionOpt(StrEnum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class OptimizerOpt(StrEnum):
    adamw = "adamw"
    paged_adamw = "paged-adamw"
    adamw8bit = "adamw8bit"
    paged_adamw8bit = "paged-adamw8bit"
    adafactor = "adafactor"
    lion = "lion"
    lion8bit = "lion8bit"
    prodigy = "prodigy"
    sgd = "sgd"


class OptimizerImplOpt(StrEnum):
    fused = "fused"
    foreach = "foreach"
    foreach_2_0 = "foreach-2.0"


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
    litgpt = "litgpt"
    unsloth = "unsloth"


class LossOpt(StrEnum):
    standard = "standard"
    hf_legacy = "hf-legacy"
    hf_446 = "hf-4.46"
    chunked = "chunked"
    liger = "liger"
    trl = "trl"
    cce = "cce"
    plain = "plain"


class KbitPathOpt(StrEnum):
    peft = "peft"
    trl_legacy = "trl-legacy"
    none = "none"
    trl = "trl"


class LengthsOpt(StrEnum):
    fixed = "fixed"
    varying = "varying"
    longest_first = "longest-first"


class BaseQuantOpt(StrEnum):
    none = "none"
    int8 = "int8"
    gptq = "gptq"
    gptq_int8 = "gptq-int8"
    awq = "awq"


class TaskOpt(StrEnum):
    causal_lm = "causal-lm"
    classification = "classification"
    seq2seq = "seq2seq"


class StrategyOpt(StrEnum):
    ddp = "ddp"
    zero1 = "zero1"
    zero2 = "zero2"
    zero3 = "zero3"
    fsdp = "fsdp"
    fsdp_grad_op = "fsdp-grad-op"
    fsdp_hybrid = "fsdp-hybrid"
    fsdp_no_shard = "fsdp-no-shard"
    device_map = "device-map"


class OffloadOpt(StrEnum):
    none = "none"
    optimizer = "optimizer"
    all = "all"


class QuantStorageOpt(StrEnum):
    uint8 = "uint8"
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class MoeLayoutOpt(StrEnum):
    fused = "fused"
    per_expert = "per-expert"


class RuleOpt(StrEnum):
    detailed = "detailed"
    thumb = "thumb"


ModelArg = Annotated[
    str,
    typer.Argument(
        help="a size (7B, 1.5B, 350M), a preset id, a Hub id (org/name[@revision]), a HF model or "
        "diffusers folder, config.json or *.safetensors"
    ),
]
ModelOptArg = Annotated[
    str | None,
    typer.Argument(
        help="a size (7B, 1.5B, 350M), a preset id, a HF model or diffusers folder, config.json or "
        "*.safetensors; optional with --from when the file names its base model (MODEL given here wins)",
        show_default=False,
    ),
]
FromO = Annotated[
    str | None,
    typer.Option(
        "--from",
        help="read model and setup from a trainer config (axolotl, LLaMA-Factory, TRL, torchtune, kohya, "
        "kohya_ss, mlx-lm, DeepSpeed, accelerate); flags given here override it",
        show_default=False,
    ),
]
FromFmtO = Annotated[
    str | None,
    typer.Option(
        "--from-format",
        help="the --from file's trainer when detection cannot tell: axolotl, llamafactory, trl, torchtune, "
        "kohya, kohya_ss, mlx, deepspeed, accelerate",
        show_default=False,
    ),
]
MethodO = Annotated[
    MethodOpt,
    typer.Option("--method", "-m", help="full (also pre-training), lora, qlora, prefix-tuning (P-Tuning v2)"),
]
DoraO = Annotated[
    bool, typer.Option("--dora", help="DoRA on top of LoRA (adds a magnitude vector per module)")
]
LoraFaO = Annotated[
    bool,
    typer.Option(
        "--lora-fa",
        help="LLM: LoRA-FA, lora_A frozen and only lora_B trained (peft's create_lorafa_optimizer)",
    ),
]
PrefixTokensO = Annotated[
    int | None,
    typer.Option(
        "--prefix-tokens",
        help="LLM, --method prefix-tuning: virtual tokens per layer (peft num_virtual_tokens); required",
        show_default=False,
    ),
]
PrefixProjO = Annotated[
    bool,
    typer.Option(
        "--prefix-projection", help="LLM, --method prefix-tuning: peft's prefix_projection (a two-layer MLP)"
    ),
]
PrefixHiddenO = Annotated[
    int | None,
    typer.Option(
        "--prefix-hidden",
        help="LLM, --prefix-projection: the MLP width (peft encoder_hidden_size) [default: key/value width]",
        show_default=False,
    ),
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
OptImplO = Annotated[
    OptimizerImplOpt | None,
    typer.Option(
        "--optimizer-impl",
        help="LLM, AdamW: fused (in place) or foreach (torch.optim.AdamW's default on CUDA: a copy of the "
        "second moments inside the step; HF optim adamw_torch); foreach-2.0: torch 2.0's foreach step (two "
        "copies) [default: the trainer's own]",
    ),
]
CkptO = Annotated[bool, typer.Option("--grad-ckpt/--no-grad-ckpt", help="gradient checkpointing")]
AttnO = Annotated[AttnOpt, typer.Option("--attn", help="attention kernel")]
RankO = Annotated[
    int | None, typer.Option("--lora-rank", help="LoRA rank (kohya's network_dim) [default: 16]")
]
AlphaO = Annotated[float | None, typer.Option("--lora-alpha", help="LoRA alpha [default: 2 x rank]")]
TargetsO = Annotated[
    str | None,
    typer.Option(
        "--lora-targets",
        help="attn, all-linear (peft's), linear-modules (axolotl's lora_target_linear), llamafactory-all "
        "(LLaMA-Factory's lora_target: all), or module names [default: all-linear]",
    ),
]
DropO = Annotated[float | None, typer.Option("--lora-dropout", help="LoRA dropout [default: 0]")]
DQO = Annotated[bool, typer.Option("--double-quant/--no-double-quant", help="QLoRA double quantization")]
TrainerO = Annotated[TrainerOpt, typer.Option("--trainer", help="whose implementation details to model")]
#: ``fitcheck plan``'s --trainer: fixed when given, else the emitted config's (commands/plan.py).
TrainerPO = Annotated[
    TrainerOpt | None,
    typer.Option("--trainer", help="whose regime to plan for [default: the emitted config's, else hf]"),
]
TaskO = Annotated[
    TaskOpt | None,
    typer.Option(
        "--task", help="what the model is trained for [default: the model's own: causal-lm for decoders]"
    ),
]
LabelsO = Annotated[int | None, typer.Option("--num-labels", help="classification labels [default: 2]")]
TargetO = Annotated[
    int | None, typer.Option("--target-len", help="seq2seq target tokens [default: --seq-len]")
]
ImageO = Annotated[int, typer.Option("--image-tokens", help="image tokens per example (multimodal models)")]
BaseQuantO = Annotated[
    BaseQuantOpt | None,
    typer.Option(
        "--base-quant",
        help="LoRA on a quantized base: int8 (bitsandbytes), gptq, gptq-int8, awq [default: none]",
    ),
]
TrainModulesO = Annotated[
    str | None,
    typer.Option(
        "--train-modules",
        help="modules trained in full beside LoRA: embed_tokens, lm_head (peft modules_to_save)",
    ),
]
LossO = Annotated[
    LossOpt | None,
    typer.Option(
        "--loss",
        help="cross-entropy kernel: standard, hf-legacy, hf-4.46, chunked, liger, trl (TRL 1.16 SFTTrainer's "
        "fused LM head), cce, plain "
        "[default: the trainer's own]",
    ),
]
OffloadActO = Annotated[
    bool, typer.Option("--offload-activations", help="keep saved activations / checkpoints in CPU memory")
]
OptInBwdO = Annotated[
    bool,
    typer.Option(
        "--optimizer-in-backward",
        help="full fine-tuning: each parameter's step runs in backward (torchtune optimizer_in_bwd)",
    ),
]
KeepGradsO = Annotated[
    bool,
    typer.Option(
        "--keep-grads",
        help="the loop zeroes gradients in place (zero_grad(set_to_none=False), torch < 2.0's default): "
        "they stay allocated beside the next step's activations",
    ),
]
AutocastO = Annotated[
    bool | None,
    typer.Option(
        "--autocast/--no-autocast",
        help="LLM: --no-autocast runs the model in its load dtype without torch.autocast (a plain loop, "
        "HF Trainer with bf16/fp16 off on a 16-bit model) [default: the trainer's own]",
        show_default=False,
    ),
]
CompileO = Annotated[
    bool | None,
    typer.Option(
        "--compile/--no-compile",
        help="LLM: torch.compile on the model and loss (torchtune compile: True, HF Trainer torch_compile); "
        "the partitioner's saved set and fused loss (docs/methodology.md) [default: the trainer's own, off]",
        show_default=False,
    ),
]
KbitPrepO = Annotated[
    bool | None,
    typer.Option(
        "--kbit-prep/--no-kbit-prep",
        help="LLM, 4-bit/8-bit bitsandbytes base under --trainer hf: --kbit-prep when your script calls "
        "peft's prepare_model_for_kbit_training (non-quantized params, adapters fp32); --no-kbit-prep: TRL's "
        "SFTTrainer (>= 0.26: load dtype, adapters cast to bf16) [default: the trainer's own; hf: no]",
        show_default=False,
    ),
]
KbitPathO = Annotated[
    KbitPathOpt | None,
    typer.Option(
        "--kbit-path",
        help="LLM, 4-bit/8-bit bitsandbytes base under --trainer hf: peft (= --kbit-prep: everything "
        "non-quantized fp32), trl-legacy (TRL 0.9-0.25 SFTTrainer: prepared, then with bf16 norms fp32 and "
        "embeddings / lm_head back to bf16, adapters fp32), none (plain HF Trainer script: load dtype, fp32 "
        "adapters), trl (= --no-kbit-prep: TRL >= 0.26, bf16 adapters) [default: trl]",
        show_default=False,
    ),
]
BnbKeepsO = Annotated[
    bool | None,
    typer.Option(
        "--bnb-keeps-input/--no-bnb-keeps-input",
        help="QLoRA: bitsandbytes < 0.43.2, whose 4-bit matmul keeps its input until backward (with "
        "--no-ckpt-reentrant, in every layer; past its backward where the loop keeps the step's output, as "
        "litgpt's) [default: no; litgpt pinned 0.41-0.42 until 2024-12]",
        show_default=False,
    ),
]
CkptReentrantO = Annotated[
    bool | None,
    typer.Option(
        "--ckpt-reentrant/--no-ckpt-reentrant",
        help="--grad-ckpt with use_reentrant=True / False; changes the estimate with --bnb-keeps-input or "
        "--base-quant int8 and "
        "under FSDP1 LoRA (frozen units keep recomputed layers) [default: the trainer's own; reentrant with "
        "--bnb-keeps-input, else not]",
        show_default=False,
    ),
]
KeepLogitsO = Annotated[
    bool,
    typer.Option(
        "--keep-logits",
        help="LLM: the training loop holds the model's output through backward and the optimizer step "
        "(out = model(**batch); out.loss.backward()); HF Trainer keeps only the loss",
    ),
]
PaddingFreeO = Annotated[
    bool,
    typer.Option(
        "--padding-free",
        help="LLM: TRL's padding-free batches (padding_free, or packing with its default 'bfd'): the "
        "micro-batch flattened into one row; under SDPA its block-diagonal mask is counted",
    ),
]
LengthsO = Annotated[
    LengthsOpt,
    typer.Option(
        "--lengths",
        help="LLM: fixed (every step at --seq-len: packed or padded to max length), varying (unpacked data "
        "padded to the longest of each batch): adds the allocator history a whole-run max_memory_reserved / "
        "nvidia-smi shows above one step; released when memory runs short, so the verdict does not count it; "
        "or longest-first (padded the same way, the longest batch first: HF Trainer's group_by_length), no "
        "such history",
    ),
]
OnO = Annotated[
    str,
    typer.Option(
        "--on",
        help="target: catalog id (rtx-4090), 24GB, 36GB-unified, 2x4090, auto (detect this machine), cpu, "
        "or none (no verdict)",
    ),
]
GpusO = Annotated[
    int, typer.Option("--gpus", help="GPUs per node (2x4090 and 8xh100-80gb in --on say it too)")
]
StrategyO = Annotated[
    StrategyOpt | None,
    typer.Option(
        "--strategy",
        help="several GPUs: ddp (default), DeepSpeed zero1/zero2/zero3, FSDP2 fsdp/fsdp-grad-op/fsdp-hybrid, "
        "FSDP1 fsdp-no-shard, device-map (layers split over the GPUs, HF device_map=auto)",
    ),
]
OffloadO = Annotated[
    OffloadOpt, typer.Option("--offload", help="to CPU: none, optimizer (ZeRO), all (ZeRO-3 params, FSDP)")
]
#: ``fitcheck plan``'s --offload: fixed when given, else searched (commands/plan.py).
OffloadPO = Annotated[
    OffloadOpt | None,
    typer.Option("--offload", help="fix CPU offload: none, optimizer, all [default: searched]"),
]
NodesO = Annotated[int, typer.Option("--nodes", help="nodes; world size = GPUs per node x nodes")]
FsdpVerO = Annotated[int, typer.Option("--fsdp-version", help="2 (fully_shard) or 1 (the legacy wrapper)")]
DevMapVerO = Annotated[
    int,
    typer.Option(
        "--device-map-version",
        help="--strategy device-map: 5 (transformers 5 placement) or 4 (transformers 4 with accelerate's)",
    ),
]
MoeLayoutO = Annotated[
    MoeLayoutOpt,
    typer.Option(
        "--moe-layout",
        help="MoE experts as transformers holds them: fused (transformers 5: 3-D parameters that "
        "bitsandbytes leaves 16-bit) or per-expert (transformers 4.x: one nn.Linear per expert, quantized)",
    ),
]
FsdpEmbUnitsO = Annotated[
    bool,
    typer.Option(
        "--fsdp-embedding-units",
        help="FSDP2: the embedding and lm_head are their own units, gathered only while they run (torchtune "
        "custom_sharded_layers ['tok_embeddings', 'output']); not kept unsharded by the root",
    ),
]
ZeroBucketO = Annotated[
    int | None,
    typer.Option(
        "--zero-bucket-size",
        help="DeepSpeed reduce_bucket_size in elements, as the config states it [default: the trainer's: "
        "HF 'auto' hidden_size^2, DeepSpeed 5e8]",
    ),
]
ZeroOverlapO = Annotated[
    bool | None,
    typer.Option(
        "--zero-overlap-comm/--no-zero-overlap-comm",
        help="DeepSpeed overlap_comm as the config states it (ZeRO-1/2: two IPG buffers when on) "
        "[default: the trainer's: HF family on, DeepSpeed on at ZeRO-3 only]",
        show_default=False,
    ),
]
QuantStorageO = Annotated[
    QuantStorageOpt | None,
    typer.Option("--quant-storage", help="QLoRA bnb_4bit_quant_storage [default: compute dtype if sharded]"),
]
HostMemO = Annotated[
    str | None,
    typer.Option("--host-memory", help="CPU RAM of one node, e.g. 512GB [default: catalog or detected]"),
]
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
ChartO = Annotated[
    str | None,
    typer.Option(
        "--chart", help="also draw the answer into FILE: .svg, .png or .html (needs the chart extra)"
    ),
]
ChartForceO = Annotated[bool, typer.Option("--force", help="overwrite an existing --chart file")]
StrictO = Annotated[bool, typer.Option("--strict", help="exit 1 for 'tight' too")]


def verdict_exit(verdict: str, strict: bool) -> int:
    """The exit code of a verdict (check and plan alike): 0 fits (tight too unless ``--strict``), 1 does
    not fit."""
    if verdict == "fits" or (verdict == "tight" and not strict):
        return 0
    return 1


def warn_tight(words: str, strict: bool) -> None:
    """The one stderr line of a tight answer (check and plan alike): why, and what ``--strict`` does."""
    sys.stderr.write(
        f"fitcheck: warning: tight: {printable(words)}"
        + (" (--strict: exit 1)" if strict else " (exit 0; --strict makes it 1)")
        + "\n"
    )


def chart_given(path: str | None) -> bool:
    """Whether ``--chart`` was given; an empty or blank one is an error, not "no chart" (it was ignored)."""
    if path is None:
        return False
    if not path.strip():
        from fitcheck.errors import InputError

        raise InputError("--chart is empty: name a .svg, .png or .html file")
    return True


def write_chart(path: str | None, force: bool, build: Callable[[], Any]) -> None:
    """Draw a chart into ``path`` when ``--chart`` was given (before the answer is printed)."""
    if not chart_given(path) or path is None:
        return

    from fitcheck.chart import chart_path
    from fitcheck.chart import write_chart as write

    target = chart_path(path)  # a folder or a wrong extension is refused before anything is drawn
    write(build(), target, force)
    sys.stderr.write(f"fitcheck: wrote {printable(path)}\n")


def print_chart_link(fmt: Fmt, path: str | None) -> None:
    """``--format markdown`` embeds the chart it wrote."""
    if path and fmt is Fmt.markdown:
        sys.stdout.write(f"\n![memory chart]({path})\n")


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


#: Setup fields whose valid values depend on the model (its module names, depth, context, heads): an error
#: about one the ``--from`` file set asks whether MODEL is the file's model.
MODEL_SHAPED_FIELDS = frozenset(
    {"lora_targets", "train_modules", "lora_head", "seq_len", "task", "num_labels", "prefix_tokens", "attn"}
)


class FromFile:
    """What ``--from`` (and ``--trainer``) decided: the model, the merged setup values, provenance."""

    def __init__(
        self, model: str, values: dict[str, Any], origin: dict[str, str], shown: bool, report: list[str]
    ) -> None:
        self.model = model
        self.values = values
        self.origin = origin
        self.shown = shown  # JSON carries setup_origin (with --from or an explicit --trainer)
        self.report = report
        self.path: str | None = None
        self.keys: dict[str, str] = {}  # setup field -> the file key it was read from
        self.model_given = True  # MODEL typed on the command line (else the file's own model is used)

    def blame(self, exc: Exception) -> Exception:
        """An option error about a value the file set says so (the user did not type that flag)."""
        import re

        from fitcheck.errors import InputError, OptionError

        m = re.match(r"--(?:no-)?([a-z0-9-]+)", str(exc))
        if self.path is None or not isinstance(exc, (OptionError, InputError)) or m is None:
            return exc
        field = m.group(1).replace("-", "_")
        if self.origin.get(field) != "file":
            return exc
        # a value that names the model's parts may be right for the file's model and not for MODEL
        ask = ": is MODEL the file's model?" if field in MODEL_SHAPED_FIELDS and self.model_given else ""
        key = self.keys.get(field)
        where = f"{self.path}, {key}" if key else self.path
        return type(exc)(f"{exc} (the value comes from {where}{ask})")

    def say(self) -> None:
        """The report on stderr, once the run was sized (an error stays one line)."""
        for line in self.report:
            sys.stderr.write(f"fitcheck: {printable(line)}\n")

    def origin_of(self, setup: Any, given: frozenset[str]) -> dict[str, str]:
        """Every setup field's origin, as the setup's JSON holds them (not ``kind``: the model decides it;
        not ``lengths`` at its default, which the JSON leaves out); the backend follows ``--on``."""
        fields = [name for name in setup.model_dump() if name != "kind"]
        out = {name: self.origin.get(name, "fitcheck default") for name in fields}
        if "backend" in out:
            out["backend"] = "command line" if "on" in given else "fitcheck default"
        return out


def merge_from(
    model: str | None, training: dict[str, Any], path: str | None, fmt: str | None, given: frozenset[str]
) -> FromFile:
    """Merge command line, ``--from`` file and trainer defaults (fitcheck.readers.merge), with the report."""
    from typing import get_type_hints

    from fitcheck.api import TrainingOptions
    from fitcheck.errors import InputError
    from fitcheck.readers import read_config
    from fitcheck.readers.merge import resolve
    from fitcheck.readers.report import lines

    if fmt is not None and path is None:
        raise InputError("--from-format needs --from FILE")
    read = read_config(path, fmt) if path is not None else None
    merged = resolve(training, given, read, tuple(get_type_hints(TrainingOptions)))
    note = None
    given_model = model is not None
    if read is not None and model is not None and read.model and file_model(read.model) != model:
        note = f"MODEL {model} on the command line overrides the file's base model {read.model}"
    if model is None:
        if read is None or not read.model:
            raise InputError("give MODEL" + (f": {path} names no base model" if read is not None else ""))
        model = file_model(read.model)
    shown = read is not None or "trainer" in given
    report = lines(read, merged, note) if shown else []
    prov = FromFile(model, dict(merged.values), merged.origin, shown, report)
    prov.path = path
    prov.keys = dict(read.keys) if read is not None else {}
    prov.model_given = given_model
    return prov


def file_model(ref: str) -> str:
    """The model a file names, as MODEL: a preset whose ``hf_id`` it is (no network needed), a
    placeholder path whose stem is a preset id (``/path/to/sdxl.safetensors``, as fitcheck's kohya
    emitter writes), else the reference itself."""
    from pathlib import Path

    from fitcheck.fileio import could_be_path
    from fitcheck.presets import load_preset, preset_ids

    p = Path(ref)
    if could_be_path(ref) and p.exists():
        return ref
    for kind in ("models", "diffusion"):
        for pid in preset_ids(kind):
            hf_id = load_preset(kind, pid).get("hf_id")
            if isinstance(hf_id, str) and hf_id.lower() == ref.lower():
                return pid
    if "/" in ref and ref.endswith((".safetensors", ".ckpt")):
        known = {*preset_ids("models"), *preset_ids("diffusion")}
        return p.stem if p.stem in known else ref
    return ref


def with_origin(doc: dict[str, Any], est: Any, prov: FromFile, given: frozenset[str]) -> dict[str, Any]:
    """The estimate document, with ``setup_origin`` after ``setup`` when --from or --trainer decided it."""
    if not prov.shown:
        return doc
    out: dict[str, Any] = {}
    for key, value in doc.items():
        out[key] = value
        if key == "setup":
            out["setup_origin"] = prov.origin_of(est.setup, given)
    return out


def _training_template(
    method: MethodO = MethodOpt.lora,
    dora: DoraO = False,
    lora_fa: LoraFaO = False,
    prefix_tokens: PrefixTokensO = None,
    prefix_projection: PrefixProjO = False,
    prefix_hidden: PrefixHiddenO = None,
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
    optimizer_impl: OptImplO = None,
    grad_ckpt: CkptO = False,
    attn: AttnO = AttnOpt.sdpa,
    lora_rank: RankO = None,
    lora_alpha: AlphaO = None,
    lora_targets: TargetsO = None,
    lora_dropout: DropO = None,
    double_quant: DQO = True,
    base_quant: BaseQuantO = None,
    train_modules: TrainModulesO = None,
    loss: LossO = None,
    offload_activations: OffloadActO = False,
    optimizer_in_bwd: OptInBwdO = False,
    keep_grads: KeepGradsO = False,
    autocast: AutocastO = None,
    compile: CompileO = None,
    kbit_prep: KbitPrepO = None,
    kbit_path: KbitPathO = None,
    bnb_keeps_input: BnbKeepsO = None,
    ckpt_reentrant: CkptReentrantO = None,
    keep_logits: KeepLogitsO = False,
    padding_free: PaddingFreeO = False,
    lengths: LengthsO = LengthsOpt.fixed,
    trainer: TrainerO = TrainerOpt.generic,
    gpus: GpusO = 1,
    task: TaskO = None,
    num_labels: LabelsO = None,
    target_len: TargetO = None,
    image_tokens: ImageO = 0,
    strategy: StrategyO = None,
    offload: OffloadO = OffloadOpt.none,
    nodes: NodesO = 1,
    fsdp_version: FsdpVerO = 2,
    device_map_version: DevMapVerO = 5,
    moe_layout: MoeLayoutO = MoeLayoutOpt.fused,
    fsdp_embedding_units: FsdpEmbUnitsO = False,
    zero_bucket_size: ZeroBucketO = None,
    zero_overlap_comm: ZeroOverlapO = None,
    quant_storage: QuantStorageO = None,
    host_memory: HostMemO = None,
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
    model: ModelOptArg = None,
    on: OnO = "auto",
    from_file: FromO = None,
    from_format: FromFmtO = None,
    headroom: HeadroomO = None,
    rule: RuleO = RuleOpt.detailed,
    fmt: FmtO = Fmt.table,
    chart: ChartO = None,
    force: ChartForceO = False,
    verbose: VerboseO = False,
    *,
    training: dict[str, Any],
) -> None:
    """Memory breakdown of one training step, with the rule of thumb beside it (and a verdict with --on)."""
    from fitcheck import api, render
    from fitcheck._clicompat import given_parameters

    given = given_parameters()
    prov = merge_from(model, training, from_file, from_format, given)
    spec = api.resolve(prov.model)
    try:
        est = api.estimate(spec, on=on, headroom=headroom, **prov.values)
    except FitcheckError as exc:
        raise prov.blame(exc) from None
    prov.say()
    write_chart(chart, force, lambda: estimate_chart(est))
    if rule is RuleOpt.thumb:
        if est.thumb is None:
            from fitcheck.errors import OptionError

            raise OptionError("--rule thumb: the source documents give no rule of thumb for diffusion models")
        from fitcheck.engine.verdict import thumb_verdict

        judged = thumb_verdict(est)
        data = render.thumb_doc(est, judged)
        print_doc(fmt, data, lambda: render.thumb_table(est, judged, verbose))
        return
    doc = with_origin(render.estimate_doc(est), est, prov, given)
    print_doc(fmt, doc, lambda: render.estimate_table(est, spec, verbose))
    print_chart_link(fmt, chart)


def estimate_chart(est: Any) -> Any:
    """The estimate's chart spec (the chart extra draws it)."""
    from fitcheck.chart import spec

    return spec.estimate_chart(est)


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
    """Entry point: run the app with a guarded stdout; errors become one stderr line and an exit code.

    The exit code is the answer's (0, 1) or 2 for trouble, whatever else happens: ``--debug`` adds a
    traceback and keeps the code; a reader that leaves early (a broken pipe) keeps the code quietly;
    a stdout that cannot be written is 2 with one line (`fitcheck.output`).
    """
    from fitcheck.fileio import reading
    from fitcheck.output import OutputError, finish, guarded_stdout

    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args.remove("--debug")
    with guarded_stdout() as guard, reading():  # reading: no file written is one the command read
        try:
            code = _run(args, debug)
        except OutputError as exc:
            sys.stderr.write(f"fitcheck: error: {error_line(str(exc))}\n")
            return int(ExitCode.TROUBLE)
        return finish(guard, code)


def _trouble(message: str, debug: bool) -> int:
    if debug:
        import traceback

        traceback.print_exc()
    sys.stderr.write(error_line(message) + "\n")
    return int(ExitCode.TROUBLE)


def _run(args: list[str], debug: bool) -> int:
    from fitcheck._clicompat import click_exceptions

    Exit, ClickException, Abort = click_exceptions()
    try:
        result = app(args=args, prog_name="fitcheck", standalone_mode=False)
        return int(result) if isinstance(result, int) else 0
    except FitcheckError as exc:
        if debug:
            import traceback

            traceback.print_exc()
        sys.stderr.write(f"fitcheck: error: {error_line(str(exc))}\n")
        return int(exc.exit_code)
    except Exit as exc:
        return int(exc.exit_code)
    except ClickException as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # bare `fitcheck`: the help, not an error line
            sys.stderr.write(exc.format_message() + "\n")
            return int(ExitCode.TROUBLE)
        return _trouble(f"fitcheck: error: {exc.format_message()}", debug)
    except Abort:
        sys.stderr.write("fitcheck: aborted\n")
        return int(ExitCode.TROUBLE)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: one line unless --debug
        return _trouble(
            f"fitcheck: internal error: {exc.__class__.__name__}: {exc} (rerun with --debug for a traceback)",
            debug,
        )
