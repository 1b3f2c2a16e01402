"""QLoRA's 4-bit NF4 base, per implementation: bytes stored, bytes while a weight is dequantized or quantized.

Two libraries store NF4 differently and, above all, dequantize differently (docs/methodology.md,
"NF4 formats"):

===========  ==========================================================================================
bitsandbytes ``Params4bit`` (functional.py ``quantize_4bit`` / ``dequantize_4bit``): packed data, one
             absmax per 64 weights (fp32, or uint8 with double quantization, whose own absmax is fp32
             per 256 blocks), per-tensor code tables; a CUDA kernel writes the dequantized weight in
             the compute dtype (the only transient, ``g`` bytes per weight).
torchao      ``NF4Tensor`` (torchao/dtypes/nf4tensor.py @v0.5.0, the torchao of torchtune's 2024
             recipes; unchanged in the 2026 quantize_/workflows/nf4/nf4_tensor.py): ``to_nf4`` always
             double-quantizes: ``quantized_data`` uint8 (two weights a byte), ``quantized_scalers``
             int8 per 64-weight block, ``quantization_factor`` per 256 blocks and ``scaler_mean`` in
             the weight's dtype, a 16-entry ``nf4`` table in that dtype. ``get_original_weight``
             dequantizes in Python ops: two int64 index tensors over half the weights each
             (``(quantized_data >> 4).to(torch.long)``), two lookups and two scaled halves in the
             dtype, then ``torch.stack`` into the full weight, all alive at the stack.
             ``LinearNF4`` saves the NF4 weight (not the dequantized one) for backward and
             dequantizes again there (``grad_output @ weight.to(grad_output.dtype)``).
mlx          MLX's affine 4-bit (``mx.quantize``, what ``mlx_lm.convert -q`` writes: group 64, mlx-lm
             utils.py ``quantize_model`` @v0.31.3): packed uint32 words (eight weights each), a scale and a
             bias per 64 weights in the model's dtype. ``nn.QuantizedLinear`` runs ``mx.quantized_matmul``,
             whose gradient with respect to its input is another quantized matmul (mlx primitives.cpp
             ``QuantizedMatmul::vjp``): no weight is ever dequantized whole; ``QuantizedEmbedding``
             dequantizes only the rows it gathers.
===========  ==========================================================================================
"""

from __future__ import annotations

from typing import Literal

Nf4Format = Literal["bitsandbytes", "torchao", "mlx"]

#: Weights per absmax block (both libraries) and blocks per second-level block (double quantization).
NF4_BLOCK = 64
DQ_BLOCK = 256
#: bitsandbytes: the 16-entry NF4 code (fp32); the 8-bit dynamic code of the second level plus its offset.
NF4_TENSOR_CONST = 16 * 4
DQ_TENSOR_CONST = 256 * 4 + 4
#: torchao ``get_original_weight``: two int64 index tensors, each over half the weights (bytes per weight).
TORCHAO_INDEX_BYTES = 2 * 8 // 2
#: torchao ``convert_to_norm_float_weight`` finds the nearest code value ``CHUNK_SIZE = 1024**2`` weights
#: at a time (since torchao 0.2, pytorch/ao#196): ``(value - nf4).abs()`` holds two (chunk, 16) tensors.
TORCHAO_CHUNK = 1024**2
#: MLX affine quantization's group size, ``mlx_lm.convert``'s default (``q_group_size`` 64).
MLX_GROUP = 64
TORCHAO_CODES = 16


def stored_bytes(fmt: Nf4Format, numel: int, tensors: int, double_quant: bool, dtype_bytes: int) -> int:
    """Packed 4-bit weights plus their quantization constants. ``dtype_bytes``: the weight's dtype before
    quantization (torchao keeps its factors, mean and code table in it); torchao always double-quantizes."""
    packed = numel // 2
    blocks = -(-numel // NF4_BLOCK)
    scaler_blocks = -(-blocks // DQ_BLOCK)
    if fmt == "mlx":
        return packed + 2 * dtype_bytes * -(-numel // MLX_GROUP)  # a scale and a bias per group
    if fmt == "torchao":
        per_tensor = (TORCHAO_CODES + 1) * dtype_bytes  # the nf4 table and scaler_mean
        return packed + blocks + dtype_bytes * scaler_blocks + tensors * per_tensor
    if double_quant:
        return packed + blocks + 4 * scaler_blocks + tensors * (DQ_TENSOR_CONST + NF4_TENSOR_CONST)
    return packed + 4 * blocks + tensors * NF4_TENSOR_CONST


def dequant_bytes(fmt: Nf4Format, numel: int, compute_bytes: int) -> int:
    """Bytes alive while one weight of ``numel`` elements is dequantized for its matmul (forward or
    backward): bitsandbytes writes the weight once; torchao holds the int64 indices, the two looked-up
    halves, the two scaled halves and the stacked weight together (``get_original_weight``); MLX's
    quantized matmul dequantizes nothing whole."""
    if fmt == "mlx":
        return 0
    if fmt == "torchao":
        return numel * (TORCHAO_INDEX_BYTES + 3 * compute_bytes)
    return numel * compute_bytes


def quantize_bytes(fmt: Nf4Format, numel: int, dtype_bytes: int) -> int | None:
    """Bytes alive while torchao's ``to_nf4`` quantizes one 16-bit weight on the device, the weight
    included; None for bitsandbytes (its loader's own rule, `fitcheck.engine.load`).

    ``from_tensor`` holds the weight, ``scaled_blocks`` (its dtype) and ``quantized_blocks`` (uint8, one
    per weight) through the chunk loop, whose two (chunk, 16) tensors come on top; the packing
    (``quantized_blocks[::2] << 4 | quantized_blocks[1::2]``) then adds half a byte twice.
    """
    if fmt == "mlx":
        return 0  # mlx-lm loads a converted model's packed arrays as they are stored
    if fmt != "torchao":
        return None
    held = numel * (2 * dtype_bytes + 1)
    chunk = 2 * min(numel, TORCHAO_CHUNK) * TORCHAO_CODES * dtype_bytes
    return max(held + chunk, held + numel)
