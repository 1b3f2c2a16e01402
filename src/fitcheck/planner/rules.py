"""Backend rules: which values each searched dimension may take on this device and trainer.

Facts are tables (one row per rule, with its source); the functions below only read them. A value
the user fixes is checked against the same facts: what cannot run (xformers on Apple silicon, a
bitsandbytes 8-bit optimizer under MPS, FlashAttention-2 before Ampere) or cannot be written for the
trainer is an `OptionError` (exit 2) that names an alternative.
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.errors import OptionError
from fitcheck.facts.optimizers import BITSANDBYTES
from fitcheck.models import ModelSpec, Strategy, Target
from fitcheck.planner import kernels as K
from fitcheck.planner.models import DevicePerf, PlanRequest


@dataclass(frozen=True)
class Rule:
    """One backend rule, shown as a reason wherever it decides something."""

    id: str
    text: str
    source: str


_RULES = (
    Rule(
        "effective-batch",
        "micro-batch x gradient accumulation x GPUs = the effective batch",
        "issue #5; seeds/000 (Nvidia 2: accumulation simulates a larger batch without its memory)",
    ),
    Rule(
        "tensor-core-batch",
        "micro-batch a power of two or a multiple of 8, so matrix shapes fill Tensor Core tiles",
        "seeds/000 (Nvidia 1: train_batch_size 4, 8 or 16; matrices in multiples of 8 or 16)",
    ),
    Rule(
        "small-card-accum",
        "12-16 GB cards: micro-batch 1-2 with gradient accumulation when larger micro-batches do not fit",
        "seeds/000 (Nvidia 2: batch 1 or 2 with gradient_accumulation_steps=4 on 12-16 GB)",
    ),
    Rule(
        "mps-small-batch",
        "Apple silicon: micro-batch 1-2; larger ones saturate the GPU and throttle without a speed-up",
        "seeds/000 (Apple 1: batch piu' piccolo, 1 o 2)",
    ),
    Rule(
        "flash-ampere",
        "FlashAttention-2 on NVIDIA Ampere or newer (compute capability >= 8.0) and on AMD Instinct "
        "MI200 / MI300 (head dimensions up to 128)",
        "seeds/000 (Nvidia 3: XFormers o FlashAttention-2); Dao-AILab/flash-attention README @014c349e "
        "(CUDA: Ampere, Ada, Hopper; ROCm: MI200 or MI300, backward head dimensions up to 128)",
    ),
    Rule(
        "xformers",
        "xformers memory-efficient attention where the trainer offers it (axolotl) and FlashAttention-2 "
        "is not available",
        "seeds/000 (Nvidia 3)",
    ),
    Rule(
        "sdpa",
        "PyTorch SDPA otherwise: fused O(s) kernels on CUDA, ROCm and CPU; native Metal on Apple silicon",
        "seeds/000 (Apple 3: SDPA mapped to Metal); design.md section 6",
    ),
    Rule(
        "softcap-attention",
        "attention logit soft-capping (Gemma 2): eager attention, or FlashAttention-2 (its softcap argument) "
        "on Ampere or newer; SDPA and xformers drop the soft-cap and train a different model",
        "transformers 5.24.0 models/gemma2/modeling_gemma2.py (_supports_sdpa = False); HF "
        "google/gemma-2-27b-it discussion #22; fitcheck.planner.kernels",
    ),
    Rule(
        "fp16-full-amp",
        "full fine-tuning in fp16 loads fp32 weights and autocasts (16 B/param with AdamW): the GradScaler "
        "cannot unscale fp16 gradients; trainers that load fp16 weights whenever fp16 is on (axolotl) or "
        "have no loss scaling (mlx-lm) train full weights in fp32 instead",
        "torch/amp/grad_scaler.py _unscale_grads_; axolotl resolve_dtype @067b021c; "
        "fitcheck.planner.kernels FP16_FULL",
    ),
    Rule(
        "no-xformers-mps",
        "never xformers on Apple silicon: its binaries are CUDA-only and crash",
        "seeds/000 (Apple 3); facebookresearch/xformers#731",
    ),
    Rule(
        "bf16-hw",
        "bf16 only where the hardware has it (NVIDIA compute capability >= 8.0), fp16 otherwise",
        "design.md section 6; hardware_detection.md 6.3 "
        "(torch.cuda.is_bf16_supported(including_emulation=False))",
    ),
    Rule(
        "mps-bf16",
        "Apple M1/M2: bf16 is emulated through fp32, so fp16",
        "transformers PR #40458; pytorch/pytorch#119641 (bf16 on MPS from macOS 14)",
    ),
    Rule(
        "adamw8bit-to-fit",
        "8-bit AdamW (bitsandbytes) on CUDA only when it is needed to fit: optimizer states 8 -> 2 B/param",
        "seeds/001 (AdamW8bit: da 8 a 2 byte per parametro)",
    ),
    Rule(
        "mps-optimizers",
        "Apple silicon: no bitsandbytes optimizers; AdamW, Adafactor or Lion",
        "seeds/001 (ottimizzatori nativi: AdamW, Adafactor, Lion); bitsandbytes PR #1983 (MPS: 4-bit yes, "
        "optimizers no)",
    ),
    Rule(
        "mlx-native",
        "mlx-lm, the native path on Apple silicon: optimizers adam, adamw, muon, sgd, adafactor; QLoRA "
        "trains a pre-quantized 4-bit MLX model",
        "tests/data/trainer_keys/mlx_lm_lora_keys.txt (ml-explore/mlx-lm @d78bf58e); design.md section 6",
    ),
    Rule(
        "grad-ckpt",
        "gradient checkpointing only when it is needed: recomputing the forward costs about a third more "
        "FLOPs (the source documents: 20-30% slower)",
        "seeds/002 (gradient checkpointing: circa il 20-30% piu' lento)",
    ),
    Rule(
        "method-auto",
        "--method auto: full fine-tuning if any configuration fits, then LoRA, then QLoRA",
        "issue #5; seeds/002 (LoRA instead of full fine-tuning; switch to QLoRA)",
    ),
    Rule(
        "seq-floor",
        "the longest sequence length that fits, never below --min-seq-len (default: the requested length)",
        "seeds/002 (shorten the maximum length first, but never below typical examples)",
    ),
    Rule(
        "qlora-mps",
        "QLoRA through bitsandbytes on MPS works only in recent releases; mlx-lm with a 4-bit model is the "
        "native path",
        "hardware_detection.md 3.7 (bitsandbytes PR #1983, 2026-07, torch >= 2.9); design.md section 6",
    ),
    Rule(
        "expandable-segments",
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True when the plan is within 10% of the budget: "
        "fewer fragmented blocks in the caching allocator",
        "PyTorch docs, CUDA semantics: optimizing memory usage with PYTORCH_CUDA_ALLOC_CONF",
    ),
    Rule(
        "mps-watermark",
        "PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 lifts PyTorch's MPS allocation cap; risk: the run can "
        "push macOS "
        "into swap (about 10x slower) or freeze it",
        "seeds/000 (Apple 2); hardware_detection.md 3.6 (0.0 'may cause system failure')",
    ),
    Rule(
        "mps-fallback",
        "PYTORCH_ENABLE_MPS_FALLBACK=1 runs an operator MPS lacks on the CPU instead of stopping the run",
        "hardware_detection.md 3.7 (pytorch/pytorch#77764; docs mps_environment_variables)",
    ),
    Rule(
        "throughput",
        "the highest estimated throughput among the configurations that fit with the headroom",
        "issue #5; docs/planner.md (throughput model)",
    ),
    Rule(
        "tie-order",
        "equal estimated throughput: bf16 > fp16 > fp32; flash > xformers > sdpa > eager; "
        "adamw > adafactor > "
        "lion > sgd > 8-bit; no checkpointing first; larger micro-batch first (smaller on Apple silicon)",
        "docs/planner.md (tie order)",
    ),
    Rule(
        "least-communication",
        "several GPUs: the strategy that communicates least among those that fit: ddp, zero1, zero2, "
        "fsdp, zero3; CPU offload only when nothing fits without it",
        "issue #14; docs/distributed.md (strategies, offload)",
    ),
    Rule(
        "device-map",
        "several GPUs, no data-parallel strategy fits, even with CPU offload: device-map, one process "
        'with the layers split over the GPUs (HF device_map="auto"); they run in turn, so the speed is one '
        "GPU's",
        'TRL 1.16.0 trainer/utils.py create_model_from_path (device_map "auto" unless given), '
        "trainer/sft_trainer.py (device_map None under a MULTI_GPU/DEEPSPEED launch; nn.DataParallel "
        "refused); transformers 5.24.0 trainer.py (is_model_parallel: n_gpu 1); "
        "docs/distributed.md#device-map",
    ),
    Rule(
        "diffusion-cache",
        "diffusion: latents and text-encoder outputs cached whenever kohya allows; the VAE and the "
        "encoders then leave the GPU at no step cost",
        "kohya-ss/sd-scripts docs/train_SDXL-en.md (cache_latents, cache_text_encoder_outputs); "
        "docs/diffusion.md#speed",
    ),
    Rule(
        "diffusion-departure",
        "diffusion: another optimizer, fp8 base weights or full_bf16 than asked only when needed to fit or "
        "when it buys more than 5% of estimated speed (smaller differences are within the model's noise)",
        "kohya-ss/sd-scripts docs/train_SDXL-en.md (Adafactor and full_bf16 for 24 GB), "
        "docs/flux_train_network.md (fp8_base for 24 GB); docs/diffusion.md#speed",
    ),
    Rule(
        "diffusion-attention",
        "diffusion: the attention kernel as asked (SDPA by default, O(N) memory); xformers becomes SDPA "
        "on Apple silicon",
        "seeds/000 (Apple 3); facebookresearch/xformers#731; docs/diffusion.md",
    ),
    Rule(
        "tight-fallback",
        "when no configuration's likely range (the band's upper edge) fits, the best-ranked one whose "
        "central estimate fits, verdict tight, as check judges it; among equally good ones the lower upper "
        "edge; exit 0 with a warning, 1 with --strict",
        "issue 10 (conservative verdict: check exits 0 for tight with a warning); docs/planner.md#tight",
    ),
    Rule(
        "diffusion-resolution",
        "diffusion: the asked resolution; 64 px lower at a time, never below --min-resolution, only when "
        "nothing fits",
        "docs/diffusion.md#speed (kohya buckets in multiples of 64 px)",
    ),
)
RULES: dict[str, Rule] = {r.id: r for r in _RULES}

#: Attention kernels each trainer's config can name: one table, in `fitcheck.planner.kernels`.
TRAINER_ATTN = K.TRAINER_KERNELS
_HF_OPT = ("adamw", "paged-adamw", "adamw8bit", "paged-adamw8bit", "adafactor", "lion", "lion8bit", "sgd")
_ALL_OPT = (*_HF_OPT, "prodigy")
TRAINER_OPT: dict[str, tuple[str, ...]] = {
    "hf": _HF_OPT,
    "axolotl": _HF_OPT,
    "llamafactory": _HF_OPT,
    "mlx": ("adamw", "adafactor", "sgd"),
    "torchtune": ("adamw", "paged-adamw", "adamw8bit", "paged-adamw8bit", "sgd"),
    # litgpt's --optimizer names a torch.optim class (AdamW by default; bitsandbytes PagedAdamW when it
    # quantizes); Unsloth trains through the HF/TRL Trainer and takes its optim names
    "litgpt": ("adamw", "paged-adamw", "sgd"),
    "unsloth": _HF_OPT,
    "generic": _ALL_OPT,
    "kohya": _ALL_OPT,
}
#: Optimizers that need bitsandbytes' CUDA kernels (HF's ``lion`` is bitsandbytes' ``lion_32bit``).
BNB_OPT = frozenset(BITSANDBYTES)
HF_BNB_LION = frozenset({"hf", "axolotl", "llamafactory"})
#: Backends each trainer runs on.
TRAINER_BACKENDS: dict[str, tuple[str, ...]] = {
    "hf": ("cuda", "rocm", "mps", "cpu"),
    "axolotl": ("cuda", "rocm"),
    "llamafactory": ("cuda", "rocm", "mps", "cpu"),
    "mlx": ("mps",),
    "torchtune": ("cuda", "rocm", "mps", "cpu"),
    # litgpt runs on Lightning Fabric's accelerators (cuda, mps, cpu; PyTorch's ROCm builds report cuda).
    # Unsloth: NVIDIA GPUs only here; Apple silicon is "in the works" (reference/estimators.md), and its
    # AMD support is not read yet, so ROCm is refused rather than assumed
    "litgpt": ("cuda", "rocm", "mps", "cpu"),
    "unsloth": ("cuda",),
    "generic": ("cuda", "rocm", "mps", "cpu"),
    "kohya": ("cuda", "rocm", "mps", "cpu"),
}
#: Searched optimizers per backend, in the tie order.
SEARCH_OPT: dict[str, tuple[str, ...]] = {
    "cuda": ("adamw", "adamw8bit"),
    "rocm": ("adamw",),
    "mps": ("adamw", "adafactor", "lion"),
    "cpu": ("adamw", "adafactor"),
}
#: Tie order per dimension (earlier wins when throughput is equal).
PRECISION_ORDER = ("bf16", "fp16", "fp32")
ATTN_ORDER = ("flash", "xformers", "sdpa", "eager")
OPT_ORDER = (
    "adamw",
    "adafactor",
    "lion",
    "sgd",
    "prodigy",
    "paged-adamw",
    "adamw8bit",
    "paged-adamw8bit",
    "lion8bit",
)
METHOD_ORDER = ("full", "lora", "qlora")


def reason_for(rule_id: str, choice: str, text: str | None = None) -> tuple[str, str, str, str]:
    """(rule, choice, text, source) for a `Reason`, the rule's own text unless one is given."""
    rule = RULES[rule_id]
    return rule.id, choice, text or rule.text, rule.source


