"""The search: the chosen plan is the best fitting point of the grid, enumerated here independently."""

from __future__ import annotations

import itertools

import pytest

from fitcheck.api import device_for
from fitcheck.engine.estimate import estimate
from fitcheck.engine.states import counts
from fitcheck.engine.verdict import high_bytes
from fitcheck.models import LlmSetup
from fitcheck.planner.models import Plan
from fitcheck.planner.plan import make_plan
from fitcheck.planner.search import evaluate_grid
from fitcheck.planner.throughput import throughput
from fitcheck.sources.resolve import resolve_model
from plan_helpers import GIB, plan_for, request, target

#: The grid each case must search, written out from the rules in docs/planner.md (not from the code).
CASES = [
    # model, target, method, trainer, methods, precisions, attentions, optimizers, micro-batches
    (
        "llama-3.1-8b",
        "rtx-4090",
        "auto",
        "hf",
        ("full", "lora", "qlora"),
        ("bf16", "fp16"),
        ("flash", "sdpa"),
        ("adamw", "adamw8bit"),
        (1, 2, 4, 8, 16),
    ),
    (
        "qwen2.5-1.5b",
        "rtx-3060-12gb",
        "lora",
        "hf",
        ("lora",),
        ("bf16", "fp16"),
        ("flash", "sdpa"),
        ("adamw", "adamw8bit"),
        (1, 2, 4, 8, 16),
    ),
    (
        "llama-3.1-8b",
        "h100-80gb",
        "full",
        "hf",
        ("full",),
        ("bf16", "fp16"),
        ("flash", "sdpa"),
        ("adamw", "adamw8bit"),
        (1, 2, 4, 8, 16),
    ),
    (
        "llama-3.2-3b",
        "rtx-2080-ti",
        "qlora",
        "axolotl",
        ("qlora",),
        ("fp16",),
        ("xformers", "sdpa"),
        ("adamw", "adamw8bit"),
        (1, 2, 4, 8, 16),
    ),
    (
        "qwen2.5-7b",
        "apple-m3-max-36gb",
        "auto",
        "hf",
        ("full", "lora", "qlora"),
        ("bf16", "fp16"),
        ("sdpa",),
        ("adamw", "adafactor"),
        (1, 2),
    ),
    (
        "llama-3.2-1b",
        "apple-m1-16gb",
        "lora",
        "mlx",
        ("lora",),
        ("fp16",),
        ("sdpa",),
        ("adamw", "adafactor"),
        (1, 2),
    ),
    (
        "qwen2.5-0.5b",
        "cpu",
        "full",
        "hf",
        ("full",),
        ("bf16", "fp32"),
        ("sdpa",),
        ("adamw", "adafactor"),
        (1, 2, 4, 8, 16),
    ),
]


FIELDS = ("model", "on", "method", "trainer", "methods", "precs", "attns", "opts", "batches")


@pytest.mark.parametrize(FIELDS, CASES)
def test_chosen_is_best_fitting_point_of_the_grid(
    model: str, on: str, method: str, trainer: str, methods, precs, attns, opts, batches
) -> None:
    spec = resolve_model(model)
    t = target(on)
    dev = device_for(t)
    plan = make_plan(spec, t, dev, request(t, method=method, trainer=trainer))
    grid = list(itertools.product(methods, precs, attns, opts, (False, True), batches))
    assert plan.grid_points == len(grid)
    fitting = []
    for m, p, a, o, ckpt, b in grid:
        setup = LlmSetup(
            method=m,
            precision=p,
            attn=a,
            optimizer=o,
            grad_ckpt=ckpt,
            batch_size=b,
            grad_accum=16 // b,
            trainer=trainer,
            backend=t.backend,
            double_quant=trainer != "mlx",
        )
        need = high_bytes(estimate(spec, setup, t.context_bytes or None))  # plans against the band
        if need <= t.budget_bytes:
            tp = throughput(spec.arch, setup, dev, counts(spec.arch, setup).trainable).tokens_per_s
            fitting.append((methods.index(m), tp, setup))
    assert plan.fits == bool(fitting)
    if not fitting:
        return
    chosen = plan.chosen
    assert chosen is not None and chosen.fits
    tier = methods.index(chosen.setup.method)
    assert tier == min(f[0] for f in fitting), "a preferred method fits but was not chosen"
    best = max(tp for m, tp, _ in fitting if m == tier)
    assert chosen.throughput.tokens_per_s == best, "a fitting configuration is faster"
    assert chosen.device_bytes <= chosen.high_bytes <= t.budget_bytes
    assert plan.estimate is not None and plan.estimate.device_bytes == chosen.device_bytes


def test_memory_equivalent_points_share_estimates() -> None:
    """The search estimates bf16/fp16 and flash/sdpa/xformers once: the engine must agree."""
    spec = resolve_model("llama-3.2-1b")
    variants = itertools.product(("full", "lora", "qlora"), ("hf", "axolotl"), (False, True), (1, 4))
    for method, trainer, ckpt, b in variants:
        seen = set()
        for p, a in itertools.product(("bf16", "fp16"), ("flash", "sdpa", "xformers")):
            s = LlmSetup(method=method, trainer=trainer, precision=p, attn=a, grad_ckpt=ckpt, batch_size=b)
            seen.add(estimate(spec, s).device_bytes)
        assert len(seen) == 1, (method, trainer, ckpt, b)


def test_runners_up_are_ranked_and_explained() -> None:
    plan = plan_for("llama-3.1-8b", "rtx-4090")
    assert plan.kind == "llm" and Plan.model_validate_json(plan.model_dump_json()) == plan
    assert plan.fits and plan.runners_up
    for r in plan.runners_up:
        assert r.reason
        if not r.candidate.fits:
            assert r.reason.startswith("does not fit" if r.candidate.verdict == "does_not_fit" else "tight")
    assert any(r.candidate.fits for r in plan.runners_up)
    assert any(not r.candidate.fits for r in plan.runners_up)


