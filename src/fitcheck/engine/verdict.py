"""Fit verdict: compare an estimate and its band with a target's budget, and say what would fit.

The rule is conservative (issue 10): ``fits`` when the band's ``high_bytes`` fits the budget (usable
memory minus ``--headroom``), ``tight`` when ``device_bytes`` fits and ``high_bytes`` does not,
``does_not_fit`` when ``device_bytes`` does not. An estimate without a band (the rule of thumb) is judged
on ``device_bytes`` alone. Suggestions follow the source documents' order (seeds/002 "Se un'esecuzione
esaurisce la memoria"): shorter maximum length, smaller micro-batch with more accumulation, QLoRA, gradient
checkpointing, LoRA instead of full. When none of them fits alone, the fewest of them (two or three, drawn
from the five that save most) that fit together are suggested as one more change (`combined_change`).

Paged optimizer states (component ``optimizer_states_paged``) live in CUDA managed memory, which the driver
pages to the host when the device runs short instead of failing (bitsandbytes functional.py ``get_paged`` ->
csrc/pythonInterface.cpp ``cudaMallocManaged``, optim/optimizer.py ``prefetch_state`` ->
``cudaMemPrefetchAsync`` @95f9af30). One rule for every fit test (`judge_bytes`): each figure is judged
less the paged bytes that do not fit what is left of the budget (`spill_bytes`); paging never excuses the
other bytes, so a run whose non-paged bytes are over the budget does not fit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fitcheck.hardware.budget import trainer_notes
from fitcheck.models import DecoderArch, DiffusionSetup, Estimate, LlmSetup, Suggestion, Target, Verdict
from fitcheck.units import gib
from fitcheck.vocab import VerdictName

#: The setup model of the workload being judged (its remedies and estimator take the same kind).
S = TypeVar("S", LlmSetup, DiffusionSetup)


def spill_bytes(figure: int, paged: int, budget: int) -> int:
    """The paged bytes of ``figure`` that do not fit the budget and page to the host (0 to ``paged``)."""
    return min(max(0, figure - budget), max(0, paged))


def judge_bytes(device: int, high: int, budget: int, paged: int = 0) -> VerdictName:
    """``fits`` when ``high`` fits the budget, ``tight`` when only ``device`` does, else ``does_not_fit``;
    each figure less the ``paged`` bytes that would spill to the host (`spill_bytes`)."""
    if high - spill_bytes(high, paged, budget) <= budget:
        return "fits"
    if device - spill_bytes(device, paged, budget) <= budget:
        return "tight"
    return "does_not_fit"


def high_bytes(est: Estimate) -> int:
    """The figure a plan must fit: the band's upper edge (``device_bytes`` when there is no band)."""
    return est.band.high_bytes if est.band is not None else est.device_bytes


def paged_bytes(est: Estimate) -> int:
    """Paged optimizer states at the peak (component ``optimizer_states_paged``; 0 without one)."""
    peak = est.phase(est.peak_phase)
    return sum(c.bytes for c in peak.components if c.name == "optimizer_states_paged")


def fits_budget(est: Estimate, budget: int) -> bool:
    """Whether the estimate ``fits`` the budget under the one rule (`judge_bytes`)."""
    return judge_bytes(est.device_bytes, high_bytes(est), budget, paged_bytes(est)) == "fits"


def judge(est: Estimate, target: Target) -> tuple[str, int, float]:
    """(verdict, spare bytes of the budget after device_bytes less its spilled paged bytes, that as % of
    usable memory)."""
    budget, paged = target.budget_bytes, paged_bytes(est)
    verdict = judge_bytes(est.device_bytes, high_bytes(est), budget, paged)
    need = est.device_bytes - spill_bytes(est.device_bytes, paged, budget)
    return verdict, budget - need, 100.0 * (budget - need) / target.usable_bytes


