"""Trace kohya sd-scripts' own FLUX.1 and SD 3.5 models and record the peaks.

The DiT estimates follow sd-scripts' layout (BFL's FLUX code: fused qkv, modulation linears, 19
double + 38 single blocks; SAI's MMDiT: fused qkv, MMDiT-X attn2), so their reference is sd-scripts'
code, not diffusers'. This script imports ``library/flux_models.py`` and ``library/sd3_models.py``
from an sd-scripts checkout (with the three small modules they import; ``torchvision``, ``cv2`` and
``einops`` are replaced by shims, because the model code needs none of them beyond a few
``rearrange`` patterns), builds the model on the meta device, wraps every ``Linear`` of
``DoubleStreamBlock``/``SingleStreamBlock`` (``networks/lora_flux.py``) or ``SingleDiTBlock``
(``networks/lora_sd3.py``) like kohya's LoRAModule, and traces two training steps on fake tensors
exactly as ``bench/calibrate_diffusion.py`` does for UNets.

Usage (about half a minute per record on 2 CPU cores):

    PYTHONPATH=src python bench/calibrate_kohya_dit.py --sd-scripts /path/to/sd-scripts

Records are written beside the UNet ones (``tests/data/calibration/diffusion/kohya_*.json``) with
the sd-scripts commit given by ``--commit`` (default: the commit of tests/data/kohya_args.tsv).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "calibration" / "diffusion"
COMMAND = "PYTHONPATH=src python bench/calibrate_kohya_dit.py --sd-scripts PATH"
SD_SCRIPTS_COMMIT = "48d368fa557731ad0488c07304dfeba8c07910eb"
LORA = {"method": "lora", "lora_rank": 16, "optimizer": "adamw"}
GRID: list[tuple[str, dict[str, Any]]] = [
    ("flux.1-dev", {**LORA, "resolution": 512, "grad_ckpt": True}),
    ("flux.1-dev", {**LORA, "resolution": 1024, "grad_ckpt": True}),
    ("flux.1-schnell", {**LORA, "resolution": 512, "grad_ckpt": False}),
    ("sd35-medium", {**LORA, "resolution": 1024, "grad_ckpt": True}),
    ("sd35-medium", {**LORA, "resolution": 512, "grad_ckpt": False}),
    ("sd35-large", {**LORA, "resolution": 1024, "grad_ckpt": True}),
]


def _shims() -> None:
    """Stand-ins for imports flux_models.py's siblings make but the model never uses at runtime."""
    import diffusers  # noqa: F401  (imported first: its availability checks must not see the shims)
    import torch
    from transformers import CLIPTokenizer, T5TokenizerFast  # noqa: F401  (same reason: sd3_models)

    class _Stub:
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

    tv = types.ModuleType("torchvision")
    tr = types.ModuleType("torchvision.transforms")
    for name in (
        "Compose",
        "ToTensor",
        "Normalize",
        "Resize",
        "CenterCrop",
        "InterpolationMode",
        "functional",
    ):
        setattr(tr, name, _Stub)
    tv.transforms = tr  # type: ignore[attr-defined]
    sys.modules.setdefault("torchvision", tv)
    sys.modules.setdefault("torchvision.transforms", tr)
    sys.modules.setdefault("cv2", types.ModuleType("cv2"))

    def rearrange(x: torch.Tensor, pattern: str, **sizes: int) -> torch.Tensor:
        if pattern == "B L (K H D) -> K B H L D":
            b, n, _ = x.shape
            return x.view(b, n, sizes["K"], sizes["H"], -1).permute(2, 0, 3, 1, 4)
        if pattern == "B H L D -> B L (H D)":
            b, h, n, d = x.shape
            return x.permute(0, 2, 1, 3).reshape(b, n, h * d)
        if pattern == "b n d (i j) -> b n d i j":
            return x.view(*x.shape[:-1], sizes["i"], sizes["j"])
        raise NotImplementedError(pattern)

    ein = types.ModuleType("einops")
    ein.rearrange = rearrange  # type: ignore[attr-defined]
    sys.modules.setdefault("einops", ein)


