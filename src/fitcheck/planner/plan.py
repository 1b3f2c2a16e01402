"""``make_plan``: an LLM plan. Check the request, run the planner loop, or say what would fit.

The loop (`fitcheck.planner.loop`) searches the LLM workload (`fitcheck.planner.search.LlmWorkload`);
this module adds what only a decoder's plan has: the request's checks and the changes that make
something fit when nothing does. Pure: the model spec, target, device speed and the catalog's
other targets come in as data.
"""

from __future__ import annotations

from collections.abc import Sequence

from fitcheck.engine.estimate import estimate
from fitcheck.engine.verdict import fits_budget
from fitcheck.models import LlmSetup, ModelSpec, Target
from fitcheck.planner import loop
from fitcheck.planner import rules as R
from fitcheck.planner.models import Change, DevicePerf, Plan, PlanRequest
from fitcheck.planner.models import LlmCandidate as Candidate
from fitcheck.planner.search import LlmWorkload
from fitcheck.units import GIB
from fitcheck.vocab import LINEAR_MODULES, LMF_ALL

#: Shortest sequence length suggested when nothing fits.
MIN_SUGGESTED_SEQ = 128
#: Model sizes (billions of parameters) tried as "a smaller model", at most 90% of the model's size.
SMALLER_SIZES_B = (70, 34, 14, 8, 7, 3, 1.5, 1, 0.5, 0.25, 0.125)
SMALLER_AT_MOST = 0.9


def make_plan(
    spec: ModelSpec,
    target: Target,
    device: DevicePerf,
    req: PlanRequest,
    other_targets: Sequence[Target] = (),
) -> Plan:
    """The fastest configuration that fits, with reasons and runners-up; or the smallest change.

    Args:
        spec: the model.
        target: the machine (budget from `fitcheck.hardware.budget`).
        device: its speed (`fitcheck.planner.device`).
        req: what is fixed and what is searched.
        other_targets: catalog devices of the same backend, for "a bigger device" when nothing fits.

    Raises:
        OptionError: an impossible request (xformers on MPS, an 8-bit optimizer on MPS, ...).
    """
    R.check_request(spec, target, device, req)
    req = _normalise(req, target)

    def changes(w: LlmWorkload, ranked: Sequence[Candidate]) -> list[Change]:
        return smallest_changes(spec, target, device, w.req, ranked, other_targets)

    w = LlmWorkload(spec, target, device, req, changes=changes)
    return loop.make(w, loop.Asked(spec.id, spec.name, target, device, req))


def _normalise(req: PlanRequest, target: Target) -> PlanRequest:
    """Fill what the target decides: backend and GPUs; MLX's 4-bit format has no double quantization."""
    update: dict[str, object] = {"backend": target.backend, "gpus": target.gpus}
    if req.base.trainer == "mlx":
        update["double_quant"] = False
    return req.model_copy(update={"base": req.base.model_copy(update=update)})


def _fits_with(spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest) -> Candidate | None:
    return loop.search(LlmWorkload(spec, target, device, req), target).chosen


def _least(cands: Sequence[Candidate]) -> Candidate:
    return min(cands, key=lambda c: c.device_bytes)


def smallest_changes(
    spec: ModelSpec,
    target: Target,
    device: DevicePerf,
    req: PlanRequest,
    cands: Sequence[Candidate],
    other_targets: Sequence[Target] = (),
) -> list[Change]:
    """Changes that make something fit, smallest first: a fixed choice freed, another method, a shorter
    sequence, a smaller model, a bigger device (each checked by estimating it)."""
    budget = target.budget_bytes
    out = [
        Change(change=change, flag=flag, device_bytes=c.device_bytes, budget_bytes=budget)
        for change, flag, c in _request_changes(spec, target, device, req)
    ]
    frugal = _least(cands).setup
    smaller = _smaller_model(spec, target, frugal)
    if smaller is not None:
        size, need = smaller
        out.append(
            Change(
                change=f"a smaller model: about {size} parameters",
                flag=size,
                device_bytes=need,
                budget_bytes=budget,
            )
        )
    bigger = _bigger_device(spec, target, frugal, other_targets)
    if bigger is not None:
        t, need = bigger
        out.append(
            Change(
                change=f"a bigger device: {t.name} ({t.budget_bytes / GIB:.1f} GiB budget)",
                flag=f"--on {t.id}",
                device_bytes=need,
                budget_bytes=t.budget_bytes,
            )
        )
    return out


