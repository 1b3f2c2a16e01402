"""``--strategy device-map``: one process, the layers split in order over the GPUs (naive model parallel).

transformers' ``from_pretrained(device_map="auto")`` places the modules with accelerate
(`engine/devmap_place.py`) and ``dispatch_model`` hooks every placed module with an
``AlignDevicesHook`` that moves its inputs to its own GPU before it runs; one GPU works at a time.
This module deals the single-GPU step's lines out to the GPUs that hold them and re-runs the engine's
own moments (`estimate.step_phases`) on each GPU, so each GPU's peak is its own largest moment:

* model states (weights, adapters, gradients, optimizer states, step temporaries) follow their
  parameters: an optimizer allocates each state beside its parameter, and torch's foreach/fused AdamW
  groups tensors by device (torch/optim/optimizer.py ``_group_tensors_by_device_and_dtype``);
* checkpoints and saved activations follow their layer; the first layer of each GPU may keep its
  checkpoint on the GPU before (transformers 4.x checkpoints the hooked ``__call__``), so that one is
  counted on both (`Layout.checkpoints_on`);
* one layer's working set (a recomputed layer, eager attention transients, a dequantized weight, the
  LoRA projection transient, the eager mask's copy) exists on every GPU that runs layers;
* the final norm, lm_head, logits and loss live on the GPU of the lm_head; the labels are copied
  there (``labels.to(logits.device)``, transformers loss_utils ``ForCausalLMLoss``);
* the root module's hook has ``io_same_device=True`` (accelerate big_modeling.py ``dispatch_model``:
  ``execution_device[""] = main_device``; hooks.py ``attach_align_device_hook_on_blocks``), so the
  model's output (logits and loss) is copied back to the first GPU when the forward returns:
  ``output_copy``, alive until the trainer drops the outputs (HF Trainer: before backward).

Every GPU holds a CUDA context and its own caching-allocator reserve; no NCCL communicator is made
(peer copies). docs/distributed.md#device-map has the rules and their sources.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from fitcheck.assembly import phase, reassemble
from fitcheck.engine import devmap_place as dp
from fitcheck.engine import loss
from fitcheck.engine.estimate import STEADY, Saved, loss_margins, step_phases
from fitcheck.engine.params import inventory, layer_kinds, norm_params
from fitcheck.errors import OptionError
from fitcheck.facts.dtypes import nbytes
from fitcheck.models import (
    Band,
    Component,
    Distributed,
    Estimate,
    GpuShare,
    HostPhase,
    LlmSetup,
    ModelSpec,
    Phase,
    Regime,
)
from fitcheck.units import fmt_gib

D = "docs/distributed.md#device-map"
#: Bytes per element of a linear's weight as transformers sizes it for the placement: the bitsandbytes
#: quantizers' ``quantized_element_size`` (4-bit 0.5, 8-bit 1) for the weights they quantize
#: (``param_needs_quantization``: ``Linear4bit`` weights), GPTQ/AWQ checkpoints already packed (0.5).
#: Everything else (embeddings, norms, lm_head) in the load dtype.
QUANT_PLACE_BYTES: dict[str, float] = {"qlora": 0.5, "int8": 1.0, "gptq": 0.5, "awq": 0.5}
#: transformers' ``adjust_max_memory`` of the bitsandbytes quantizers: ``val * 0.90`` for every device
#: ("need more space for buffers that are created during quantization", quantizer_bnb_4bit.py / _8bit.py).
MAX_MEMORY_SCALE: dict[str, float] = {"qlora": 0.9, "int8": 0.9}
#: transformers' default shard size for hub checkpoints (the host reads one shard at a time when
#: loading straight onto the GPUs).
CHECKPOINT_SHARD_BYTES = 5 * 10**9


@dataclass(frozen=True)
class Layout:
    """The modules in placement order, their bytes and devices, and what each GPU holds."""

    names: tuple[str, ...]
    sizes: tuple[int, ...]
    devices: tuple[int, ...]
    gpus: int
    layer_devices: tuple[int, ...]  # device of each decoder layer
    head: int  # device of the lm_head (the embedding's when tied)
    first: int  # device of the embeddings: where the inputs arrive and outputs are copied back
    norm: int  # device of the final norm

    def layers_on(self, g: int) -> int:
        return sum(1 for d in self.layer_devices if d == g)

    def checkpoints_on(self, g: int) -> int:
        """Checkpoints GPU ``g`` holds: one per layer it runs, plus one per layer on the next GPU whose
        input it made. Which GPU keeps a boundary layer's checkpoint depends on whether the checkpoint
        wraps accelerate's hook (transformers 4.x: ``checkpoint(decoder_layer.__call__, hidden_states)``,
        the input not yet moved) or not (5.x ``GradientCheckpointingLayer`` checkpoints ``forward``,
        "so module hooks ... stay outside the checkpoint"); fitcheck counts it on both."""
        made = (self.first, *self.layer_devices[:-1])
        crossing = sum(1 for src, dst in zip(made, self.layer_devices, strict=True) if src == g != dst)
        return self.layers_on(g) + crossing

    def bytes_on(self, g: int) -> int:
        return sum(s for s, d in zip(self.sizes, self.devices, strict=True) if d == g)


def _block_sizes(spec: ModelSpec, setup: LlmSetup) -> tuple[list[str], list[int], int]:
    """(names, bytes, the leaf module the buffer is sized on) of the modules placed, in order."""
    a = spec.arch
    inv = inventory(a)
    wb = nbytes(setup.precision)
    qb = QUANT_PLACE_BYTES.get(_quant_key(setup), wb)
    # transformers 4.x sized every parameter outside modules_to_not_convert (the lm_head) at the
    # bitsandbytes target dtype (target_dtype with special_dtypes), embeddings and norms included
    ob = qb if setup.device_map_version == 4 and _quant_key(setup) in MAX_MEMORY_SCALE else wb
    names, sizes = ["embed_tokens"], [round((inv.embedding + inv.positions) * ob)]
    norms = a.norms_per_layer * norm_params(a) + inv.other_layer // max(1, a.num_layers)
    biggest, leaves = 0, 3 - int(a.tie_embeddings)
    for kind in layer_kinds(a):
        lins = kind.linears(a)
        parts = [round(lin.numel * (qb if lin.is_module else ob)) for lin in lins]
        biggest = max(biggest, *parts)
        leaves += kind.count * (len(lins) + a.norms_per_layer)
        for _ in range(kind.count):
            names.append(f"layers.{len(names) - 1}")
            sizes.append(sum(parts) + round(norms * ob))
    names += ["norm", "lm_head"]
    sizes += [round(inv.final_norm * ob), 0 if a.tie_embeddings else inv.lm_head * wb]
    if setup.device_map_version == 4:  # accelerate: the mean leaf module
        return names, sizes, sum(sizes) // leaves
    return names, sizes, max(biggest, sizes[0], sizes[-1])  # transformers 5: the biggest leaf


def _quant_key(setup: LlmSetup) -> str:
    return "qlora" if setup.method == "qlora" else setup.base_quant


def layout(spec: ModelSpec, setup: LlmSetup) -> Layout:
    """accelerate's balanced placement of ``spec`` over ``setup.gpus`` GPUs (`devmap_place`)."""
    names, sizes, leaf = _block_sizes(spec, setup)
    g = setup.gpus
    # the decoder layer: transformers 5 takes the biggest, accelerate the first (they are alike here)
    quota = dp.balanced_quota(sizes, g, max(max(sizes[1:-2], default=0), leaf))
    # bitsandbytes' quantizers keep 10% of every GPU's max_memory back for quantization buffers
    quota = int(quota * MAX_MEMORY_SCALE.get(_quant_key(setup), 1.0))
    devices = list(dp.place(sizes, g, quota))
    if spec.arch.tie_embeddings:
        devices[-1] = devices[0]  # a tied lm_head goes with the embeddings
    L = spec.arch.num_layers
    return Layout(
        names=tuple(names),
        sizes=tuple(sizes),
        devices=tuple(devices),
        gpus=g,
        layer_devices=tuple(devices[1 : 1 + L]),
        head=devices[-1],
        first=devices[0],
        norm=devices[-2],
    )


