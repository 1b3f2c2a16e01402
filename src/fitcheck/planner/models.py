"""Data contracts of the planner: what is asked, the device's speed, each candidate and the plan.

Frozen pydantic models like the rest of fitcheck (`fitcheck.models`); the JSON of ``fitcheck plan
--format json`` is `Plan`'s dump (docs/json.md), one shape for every workload: the setup inside a
candidate is the `kind`-tagged setup union, its speed the workload's throughput (tokens/s for LLMs,
images/s for diffusion). Byte counts are integers ending in ``_bytes``; times are seconds ending
in ``_s``.
"""

from __future__ import annotations

from typing import Generic, Literal, TypeVar, cast

from pydantic import Field, model_validator

from fitcheck.models import (
    SCHEMA_VERSION,
    Attention,
    Backend,
    DiffusionSetup,
    Estimate,
    Frozen,
    LlmSetup,
    Offload,
    Optimizer,
    Precision,
    SetupKind,
    Strategy,
    Target,
    VerdictName,
)
from fitcheck.units import GIB, MAX_DATASET_TOKENS
from fitcheck.vocab import MethodChoice

#: Default effective batch (examples per optimizer step, all GPUs): micro-batches of 1-16 with
#: accumulation reach it, the range the source documents use (seeds/000: batch 1-2 x accumulation 4
#: on small cards, 4-16 on large ones); a common SFT setting (TRL/axolotl examples use 8-32).
DEFAULT_EFFECTIVE_BATCH = 16


