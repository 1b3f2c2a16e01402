"""Model states: weights, adapters, gradients, optimizer states, master copy, step transients.

Every function returns bytes for the whole model on one device (data parallel: each GPU holds all
of it). Rules and sources: docs/methodology.md, "Model states".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fitcheck.engine import nf4
from fitcheck.engine.lora import (
    adapter_params,
    frozen_a_params,
    head_targets,
    tower_targets,
    trained_modules,
)
from fitcheck.engine.params import head_shapes, inventory, layer_kinds
from fitcheck.engine.quant import (
    expert_modules,
    is_fused_expert,
    kept_layers,
    quantized_bytes,
    quantized_linear,
)
from fitcheck.facts import optimizers as opt
from fitcheck.facts.dtypes import BYTES, nbytes
from fitcheck.facts.optimizers import Shape
from fitcheck.models import DecoderArch, LlmSetup, Regime


@dataclass(frozen=True)
class Counts:
    """Parameter counts by role, for the setup's method."""

    total: int
    trainable: int
    adapter: int
    quantized: int
    quantized_tensors: int
    frozen_dense: int  # frozen parameters kept dense (not 4-bit)
    module_copies: int = 0  # trainable full copies of lm_head / embed_tokens (peft modules_to_save)

    @property
    def base(self) -> int:
        """The model's own parameters (no adapters, no trained copies)."""
        return self.total - self.adapter - self.module_copies


def quantizable_tensors(a: DecoderArch, setup: LlmSetup | None = None) -> tuple[int, int]:
    """(parameters, tensors) that 4-bit quantization packs: the projections inside the layers, less the
    fused MoE experts bitsandbytes leaves in the compute dtype (`quant.quantized_linear`; every expert
    when no setup is given) and less the layers' copies a pre-quantized checkpoint's skip list keeps
    unquantized (`quant.kept_layers`). A fused expert parameter is one tensor, or, held as per-expert
    modules (`quant.expert_modules`), one per expert and module (gate and up apart)."""
    kept = kept_layers(a, setup.quant_skip) if setup is not None and setup.quant_skip else {}
    numel = tensors = 0
    for index, kind in enumerate(layer_kinds(a)):
        for lin in kind.linears(a):
            if lin.role != "router" and (setup is None or quantized_linear(a, setup, lin)):
                n = kind.count - kept.get((index, lin.name), 0)
                numel += n * lin.copies * lin.d_in * lin.d_out
                split = setup is not None and is_fused_expert(lin) and expert_modules(a, setup)
                tensors += n * (lin.copies * lin.lora_factor if split else 1)
    return numel, tensors


def counts(a: DecoderArch, setup: LlmSetup) -> Counts:
    """How many parameters are trainable, adapters, 4-bit, frozen."""
    total = inventory(a).total
    adapters = adapter_params(a, setup) if setup.method != "full" else 0
    if quantized_base(setup):
        q, qt = quantizable_tensors(a, setup)
    else:
        q, qt = 0, 0
    copies = module_copy_params(a, setup)
    trainable = total if setup.method == "full" else adapters - frozen_a_params(a, setup) + copies
    frozen_dense = 0 if setup.method == "full" else total - q
    return Counts(total + adapters + copies, trainable, adapters, q, qt, frozen_dense, copies)


def quantized_base(setup: LlmSetup) -> bool:
    """Whether the frozen projections are stored quantized (QLoRA's NF4 or an --base-quant format)."""
    return setup.method == "qlora" or (setup.method == "lora" and setup.base_quant != "none")


def module_copy_params(a: DecoderArch, setup: LlmSetup) -> int:
    """Parameters of the full copies peft's ``modules_to_save`` trains (``ModulesToSaveWrapper`` deep-copies
    the module and keeps the original frozen beside it; peft ``utils/other.py``)."""
    return sum(module_copy_sizes(a, setup))


def module_copy_sizes(a: DecoderArch, setup: LlmSetup) -> list[int]:
    """Parameters of each ``modules_to_save`` copy (none in full fine-tuning, which trains the modules)."""
    if setup.method == "full":
        return []
    inv = inventory(a)
    sizes = {"lm_head": inv.lm_head or inv.embedding, "embed_tokens": inv.embedding}
    return [sizes[m] for m in trained_modules(setup)]


def copy_dtype(regime: Regime) -> str:
    """dtype of a ``modules_to_save`` copy: the module's own (fp32 after a k-bit upcast)."""
    return "fp32" if regime.kbit_upcast else regime.weight_dtype


