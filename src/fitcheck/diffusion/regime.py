"""Where each part lives during a training step, in which dtype, and what trains (kohya sd-scripts).

The rules are kohya sd-scripts' (``train_network.py``, ``sdxl_train.py``, ``flux_train_network.py`` at
the commit of ``tests/data/kohya_args.tsv``); the table with a source per row is in docs/diffusion.md,
"Parts and dtypes":

- UNet/DiT: always on the device; LoRA: frozen in the mixed-precision dtype (fp8 e4m3 with
  ``fp8_base``); full: fp32 weights (accelerate AMP) or the compute dtype with ``full_bf16``;
- text encoders: on the device unless their outputs are cached (and they do not train);
- VAE: on the device unless latents are cached;
- LoRA modules: fp32, or the compute dtype with ``full_bf16``/``full_fp16``.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.diffusion.spec import DiffusionSpec, PartSpec
from fitcheck.errors import OptionError
from fitcheck.facts.optimizers import BITSANDBYTES
from fitcheck.models import DiffusionSetup, Regime

SRC_KOHYA = (
    "kohya-ss/sd-scripts 48d368f: train_network.py, sdxl_train.py, flux_train_network.py (dtypes per part)"
)
#: Optimizers whose kernels need bitsandbytes (CUDA; not on Apple silicon).
BNB = BITSANDBYTES


@dataclass(frozen=True)
class PartPlan:
    """One part during the step: on the device or not, weight dtype, what trains."""

    part: PartSpec
    on_device: bool
    dtype: str
    train: str  # "none" | "lora" | "full"

    @property
    def name(self) -> str:
        return self.part.name


def compute_dtype(setup: DiffusionSetup) -> str:
    """kohya's ``weight_dtype``: the ``mixed_precision`` dtype (fp32 when mixed precision is off)."""
    return setup.precision


def trainable_dtype(setup: DiffusionSetup) -> str:
    """Dtype of trained weights: fp32 (accelerate AMP) unless ``full_bf16``/``full_fp16``."""
    if setup.full_bf16:
        return "bf16"
    if setup.full_fp16:
        return "fp16"
    return "fp32"


def check(spec: DiffusionSpec, setup: DiffusionSetup) -> None:
    """Refuse setups kohya sd-scripts refuses (its asserts in train()) or that fitcheck cannot model."""
    if setup.method == "qlora":
        raise OptionError("--method qlora is for LLMs; for diffusion use --method lora with --fp8-base")
    if setup.full_bf16 and setup.precision != "bf16":
        raise OptionError("--full-bf16 needs --precision bf16 (kohya asserts mixed_precision='bf16')")
    if setup.full_fp16 and setup.precision != "fp16":
        raise OptionError("--full-fp16 needs --precision fp16 (kohya asserts mixed_precision='fp16')")
    if setup.full_bf16 and setup.full_fp16:
        raise OptionError("--full-bf16 and --full-fp16 exclude each other")
    if setup.fp8_base and setup.precision == "fp32":
        raise OptionError("--fp8-base needs --precision bf16 or fp16 (kohya asserts mixed precision)")
    if setup.fp8_base and setup.method == "full":
        raise OptionError("--fp8-base stores frozen base weights; with --method full every weight trains")
    if setup.fp8_base and setup.backend == "mps":
        raise OptionError("--fp8-base: PyTorch MPS has no float8 tensors; use bf16 on Apple silicon")
    if setup.attn == "xformers" and setup.backend == "mps":
        raise OptionError("xformers is CUDA-only and crashes on Apple silicon; use --attn sdpa")
    if setup.optimizer in BNB and setup.backend == "mps":
        raise OptionError(
            f"--optimizer {setup.optimizer} needs bitsandbytes CUDA kernels; on Apple silicon use "
            "adamw, adafactor or lion"
        )
    if setup.cache_text_encoder_outputs and spec.family in ("sd1", "sd2"):
        raise OptionError(
            "--cache-text-encoder-outputs: kohya's train_network.py for SD 1.x/2.x has no such option "
            "(only the SDXL, SD3 and FLUX scripts do)"
        )
    if setup.cache_text_encoder_outputs and setup.train_text_encoder and spec.family != "flux":
        raise OptionError("--cache-text-encoder-outputs cannot be combined with --train-text-encoder")
    if setup.lora_targets not in ("all-linear", "conv"):
        raise OptionError(
            "--lora-targets for diffusion: all-linear (kohya's default modules) or conv (also the 3x3 "
            "convolutions, conv_dim = rank)"
        )
    if setup.lora_dropout:
        raise OptionError("--lora-dropout is not modelled for diffusion (kohya network_dropout)")


def plan_parts(spec: DiffusionSpec, setup: DiffusionSetup) -> list[PartPlan]:
    """Residency, dtype and training role of every part."""
    c = compute_dtype(setup)
    frozen = "fp8" if setup.fp8_base else c
    full = setup.method == "full"
    out: list[PartPlan] = []
    for p in spec.parts:
        if p.role == "denoiser":
            out.append(
                PartPlan(p, True, trainable_dtype(setup) if full else frozen, "full" if full else "lora")
            )
        elif p.role == "text_encoder":
            trains = setup.train_text_encoder and trainable_text_encoder(spec, p)
            cached = setup.cache_text_encoder_outputs and not trains
            if trains:
                out.append(
                    PartPlan(p, True, trainable_dtype(setup) if full else c, "full" if full else "lora")
                )
            else:
                out.append(PartPlan(p, not cached, frozen, "none"))
        else:
            out.append(PartPlan(p, not setup.cache_latents, c, "none"))
    return out


def trainable_text_encoder(spec: DiffusionSpec, part: PartSpec) -> bool:
    """CLIP encoders train with ``--train-text-encoder``; T5-XXL does not (kohya's default)."""
    return part.class_name.startswith("CLIP")


def regime(spec: DiffusionSpec, setup: DiffusionSetup) -> Regime:
    """The `Regime` record of the estimate (the dtypes of the denoiser's tensors)."""
    full = setup.method == "full"
    c = compute_dtype(setup)
    td = trainable_dtype(setup)
    adapter = td if (setup.full_bf16 or setup.full_fp16) else "fp32"
    base = "fp8" if setup.fp8_base else c
    return Regime(
        name="kohya",
        description=(
            "kohya sd-scripts: "
            + (f"{td} trainable weights" if full else f"frozen {base} base, LoRA in {adapter}")
            + (f", autocast {c}" if c != "fp32" else ", fp32")
            + ", optimizer states in the parameter dtype"
        ),
        weight_dtype=td if full else base,  # type: ignore[arg-type]
        trainable_dtype=td,  # type: ignore[arg-type]
        adapter_dtype=adapter,  # type: ignore[arg-type]
        grad_dtype=(td if full else adapter),  # type: ignore[arg-type]
        optimizer_state_dtype="param",
        master_weights=False,
        autocast=c != "fp32",
        logits_fp32=False,
        kbit_upcast=False,
        fused_optimizer=False,
        source=SRC_KOHYA,
    )
