"""``make_plan``: an LLM plan. Check the request, run the planner loop, or say what would fit.

The loop (`fitcheck.planner.loop`) searches the LLM workload (`fitcheck.planner.search.LlmWorkload`);
this module adds what only a decoder's plan has: the request's checks and the changes that make
some configuration's likely range fit, when nothing fits or the plan is only tight. Pure: the model
spec, target, device speed and the catalog's other targets come in as data.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from fitcheck.engine.estimate import estimate
from fitcheck.engine.verdict import delta, fits_budget, moe_changes
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup, ModelSpec, Target
from fitcheck.planner import loop
from fitcheck.planner import rules as R
from fitcheck.planner.loop import Tally
from fitcheck.planner.models import Change, DevicePerf, Plan, PlanRequest, change_of
from fitcheck.planner.models import LlmCandidate as Candidate
from fitcheck.planner.search import LlmWorkload, MemoryFn
from fitcheck.units import GIB
from fitcheck.vocab import LINEAR_MODULES, LMF_ALL

if TYPE_CHECKING:
    from fitcheck.sources.resolve import ModelOption

#: Shortest sequence length suggested when nothing fits.
MIN_SUGGESTED_SEQ = 128
#: "A smaller model" is a catalogued model preset of at most 90% of the model's parameters.
SMALLER_AT_MOST = 0.9


def make_plan(
    spec: ModelSpec,
    target: Target,
    device: DevicePerf,
    req: PlanRequest,
    other_targets: Sequence[Target] = (),
    perf_of: PerfOf | None = None,
) -> Plan:
    """The fastest configuration that fits, with reasons and runners-up; or the smallest change.

    Args:
        spec: the model.
        target: the machine (budget from `fitcheck.hardware.budget`).
        device: its speed (`fitcheck.planner.device`).
        req: what is fixed and what is searched.
        other_targets: catalog devices of the same backend, for "a bigger device" when nothing fits.
        perf_of: the speed figures of one of ``other_targets`` (`fitcheck.api.device_for`): a bigger
            device is offered only where the request can run (FlashAttention-2 needs Ampere, ...).

    Raises:
        OptionError: an impossible request (xformers on MPS, an 8-bit optimizer on MPS, ...).
    """
    R.check_request(spec, target, device, req)
    req = _normalise(req, target)

    def changes(w: LlmWorkload, ranked: Sequence[Candidate]) -> list[Change]:
        # counts in w.estimates_run itself
        tally = LlmTally(target=target, base=w.req.base, shared=w.memory, spec_id=spec.id)
        there = OnOther(spec, target, w.req, perf_of or (lambda t: device), tally)
        tight = loop.tight_choice(w, ranked)  # beside a tight plan: its own settings on a bigger device
        current = tight.setup if tight is not None else None
        out = smallest_changes(spec, target, device, w.req, ranked, other_targets, tally, there, current)
        w.estimates_run += tally.estimates  # the plan says what the changes cost too
        return out

    w = LlmWorkload(spec, target, device, req, changes=changes)
    return loop.make(w, loop.Asked(spec.id, spec.name, target, device, req))


#: A device's speed figures, for the request on "a bigger device".
PerfOf = Callable[[Target], DevicePerf]


@dataclass(frozen=True)
class OnOther:
    """The request on another catalog device, with as many GPUs as the target: whether it can run there
    (`check_request`: FlashAttention-2 needs Ampere, ...) and what one search there chooses."""

    spec: ModelSpec
    target: Target
    req: PlanRequest
    perf_of: PerfOf
    tally: Tally

    def _there(self, t: Target) -> tuple[Target, DevicePerf, PlanRequest]:
        t = t.model_copy(update={"gpus": self.target.gpus})
        return t, self.perf_of(t), _normalise(self.req, t)

    def runs(self, t: Target) -> bool:
        there, perf, req = self._there(t)
        try:
            R.check_request(self.spec, there, perf, req)
        except OptionError:
            return False
        return True

    def best(self, t: Target) -> Candidate | None:
        """The best candidate whose likely range fits there (one search), None when none does."""
        there, perf, req = self._there(t)
        return _fits_with(self.spec, there, perf, req, self.tally)


def _normalise(req: PlanRequest, target: Target) -> PlanRequest:
    """Fill what the target decides: backend and GPUs; MLX's 4-bit format has no double quantization."""
    update: dict[str, object] = {"backend": target.backend, "gpus": target.gpus}
    if req.base.trainer == "mlx":
        update["double_quant"] = False
    return req.model_copy(update={"base": req.base.model_copy(update=update)})