def nf4_bytes(numel: int, tensors: int, double_quant: bool, regime: Regime | None = None) -> int:
    """Packed 4-bit weights plus their quantization constants, in the regime's NF4 format
    (`fitcheck.engine.nf4`); torchao keeps its constants in the model dtype."""
    fmt = regime.nf4_format if regime is not None else "bitsandbytes"
    dtype_b = nbytes(regime.weight_dtype) if regime is not None else 2
    return nf4.stored_bytes(fmt, numel, tensors, double_quant, dtype_b)


def trainable_shapes(a: DecoderArch, setup: LlmSetup) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of every trainable tensor; vectors have cols = 1."""
    if setup.method == "prefix-tuning":
        from fitcheck.engine import prefix

        return prefix.shapes(a, setup)
    if setup.method != "full":
        out = layer_tensors(a, setup)
        r, h, v = setup.lora_rank, a.hidden_size, a.vocab_size
        for d_in, d_out, k in tower_targets(a, setup.lora_targets):
            out += [(d_out, r, k)] if setup.lora_fa else [(r, d_in, k), (d_out, r, k)]
            if setup.dora:
                out.append((d_out, 1, k))
        for m in head_targets(setup.lora_targets):
            if m == "lm_head":
                out += [(v, r, 1)] if setup.lora_fa else [(r, h, 1), (v, r, 1)]
            else:
                out += [(r, v, 1), (h, r, 1)]
        return out
    inv = inventory(a)
    h = a.hidden_size
    out = [(a.vocab_size, h, 1)]
    out += head_shapes(a)
    if a.learned_positions:
        out.append((a.learned_positions, h, 1))
    out += layer_tensors(a, setup)
    # norms, q/k norms and the small tables (token types, relative positions) as one vector group
    out.append((inv.norms, 1, 1))
    if inv.extra:
        out.append((inv.extra, 1, 1))  # a vision tower trained with the rest: one flat group
    return out


def layer_tensors(a: DecoderArch, setup: LlmSetup) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of the decoder layers' trainable tensors: every projection (and bias) in full
    fine-tuning, the targeted projections' adapter factors otherwise (`trainable_shapes`' layer part)."""
    out: list[tuple[int, int, int]] = []
    if setup.method == "full":
        for kind in layer_kinds(a):
            for lin in kind.linears(a):
                out.append((lin.d_out, lin.d_in, kind.count * lin.copies))
                if lin.bias:
                    out.append((lin.d_out, 1, kind.count * lin.copies))
        return out
    from fitcheck.engine.lora import targeted, wrapped

    for kind in layer_kinds(a):
        n_layers = kind.count
        for lin in kind.linears(a):
            if targeted(a, setup.lora_targets, lin):
                n, r, d_in, d_out = wrapped(a, setup, lin)
                # one module's factors per expert and projection
                if is_fused_expert(lin) and expert_modules(a, setup):
                    k = n_layers * n
                else:  # peft stores an expert parameter's factors as single tensors of rank r*E
                    k, r = n_layers, r * n
                out += [(d_out, r, k)] if setup.lora_fa else [(r, d_in, k), (d_out, r, k)]
                if setup.dora:
                    out.append((d_out, 1, k))
    return out


def largest_layer_grad_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Bytes of the largest gradient tensor a decoder layer's backward makes (0 when no layer tensor
    trains: prefix tuning). A fused expert parameter counts as one expert's slice."""
    if setup.method == "prefix-tuning":
        return 0
    return max((rows * cols for rows, cols, _ in layer_tensors(a, setup)), default=0) * int(
        BYTES[regime.grad_dtype]
    )


def largest_regrowing_grad_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """The gradient tensor that decides `regrown_loss_blocks` (engine/overhead.py): a decoder layer's
    largest (`largest_layer_grad_bytes`) or, beside LoRA, a module trained in full (``--train-modules``,
    peft's modules_to_save copies, in `copy_dtype`), whichever is larger. The copies count since the H200
    modules grid (tests/data/measured/h200-modules.yaml): Qwen2.5 1.5B / 7B LoRA with both copies held
    0.8-1.6 GiB beyond the engine's reserve without them, and the 7B's nvidia-smi peak stood above the
    band's high edge."""
    copy = max(module_copy_sizes(a, setup), default=0) * nbytes(copy_dtype(regime))
    return max(largest_layer_grad_bytes(a, setup, regime), copy)


