"""Trace a 2023-stack QLoRA step by emulation (bitsandbytes cannot run on fake tensors).

The 2023 stack of published QLoRA runs (tests/data/published/google-vertex-openllama-finetune.yaml): peft's
``prepare_model_for_kbit_training`` (every non-quantized parameter fp32, ``enable_input_require_grads``,
reentrant gradient checkpointing, torch 2.0's default), bitsandbytes 0.39 ``Linear4bit`` (input cast to the
fp16 compute dtype, output cast back to the input's dtype), HF Trainer fp16 autocast, eager LLaMA attention.

Every decoder ``nn.Linear`` is replaced by `EmulatedLinear4bit`, which reproduces what bitsandbytes'
``Linear4bit.forward`` does with dtypes and saved tensors, not its numbers:

- its frozen weight is a uint8 tensor of half the elements (4 bits a weight) and an fp32 absmax per 64 weights
  (``QuantState``, no double quantization);
- ``forward``: ``inp_dtype = x.dtype; x = x.to(compute_dtype)``, the 4-bit matmul, ``out.to(inp_dtype)``
  (bitsandbytes nn/modules.py ``Linear4bit.forward`` @0.39.0);
- the matmul is an autograd Function like ``MatMul4Bit``: a dequantized fp16 weight made on the fly
  (``F.dequantize_4bit``), ``F.linear``; it keeps ``ctx.tensors = (A, B)`` when an input needs a gradient
  (bitsandbytes autograd/_functions.py @0.39.0, until 0.43.2 "fix QLoRA mem bug: delete useless buffered
  activation", #1270) or ``(None, B)`` after that fix (``--bnb-fixed``); backward dequantizes again.

Then peft LoRA on the seven projections (fp32 adapters), the trace of `fitcheck.measure.trace.trace_step`
(``LiveStorageMode``, phases of the second step), and the engine's estimate for the same setup
(``--method qlora --kbit-path peft --grad-ckpt --attn eager --precision fp16 --trainer hf``).

    PYTHONPATH=src python bench/qlora2023_trace.py                 # the default grid, ~1 min
    PYTHONPATH=src python bench/qlora2023_trace.py --layers 4 8 --batch 1 4
    PYTHONPATH=src python bench/qlora2023_trace.py --shape 7b --layers 32 --batch 16 24 32 --replay 3

``--replay N`` also replays the traced step's allocations and frees (the second step's, after what is
alive as it starts) N times through bench/swift_loss.py's model of PyTorch's CUDA caching allocator and
prints the reserved high-water mark beside the engine's reserved figure: what fragmentation of this stack's
blocks (reentrant recompute of every layer, eager scores, fp32 stream) adds above the allocated peak.
``--replay 1 --whole-run`` replays every allocation from the trace's start instead (the model's build and
both steps, in order), for the history before the step.
``--shape 7b`` traces LLaMA-7B's shape (tests/data/published/google-vertex-openllama-finetune.yaml: hidden
4096, MLP 11008, 32 heads, vocabulary 32000), about 10-30 s a trace at 32 layers.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

#: A LLaMA shape small enough to trace in seconds; vocabulary cut so that layers, not logits, decide.
SMALL_LLAMA: dict[str, Any] = {
    "model_type": "llama",
    "hidden_size": 512,
    "intermediate_size": 1376,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "num_hidden_layers": 4,
    "vocab_size": 512,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
#: LLaMA-7B's shape (OpenLLaMA-7B's, the Google Vertex record's model; the llama-2-7b preset's numbers).
LLAMA_7B: dict[str, Any] = {
    **SMALL_LLAMA,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32000,
}
SHAPES = {"small": SMALL_LLAMA, "7b": LLAMA_7B}


class MatMul4BitEmulated(torch.autograd.Function):
    """bitsandbytes 0.39 ``MatMul4Bit`` as far as memory goes (see the module docstring)."""

    @staticmethod
    def forward(
        ctx: Any, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, int], holds: bool
    ) -> torch.Tensor:
        w = b.new_empty(shape, dtype=a.dtype)  # F.dequantize_4bit(B, state).to(A.dtype): a fresh fp16 weight
        out = nn.functional.linear(a, w)
        ctx.shape = shape
        ctx.tensors = (a if holds and ctx.needs_input_grad[0] else None, b)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        _, b = ctx.tensors
        w = b.new_empty(ctx.shape, dtype=grad.dtype)
        return torch.matmul(grad, w), None, None, None


class EmulatedLinear4bit(nn.Linear):
    """``bnb.nn.Linear4bit`` (nf4, fp16 compute dtype, no bias) with its dtype behaviour and storage."""

    holds_input = True

    def __init__(self, in_features: int, out_features: int, dtype: torch.dtype) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.compute_dtype = dtype
        n = in_features * out_features
        self.weight = nn.Parameter(torch.empty(n // 2, 1, dtype=torch.uint8), requires_grad=False)
        # QuantState.absmax: one fp32 scale per 64-weight block (blocksize 64, no double quantization)
        self.register_buffer("absmax", torch.empty(n // 64, dtype=torch.float32))
        self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        shape = (self.out_features, self.in_features)
        out = MatMul4BitEmulated.apply(x, self.weight, shape, self.holds_input)
        return out.to(inp_dtype)


def quantize_decoder(model: nn.Module) -> None:
    """Replace every nn.Linear under ``model.model.layers`` (not lm_head) by `EmulatedLinear4bit`."""
    for module in list(model.model.layers.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(
                    module, name, EmulatedLinear4bit(child.in_features, child.out_features, torch.float16)
                )


def build_emulated(hf_config: dict[str, Any], setup: Any, regime: Any, reentrant: bool) -> Any:
    """The 2023 QLoRA model: fp16 load, 4-bit decoder linears, k-bit preparation, LoRA (fp32 adapters)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fitcheck.measure.build import Built, hf_config_object

    config = hf_config_object(hf_config)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float16, attn_implementation="eager")
    model.train()
    quantize_decoder(model)
    # peft prepare_model_for_kbit_training (utils/other.py @v0.5.0): freeze, fp16 -> fp32, input grads, ckpt
    for p in model.parameters():
        p.requires_grad_(False)
        if p.dtype in (torch.float16, torch.bfloat16):
            p.data = p.data.to(torch.float32)
    model.enable_input_require_grads()
    kwargs = {"use_reentrant": reentrant}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:  # transformers < 5.2
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    cfg = LoraConfig(
        r=setup.lora_rank,
        lora_alpha=setup.alpha,  # type: ignore[arg-type]
        lora_dropout=setup.lora_dropout,
        target_modules=TARGETS.split(","),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 still calls transformers' deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        peft_model = get_peft_model(model, cfg, autocast_adapter_dtype=True)
    return Built(model=peft_model, model_type="llama", notes=["emulated bitsandbytes 0.39 Linear4bit"])


def qlora_setup(batch: int, seq: int, **extra: Any) -> Any:
    from fitcheck.models import LlmSetup

    fields: dict[str, Any] = dict(
        method="qlora", kbit_path="peft", grad_ckpt=True, attn="eager", precision="fp16", trainer="hf",
        optimizer="adamw", lora_rank=16, lora_alpha=32, lora_dropout=0.05, lora_targets=TARGETS,
        double_quant=False, batch_size=batch, seq_len=seq,
    )  # fmt: skip
    fields.update(extra)
    return LlmSetup(**fields)


def trace(hf_config: dict[str, Any], setup: Any, reentrant: bool, holds: bool) -> Any:
    """`trace_step` with the emulated model in place of `build_model` (which refuses QLoRA)."""
    from fitcheck.measure import build
    from fitcheck.measure import trace as trace_mod

    EmulatedLinear4bit.holds_input = holds
    original = build.build_model
    build.build_model = lambda cfg, s, r: build_emulated(cfg, s, r, reentrant)  # type: ignore[assignment]
    try:
        return trace_mod.trace_step(hf_config, setup)
    finally:
        build.build_model = original  # type: ignore[assignment]


def step_events(
    hf_config: dict[str, Any], setup: Any, reentrant: bool, holds: bool, whole: bool = False
) -> tuple[Any, list[int], list[tuple[str, int, int]]]:
    """`trace` keeping its tracker: (the trace, bytes alive as the last step starts, that step's
    allocations and frees in order as bench/swift_loss.py ``Event`` tuples; a block still alive at the
    step's end is freed there, as the next step would find it). ``whole``: every allocation and free
    the tracker saw from its start instead (the model's build and both steps), nothing alive before."""
    from dataclasses import dataclass

    import fitcheck.measure.tracker as tracker_mod

    made: list[Any] = []

    @dataclass
    class Recording(tracker_mod.Tracker):
        def __post_init__(self) -> None:
            made.append(self)

    original = tracker_mod.Tracker
    tracker_mod.Tracker = Recording  # type: ignore[misc]
    try:
        measured = trace(hf_config, setup, reentrant, holds)
    finally:
        tracker_mod.Tracker = original  # type: ignore[misc]
    log = made[-1]
    last = [w for w in log.windows if w.step == max(x.step for x in log.windows)]
    start, end = last[0].start_seq, last[-1].end_seq
    if whole:
        start = min(r.alloc_seq for r in log.log) - 1
    base = [r.nbytes for r in log.log if r.alloc_seq <= start and (r.free_seq is None or r.free_seq > start)]
    timed: list[tuple[int, tuple[str, int, int]]] = []
    for rec in log.log:
        if start < rec.alloc_seq <= end:
            timed.append((rec.alloc_seq, ("a", rec.alloc_seq, rec.nbytes)))
            free = rec.free_seq if rec.free_seq is not None and rec.free_seq <= end else end + 1
            timed.append((free, ("f", rec.alloc_seq, rec.nbytes)))
    return measured, base, [e for _, e in sorted(timed)]


def replay(base: list[int], events: list[tuple[str, int, int]], steps: int) -> Any:
    """The persistent blocks, then ``steps`` repeats of one step's events, through swift_loss's allocator."""
    from swift_loss import Allocator

    alloc = Allocator()
    for nbytes in base:
        alloc.malloc(nbytes)
    for _ in range(steps):
        live: dict[int, Any] = {}
        for kind, rid, nbytes in events:
            if kind == "a":
                live[rid] = alloc.malloc(nbytes)
            else:
                alloc.free(live.pop(rid))
    return alloc


def _engine_estimate(hf_config: dict[str, Any], setup: Any) -> Any:
    """The engine's estimate for the same setup, on a CUDA backend."""
    from fitcheck.engine.estimate import estimate
    from fitcheck.models import ModelSpec
    from fitcheck.sources.hf_config import arch_from_hf_config

    spec = ModelSpec(
        id="small",
        name="small",
        source_kind="hf_config",
        arch=arch_from_hf_config(hf_config),
        hf_config=hf_config,
    )
    return estimate(spec, setup.model_copy(update={"backend": "cuda"}))


def engine_reserved(hf_config: dict[str, Any], setup: Any) -> tuple[int, int]:
    """The engine's (peak allocated, peak reserved) for the same setup."""
    est = _engine_estimate(hf_config, setup)
    return est.peak_allocated_bytes, est.peak_reserved_bytes


def engine(hf_config: dict[str, Any], setup: Any) -> dict[str, int]:
    """The engine's per-phase totals for the same setup (allocated bytes, no reserve)."""
    return {p.name: p.total_bytes for p in _engine_estimate(hf_config, setup).phases}


def phase_peaks(measured: Any) -> dict[str, int]:
    return {p.name: p.peak_bytes for p in measured.phases}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--bnb-fixed", action="store_true", help="bitsandbytes >= 0.43.2: the input is not kept")
    ap.add_argument("--non-reentrant", action="store_true", help="use_reentrant=False checkpointing")
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--top", action="store_true", help="print the largest tensors at each peak")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small", help="the traced LLaMA's shape")
    ap.add_argument("--replay", type=int, default=0, metavar="N", help="replay N steps through an allocator")
    ap.add_argument(
        "--whole-run", action="store_true", help="with --replay 1: replay the whole trace (build, both steps)"
    )
    args = ap.parse_args()
    if args.replay:
        _replays(args)
        return
    rows = []
    for layers, b, cfg, setup in _grid(args):
        m = trace(cfg, setup, reentrant=not args.non_reentrant, holds=not args.bnb_fixed)
        est = engine(cfg, setup)
        meas = phase_peaks(m)
        rows.append((layers, b, meas, est))
        for name in ("forward", "backward"):
            err = 100 * (est[name] - meas[name]) / meas[name]
            head = f"L={layers} b={b} {name:9s}"
            print(f"{head} measured {meas[name]:>12,} estimate {est[name]:>12,} {err:+.1f}%")
        if args.top:
            for p in m.phases:
                if p.name in ("forward", "backward"):
                    print(f"  {p.name} breakdown {p.breakdown}")
                    for t in p.top_tensors[:8]:
                        print(f"    {t.bytes:>10,} {t.dtype} {t.shape} {t.op} {t.module} {t.created_in}")
    _slopes(rows, args.seq)


