"""litgpt's own memory rules: what its model code, Lightning Fabric and its pinned bitsandbytes hold that
the transformers layout the activation rules follow does not (docs/methodology.md, "Trainers: litgpt and
Unsloth").

Each rule was read in the code at the commits the published litgpt records cite (litgpt 00af8b0d for the
config hub, 8641822 for the resource tables; lightning 2.4.0 and 71aed751, their pins; bitsandbytes
0.42.0). The loss kernels for litgpt's two training loops live in ``engine/loss.py`` with the others.

=====================  ==================================================================================
fused qkv kept (MHA)   ``CausalSelfAttention.forward`` (litgpt/model.py): with as many query groups as
                       heads, ``v.reshape(B, -1, T, hs)`` merges a size-1 dimension and is a *view* of the
                       fused ``qkv`` output (grouped models ``expand`` first, so their reshape copies); the
                       attention kernel saves ``v``, so the whole ``qkv`` storage stays alive
pad source (LoRA)      ``LoRAQKVLinear.zero_pad`` (litgpt/lora.py): when LoRA adapts some but not all of
                       q, k, v, the adapter output is scattered into zeros with ``index_copy_``, whose
                       backward keeps its ``source`` (torch derivatives.yaml ``index_copy``:
                       ``grad.index_select(dim, index).expand_as(source)``): the adapted q/v widths per token
fp16 quant state       lightning ``BitsandbytesPrecision`` quantizes ``weight.to(dtype=torch.half)``
                       (fabric/plugins/precision/bitsandbytes.py ``_Linear4bit.quantize``), so the
                       ``QuantState`` dtype is fp16 (bitsandbytes functional.py ``quantize_4bit``);
                       ``dequantize_4bit`` allocates its output in that dtype and ``MatMul4Bit`` casts it
                       ``.to(A.dtype)`` in forward and backward (autograd/_functions.py @0.42.0): under
                       bf16-true both copies of the weight exist at once
=====================  ==================================================================================
"""

from __future__ import annotations

from fitcheck.engine.lora import targeted
from fitcheck.engine.params import Linear
from fitcheck.facts.dtypes import nbytes
from fitcheck.models import DecoderArch, LlmSetup

#: Trainers that run litgpt's model code (``CausalSelfAttention``, ``LoRAQKVLinear``).
LITGPT_MODEL_TRAINERS = ("litgpt",)
#: Trainers whose 4-bit weights carry an fp16 quant state (lightning ``BitsandbytesPrecision``).
FP16_QUANT_STATE_TRAINERS = ("litgpt",)
#: The dtype lightning quantizes from (``_Linear4bit.quantize``: ``.to(device=device, dtype=torch.half)``).
QUANT_STATE_DTYPE = "fp16"


def fused_qkv_kept_bytes(a: DecoderArch, setup: LlmSetup, gamma: int) -> int:
    """Bytes per token the fused qkv output adds beyond the ``v`` the kernel is counted as saving.

    Multi-head models only: ``v`` is a view of ``qkv``, so q's and k's slices of it stay alive too.
    """
    if setup.trainer not in LITGPT_MODEL_TRAINERS or a.num_kv_heads != a.num_heads:
        return 0
    return gamma * (a.num_heads + a.num_kv_heads) * a.head_dim


def pad_source_bytes(a: DecoderArch, setup: LlmSetup, qkv: list[Linear], adapter: int) -> int:
    """Bytes per token ``index_copy_`` keeps when LoRA adapts only some of q, k and v (``zero_pad``).

    ``qkv``: the layer's query/key/value projections (one fused projection counts as all three).
    """
    if setup.trainer not in LITGPT_MODEL_TRAINERS or setup.method == "full":
        return 0
    hit = [x for x in qkv if targeted(a, setup.lora_targets, x)]
    if not hit or len(hit) == len(qkv):
        return 0
    return adapter * sum(x.d_out for x in hit)


def dequant_bytes_per_weight(setup: LlmSetup, gamma: int) -> int:
    """Bytes per element of a 4-bit weight while bitsandbytes dequantizes it for a matmul.

    One copy in the compute dtype; two (the fp16 dequantized tensor and its compute-dtype cast) where the
    quant state is fp16 and the compute dtype is not.
    """
    if setup.trainer in FP16_QUANT_STATE_TRAINERS and setup.precision != QUANT_STATE_DTYPE:
        return nbytes(QUANT_STATE_DTYPE) + gamma
    return gamma


def layer_extras(
    a: DecoderArch, setup: LlmSetup, qkv: list[Linear], gamma: int, adapter: int
) -> dict[str, int]:
    """litgpt's per-layer saved bytes per token beyond the transformers layout, by part name."""
    return {
        "fused_qkv_kept": fused_qkv_kept_bytes(a, setup, gamma),
        "lora_pad_source": pad_source_bytes(a, setup, qkv, adapter),
    }
