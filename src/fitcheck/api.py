"""The fitcheck library: the CLI is a thin layer over these functions.

Every function takes the CLI's option names as keyword arguments (underscores for dashes) and returns
the pydantic models the JSON serialises (docs/api.md, docs/json.md)::

    from fitcheck.api import estimate
    e = estimate("llama-3.1-8b", method="lora", seq_len=4096, grad_ckpt=True, on="rtx-4090")
    e.peak_allocated_bytes, e.target.verdict

One path for every workload: `resolve` -> `setup_for` (one setup model, a union on ``kind``) ->
the workload's estimator (closed form for decoders, the simulator for UNets/DiTs) -> the verdict.
A model or target resolved once (`resolve`, `target`) can be passed back in, so a command that sizes
many runs probes the machine once.

Imports stay light: pydantic and the engines are imported inside the functions that need them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Literal, TypeVar, get_args, get_type_hints

from pydantic import BaseModel, Field
from typing_extensions import TypedDict, Unpack  # pydantic validates only this TypedDict on 3.11

from fitcheck.errors import InputError, OptionError
from fitcheck.units import MAX_DATASET_TOKENS
from fitcheck.vocab import (
    Attention,
    BaseQuant,
    KbitPath,
    Lengths,
    Loss,
    Method,
    MethodChoice,
    MoeLayout,
    Offload,
    Optimizer,
    OptimizerImpl,
    Precision,
    QuantStorage,
    Strategy,
    Task,
    Trainer,
)

if TYPE_CHECKING:
    from fitcheck.diffusion.spec import DiffusionSpec
    from fitcheck.hardware.env import ProbeEnv
    from fitcheck.hardware.report import HwCatalog, HwReport
    from fitcheck.models import DecoderArch, DiffusionSetup, Estimate, LlmSetup, ModelInfo, ModelSpec, Target
    from fitcheck.planner.models import DevicePerf, Plan

    Spec = ModelSpec | DiffusionSpec
    Setup = LlmSetup | DiffusionSetup

_M = TypeVar("_M", bound="BaseModel")


class _Common(TypedDict, total=False):
    """Options every sizing command takes; None (or leaving a key out) means the workload's default."""

    dora: bool
    lora_fa: bool
    prefix_tokens: Annotated[int, Field(ge=1, le=1_000_000)] | None
    prefix_projection: bool
    prefix_hidden: Annotated[int, Field(ge=1, le=1_000_000)] | None
    grad_accum: int
    seq_len: int | None
    resolution: int | None
    cache_latents: bool
    cache_text_encoder_outputs: bool
    train_text_encoder: bool
    fp8_base: bool
    full_bf16: bool
    full_fp16: bool
    master_weights: bool
    lora_rank: int | None
    lora_alpha: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None
    lora_targets: str | None
    lora_dropout: Annotated[float, Field(allow_inf_nan=False)] | None
    double_quant: bool | None
    base_quant: BaseQuant | None
    train_modules: str | None
    loss: Loss | None
    offload_activations: bool
    optimizer_in_bwd: bool
    autocast: bool | None
    compile: bool | None
    kbit_prep: bool | None
    kbit_path: KbitPath | None
    bnb_keeps_input: bool | None
    ckpt_reentrant: bool | None
    keep_logits: bool
    padding_free: bool
    lengths: Lengths
    trainer: Trainer | None
    gpus: Annotated[int, Field(ge=1, le=4096)] | None
    task: Task | None
    num_labels: int | None
    target_len: int | None
    image_tokens: int | None
    nodes: int
    fsdp_version: int
    device_map_version: int
    moe_layout: MoeLayout
    fsdp_embedding_units: bool
    zero_bucket_size: Annotated[int, Field(ge=1, le=10**12)] | None
    zero_overlap_comm: bool | None
    quant_storage: QuantStorage | None
    host_memory: str | None


class TrainingOptions(_Common, total=False):
    """The training options of `estimate` and `check` (docs/cli.md; the CLI's flags, underscored)."""

    method: Method
    batch_size: int
    precision: Precision
    optimizer: Optimizer
    optimizer_impl: OptimizerImpl | None
    grad_ckpt: bool
    attn: Attention
    strategy: Strategy | None
    offload: Offload
    keep_grads: bool


class PlanOptions(_Common, total=False):
    """The options of `plan`: a None choice is searched; ``method="auto"`` tries full, LoRA, QLoRA."""

    method: MethodChoice
    batch_size: int | None
    precision: Precision | None
    optimizer: Optimizer | None
    optimizer_impl: OptimizerImpl | None
    grad_ckpt: bool | None
    attn: Attention | None
    effective_batch: Annotated[int, Field(ge=1, le=1_048_576)] | None
    min_seq_len: Annotated[int, Field(ge=1, le=10_000_000)] | None
    min_resolution: Annotated[int, Field(ge=64, le=8192)] | None
    dataset_tokens: Annotated[int, Field(ge=1, le=MAX_DATASET_TOKENS)] | None
    epochs: Annotated[float, Field(gt=0, le=1_000_000, allow_inf_nan=False)] | None
    strategy: Strategy | None
    offload: Offload | None