def _request_changes(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest
) -> list[tuple[str, str, Candidate]]:
    """(change, flag, what then fits) for changes to the request: a fixed choice freed, the next
    method, a shorter maximum length."""
    out: list[tuple[str, str, Candidate]] = []

    def add(change: str, flag: str, c: Candidate | None) -> None:
        if c is not None:
            out.append((change, flag, c))

    freed = {
        "batch_size": ("--batch-size", req.batch_size is not None),
        "grad_ckpt": ("--no-grad-ckpt", req.grad_ckpt is False),
        "optimizer": ("--optimizer", req.optimizer is not None),
        "precision": ("--precision", req.precision == "fp32"),
        "attn": ("--attn", req.attn == "eager"),
    }
    for field, (flag, fixed) in freed.items():
        if fixed:
            freer = req.model_copy(update={field: None})
            add(
                f"let fitcheck choose {field.replace('_', ' ')}",
                f"drop {flag}",
                _fits_with(spec, target, device, freer),
            )
    # the optimizer step in backward, as asked, is full fine-tuning only: no other method to offer
    others = (
        ()
        if req.base.optimizer_in_bwd
        else {"full": ("lora", "qlora"), "lora": ("qlora",)}.get(req.method, ())
    )
    for m in others:
        c = _fits_with(spec, target, device, req.model_copy(update={"method": m}))
        add(
            "QLoRA: 4-bit base weights" if m == "qlora" else "LoRA instead of full fine-tuning",
            f"--method {m}",
            c,
        )
        if c is not None:
            break
    if req.base.optimizer_in_bwd:
        add(*_one_per_gpu(spec, target, device, req))
    seq = req.floor_seq_len // 2
    while seq >= MIN_SUGGESTED_SEQ:
        c = _fits_with(spec, target, device, req.model_copy(update={"seq_len": seq, "min_seq_len": None}))
        if c is not None:
            add(
                f"a maximum length of {seq} tokens (check that typical examples still fit)",
                f"--seq-len {seq}",
                c,
            )
            break
        seq //= 2
    return out


def _one_per_gpu(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest
) -> tuple[str, str, Candidate | None]:
    """With the step in backward every example of the effective batch is in one micro-batch (no
    accumulation): the change to one example per GPU."""
    n = target.gpus * req.base.nodes
    if req.effective_batch <= n:
        return "", "", None
    c = _fits_with(spec, target, device, req.model_copy(update={"effective_batch": n}))
    why = "the optimizer step in backward cannot accumulate gradients"
    return f"an effective batch of {n} ({why})", f"--effective-batch {n}", c


def _smaller_model(spec: ModelSpec, target: Target, frugal: LlmSetup) -> tuple[str, int] | None:
    """The largest Llama-shaped size below this model that fits with the most frugal setup."""
    from fitcheck.engine.params import count_params
    from fitcheck.sources.size import spec_from_size

    total = count_params(spec.arch)
    setup = frugal
    if frugal.lora_targets not in ("all-linear", "attn", LINEAR_MODULES, LMF_ALL):
        setup = frugal.model_copy(update={"lora_targets": "all-linear"})
    for b in SMALLER_SIZES_B:
        if b * 1e9 > SMALLER_AT_MOST * total:
            continue
        label = f"{b:g}B"
        est = estimate(spec_from_size(label), setup, target.context_bytes or None)
        if fits_budget(est, target.budget_bytes):
            return label, est.device_bytes
    return None


def _bigger_device(
    spec: ModelSpec, target: Target, frugal: LlmSetup, others: Sequence[Target]
) -> tuple[Target, int] | None:
    """The smallest device of the same backend whose budget holds the most frugal setup."""
    pool = sorted(
        (t for t in others if t.backend == target.backend and t.budget_bytes > target.budget_bytes),
        key=lambda t: (t.budget_bytes, t.id),
    )
    for t in pool:
        est = estimate(spec, frugal, t.context_bytes or None)
        if fits_budget(est, t.budget_bytes):
            return t, est.device_bytes
    return None
