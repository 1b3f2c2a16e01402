"""Real peaks on a GPU for a grid of random-weight models -> tests/data/measured/<gpu>.yaml.

For a session that has a GPU lent (the `device` tool): it runs each setup with
`fitcheck.measure.real.real_step` (torch's own max_memory_allocated / max_memory_reserved per phase),
reads nvidia-smi's process total, and writes each record as soon as it finishes, with the driver, CUDA
and torch versions, so a run cut short still leaves data. No weights are downloaded: models are built
from their configs with random weights. Run it on the GPU machine:

    python bench/gpu_measure.py --out $OUT/measured.yaml --budget-s 200

then commit the file as tests/data/measured/<gpu>.yaml. Smoke test on a CPU: `--device cpu --quick`.
Nothing in the test suite needs a GPU; these records are used to fit and check the reserve and context
model (docs/accuracy.md), and they are never typed in by hand.
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

#: (preset, setup) pairs, smallest first so a time budget still covers several families.
GRID: list[tuple[str, dict[str, Any]]] = [
    ("smollm2-135m", dict(method="full", trainer="hf", batch_size=4, seq_len=1024)),
    ("smollm2-360m", dict(method="lora", trainer="hf", batch_size=4, seq_len=1024)),
    ("qwen2.5-0.5b", dict(method="full", trainer="hf", batch_size=2, seq_len=2048)),
    ("qwen2.5-0.5b", dict(method="lora", trainer="hf", batch_size=2, seq_len=2048, attn="eager")),
    ("llama-3.2-1b", dict(method="lora", trainer="hf", batch_size=2, seq_len=2048, grad_ckpt=True)),
    ("llama-3.2-1b", dict(method="full", trainer="torchtune", batch_size=1, seq_len=2048)),
    ("gemma-2-2b", dict(method="lora", trainer="hf", batch_size=1, seq_len=2048, attn="eager")),
    ("llama-3.2-3b", dict(method="lora", trainer="hf", batch_size=1, seq_len=4096, grad_ckpt=True)),
    ("qwen2.5-7b", dict(method="lora", trainer="hf", batch_size=1, seq_len=2048, grad_ckpt=True)),
    ("llama-3.1-8b", dict(method="lora", trainer="hf", batch_size=1, seq_len=2048, grad_ckpt=True)),
    ("llama-3.1-8b", dict(method="full", trainer="hf", batch_size=1, seq_len=1024, grad_ckpt=True)),
]


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
    args = ap.parse_args()
    grid = [(m, {**s, "seq_len": 128}) for m, s in GRID[:2]] if args.quick else GRID
    doc: dict[str, Any] = {"environment": environment(), "command": " ".join(sys.argv), "records": []}
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
            meas = real_step(spec.hf_config or {}, setup, device=args.device, steps=3)
            est = estimate(spec, setup)
            rec["measured"] = meas.model_dump(mode="json")
            rec["nvidia_smi_used_mib"] = smi_used_mib()
            keys = ("peak_allocated_bytes", "peak_reserved_bytes", "device_bytes", "peak_phase")
            rec["estimate"] = {k: getattr(est, k) for k in keys}
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