#: Options that apply to one workload only, and the value that means "not given" (a flag's off).
LLM_ONLY: dict[str, object] = {
    "seq_len": None,
    "dora": False,
    "lora_fa": False,
    "prefix_tokens": None,
    "prefix_projection": False,
    "prefix_hidden": None,
    "master_weights": False,
    "double_quant": True,
    "base_quant": "none",
    "train_modules": "",
    "loss": None,
    "offload_activations": False,
    "optimizer_in_bwd": False,
    "autocast": None,
    "compile": None,
    "kbit_prep": None,
    "kbit_path": None,
    "bnb_keeps_input": None,
    "ckpt_reentrant": None,
    "keep_logits": False,
    "padding_free": False,
    "lengths": "fixed",
    "optimizer_impl": None,
    "quant_storage": None,
    "min_seq_len": None,
    "dataset_tokens": None,
    "epochs": None,
    "task": None,
    "num_labels": None,
    "target_len": None,
    "image_tokens": 0,
    "device_map_version": 5,
    "moe_layout": "fused",
    "fsdp_version": 2,
    "fsdp_embedding_units": False,
    "zero_bucket_size": None,
    "zero_overlap_comm": None,
}
DIFFUSION_ONLY: dict[str, object] = {
    "resolution": None,
    "cache_latents": False,
    "cache_text_encoder_outputs": False,
    "train_text_encoder": False,
    "fp8_base": False,
    "full_bf16": False,
    "full_fp16": False,
    "min_resolution": None,
}
_LORA = ("lora_rank", "lora_alpha", "lora_targets", "lora_dropout")
#: The LLM hint for a diffusion-only option and back (what to use instead).
_HINT = {
    "resolution": "; for an LLM use --seq-len",
    "seq_len": ": use --resolution",
    "min_resolution": "; for an LLM use --min-seq-len",
    "min_seq_len": ": use --min-resolution",
}


#: Setup fields whose command-line flag is not the field's name with dashes.
FLAG_NAMES = {"optimizer_in_bwd": "--optimizer-in-backward"}


def _flag(name: str) -> str:
    return FLAG_NAMES.get(name, "--" + name.replace("_", "-"))


def _need_text(value: object, what: str, optional: bool = False) -> None:
    """The library's own error for an argument of the wrong type (a str where the CLI takes text)."""
    if isinstance(value, str) or (optional and value is None):
        return
    raise InputError(f"{what} must be text{' or None' if optional else ''} (got {type(value).__name__})")


# --- models and targets ----------------------------------------------------------------------------


def resolve(model: str) -> Spec:
    """The model: a diffusion pipeline (`DiffusionSpec`) or a transformer (`ModelSpec`).

    ``model`` is a size (7B), a preset id or alias, a Hugging Face Hub id (``org/name[@revision]``),
    a Hugging Face folder, ``config.json``, a diffusers folder or a ``.safetensors`` file; the order
    is `fitcheck.sources.resolve.resolve`'s (docs/cli.md, "Which model").
    """
    from fitcheck.sources.resolve import resolve as resolve_any

    _need_text(model, "model (a preset id, a size like 7B, a Hub id or a path)")
    return resolve_any(model)


def kind_of(spec: Spec) -> Literal["llm", "diffusion"]:
    """The workload of a resolved model."""
    from fitcheck.models import ModelSpec

    return "llm" if isinstance(spec, ModelSpec) else "diffusion"


def target(
    on: str | None, headroom: str | None = None, gpus: int | None = None, probe_env: ProbeEnv | None = None
) -> Target | None:
    """The machine to judge against (``--on``), None for ``none``; ``auto`` probes this machine."""
    _need_text(on, "on (a hardware id, a size like 24GB, auto or none)", optional=True)
    _need_text(headroom, "headroom (a size like 2GB or a percentage)", optional=True)
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 4096):
        raise InputError(f"gpus must be a whole number from 1 to 4096 (got {gpus!r:.40})")
    if on is None or on.strip().lower() == "none":
        return None
    from fitcheck.hardware.budget import resolve_target

    t = resolve_target(on, headroom, probe_env)
    if gpus is not None and gpus > 1 and t.gpus > 1 and gpus != t.gpus:
        # neither may silently win: 8xh100-80gb with --gpus 2 would judge 8 ranks, 2x with --gpus 3 three
        raise OptionError(
            f"--gpus {gpus} and --on {t.id} ({t.gpus} GPUs) disagree: give the GPU count once "
            "(in --on, or with --gpus beside a one-GPU target)"
        )
    if gpus is not None and gpus > 1 and t.gpus == 1:
        t = t.model_copy(update={"gpus": gpus})
    return t


def _spec(model: str | Spec) -> Spec:
    from fitcheck.diffusion.spec import DiffusionSpec
    from fitcheck.models import ModelSpec

    return model if isinstance(model, (ModelSpec, DiffusionSpec)) else resolve(model)


def _target(on: str | Target | None, headroom: str | None, gpus: int | None) -> Target | None:
    from fitcheck.models import Target

    return on if isinstance(on, Target) else target(on, headroom, gpus)


# --- setups ----------------------------------------------------------------------------------------


