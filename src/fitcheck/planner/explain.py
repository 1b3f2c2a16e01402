"""Why an LLM plan is what it is: one reason per choice, and why each runner-up lost.

Each reason names the rule that decided it (`fitcheck.planner.rules.RULES`) and compares the
choice with the best alternative in the grid, so "gradient checkpointing: needed to fit" is a fact
read from the evaluated grid, not a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fitcheck.models import Target
from fitcheck.planner import rules as R
from fitcheck.planner.models import DevicePerf, PlanRequest, Reason
from fitcheck.planner.models import LlmCandidate as Candidate
from fitcheck.units import GIB


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def _r(rule: str, choice: str, text: str | None = None) -> Reason:
    rid, ch, txt, src = R.reason_for(rule, choice, text)
    return Reason(rule=rid, choice=ch, text=txt, source=src)


def _same_tier(c: Candidate, chosen: Candidate) -> bool:
    return c.setup.method == chosen.setup.method and c.setup.seq_len == chosen.setup.seq_len


def _best(
    chosen: Candidate, cands: Sequence[Candidate], pred: Callable[[Candidate], bool]
) -> Candidate | None:
    """The best-ranked candidate matching ``pred`` that meets the choice's verdict (fits; tight for a
    tight plan, `fitcheck.planner.loop`); ``cands`` is in rank order."""
    return next((c for c in cands if c.meets(chosen.verdict) and pred(c)), None)


def _least(cands: Sequence[Candidate], pred: Callable[[Candidate], bool]) -> int | None:
    """The smallest device bytes among candidates matching ``pred``."""
    needs = [c.device_bytes for c in cands if pred(c)]
    return min(needs) if needs else None


def lead(c: Candidate) -> str:
    """How a runner-up that meets the choice's verdict is introduced: "fits", or "tight too"."""
    return "fits" if c.fits else "tight too"


def _fits(c: Candidate) -> str:
    """The chosen configuration's fit in a reason: "fits", or "is tight" (only its central estimate
    fits: the tight fallback)."""
    return "fits" if c.fits else "is tight (its central estimate fits)"


def _tps(c: Candidate) -> str:
    x = c.throughput.tokens_per_s
    return f"{x:,.0f}" if x >= 1000 else f"{x:.1f}"


def _pct(x: float) -> str:
    return f"{x:.1f}%" if x >= 0.1 else "under 0.1%"


def _pct_slower(slow: Candidate, fast: Candidate) -> float:
    return 100.0 * (1 - slow.throughput.tokens_per_s / fast.throughput.tokens_per_s)


def reasons(
    chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest, target: Target, device: DevicePerf
) -> list[Reason]:
    """One reason per decided dimension, each with its rule and source."""
    out = [*_method(chosen, cands, req), *_seq(chosen, cands, req)]
    out += _batch(chosen, cands, req, target)
    out += _ckpt(chosen, cands, req)
    out += _optimizer(chosen, cands, req, target)
    out += _attention(chosen, req, device)
    out += _precision(chosen, req, device)
    out += _strategy(chosen, cands, req)
    if chosen.setup.method == "qlora" and target.backend == "mps" and chosen.setup.trainer != "mlx":
        out.append(_r("qlora-mps", "method"))
    t = chosen.throughput
    out.append(
        _r(
            "throughput",
            "objective",
            f"{t.tokens_per_s:,.0f} tokens/s estimated ({t.bound}-bound, MFU {100 * t.mfu:.0f}%), "
            f"{_gib(chosen.device_bytes)} of the {_gib(chosen.budget_bytes)} budget" + _paging(chosen),
        )
    )
    return out


def _paging(c: Candidate) -> str:
    """How much of a plan's paged optimizer states page to the host (empty when none do)."""
    host = c.paged_host_bytes
    return f" ({_gib(host)} of paged optimizer states on the host: slower steps)" if host else ""


def _method(chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest) -> list[Reason]:
    if req.method != "auto":
        return []
    m = chosen.setup.method
    order = R.methods(req)
    missed = []
    for earlier in order[: order.index(m)]:
        least = _least(cands, lambda c, e=earlier: c.setup.method == e)  # type: ignore[misc]
        missed.append(f"{earlier} does not fit (needs at least {_gib(least or 0)})")
    text = "; ".join(missed) + f"; {m} {_fits(chosen)}" if missed else f"{m} fine-tuning {_fits(chosen)}"
    return [_r("method-auto", "method", f"--method auto: {text}")]


