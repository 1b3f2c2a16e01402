"""The fit verdict for a diffusion estimate, with the remedies kohya users reach for, in order.

The order follows what costs nothing first (caching latents and text-encoder outputs only moves
work before training), then what costs speed (gradient checkpointing, about 20-30% per the source
documents; smaller micro-batch with accumulation), then memory-lean optimizers and fp8 base
weights, and last what changes the result (lower resolution, LoRA instead of full training).
"""

from __future__ import annotations

from fitcheck.diffusion.estimate import estimate_diffusion
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.engine.verdict import verdict
from fitcheck.models import DiffusionSetup, Estimate, Target, Verdict


def remedies(spec: DiffusionSpec, setup: DiffusionSetup) -> list[tuple[str, str, DiffusionSetup]]:
    """(change, flag, setup) candidates, cheapest first."""
    out: list[tuple[str, str, DiffusionSetup]] = []

    def add(change: str, flag: str, **update: object) -> None:
        out.append((change, flag, setup.model_copy(update=update)))

    if not setup.cache_latents:
        add("cache latents (the VAE leaves the GPU)", "--cache-latents", cache_latents=True)
    if (
        not setup.cache_text_encoder_outputs
        and not setup.train_text_encoder
        and spec.family not in ("sd1", "sd2")
    ):
        add(
            "cache text-encoder outputs (the encoders leave the GPU)",
            "--cache-text-encoder-outputs",
            cache_text_encoder_outputs=True,
        )
    if not setup.grad_ckpt:
        add("gradient checkpointing (about 20-30% slower)", "--grad-ckpt", grad_ckpt=True)
    if setup.batch_size > 1:
        b = max(1, setup.batch_size // 2)
        add(
            f"micro-batch {b} with accumulation (same effective batch)",
            f"--batch-size {b} --grad-accum {setup.grad_accum * (setup.batch_size // b)}",
            batch_size=b,
            grad_accum=setup.grad_accum * (setup.batch_size // b),
        )
    if setup.optimizer in ("adamw", "prodigy") and setup.backend in ("cuda", "rocm"):
        add("8-bit AdamW (bitsandbytes)", "--optimizer adamw8bit", optimizer="adamw8bit")
    elif setup.optimizer in ("adamw", "prodigy"):
        add("Adafactor (factored second moments)", "--optimizer adafactor", optimizer="adafactor")
    if setup.method == "lora" and not setup.fp8_base and setup.precision != "fp32" and setup.backend != "mps":
        add("fp8 base weights", "--fp8-base", fp8_base=True)
    if setup.method == "full" and setup.precision == "bf16" and not setup.full_bf16:
        add("bf16 weights and gradients (kohya full_bf16)", "--full-bf16", full_bf16=True)
    res = setup.resolution or spec.native_resolution
    if res > 512:
        lower = max(512, (res * 3 // 4) // 64 * 64)
        add(
            f"train at {lower}px (lower quality at the native size)",
            f"--resolution {lower}",
            resolution=lower,
        )
    if setup.method == "full":
        add(
            "LoRA instead of full fine-tuning",
            "--method lora",
            method="lora",
            full_bf16=False,
            full_fp16=False,
        )
    return out


def diffusion_verdict(est: Estimate, target: Target, spec: DiffusionSpec) -> Verdict:
    """The verdict against ``target``; when it does not fit, each remedy re-estimated."""
    ctx = target.context_bytes or None

    def again(s: DiffusionSpec, setup: DiffusionSetup) -> Estimate:
        return estimate_diffusion(s, setup, ctx)

    assert isinstance(est.setup, DiffusionSetup)
    return verdict(est, target, spec, again, changes=remedies(spec, est.setup))