def refuse_foreign(spec: Spec, options: dict[str, object]) -> None:
    """A flag that does not apply to the model's workload is an error (design.md s.2)."""
    kind = kind_of(spec)
    foreign = DIFFUSION_ONLY if kind == "llm" else LLM_ONLY
    for name, unset in foreign.items():
        value = options.get(name)
        if value is not None and value != unset:
            if kind == "llm":
                raise OptionError(
                    f"{_flag(name)} applies to diffusion models, not to {spec.name}{_HINT.get(name, '')}"
                )
            raise OptionError(
                f"{_flag(name)} applies to LLMs; {spec.name} is a diffusion model{_HINT.get(name, '')}"
            )
    trainer = options.get("trainer")
    if kind == "llm" and trainer == "kohya":
        raise OptionError(
            f"--trainer kohya trains diffusion models (kohya sd-scripts); for {spec.name} use generic, hf, "
            "torchtune, axolotl, llamafactory, mlx, litgpt or unsloth"
        )
    if kind == "diffusion" and trainer not in (None, "generic", "kohya"):
        raise OptionError(f"--trainer {trainer} does not train diffusion models; use --trainer kohya")
    if options.get("method") in ("full", "prefix-tuning"):
        given = [k for k in _LORA if options.get(k) is not None]
        if given:
            raise OptionError(
                f"{_flag(given[0])} applies to LoRA and QLoRA, not --method {options['method']}"
            )


def refuse_inert(spec: Spec, options: dict[str, object]) -> None:
    """A flag the asked method leaves without effect is an error, not a silent no-op (the planner's own
    candidates carry it through every method, so this is called on what was asked, not per setup)."""
    method = options.get("method")
    inert_dq = options.get("double_quant") is False and method not in (None, "auto", "qlora")
    if kind_of(spec) == "llm" and inert_dq and not _prequantized(spec):  # a stored base is checked there
        # only an NF4 base has quantization constants to quantize again
        raise OptionError(f"--no-double-quant applies to QLoRA's NF4 base, not --method {method}")


def _prequantized(spec: Spec) -> bool:
    """Whether the checkpoint stores a quantized base (`fitcheck.sources.prequant`)."""
    from fitcheck.models import ModelSpec
    from fitcheck.sources.prequant import read_prequant

    config = spec.hf_config if isinstance(spec, ModelSpec) else None
    return config is not None and read_prequant(config) is not None


def is_auto(on: object) -> bool:
    """Whether ``--on`` asks for this machine (``auto`` in any case, as `resolve_target` reads it)."""
    return isinstance(on, str) and on.strip().lower() == "auto"


def refuse_gpu_run_here(tgt: Target | None, options: dict[str, object], trainer_too: bool = False) -> None:
    """A GPU-only run (FlashAttention-2; with ``trainer_too``, a trainer that does not run on this
    backend, which `plan` refuses and `estimate` sizes) on this machine, found to have no GPU (``--on
    auto``): the run is for another machine, which only ``--on`` can name (a file written for a GPU, read
    on a laptop)."""
    from fitcheck.engine.estimate import FLASH_GPUS
    from fitcheck.planner.rules import TRAINER_BACKENDS

    if tgt is None or not tgt.detected or tgt.backend not in ("cpu", "mps"):
        return
    trainer = options.get("trainer")
    if options.get("attn") == "flash":
        what = FLASH_GPUS
    elif trainer_too and isinstance(trainer, str) and tgt.backend not in TRAINER_BACKENDS.get(trainer, ()):
        what = f"--trainer {trainer} runs on {' and '.join(TRAINER_BACKENDS[trainer])}"
    else:
        return
    where = "an Apple GPU" if tgt.backend == "mps" else "no GPU"
    example = (
        "the Mac the run trains on with --on (e.g. --on apple-m2-16gb"
        if trainer == "mlx"
        else ("the GPU the run trains on with --on (e.g. --on rtx-4090")
    )
    raise OptionError(f"{what} and this machine has {where}: name {example}; fitcheck hw list)")


def setup_for(spec: Spec, options: dict[str, object], tgt: Target | None = None) -> Setup:
    """The setup of one run: the model's workload decides the model (`LlmSetup` | `DiffusionSetup`).

    Raises:
        OptionError: an option that does not apply to this workload or method.
        InputError: a value out of range (one line naming the flag).
    """
    from fitcheck.models import DiffusionSetup, LlmSetup

    refuse_foreign(spec, options)
    kind = kind_of(spec)
    if options.get("trainer") == "mlx" and tgt is not None and tgt.id != "none" and tgt.backend != "mps":
        vendor = {"cuda": "NVIDIA GPUs", "rocm": "AMD GPUs"}.get(tgt.backend, "a CPU")
        raise OptionError(
            f"--trainer mlx trains on Apple silicon (MLX), not on {vendor} ({tgt.id}): use hf, axolotl, "
            "llamafactory, torchtune, litgpt or unsloth there"
        )
    model = LlmSetup if kind == "llm" else DiffusionSetup
    values = {k: v for k, v in options.items() if v is not None and k in model.model_fields}
    if kind == "llm":
        refuse_autocast(values)
        refuse_master_weights(values)
        refuse_optimizer_impl(values)
        refuse_kbit_prep(values)
        refuse_kbit_path(values)
        refuse_bnb_flags(values)
        if values.get("compile") and values.get("trainer") == "mlx":
            raise OptionError("--compile: MLX has no torch.compile (its mx.compile is not modelled)")
        defaulted = "lora_targets" not in values
        if values.get("method") != "prefix-tuning":  # prefix tuning wraps no projection
            values.setdefault("lora_targets", default_targets(values.get("trainer")))
    if kind == "diffusion":
        values["trainer"] = "kohya"
    if tgt is not None:
        values["backend"] = tgt.backend
        values["gpus"] = max(tgt.gpus, int(values.get("gpus", 1)))  # type: ignore[call-overload]
    if kind == "llm":
        from fitcheck.models import ModelSpec
        from fitcheck.sources.prequant import apply

        stored = spec.hf_config if isinstance(spec, ModelSpec) else None
        arch = spec.arch if isinstance(spec, ModelSpec) else None
        setup = validated(LlmSetup, peft_all_linear(apply(spec.name, stored, values), defaulted, arch))
        refuse_flash_on(spec, setup, tgt)
        return setup
    return validated(DiffusionSetup, values)