def check(spec: ModelSpec, setup: LlmSetup) -> None:
    """Refuse what accelerate's device_map training path is not modelled for."""
    if spec.arch.structure != "decoder":
        raise OptionError(
            f"--strategy device-map is modelled for decoder-only models, not {spec.arch.structure}"
        )
    if setup.backend not in ("cuda", "rocm"):
        raise OptionError(f"--strategy device-map splits a model over CUDA/ROCm GPUs, not {setup.backend}")
    if setup.nodes > 1:
        raise OptionError("--strategy device-map runs one process on one machine: --nodes does not apply")
    if setup.offload != "none":
        raise OptionError(
            "--strategy device-map with --offload: accelerate's CPU offload of layers in training is not "
            "modelled; use --strategy zero3|fsdp with --offload"
        )
    if setup.fsdp_version != 2:
        raise OptionError("--fsdp-version applies to --strategy fsdp*, not device-map")


@dataclass(frozen=True)
class Share:
    """Fractions of the single-GPU lines that one GPU holds."""

    gpu: int
    layers: float  # of the decoder layers (saved activations, 4-bit weights, LoRA states)
    ckpt: float  # of the checkpoints
    weights: float  # of the placed bytes (dense weights)
    dense: float  # of the embeddings, final norm and lm_head (QLoRA's unquantized weights)
    trainable: float  # of the trainable parameters
    head: bool  # holds the lm_head (logits and loss)
    norm: bool
    first: bool  # the inputs arrive here and the output is copied back here
    runs_layers: bool