# ------------------------------------------------------------------------------------------ checks


def check_request(spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest) -> None:
    """Refuse what cannot run or cannot be written, naming an alternative (exit 2)."""
    trainer, backend = req.base.trainer, target.backend
    if backend not in TRAINER_BACKENDS[trainer]:
        alt = "mlx or hf" if backend == "mps" else "hf or llamafactory"
        where = {"mps": "Apple silicon", "cpu": "a CPU", "cuda": "NVIDIA GPUs", "rocm": "AMD GPUs"}[backend]
        runs = " and ".join(TRAINER_BACKENDS[trainer])
        raise OptionError(f"--trainer {trainer} runs on {runs}, not on {where}; use --trainer {alt}")
    if req.attn is not None:
        _check_attn(spec, req.attn, trainer, backend, device)
    if req.optimizer is not None:
        _check_optimizer(req.optimizer, trainer, backend)
    if req.precision is not None:
        _check_precision(req.precision, backend, device)
        why = K.precision_refusal(trainer, "full", req.precision)
        if why is not None and req.method == "full":
            raise OptionError(why)
    n = ranks(req, target, req.strategy)
    per_gpu, rest = divmod(req.effective_batch, n)
    if rest:
        where = f"{target.gpus} GPUs" if req.base.nodes == 1 else f"{n} GPUs ({req.base.nodes} nodes)"
        raise OptionError(
            f"--effective-batch {req.effective_batch} is not a multiple of the {where}; "
            f"use {max(1, per_gpu) * n}"
        )
    if req.batch_size is not None and per_gpu % req.batch_size:
        raise OptionError(
            f"--batch-size {req.batch_size} does not divide the per-GPU effective batch {per_gpu}: "
            f"use one of {', '.join(str(d) for d in _divisors(per_gpu))}"
        )
    if req.floor_seq_len > req.seq_len:
        raise OptionError(f"--min-seq-len {req.floor_seq_len} is above --seq-len {req.seq_len}")
    if req.method == "full" and req.base.dora:
        raise OptionError("--dora applies to LoRA and QLoRA, not --method full")
    if req.method == "full" and req.base.lora_fa:
        raise OptionError(
            "--lora-fa freezes LoRA's A factors: it applies to LoRA and QLoRA, not --method full"
        )