def tensor_shapes(a: DecoderArch, setup: LlmSetup) -> list[tuple[Shape, int]]:
    """Trainable tensors as (shape, how many) for the optimizer table: vectors are 1-D."""
    return [((rows, cols) if cols > 1 else (rows,), k) for rows, cols, k in trainable_shapes(a, setup)]


def _param_bytes(setup: LlmSetup, regime: Regime) -> int:
    return nbytes(regime.adapter_dtype if setup.method != "full" else regime.trainable_dtype)


def optimizer_state_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Optimizer states for every trainable tensor (`fitcheck.facts.optimizers`)."""
    param_b = _param_bytes(setup, regime)
    # fp32 moments are the seeds' AdamW accounting; other optimizers keep states in the param dtype
    # (torch SGD momentum_buffer, lion-pytorch exp_avg, prodigyopt: zeros_like(p)).
    fp32_moments = regime.optimizer_state_dtype == "fp32" and setup.optimizer == "adamw"
    adapters = opt.state_bytes(setup.optimizer, tensor_shapes(a, setup), 4 if fp32_moments else param_b)
    return adapters + _copy_state_bytes(a, setup, regime)


def paged_optimizer_bytes(a: DecoderArch, setup: LlmSetup) -> int:
    """Optimizer states a bitsandbytes paged optimizer keeps in CUDA managed memory, outside PyTorch's
    allocator (`fitcheck.facts.optimizers.paged_state_bytes`); one process only: one GPU, or a device map
    (each parameter's states are prefetched to its own GPU, ``get_paged(..., device=p.device)``, and the map
    places the line with the trainable parameters, engine/devmap.py). The sharding engines shard the states
    as one line."""
    if setup.distributed and setup.strategy != "device-map":
        return 0
    return opt.paged_state_bytes(setup.optimizer, tensor_shapes(a, setup))


def _copy_state_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Optimizer states of ``modules_to_save`` copies (V x h matrices), in their own dtype."""
    mods = trained_modules(setup)
    if setup.method == "full" or not mods:
        return 0
    fp32_moments = regime.optimizer_state_dtype == "fp32" and setup.optimizer == "adamw"
    sb = 4 if fp32_moments else nbytes(copy_dtype(regime))
    return opt.state_bytes(setup.optimizer, [((a.vocab_size, a.hidden_size), len(mods))], sb)


def adam_impl(setup: LlmSetup, regime: Regime) -> opt.AdamImpl:
    """Which AdamW step the trainer runs: fused (hf, torchtune), a for-loop over fp32 moments of
    16-bit weights (generic), else torch's foreach default (as torch 2.0.x ran it: ``foreach_denom``)."""
    if regime.fused_optimizer:
        return "fused"
    if regime.optimizer_state_dtype == "fp32" and _param_bytes(setup, regime) != 4:
        return "loop-fp32"
    return "foreach-2.0" if regime.foreach_denom else "foreach"


def step_transient_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Temporaries alive inside ``optimizer.step()`` (`fitcheck.facts.optimizers.step_temporary_bytes`);
    with the optimizer in backward each step sees one parameter, the largest deciding.

    ``modules_to_save`` copies are in the same param group as the adapters, in their own dtype: foreach
    AdamW's ``_foreach_sqrt(exp_avg_sqs)`` copies every tensor of each dtype group and the previous
    group's list is still bound while the next is made (torch optim/adamw.py ``_multi_tensor_adamw``,
    ``_group_tensors_by_device_and_dtype``), so their temporaries add; the other steps hold one
    tensor's at a time, the largest deciding. torch 2.0.x's foreach step holds two lists per group
    (`_foreach20_groups`)."""
    shapes = tensor_shapes(a, setup)
    if setup.optimizer_in_bwd and shapes:
        shapes = [(max(shapes, key=lambda sk: math.prod(sk[0]))[0], 1)]
    impl = adam_impl(setup, regime)
    own = opt.step_temporary_bytes(setup.optimizer, shapes, _param_bytes(setup, regime), impl)
    mods = trained_modules(setup) if setup.method != "full" else []
    if not mods:
        return own
    copies = [((a.vocab_size, a.hidden_size), len(mods))]
    theirs = opt.step_temporary_bytes(setup.optimizer, copies, nbytes(copy_dtype(regime)), impl)
    if setup.optimizer == "adamw" and impl == "foreach-2.0":
        one_group = copy_dtype(regime) == (
            regime.adapter_dtype if setup.method != "full" else regime.trainable_dtype
        )
        return _foreach20_groups(own, theirs, one_group)
    return own + theirs if setup.optimizer == "adamw" and impl == "foreach" else max(own, theirs)


def _foreach20_groups(own: int, theirs: int, one_group: bool) -> int:
    """torch 2.0.x foreach AdamW over the adapters' and the copies' dtype groups, each term already the
    group's two lists (``exp_avg_sq_sqrt`` and ``denom``): one dtype is one group, both lists of all
    tensors at once; two groups run in turn, and the first group's two lists are still bound when the
    second's ``sqrt`` and then its ``denom`` are made, so the peak is both groups' single lists plus the
    larger one's second (``SRC_FOREACH_20`` in engine/regimes.py)."""
    if one_group:
        return own + theirs
    return (own + theirs) // 2 + max(own, theirs) // 2