def shares(lay: Layout, spec: ModelSpec, setup: LlmSetup) -> list[Share]:
    L = max(1, len(lay.layer_devices))
    total = max(1, sum(lay.sizes))
    ends = [
        (s, d)
        for s, d, n in zip(lay.sizes, lay.devices, lay.names, strict=True)
        if not n.startswith("layers.")
    ]
    dense_total = max(1, sum(s for s, _ in ends))
    out = []
    for g in range(lay.gpus):
        layers = lay.layers_on(g) / L
        weights = lay.bytes_on(g) / total
        out.append(
            Share(
                gpu=g,
                layers=layers,
                ckpt=lay.checkpoints_on(g) / L,
                weights=weights,
                dense=sum(s for s, d in ends if d == g) / dense_total,
                trainable=weights if setup.method == "full" else layers,
                head=lay.head == g,
                norm=lay.norm == g,
                first=lay.first == g,
                runs_layers=lay.layers_on(g) > 0,
            )
        )
    return out


def _scaled(c: Component, f: float, g: int, how: str) -> Component:
    if f == 1.0:
        return c
    rule = f"GPU {g}: {how}" + (f" of {c.rule}" if c.rule and f > 0 else "")
    return Component(name=c.name, bytes=max(0, round(c.bytes * f)), rule=rule, source=c.source)


#: Each model-state line and the share of it a GPU holds.
STATE_SHARE: dict[str, Callable[[Share], tuple[float, str]]] = {
    "weights": lambda s: (s.trainable, f"{s.trainable:.1%} (its modules)"),
    "weights_frozen": lambda s: (s.weights, f"{s.weights:.1%} (its modules)"),
    "weights_4bit": lambda s: (s.layers, f"{s.layers:.1%} (its layers)"),
    "weights_quantized": lambda s: (s.layers, f"{s.layers:.1%} (its layers)"),
    "weights_unquantized": lambda s: (s.dense, f"{s.dense:.1%} (embeddings/norm/lm_head placed here)"),
    "module_copies": lambda s: (s.dense, f"{s.dense:.1%} (embeddings/lm_head placed here)"),
}
_TRAINABLE = ("adapters", "master_weights", "optimizer_states", "optimizer_states_paged", "gradients")