def build_flux(sd_scripts: Path, guidance: bool) -> Any:
    sys.path.insert(0, str(sd_scripts))
    _shims()
    import torch
    from library import flux_models  # type: ignore[import-not-found]

    params = flux_models.FluxParams(
        in_channels=64, vec_in_dim=768, context_in_dim=4096, hidden_size=3072, mlp_ratio=4.0, num_heads=24,
        depth=19, depth_single_blocks=38, axes_dim=[16, 56, 56], theta=10_000, qkv_bias=True,
        guidance_embed=guidance,
    )  # fmt: skip
    with torch.device("meta"):
        return flux_models.Flux(params)


def build_mmdit(sd_scripts: Path, cfg: dict[str, Any]) -> Any:
    sys.path.insert(0, str(sd_scripts))
    _shims()
    import torch
    from library import sd3_models  # type: ignore[import-not-found]

    depth = int(cfg["num_attention_heads"])  # SAI's MMDiT: hidden size = 64 x depth
    pos = int(cfg["pos_embed_max_size"])
    params = sd3_models.SD3Params(
        patch_size=2, depth=depth, num_patches=pos * pos, pos_embed_max_size=pos, adm_in_channels=2048,
        qk_norm="rms", x_block_self_attn_layers=list(cfg.get("dual_attention_layers") or []),
        context_embedder_in_features=4096, context_embedder_out_features=64 * depth,
        model_type="3-5-medium" if cfg.get("dual_attention_layers") else "3-5-large",
    )  # fmt: skip
    with torch.device("meta"):
        return sd3_models.create_sd3_mmdit(params, attn_mode="torch")


def trace(sd_scripts: Path, model_id: str, setup: Any) -> Any:
    if model_id.startswith("sd35"):
        return trace_sd3(sd_scripts, model_id, setup)
    return trace_flux(sd_scripts, model_id, setup)


def trace_sd3(sd_scripts: Path, model_id: str, setup: Any) -> Any:
    import torch

    from fitcheck.diffusion import regime as rg
    from fitcheck.diffusion.sources import spec_from_preset
    from fitcheck.diffusion.step import LORA_CLASSES
    from fitcheck.measure.diffusion import attach_kohya_lora, trace_module
    from fitcheck.measure.diffusion import torch_dtype as _dtype

    spec = spec_from_preset(model_id)
    spec = spec.model_copy(update={"parts": (spec.denoiser,)})
    rg.check(spec, setup)
    plan = next(p for p in rg.plan_parts(spec, setup) if p.part.role == "denoiser")
    regime = rg.regime(spec, setup)
    started = time.perf_counter()
    model = build_mmdit(sd_scripts, spec.denoiser.config)
    model.to(_dtype(plan.dtype))
    model.requires_grad_(plan.train == "full")
    lora = (
        attach_kohya_lora(model, setup, regime.adapter_dtype, LORA_CLASSES["sd3"])
        if plan.train == "lora"
        else []
    )
    if setup.grad_ckpt:
        model.enable_gradient_checkpointing()
    b = setup.batch_size
    h = (setup.resolution or spec.native_resolution) // 8
    cdt = _dtype(rg.compute_dtype(setup))

    def make_inputs() -> tuple[list[Any], list[Any], Any]:
        x = torch.randn(b, 16, h, h, dtype=cdt)
        context = torch.randn(b, spec.text_tokens, 4096, dtype=cdt)
        y = torch.randn(b, 2048, dtype=cdt)
        ts = torch.rand(b) * 1000
        target = torch.randn(b, 16, h, h)

        def call() -> Any:
            return model(x, ts, context=context, y=y)

        grads = [x, context, y] if setup.grad_ckpt else []  # sd3_train_network.py
        others = ([] if setup.grad_ckpt else [x, context, y]) + [ts, target]
        return grads, others, (call, target)

    return trace_module(model, make_inputs, setup, regime, started, "MMDiT (sd-scripts)", len(lora))


