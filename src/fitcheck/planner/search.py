"""The LLM workload of the planner loop: the grid, its cost model and its ranking.

`LlmWorkload` is what `fitcheck.planner.loop` searches for a decoder. The grid is the product of
the dimensions `fitcheck.planner.rules` allows (method, sequence length, precision, attention kernel,
optimizer, checkpointing, micro-batch; accumulation follows from the effective batch). Every point
gets a memory estimate (`fitcheck.engine.estimate`) and a throughput (`fitcheck.planner.throughput`).
The ranking is lexicographic (docs/planner.md, "Objective"):

1. method preference (``--method auto``: full, then LoRA, then QLoRA);
2. the longest sequence length (never below ``--min-seq-len``);
3. the highest estimated tokens/s;
4. the tie order of `rules` (bf16 > fp16, flash > sdpa, adamw > 8-bit, no checkpointing, ...).

The chosen plan is the first point in that order whose band's high edge fits the budget (usable
memory minus headroom): the planner plans against ``high_bytes``, not the central estimate. Points
that differ only in ways the memory engine does not see (bf16 vs fp16, flash vs SDPA vs xformers)
share one estimate; a test checks that they are equal.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from fitcheck.engine.estimate import FLASH_FP32, estimate
from fitcheck.engine.states import counts
from fitcheck.engine.verdict import verdict
from fitcheck.errors import OptionError
from fitcheck.models import Estimate, LlmSetup, ModelSpec, SetupKind, Target
from fitcheck.planner import explain
from fitcheck.planner import kernels as K
from fitcheck.planner import rules as R
from fitcheck.planner.advice import env_vars
from fitcheck.planner.loop import Memory, memory_of, search
from fitcheck.planner.models import (
    Change,
    DevicePerf,
    EnvVar,
    LlmCandidate,
    PlanRequest,
    Reason,
    Throughput,
)
from fitcheck.planner.throughput import throughput

#: Attention kernels with the same memory in the engine (O(s) saved tensors).
FUSED_ATTN = frozenset({"flash", "sdpa", "xformers"})


@dataclass(frozen=True)
class Point:
    """One configuration of the grid."""

    method: str
    seq_len: int
    precision: str
    attn: str
    optimizer: str
    grad_ckpt: bool
    batch_size: int
    grad_accum: int
    strategy: str | None = None
    offload: str = "none"


@dataclass
class Grid:
    """The searched values per dimension, and the points."""

    methods: tuple[str, ...]
    seq_lens: tuple[int, ...]
    precisions: tuple[str, ...]
    attentions: tuple[str, ...]
    optimizers: tuple[str, ...]
    checkpointing: tuple[bool, ...]
    micro_batches: tuple[int, ...]
    per_gpu: int
    points: list[Point] = field(default_factory=list)


def build_grid(req: PlanRequest, target: Target, device: DevicePerf, spec: ModelSpec) -> Grid:
    """All points of the grid for this request, device, trainer and architecture."""
    methods = R.methods(req)
    per_method = {m: R.precisions(req, device, m) for m in methods}
    g = Grid(
        methods=methods,
        seq_lens=R.seq_lens(req),
        precisions=tuple(dict.fromkeys(p for ps in per_method.values() for p in ps)),
        attentions=R.attentions(req, device, spec),
        optimizers=R.optimizers(req, target.backend),
        checkpointing=R.checkpointing(req),
        micro_batches=R.micro_batches(req, target),
        per_gpu=R.per_process_batch(req, target, None),
    )
    if set(g.attentions) == {"flash"} and set(g.precisions) == {"fp32"}:
        raise OptionError(FLASH_FP32)
    # device-map trains the whole effective batch in one process: its own micro-batches and accumulation
    dist = [
        (st, off, R.per_process_batch(req, target, st), b)
        for st in R.strategies(req, target)
        for off in R.offloads(req, st)
        for b in R.micro_batches(req, target, st)
    ]
    for m, s, p, a, o, c, (st, off, per, b) in itertools.product(
        g.methods,
        g.seq_lens,
        g.precisions,
        g.attentions,
        g.optimizers,
        g.checkpointing,
        dist,
    ):
        if p in per_method[m] and not (a == "flash" and p == "fp32"):  # FlashAttention-2: fp16/bf16 only
            g.points.append(Point(m, s, p, a, o, c, b, per // b, st, off))
    return g


def setup_for(base: LlmSetup, p: Point) -> LlmSetup:
    """The LlmSetup of a point (everything else as asked)."""
    return base.model_copy(
        update={
            "method": p.method,
            "seq_len": p.seq_len,
            "precision": p.precision,
            "attn": p.attn,
            "optimizer": p.optimizer,
            "grad_ckpt": p.grad_ckpt,
            "batch_size": p.batch_size,
            "grad_accum": p.grad_accum,
            "dora": base.dora and p.method != "full",
            "lora_fa": base.lora_fa and p.method != "full",
            "strategy": p.strategy,
            "offload": p.offload,
            # fp16 full fine-tuning under the HF Trainer: fp32 weights with autocast (kernels.FP16_FULL)
            # (not without autocast: the model then trains in its load dtype, --no-autocast)
            "master_weights": base.master_weights
            or (base.autocast is not False and K.amp_fp32_weights(base.trainer, p.method, p.precision)),
        }
    )


def memory_key(s: LlmSetup) -> tuple[object, ...]:
    """Setups with equal keys have equal estimates (16-bit dtypes alike; fused kernels alike; fp32
    weights under AMP apart)."""
    width = 4 if s.precision == "fp32" else 2
    kernel = "fused" if s.attn in FUSED_ATTN else s.attn
    return (
        s.method,
        s.seq_len,
        width,
        kernel,
        s.optimizer,
        s.grad_ckpt,
        s.batch_size,
        s.grad_accum,
        s.strategy,
        s.offload,
        s.master_weights,
    )


MemoryFn = Callable[[LlmSetup], Memory]


def device_bytes_fn(spec: ModelSpec, target: Target) -> MemoryFn:
    """The engine's device bytes (per GPU), band high bytes, and host bytes (per node) for a setup."""
    ctx = target.context_bytes or None

    def need(setup: LlmSetup) -> Memory:
        # the allocator's history over varying lengths is releasable cache, outside device_bytes and the band
        # (engine/cache_history.py): the search skips its rungs (a padded batch's step stays padded)
        est = estimate(spec, setup, ctx, history=False)
        return memory_of(est)

    return need