def _state(c: Component, s: Share) -> Component:
    if c.name in STATE_SHARE:
        f, how = STATE_SHARE[c.name](s)
    elif c.name in (*_TRAINABLE, "optimizer_transient"):
        f, how = s.trainable, f"{s.trainable:.1%} (its trainable parameters)"
    else:
        raise KeyError(f"device-map: no share rule for model-state line {c.name!r}")
    return _scaled(c, f, s.gpu, how)


def _saved(c: Component, s: Share) -> Component:
    """A line of what the forward keeps: checkpoints where made, activations with their layer, the
    final norm's and lm_head's inputs on their GPU."""
    if c.name == "checkpoints":
        return _scaled(c, s.ckpt, s.gpu, f"{s.ckpt:.1%} (its layers' inputs, boundary included)")
    if c.name in ("activations", "attention_scores", "encoder_and_cross_attention"):
        return _scaled(c, s.layers, s.gpu, f"{s.layers:.1%} (its layers)")
    if c.name == "final_norm":
        return _scaled(c, float(s.norm), s.gpu, "final norm elsewhere" if not s.norm else "")
    if c.name == "head_inputs":
        return _scaled(c, float(s.head), s.gpu, "lm_head elsewhere" if not s.head else "")
    return _layer_wide(c, s)


def _layer_wide(c: Component, s: Share) -> Component:
    """One layer's working set: on every GPU that runs layers."""
    return _scaled(c, float(s.runs_layers), s.gpu, "runs no layer" if not s.runs_layers else "")


def _on_head(c: Component, s: Share) -> Component:
    return _scaled(c, float(s.head), s.gpu, "lm_head elsewhere" if not s.head else "")


def _inputs(c: Component, s: Share, tokens: int) -> Component:
    """input_ids and labels arrive on the first GPU; the loss copies the labels to the lm_head's."""
    if s.first:
        return c
    if not s.head:
        return Component(name=c.name, bytes=0, rule="", source=c.source)
    rule = f"GPU {s.gpu}: labels copied to the logits' GPU (int64)"
    return Component(name=c.name, bytes=8 * tokens, rule=rule, source=c.source)


def _output_copy(s: Share, lay: Layout, out_bytes: int) -> Component:
    """The model's output copied back to the first GPU by the root hook (io_same_device)."""
    n = out_bytes if s.first and lay.head != lay.first else 0
    rule = "the model's logits copied back to the input GPU by accelerate's root hook (io_same_device)"
    return Component(name="output_copy", bytes=n, rule=rule if n else "", source=D)