def paged_note(est: Estimate, budget: int) -> str | None:
    """The warning line of a run that fits (or is tight) because paged optimizer states spill to the host
    (None when none spill, or when the run does not fit anyway)."""
    paged = paged_bytes(est)
    host = spill_bytes(est.device_bytes, paged, budget)
    most = spill_bytes(high_bytes(est), paged, budget)
    if most == 0 or judge_bytes(est.device_bytes, high_bytes(est), budget, paged) == "does_not_fit":
        return None
    if host == 0:
        return (
            f"up to {gib(most):.1f} GiB of paged optimizer states may live on the host (at the band's "
            "upper edge); steps slow down while they page"
        )
    return (
        f"{gib(host):.1f} GiB of paged optimizer states will live on the host; steps slow down while they "
        "page"
    )


def candidate_changes(setup: LlmSetup, arch: DecoderArch | None = None) -> list[tuple[str, str, LlmSetup]]:
    """The seeds' remedies, as concrete setups, in the seeds' order; then, for a MoE model (``arch``),
    its own remedies (`moe_changes`)."""
    out: list[tuple[str, str, LlmSetup]] = []
    if setup.seq_len > 256:
        half = setup.seq_len // 2
        out.append(
            (
                f"halve the maximum length to {half} (keep it above typical examples)",
                f"--seq-len {half}",
                setup.model_copy(update={"seq_len": half}),
            )
        )
    if setup.batch_size > 1:
        b = max(1, setup.batch_size // 2)
        acc = setup.grad_accum * (setup.batch_size // b)
        out.append(
            (
                f"micro-batch {b} with gradient accumulation {acc} (same effective batch)",
                f"--batch-size {b} --grad-accum {acc}",
                setup.model_copy(update={"batch_size": b, "grad_accum": acc}),
            )
        )
    if setup.method == "lora":
        out.append(
            ("QLoRA: 4-bit base weights", "--method qlora", setup.model_copy(update={"method": "qlora"}))
        )
    if not setup.grad_ckpt:
        out.append(
            (
                "gradient checkpointing (about 20-30% slower)",
                "--grad-ckpt",
                setup.model_copy(update={"grad_ckpt": True}),
            )
        )
    if setup.method == "full":
        out.append(
            ("LoRA instead of full fine-tuning", "--method lora", setup.model_copy(update={"method": "lora"}))
        )
        if setup.optimizer == "adamw" and setup.backend in ("cuda", "rocm"):
            out.append(
                (
                    "8-bit AdamW (bitsandbytes)",
                    "--optimizer adamw8bit",
                    setup.model_copy(update={"optimizer": "adamw8bit"}),
                )
            )
    out += _kernel_changes(setup, arch)
    if setup.precision == "fp32":
        # half the bytes of every weight and activation, and on a grouped-query model SDPA's flash kernel
        # instead of its math one (engine/activations.py `sdpa_math`)
        out.append(
            (
                "bf16 mixed precision (fp16 where the GPU has no bf16)",
                "--precision bf16",
                setup.model_copy(update={"precision": "bf16"}),
            )
        )
    return out + (moe_changes(arch, setup) if arch is not None else [])


def _kernel_changes(setup: LlmSetup, arch: DecoderArch | None) -> list[tuple[str, str, LlmSetup]]:
    """The attention kernel's remedies: SDPA for eager attention; FlashAttention-2 where SDPA gets masks."""
    out: list[tuple[str, str, LlmSetup]] = []
    if setup.attn == "eager":
        out.append(("memory-efficient attention", "--attn sdpa", setup.model_copy(update={"attn": "sdpa"})))
    if arch is not None and _sdpa_masks(arch, setup):
        out.append(
            (
                "FlashAttention-2: no per-layer copies of SDPA's mask",
                "--attn flash",
                setup.model_copy(update={"attn": "flash"}),
            )
        )
    return out


def _sdpa_masks(arch: DecoderArch, setup: LlmSetup) -> bool:
    """SDPA gets an explicit mask in some layer (a sliding window past its length, a padded batch), which
    FlashAttention-2 does without: each such layer keeps a mask copy, and a grouped-query model's K/V at
    every head (engine/activations.py `windowed_layers`, `masked_gqa`). Only where FlashAttention-2 can be
    written for this model, trainer and backend (the planner's kernel table, `planner.kernels.refusal`)
    and runs (not in fp32: engine/estimate.py ``FLASH_FP32``)."""
    from fitcheck.engine import activations as act
    from fitcheck.planner.kernels import refusal

    if setup.precision == "fp32" or refusal(arch, setup.trainer, setup.backend, None, "flash") is not None:
        return False
    return bool(act.windowed_layers(arch, setup)) or act.masked_gqa(arch, setup, False)


def moe_changes(arch: DecoderArch, setup: LlmSetup) -> list[tuple[str, str, LlmSetup]]:
    """A MoE model's own remedies for LoRA / QLoRA: attention only, when the targets reach the routed
    experts; and under a trainer on transformers' classes, the runs that handle transformers 5's fused
    experts better (bitsandbytes leaves them in 16 bits, engine/quant.py `experts_unquantized`; peft
    adapts them through a merged copy): a transformers 4.x run (``--moe-layout per-expert``, for the
    types whose 4.x experts were per-expert ``nn.Linear``) and Unsloth (``--trainer unsloth``). Each
    is re-estimated; one that saves nothing is not shown."""
    from fitcheck.engine import lora, quant
    from fitcheck.engine.params import layer_kinds

    if not arch.is_moe:
        return []
    out: list[tuple[str, str, LlmSetup]] = []
    experts = [lin for k in layer_kinds(arch) for lin in k.linears(arch) if lin.role == "expert"]
    if setup.method != "full" and any(lora.targeted(arch, setup.lora_targets, lin) for lin in experts):
        out.append(
            (
                "LoRA on attention only, not the routed experts",
                "--lora-targets attn",
                setup.model_copy(update={"lora_targets": "attn"}),
            )
        )
    if setup.method == "full" or setup.trainer not in quant.TRANSFORMERS_TRAINERS:
        return out
    if setup.moe_layout == "fused" and arch.model_type not in quant.FUSED_IN_V4:
        out.append(
            (
                "a transformers 4.x run (pin transformers<5): per-expert nn.Linear experts, which "
                "bitsandbytes quantizes (QLoRA) and peft adapts without a merged copy",
                "--moe-layout per-expert",
                setup.model_copy(update={"moe_layout": "per-expert"}),
            )
        )
    out.append(
        (
            "Unsloth: it packs the fused experts in 4 bits itself (QLoRA) and adapts them without a "
            "merged copy",
            "--trainer unsloth",
            setup.model_copy(update={"trainer": "unsloth"}),
        )
    )
    return out


#: How many single changes (those saving the most) the combined suggestion draws from.
COMBINE_TOP = 5


def delta(base: Any, setup: Any) -> dict[str, Any]:
    """The fields a remedy changes, against the setup it was made from."""
    before, after = base.model_dump(), setup.model_dump()
    return {k: v for k, v in after.items() if before.get(k) != v}


def _suggestion(
    change: str, flag: str, est: Estimate, again: Estimate, target: Target, size: int = 1
) -> Suggestion:
    """``again`` (the estimate after the change) as a suggestion, judged by the verdict's one rule."""
    after = judge_bytes(again.device_bytes, high_bytes(again), target.budget_bytes, paged_bytes(again))
    return Suggestion(
        change=change,
        flag=flag,
        saves_bytes=est.device_bytes - again.device_bytes,
        device_bytes_after=again.device_bytes,
        fits=after == "fits",
        changes=size,
        high_bytes_after=high_bytes(again),
        verdict_after=after,
    )


def combined_change(
    est: Estimate,
    target: Target,
    spec: Any,
    estimator: Callable[[Any, S], Estimate],
    changes: list[tuple[str, str, S]],
) -> Suggestion | None:
    """When no single remedy fits: the smallest combination of them that does.

    ``changes`` are the remedies to combine, in the seeds' order (`verdict` passes the `COMBINE_TOP`
    that save most). Pairs first, then triples (fewest changes wins); among those that fit, the smallest
    ``device_bytes``. Remedies that change the same field are not combined. None when nothing fits.
    """
    from itertools import combinations

    from fitcheck.errors import OptionError

    deltas = [(change, flag, delta(est.setup, setup)) for change, flag, setup in changes]
    for size in (2, 3):
        best: tuple[int, Suggestion] | None = None
        for combo in combinations(deltas, size):
            keys = [k for _, _, d in combo for k in d]
            if len(keys) != len(set(keys)):
                continue
            update = {k: v for _, _, d in combo for k, v in d.items()}
            try:
                again = estimator(spec, est.setup.model_copy(update=update))  # type: ignore[arg-type]
            except OptionError:
                continue
            if not fits_budget(again, target.budget_bytes):
                continue
            if best is None or again.device_bytes < best[0]:
                best = (
                    again.device_bytes,
                    _suggestion(
                        " + ".join(c for c, _, _ in combo),
                        " ".join(f for _, f, _ in combo),
                        est,
                        again,
                        target,
                        size,
                    ),
                )
        if best is not None:
            return best[1]
    return None


def verdict(
    est: Estimate,
    target: Target,
    spec: Any = None,
    estimator: Callable[[Any, S], Estimate] | None = None,
    changes: list[tuple[str, str, S]] | None = None,
) -> Verdict:
    """The verdict, with suggestions (each re-estimated) when the run does not fit.

    Args:
        changes: the candidate remedies, cheapest first; by default the seeds' LLM order
            (`candidate_changes`). A remedy the estimator refuses (an option that does not apply) is
            left out.
    """
    from fitcheck.errors import OptionError

    name, spare, pct = judge(est, target)
    suggestions: list[Suggestion] = []
    if name != "fits" and spec is not None and estimator is not None:
        if changes is None:
            assert isinstance(est.setup, LlmSetup), "diffusion passes its own remedies"
            arch = getattr(spec, "arch", None)
            changes = candidate_changes(est.setup, arch if isinstance(arch, DecoderArch) else None)  # type: ignore[assignment]
        for change, flag, setup in changes or ():
            try:
                again = estimator(spec, setup)
            except OptionError:
                continue
            suggestions.append(_suggestion(change, flag, est, again, target))
        if suggestions and not any(sug.fits for sug in suggestions):
            saving = {sug.flag: sug.saves_bytes for sug in suggestions if sug.saves_bytes > 0}
            top = sorted(saving, key=lambda flag: -saving[flag])[:COMBINE_TOP]
            # the five that save most, in the seeds' order: at most 10 pairs and 10 triples re-estimated
            both = combined_change(est, target, spec, estimator, [ch for ch in changes or () if ch[1] in top])
            suggestions += [both] if both is not None else []
    paged = paged_bytes(est)
    note: str | None = paged_note(est, target.budget_bytes)
    trainer: str | None = est.setup.trainer if isinstance(est.setup, LlmSetup) else None
    return Verdict(
        hardware=target.id,
        backend=target.backend,
        budget_bytes=target.budget_bytes,
        usable_bytes=target.usable_bytes,
        device_bytes=est.device_bytes,
        high_bytes=high_bytes(est),
        verdict=name,  # type: ignore[arg-type]
        headroom_bytes=target.headroom_bytes,
        spare_bytes=spare,
        spare_pct=round(pct, 1),
        budget_lines=target.budget_lines,
        detected=target.detected,
        suggestions=tuple(suggestions),
        notes=(*trainer_notes(target, trainer), *([note] if note else [])),
        paged_bytes=paged,
        paged_host_bytes=spill_bytes(est.device_bytes, paged, target.budget_bytes),
    )


def thumb_verdict(est: Estimate) -> Verdict | None:
    """``--rule thumb`` with a target: the rule of thumb's figure judged against the same budget.

    The rule of thumb has no band, so it either fits or does not (never ``tight``); no suggestions.
    """
    v = est.target
    if v is None or est.thumb is None:
        return None
    need = est.thumb.bytes
    spare = v.budget_bytes - need
    return v.model_copy(
        update={
            "device_bytes": need,
            "high_bytes": need,
            "verdict": judge_bytes(need, need, v.budget_bytes),
            "spare_bytes": spare,
            "spare_pct": round(100.0 * spare / v.usable_bytes, 1),
            "suggestions": (),
        }
    )