def _check_attn(spec: ModelSpec, attn: str, trainer: str, backend: str, device: DevicePerf) -> None:
    why = K.refusal(spec.arch, trainer, backend, device.cc, attn, device.architecture)
    if why is None:
        return
    on_gpu = attn == "flash" and K.flash_device_refusal(
        backend, device.cc, device.architecture, spec.arch.head_dim, device.name
    )
    if on_gpu:
        other = "sdpa" + (" or xformers (axolotl)" if backend == "cuda" else "")
        why = f"{on_gpu}: use --attn {other if K.arch_kernels(spec.arch).sdpa else 'eager'}"
    raise OptionError(why)


def _check_optimizer(opt: str, trainer: str, backend: str) -> None:
    if backend == "mps" and (opt in BNB_OPT or (opt == "lion" and trainer in HF_BNB_LION)):
        native = "adamw, adafactor or lion" if trainer not in HF_BNB_LION else "adamw or adafactor"
        raise OptionError(
            f"--optimizer {opt} needs bitsandbytes CUDA kernels; on Apple silicon use {native}"
            + (" (the HF Trainer's lion is bitsandbytes')" if opt == "lion" else "")
        )
    if backend == "cpu" and (opt in BNB_OPT or (opt == "lion" and trainer in HF_BNB_LION)):
        raise OptionError(
            f"--optimizer {opt} needs bitsandbytes GPU kernels; on a CPU use adamw or adafactor"
        )
    if opt not in TRAINER_OPT[trainer]:
        can = ", ".join(TRAINER_OPT[trainer])
        raise OptionError(f"--trainer {trainer} has no --optimizer {opt}; it offers {can}")


