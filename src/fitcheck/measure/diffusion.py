"""Trace a kohya-style training step of a real diffusers UNet on fake tensors (torch + diffusers).

This is the reference the simulator is calibrated against (``bench/calibrate_diffusion.py`` writes
the records, ``tests/test_diffusion_calibration.py`` compares the engine with every one). The
UNet is ``diffusers.UNet2DConditionModel`` built from the part's published config on the meta
device, then given fake CPU storage (``fitcheck.measure._internals.fakeify``); the step is what kohya's
``train_network.py`` / ``sdxl_train.py`` do with cached latents and text-encoder outputs:

* frozen base in the mixed-precision dtype (fp8 with ``fp8_base``), or all weights trained (fp32,
  or the compute dtype with ``full_bf16``);
* kohya's LoRA: ``org_forward(x) + lora_up(lora_down(x)) * multiplier * scale`` on every
  ``Linear`` and 1x1 ``Conv2d`` inside ``Transformer2DModel`` (3x3 convs of ``ResnetBlock2D``,
  ``Downsample2D`` and ``Upsample2D`` too with conv LoRA), fp32 adapters;
* ``AttnProcessor`` (eager) or ``AttnProcessor2_0`` (SDPA), ``enable_gradient_checkpointing()``
  and, like kohya, ``requires_grad_(True)`` on the inputs when checkpointing;
* CUDA autocast semantics on CPU (``fitcheck.measure.autocast``); fp32 MSE loss; the optimizer as
  ``fitcheck.measure.optim`` builds it (torch AdamW foreach, transformers Adafactor, ...);
* two steps; phases of the second are reported (optimizer states exist by then).
"""

from __future__ import annotations

import time
from typing import Any

from fitcheck.diffusion import regime as rg
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.diffusion.step import LORA_CLASSES, VAE_FACTOR
from fitcheck.errors import OptionError
from fitcheck.models import DiffusionSetup

DEVICE_SEMANTICS = (
    "fake tensors on the CPU device with CUDA autocast op lists; SDPA runs CPU flash attention (saves "
    "out + fp32 logsumexp, like CUDA flash); exact storage bytes, no allocator rounding or CUDA context"
)
TORCH_DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn"}


def torch_dtype(name: str) -> Any:
    import torch

    return getattr(torch, TORCH_DTYPES[name])


