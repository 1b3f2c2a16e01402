"""Model states: weights, adapters, gradients, optimizer states, master copy, step transients.

Every function returns bytes for the whole model on one device (data parallel: each GPU holds all
of it). Rules and sources: docs/methodology.md, "Model states".
"""

from __future__ import annotations

from dataclasses import dataclass

from fitcheck.engine.dtypes import BYTES, nbytes
from fitcheck.engine.lora import adapter_params
from fitcheck.engine.params import inventory, layer_linears
from fitcheck.models import DecoderArch, LlmSetup, Regime

#: bitsandbytes 4-bit: blocks of 64 weights share one absmax (fp32, or uint8 with double quantization,
#: whose own absmax is fp32 per 256 blocks); per-tensor code tables (functional.py quantize_4bit).
NF4_BLOCK = 64
DQ_BLOCK = 256
NF4_TENSOR_CONST = 16 * 4  # the 16-entry NF4 code (fp32)
DQ_TENSOR_CONST = 256 * 4 + 4  # the 8-bit dynamic code of the second level, plus its offset
#: bitsandbytes 8-bit optimizers: one uint8 per state element + an fp32 absmax per 256-element block;
#: tensors under 4096 elements keep 32-bit states (optim/optimizer.py, min_8bit_size).
BNB8_BLOCK = 256
BNB8_MIN_SIZE = 4096


@dataclass(frozen=True)
class Counts:
    """Parameter counts by role, for the setup's method."""

    total: int
    trainable: int
    adapter: int
    quantized: int
    quantized_tensors: int
    frozen_dense: int  # frozen parameters kept dense (not 4-bit)


def quantizable_tensors(a: DecoderArch) -> tuple[int, int]:
    """(parameters, tensors) that 4-bit quantization packs: the projections inside the layers."""
    moe_n = a.moe_layers if a.is_moe else 0
    numel = tensors = 0
    for n_layers, moe in ((a.num_layers - moe_n, False), (moe_n, True)):
        for lin in layer_linears(a, moe):
            if lin.role != "router":
                numel += n_layers * lin.copies * lin.d_in * lin.d_out
                tensors += n_layers
    return numel, tensors


def counts(a: DecoderArch, setup: LlmSetup) -> Counts:
    """How many parameters are trainable, adapters, 4-bit, frozen."""
    total = inventory(a).total
    adapters = adapter_params(a, setup) if setup.method != "full" else 0
    if setup.method == "qlora":
        q, qt = quantizable_tensors(a)
    else:
        q, qt = 0, 0
    trainable = total if setup.method == "full" else adapters
    frozen_dense = 0 if setup.method == "full" else total - q
    return Counts(total + adapters, trainable, adapters, q, qt, frozen_dense)


