"""Where the caching allocator cut its segments in a real step -> YAML (a GPU session's investigation aid).

Runs `bench/gpu_measure.py`'s grid entries with torch's allocator history on
(``torch.cuda.memory._record_memory_history``), then lists every ``segment_alloc`` (a cudaMalloc) and
``segment_free`` with its size and address (with ``--big-mib`` every tensor of at least that size too), the
phase and step it fell in, and the innermost frames of the fitcheck /
transformers / peft / torch code that asked for it, plus the reserved and allocated bytes at each cut.
It reads the history in-process (``torch.cuda.memory._snapshot()``, a dict) and writes plain YAML: no
pickle is written or read. Run it on the GPU machine:

    python bench/gpu_segments.py --grid holdout --only 3,8 --out $OUT/segments.yaml
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

KEEP = ("fitcheck", "transformers", "peft", "torch/optim", "torch/autograd", "torch/utils/checkpoint",
        "bitsandbytes")  # fmt: skip


def _frames(event: dict[str, Any]) -> list[str]:
    out = []
    for f in event.get("frames") or []:
        name = str(f.get("filename", ""))
        if any(k in name for k in KEEP):
            short = name.split("site-packages/")[-1].split("src/")[-1]
            out.append(f"{short}:{f.get('line')} {f.get('name')}")
        if len(out) >= 4:
            break
    return out


def segments(model: str, kw: dict[str, Any], big_mib: float = 0.0) -> dict[str, Any]:
    import torch

    from fitcheck.measure.real import real_step
    from fitcheck.models import LlmSetup
    from fitcheck.sources.resolve import spec_from_preset

    spec = spec_from_preset(model)
    setup = LlmSetup(**{**kw, "backend": "cuda"})
    torch.cuda.empty_cache()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    meas = real_step(spec.hf_config or {}, setup, device="cuda", steps=3)
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    trace = snap["device_traces"][0]
    reserved = allocated = 0
    cuts = []
    for i, ev in enumerate(trace):
        act, size = ev["action"], int(ev["size"])
        if act == "segment_alloc":
            reserved += size
        elif act == "segment_free":
            reserved -= size
        elif act == "alloc":
            allocated += size
        elif act == "free_completed":
            allocated -= size
        big = big_mib and act in ("alloc", "free_completed") and size >= big_mib * 2**20
        if act in ("segment_alloc", "segment_free") or big:
            cuts.append({"i": i, "action": act, "mib": round(size / 2**20, 1), "addr": int(ev["addr"]),
                         "reserved_gib": round(reserved / 2**30, 3),
                         "allocated_gib": round(allocated / 2**30, 3), "frames": _frames(ev)})  # fmt: skip
    return {
        "model": model,
        "setup": kw,
        "events": len(trace),
        "peak_reserved_bytes": meas.peak_reserved_bytes,
        "peak_allocated_bytes": meas.peak_allocated_bytes,
        "segment_events": cuts,
    }


def main() -> None:
    import gpu_measure
    import yaml

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--grid", choices=sorted(gpu_measure.GRIDS), default="holdout")
    ap.add_argument("--only", required=True, help="comma-separated grid indices")
    ap.add_argument("--big-mib", type=float, default=0.0, help="also list tensors of at least this size")
    args = ap.parse_args()
    grid = gpu_measure.GRIDS[args.grid]
    docs = []
    for i in args.only.split(","):
        model, kw = grid[int(i)]
        try:
            docs.append(segments(model, kw, args.big_mib))
        except Exception as exc:  # record it and go on
            docs.append({"model": model, "setup": kw, "error": f"{exc.__class__.__name__}: {exc}"[:300]})
        Path(args.out).write_text(yaml.safe_dump(docs, sort_keys=False))
        print(model, "error" in docs[-1], flush=True)


if __name__ == "__main__":
    main()
