"""Attention kernels and precisions: what each architecture can run, on each backend, under each trainer.

One table per kind of fact, each row with its source. The planner (`fitcheck.planner.rules`, the
diffusion planner) and every emitter ask the functions below, so a fact is written once:

* `KERNEL_BACKENDS`: where a kernel runs at all; `flash_device_refusal`, on which GPUs of those backends
  FlashAttention-2 trains (NVIDIA from compute capability 8.0; AMD Instinct MI200 / MI300, head
  dimensions up to 128 in the backward).
* `TRAINER_KERNELS`: which kernels a trainer's config can name.
* `ARCH_KERNELS`: transformers' per-model ``_supports_sdpa`` / ``_supports_flash_attn`` flags for the
  preset architectures; an architecture outside the table follows `SOFTCAP`: attention logit
  soft-capping (Gemma 2) is applied by eager attention and FlashAttention-2's ``softcap`` argument
  only, so SDPA and xformers would train a different model.
* `MLX_KERNEL`: mlx-lm runs its own model code, one attention per architecture; the kernel name is
  the engine's memory model of it (``eager``: explicit score matrices).
* Precisions: bf16 where the device has it (the hardware catalog, `fitcheck.planner.device`); full
  fine-tuning in fp16 needs fp32 weights under AMP, because ``GradScaler`` refuses fp16 gradients;
  a trainer that cannot load fp32 weights with fp16 autocast (axolotl), or has no loss scaling
  (mlx-lm), trains full in fp32 where the device lacks bf16 (`FP16_FULL`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.models import BACKENDS, DecoderArch, Target

#: Tie order: earlier wins when throughput is equal.
KERNEL_ORDER = ("flash", "xformers", "sdpa", "eager")
FLASH_MIN_CC = 8.0

#: kernel -> (backends it runs on, source)
KERNEL_BACKENDS: dict[str, tuple[tuple[str, ...], str]] = {
    "flash": (
        ("cuda", "rocm"),
        "Dao-AILab/flash-attention README @014c349e ('NVIDIA CUDA Support': Ampere, Ada, Hopper; "
        "'AMD ROCm Support': composable_kernel backend, MI200 or MI300 GPUs)",
    ),
    "xformers": (("cuda",), "seeds/000 (Apple 3: CUDA-only, crashes on MPS); facebookresearch/xformers#731"),
    "sdpa": (
        BACKENDS,
        "PyTorch docs torch.nn.functional.scaled_dot_product_attention (CUDA, ROCm, MPS, CPU backends; "
        "MPS keeps the s^2 scores in training: design.md section 3)",
    ),
    "eager": (BACKENDS, "plain matmul + softmax: every backend"),
}

#: AMD GPU architectures FlashAttention-2 trains on, and its backward's largest head dimension there
#: (Dao-AILab/flash-attention README @014c349e, "AMD ROCm Support": "FlashAttention-2 with ROCm currently
#: supports: 1. MI200 or MI300 GPUs. 2. Datatype fp16 and bf16 3. Forward's head dimensions up to 256.
#: Backward head dimensions up to 128."). MI200 is CDNA2, MI300 / MI325X CDNA3 (the catalog's
#: ``architecture``); RDNA (Radeon) is not listed.
FLASH_ROCM_ARCHS = ("CDNA2", "CDNA3")
FLASH_ROCM_MAX_HEAD_DIM = 128

#: trainer -> kernels its config can name (hf/axolotl: attn_implementation; LLaMA-Factory: flash_attn
#: fa2/sdpa/disabled; kohya: --sdpa/--xformers flags; mlx-lm and torchtune name none).
TRAINER_KERNELS: dict[str, tuple[str, ...]] = {
    "hf": ("flash", "sdpa", "eager"),
    "axolotl": ("flash", "xformers", "sdpa", "eager"),
    "llamafactory": ("flash", "sdpa", "eager"),
    "mlx": ("sdpa", "eager"),
    "torchtune": ("sdpa",),
    # litgpt's CausalSelfAttention calls torch SDPA (litgpt/model.py @00af8b0d, read for the litgpt rules);
    # Unsloth's own attention dispatch (FlashAttention-2, xformers or SDPA) is not read at a commit here:
    # the three O(s) kernels are offered, eager is not
    "litgpt": ("sdpa",),
    "unsloth": ("flash", "xformers", "sdpa"),
    "generic": ("flash", "xformers", "sdpa", "eager"),
    "kohya": ("xformers", "sdpa", "eager"),
}
TRAINER_KERNELS_SOURCE = (
    "tests/data/trainer_keys (TRL ModelConfig attn_implementation, axolotl attn_implementation values, "
    "LLaMA-Factory flash_attn auto|disabled|sdpa|fa2|fa3), tests/data/kohya_args.tsv (--sdpa, --xformers)"
)


@dataclass(frozen=True)
class ArchKernels:
    """transformers' flags for one model type: which kernels its attention classes accept."""

    sdpa: bool
    flash: bool
    source: str