def _grid(args: argparse.Namespace) -> Iterator[tuple[int, int, dict[str, Any], Any]]:
    """(layers, batch, config, setup) at every grid point the arguments name."""
    for layers in args.layers:
        for b in args.batch:
            cfg = {**SHAPES[args.shape], "num_hidden_layers": layers}
            if args.shape == "small":
                cfg["vocab_size"] = args.vocab
            setup = qlora_setup(
                b, args.seq, bnb_keeps_input=not args.bnb_fixed, ckpt_reentrant=not args.non_reentrant
            )
            yield layers, b, cfg, setup


def _replays(args: argparse.Namespace) -> None:
    """Traced peak allocated, replayed reserved and the engine's reserved, each grid point (decimal GB)."""
    gb = 1e9
    for layers, b, cfg, setup in _grid(args):
        _, base, events = step_events(
            cfg, setup, reentrant=not args.non_reentrant, holds=not args.bnb_fixed, whole=args.whole_run
        )
        alloc = replay(base, events, args.replay)
        est_alloc, est_reserved = engine_reserved(cfg, setup)
        print(
            f"L={layers} b={b} s={args.seq}: replayed allocated {alloc.peak_allocated / gb:.2f} reserved "
            f"{alloc.peak_reserved / gb:.2f} (+{(alloc.peak_reserved - alloc.peak_allocated) / gb:.2f}); "
            f"engine allocated {est_alloc / gb:.2f} reserved {est_reserved / gb:.2f} "
            f"(+{(est_reserved - est_alloc) / gb:.2f})"
        )


def _slopes(rows: list[tuple[int, int, dict[str, int], dict[str, int]]], seq: int) -> None:
    """Per token per layer: the double difference of the peaks over layers and batch (weights, adapters and
    optimizer states per layer cancel), and per token at the most layers."""
    by = {(r[0], r[1]): r for r in rows}
    layers = sorted({r[0] for r in rows})
    batches = sorted({r[1] for r in rows})
    if len(batches) < 2:
        return
    (b0, b1), (l0, l1) = (batches[0], batches[-1]), (layers[0], layers[-1])
    for name in ("forward", "backward"):
        for i, label in ((2, "measured"), (3, "estimate")):
            per_tok = (by[(l1, b1)][i][name] - by[(l1, b0)][i][name]) / ((b1 - b0) * seq)
            line = f"{name:9s} {label:8s} per token at L={l1}: {per_tok:9.1f} B"
            if l1 != l0:
                lo = (by[(l0, b1)][i][name] - by[(l0, b0)][i][name]) / ((b1 - b0) * seq)
                line += f"; per token per layer: {(per_tok - lo) / (l1 - l0):8.1f} B"
            print(line)


if __name__ == "__main__":
    sys.exit(main())