def default_effective_batch(ranks: int) -> int:
    """The effective batch a plan aims for when none is given: `DEFAULT_EFFECTIVE_BATCH` rounded up to a
    whole number of examples per rank, so that it divides over every GPU of every node (3 GPUs: 18;
    8 GPUs x 4 nodes: 32) instead of refusing a value the user never typed."""
    return -(-DEFAULT_EFFECTIVE_BATCH // ranks) * ranks


class DevicePerf(Frozen):
    """How fast the target computes and moves memory (hardware catalog, or a labelled assumption)."""

    id: str
    name: str
    backend: Backend
    bf16_tflops: float = Field(gt=0, description="dense tensor TFLOPS at bf16 (fp32 accumulate)")
    fp16_tflops: float = Field(gt=0)
    fp32_tflops: float = Field(
        gt=0, description="plain fp32 (PyTorch does not use TF32 for matmul by default)"
    )
    bandwidth_gbps: float = Field(gt=0, description="memory bandwidth, GB/s (10^9)")
    compute_capability: str | None = None
    architecture: str | None = Field(
        default=None, description="the catalog's GPU architecture (CDNA3, Ampere, ...); None when unknown"
    )
    bf16_native: bool = Field(description="bf16 in hardware (CUDA compute capability >= 8.0)")
    chip: str | None = Field(default=None, description="Apple chip brand string")
    memory_bytes: int = Field(default=0, ge=0)
    sources: tuple[str, ...] = ()
    assumed: tuple[str, ...] = Field(default=(), description="figures that are assumptions, not data")

    def tflops(self, precision: str) -> float:
        """Peak dense TFLOPS for a compute dtype."""
        return {"bf16": self.bf16_tflops, "fp16": self.fp16_tflops, "fp32": self.fp32_tflops}[precision]

    @property
    def cc(self) -> float | None:
        """Compute capability as a number (8.6), None when unknown or not CUDA."""
        return float(self.compute_capability) if self.compute_capability else None

    @property
    def gpu_unknown(self) -> bool:
        """A GPU whose kernels cannot be told (no compute capability on CUDA, no architecture on ROCm): a
        size like ``24GB``; FlashAttention-2 is not assumed on it."""
        return (self.backend == "cuda" and self.cc is None) or (
            self.backend == "rocm" and self.architecture is None
        )


class PlanRequest(Frozen):
    """What the user fixed and what the planner may choose.

    ``base`` carries everything kept as asked (LoRA rank/alpha/targets/dropout, DoRA, master weights,
    double quantization, trainer, backend, GPUs); a ``None`` constraint is a searched dimension.
    """

    base: LlmSetup
    method: MethodChoice = "auto"
    effective_batch: int = Field(default=DEFAULT_EFFECTIVE_BATCH, ge=1, le=1 << 20)
    seq_len: int = Field(default=2048, ge=1, le=10_000_000, description="the longest length, as asked")
    min_seq_len: int | None = Field(default=None, ge=1, description="never below this; default seq_len")
    batch_size: int | None = Field(default=None, ge=1)
    grad_ckpt: bool | None = None
    optimizer: Optimizer | None = None
    attn: Attention | None = None
    precision: Precision | None = None
    strategy: Strategy | None = Field(default=None, description="None: searched when there are several GPUs")
    offload: Offload | None = Field(default=None, description="None: searched (none first)")
    dataset_tokens: int | None = Field(default=None, ge=1, le=MAX_DATASET_TOKENS)
    epochs: float | None = Field(default=None, gt=0)

    @property
    def floor_seq_len(self) -> int:
        return self.min_seq_len if self.min_seq_len is not None else self.seq_len


class DiffusionRequest(Frozen):
    """What the user asked of a diffusion plan: the setup as asked and the lowest resolution.

    ``base.batch_size x base.grad_accum`` is the effective batch, kept as a minimum; micro-batch,
    checkpointing, optimizer, fp8 base, ``full_bf16`` and caching are searched
    (`fitcheck.diffusion.plan`).
    """

    base: DiffusionSetup
    effective_batch: int = Field(ge=1)
    min_resolution: int | None = Field(default=None, ge=64)


class Throughput(Frozen):
    """Estimated speed of one LLM configuration (docs/planner.md, "Throughput model")."""

    flops_per_token: float = Field(description="model FLOPs per trained token, incl. recompute and attention")
    tokens_per_s: float = Field(description="all GPUs; 6 significant digits, equal figures are ties")
    micro_step_s: float
    step_s: float = Field(description="one optimizer step: accumulation x micro-step + the update")
    bound: Literal["compute", "memory"]
    mfu: float = Field(description="model FLOPs utilisation: achieved / peak dense TFLOPS")
    optimizer_steps: int | None = None
    dataset_s: float | None = Field(default=None, description="time for --dataset-tokens x --epochs")


class ImageThroughput(Frozen):
    """Estimated speed of one diffusion configuration (docs/diffusion.md#speed).

    Unrounded: the ranking compares these figures exactly, as the search always has.
    """

    images_per_s: float = Field(description="images per second over the whole optimizer step")
    flops_per_image: float = Field(description="denoiser FLOPs per image: forward, backward, recompute")
    step_s: float = Field(description="one optimizer step: micro-batch x accumulation images + the update")


#: Verdicts best first (`Candidate.meets`).
VERDICT_ORDER: tuple[VerdictName, ...] = ("fits", "tight", "does_not_fit")

SetupT = TypeVar("SetupT", LlmSetup, DiffusionSetup)
SpeedT = TypeVar("SpeedT", Throughput, ImageThroughput)


class Candidate(Frozen, Generic[SetupT, SpeedT]):
    """One point of the search space with its memory and speed."""

    setup: SetupT
    effective_batch: int
    device_bytes: int
    high_bytes: int = Field(description="the band's upper edge; the plan must fit it")
    budget_bytes: int
    verdict: VerdictName
    throughput: SpeedT
    host_bytes: int | None = Field(default=None, description="CPU memory per node (several GPUs)")
    paged_bytes: int = Field(
        default=0, ge=0, description="paged optimizer states in device_bytes: those over the budget page"
    )

    @property
    def fits(self) -> bool:
        return self.verdict == "fits"

    def meets(self, bar: VerdictName) -> bool:
        """Whether the candidate is at least as good as ``bar`` (fits > tight > does_not_fit): a plan's
        alternatives are those that meet the chosen one's verdict."""
        return VERDICT_ORDER.index(self.verdict) <= VERDICT_ORDER.index(bar)

    @property
    def paged_host_bytes(self) -> int:
        """Paged optimizer states over the budget at ``device_bytes``: they live on the host."""
        return min(max(0, self.device_bytes - self.budget_bytes), self.paged_bytes)

    @property
    def reach_bytes(self) -> int:
        """What the band's upper edge holds on the device: ``high_bytes`` less the paged bytes over the
        budget (engine/verdict.py `judge_bytes`)."""
        return self.high_bytes - min(max(0, self.high_bytes - self.budget_bytes), self.paged_bytes)


#: A candidate of each workload: the types the planner's two cost models produce.
LlmCandidate = Candidate[LlmSetup, Throughput]
DiffusionCandidate = Candidate[DiffusionSetup, ImageThroughput]
AnyCandidate = LlmCandidate | DiffusionCandidate


class RunnerUp(Frozen):
    """A candidate next to the chosen one, and why it was not chosen."""

    candidate: AnyCandidate
    reason: str


class Reason(Frozen):
    """Why one choice of the plan was made: the rule, what it decided, its source."""

    rule: str = Field(description="stable id of the rule (docs/planner.md)")
    choice: str = Field(description="what it decided: micro-batch, attention, optimizer, ...")
    text: str
    source: str


class EnvVar(Frozen):
    """An environment variable for env.sh: set (active) or shown commented out with its risk."""

    name: str
    value: str
    active: bool
    why: str
    source: str


#: What a listed change does to the command line: set an option (or the MODEL argument), or drop one.
ChangeAction = Literal["set", "drop"]


class Change(Frozen):
    """A change that makes some configuration's likely range fit when none does (nothing fits, or only
    tight configurations): checked by estimating it against the band's upper edge."""

    change: str
    flag: str = Field(description="the change as typed: `--method qlora`, `drop --batch-size`, a model id")
    option: str | None = Field(
        default=None, description="the option it sets or drops (`--method`, `--on`), or MODEL (the argument)"
    )
    value: str | None = Field(default=None, description="the value it sets (null when it drops the option)")
    action: ChangeAction = Field(default="set", description="set: add `args`; drop: remove `option`")
    args: tuple[str, ...] = Field(
        default=(), description="the words to add to the command line (drop: the option to remove)"
    )
    device_bytes: int = Field(description="the smallest need after the change")
    budget_bytes: int
    high_bytes: int | None = Field(
        default=None, description="the band's upper edge after the change: within budget_bytes"
    )

    def need_words(self) -> str:
        """Its need: the central estimate and, when known, the band's upper edge (both within budget)."""
        likely = f", likely up to {self.high_bytes / GIB:,.2f} GiB" if self.high_bytes is not None else ""
        return f"{self.device_bytes / GIB:,.2f} GiB{likely}"

    def words(self) -> str:
        """One line, as the table lists it: ``FLAG — what (X GiB, likely up to Y GiB)``."""
        return f"{self.flag} — {self.change} ({self.need_words()})"


def change_of(
    change: str, flag: str, need: int, budget: int, high: int | None, option: str | None = None
) -> Change:
    """A listed change, its flag also as structured fields (`Change.option`, ``value``, ``action``,
    ``args``): ``drop --X`` removes an option, ``--X V ...`` sets it; ``option="MODEL"``: the flag is a
    model id that replaces the MODEL argument."""
    words = flag.split()
    args: tuple[str, ...]
    if option is not None:
        opt, value, action, args = option, flag, "set", (flag,)
    elif words[0] == "drop":
        opt, value, action, args = words[1], None, "drop", (words[1],)
    else:
        opt, value, action, args = words[0], (words[1] if len(words) > 1 else None), "set", tuple(words)
    return Change(
        change=change,
        flag=flag,
        option=opt,
        value=value,
        action=cast(ChangeAction, action),
        args=args,
        device_bytes=need,
        budget_bytes=budget,
        high_bytes=high,
    )


class Plan(Frozen):
    """The planner's answer, for every workload (`fitcheck.planner.loop`)."""

    schema_version: int = SCHEMA_VERSION
    kind: SetupKind = Field(default="llm", description="the workload: llm or diffusion")
    model: str
    model_name: str
    target: Target
    device: DevicePerf
    request: PlanRequest | DiffusionRequest
    fits: bool = Field(description="true only when the chosen configuration's verdict is fits")
    verdict: VerdictName = Field(
        description="the chosen configuration's verdict: fits (its likely range fits), tight (none's likely "
        "range fits; the fastest whose central estimate fits, chosen with a warning), does_not_fit "
        "(nothing's central estimate fits: no choice)"
    )
    chosen: AnyCandidate | None = None
    estimate: Estimate | None = Field(default=None, description="the chosen configuration's full estimate")
    reasons: tuple[Reason, ...] = ()
    runners_up: tuple[RunnerUp, ...] = ()
    env: tuple[EnvVar, ...] = ()
    min_device_bytes: int = Field(description="the smallest need over the whole grid")
    changes: tuple[Change, ...] = Field(
        default=(),
        description="when nothing fits, or the plan is only tight: what would make the likely range fit, "
        "smallest first",
    )
    grid_points: int
    estimates_run: int
    warnings: tuple[str, ...] = ()
    smallest: AnyCandidate | None = Field(
        default=None, description="when nothing fits: the candidate that needs the least memory"
    )
    notes: tuple[str, ...] = Field(default=(), description="what the figures assume (not warnings)")

    @model_validator(mode="after")
    def _one_verdict(self) -> Plan:
        """``fits``, ``verdict`` and ``chosen`` say one thing: a choice exactly when its central estimate
        fits, with that choice's verdict."""
        said = self.chosen.verdict if self.chosen is not None else "does_not_fit"
        if self.chosen is not None and said == "does_not_fit":
            raise ValueError("a plan cannot choose a configuration that does not fit")
        if self.verdict != said or self.fits != (said == "fits"):
            raise ValueError(f"plan verdict {self.verdict} (fits={self.fits}) but the choice says {said}")
        return self