def _seq(chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest) -> list[Reason]:
    if req.floor_seq_len == req.seq_len:
        return []
    s = chosen.setup.seq_len
    if s == req.seq_len:
        return [_r("seq-floor", "sequence length", f"the requested {s} tokens fit")]
    longer = [x for x in R.seq_lens(req) if x > s]
    least = _least(cands, lambda c: c.setup.seq_len in longer and c.setup.method == chosen.setup.method)
    return [
        _r(
            "seq-floor",
            "sequence length",
            f"{s} tokens: the longest that {'fits' if chosen.fits else 'fits at its central estimate'} "
            f"({longer[-1]} needs at least {_gib(least or 0)}); "
            f"never below --min-seq-len {req.floor_seq_len}",
        )
    ]


def _batch(chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest, target: Target) -> list[Reason]:
    s = chosen.setup
    gpus = f" x {s.data_ranks} GPUs" if s.data_ranks > 1 else ""
    out = [
        _r(
            "effective-batch",
            "micro-batch",
            f"micro-batch {s.batch_size} x accumulation {s.grad_accum}{gpus} = effective batch "
            f"{req.effective_batch}",
        )
    ]
    if req.batch_size is not None:
        return out
    allowed = R.micro_batches(req, target, s.strategy)
    bigger = [b for b in allowed if b > s.batch_size]

    def like(c: Candidate, b: int) -> bool:
        """Same configuration as the chosen one but for the micro-batch (and its accumulation)."""
        x = c.setup
        return (
            _same_tier(c, chosen)
            and x.batch_size == b
            and (x.grad_ckpt, x.optimizer, x.attn, x.precision)
            == (s.grad_ckpt, s.optimizer, s.attn, s.precision)
        )

    blocked = next((b for b in bigger if not any(c.meets(chosen.verdict) for c in cands if like(c, b))), None)
    if target.backend in ("cuda", "rocm"):
        more = (
            f"; micro-batch {blocked} does not fit (needs at least "
            f"{_gib(_least(cands, lambda c: like(c, blocked)) or 0)})"
            if blocked
            else ""
        )
        out.append(
            _r(
                "tensor-core-batch",
                "micro-batch",
                f"micro-batch from {', '.join(map(str, allowed))} (powers of two or multiples of 8 dividing "
                f"{R.per_process_batch(req, target, s.strategy)}){more}",
            )
        )
        gib = target.memory_bytes / GIB
        if (
            target.backend == "cuda"
            and 11.5 <= gib <= 16.5
            and s.batch_size <= 2
            and s.grad_accum > 1
            and blocked
        ):
            out.append(
                _r(
                    "small-card-accum",
                    "micro-batch",
                    f"a {gib:.0f} GiB card: micro-batch {s.batch_size} with accumulation {s.grad_accum}, "
                    "because larger micro-batches do not fit",
                )
            )
    elif target.backend == "mps":
        out.append(_r("mps-small-batch", "micro-batch"))
    return out


def _ckpt(chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest) -> list[Reason]:
    if req.grad_ckpt is not None:
        return [_r("grad-ckpt", "checkpointing", f"{'on' if req.grad_ckpt else 'off'}, as asked")]
    s = chosen.setup
    if not s.grad_ckpt:
        twin = next(
            (
                c
                for c in cands
                if _same_tier(c, chosen)
                and c.setup.grad_ckpt
                and c.setup.batch_size == s.batch_size
                and c.setup.optimizer == s.optimizer
                and c.setup.attn == s.attn
                and c.setup.precision == s.precision
            ),
            None,
        )
        cost = f" (it would cost {_pct_slower(twin, chosen):.0f}% of the throughput)" if twin else ""
        return [_r("grad-ckpt", "checkpointing", f"off: the plan {_fits(chosen)} without it{cost}")]
    without = _best(chosen, cands, lambda c: _same_tier(c, chosen) and not c.setup.grad_ckpt)
    if without is None:
        least = _least(cands, lambda c: _same_tier(c, chosen) and not c.setup.grad_ckpt)
        text = f"on: needed to fit (without it the least any configuration needs is {_gib(least or 0)})"
    else:
        text = (
            f"on: it lets micro-batch {s.batch_size} fit, {_pct_slower(without, chosen):.0f}% faster "
            "than the "
            f"best configuration without it (micro-batch {without.setup.batch_size})"
        )
    return [_r("grad-ckpt", "checkpointing", text)]


