"""Trace kohya-style training steps of real diffusers UNets and record the peaks for calibration.

Usage (regenerates every record; about 10 minutes on 2 CPU cores, no GPU, no weights downloaded):

    PYTHONPATH=src python bench/calibrate_diffusion.py [--only NAME_SUBSTRING] [--list]

Each record in ``tests/data/calibration/diffusion/`` holds the setup, the traced peaks per phase
(with the breakdown by category at each peak), the tool versions and this command;
``tests/test_diffusion_calibration.py`` compares ``estimate_diffusion`` with every record (the
denoiser's step: latents and text-encoder outputs cached, as kohya users train).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "calibration" / "diffusion"
COMMAND = "PYTHONPATH=src python bench/calibrate_diffusion.py"

#: (model, resolutions, setups): LoRA with and without checkpointing, kohya's SDXL full fine-tune
#: recipe (Adafactor, full_bf16, checkpointing), AMP full training, conv LoRA and batch 2.
LORA = {"method": "lora", "lora_rank": 16, "optimizer": "adamw"}
GRID: list[tuple[str, tuple[int, ...], tuple[str, ...], list[dict[str, Any]]]] = [
    (
        "sd15",
        (512, 768),
        ("sdpa", "eager"),
        [
            {**LORA, "grad_ckpt": False},
            {**LORA, "grad_ckpt": True},
            {"method": "full", "optimizer": "adafactor", "full_bf16": True, "grad_ckpt": True},
        ],
    ),
    (
        "sdxl",
        (1024, 768),
        ("sdpa", "eager"),
        [
            {**LORA, "grad_ckpt": False},
            {**LORA, "grad_ckpt": True},
            {"method": "full", "optimizer": "adafactor", "full_bf16": True, "grad_ckpt": True},
        ],
    ),
    ("sd15", (512,), ("sdpa",), [{"method": "full", "optimizer": "adamw", "grad_ckpt": False}]),
    ("sd15", (512,), ("sdpa",), [{**LORA, "lora_targets": "conv", "grad_ckpt": False, "batch_size": 2}]),
    ("sd21", (768,), ("eager",), [{**LORA, "grad_ckpt": True, "batch_size": 2}]),
    ("sd15", (512,), ("sdpa",), [{**LORA, "fp8_base": True, "grad_ckpt": ckpt} for ckpt in (False, True)]),
    ("sdxl", (1024,), ("sdpa",), [{**LORA, "grad_ckpt": True, "batch_size": 2, "optimizer": "lion"}]),
]


def record_name(model: str, setup: Any) -> str:
    """A stable file name from the setup's distinguishing fields."""
    bits = [model, f"{setup.resolution}px", setup.attn, setup.method]
    if setup.method == "lora":
        bits.append(f"r{setup.lora_rank}" + ("conv" if setup.lora_targets == "conv" else ""))
    bits += [setup.optimizer, "ckpt" if setup.grad_ckpt else "nockpt", f"b{setup.batch_size}"]
    if setup.full_bf16:
        bits.append("fullbf16")
    if setup.fp8_base:
        bits.append("fp8")
    return "_".join(bits)


def main() -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
    from fitcheck.diffusion.sources import spec_from_preset
    from fitcheck.measure.diffusion import trace_denoiser_step
    from fitcheck.models import DiffusionSetup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="regenerate records whose name contains this")
    ap.add_argument("--list", action="store_true", help="print the record names and exit")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    for model, resolutions, attns, setups in GRID:
        spec = spec_from_preset(model)
        only_unet = spec.model_copy(update={"parts": (spec.denoiser,)})
        for res in resolutions:
            for attn in attns:
                for kw in setups:
                    setup = DiffusionSetup(resolution=res, attn=attn, **kw)
                    name = record_name(model, setup)
                    if args.list:
                        print(name)
                        continue
                    if args.only not in name:
                        continue
                    step = trace_denoiser_step(only_unet, setup)
                    rec = {
                        "name": name,
                        "model": model,
                        "part": spec.denoiser.name,
                        "part_class": spec.denoiser.class_name,
                        "config_source": spec.denoiser.source,
                        "setup": setup.model_dump(mode="json"),
                        "traced": {
                            "peak_allocated_bytes": step.peak_allocated_bytes,
                            "peak_phase": step.peak_phase,
                            "phases": [
                                {"name": p.name, "peak_bytes": p.peak_bytes, "breakdown": p.breakdown}
                                for p in step.phases
                            ],
                            "trainable_params": step.trainable_params,
                            "total_params": step.total_params,
                        },
                        "device_semantics": step.device_semantics,
                        "tool_versions": {**step.tool_versions, **_extra_versions()},
                        "command": COMMAND,
                        "generated": datetime.date.today().isoformat(),
                        "wall_seconds": step.wall_seconds,
                    }
                    path = OUT / f"{name}.json"
                    path.write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
                    print(f"{name}: {step.peak_allocated_bytes / 2**30:.3f} GiB ({step.wall_seconds:.0f} s)")
    return 0


def _extra_versions() -> dict[str, str]:
    from importlib import metadata

    out = {}
    for dist in ("diffusers",):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out


if __name__ == "__main__":
    raise SystemExit(main())