def saved_for(sv: Saved, s: Share, lay: Layout, setup: LlmSetup, out_bytes: int) -> Saved:
    """The single-GPU step's transient and saved lines as one GPU holds them."""
    lp = sv.layer
    layer = dataclasses.replace(
        lp,
        forward=[_saved(c, s) for c in lp.forward] if s.runs_layers else [],
        backward=[_saved(c, s) for c in lp.backward] if s.runs_layers else [],
    )
    copy = _output_copy(s, lay, out_bytes)
    # merged MoE experts: one layer's when checkpointing (recomputed per layer), else every layer's
    merged = (
        _layer_wide(sv.merged_fwd, s)
        if setup.grad_ckpt
        else _scaled(sv.merged_fwd, s.layers, s.gpu, f"{s.layers:.1%}")
    )
    return dataclasses.replace(
        sv,
        inputs=_inputs(sv.inputs, s, setup.tokens),
        saved=tuple(_saved(c, s) for c in sv.saved),
        logits_fwd=_on_head(sv.logits_fwd, s) if s.head else copy,
        logits_bwd=_on_head(sv.logits_bwd, s),
        logits_head=_on_head(sv.logits_head, s),
        head_dequant=_on_head(sv.head_dequant, s),
        head_grads=_on_head(sv.head_grads, s),
        tied=_on_head(sv.tied, s),
        casts_fwd=_scaled(sv.casts_fwd, s.trainable, s.gpu, f"{s.trainable:.1%}"),
        casts_bwd=_on_head(sv.casts_bwd, s),
        casts_layer=_layer_wide(sv.casts_layer, s),
        merged_fwd=merged,
        merged_layer=_layer_wide(sv.merged_layer, s),
        dequant=_layer_wide(sv.dequant, s),
        late=_layer_wide(sv.late, s),
        mask=_layer_wide(sv.mask, s),
        held=sv.held if s.first else _scaled(sv.held, 0.0, s.gpu, "held on the input GPU"),
        held_prev=sv.held_prev if s.first else _scaled(sv.held_prev, 0.0, s.gpu, "held on the input GPU"),
        layer=layer,
        # the layer blocks cached beside the loss: on the GPU that runs the loss, when it runs layers
        stranded=sv.stranded if s.head and s.runs_layers else 0.0,
    )


def gpu_phases(
    ms: dict[str, Component], sv: Saved, setup: LlmSetup, lay: Layout, s: Share, out_bytes: int, load: Phase
) -> tuple[Phase, ...]:
    """One GPU's phases: its share of loading and the engine's moments on its own lines."""
    return gpu_step(ms, sv, setup, lay, s, out_bytes, load)[0]


def gpu_step(
    ms: dict[str, Component],
    sv: Saved,
    setup: LlmSetup,
    lay: Layout,
    s: Share,
    out_bytes: int,
    load: Phase,
    kernel: str = "",
    grad_tensor: int = 0,
) -> tuple[tuple[Phase, ...], int]:
    """One GPU's phases (`gpu_phases`) and its reserve beyond the flat share, from the same per-GPU lines:
    its margin at the loss over its own allocated peak (engine/estimate.py `stranded_margin`) and, on the
    GPU that runs the loss, the loss's blocks its gradients fill (`regrown_loss_blocks`; ``kernel`` the loss
    kernel, none counted without one: `gpu_phases` wants the phases only; ``grad_tensor`` the gradient
    tensor that decides it, engine/states.py `largest_regrowing_grad_bytes`)."""
    ms_g = {k: _state(c, s) for k, c in ms.items()}
    sv_g = saved_for(sv, s, lay, setup, out_bytes)
    load_g = phase("load", [_state(c, s) if c.name in ms else _layer_wide(c, s) for c in load.components])
    phases = (load_g, *step_phases(ms_g, sv_g, setup.grad_accum > 1, setup.optimizer_in_bwd))
    peak = max(p.total_bytes for p in phases)
    return phases, sum(loss_margins(ms_g, sv_g, setup, kernel, grad_tensor, peak, False))


def split(
    spec: ModelSpec,
    setup: LlmSetup,
    regime: Regime,
    ms: dict[str, Component],
    sv: Saved,
    est: Estimate,
    tensors: int,
    out_bytes: int,
    grad_tensor: int = 0,
) -> Estimate:
    """The per-GPU estimates of a device-map run; the returned estimate is the bottleneck GPU's, with
    every GPU's placement and peak in ``distributed.per_gpu``."""
    check(spec, setup)
    lay = layout(spec, setup)
    kernel = loss.kernel_for(setup, regime, spec.arch)
    per: list[tuple[Estimate, Share]] = []
    for s in shares(lay, spec, setup):
        phases, stranded = gpu_step(ms, sv, setup, lay, s, out_bytes, est.phase("load"), kernel, grad_tensor)
        steady = sum(_state(ms[k], s).bytes for k in STEADY if k in ms)
        # tensors alive on this GPU: its layers' share (the allocator rounds each up)
        per.append((reassemble(est, phases, steady, max(1, round(tensors * s.layers)), stranded), s))
    k = max(range(len(per)), key=lambda i: per[i][0].device_bytes)
    return _result(setup, lay, per, per[k][0], k)