def trace_flux(sd_scripts: Path, model_id: str, setup: Any) -> Any:
    import torch

    from fitcheck.diffusion import regime as rg
    from fitcheck.diffusion.sources import spec_from_preset
    from fitcheck.diffusion.step import LORA_CLASSES
    from fitcheck.measure.diffusion import attach_kohya_lora, trace_module
    from fitcheck.measure.diffusion import torch_dtype as _dtype

    spec = spec_from_preset(model_id)
    spec = spec.model_copy(update={"parts": (spec.denoiser,)})
    rg.check(spec, setup)
    plan = next(p for p in rg.plan_parts(spec, setup) if p.part.role == "denoiser")
    regime = rg.regime(spec, setup)
    started = time.perf_counter()
    guidance = bool(spec.denoiser.config.get("guidance_embeds"))
    model = build_flux(sd_scripts, guidance)
    model.to(_dtype(plan.dtype))
    model.requires_grad_(plan.train == "full")
    lora = (
        attach_kohya_lora(model, setup, regime.adapter_dtype, LORA_CLASSES["flux"])
        if plan.train == "lora"
        else []
    )
    if setup.grad_ckpt:
        model.enable_gradient_checkpointing()
    b = setup.batch_size
    side = (setup.resolution or spec.native_resolution) // 16
    n_img, n_txt = side * side, spec.text_tokens
    cdt = _dtype(rg.compute_dtype(setup))

    def make_inputs() -> tuple[list[Any], list[Any], Any]:
        img = torch.randn(b, n_img, 64, dtype=cdt)
        txt = torch.randn(b, n_txt, 4096, dtype=cdt)
        y = torch.randn(b, 768, dtype=cdt)
        img_ids = torch.zeros(b, n_img, 3)
        txt_ids = torch.zeros(b, n_txt, 3)
        ts = torch.rand(b)
        guid = torch.full((b,), 1.0)
        target = torch.randn(b, n_img, 64)

        def call() -> Any:
            return model(img=img, img_ids=img_ids, txt=txt, txt_ids=txt_ids, timesteps=ts, y=y, guidance=guid)

        grads = [img, txt, y, img_ids, guid] if setup.grad_ckpt else []  # flux_train_network.py
        return (
            grads,
            ([] if setup.grad_ckpt else [img, txt, y, img_ids, guid]) + [txt_ids, ts, target],
            (
                call,
                target,
            ),
        )

    return trace_module(model, make_inputs, setup, regime, started, "Flux (sd-scripts)", len(lora))


def main() -> int:
    sys.path.insert(0, str(ROOT / "src"))
    from fitcheck.models import DiffusionSetup

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sd-scripts", type=Path, required=True, help="an sd-scripts checkout")
    ap.add_argument("--commit", default=SD_SCRIPTS_COMMIT, help="its commit, recorded with the results")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    for model_id, kw in GRID:
        setup = DiffusionSetup(**kw)
        short = model_id.replace(".", "").replace("-", "")
        name = f"kohya_{short}_{setup.resolution}px_lora_r{setup.lora_rank}_" + (
            "ckpt" if setup.grad_ckpt else "nockpt"
        )
        if args.only not in name:
            continue
        step = trace(args.sd_scripts, model_id, setup)
        sd3 = model_id.startswith("sd35")
        rec = {
            "name": name,
            "model": model_id,
            "part": "transformer",
            "part_class": "sd-scripts " + ("library.sd3_models.MMDiT" if sd3 else "library.flux_models.Flux"),
            "config_source": f"https://github.com/kohya-ss/sd-scripts/blob/{args.commit}/library/"
            + ("sd3_models.py" if sd3 else "flux_models.py"),
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
            "tool_versions": {
                **step.tool_versions,
                "diffusers": "n/a (sd-scripts model)",
                "sd-scripts": args.commit,
            },
            "command": COMMAND,
            "generated": datetime.date.today().isoformat(),
            "wall_seconds": step.wall_seconds,
        }
        (OUT / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {step.peak_allocated_bytes / 2**30:.3f} GiB ({step.wall_seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
