"""The search: every configuration of the grid, estimated, ranked; the best one that fits.

The grid is the product of the dimensions `fitcheck.planner.rules` allows (method, sequence length,
precision, attention kernel, optimizer, checkpointing, micro-batch; accumulation follows from the
effective batch). Every point gets a memory estimate (`fitcheck.engine.estimate`) and a throughput
(`fitcheck.planner.throughput`). The ranking is lexicographic (docs/planner.md, "Objective"):

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
from collections.abc import Callable
from dataclasses import dataclass, field

from fitcheck.engine.distributed import STRATEGY_FACTS
from fitcheck.engine.estimate import estimate
from fitcheck.engine.states import counts
from fitcheck.engine.verdict import high_bytes, judge_bytes
from fitcheck.models import LlmSetup, ModelSpec, Target
from fitcheck.planner import kernels as K
from fitcheck.planner import rules as R
from fitcheck.planner.models import Candidate, DevicePerf, PlanRequest
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
        per_gpu=req.effective_batch // (target.gpus * req.base.nodes),
    )
    dist = [(st, off) for st in R.strategies(req, target) for off in R.offloads(req, st)]
    for m, s, p, a, o, c, b, (st, off) in itertools.product(
        g.methods,
        g.seq_lens,
        g.precisions,
        g.attentions,
        g.optimizers,
        g.checkpointing,
        g.micro_batches,
        dist,
    ):
        if p in per_method[m]:
            g.points.append(Point(m, s, p, a, o, c, b, g.per_gpu // b, st, off))
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
            "strategy": p.strategy,
            "offload": p.offload,
            # fp16 full fine-tuning under the HF Trainer: fp32 weights with autocast (kernels.FP16_FULL)
            # (not without autocast: the model then trains in its load dtype, --no-autocast)
            "master_weights": base.master_weights
            or (base.autocast is not False and K.amp_fp32_weights(base.trainer, p.method, p.precision)),
        }
    )


def memory_key(p: Point, master_weights: bool = False) -> tuple[object, ...]:
    """Points with equal keys have equal estimates (16-bit dtypes alike; fused kernels alike; fp32
    weights under AMP apart)."""
    width = 4 if p.precision == "fp32" else 2
    kernel = "fused" if p.attn in FUSED_ATTN else p.attn
    return (
        p.method,
        p.seq_len,
        width,
        kernel,
        p.optimizer,
        p.grad_ckpt,
        p.batch_size,
        p.grad_accum,
        p.strategy,
        p.offload,
        master_weights,
    )


class Evaluator:
    """Estimates and throughputs of grid points, memoised."""

    def __init__(
        self,
        spec: ModelSpec,
        target: Target,
        device: DevicePerf,
        req: PlanRequest,
        est: Callable[..., tuple[int, int, int | None]],
    ) -> None:
        self.spec, self.target, self.device, self.req = spec, target, device, req
        self._est = est
        self._mem: dict[tuple[object, ...], tuple[int, int, int | None]] = {}
        self._trainable: dict[str, int] = {}
        self.estimates_run = 0

    def device_bytes(self, p: Point, setup: LlmSetup) -> tuple[int, int, int | None]:
        """(device bytes per GPU, the band's high bytes, host bytes per node or None)."""
        key = memory_key(p, setup.master_weights)
        if key not in self._mem:
            self._mem[key] = self._est(setup)
            self.estimates_run += 1
        return self._mem[key]

    def trainable(self, setup: LlmSetup) -> int:
        if setup.method not in self._trainable:
            self._trainable[setup.method] = counts(self.spec.arch, setup).trainable
        return self._trainable[setup.method]

    def candidate(self, p: Point) -> Candidate:
        setup = setup_for(self.req.base, p)
        need, high, host = self.device_bytes(p, setup)
        t = self.target
        verdict = judge_bytes(need, high, t.budget_bytes)
        if host is not None and t.host_memory_bytes is not None and host > t.host_memory_bytes:
            verdict = "does_not_fit"  # the node's CPU RAM cannot hold the offload or the loading
        return Candidate(
            setup=setup,
            effective_batch=self.req.effective_batch,
            device_bytes=need,
            high_bytes=high,
            budget_bytes=t.budget_bytes,
            verdict=verdict,  # type: ignore[arg-type]
            host_bytes=host,
            throughput=throughput(
                self.spec.arch,
                setup,
                self.device,
                self.trainable(setup),
                self.req.dataset_tokens,
                self.req.epochs,
            ),
        )


def device_bytes_fn(spec: ModelSpec, target: Target) -> Callable[[LlmSetup], tuple[int, int, int | None]]:
    """The engine's device bytes (per GPU), band high bytes, and host bytes (per node) for a setup."""
    ctx = target.context_bytes or None

    def need(setup: LlmSetup) -> tuple[int, int, int | None]:
        est = estimate(spec, setup, ctx)
        return est.device_bytes, high_bytes(est), est.host_bytes

    return need


def rank_key(c: Candidate, methods: tuple[str, ...], backend: str) -> tuple[object, ...]:
    """Lexicographic ranking: method preference, longest sequence, throughput, tie order."""
    s = c.setup
    batch = s.batch_size if backend == "mps" else -s.batch_size
    dist = (
        (0, 0)
        if not s.distributed
        else (
            R.OFFLOAD_ORDER.index(s.offload),
            STRATEGY_FACTS[s.effective_strategy].comm_rank,
        )
    )
    return (
        methods.index(s.method),
        -s.seq_len,
        *dist,
        -c.throughput.tokens_per_s,
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
    est: Callable[[LlmSetup], tuple[int, int, int | None]] | None = None,
) -> tuple[Grid, list[Candidate], int]:
    """Every grid point as a candidate, ranked best first; and how many estimates ran."""
    grid = build_grid(req, target, device, spec)
    ev = Evaluator(spec, target, device, req, est or device_bytes_fn(spec, target))
    cands = [ev.candidate(p) for p in grid.points]
    cands.sort(key=lambda c: rank_key(c, grid.methods, target.backend))
    return grid, cands, ev.estimates_run