#: What `LlmWorkload.changes` calls when nothing fits (`fitcheck.planner.plan.smallest_changes`).
ChangesFn = Callable[["LlmWorkload", Sequence[LlmCandidate]], list[Change]]


class LlmWorkload:
    """A decoder's search space (the grid, one tier), cost model (engine estimate, memoised on
    `memory_key`; `fitcheck.planner.throughput`), ranking and words, for `fitcheck.planner.loop`."""

    kind: SetupKind = "llm"
    candidate_model = LlmCandidate
    exhaustive = True  # the whole grid: runners-up on both sides and the least need of any point

    def __init__(
        self,
        spec: ModelSpec,
        target: Target,
        device: DevicePerf,
        req: PlanRequest,
        est: MemoryFn | None = None,
        changes: ChangesFn | None = None,
    ) -> None:
        self.spec, self.target, self.device, self.req = spec, target, device, req
        self.grid = build_grid(req, target, device, spec)
        self.effective_batch = req.effective_batch
        self.estimates_run = 0
        self._est = est or device_bytes_fn(spec, target)
        self._changes = changes
        self._mem: dict[tuple[object, ...], Memory] = {}
        self._trainable: dict[str, int] = {}

    def tiers(self) -> Iterator[Iterator[list[LlmSetup]]]:
        """One tier, each grid point its own family (the ranking, not the order, decides)."""
        yield ([setup_for(self.req.base, p)] for p in self.grid.points)

    def memory(self, setup: LlmSetup) -> Memory:
        key = memory_key(setup)
        if key not in self._mem:
            self._mem[key] = self._est(setup)
            self.estimates_run += 1
        return self._mem[key]

    def speed(self, setup: LlmSetup) -> Throughput:
        if setup.method not in self._trainable:
            self._trainable[setup.method] = counts(self.spec.arch, setup).trainable
        trainable = self._trainable[setup.method]
        req = self.req
        return throughput(self.spec.arch, setup, self.device, trainable, req.dataset_tokens, req.epochs)

    def rank_key(self, c: LlmCandidate) -> tuple[object, ...]:
        return rank_key(c, self.grid.methods, self.target.backend)

    def speed_key(self, c: LlmCandidate) -> tuple[object, ...]:
        return speed_key(c, self.grid.methods)

    def goal_key(self, c: LlmCandidate) -> tuple[object, ...]:
        return goal_key(c, self.grid.methods)

    def signature(self, c: LlmCandidate) -> tuple[object, ...]:
        return explain.signature(c)

    def why_not(self, c: LlmCandidate, chosen: LlmCandidate) -> str:
        return explain.why_not(c, chosen, self.grid.methods)

    def reasons(self, chosen: LlmCandidate, ranked: Sequence[LlmCandidate]) -> list[Reason]:
        return explain.reasons(chosen, ranked, self.req, self.target, self.device)

    def env(self, chosen: LlmCandidate) -> tuple[EnvVar, ...]:
        return env_vars(chosen, self.target)

    def changes(self, ranked: Sequence[LlmCandidate]) -> list[Change]:
        return self._changes(self, ranked) if self._changes is not None else []

    def estimate(self, setup: LlmSetup) -> Estimate:
        est = estimate(self.spec, setup, self.target.context_bytes or None)
        return est.model_copy(update={"target": verdict(est, self.target)})

    def notes(self, chosen: LlmCandidate | None) -> tuple[str, ...]:
        return ()


def goal_key(c: LlmCandidate, methods: tuple[str, ...]) -> tuple[object, ...]:
    """What is trained: method preference, then the longest sequence."""
    return (methods.index(c.setup.method), -c.setup.seq_len)


def speed_key(c: LlmCandidate, methods: tuple[str, ...]) -> tuple[object, ...]:
    """The head of the ranking: `goal_key`, strategy, throughput."""
    s = c.setup
    dist = (0, 0) if not s.distributed else R.dist_rank(s.effective_strategy, s.offload)
    return (*goal_key(c, methods), *dist, -c.throughput.tokens_per_s)


def rank_key(c: LlmCandidate, methods: tuple[str, ...], backend: str) -> tuple[object, ...]:
    """Lexicographic ranking: `speed_key`, then the tie order."""
    s = c.setup
    batch = s.batch_size if backend == "mps" else -s.batch_size
    return (
        *speed_key(c, methods),
        R.PRECISION_ORDER.index(s.precision),
        R.ATTN_ORDER.index(s.attn),
        R.OPT_ORDER.index(s.optimizer),
        s.grad_ckpt,
        batch,
    )


def evaluate_grid(
    spec: ModelSpec,
    target: Target,
    device: DevicePerf,
    req: PlanRequest,
    est: MemoryFn | None = None,
) -> tuple[Grid, list[LlmCandidate], int]:
    """Every grid point as a candidate, ranked best first; and how many estimates ran."""
    w = LlmWorkload(spec, target, device, req, est)
    found = search(w, target)
    return w.grid, found.ranked, w.estimates_run