def build_unet(config: dict[str, Any]) -> Any:
    """``UNet2DConditionModel`` from its config, on the meta device."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel.from_config(config)


def attach_kohya_lora(
    model: Any, setup: DiffusionSetup, dtype: str, classes: tuple[str, ...] | None = None
) -> list[Any]:
    """kohya networks/lora*.py: wrap the forward of every targeted layer; return the LoRA parameters."""
    import torch

    if classes is None:
        classes = LORA_CLASSES["unet_conv" if setup.lora_targets == "conv" else "unet"]
    targets: list[Any] = []
    seen: set[int] = set()
    for _, mod in model.named_modules():
        if type(mod).__name__ in classes:
            for _, child in mod.named_modules():
                if id(child) in seen:
                    continue
                linear = isinstance(child, torch.nn.Linear)
                conv = isinstance(child, torch.nn.Conv2d)
                if linear or (conv and (child.kernel_size == (1, 1) or setup.lora_targets == "conv")):
                    seen.add(id(child))
                    targets.append(child)
    holder = torch.nn.ModuleList()
    params: list[Any] = []
    r = setup.lora_rank
    for child in targets:
        down: torch.nn.Module
        up: torch.nn.Module
        with torch.device("meta"):
            if isinstance(child, torch.nn.Linear):
                down = torch.nn.Linear(child.in_features, r, bias=False)
                up = torch.nn.Linear(r, child.out_features, bias=False)
            else:
                down = torch.nn.Conv2d(
                    child.in_channels, r, child.kernel_size, child.stride, child.padding, bias=False
                )
                up = torch.nn.Conv2d(r, child.out_channels, 1, bias=False)
        down.to(torch_dtype(dtype))
        up.to(torch_dtype(dtype))
        holder.extend([down, up])
        params += [down.weight, up.weight]
        org = child.forward
        multiplier, scale = 1.0, setup.alpha / r

        def forward(
            x: Any, org: Any = org, down: Any = down, up: Any = up, m: float = multiplier, s: float = scale
        ) -> Any:
            org_forwarded = org(x)
            lx = down(x)
            lx = up(lx)
            return org_forwarded + lx * m * s

        child.forward = forward
    model.kohya_lora = holder
    return params


def trace_denoiser_step(spec: DiffusionSpec, setup: DiffusionSetup) -> Any:
    """Trace two training steps of the spec's UNet under ``setup``; a `MeasuredStep`.

    Raises:
        OptionError: a denoiser other than a UNet, or an optimizer with no fake-tensor path.
    """
    import torch
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    part = spec.denoiser
    if part.class_name != "UNet2DConditionModel":
        raise OptionError(f"the diffusers tracer runs UNet2DConditionModel, not {part.class_name}")
    rg.check(spec, setup)
    plan = next(p for p in rg.plan_parts(spec, setup) if p.part.role == "denoiser")
    regime = rg.regime(spec, setup)
    started = time.perf_counter()
    model = build_unet(part.config)
    model.to(torch_dtype(plan.dtype))
    model.requires_grad_(plan.train == "full")
    lora: list[Any] = []
    if plan.train == "lora":
        lora = attach_kohya_lora(model, setup, regime.adapter_dtype)
    model.set_attn_processor(AttnProcessor() if setup.attn == "eager" else AttnProcessor2_0())
    if setup.grad_ckpt:
        model.enable_gradient_checkpointing()
    c = rg.compute_dtype(setup)
    res = setup.resolution or spec.native_resolution
    h = res // VAE_FACTOR
    b = setup.batch_size
    cfg = part.config

    def make_inputs() -> tuple[list[Any], Any, Any]:
        cdt = torch_dtype(c)
        sample = torch.randn(b, int(cfg.get("in_channels", 4)), h, h, dtype=cdt)
        ctx = torch.randn(b, spec.text_tokens, int(cfg.get("cross_attention_dim", 768)), dtype=cdt)
        ts = torch.randint(0, 1000, (b,))
        added = None
        if cfg.get("addition_embed_type") == "text_time":
            n_text = int(cfg["projection_class_embeddings_input_dim"]) - 6 * int(
                cfg["addition_time_embed_dim"]
            )
            added = {
                "text_embeds": torch.randn(b, n_text, dtype=cdt),
                "time_ids": torch.randn(b, 6, dtype=cdt),
            }
        target = torch.randn(b, int(cfg.get("out_channels", 4)), h, h)

        def call() -> Any:
            return model(sample, ts, ctx, added_cond_kwargs=added).sample

        return [sample, ctx, *(added or {}).values()], [ts, target], (call, target)

    return trace_module(model, make_inputs, setup, regime, started, part.class_name, len(lora))


def trace_module(
    model: Any,
    make_inputs: Any,
    setup: DiffusionSetup,
    regime: Any,
    started: float,
    model_type: str,
    n_lora: int,
) -> Any:
    """Trace two kohya-style steps of ``model`` (already built, dtyped, LoRA-wrapped) on fake tensors.

    ``make_inputs()`` (called inside fake mode) returns (tensors that get ``requires_grad`` with
    checkpointing, other tensors, (call, target)): ``call()`` runs the forward and returns the
    prediction, compared with ``target`` by an fp32 MSE loss.
    """

    from fitcheck.measure._internals import FakeTensorMode, fakeify, param_bytes
    from fitcheck.measure.optim import make_optimizer
    from fitcheck.measure.summary import RunFacts, summarize
    from fitcheck.measure.trace import window
    from fitcheck.measure.tracker import Tracker

    model.train()
    fake = FakeTensorMode()
    fakeify(model, fake)
    tracker = Tracker()
    c = rg.compute_dtype(setup)
    steps = 2
    with fake:
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = make_optimizer(params, setup, regime)
        grads_in, others, (call, target) = make_inputs()
        if setup.grad_ckpt:
            for t in grads_in:
                t.requires_grad_(True)  # kohya: noisy latents / text conds requires_grad_(True)
        uniq = _register(tracker, model, [*grads_in, *others])
        _run_steps(tracker, model, call, target, optimizer, params, c, steps, setup.keep_grads)
        tracker.end()
        windows = [window(tracker, w, 8) for w in tracker.windows]
        facts = RunFacts(
            mode="trace",
            device="fake",
            device_semantics=DEVICE_SEMANTICS,
            model_type=model_type,
            regime=regime.name,
            steps=steps,
            param_bytes=param_bytes(model),
            trainable_params=sum(p.numel() for p in params),
            total_params=sum(p.numel() for p in uniq),
            wall_seconds=time.perf_counter() - started,
            notes=[f"{n_lora} LoRA tensors (kohya LoRAModule)"] if n_lora else [],
        )
        del optimizer, model, params, grads_in, others, call, target
    return summarize(windows, setup, facts)


def _register(tracker: Any, model: Any, batch: list[Any]) -> list[Any]:
    """Tag the model's frozen and trainable parameters, its buffers and the batch; returns the
    unique parameters (tied ones once)."""
    from fitcheck.measure._internals import unique_params

    uniq = unique_params(model)
    tracker.register([p for p in uniq if not p.requires_grad], "parameters_frozen", "<parameter>")
    tracker.register([p for p in uniq if p.requires_grad], "parameters_trainable", "<parameter>")
    tracker.register(list(model.buffers()), "buffers", "<buffer>")
    tracker.register(batch, "inputs", "<batch>")
    return uniq


def _run_steps(
    tracker: Any,
    model: Any,
    call: Any,
    target: Any,
    optimizer: Any,
    params: list[Any],
    c: str,
    steps: int,
    keep_grads: bool = False,
) -> None:
    """Forward under autocast, an fp32 MSE loss, backward and the optimizer step, ``steps`` times,
    each phase a tracker window; gradients and optimizer states retagged after the step."""
    import torch

    from fitcheck.measure.autocast import cuda_autocast_policy
    from fitcheck.measure.optim import state_tensors
    from fitcheck.measure.tracker import LiveStorageMode, ModuleScope

    names = {id(m): n for n, m in model.named_modules()}
    autocast = (
        torch.autocast("cpu", dtype=torch_dtype(c)) if c != "fp32" else torch.autocast("cpu", enabled=False)
    )
    with cuda_autocast_policy(), ModuleScope(tracker, names), LiveStorageMode(tracker):
        for step in range(1, steps + 1):
            tracker.begin("forward", step)
            with autocast:
                pred = call()
            loss = torch.nn.functional.mse_loss(pred.float(), target.float(), reduction="none").mean()
            del pred
            tracker.begin("backward", step)
            loss.backward()
            del loss
            tracker.begin("optimizer_step", step)
            optimizer.step()
            tracker.retag([p.grad for p in params if p.grad is not None], "gradients")
            tracker.retag([t for _, t in state_tensors(optimizer)], "optimizer_states")
            optimizer.zero_grad(set_to_none=not keep_grads)  # --keep-grads: zeroed in place, kept
