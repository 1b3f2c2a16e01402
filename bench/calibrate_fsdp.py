"""Generate tests/data/calibration/fsdp/records.yaml: FSDP2 ranks traced with PyTorch's FSDPMemTracker.

Each record is one setup (world size 2-8, full or LoRA, with or without checkpointing) of a small
random-weight Llama-shaped model, traced as rank 0 of a fake process group
(`fitcheck.measure.fsdp_trace.trace_fsdp`): the exact ``hf_config``, the setup, the traced
forward+backward peak of the second step with its breakdown by the tracker's categories, tool
versions, and the command that regenerates it. Run by hand (needs the torch extra); about 10-30 s per
record on 2 cores:

    PYTHONPATH=src python bench/calibrate_fsdp.py            # all records
    PYTHONPATH=src python bench/calibrate_fsdp.py --report   # engine vs records
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "calibration" / "fsdp" / "records.yaml"

#: Two shrunken Llama shapes: a 32k vocabulary (Llama 2) and a 128k one (Llama 3), so the root unit
#: (embeddings + lm_head) weighs as it does in the real families.
CONFIGS: dict[str, dict[str, Any]] = {
    "llama2-small": {
        "model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
        "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
        "tie_word_embeddings": False, "max_position_embeddings": 4096,
    },
    "llama3-small": {
        "model_type": "llama", "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 128256,
        "tie_word_embeddings": False, "rope_theta": 500000.0, "max_position_embeddings": 8192,
    },
}  # fmt: skip
#: (id, config, world size, method, checkpointing, micro-batch, sequence)
GRID: list[tuple[str, str, int, str, bool, int, int]] = [
    ("fsdp-01", "llama2-small", 2, "full", False, 2, 1024),
    ("fsdp-02", "llama2-small", 4, "full", False, 2, 1024),
    ("fsdp-03", "llama2-small", 8, "full", False, 2, 1024),
    ("fsdp-04", "llama2-small", 2, "lora", False, 2, 1024),
    ("fsdp-05", "llama2-small", 4, "lora", False, 2, 1024),
    ("fsdp-06", "llama2-small", 8, "lora", False, 2, 1024),
    ("fsdp-07", "llama2-small", 4, "full", True, 4, 1024),
    ("fsdp-08", "llama2-small", 8, "lora", True, 4, 1024),
    ("fsdp-09", "llama3-small", 2, "full", False, 1, 1024),
    ("fsdp-10", "llama3-small", 8, "full", False, 1, 1024),
    ("fsdp-11", "llama3-small", 4, "lora", False, 1, 1024),
    ("fsdp-12", "llama3-small", 8, "lora", True, 2, 1024),
    ("fsdp-13", "llama3-small", 2, "lora", True, 2, 2048),
    ("fsdp-14", "llama2-small", 6, "full", True, 2, 2048),
    ("fsdp-15", "llama3-small", 2, "full", False, 1, 1024),
    ("fsdp-16", "llama3-small", 8, "full", True, 2, 1024),
    ("fsdp-17", "llama3-small", 4, "lora", False, 1, 1024),
    ("fsdp-18", "llama3-small", 8, "lora", True, 2, 1024),
]
#: Records traced with the embedding and the lm_head as their own FSDP2 units (--fsdp-embedding-units).
EMBEDDING_UNITS = frozenset({"fsdp-15", "fsdp-16", "fsdp-17", "fsdp-18"})


def setup_fields(world: int, method: str, ckpt: bool, batch: int, seq: int) -> dict[str, Any]:
    """The LlmSetup of a record: FSDP2 FULL_SHARD through accelerate (the hf regime)."""
    return {
        "method": method,
        "batch_size": batch,
        "seq_len": seq,
        "grad_ckpt": ckpt,
        "trainer": "hf",
        "gpus": world,
        "strategy": "fsdp",
    }


def versions() -> dict[str, str]:
    import peft
    import torch
    import transformers

    return {
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        "peft": str(peft.__version__),
    }


def generate(only: str | None) -> None:
    from fitcheck.measure.fsdp_trace import trace_fsdp
    from fitcheck.models import LlmSetup

    old = yaml.safe_load(OUT.read_text())["records"] if OUT.exists() else []
    by_id = {r["id"]: r for r in old}
    for rid, cfg_id, world, method, ckpt, batch, seq in GRID:
        if only and rid != only:
            continue
        fields = setup_fields(world, method, ckpt, batch, seq)
        if rid in EMBEDDING_UNITS:
            fields["fsdp_embedding_units"] = True
        t = trace_fsdp(CONFIGS[cfg_id], LlmSetup(**fields), world)
        by_id[rid] = {
            "id": rid,
            "config": cfg_id,
            "hf_config": CONFIGS[cfg_id],
            "setup": fields,
            "world_size": world,
            "traced_peak_bytes": t.peak_bytes,
            "traced_phase_peaks_bytes": t.phases,
            "breakdown_bytes": t.breakdown,
            "wall_seconds": round(t.wall_seconds, 1),
            "versions": versions(),
            "command": f"PYTHONPATH=src python bench/calibrate_fsdp.py --only {rid}",
        }
        print(f"{rid}: {t.peak_bytes / 2**20:.1f} MiB ({t.wall_seconds:.0f} s)", file=sys.stderr)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    head = (
        "# FSDP2 calibration records: rank 0 of N traced with torch's FSDPMemTracker under FakeTensorMode\n"
        "# and a fake process group (fitcheck.measure.fsdp_trace; docs/distributed.md#calibration).\n"
        "# Generated by bench/calibrate_fsdp.py; regenerate with:\n"
        "#   PYTHONPATH=src python bench/calibrate_fsdp.py\n"
    )
    recs = [by_id[g[0]] for g in GRID if g[0] in by_id]
    OUT.write_text(head + yaml.safe_dump({"records": recs}, sort_keys=False, width=110))


def report() -> None:
    from fitcheck.measure.fsdp_compare import compare

    for rec in yaml.safe_load(OUT.read_text())["records"]:
        est, traced = compare(rec)
        err = 100 * (est / traced - 1)
        print(f"{rec['id']}: engine {est / 2**20:9.1f} MiB  traced {traced / 2**20:9.1f} MiB  {err:+.1f}%")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--only")
    ap.add_argument("--report", action="store_true")
    a = ap.parse_args()
    report() if a.report else generate(a.only)