_TF = "transformers 5.24.0 src/transformers/models/{m}/modeling_{m}.py ({cls}PreTrainedModel)"
#: model_type -> flags, for the preset architectures (checked against transformers in the tests).
ARCH_KERNELS: dict[str, ArchKernels] = {
    "gemma2": ArchKernels(
        sdpa=False,
        flash=True,
        source=_TF.format(m="gemma2", cls="Gemma2")
        + ": _supports_sdpa = False ('sdpa does not support softcapping'); HF google/gemma-2-27b-it "
        "discussion #22 (eager by default); LLaMA-Factory model_utils/attention.py @ff6d4d12 (fa2, else "
        "eager; sdpa only warns and drops the soft-cap); flash-attn >= 2.6 softcap",
    ),
    **{
        m: ArchKernels(sdpa=True, flash=True, source=_TF.format(m=m, cls=cls))
        for m, cls in (
            ("gemma3", "Gemma3"),
            ("gemma3_text", "Gemma3"),
            ("gpt2", "GPT2"),
            ("llama", "Llama"),
            ("mistral", "Mistral"),
            ("mixtral", "Mixtral"),
            ("phi3", "Phi3"),
            ("qwen2", "Qwen2"),
            ("qwen3", "Qwen3"),
            ("qwen3_moe", "Qwen3Moe"),
        )
    },
}
#: An architecture outside the table: soft-capped attention logits rule out SDPA and xformers.
SOFTCAP = ArchKernels(
    sdpa=False,
    flash=True,
    source="attention soft-capping is applied by eager attention and flash-attn's softcap only "
    "(transformers gemma2 eager_attention_forward; PyTorch SDPA has no softcap argument)",
)
DEFAULT_ARCH = ArchKernels(sdpa=True, flash=True, source="transformers default for decoder models")

#: mlx-lm: the one attention of its model code, as the engine's memory kernel.
MLX_KERNEL_SOURCE = (
    "ml-explore/mlx-lm mlx_lm/models/gemma2.py @1245c2ec (scores = queries @ keys, tanh soft-cap, "
    "softmax: explicit s^2 scores); other models call mx.fast.scaled_dot_product_attention "
    "(mlx_lm/models/base.py)"
)


def arch_kernels(arch: DecoderArch) -> ArchKernels:
    """transformers' flags for this architecture (the table, else the soft-capping rule)."""
    if arch.model_type in ARCH_KERNELS:
        return ARCH_KERNELS[arch.model_type]
    return SOFTCAP if arch.attn_logit_softcapping else DEFAULT_ARCH


def mlx_kernel(arch: DecoderArch) -> str:
    """The kernel mlx-lm's model code amounts to: explicit scores where it soft-caps them."""
    return "eager" if arch.attn_logit_softcapping else "sdpa"


def kernels_for(
    arch: DecoderArch, trainer: str, backend: str, cc: float | None, gpu_arch: str | None = None
) -> tuple[str, ...]:
    """Every kernel this architecture can train with here, in the tie order."""
    if trainer == "mlx":
        return (mlx_kernel(arch),)
    return tuple(k for k in KERNEL_ORDER if refusal(arch, trainer, backend, cc, k, gpu_arch) is None)