def quantized_head_params(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Output-layer (and embedding) parameters stored in 4 bits: litgpt's BitsandbytesPrecision replaces
    every nn.Linear, the output layer included (``Regime.quantized_lm_head``); mlx-lm's converted models
    store the embedding in 4 bits too (``Regime.quantized_embedding``)."""
    if setup.method != "qlora":
        return 0
    inv = inventory(a)
    return (inv.lm_head if regime.quantized_lm_head else 0) + (
        inv.embedding if regime.quantized_embedding else 0
    )


def castback_params(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Non-quantized parameters TRL 0.9-0.25 casts back to bf16 after k-bit preparation
    (``Regime.kbit_norms_fp32``): the modules named embed_tokens / wte, wpe and lm_head (trl v0.13.0
    trainer/utils.py ``peft_module_casting_to_bf16``); every other one (norms, biases) stays fp32."""
    if not regime.kbit_norms_fp32:
        return 0
    inv = inventory(a)
    head = 0 if quantized_head_params(a, setup, regime) else inv.lm_head
    return inv.embedding + inv.positions + head


def weight_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, c: Counts) -> dict[str, int]:
    """Resident weights by kind: base (dense or 4-bit), the layers left unquantized, adapters."""
    if setup.method == "full":
        return {"weights": c.trainable * nbytes(regime.trainable_dtype)}
    out: dict[str, int] = {}
    base = c.base
    if quantized_base(setup):
        head = quantized_head_params(a, setup, regime)
        if setup.method == "qlora":
            out["weights_4bit"] = nf4_bytes(
                c.quantized + head, c.quantized_tensors + (head > 0), setup.double_quant, regime
            )
        else:
            out["weights_quantized"] = quantized_bytes(a, setup)
        dense = base - c.quantized - head
        dense_dtype = "fp32" if regime.kbit_upcast or regime.kbit_norms_fp32 else regime.weight_dtype
        back = castback_params(a, setup, regime)
        out["weights_unquantized"] = (dense - back) * nbytes(dense_dtype) + back * nbytes(regime.weight_dtype)
    else:
        out["weights_frozen"] = base * nbytes(regime.weight_dtype)
    out["adapters"] = c.adapter * nbytes(regime.adapter_dtype)
    if c.module_copies:
        out["module_copies"] = c.module_copies * nbytes(copy_dtype(regime))
    return out


def grad_bytes(setup: LlmSetup, regime: Regime, c: Counts, a: DecoderArch | None = None) -> int:
    """Gradients: one per trainable parameter in its dtype; accumulation adds nothing. With the optimizer
    in backward (``optimizer_in_bwd``, full fine-tuning) a parameter's step runs from its post-accumulate-
    grad hook and frees its gradient, so one gradient exists at a time: the largest parameter's bounds it."""
    if setup.optimizer_in_bwd and a is not None:
        largest = max((math.prod(shape) for shape, _ in tensor_shapes(a, setup)), default=0)
        return largest * int(BYTES[regime.grad_dtype])
    copies = c.module_copies * nbytes(copy_dtype(regime))
    return (c.trainable - c.module_copies) * int(BYTES[regime.grad_dtype]) + copies


def master_bytes(regime: Regime, c: Counts) -> int:
    """fp32 master copy of the trainable weights when the regime keeps one."""
    return 4 * c.trainable if regime.master_weights else 0


def head_grad_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """The output layer's weight gradient, made by the loss backward before any layer's backward.

    Full fine-tuning only (LoRA leaves lm_head frozen unless it is targeted); a tied head's gradient
    is the embedding's.
    """
    inv = inventory(a)
    if setup.method != "full":
        trained = "lm_head" in trained_modules(setup)
        return (inv.lm_head or inv.embedding) * nbytes(copy_dtype(regime)) if trained else 0
    return (inv.lm_head or inv.embedding) * int(BYTES[regime.grad_dtype])