def _optimizer(
    chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest, target: Target
) -> list[Reason]:
    s = chosen.setup
    out: list[Reason] = []
    if s.trainer == "mlx":
        out.append(_r("mlx-native", "optimizer"))
    elif target.backend == "mps":
        out.append(_r("mps-optimizers", "optimizer"))
    if req.optimizer is not None:
        return out
    if s.optimizer == "adamw8bit":
        plain = _best(chosen, cands, lambda c: _same_tier(c, chosen) and c.setup.optimizer == "adamw")
        if plain is None:
            text = "8-bit AdamW: needed to fit (with AdamW nothing fits at this method and length)"
        elif plain.throughput.tokens_per_s <= chosen.throughput.tokens_per_s and not chosen.fits:
            text = (
                f"8-bit AdamW: as fast as the best with AdamW, and its likely range is lower "
                f"({_gib(chosen.high_bytes)} vs {_gib(plain.high_bytes)}; both tight)"
            )
        else:
            text = (
                f"8-bit AdamW: it lets a configuration {_pct_slower(plain, chosen):.0f}% faster fit than the "
                "best with AdamW"
            )
        out.append(_r("adamw8bit-to-fit", "optimizer", text))
    elif target.backend == "cuda" and "adamw8bit" in R.optimizers(req, "cuda"):
        out.append(_r("adamw8bit-to-fit", "optimizer", f"{s.optimizer}: 8-bit AdamW is not needed to fit"))
    elif s.optimizer != "adamw":
        out.append(
            _r(
                "mps-optimizers" if target.backend == "mps" else "tie-order",
                "optimizer",
                f"{s.optimizer}: AdamW does not fit at this configuration",
            )
        )
    return out


def _flash_runs_here(device: DevicePerf) -> bool:
    """The GPU itself trains FlashAttention-2 (`fitcheck.planner.kernels.flash_device_refusal`), so SDPA
    was chosen for the trainer or the model."""
    from fitcheck.planner.kernels import flash_device_refusal

    return (
        device.backend in ("cuda", "rocm")
        and not device.gpu_unknown
        and flash_device_refusal(device.backend, device.cc, device.architecture, None) is None
    )


def _attention(chosen: Candidate, req: PlanRequest, device: DevicePerf) -> list[Reason]:
    a = chosen.setup.attn
    if req.attn is not None:
        return [_r("sdpa" if a == "sdpa" else "flash-ampere", "attention", f"{a}, as asked")]
    if a == "eager":
        return [_r("softcap-attention", "attention")]
    if a == "flash":
        return [
            _r(
                "flash-ampere",
                "attention",
                "FlashAttention-2: "
                + (
                    f"{device.name} ({device.architecture})"
                    if device.backend == "rocm"
                    else f"compute capability {device.compute_capability}"
                ),
            )
        ]
    if a == "xformers":
        return [_r("xformers", "attention")]
    out: list[Reason] = []
    if device.backend == "mps":
        out.append(_r("no-xformers-mps", "attention"))
    why = {
        "cuda": "SDPA: FlashAttention-2 needs compute capability 8.0 or newer"
        + (
            f" ({device.name}: {device.compute_capability})"
            if device.compute_capability
            else " (unknown here)"
        ),
        "rocm": "SDPA: PyTorch's fused kernels on ROCm (FlashAttention-2 trains on Instinct MI200 / MI300)",
        "mps": "SDPA, mapped to Metal",
        "cpu": "SDPA: PyTorch's fused CPU kernel",
    }[device.backend]
    if _flash_runs_here(device):
        why = "SDPA: this trainer or model cannot take FlashAttention-2 here"
    if chosen.setup.trainer == "mlx":
        why = "mlx-lm's fused scaled_dot_product_attention (the only kernel it has)"
    out.append(_r("sdpa", "attention", why))
    return out


def _precision(chosen: Candidate, req: PlanRequest, device: DevicePerf) -> list[Reason]:
    s = chosen.setup
    if s.method == "full" and s.precision == "fp16" and s.master_weights and not req.base.master_weights:
        text = (
            "fp16 autocast on fp32 weights (16 B/param with AdamW): the GradScaler cannot unscale fp16 "
            "gradients"
        )
        return [_r("fp16-full-amp", "precision", text)]
    if s.method == "full" and s.precision == "fp32" and req.precision is None and device.backend != "cpu":
        text = f"fp32: {s.trainer} cannot train full weights in fp16, and {device.name} has no bf16"
        return [_r("fp16-full-amp", "precision", text)]
    p = s.precision
    if req.precision is not None:
        return [_r("bf16-hw", "precision", f"{p}, as asked")]
    if device.backend == "mps" and not device.bf16_native:
        return [_r("mps-bf16", "precision", f"{p}: {device.chip or 'this Mac'} emulates bf16 through fp32")]
    if device.backend == "cpu":
        return [_r("bf16-hw", "precision", f"{p}: CPU autocast runs bf16")]
    cc = f" (compute capability {device.compute_capability})" if device.compute_capability else ""
    text = f"{p}: the hardware has bf16{cc}" if p == "bf16" else f"{p}: no bf16 in hardware{cc}"
    return [_r("bf16-hw", "precision", text)]


