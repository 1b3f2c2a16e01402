"""What every emitter shares: the context, the header comment, a small YAML writer, module names.

The YAML writer is ours rather than ``yaml.safe_dump`` so that the files carry comments on their
memory knobs and are byte-stable (golden files). It writes only what the emitters need: scalars,
lists of scalars, one level of mapping, and lists of flat mappings; strings are double-quoted JSON
strings (valid YAML), floats always carry a dot (``2.0e-05``) so YAML 1.1 readers see numbers.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fitcheck import __version__
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.emitters.launch import launch_line
from fitcheck.engine.lora import expand_targets
from fitcheck.engine.params import layer_linears
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup, ModelSpec
from fitcheck.planner.models import Change, LlmCandidate, Plan, PlanRequest
from fitcheck.terminal import printable
from fitcheck.units import GIB

#: Learning rates written when the user gives none: the TRL/PEFT examples' usual values, not tuned.
LR_ADAPTER = 2.0e-4
LR_FULL = 2.0e-5
OUTPUT_DIR = "outputs"


@dataclass(frozen=True)
class EmitContext:
    """Facts an emitter needs beyond the plan.

    Attributes:
        spec: the model (module names, family).
        model_ref: what the trainer loads (a Hugging Face id or a local folder); None when MODEL was
            a size string, which names no real weights.
        command: the ``fitcheck plan ...`` line that reproduces the file.
        filename: the name the user gave the file (``--emit run.hf.yaml``); empty: the format's name.
            An emitter that writes several files (kohya: config and dataset) names the others after it.
        files: every file written by the same ``plan`` run, format -> file name (the launch line
            names them together).
    """

    spec: ModelSpec | DiffusionSpec
    model_ref: str | None
    command: str
    filename: str = ""
    files: Mapping[str, str] = field(default_factory=dict)

    @property
    def arch(self) -> DecoderArch:
        """The decoder's architecture (the LLM trainers' configs need module names)."""
        if not isinstance(self.spec, ModelSpec):
            raise OptionError(f"{self.spec.id} is a diffusion model: its trainer config is kohya.toml")
        return self.spec.arch

    @property
    def stored_4bit(self) -> bool:
        """Whether the model is a checkpoint stored in bitsandbytes 4-bit (its config.json's
        ``quantization_config``): transformers builds those layers from the checkpoint's own config, and a
        ``BitsAndBytesConfig`` passed to ``from_pretrained`` beside it is set aside with a warning ("The
        ``quantization_config`` from the model will be used", transformers 5.24.0 quantizers/auto.py
        ``merge_quantization_configs``), so a trainer file should not state 4-bit settings of its own."""
        from fitcheck.sources.prequant import read_prequant

        cfg = self.spec.hf_config if isinstance(self.spec, ModelSpec) else None
        stored = read_prequant(cfg) if cfg else None
        return stored is not None and stored.scheme == "bnb-4bit"


@dataclass(frozen=True)
class Item:
    """One top-level YAML key with its value and an optional trailing comment."""

    key: str
    value: Any
    comment: str = ""


def chosen(plan: Plan) -> LlmCandidate:
    """The plan's chosen candidate; emitters are only called for LLM plans that fit."""
    c = plan.chosen
    if c is None:
        raise OptionError("no configuration fits, so there is nothing to write")
    if not isinstance(c.setup, LlmSetup):
        raise OptionError(
            f"{plan.model} is a diffusion model: its trainer config is kohya.toml (the LLM trainers' "
            "configs cannot express it)"
        )
    if c.setup.method == "prefix-tuning":
        raise OptionError("--method prefix-tuning: no emitter writes a prefix-tuning config; drop --emit")
    if c.setup.lora_fa:
        raise OptionError(
            "--lora-fa: no emitted config expresses LoRA-FA (peft's create_lorafa_optimizer is called in "
            "the training code), and plain LoRA needs more memory than this plan; drop --emit or --lora-fa"
        )
    if c.setup.fsdp_embedding_units:
        raise OptionError(
            "--fsdp-embedding-units: no emitted config expresses it (it is torchtune's "
            "custom_sharded_layers, and fitcheck has no torchtune emitter), and without it FSDP's root holds "
            "the embedding and lm_head, more memory than this plan; drop --emit or --fsdp-embedding-units"
        )
    return c  # type: ignore[return-value]  # an LlmSetup's candidate is an LlmCandidate