def refuse_flash_on(spec: Spec, setup: LlmSetup, tgt: Target | None) -> None:
    """``--attn flash`` on a catalog GPU FlashAttention-2 does not train on (an NVIDIA GPU before compute
    capability 8.0, an AMD GPU outside Instinct MI200 / MI300, or there a head dimension above 128:
    `fitcheck.planner.kernels.flash_device_refusal`) is an error: the run could not start. A plain size
    (24GB) names no GPU and is not judged."""
    from fitcheck.models import ModelSpec
    from fitcheck.planner.kernels import flash_device_refusal

    if setup.attn != "flash" or tgt is None or not isinstance(spec, ModelSpec):
        return
    dev = device_for(tgt)
    why = flash_device_refusal(dev.backend, dev.cc, dev.architecture, spec.arch.head_dim, dev.name)
    if why is not None:
        raise OptionError(f"--attn flash: {why}; use --attn sdpa")


#: Bases whose quantized layers peft's ``all-linear`` does not reach: it collects ``torch.nn.Linear`` and
#: ``Conv1D`` modules only (peft 0.21.2 tuners/tuners_utils.py ``_maybe_include_all_linear_layers``:
#: ``linear_classes = (torch.nn.Linear, Conv1D)``), and a GPTQ or AWQ projection is gptqmodel's
#: ``BaseQuantLinear`` (``class BaseQuantLinear(nn.Module)``; peft's dispatchers tuners/lora/gptq.py
#: ``dispatch_gptq`` and tuners/lora/awq.py ``dispatch_awq`` wrap it only when it is named), or AutoGPTQ's
#: ``QuantLinear`` / AutoAWQ's ``WQLinear_GEMM``, also plain ``nn.Module``s. bitsandbytes' ``Linear4bit`` and
#: ``Linear8bitLt`` subclass ``nn.Linear`` and are reached.
PEFT_UNREACHED_BASES = frozenset({"gptq", "gptq-int8", "awq"})


def peft_all_linear(
    values: dict[str, object], defaulted: bool, arch: DecoderArch | None
) -> dict[str, object]:
    """LoRA targets on a GPTQ / AWQ base (`PEFT_UNREACHED_BASES`): fitcheck's default all-linear becomes
    ``linear-modules`` (every projection by its name, the list a user or axolotl's ``lora_target_linear``
    gives peft, which its dispatchers then wrap), or, where that list cannot run (a vision tower whose
    modules share its leaf names, `fitcheck.engine.lora.validate_targets`), the language model's projections
    by name; an ``all-linear`` asked for is refused, since peft would adapt none of the quantized
    projections ("Target modules set() not found" on a model with no other linear layer)."""
    base = values.get("base_quant")
    if values.get("lora_targets") != "all-linear" or values.get("method", "lora") != "lora":
        return values
    if base not in PEFT_UNREACHED_BASES:
        return values
    if defaulted:
        from fitcheck.engine.lora import linear_module_names, validate_targets
        from fitcheck.vocab import LINEAR_MODULES

        # an MoE keeps session 8's model of its default (per-expert modules and the router's parameter,
        # docs/methodology.md "MoE experts on a GPTQ / AWQ base"): its named form is not derived yet
        if arch is None or arch.is_moe:
            return values
        try:
            validate_targets(arch, LINEAR_MODULES)
        except OptionError:
            return {**values, "lora_targets": ",".join(linear_module_names(arch))}
        return {**values, "lora_targets": LINEAR_MODULES}
    raise OptionError(
        f"--lora-targets all-linear on the {base} base adapts none of its quantized projections: peft's "
        "all-linear takes torch.nn.Linear and Conv1D layers only, and GPTQ / AWQ layers are not "
        "(gptqmodel's BaseQuantLinear is an nn.Module); give --lora-targets linear-modules (every "
        "projection by name, as axolotl's lora_target_linear) or name the projections"
    )


def default_targets(trainer: object) -> str:
    """The LoRA targets a run gets when none are given: LLaMA-Factory's own ``lora_target: all`` rule
    under its trainer (its default; readers/llamafactory.py), else peft's all-linear."""
    from fitcheck.vocab import LMF_ALL

    return LMF_ALL if trainer == "llamafactory" else "all-linear"