def flash_device_refusal(
    backend: str, cc: float | None, gpu_arch: str | None, head_dim: int | None, name: str = ""
) -> str | None:
    """Why FlashAttention-2 cannot train on this GPU (None where it can, or where the GPU is not known:
    no compute capability on CUDA, no architecture on ROCm)."""
    on = f"; {name} has " if name else "; this GPU has "
    if backend == "cuda" and cc is not None and cc < FLASH_MIN_CC:
        return f"FlashAttention-2 needs compute capability {FLASH_MIN_CC:.1f} or newer{on}{cc:.1f}"
    if backend != "rocm":
        return None
    if gpu_arch is not None and not gpu_arch.startswith(FLASH_ROCM_ARCHS):
        return f"FlashAttention-2 on AMD GPUs runs on Instinct MI200 / MI300 (CDNA2, CDNA3){on}{gpu_arch}"
    if head_dim is not None and head_dim > FLASH_ROCM_MAX_HEAD_DIM:
        return (
            f"FlashAttention-2 on AMD GPUs trains head dimensions up to {FLASH_ROCM_MAX_HEAD_DIM} (its "
            f"backward); this model's is {head_dim}"
        )
    return None


def refusal(
    arch: DecoderArch,
    trainer: str,
    backend: str,
    cc: float | None,
    kernel: str,
    gpu_arch: str | None = None,
) -> str | None:
    """Why ``kernel`` cannot train this architecture here (naming what can), or None. ``cc`` (CUDA) and
    ``gpu_arch`` (ROCm: the catalog's architecture) name the GPU; None where it is not known."""
    if trainer == "mlx":
        own = mlx_kernel(arch)
        if kernel == own:
            return None
        return (
            f"mlx-lm runs its own attention for {arch.model_type} (--attn {own}); --attn {kernel} cannot "
            "be written"
        )
    backends, _ = KERNEL_BACKENDS[kernel]
    if backend not in backends:
        if kernel == "xformers" and backend == "mps":
            return "xformers is CUDA-only and crashes on Apple silicon; use --attn sdpa"
        if kernel == "flash":
            return (
                f"--attn flash needs an NVIDIA (Ampere or newer) or AMD Instinct GPU; on {backend} use "
                "--attn sdpa"
            )
        return f"--attn {kernel} needs an NVIDIA GPU; on {backend} use --attn sdpa"
    if kernel == "flash":
        why = flash_device_refusal(backend, cc, gpu_arch, arch.head_dim)
        if why is not None:
            return why
    flags = arch_kernels(arch)
    if kernel in ("sdpa", "xformers") and not flags.sdpa:
        return (
            f"{arch.model_type} soft-caps its attention logits, which --attn {kernel} drops (a different "
            "model would train); use --attn eager (or flash on an Ampere or newer NVIDIA GPU)"
        )
    if kernel == "flash" and not flags.flash:
        return f"{arch.model_type} has no FlashAttention-2 path in transformers; use --attn sdpa"
    if kernel not in TRAINER_KERNELS[trainer]:
        can = ", ".join(TRAINER_KERNELS[trainer])
        return f"--trainer {trainer} cannot select --attn {kernel}; it offers {can}"
    return None


# ------------------------------------------------------------------------------------ precisions

#: Full fine-tuning in fp16 per trainer: "amp" loads fp32 weights and autocasts (16 B/param with
#: AdamW); "fp32" means the trainer cannot, so fp16 is replaced by fp32; "ok" keeps fp16 (the trainer
#: upcasts the trainable weights itself).
FP16_FULL: dict[str, tuple[str, str]] = {
    "hf": (
        "amp",
        "torch/amp/grad_scaler.py _unscale_grads_: 'Attempting to unscale FP16 gradients.'; TRL "
        "ModelConfig dtype float32 + fp16: true is transformers' AMP",
    ),
    "axolotl": (
        "fp32",
        "axolotl utils/config/__init__.py resolve_dtype @067b021c (fp16 -> torch_dtype float16); "
        "schemas/validation.py check_fft_possible_bad_config ('Attempting to unscale FP16 gradients')",
    ),
    "llamafactory": (
        "ok",
        "LLaMA-Factory model/adapter.py _setup_full_tuning @ff6d4d12 (trainable params cast to fp32)",
    ),
    "mlx": (
        "fp32",
        "mlx-lm tuner/trainer.py @d78bf58e: no loss scaling; MLX has no autocast, so fp16 grads underflow",
    ),
}