def epochs(plan: Plan) -> float:
    """Passes over the dataset the plan was asked for (``--epochs``, default 1)."""
    req = plan.request
    return float(req.epochs or 1.0) if isinstance(req, PlanRequest) else 1.0


def model_ref(ctx: EmitContext, what: str) -> str:
    """The model to load, or an error saying a size string names no weights."""
    if ctx.model_ref is None:
        raise OptionError(
            f"{what} needs a real model to load; MODEL was a size. Plan a preset id, a Hugging Face "
            "folder or "
            "a config.json instead"
        )
    return ctx.model_ref


def gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def header(plan: Plan, ctx: EmitContext, what: str, runs_with: str) -> list[str]:
    """The opening comment: producer, hardware, estimated peak, the plan, how to reproduce it."""
    c = chosen(plan)
    s = c.setup
    t = plan.target
    est = plan.estimate
    peak = (
        f"{gib(c.device_bytes)} on the device"
        + (f" (allocated peak {gib(est.peak_allocated_bytes)} in {est.peak_phase})" if est else "")
        + f", likely up to {gib(c.high_bytes)}"
        + f" ({100 * c.high_bytes / max(1, t.budget_bytes):.0f}% of the budget)"
    )
    ckpt = "on" if s.grad_ckpt else "off"
    lines = [
        f"{what}: written by fitcheck {__version__} (fitcheck plan) for {plan.model_name}",
        f"hardware: {t.name} ({t.backend}"
        + (f", {t.gpus} GPUs per node" if t.gpus > 1 else "")
        + f"), budget {gib(t.budget_bytes)} = usable {gib(t.usable_bytes)}"
        + f" - headroom {gib(t.headroom_bytes)}",
        f"estimated peak: {peak}; regime {est.regime.name if est else s.trainer}"
        + (
            f": {est.regime.weight_dtype} weights, {s.precision} autocast"
            if est and est.regime.autocast and est.regime.weight_dtype != s.precision and s.method == "full"
            else ""
        ),
        f"plan: {s.method}{'+dora' if s.dora else ''}, micro-batch {s.batch_size}"
        + f" x accumulation {s.grad_accum}"
        + (f" x {s.data_ranks} GPUs" if s.data_ranks > 1 else "")
        + f" = {c.effective_batch}, {s.seq_len} tokens, {s.precision}, attention {s.attn}, {s.optimizer}, "
        f"checkpointing {ckpt}; about {c.throughput.tokens_per_s:,.0f} tokens/s",
        f"run: {runs_with}",
    ]
    if c.verdict == "tight":
        fix = smallest_change_line(plan.changes)
        lines[3:3] = [tight_line(c.high_bytes, t.budget_bytes), *([fix] if fix else [])]
    launch = launch_line(s, ctx.files)
    if launch is not None:
        lines.append(f"launch: {launch}")
        lines.append(distributed_summary(plan))
    lines.append(f"reproduce: {ctx.command}")
    return lines


def tight_line(high_bytes: int, budget_bytes: int) -> str:
    """The header line of a tight plan (the planner's fallback when no configuration's likely range
    fits): the same warning `fitcheck plan` prints."""
    return (
        f"TIGHT: the estimate fits the {gib(budget_bytes)} budget but the likely range reaches "
        f"{gib(high_bytes)}: it may run out of memory (no configuration's likely range fits)"
    )


def smallest_change_line(changes: Sequence[Change]) -> str | None:
    """The header line under a tight plan's `tight_line`: the smallest change that makes the likely range
    fit, in the table's words (`Change.words`); None when no single change was found."""
    return f"TIGHT: to fit the likely range, smallest change: {changes[0].words()}" if changes else None