def validated(model: type[_M], values: Mapping[str, object]) -> _M:
    """``model`` built from ``values``; a value out of range is one `InputError` line naming its flag.

    Every request model the api builds from user options goes through here (`setup_for`, the plan
    request), so a bound a model declares can never surface as pydantic's internal error.
    """
    from pydantic import ValidationError

    try:
        return model.model_validate(values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "value"
        raise InputError(f"{_flag(field)}: {err['msg']} (got {err.get('input')!r})") from None


def refuse_autocast(values: Mapping[str, object]) -> None:
    """``--autocast`` / ``--no-autocast`` against the rest of the setup (docs/cli.md, the option table)."""
    from fitcheck.engine.regimes import AUTOCAST_TRAINERS

    autocast = values.get("autocast")
    trainer = values.get("trainer") or "generic"
    if autocast is False and values.get("master_weights"):
        raise OptionError(
            "--no-autocast: --master-weights is fp32 weights under autocast; without autocast a model "
            "loaded in fp32 trains in fp32 (--precision fp32)"
        )
    if autocast is True and trainer not in AUTOCAST_TRAINERS:
        raise OptionError(
            f"--autocast: {trainer} runs the model in its own dtype without torch.autocast; "
            f"use --trainer {' / '.join(AUTOCAST_TRAINERS)} for an autocast run"
        )
    if autocast is True and values.get("precision") == "fp32":
        raise OptionError("--autocast: --precision fp32 has no lower-precision dtype to autocast to")


#: Trainers whose code fixes the weights' dtype, so ``--master-weights`` would change nothing: torchtune's
#: recipes and mlx-lm train the model in the dtype it was loaded in (engine/regimes.py ``_torchtune``,
#: ``_mlx``).
NO_MASTER_TRAINERS = ("torchtune", "mlx")


def refuse_master_weights(values: Mapping[str, object]) -> None:
    """``--master-weights`` against the trainer: an error where the trainer has no such mode, and for litgpt
    QLoRA, which litgpt refuses ("Quantization and mixed precision is not supported", finetune/lora.py)."""
    if not values.get("master_weights"):
        return
    trainer = str(values.get("trainer") or "generic")
    if trainer in NO_MASTER_TRAINERS:
        raise OptionError(
            f"--master-weights: {trainer} trains the model in the dtype it loads (no fp32 master copy); "
            "drop it"
        )
    if trainer == "litgpt" and values.get("method") == "qlora":
        raise OptionError(
            "--master-weights: litgpt's mixed precision with quantize raises 'Quantization and mixed "
            "precision is not supported' (finetune/lora.py); use bf16-true (drop --master-weights)"
        )


def refuse_kbit_prep(values: Mapping[str, object]) -> None:
    """``--kbit-prep`` / ``--no-kbit-prep`` against the trainer (docs/cli.md): only under ``hf`` does the
    user's own script decide whether peft's ``prepare_model_for_kbit_training`` runs; the other trainers'
    code decides it, so a value other than theirs is an error."""
    from fitcheck.engine.regimes import KBIT_PREP_DEFAULT

    prep = values.get("kbit_prep")
    trainer = str(values.get("trainer") or "generic")
    if prep is None or trainer == "hf" or prep == KBIT_PREP_DEFAULT.get(trainer, False):
        return
    flag = "--kbit-prep" if prep else "--no-kbit-prep"
    raise OptionError(f"{flag}: {trainer} decides its own k-bit preparation; drop it (or use --trainer hf)")


def refuse_kbit_path(values: Mapping[str, object]) -> None:
    """``--kbit-path`` (docs/cli.md): only under ``hf``, and not against ``--kbit-prep`` / ``--no-kbit-prep``
    (peft and trl-legacy prepare, none and trl do not: engine/regimes.py ``KBIT_PATH_PREPARES``)."""
    from fitcheck.engine.regimes import KBIT_PATH_PREPARES

    path = values.get("kbit_path")
    if path is None:
        return
    trainer = str(values.get("trainer") or "generic")
    if trainer != "hf":
        raise OptionError(
            f"--kbit-path: {trainer} decides its own k-bit preparation; drop it (or use --trainer hf)"
        )
    prep = values.get("kbit_prep")
    if prep is not None and prep != KBIT_PATH_PREPARES[path]:  # type: ignore[index]
        flag = "--kbit-prep" if prep else "--no-kbit-prep"
        raise OptionError(f"{flag} contradicts --kbit-path {path}: give one of them")


def refuse_bnb_flags(values: Mapping[str, object]) -> None:
    """``--bnb-keeps-input`` needs bitsandbytes 4-bit layers (``--method qlora``); ``--ckpt-reentrant``
    needs checkpointing (docs/methodology.md, "bitsandbytes kept inputs")."""
    keeps = values.get("bnb_keeps_input")
    if keeps is not None and values.get("method") != "qlora":
        flag = "--bnb-keeps-input" if keeps else "--no-bnb-keeps-input"
        raise OptionError(f"{flag} applies to --method qlora (bitsandbytes 4-bit layers)")
    reentrant = values.get("ckpt_reentrant")
    if reentrant is not None and not values.get("grad_ckpt"):
        flag = "--ckpt-reentrant" if reentrant else "--no-ckpt-reentrant"
        raise OptionError(f"{flag} applies with --grad-ckpt")


def refuse_optimizer_impl(values: Mapping[str, object]) -> None:
    """``--optimizer-impl`` against the optimizer and the trainer (docs/cli.md): it picks the step of
    ``torch.optim.AdamW``, so another optimizer or a trainer without one is an error."""
    from fitcheck.engine.regimes import TORCH_ADAMW_TRAINERS

    impl = values.get("optimizer_impl")
    if impl is None:
        return
    optimizer = values.get("optimizer") or "adamw"
    trainer = values.get("trainer") or "generic"
    if optimizer != "adamw":
        raise OptionError(f"--optimizer-impl: picks torch AdamW's step; --optimizer {optimizer} has its own")
    if trainer not in TORCH_ADAMW_TRAINERS:
        raise OptionError(
            f"--optimizer-impl: {trainer} does not train with torch.optim.AdamW; use --trainer "
            f"{' / '.join(TORCH_ADAMW_TRAINERS)}"
        )
    if trainer == "litgpt" and values.get("method") == "qlora":
        raise OptionError("--optimizer-impl: litgpt's QLoRA trains with bitsandbytes' PagedAdamW")


def _holds(hint: object, kinds: tuple[type, ...]) -> bool:
    """Whether an option's type is or holds one of ``kinds``, seen through ``| None`` and ``Annotated``."""
    return hint in kinds or any(_holds(arg, kinds) for arg in get_args(hint))


def refuse_bool_numbers(options: Mapping[str, object], kind: type) -> None:
    """A bool given for a number or a name is an error, not 1 or 0: pydantic's lax mode reads
    ``seq_len=True`` as a one-token sequence (and ``batch_size=False`` as 0, refused only by its bound)."""
    hints = get_type_hints(kind, include_extras=True)
    for name, value in options.items():
        hint = hints.get(name)
        if isinstance(value, bool) and hint is not None and not _holds(hint, (bool,)):
            what = "a number" if _holds(hint, (int, float)) else "one of its names"
            raise InputError(f"{_flag(name)}: Input should be {what}, not a bool (got {value!r})")


def _validate(options: Mapping[str, object], kind: type) -> dict[str, object]:
    """Check option names and types (a misspelt keyword is an error, not ignored)."""
    from pydantic import TypeAdapter, ValidationError

    unknown = sorted(set(options) - set(get_type_hints(kind)))
    if unknown:
        raise OptionError(f"unknown option {unknown[0]!r}")
    refuse_bool_numbers(options, kind)
    try:
        return dict(TypeAdapter(kind).validate_python(dict(options)))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "value"
        if err["type"] == "extra_forbidden":
            raise OptionError(f"unknown option {field!r}") from None
        raise InputError(f"{_flag(field)}: {err['msg']} (got {err.get('input')!r})") from None


# --- estimate, check -------------------------------------------------------------------------------


def estimate(
    model: str | Spec,
    *,
    on: str | Target | None = None,
    headroom: str | None = None,
    **options: Unpack[TrainingOptions],
) -> Estimate:
    """Memory of one training step, with a verdict when ``on`` names a machine (None: no verdict).

    Raises:
        FitcheckError: an unknown model or target, or an option that does not apply (exit 2 in the CLI).
    """
    opts = _validate(options, TrainingOptions)
    spec = _spec(model)
    gpus = opts.get("gpus")
    tgt = _target(on, headroom, gpus if isinstance(gpus, int) else None)
    refuse_inert(spec, opts)
    auto = is_auto(on)
    if auto:
        refuse_gpu_run_here(tgt, opts)
    setup = setup_for(spec, opts, tgt)
    host = opts.get("host_memory")
    host_memory = host if isinstance(host, str) else None
    return estimate_setup(spec, setup, tgt, auto=auto, host_memory=host_memory)


def estimate_setup(
    spec: Spec, setup: Setup, tgt: Target | None = None, auto: bool = False, host_memory: str | None = None
) -> Estimate:
    """Run the workload's estimator on a built setup, then the verdict (one path for both)."""
    from fitcheck.diffusion.estimate import estimate_diffusion
    from fitcheck.diffusion.verdict import diffusion_verdict
    from fitcheck.engine.estimate import estimate as estimate_llm
    from fitcheck.engine.verdict import verdict
    from fitcheck.models import LlmSetup, ModelSpec

    ctx = tgt.context_bytes or None if tgt is not None else None
    from fitcheck.engine.distributed_notes import host_verdict, order_notes

    if isinstance(spec, ModelSpec):
        assert isinstance(setup, LlmSetup)
        est = estimate_llm(spec, setup, ctx)

        def again(s: ModelSpec, st: LlmSetup) -> Estimate:
            # suggestions and notes compare device bytes, which the allocator history is not in; a
            # remedy the target's GPU cannot run (--attn flash on a T4) is refused, so not offered
            refuse_flash_on(s, st, tgt)
            return estimate_llm(s, st, ctx, history=False)

        if setup.distributed:
            est = est.model_copy(update={"warnings": (*est.warnings, *order_notes(spec, setup, est, again))})
        if tgt is None:
            return est
        v = verdict(est, tgt, spec, again)
    else:
        assert not isinstance(setup, LlmSetup)
        est = estimate_diffusion(spec, setup, ctx)
        if tgt is None:
            return est
        v = diffusion_verdict(est, tgt, spec)
    est = est.model_copy(update={"target": host_verdict(v, est, tgt, host_memory)})
    if auto and tgt.backend == "cpu":
        note = "no GPU detected: sized against this machine's RAM; --on rtx-4090 (or 24GB) sizes a GPU"
        est = est.model_copy(update={"warnings": (*est.warnings, note)})
    return est


def check(
    model: str | Spec,
    on: str | Target | None,
    *,
    headroom: str | None = None,
    **options: Unpack[TrainingOptions],
) -> Estimate:
    """`estimate` with its verdict; ``on`` is required (``check`` exists to give a verdict).

    Raises:
        OptionError: ``on`` is None or ``none``.
    """
    if on is None or (isinstance(on, str) and on.strip().lower() == "none"):
        raise OptionError(
            "check gives a verdict: name the training GPU with --on (rtx-4090, 24GB, 2x4090, auto); "
            "for a figure without one use fitcheck estimate"
        )
    est = estimate(model, on=on, headroom=headroom, **options)
    assert est.target is not None
    return est


# --- plan ------------------------------------------------------------------------------------------


def plan(
    model: str | Spec,
    on: str | Target | None = None,
    *,
    headroom: str | None = None,
    **options: Unpack[PlanOptions],
) -> Plan:
    """The fastest configuration that fits ``on``, explained (docs/planner.md); one `Plan` for LLMs
    and diffusion models (its ``kind`` says which). When no configuration's likely range fits, the best
    whose central estimate fits, with ``verdict`` ``tight`` (as `check` judges it); ``verdict``
    ``does_not_fit`` and no ``chosen`` when none does.

    ``on=None`` (``--on none``) plans with no memory limit on the backend's assumed device: the
    fastest configuration, with the least memory any configuration needs in ``min_device_bytes``.
    """
    opts = _validate(options, PlanOptions)
    spec = _spec(model)
    refuse_foreign(spec, opts)
    refuse_inert(spec, opts)
    gpus = opts.get("gpus")
    tgt = _target(on, headroom, gpus if isinstance(gpus, int) else None)
    if tgt is None:
        from fitcheck.hardware.budget import unlimited_target

        tgt = unlimited_target()
    if kind_of(spec) == "llm":
        return _plan_llm(spec, tgt, opts, headroom)  # type: ignore[arg-type]
    return _plan_diffusion(spec, tgt, opts, headroom)  # type: ignore[arg-type]


def _stored_method(spec: ModelSpec, method: object) -> object:
    """A plan's method: on a pre-quantized checkpoint, ``auto`` is LoRA on its stored base (nothing heavier:
    `fitcheck.sources.prequant`); anything asked stays as asked (and is checked there)."""
    from fitcheck.sources.prequant import read_prequant

    stored = read_prequant(spec.hf_config) if spec.hf_config else None
    if stored is not None and not stored.dequantized and method == "auto":
        return stored.method
    return method


def _plan_llm(spec: ModelSpec, tgt: Target, opts: dict[str, object], headroom: str | None) -> Plan:
    from fitcheck.planner.models import PlanRequest, default_effective_batch
    from fitcheck.planner.plan import make_plan

    trainer = opts.get("trainer") or "hf"
    if opts.get("master_weights") and trainer not in ("generic", "hf"):
        raise OptionError(
            f"--master-weights: {trainer} decides its own precision; drop it (or use --trainer hf)"
        )
    method = _stored_method(spec, opts.get("method") or "auto")
    if method == "prefix-tuning":
        raise OptionError(
            "plan searches full, LoRA and QLoRA setups; size a prefix-tuning run with estimate or check"
        )
    if opts.get("optimizer_in_bwd") and method == "auto":
        method = "full"  # the step in backward is torchtune's full fine-tuning (engine/estimate.py)
    if opts.get("optimizer_impl") is not None:  # it picks torch AdamW's step: the optimizer is AdamW
        opts = {"optimizer": "adamw", **{k: v for k, v in opts.items() if v is not None}}
        refuse_optimizer_impl({**opts, "trainer": trainer})
    llm_extra = (
        "base_quant",
        "train_modules",
        "loss",
        "offload_activations",
        "optimizer_in_bwd",
        "autocast",
        "compile",
        "kbit_prep",
        "kbit_path",
        "keep_logits",
        "padding_free",
        "optimizer_impl",
    )
    base_keys: tuple[str, ...] = ("dora", "lora_fa", "master_weights", *_LORA, "double_quant", "seq_len")
    base_keys += ("nodes", "fsdp_version", "device_map_version", "moe_layout", "fsdp_embedding_units")
    base_keys += ("zero_bucket_size",)
    base_keys += ("zero_overlap_comm", "lengths")
    base_opts = {k: opts.get(k) for k in (*base_keys, "quant_storage", *llm_extra)}
    base = setup_for(
        spec, {**base_opts, "method": "full" if method == "full" else "lora", "trainer": trainer}, tgt
    )
    seq_len = opts.get("seq_len") or 2048
    searched: tuple[str, ...] = ("min_seq_len", "batch_size", "grad_ckpt", "optimizer", "attn", "precision")
    searched += ("dataset_tokens", "epochs", "strategy", "offload")
    req = validated(
        PlanRequest,
        {
            "base": base,
            "method": method,
            "effective_batch": opts.get("effective_batch") or default_effective_batch(tgt.gpus * base.nodes),
            "seq_len": seq_len,
            **{k: opts.get(k) for k in searched},
        },
    )
    host = opts.get("host_memory")
    if isinstance(host, str):
        from fitcheck.units import parse_option_memory

        tgt = tgt.model_copy(update={"host_memory_bytes": parse_option_memory("--host-memory", host)})
    return make_plan(spec, tgt, device_for(tgt), req, other_targets(tgt, headroom), device_for)


def _plan_diffusion(spec: DiffusionSpec, tgt: Target, opts: dict[str, object], headroom: str | None) -> Plan:
    from fitcheck.diffusion.plan import plan_diffusion

    gpus = opts.get("gpus")
    if (
        (isinstance(gpus, int) and gpus > 1)
        or tgt.gpus > 1
        or opts.get("strategy")
        or opts.get("nodes", 1) != 1
    ):
        raise OptionError(
            "--gpus: diffusion plans are for one GPU so far; fitcheck estimate gives the per-GPU memory of "
            "kohya's data-parallel run (docs/distributed.md#diffusion)"
        )
    if opts.get("offload") not in (None, "none"):
        raise OptionError(
            f"--offload {opts['offload']}: kohya sd-scripts offloads nothing to the CPU (no ZeRO or FSDP "
            "run is planned for diffusion models)"
        )
    floor, res = opts.get("min_resolution"), opts.get("resolution")
    if isinstance(floor, int) and isinstance(res, int) and floor > res:
        raise OptionError(
            f"--min-resolution {floor} is above --resolution {res}: it is the lowest to step down to"
        )
    method = opts.get("method") or "auto"
    batch = opts.get("batch_size") or 1
    effective = opts.get("effective_batch") or 1
    asked = {
        **{k: v for k, v in opts.items() if k not in ("effective_batch", "min_resolution", "grad_ckpt")},
        "method": "lora" if method == "auto" else method,
        "batch_size": batch,
        "grad_accum": max(1, effective // batch),  # type: ignore[operator]
        "grad_ckpt": bool(opts.get("grad_ckpt")),
    }
    if opts.get("precision") is None:  # bf16 only where the catalog says the device has it
        from fitcheck.planner.kernels import diffusion_precision

        asked["precision"] = diffusion_precision(tgt)
    setup = setup_for(spec, asked, tgt)
    from fitcheck.models import DiffusionSetup

    assert isinstance(setup, DiffusionSetup)  # setup_for of a diffusion spec
    others = other_targets(tgt, headroom)
    return plan_diffusion(spec, setup, tgt, floor if isinstance(floor, int) else None, others=others)


def device_for(tgt: Target) -> DevicePerf:
    """The target's speed figures: its catalog entry, else the backend's labelled assumption."""
    from fitcheck.hardware.catalog import find_entry
    from fitcheck.planner.device import catalog_id, default_perf, perf_from_entry

    entry = find_entry(catalog_id(tgt))
    return perf_from_entry(entry) if entry is not None else default_perf(tgt)


def other_targets(tgt: Target, headroom: str | None) -> list[Target]:
    """Catalog devices of the target's backend, with the same headroom rule (for "a bigger device")."""
    from fitcheck.hardware.budget import apply_headroom, entry_target
    from fitcheck.hardware.catalog import entries

    if tgt.backend == "cpu" or tgt.id == "none":
        return []
    return [apply_headroom(entry_target(e), headroom) for e in entries(tgt.backend)]


# --- catalogs --------------------------------------------------------------------------------------


def models() -> list[ModelInfo]:
    """Every model preset: LLMs, then diffusion pipelines."""
    from fitcheck.diffusion.sources import diffusion_ids
    from fitcheck.diffusion.sources import spec_from_preset as diffusion_preset
    from fitcheck.engine.params import count_params
    from fitcheck.models import ModelInfo
    from fitcheck.presets import preset_ids
    from fitcheck.sources.resolve import spec_from_preset

    rows: list[ModelInfo] = []
    for pid in preset_ids("models"):
        spec = spec_from_preset(pid)
        a = spec.arch
        rows.append(
            ModelInfo(
                id=pid,
                name=spec.name,
                params=count_params(a),
                model_type=a.model_type,
                layers=a.num_layers,
                hidden=a.hidden_size,
                vocab=a.vocab_size,
                experts=a.num_experts,
                hf_id=spec.hf_id,
                kind="llm",
            )
        )
    for pid in diffusion_ids():
        d = diffusion_preset(pid)
        rows.append(
            ModelInfo(
                id=pid,
                name=d.name,
                params=d.total_params,
                model_type=f"{d.family} " + ("unet" if d.denoiser.name == "unet" else "dit"),
                hf_id=d.hf_id,
                kind="diffusion",
            )
        )
    return rows


def hardware(backend: str | None = None) -> HwCatalog:
    """The hardware catalog (ids for ``on``), optionally one backend's devices."""
    from fitcheck.hardware.report import catalog_table

    return catalog_table(backend)


def detect(headroom: str | None = None, probe_env: ProbeEnv | None = None) -> HwReport:
    """This machine: devices, memory and the usable budget, with how each figure was measured."""
    from fitcheck.hardware.report import detect_report

    _need_text(headroom, "headroom (a size like 2GB or a percentage)", optional=True)
    return detect_report(probe_env, headroom=headroom)
