"""Real peaks on a GPU for a grid of random-weight models -> tests/data/measured/<gpu>.yaml.

For a session that has a GPU lent (the `device` tool): it runs each setup with
`fitcheck.measure.real.real_step` (torch's own max_memory_allocated / max_memory_reserved per phase;
QLoRA through bitsandbytes NF4 layers built on the device), polls NVML's used memory during each run,
probes what the process holds outside the caching allocator, and writes each record as soon as it
finishes, with the driver, CUDA and torch versions, so a run cut short still leaves data. No weights are
downloaded: models are built from their configs with random weights. Run it on the GPU machine:

    python bench/gpu_measure.py --out $OUT/measured.yaml --budget-s 200              # the fit grid
    python bench/gpu_measure.py --grid holdout --out $OUT/holdout.yaml --budget-s 200

Session 20 ran it on an H200 whose image has torch, transformers and peft but neither pydantic nor
bitsandbytes: those (and the transformers / peft releases the tracers are checked on) travelled as wheels in
a git-excluded `.whl/` folder named in the run's `carry` (/work/.library/device/README.md). Commit each file
as tests/data/measured/<gpu>[-holdout].yaml, name its card in bench/measured.py `CARDS`, and run
`python bench/measured.py` (docs/accuracy.md, tests/test_measured_gpu.py). Smoke test on a CPU:
`--device cpu --quick`. Nothing in the test suite needs a GPU; these records are never typed in by hand.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def _hf(method: str, batch: int, seq: int, **kw: Any) -> dict[str, Any]:
    """One setup of the HF Trainer's regime (the grids' rows): method, micro-batch, sequence length."""
    return {"method": method, "trainer": "hf", "batch_size": batch, "seq_len": seq, **kw}


CKPT: dict[str, Any] = {"grad_ckpt": True}
PEFT_PREP: dict[str, Any] = {"kbit_path": "peft", "grad_ckpt": True}

#: (preset, setup) pairs, smallest first so a time budget still covers several families.
GRID: list[tuple[str, dict[str, Any]]] = [
    ("smollm2-135m", _hf("full", 4, 1024)),
    ("smollm2-360m", _hf("lora", 4, 1024)),
    ("qwen2.5-0.5b", _hf("full", 2, 2048)),
    ("qwen2.5-0.5b", _hf("lora", 2, 2048, attn="eager")),
    ("llama-3.2-1b", _hf("lora", 2, 2048, **CKPT)),
    ("llama-3.2-1b", {**_hf("full", 1, 2048), "trainer": "torchtune"}),
    ("gemma-2-2b", _hf("lora", 1, 2048, attn="eager")),
    ("llama-3.2-3b", _hf("lora", 1, 4096, **CKPT)),
    ("qwen2.5-7b", _hf("lora", 1, 2048, **CKPT)),
    ("llama-3.1-8b", _hf("lora", 1, 2048, **CKPT)),
    ("llama-3.1-8b", _hf("full", 1, 1024, **CKPT)),
    # layer blocks beside the loss (docs/methodology.md): checkpointed, long rows, logits wider than a layer
    ("llama-3.1-8b", _hf("lora", 4, 4096, **CKPT)),
    # QLoRA (bitsandbytes from the wheel the run carries): ULT's Phi-3 shape, Vertex's OpenLLaMA-7B shape
    # on today's stack, an 8B at a common setting with and without peft's k-bit preparation
    ("phi-3-mini", _hf("qlora", 2, 8192, lora_rank=8, **PEFT_PREP)),
    ("llama-2-7b", _hf("qlora", 16, 512, double_quant=False, attn="eager", **PEFT_PREP)),
    ("llama-3.1-8b", _hf("qlora", 1, 2048, **PEFT_PREP)),
    ("llama-3.1-8b", _hf("qlora", 4, 2048, kbit_path="trl", **CKPT)),
    ("llama-2-13b", _hf("qlora", 2, 8192, lora_rank=8, **PEFT_PREP)),
]

#: Posed after GRID's first run had fitted the reserve line (docs/methodology.md, "Real-GPU runs"):
#: other models, batches and lengths, to check that line out of sample (`--grid holdout`).
HOLDOUT: list[tuple[str, dict[str, Any]]] = [
    ("qwen2.5-1.5b", _hf("lora", 4, 2048, **CKPT)),
    ("qwen2.5-0.5b", _hf("full", 8, 1024, **CKPT)),
    ("qwen2.5-3b", _hf("lora", 8, 1024)),
    ("llama-3.2-3b", _hf("full", 2, 2048, **CKPT)),
    ("gemma-2-2b", _hf("qlora", 4, 2048, attn="eager", **PEFT_PREP)),
    ("mistral-7b-v0.1", _hf("qlora", 2, 4096, **PEFT_PREP)),
    ("phi-3-mini", _hf("lora", 2, 8192, lora_rank=8, **CKPT)),
    ("llama-2-7b", _hf("qlora", 32, 512, double_quant=False, attn="eager", **PEFT_PREP)),
    ("gemma-2-9b", _hf("qlora", 1, 4096, kbit_path="trl", attn="eager", **CKPT)),
    ("llama-3.1-8b", _hf("lora", 2, 8192, lora_rank=8, **CKPT)),
]
#: Full fine-tuning, posed in session 20 after the holdout left its full-FT row 15% under the reserved
#: figure (the gradients of step 1 fill the loss's cached blocks; bench/gpu_segments.py): sizes, lengths,
#: with and without checkpointing, to see how that fragmentation scales before modelling it.
FULL: list[tuple[str, dict[str, Any]]] = [
    ("llama-3.2-1b", _hf("full", 4, 2048, **CKPT)),
    ("qwen2.5-1.5b", _hf("full", 2, 2048, **CKPT)),
    ("gemma-2-2b", _hf("full", 1, 2048, attn="eager", **CKPT)),
    ("llama-3.2-3b", _hf("full", 1, 1024)),
    ("llama-3.2-3b", _hf("full", 4, 2048, **CKPT)),
    ("qwen2.5-3b", _hf("full", 1, 4096, **CKPT)),
    ("smollm2-360m", _hf("full", 8, 2048, **CKPT)),
    ("mistral-7b-v0.1", _hf("full", 1, 2048, **CKPT)),
]
#: Posed with engine/overhead.py `regrown_loss_blocks` (fitted on FULL and the full rows above), before it
#: runs: other sizes, lengths and batches of full fine-tuning, to check that rule out of sample.
FULL_HOLDOUT: list[tuple[str, dict[str, Any]]] = [
    ("qwen2.5-1.5b", _hf("full", 4, 1024, **CKPT)),
    ("llama-3.2-1b", _hf("full", 2, 4096, **CKPT)),
    ("gemma-2-2b", _hf("full", 2, 1024, attn="eager", **CKPT)),
    ("qwen2.5-0.5b", _hf("full", 4, 2048)),
    ("smollm2-1.7b", _hf("full", 4, 2048, **CKPT)),
    ("llama-3.2-3b", _hf("full", 1, 4096, **CKPT)),
    ("qwen2.5-7b", _hf("full", 1, 1024, **CKPT)),
    ("qwen2.5-3b", _hf("full", 2, 2048, **CKPT)),
]
#: Posed after `regrown_loss_blocks` took its output-logits condition (after FULL_HOLDOUT ran), before it
#: runs: setups on both sides of the condition (the gradients just above or below the output logits),
#: full fine-tuning and LoRA at high rank and short length, where the adapters' gradients cross it.
BOUNDARY: list[tuple[str, dict[str, Any]]] = [
    ("smollm2-135m", _hf("full", 8, 1024)),
    ("qwen2.5-0.5b", _hf("full", 1, 1024)),
    ("smollm2-360m", _hf("full", 2, 1024)),
    ("llama-3.2-1b", _hf("full", 8, 1024, **CKPT)),
    ("qwen2.5-1.5b", _hf("full", 8, 2048, **CKPT)),
    ("llama-3.2-1b", _hf("lora", 1, 512, lora_rank=128, **CKPT)),
    ("qwen2.5-3b", _hf("lora", 1, 256, lora_rank=64, **CKPT)),
    ("gemma-2-2b", _hf("full", 4, 2048, attn="eager", **CKPT)),
]
#: Posed in session 21 with `regrown_loss_blocks`' layer-tensor condition (a decoder layer's largest gradient
#: of at least 10 MiB, engine/states.py `largest_layer_grad_bytes`), before it runs: rows on both sides of
#: 10 MiB, several where the earlier output-logits condition and this one disagree (fp32 weights double a
#: layer's gradient; Gemma 3 1B's 262,144-wide logits outgrow its gradients), and SmolLM2 1.7B again (the
#: one earlier row the rule over-counts). The layer gradient and the rule's prediction, per row:
#: SmolLM2 360M fp32 9.4 MiB none; Qwen3 0.6B 6.0 MiB none; Qwen2.5 0.5B fp32 16.6 MiB, GPT-2 medium fp32
#: 16.0 MiB, TinyLlama 1.1B 22.0 MiB, Gemma 3 1B 15.2 MiB, Qwen3 1.7B 24.0 MiB, SmolLM2 1.7B 32.0 MiB:
#: regrown (1.1-3.2 GiB each, the logits or the gradients, whichever is smaller).
THRESHOLD: list[tuple[str, dict[str, Any]]] = [
    ("smollm2-360m", _hf("full", 2, 1024, precision="fp32")),
    ("qwen3-0.6b", _hf("full", 2, 1024)),
    ("qwen2.5-0.5b", _hf("full", 2, 1024, precision="fp32")),
    ("qwen2.5-0.5b", _hf("full", 4, 2048, precision="fp32", **CKPT)),
    ("gpt2-medium", _hf("full", 4, 1024, precision="fp32")),
    ("tinyllama-1.1b", _hf("full", 4, 2048, **CKPT)),
    ("gemma-3-1b", _hf("full", 2, 2048, **CKPT)),
    ("qwen3-1.7b", _hf("full", 4, 1024, **CKPT)),
    ("smollm2-1.7b", _hf("full", 2, 1024, **CKPT)),
]
#: Posed in session 21 with engine/activations.py `sdpa_math` (found on THRESHOLD's fp32 rows), before it
#: runs: where the rule says SDPA takes its math kernel (fp32 LoRA on a fp32 base, Qwen3's grouped K/V, a
#: checkpointed run where only the recomputed layer holds the scores, a 7B LoRA, Gemma 3 1B's one-kv-head
#: attention) and a control where it says not (fp16: the flash kernel). Gemma 3 1B at 2,048 tokens is past
#: its 512-token sliding window: transformers gives its sliding layers a mask (``repeat_kv``, the
#: memory-efficient kernel), so the rule, which counts the scores in every layer, expects to over-count
#: there (every sixth layer is global); the row says by how much.
MATH: list[tuple[str, dict[str, Any]]] = [
    ("qwen2.5-0.5b", _hf("lora", 2, 1024, precision="fp32")),
    ("qwen3-0.6b", _hf("full", 2, 1024, precision="fp32")),
    ("llama-3.2-1b", _hf("full", 1, 2048, precision="fp32", **CKPT)),
    ("qwen2.5-0.5b", _hf("full", 2, 1024, precision="fp16")),
    ("gemma-3-1b", _hf("full", 2, 2048, precision="fp32")),
    ("mistral-7b-v0.1", _hf("lora", 1, 2048, precision="fp32")),
]
#: Posed in session 21, before it runs, once `measure` builds peft's modules_to_save (``--train-modules``;
#: checked on a CPU first: within 0.2% of the engine on TinyLlama and SmolLM2 135M): LoRA / QLoRA with the
#: embedding and the output layer trained in full, untied and tied, where `regrown_loss_blocks` no longer
#: applies (the copies are not a decoder layer's) and the published Qwen LoRA (emb) rows moved from 4-10%
#: over to -6..+6% when it stopped.
MODULES: list[tuple[str, dict[str, Any]]] = [
    ("tinyllama-1.1b", _hf("lora", 4, 2048, train_modules="embed_tokens,lm_head", **CKPT)),
    ("qwen2.5-1.5b", _hf("lora", 4, 1024, train_modules="embed_tokens,lm_head", **CKPT)),
    ("qwen2.5-7b", _hf("lora", 1, 1024, train_modules="embed_tokens,lm_head", **CKPT)),
    ("llama-3.1-8b", _hf("lora", 1, 2048, train_modules="embed_tokens,lm_head", **CKPT)),
    ("mistral-7b-v0.1", _hf("qlora", 2, 2048, train_modules="lm_head", **PEFT_PREP)),
]
#: Posed at the end of session 21 with the engine and band as they then stood, before it runs: other models
#: and mixes, to hold the session's rules (the regrown-blocks conditions, SDPA's math kernel, trained
#: module copies) and its narrower band (+9%) out of sample.
HOLDOUT_21: list[tuple[str, dict[str, Any]]] = [
    ("qwen3-4b", _hf("lora", 2, 4096, **CKPT)),
    ("phi-3.5-mini", _hf("qlora", 4, 2048, **PEFT_PREP)),
    ("llama-3.2-3b", _hf("lora", 2, 2048, train_modules="embed_tokens,lm_head", **CKPT)),
    ("qwen3-8b", _hf("qlora", 1, 4096, **PEFT_PREP)),
    ("llama-3.2-1b", _hf("lora", 2, 2048, precision="fp32")),
    ("gemma-3-1b", _hf("lora", 4, 2048, **CKPT)),
    ("qwen2.5-3b", _hf("full", 2, 1024, **CKPT)),
    ("mistral-nemo-12b", _hf("qlora", 1, 4096, **PEFT_PREP)),
]
GRIDS = {
    "fit": GRID,
    "holdout": HOLDOUT,
    "full": FULL,
    "full-holdout": FULL_HOLDOUT,
    "boundary": BOUNDARY,
    "threshold": THRESHOLD,
    "math": MATH,
    "modules": MODULES,
    "holdout-21": HOLDOUT_21,
}


def context_probe() -> list[dict[str, Any]]:
    """NVML's used memory and torch's reserved bytes after each library first touches the GPU: what the
    process holds outside the caching allocator (the engine's context line), step by step."""
    import torch

    steps: list[dict[str, Any]] = []

    def mark(what: str) -> None:
        torch.cuda.synchronize()
        steps.append({"after": what, "nvidia_smi_used_mib": smi_used_mib(),
                      "torch_reserved_bytes": int(torch.cuda.memory_reserved())})  # fmt: skip

    torch.cuda.init()
    torch.empty(1, device="cuda")
    mark("torch.cuda.init and a first tensor")
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    mark("a bf16 matmul (cuBLAS / cuBLASLt)")
    q = torch.randn(2, 32, 2048, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().backward()
    mark("SDPA forward and backward (flash)")
    try:
        import bitsandbytes as bnb

        lin = bnb.nn.Linear4bit(4096, 4096, compute_dtype=torch.bfloat16, quant_type="nf4").cuda()
        lin(a[:16]).sum().item()
        mark("a bitsandbytes NF4 matmul")
        del lin
    except ImportError:
        pass
    del a, q
    torch.cuda.empty_cache()
    mark("tensors freed, cache emptied")
    return steps


class SmiPeak:
    """The GPU's used memory as NVML reports it (nvidia-smi's figure), polled every 5 ms in a thread:
    its peak over a setup is what a source that read nvidia-smi during the run would print."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle: Any = pynvml.nvmlDeviceGetHandleByIndex(0)
            self._read = lambda: int(pynvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:  # no NVML (a CPU smoke test): no reading
            self._read = None

    def __enter__(self) -> SmiPeak:
        import threading

        if self._read is not None:
            self._stop.clear()
            self.peak = self._read()
            self._thread = threading.Thread(target=self._poll, daemon=True)
            self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, self._read())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def value(self) -> int | None:
        return self.peak if self._read is not None else None


def smi_used_mib() -> int | None:
    """nvidia-smi's used memory of GPU 0 (what the whole process holds, context included)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return int(out.strip().splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {"torch": str(torch.__version__), "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["total_bytes"] = torch.cuda.get_device_properties(0).total_memory
    try:
        env["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        env["driver"] = None
    return env


def main() -> None:
    import yaml

    from fitcheck.engine.estimate import estimate
    from fitcheck.measure.real import real_step
    from fitcheck.models import LlmSetup
    from fitcheck.sources.resolve import spec_from_preset

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--budget-s", type=float, default=200.0, help="stop starting new setups after this")
    ap.add_argument("--quick", action="store_true", help="first two setups, short sequences (smoke test)")
    ap.add_argument("--only", default="", help="comma-separated grid indices to run (default: all)")
    ap.add_argument("--grid", choices=sorted(GRIDS), default="fit")
    args = ap.parse_args()
    chosen = GRIDS[args.grid]
    grid = [(m, {**s, "seq_len": 128}) for m, s in chosen[:2]] if args.quick else chosen
    if args.only:
        grid = [chosen[int(i)] for i in args.only.split(",")]
    doc: dict[str, Any] = {"environment": environment(), "command": " ".join(sys.argv), "records": []}
    doc["environment"]["nvidia_smi_used_mib_before"] = smi_used_mib()
    if args.device == "cuda":
        doc["context_probe"] = context_probe()
    out = Path(args.out)
    started = time.perf_counter()
    for model, kw in grid:
        if time.perf_counter() - started > args.budget_s:
            doc["stopped"] = f"time budget of {args.budget_s:.0f} s reached"
            break
        spec = spec_from_preset(model)
        setup = LlmSetup(**{**kw, "backend": "cuda" if args.device == "cuda" else "cpu"})
        rec: dict[str, Any] = {"model": model, "setup": setup.model_dump(mode="json")}
        try:
            with SmiPeak() as smi:
                meas = real_step(spec.hf_config or {}, setup, device=args.device, steps=3)
            est = estimate(spec, setup)
            rec["measured"] = meas.model_dump(mode="json")
            rec["nvml_used_peak_bytes"] = smi.value()
            rec["nvidia_smi_used_mib_after"] = smi_used_mib()
            if args.device == "cuda":
                import torch

                rec["torch_reserved_after_bytes"] = int(torch.cuda.memory_reserved())
                rec["torch_allocated_after_bytes"] = int(torch.cuda.memory_allocated())
            keys = ("peak_allocated_bytes", "peak_reserved_bytes", "device_bytes", "peak_phase")
            rec["estimate"] = {k: getattr(est, k) for k in keys}
            rec["estimate"]["band"] = est.band.model_dump(mode="json") if est.band else None
        except Exception as exc:  # record the failure (OOM included) and go on
            rec["error"] = f"{exc.__class__.__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        doc["records"].append(rec)
        out.write_text(yaml.safe_dump(doc, sort_keys=False))
        print(f"{model:16s} {rec.get('error', 'ok')}", flush=True)
        if args.device == "cuda":
            import torch

            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