def _strategy(chosen: Candidate, cands: Sequence[Candidate], req: PlanRequest) -> list[Reason]:
    s = chosen.setup
    if not s.distributed:
        return []
    label = s.effective_strategy + ("" if s.offload == "none" else f" with --offload {s.offload}")
    if req.strategy == "device-map":
        return [_device_map(chosen, (), "")]
    if req.strategy is not None and (req.offload is not None or s.offload == "none"):
        return [_r("least-communication", "strategy", f"{label}, as asked")]
    rank = R.dist_rank(s.effective_strategy, s.offload)
    missed: list[str] = []
    for st in R.STRATEGY_ORDER:
        for off in R.OFFLOAD_ORDER:
            if R.dist_rank(st, off) >= rank:
                continue
            pool = [
                c
                for c in cands
                if c.setup.effective_strategy == st and c.setup.offload == off and _same_tier(c, chosen)
            ]
            if pool:
                missed.append(f"{st}{'' if off == 'none' else ' + offload ' + off} needs {_need(pool)}")
    host = f"; host {_gib(chosen.host_bytes)} per node" if chosen.host_bytes else ""
    if s.strategy == "device-map":
        return [_device_map(chosen, missed, host)]
    text = f"{label} on {s.world_size} GPUs" + (
        f": less communication does not fit ({'; '.join(missed)})" if missed else ": the least communication"
    )
    dm = _best(chosen, cands, lambda c: c.setup.strategy == "device-map" and _same_tier(c, chosen))
    if dm is not None:
        text += (
            f"; device-map also {'fits' if dm.fits else 'is tight'}, at one GPU's speed ({_tps(dm)} tokens/s)"
        )
    return [_r("least-communication", "strategy", text + host)]


def _need(pool: Sequence[Candidate]) -> str:
    """What a strategy lacks: its least device memory, or, when some point fits the GPUs (band high edge
    within the budget) and still does not fit, the least host memory per node among those."""
    on_gpu = [c for c in pool if c.high_bytes <= c.budget_bytes and c.host_bytes is not None]
    if on_gpu and not any(c.fits for c in on_gpu):
        return f"{_gib(min(c.host_bytes or 0 for c in on_gpu))} of host memory per node"
    return _gib(min(c.device_bytes for c in pool))


def _device_map(chosen: Candidate, missed: Sequence[str], host: str) -> Reason:
    """device-map chosen: no data-parallel strategy fits without offload (what each needs), and the
    price: one GPU works at a time."""
    s = chosen.setup
    why = (
        f"no data-parallel strategy fits, even with CPU offload ({'; '.join(missed)})"
        if missed
        else "as asked"
    )
    text = (
        f"device-map: the layers split over {s.gpus} GPUs in one process, {why}; the GPUs run in turn, "
        f"so {_tps(chosen)} tokens/s is one GPU's speed, no speed-up from the others" + host
    )
    return _r("device-map", "strategy", text)


# ------------------------------------------------------------------------------------- runners-up


def why_not(c: Candidate, chosen: Candidate, methods: tuple[str, ...]) -> str:
    """Why a runner-up that meets the choice's verdict was not chosen (the loop picks the runners-up and
    words the ones that do not, `fitcheck.planner.loop`); "tight too" when the choice is tight."""
    s, x = c.setup, chosen.setup
    fits = lead(c)
    if methods.index(s.method) > methods.index(x.method):
        return f"{fits}, but --method auto prefers {x.method} (full, then LoRA, then QLoRA)"
    if s.seq_len < x.seq_len:
        return f"{fits}, but with {s.seq_len} tokens instead of {x.seq_len}"
    if s.strategy == "device-map" and x.strategy != "device-map":
        return (
            f"{fits}, but device-map runs the GPUs in turn at one GPU's speed ({_tps(c)} tokens/s); "
            f"{x.effective_strategy} trains on all {x.gpus} at once"
        )
    if (s.offload, s.strategy) != (x.offload, x.strategy):
        return (
            f"{fits}, but {x.effective_strategy}/{x.offload} offload communicates less than "
            f"{s.effective_strategy}/{s.offload} (least-communication rule)"
        )
    if c.throughput.tokens_per_s < chosen.throughput.tokens_per_s:
        return f"{fits}, {_pct(_pct_slower(c, chosen))} slower ({_tps(c)} vs {_tps(chosen)} tokens/s)"
    for dim in ("strategy", "offload", "precision", "attn", "optimizer", "grad_ckpt", "batch_size"):
        a, b = getattr(x, dim), getattr(s, dim)
        if a != b:
            return f"same estimated speed; the tie order puts {dim} {a} before {b}"
    return "same configuration"


def signature(c: Candidate) -> tuple[object, ...]:
    """What a runner-up line says: candidates that share it differ only in a memory-neutral choice."""
    s = c.setup
    return (
        s.method,
        s.seq_len,
        s.optimizer,
        s.grad_ckpt,
        s.batch_size,
        s.strategy,
        s.offload,
        c.device_bytes,
        c.throughput.tokens_per_s,
    )