def test_sequence_length_falls_back_but_never_below_the_floor() -> None:
    kw = {"method": "lora", "seq_len": 8192, "min_seq_len": 1024}
    plan = plan_for("llama-3.1-8b", "rtx-4090", **kw)
    assert plan.fits and plan.chosen is not None
    s = plan.chosen.setup.seq_len
    assert 1024 <= s < 8192
    t = target("rtx-4090")
    _, cands, _ = evaluate_grid(resolve_model("llama-3.1-8b"), t, device_for(t), plan.request)
    assert not any(c.fits and c.setup.seq_len > s for c in cands)
    assert any(r.rule == "seq-floor" for r in plan.reasons)
    strict = plan_for("llama-3.1-8b", "rtx-4090", method="lora", seq_len=8192)
    assert not strict.fits  # the default floor is the requested length


def test_method_auto_prefers_full_then_lora_then_qlora() -> None:
    small = plan_for("qwen2.5-0.5b", "a100-80gb")
    assert small.chosen is not None and small.chosen.setup.method == "full"
    mid = plan_for("llama-3.2-3b", "rtx-4090")
    assert mid.chosen is not None and mid.chosen.setup.method == "lora"
    big = plan_for("llama-2-13b", "rtx-4090")  # 13B: LoRA's bf16 weights alone are 24 GiB
    assert big.chosen is not None and big.chosen.setup.method == "qlora"
    reason = next(r for r in big.reasons if r.rule == "method-auto")
    assert "full does not fit" in reason.text and "lora does not fit" in reason.text


def test_nothing_fits_names_the_smallest_change_and_it_works() -> None:
    # a 43 GiB budget (an A100 40GB until session 20, whose reserve counts the loss's blocks that 15 GiB of
    # gradients regrow: paged 8-bit AdamW no longer fits there, and LoRA is the smallest change)
    plan = plan_for("llama-3.1-8b", "44GB", method="full")
    assert not plan.fits and plan.chosen is None
    assert plan.min_device_bytes > plan.target.budget_bytes
    # the smallest change (paged 8-bit AdamW: its states page to the host, so the verdict judges the rest)
    first = plan.changes[0]
    assert first.flag == "--optimizer paged-adamw8bit", [c.flag for c in plan.changes]
    paged = plan_for("llama-3.1-8b", "44GB", method="full", optimizer="paged-adamw8bit")
    assert paged.fits and paged.chosen is not None and paged.chosen.device_bytes == first.device_bytes
    lora = next(c for c in plan.changes if c.flag == "--method lora")
    assert lora.device_bytes <= lora.budget_bytes
    again = plan_for("llama-3.1-8b", "a100-40gb", method="lora")
    assert again.fits and again.chosen is not None
    assert again.chosen.device_bytes == lora.device_bytes


def test_nothing_fits_suggests_a_bigger_device_and_a_smaller_model() -> None:
    plan = plan_for("llama-3.1-8b", "rtx-3060-12gb", method="full")
    assert not plan.fits
    flags = [c.flag for c in plan.changes]
    assert any(f.startswith("--on ") for f in flags)
    assert all(c.device_bytes <= c.budget_bytes for c in plan.changes)
    bigger = next(c for c in plan.changes if c.flag.startswith("--on "))
    assert plan_for("llama-3.1-8b", bigger.flag.split()[1], method="full").fits
    smaller = next(c for c in plan.changes if c.option == "MODEL")
    # a preset the CLI takes as its MODEL argument, the closest kin that fits: no Llama-family preset does
    # (Llama 3.2 1B's 128k vocabulary), TinyLlama is a llama architecture
    assert smaller.flag == smaller.value and smaller.args == (smaller.flag,)
    assert smaller.flag == "tinyllama-1.1b" and "the same architecture, llama" in smaller.change
    again = plan_for(smaller.flag, "rtx-3060-12gb", method="full")
    assert again.fits and again.chosen is not None and again.chosen.device_bytes == smaller.device_bytes
    assert plan.min_device_bytes > 12 * GIB


@pytest.mark.parametrize(
    ("model", "on", "kw", "budget_gib"),
    [
        ("qwen2.5-7b", "rtx-4090", {"method": "lora"}, None),  # tight on the card: fitting points are few
        ("qwen2.5-7b", "rtx-4090", {"method": "lora", "seq_len": 1024}, None),
        ("llama-3.1-8b", "rtx-3060-12gb", {"method": "auto"}, 40),  # three methods, many fitting points
        ("qwen2.5-7b", "2x4090", {"method": "lora"}, None),  # strategies and offloads
        ("llama-3.1-70b", "rtx-4090", {"method": "lora"}, None),  # nothing fits: None both ways
    ],
)
def test_best_fit_chooses_what_the_search_chooses(
    model: str, on: str, kw: dict[str, object], budget_gib: int | None
) -> None:
    """`loop.best_fit` (the changes' searches: speed only for fitting points) chooses the candidate the
    full search chooses, the same setup with the same figures."""
    from fitcheck.planner import loop
    from fitcheck.planner.search import LlmWorkload

    spec, t = resolve_model(model), target(on)
    if budget_gib is not None:
        t = t.model_copy(update={"usable_bytes": budget_gib * GIB, "headroom_bytes": 0})
    device, req = device_for(t), request(t, **kw)
    best = loop.best_fit(LlmWorkload(spec, t, device, req), t)
    chosen = loop.search(LlmWorkload(spec, t, device, req), t).chosen
    assert (best is None) == (chosen is None)
    if best is not None and chosen is not None:
        assert best.model_dump() == chosen.model_dump()