def nf4_bytes(numel: int, tensors: int, double_quant: bool) -> int:
    """Packed 4-bit weights plus their quantization constants."""
    packed = numel // 2
    blocks = -(-numel // NF4_BLOCK)
    if double_quant:
        consts = blocks + 4 * -(-blocks // DQ_BLOCK) + tensors * (DQ_TENSOR_CONST + NF4_TENSOR_CONST)
    else:
        consts = 4 * blocks + tensors * NF4_TENSOR_CONST
    return packed + consts


def optimizer_bytes_per_param(optimizer: str, state_dtype_bytes: int) -> float:
    """Optimizer state bytes per trainable parameter (dense tensors).

    Adafactor is handled separately (factored); 8-bit rules apply to tensors of 4096+ elements.
    """
    eight_bit = 1 + 4 / BNB8_BLOCK
    table = {
        "adamw": 2 * state_dtype_bytes,  # exp_avg, exp_avg_sq (torch.optim.AdamW zeros_like)
        "adamw8bit": 2 * eight_bit,
        "paged-adamw8bit": 2 * eight_bit,
        "lion": 1 * state_dtype_bytes,  # exp_avg only
        "lion8bit": 1 * eight_bit,
        "prodigy": 4 * state_dtype_bytes,  # exp_avg, exp_avg_sq, s, p0 (prodigyopt)
        "sgd": 1 * state_dtype_bytes,  # momentum buffer
    }
    return table[optimizer]


def trainable_shapes(a: DecoderArch, setup: LlmSetup) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of every trainable tensor; vectors have cols = 1."""
    if setup.method != "full":
        out: list[tuple[int, int, int]] = []
        moe_n = a.moe_layers if a.is_moe else 0
        from fitcheck.engine.lora import targeted

        for n_layers, moe in ((a.num_layers - moe_n, False), (moe_n, True)):
            for lin in layer_linears(a, moe):
                if n_layers and targeted(a, setup.lora_targets, lin):
                    # peft stores an expert parameter's factors as single tensors of rank r*E
                    k, r = n_layers, setup.lora_rank * lin.lora_factor * lin.copies
                    out += [(r, lin.d_in, k), (lin.d_out, r, k)]
                    if setup.dora:
                        out.append((lin.d_out, 1, k))
        return out
    inv = inventory(a)
    h = a.hidden_size
    out = [(a.vocab_size, h, 1)]
    if inv.lm_head:
        out.append((a.vocab_size, h, 1))
    if a.learned_positions:
        out.append((a.learned_positions, h, 1))
    moe_n = a.moe_layers if a.is_moe else 0
    for n_layers, moe in ((a.num_layers - moe_n, False), (moe_n, True)):
        for lin in layer_linears(a, moe):
            if n_layers:
                out.append((lin.d_out, lin.d_in, n_layers * lin.copies))
                if lin.bias:
                    out.append((lin.d_out, 1, n_layers * lin.copies))
    out.append((inv.norms, 1, 1))
    return out


def optimizer_state_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime) -> int:
    """Optimizer states for every trainable tensor."""
    param_b = nbytes(regime.adapter_dtype if setup.method != "full" else regime.trainable_dtype)
    # fp32 moments are the seeds' AdamW accounting; other optimizers keep states in the param dtype
    # (torch SGD momentum_buffer, lion-pytorch exp_avg, prodigyopt: zeros_like(p)).
    adam = setup.optimizer == "adamw"
    sb = 4 if regime.optimizer_state_dtype == "fp32" and adam else param_b
    total = 0.0
    for rows, cols, k in trainable_shapes(a, setup):
        n = rows * cols
        if setup.optimizer == "adafactor":
            # factored second moment for matrices (row + column vectors), full for vectors; no
            # first moment (transformers.optimization.Adafactor default beta1=None).
            total += k * 4 * ((rows + cols) if cols > 1 and rows > 1 else n)
        elif setup.optimizer in ("adamw8bit", "paged-adamw8bit", "lion8bit") and n < BNB8_MIN_SIZE:
            states = 1 if setup.optimizer == "lion8bit" else 2
            total += k * n * 4 * states
        else:
            total += k * n * optimizer_bytes_per_param(setup.optimizer, sb)
    return int(total)


def largest_trainable(a: DecoderArch, setup: LlmSetup) -> int:
    """Elements of the largest trainable tensor (sizes per-tensor optimizer temporaries)."""
    return max(rows * cols for rows, cols, _ in trainable_shapes(a, setup))


def step_transient_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, trainable: int) -> int:
    """Temporaries alive inside ``optimizer.step()``.

    foreach AdamW allocates ``_foreach_sqrt(exp_avg_sq)``: one full-size copy of the second moment
    (torch/optim/adamw.py, _multi_tensor_adamw). Fused AdamW and the 8-bit kernels update in place.
    The for-loop step of the generic regime (fp32 moments on 16-bit params) holds ``sqrt(v)`` and the
    update of one tensor at a time (traced: two fp32 tensors of the largest parameter's size).
    """
    param_b = nbytes(regime.trainable_dtype if setup.method == "full" else regime.adapter_dtype)
    if setup.optimizer == "sgd":
        return 0  # foreach SGD updates momentum and weights in place
    if setup.optimizer in ("lion", "prodigy"):
        return 2 * param_b * largest_trainable(a, setup)  # per-tensor update temporaries
    if setup.optimizer == "adamw":
        if regime.fused_optimizer:
            return 0
        if regime.optimizer_state_dtype == "fp32" and param_b != 4:
            # for-loop step on 16-bit params with fp32 moments: sqrt(v) and the update, one tensor at a time
            return 2 * 4 * largest_trainable(a, setup)
        return trainable * param_b
    if setup.optimizer == "adafactor":
        return 2 * 4 * largest_trainable(a, setup)  # update and its square, fp32, one tensor
    return 0


def weight_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, c: Counts) -> dict[str, int]:
    """Resident weights by kind: base (dense or 4-bit), the layers left unquantized, adapters."""
    if setup.method == "full":
        return {"weights": c.trainable * nbytes(regime.trainable_dtype)}
    out: dict[str, int] = {}
    base = c.total - c.adapter
    if setup.method == "qlora":
        out["weights_4bit"] = nf4_bytes(c.quantized, c.quantized_tensors, setup.double_quant)
        dense = base - c.quantized
        dense_dtype = "fp32" if regime.kbit_upcast else regime.weight_dtype
        out["weights_unquantized"] = dense * nbytes(dense_dtype)
    else:
        out["weights_frozen"] = base * nbytes(regime.weight_dtype)
    out["adapters"] = c.adapter * nbytes(regime.adapter_dtype)
    return out


def grad_bytes(setup: LlmSetup, regime: Regime, c: Counts) -> int:
    """Gradients: one per trainable parameter in its dtype; accumulation adds nothing."""
    return c.trainable * int(BYTES[regime.grad_dtype])


def master_bytes(regime: Regime, c: Counts) -> int:
    """fp32 master copy of the trainable weights when the regime keeps one."""
    return 4 * c.trainable if regime.master_weights else 0