def _check_precision(precision: str, backend: str, device: DevicePerf) -> None:
    if precision == "bf16" and not device.bf16_native and backend in ("cuda", "rocm"):
        raise OptionError(
            f"{device.name} has no bf16 in hardware (compute capability {device.compute_capability or '?'} "
            "< 8.0): use --precision fp16"
        )


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


# ------------------------------------------------------------------------------------ candidates


def methods(req: PlanRequest) -> tuple[str, ...]:
    """The methods to search, in preference order (auto: full, then LoRA, then QLoRA)."""
    if req.method != "auto":
        return (req.method,)
    lora_only = req.base.dora or req.base.lora_fa  # options that only mean something on LoRA
    out: tuple[str, ...] = METHOD_ORDER if not lora_only else ("lora", "qlora")
    if req.precision is not None and K.precision_refusal(req.base.trainer, "full", req.precision):
        out = tuple(m for m in out if m != "full")
    return out


def seq_lens(req: PlanRequest) -> tuple[int, ...]:
    """The requested length, then halvings down to (and including) --min-seq-len."""
    out = [req.seq_len]
    floor = req.floor_seq_len
    while out[-1] // 2 >= floor:
        out.append(out[-1] // 2)
    if out[-1] != floor:
        out.append(floor)
    return tuple(out)


def ranks(req: PlanRequest, target: Target, strategy: str | None) -> int:
    """The processes the effective batch is shared by: one under device-map (one process drives every
    GPU), else every GPU of every node."""
    return 1 if strategy == "device-map" else target.gpus * req.base.nodes


def per_process_batch(req: PlanRequest, target: Target, strategy: str | None) -> int:
    """The effective batch each process trains on (its share over `ranks`)."""
    return req.effective_batch // ranks(req, target, strategy)


def micro_batches(req: PlanRequest, target: Target, strategy: str | None = None) -> tuple[int, ...]:
    """Micro-batches that divide the per-process effective batch and suit the backend."""
    per_gpu = per_process_batch(req, target, strategy)
    if req.batch_size is not None:
        return (req.batch_size,)
    if req.base.optimizer_in_bwd:  # no accumulation with the step in backward (engine/estimate.py)
        return (per_gpu,)
    divs = _divisors(per_gpu)
    pow2 = [d for d in divs if d & (d - 1) == 0]
    if target.backend in ("cuda", "rocm"):
        out = sorted(set(pow2) | {d for d in divs if d % 8 == 0})
    elif target.backend == "mps":
        out = [d for d in pow2 if d <= 2]
    else:
        out = pow2
    return tuple(out)


def precisions(req: PlanRequest, device: DevicePerf, method: str) -> tuple[str, ...]:
    """Compute dtypes the hardware runs natively and the trainer can train ``method`` in, in the tie
    order (`fitcheck.planner.kernels`)."""
    if req.precision is not None:
        return (req.precision,)
    return K.precisions_for(req.base.trainer, method, device.backend, device.bf16_native)


def attentions(req: PlanRequest, device: DevicePerf, spec: ModelSpec) -> tuple[str, ...]:
    """Kernels the device, trainer and architecture allow, in the tie order; eager only when asked or
    when nothing else trains this architecture right (`fitcheck.planner.kernels`)."""
    if req.attn is not None:
        return (req.attn,)
    can = K.kernels_for(spec.arch, req.base.trainer, device.backend, device.cc, device.architecture)
    if device.gpu_unknown:
        can = tuple(k for k in can if k != "flash")  # flash not assumed
    fast = tuple(k for k in can if k != "eager")
    return fast or can


def optimizers(req: PlanRequest, backend: str) -> tuple[str, ...]:
    """Optimizers to search on this backend that the trainer can name, in the tie order."""
    if req.optimizer is not None:
        return (req.optimizer,)
    trainer = req.base.trainer
    out = [o for o in SEARCH_OPT[backend] if o in TRAINER_OPT[trainer]]
    if backend == "mps" and trainer in HF_BNB_LION:
        out = [o for o in out if o != "lion"]
    return tuple(out)


def checkpointing(req: PlanRequest) -> tuple[bool, ...]:
    return (req.grad_ckpt,) if req.grad_ckpt is not None else (False, True)


#: Strategies the planner tries with several GPUs, least communication first (docs/distributed.md).
STRATEGY_ORDER: tuple[Strategy, ...] = ("ddp", "zero1", "zero2", "fsdp", "zero3")
#: Offload levels, none first: offload trades step time for memory.
OFFLOAD_ORDER = ("none", "optimizer", "all")


#: Trainers whose emitted file runs a model dispatched by ``device_map`` in one process: TRL's ``trl sft``
#: (rule ``device-map``). axolotl's and LLaMA-Factory's handling of a dispatched model is not read yet.
DEVICE_MAP_TRAINERS = frozenset({"hf"})


def strategies(req: PlanRequest, target: Target) -> tuple[str | None, ...]:
    """Strategies to search: the asked one; else none on one GPU, the ladder on several (device-map
    last, for the trainers that run it, on one node). An asked ``--offload`` none of them takes is an
    error (one GPU has no strategy to offload from unless one is named)."""
    out = _strategies(req, target)
    if req.offload not in (None, "none") and not any(offloads(req, s) for s in out):
        takes = sorted(
            s for s in STRATEGY_ORDER if req.offload in offloads(req.model_copy(update={"offload": None}), s)
        )
        named = f"--strategy {req.strategy} offloads none" if req.strategy else "name one with --strategy"
        raise OptionError(
            f"--offload {req.offload} needs a sharded strategy that offloads it ({', '.join(takes)}); {named}"
        )
    return out


def _strategies(req: PlanRequest, target: Target) -> tuple[str | None, ...]:
    if req.strategy == "fsdp-no-shard":
        # NO_SHARD's trainer files would need an FSDP1 config: not emitted yet
        raise OptionError(
            "plan does not search --strategy fsdp-no-shard yet; "
            "fitcheck estimate/check --strategy fsdp-no-shard size it"
        )
    if req.strategy == "device-map":
        _check_device_map(req, target)
    if req.strategy is not None:
        return (req.strategy,)
    if req.base.zero_bucket_size is not None or req.base.zero_overlap_comm is not None:
        # a DeepSpeed bucket size describes a ZeRO run (docs/distributed.md#buckets)
        return tuple(s for s in STRATEGY_ORDER if STRATEGY_FACTS[s].engine == "deepspeed")
    if target.gpus * req.base.nodes == 1 or target.backend not in ("cuda", "rocm"):
        return (None,)
    if req.base.fsdp_embedding_units:
        return ("fsdp",)  # the flag describes FSDP2 units (docs/distributed.md#fsdp-embedding-units)
    if req.base.fsdp_version != 2:  # --fsdp-version 1 describes an FSDP run: the other strategies refuse it
        return tuple(s for s in STRATEGY_ORDER if STRATEGY_FACTS[s].engine == "fsdp")
    if req.base.trainer in ("mlx", "kohya"):
        return ("ddp",)
    if req.base.trainer in DEVICE_MAP_TRAINERS and req.base.nodes == 1:
        return (*STRATEGY_ORDER, "device-map")
    return STRATEGY_ORDER


def _check_device_map(req: PlanRequest, target: Target) -> None:
    """--strategy device-map: a trainer that runs a dispatched model, one node, two GPUs or more."""
    if req.base.trainer not in DEVICE_MAP_TRAINERS:
        raise OptionError(
            f"plan does not search --strategy device-map for --trainer {req.base.trainer} (only TRL's "
            "trl sft, --trainer hf, is read to run a dispatched model); fitcheck estimate --strategy "
            "device-map sizes it"
        )
    if target.gpus < 2 or req.base.nodes > 1:
        raise OptionError(
            "--strategy device-map splits the layers over the GPUs of one node: use --gpus 2 or more"
        )


def dist_rank(strategy: Strategy, offload: str) -> tuple[int, int]:
    """The place of a strategy and offload in the ranking, before throughput (lower first): no offload,
    then optimizer, then all, least communication first within each; device-map after all of them, since
    one GPU works at a time (rule ``device-map``: every data-parallel point trains on all GPUs at once)."""
    if strategy == "device-map":
        return len(OFFLOAD_ORDER), 0
    return OFFLOAD_ORDER.index(offload), STRATEGY_FACTS[strategy].comm_rank


def offloads(req: PlanRequest, strategy: str | None) -> tuple[str, ...]:
    """Offload levels the strategy accepts (DDP none; ZeRO-1/2 the optimizer; ZeRO-3 both; FSDP all)."""
    allowed = {
        None: ("none",),
        "ddp": ("none",),
        "zero1": ("none", "optimizer"),
        "zero2": ("none", "optimizer"),
        "device-map": ("none",),  # layers offloaded to the CPU or disk are refused (engine/devmap.py)
    }
    allowed.update({"zero3": OFFLOAD_ORDER, "fsdp": ("none", "all"), "fsdp-grad-op": ("none", "all")})
    allowed["fsdp-hybrid"] = ("none", "all")
    options = allowed[strategy]
    if req.offload is not None:
        return tuple(o for o in options if o == req.offload)
    return options