@dataclass
class LlmTally(Tally):
    """The changes' estimates, and the plan's own memoised cost model on its target (`LlmWorkload.memory`,
    which counts its estimates in the plan's ``estimates_run``): a changed request searched on the same
    target with the same base setup shares it, so a point the plan (or an earlier change) already estimated
    is not estimated again."""

    target: Target | None = None
    #: The model whose estimates the shared cost model holds (a smaller model's search has its own).
    spec_id: str | None = None
    #: What the shared cost model's `memory_key` leaves out (GPUs, nodes, LoRA shape, ...) is in the base.
    base: LlmSetup | None = None
    shared: MemoryFn | None = None


def _fits_with(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> Candidate | None:
    """The best candidate whose likely range fits after the change (one search, `loop.best_fit`: what
    the plan of the changed request would choose), None when none does or the request or the estimator
    refuses it."""
    key = (spec.id, target, req.base)
    same = isinstance(tally, LlmTally) and (tally.spec_id, tally.target, tally.base) == key
    shared = tally.shared if same and isinstance(tally, LlmTally) else None
    try:  # refused there: a kernel, an optimizer, --optimizer-in-backward on one GPU only
        R.check_request(spec, target, device, req)
        w = LlmWorkload(spec, target, device, req, est=shared)
    except OptionError:
        return None
    try:
        found: Candidate | None = loop.best_fit(w, target)
    except OptionError:
        found = None
    if shared is None:  # the shared cost model counted its own
        tally.estimates += w.estimates_run
    return found


def _least(cands: Sequence[Candidate]) -> Candidate:
    return min(cands, key=lambda c: c.device_bytes)


def smallest_changes(
    spec: ModelSpec,
    target: Target,
    device: DevicePerf,
    req: PlanRequest,
    cands: Sequence[Candidate],
    other_targets: Sequence[Target] = (),
    tally: Tally | None = None,
    there: OnOther | None = None,
    current: LlmSetup | None = None,
) -> list[Change]:
    """Changes that make some configuration's likely range fit, smallest first: a fixed choice freed, a
    paged 8-bit optimizer, another method, a shorter sequence, more GPUs, a smaller model, a bigger device
    (each checked against the band's high edge by one search or a bounded run of estimates, counted in
    ``tally``). Used when nothing fits and beside a tight plan (``current``: its chosen setup, which the
    bigger device must hold; when nothing fits, the least-memory setup)."""
    tally = tally if tally is not None else Tally()
    out = [
        change_of(change, flag, c.device_bytes, c.budget_bytes, c.high_bytes)
        for change, flag, c in _request_changes(spec, target, device, req, tally, _is_tight(cands))
    ]
    frugal = _least(cands).setup
    there = there if there is not None else OnOther(spec, target, req, lambda t: device, tally)
    smaller = _smaller_model(spec, target, device, req, frugal, tally)
    if smaller is not None:
        other, why, c = smaller
        change = f"a smaller model: {other.name} ({other.params / 1e9:.1f}B parameters, {why})"
        out.append(change_of(change, other.id, c.device_bytes, c.budget_bytes, c.high_bytes, "MODEL"))
    bigger = _bigger_device(spec, target, current or frugal, other_targets, tally, there)
    if bigger is not None:
        t, need, high = bigger
        flag = f"--on {t.id}" + (f" --gpus {target.gpus}" if target.gpus > 1 else "")
        out.append(change_of(f"a bigger device: {t.name} ({t.budget_bytes / GIB:.1f} GiB budget)", flag,
                           need, t.budget_bytes, high))  # fmt: skip
    return out


Found = tuple[str, str, Candidate]


def _is_tight(cands: Sequence[Candidate]) -> bool:
    """Whether the plan is tight: some configuration's central estimate fits (none's likely range does)."""
    return any(c.verdict == "tight" for c in cands)


def _request_changes(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally, tight: bool = False
) -> list[Found]:
    """(change, flag, what then fits) for changes to the request: a fixed choice freed, a paged 8-bit
    optimizer, the next method, a shorter maximum length, a MoE model's own changes, more GPUs; one
    search each. Beside a tight plan
    more GPUs are searched only when no change on the same GPUs fits (the widest search, and the costliest
    change to make: docs/planner.md#tight-changes)."""
    out = _freed(spec, target, device, req, tally)
    for found in (
        _paged(spec, target, device, req, tally),
        _other_method(spec, target, device, req, tally),
        _one_per_gpu(spec, target, device, req, tally) if req.base.optimizer_in_bwd else None,
        _shorter(spec, target, device, req, tally),
    ):
        out += [found] if found is not None else []
    out += _moe_runs(spec, target, device, req, tally)
    more = _more_gpus(spec, target, device, req, tally) if not (tight and out) else None
    return out + ([more] if more is not None else [])


def _freed(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> list[Found]:
    """Each dimension the user fixed, left to the search instead (one search each)."""
    freed = {
        "batch_size": ("--batch-size", req.batch_size is not None),
        "grad_ckpt": ("--no-grad-ckpt", req.grad_ckpt is False),
        "optimizer": ("--optimizer", req.optimizer is not None),
        "precision": ("--precision", req.precision == "fp32"),
        "attn": ("--attn", req.attn == "eager"),
        "strategy": ("--strategy", req.strategy is not None),
        "offload": ("--offload", req.offload is not None),
    }
    out: list[Found] = []
    for field, (flag, fixed) in freed.items():
        c = _fits_with(spec, target, device, req.model_copy(update={field: None}), tally) if fixed else None
        if c is not None:
            out.append((f"let fitcheck choose {field.replace('_', ' ')}", f"drop {flag}", c))
    return out


#: The optimizer offered when its states could page to the host (engine/verdict.py `judge_bytes`).
PAGED = "paged-adamw8bit"


def _paged(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> Found | None:
    """Paged 8-bit AdamW, when not asked already: 2 B/param states that page to the host when the device
    runs short (bitsandbytes' paged optimizers; refused where bitsandbytes or the trainer lacks it)."""
    if req.optimizer == PAGED or req.base.optimizer_in_bwd:
        return None
    c = _fits_with(spec, target, device, req.model_copy(update={"optimizer": PAGED}), tally)
    why = (
        "paged 8-bit AdamW (bitsandbytes): its states page to the host when the GPU runs short (slower steps)"
    )
    return (why, f"--optimizer {PAGED}", c) if c is not None else None


def _other_method(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> Found | None:
    """The next lighter method (LoRA, then QLoRA) when one is fixed; the optimizer step in backward, as
    asked, is full fine-tuning only: no other method to offer."""
    if req.base.optimizer_in_bwd:
        return None
    for m in {"full": ("lora", "qlora"), "lora": ("qlora",)}.get(req.method, ()):
        c = _fits_with(spec, target, device, req.model_copy(update={"method": m}), tally)
        if c is not None:
            what = "QLoRA: 4-bit base weights" if m == "qlora" else "LoRA instead of full fine-tuning"
            return what, f"--method {m}", c
    return None


def _moe_runs(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> list[Found]:
    """A MoE model's own changes (engine/verdict.py `moe_changes`: LoRA on attention only, a
    transformers 4.x run's per-expert experts, Unsloth), each kept as asked in ``base``: one search
    each. For a method left to the search they are posed for QLoRA, the method they change most."""
    if req.method not in ("auto", "lora", "qlora"):
        return []
    posed = req.base.model_copy(update={"method": "qlora" if req.method == "auto" else req.method})
    out: list[Found] = []
    for what, flag, changed in moe_changes(spec.arch, posed):
        at = req.model_copy(update={"base": req.base.model_copy(update=delta(posed, changed))})
        c = _fits_with(spec, target, device, at, tally)
        out += [(what, flag, c)] if c is not None else []
    return out


def _shorter(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> Found | None:
    """The longest halving of the maximum length (down to `MIN_SUGGESTED_SEQ`) whose likely range fits:
    one search per halving, longest first, stopping at the first that fits (a search of every halving
    at once ranks the longest length first too, so it would choose the same)."""
    seq = req.floor_seq_len // 2
    while seq >= MIN_SUGGESTED_SEQ:
        at = req.model_copy(update={"seq_len": seq, "min_seq_len": seq})
        c = _fits_with(spec, target, device, at, tally)
        if c is not None:
            what = f"a maximum length of {seq} tokens (check that typical examples still fit)"
            return what, f"--seq-len {seq}", c
        seq //= 2
    return None


def _more_gpus(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> Found | None:
    """Twice the GPUs (``--gpus 2`` on one GPU, twice ``--nodes`` on a node): ZeRO and FSDP shard the
    states over more ranks, and each rank trains a smaller share of the effective batch (one search)."""
    if target.backend not in ("cuda", "rocm") or req.base.optimizer_in_bwd:  # in backward: one GPU only
        return None
    if target.gpus == 1:
        more, flag = target.model_copy(update={"gpus": 2}), "--gpus 2"
        req = _normalise(req, more)
    else:
        nodes = 2 * req.base.nodes
        more, flag = target, f"--nodes {nodes}"
        req = req.model_copy(update={"base": req.base.model_copy(update={"nodes": nodes})})
    c = _fits_with(spec, more, device, req, tally)
    gpus = more.gpus * req.base.nodes
    return (f"{gpus} GPUs (each holds a share of the states and the batch)", flag, c) if c else None


def _one_per_gpu(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, tally: Tally
) -> Found | None:
    """With the step in backward every example of the effective batch is in one micro-batch (no
    accumulation): the change to one example per GPU."""
    n = target.gpus * req.base.nodes
    if req.effective_batch <= n:
        return None
    c = _fits_with(spec, target, device, req.model_copy(update={"effective_batch": n}), tally)
    why = "the optimizer step in backward cannot accumulate gradients"
    return (f"an effective batch of {n} ({why})", f"--effective-batch {n}", c) if c is not None else None


def _smaller_model(
    spec: ModelSpec, target: Target, device: DevicePerf, req: PlanRequest, frugal: LlmSetup, tally: Tally
) -> tuple[ModelOption, str, Candidate] | None:
    """A catalogued model of at most `SMALLER_AT_MOST` of this one's parameters whose likely range fits:
    the closest kin first (the same series, then the same family, then any), the largest of each first.
    Each is tried with the most frugal setup (one estimate), the first that fits confirmed by one search
    of the request with that model (what its plan would choose; a request it refuses moves on):
    (the model, how it is related, the confirmed choice)."""
    from fitcheck.engine.params import count_params
    from fitcheck.sources.resolve import model_options, spec_from_preset

    total = count_params(spec.arch)
    generic = ("all-linear", "attn", LINEAR_MODULES, LMF_ALL)
    if frugal.lora_targets not in generic:  # named modules may not exist in another model
        frugal = frugal.model_copy(update={"lora_targets": "all-linear"})
        req = req.model_copy(update={"base": req.base.model_copy(update={"lora_targets": "all-linear"})})
    fewer = [m for m in model_options() if m.params <= SMALLER_AT_MOST * total]
    for other, why in _by_kinship(spec, fewer):
        other_spec = spec_from_preset(other.id)
        est = estimate(other_spec, frugal, target.context_bytes or None)
        tally.estimates += 1
        if not fits_budget(est, target.budget_bytes):
            continue
        c = _fits_with(other_spec, target, device, req, tally)
        if c is not None:
            return other, why, c
    return None


def _by_kinship(spec: ModelSpec, options: Sequence[ModelOption]) -> list[tuple[ModelOption, str]]:
    """Catalogued models, closest kin first: the same series (`ModelOption.series`), the same family (the
    preset's own), the same architecture (``model_type``), then any; the largest first within each."""
    from fitcheck.sources.resolve import model_options

    preset = spec.source_kind == "preset"
    mine = next((m for m in model_options() if m.id == spec.id), None) if preset else None
    arch = spec.arch.model_type

    def kin(m: ModelOption) -> tuple[int, str]:
        if mine is not None and m.series == mine.series:
            return 0, "the same series"
        if mine is not None and m.family == mine.family:
            return 1, "the same family"
        if m.model_type == arch:
            return 2, f"the same architecture, {arch}"
        return 3, "another family"

    ranked = sorted(options, key=lambda m: (kin(m)[0], -m.params, m.id))
    return [(m, kin(m)[1]) for m in ranked]


def _bigger_device(
    spec: ModelSpec,
    target: Target,
    setup: LlmSetup,
    others: Sequence[Target],
    tally: Tally,
    there: OnOther,
) -> tuple[Target, int, int] | None:
    """The smallest device of the same backend where the request runs whose budget holds ``setup``'s likely
    range (beside a tight plan its chosen setup, else the least-memory one; one estimate per device tried; a
    bf16 setup only where the device has bf16), confirmed by one search there (what the plan on that
    device would choose, which may differ: fp16 full fine-tuning keeps fp32 weights): (device, its
    choice's device bytes and band high edge)."""
    pool = sorted(
        (t for t in others if t.backend == target.backend and t.budget_bytes > target.budget_bytes),
        key=lambda t: (t.budget_bytes, t.id),
    )
    for t in pool:
        if (setup.precision == "bf16" and not t.bf16) or not there.runs(t):
            continue
        est = estimate(spec, setup, t.context_bytes or None)
        tally.estimates += 1
        if fits_budget(est, t.budget_bytes):
            c = there.best(t)
            return (t, c.device_bytes, c.high_bytes) if c is not None else None
    return None