def _modules(lay: Layout, g: int) -> tuple[str, ...]:
    """The modules on GPU ``g``, runs of layers written as one range."""
    out: list[str] = []
    idx = [i for i, d in enumerate(lay.devices) if d == g]
    layers = [int(lay.names[i].split(".")[1]) for i in idx if lay.names[i].startswith("layers.")]
    for i in idx:
        n = lay.names[i]
        if n.startswith("layers."):
            if int(n.split(".")[1]) == layers[0]:
                out.append(f"layers {layers[0]}-{layers[-1]}" if len(layers) > 1 else f"layer {layers[0]}")
        else:
            out.append(n + (" (tied)" if n == "lm_head" and lay.sizes[i] == 0 else ""))
    return tuple(out)


def _result(
    setup: LlmSetup, lay: Layout, per: list[tuple[Estimate, Share]], worst: Estimate, k: int
) -> Estimate:
    gpus = tuple(
        GpuShare(
            gpu=s.gpu,
            modules=_modules(lay, s.gpu),
            layers=lay.layers_on(s.gpu),
            weights_bytes=lay.bytes_on(s.gpu),
            peak_phase=e.peak_phase,
            peak_allocated_bytes=e.peak_allocated_bytes,
            peak_reserved_bytes=e.peak_reserved_bytes,
            device_bytes=e.device_bytes,
            high_bytes=e.band.high_bytes if e.band is not None else e.device_bytes,
        )
        for e, s in per
    )
    dist = Distributed(
        strategy="device-map",
        engine="accelerate-device-map",
        offload="none",
        nodes=1,
        gpus_per_node=setup.gpus,
        world_size=1,
        shard_group=1,
        per_gpu=gpus,
        bottleneck_gpu=k,
    )
    shard = min(sum(lay.sizes), CHECKPOINT_SHARD_BYTES)
    rule = "one process reads one checkpoint shard at a time straight onto its GPU (low_cpu_mem_usage)"
    load_c = (Component(name="model_load", bytes=shard, rule=rule, source=D),)
    host = (
        HostPhase(name="loading", components=load_c, total_bytes=shard),
        HostPhase(name="training", components=(), total_bytes=0),
    )
    note = (
        f'device-map: layers split over {setup.gpus} GPUs as accelerate\'s device_map="auto" places them; '
        f"GPU {k} is the bottleneck ("
        + ", ".join(f"GPU {g.gpu} {fmt_gib(g.device_bytes, 1)}" for g in gpus)
        + ")"
    )
    return worst.model_copy(
        update={
            "band": _run_band(worst, gpus, k),
            "world_size": 1,
            "distributed": dist,
            "host_phases": host,
            "host_bytes": shard,
            "warnings": (*worst.warnings, note),
        }
    )


def _run_band(worst: Estimate, gpus: Sequence[GpuShare], k: int) -> Band | None:
    """The shown GPU's band, its upper edge raised to any other GPU's: the verdict (``fits`` when the
    upper edge fits, ``does_not_fit`` when ``device_bytes`` does not) then holds for every GPU, since
    ``device_bytes`` is already the largest."""
    band = worst.band
    top = max(gpus, key=lambda g: g.high_bytes)
    if band is None or top.high_bytes <= band.high_bytes:
        return band
    basis = f"{band.basis}; upper edge from GPU {top.gpu} (its own band; GPU {k} has the largest estimate)"
    return band.model_copy(update={"high_bytes": top.high_bytes, "basis": basis})