def fp16_full(trainer: str) -> str:
    """``amp``, ``fp32`` or ``ok``: how full fine-tuning in fp16 must be written for this trainer."""
    return FP16_FULL.get(trainer, ("ok", ""))[0]


def amp_fp32_weights(trainer: str, method: str, precision: str) -> bool:
    """Whether the plan must load fp32 weights and autocast (fp16 full fine-tuning under the HF Trainer)."""
    return method == "full" and precision == "fp16" and fp16_full(trainer) == "amp"


def precisions_for(trainer: str, method: str, backend: str, bf16_native: bool) -> tuple[str, ...]:
    """Compute dtypes to search, in the tie order: bf16 where the hardware has it, else fp16 (fp32 for
    a trainer that cannot train full weights in fp16); bf16 or fp32 on a CPU."""
    if backend == "cpu":
        return ("bf16", "fp32")
    out = ["bf16", "fp16"] if bf16_native else ["fp16"]
    if method == "full" and fp16_full(trainer) == "fp32":
        out = [p if p != "fp16" else "fp32" for p in out]
    return tuple(dict.fromkeys(out))


def precision_refusal(trainer: str, method: str, precision: str) -> str | None:
    """Why ``precision`` cannot be written for this trainer and method, or None."""
    if method == "full" and precision == "fp16" and fp16_full(trainer) == "fp32":
        if trainer == "mlx":
            return (
                "mlx-lm has no loss scaling, so a full fine-tune in fp16 underflows; use --precision "
                "bf16 (M3 or newer) or fp32"
            )
        return (
            f"{trainer} loads fp16 weights when fp16 is on, and the GradScaler cannot unscale fp16 "
            "gradients: use --precision bf16 (where the GPU has it) or fp32, or --trainer hf (fp32 weights "
            "with fp16 autocast)"
        )
    return None


def target_bf16(target: Target) -> bool:
    """Whether the target has bf16 in hardware, as the hardware catalog says (`fitcheck.planner.device`)."""
    from fitcheck.hardware.catalog import find_entry
    from fitcheck.planner.device import catalog_id, default_perf, perf_from_entry

    entry = find_entry(catalog_id(target))
    return (perf_from_entry(entry) if entry is not None else default_perf(target)).bf16_native


def diffusion_precision(target: Target) -> str:
    """kohya's mixed precision when none is asked: bf16 where the catalog says the device has it, else
    fp16 (design.md section 6: bf16 where the card supports it)."""
    return "bf16" if target.backend == "cpu" or target_bf16(target) else "fp16"


# ---------------------------------------------------------------------------------- kohya (DiT)

#: sd-scripts families whose scripts read ``--sdpa`` / ``--xformers`` / ``--mem_eff_attn``
#: (train_util.replace_unet_modules). SD3 and FLUX run their own attention (torch SDPA) and read none.
KOHYA_ATTN_FLAGS: dict[str, bool] = {"sd1": True, "sd2": True, "sdxl": True, "sd3": False, "flux": False}
KOHYA_ATTN_SOURCE = (
    "kohya-ss/sd-scripts @48d368f: train_network.py, fine_tune.py, sdxl_train.py call "
    "replace_unet_modules(unet, args.mem_eff_attn, args.xformers, args.sdpa); sd3_train_network.py, "
    "flux_train_network.py, sd3_train.py, flux_train.py never read args.sdpa or args.xformers"
)


def kohya_reads_attention_flags(family: str) -> bool:
    """Whether the family's sd-scripts scripts read the attention flags at all."""
    return KOHYA_ATTN_FLAGS.get(family, True)