def distributed_summary(plan: Plan) -> str:
    """One line: strategy, offload, GPUs, and the host memory the node needs."""
    s = chosen(plan).setup
    est = plan.estimate
    host = f", host {gib(est.host_bytes)} per node" if est is not None and est.host_bytes else ""
    off = f", offload {s.offload}" if s.offload != "none" else ""
    return (
        f"multi-GPU: {s.effective_strategy}{off} on {s.world_size} GPU(s) ({s.gpus} per node x {s.nodes}); "
        f"memory figures are per GPU{host}"
    )


def comment_block(lines: Sequence[str], mark: str = "#") -> str:
    """Comment lines, each kept one line: a name from the user (a model folder, a Hub id, the reproduce
    line's arguments) with a newline or a YAML line break in it is written as its escape, never as a new
    line a shell or YAML parser would read as code (`fitcheck.terminal.printable`)."""
    return "".join(f"{mark} {printable(line)}".rstrip() + "\n" for line in lines)


# ------------------------------------------------------------------------------------------ YAML


def scalar(v: Any) -> str:
    """A YAML scalar: null, true/false, an int, a float with a dot, or a double-quoted string."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            raise ValueError("non-finite float")
        text = repr(v)
        if "e" in text:
            mant, exp = text.split("e")
            if "." not in mant:
                mant += ".0"
            text = f"{mant}e{exp}"
        return text
    if isinstance(v, str):
        return json.dumps(v)
    raise TypeError(f"not a YAML scalar: {v!r}")


def _value_lines(v: Any, indent: int) -> list[str]:
    pad = " " * indent
    if isinstance(v, dict):
        out: list[str] = []
        for k, x in v.items():
            if isinstance(x, (dict, list)):
                out.append(f"{pad}{k}:")
                out += _value_lines(x, indent + 2)
            else:
                out.append(f"{pad}{k}: {scalar(x)}")
        return out
    if isinstance(v, list):
        out = []
        for x in v:
            if isinstance(x, dict):
                inner = _value_lines(x, indent + 2)
                out.append(f"{pad}- {inner[0].lstrip()}")
                out += inner[1:]
            else:
                out.append(f"{pad}- {scalar(x)}")
        return out
    raise TypeError(v)


def yaml_text(items: Sequence[Item]) -> str:
    """Top-level keys in order; a list or mapping value goes on the following lines."""
    out: list[str] = []
    for it in items:
        tail = f"  # {printable(it.comment)}" if it.comment else ""
        if isinstance(it.value, (dict, list)) and it.value:
            out.append(f"{it.key}:{tail}")
            out += _value_lines(it.value, 2)
        elif isinstance(it.value, (dict, list)):
            out.append(f"{it.key}: {'{}' if isinstance(it.value, dict) else '[]'}{tail}")
        else:
            out.append(f"{it.key}: {scalar(it.value)}{tail}")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------- LoRA module names


def lora_modules(a: DecoderArch, setup: LlmSetup) -> list[str] | None:
    """The module names LoRA wraps; None for ``all-linear`` (every trainer has a switch for it).
    ``linear-modules`` is written as the names it stands for on this model (`expand_targets`)."""
    if setup.lora_targets == "all-linear":
        return None
    if setup.lora_targets == "attn":
        return [lin.name for lin in layer_linears(a, False) if lin.role == "attn" and lin.is_module]
    return [t.strip() for t in expand_targets(a, setup.lora_targets).split(",") if t.strip()]


def integer_alpha(setup: LlmSetup, where: str) -> int:
    """LoRA alpha as the integer HF-based configs require."""
    alpha = setup.alpha
    if alpha != int(alpha):
        raise OptionError(f"{where} takes an integer LoRA alpha; --lora-alpha {alpha:g} cannot be written")
    return int(alpha)


def learning_rate(setup: LlmSetup) -> float:
    return LR_FULL if setup.method == "full" else LR_ADAPTER


def run_name(plan: Plan) -> str:
    s = chosen(plan).setup
    return f"{OUTPUT_DIR}/{plan.model}-{s.method}"
