"""Quantized bases under LoRA: bytes of the packed projections, per storage format.

QLoRA's NF4 lives in ``states.nf4_bytes``; this module holds the other bases real configs train LoRA
on (``--base-quant``), one row per format with the layout its kernels store (docs/methodology.md,
"Quantized bases"):

=====  ===========================================================================================
int8   bitsandbytes LLM.int8 ``Linear8bitLt`` (has_fp16_weights=False): ``CB`` int8 (1 B per weight)
       and ``SCB``, one fp32 absmax per output row (bitsandbytes nn/modules.py ``Int8Params``)
gptq   AutoGPTQ / GPTQModel ``QuantLinear`` at 4 bits, group 128: ``qweight`` int32 packing 8 weights,
       ``qzeros`` (4 bits per group and output), ``scales`` fp16 per group and output, ``g_idx`` int32
       per input row
gptq-  AutoGPTQ ``QuantLinear`` at 8 bits, group 128 (auto_gptq 0.5.1 ``qlinear_cuda_old.py`` and
int8   ``qlinear_cuda.py``): ``qweight`` int32 (in // 32 * 8, out), 4 weights per int32; ``qzeros`` int32
       (groups, out // 32 * 8), one byte per group and output; ``scales`` fp16 (groups, out); ``g_idx``
       int32 per input row
awq    AutoAWQ ``WQLinear_GEMM`` at 4 bits, group 128: ``qweight``, ``qzeros`` and fp16 ``scales`` as
       GPTQ, no ``g_idx``
=====  ===========================================================================================

An 8-bit GPTQ projection is dequantized on every training matmul: with 128 or more input rows (the
``kernel_switch_threshold`` default) ``QuantLinear.forward`` takes its torch path, not the CUDA kernel
(auto_gptq 0.5.1 ``qlinear_cuda_old.py`` lines 232-273): ``bitwise_right_shift`` of ``qweight`` expanded
to one int32 per weight, cast to int16, ``bitwise_and``, ``weight - zeros`` (int16) and ``scales * ...``
(fp16), then ``torch.matmul(x, weight)``. `DEQUANT_BYTES` holds the bytes alive at once per weight.
"""

from __future__ import annotations

from functools import lru_cache

from fitcheck.engine.params import Linear, layer_kinds
from fitcheck.models import DecoderArch, LlmSetup

#: Group size of the 4-bit GPTQ / AWQ checkpoints users train on (the AutoGPTQ / AutoAWQ default).
GROUP = 128


#: Bytes per weight alive while one projection is dequantized, per format with a rule of its own
#: (the others: one copy in the compute dtype, ``estimate._dequant``). gptq-int8: the int32 shift result
#: (4) beside its int16 cast (2); later the int16 weight, the int16 difference and the fp16 product (6).
DEQUANT_BYTES: dict[str, int] = {"gptq-int8": 6}

#: Bases whose MoE experts are quantized ``Linear`` modules, one per expert and projection, not
#: transformers 5's fused 3-D ``gate_up_proj`` / ``down_proj`` parameters. A GPTQ or AWQ checkpoint
#: stores each expert as its own packed ``QuantLinear`` / ``WQLinear_GEMM`` (``qweight``, ``qzeros``,
#: ``scales`` under ``experts.<i>.gate_proj``; the fixture tests/data/prequant/gptqmodel-issue), and
#: those kernels have no 3-D form: transformers 5.24 replaces only 2-D layers for them
#: (quantizers/quantizer_gptq.py -> optimum ``GPTQQuantizer.convert_model``, which swaps ``nn.Linear``
#: / ``Conv1D``; quantizers/quantizer_awq.py -> integrations ``replace_with_awq_linear``), so a working
#: run holds per-expert quantized modules, which peft wraps one by one (peft tuners/lora/gptq.py
#: ``GPTQLoraLinear``, tuners/lora/awq.py), never through ``lora.ParamWrapper``: no merged expert copy.
#: bitsandbytes (4- and 8-bit) is not here: ``replace_with_bnb_linear`` (integrations/bitsandbytes.py,
#: transformers 5.24) swaps ``nn.Linear`` only and ``param_needs_quantization`` asks for a
#: ``Linear4bit``, so the fused experts stay 16-bit parameters that peft adapts through ``ParamWrapper``.
PER_EXPERT_MODULES: frozenset[str] = frozenset({"gptq", "gptq-int8", "awq"})

#: MoE types whose transformers 4.x classes already held the experts as 3-D parameters, so
#: ``--moe-layout per-expert`` changes nothing for them: ``GraniteMoeParallelExperts`` (a 3-D ``weight``),
#: ``Llama4TextExperts``, ``GptOssExperts`` and ``Qwen3VLMoeTextExperts`` (3-D ``gate_up_proj`` /
#: ``down_proj``; transformers 4.57 models/<type>/modeling_<type>.py). The other MoE types fitcheck reads
#: (Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, Phi-3.5-MoE, ...) held an ``nn.ModuleList`` of per-expert
#: MLPs of ``nn.Linear`` until transformers 5 fused them (bitsandbytes issue #1849, 2026-01-25).
FUSED_IN_V4: frozenset[str] = frozenset(
    {"granitemoe", "granitemoeshared", "llama4", "llama4_text", "gpt_oss"}
    | {"qwen3_vl_moe", "qwen3_vl_moe_text"}
)

#: Trainers that load the model through transformers' own classes and bitsandbytes integration, so the
#: MoE layout (``--moe-layout``) decides what bitsandbytes quantizes. litgpt, torchtune and mlx build
#: their own modules; unsloth patches the fused experts itself (`UNSLOTH_EXPERTS_4BIT`).
TRANSFORMERS_TRAINERS: frozenset[str] = frozenset({"generic", "hf", "axolotl", "llamafactory"})

#: Unsloth under transformers 5 quantizes the fused experts itself: unsloth-zoo PR #527 (merged, "Add
#: Bnb4bit support for MoE models on transformers v5", closing unsloth issue #4032 on 2026-06-18: "This
#: should be supported now") turns the 3-D expert parameters into ``Params4bit`` and dequantizes them for
#: its grouped-mm forward (unsloth-zoo PR #809, 2026-06-20: qwen3_moe, glm4_moe, deepseek_v3, gemma4 wired,
#: lfm2_moe and ernie4_5_moe added); PR #856 (2026-07-03) loads pre-quantized ``-bnb-4bit`` MoE repos
#: (per-expert packed tensors) into the same stacked ``Params4bit``. Its "Split LoRA" computes the
#: experts' adapters without materializing ``W + BA`` (unsloth.ai/docs/basics/faster-moe), so no merged
#: copy. Unsloth's own Qwen3.5 guide still advises against MoE QLoRA "due to BitsandBytes limitations",
#: so the estimate says so.
UNSLOTH_EXPERTS_4BIT = "unsloth-zoo PRs #527 / #809 / #856"


def is_fused_expert(lin: Linear) -> bool:
    """A routed-expert projection that transformers 5 stores as one 3-D parameter."""
    return lin.role == "expert" and not lin.is_module


def expert_modules(a: DecoderArch, setup: LlmSetup) -> bool:
    """The routed experts are per-expert modules: a GPTQ / AWQ base (`PER_EXPERT_MODULES`), or
    ``--moe-layout per-expert`` (transformers 4.x) on a type whose 4.x class was a list of ``nn.Linear``
    MLPs (not `FUSED_IN_V4`) under a trainer that uses transformers' classes. Then peft wraps every
    expert's projections one by one and keeps no merged copy, and bitsandbytes quantizes them."""
    if not a.is_moe:
        return False
    if setup.base_quant in PER_EXPERT_MODULES:
        return True
    return (
        setup.moe_layout == "per-expert"
        and a.model_type not in FUSED_IN_V4
        and setup.trainer in TRANSFORMERS_TRAINERS
    )


def experts_unquantized(a: DecoderArch, setup: LlmSetup) -> bool:
    """bitsandbytes (QLoRA's NF4 or ``--base-quant int8``) leaves the routed experts in the compute
    dtype: transformers 5's fused 3-D parameters under a trainer that uses transformers' own
    ``replace_with_bnb_linear``, which swaps ``nn.Linear`` only (bitsandbytes issue #1849, open; the
    ``Experts4bit`` module of PRs #1965 / #1984 is not released). Unsloth quantizes them itself
    (`UNSLOTH_EXPERTS_4BIT`); litgpt, torchtune and mlx hold their own modules."""
    bnb = setup.method == "qlora" or (setup.method == "lora" and setup.base_quant == "int8")
    return bnb and a.is_moe and setup.trainer in TRANSFORMERS_TRAINERS and not expert_modules(a, setup)


def quantized_linear(a: DecoderArch, setup: LlmSetup, lin: Linear) -> bool:
    """Whether the (quantized) base stores this projection quantized: every projection but the router,
    and but the fused experts bitsandbytes leaves alone (`experts_unquantized`)."""
    if lin.role == "router":
        return False
    return not (lin.role == "expert" and experts_unquantized(a, setup))


def packed_weight_bytes(fmt: str, d_in: int, d_out: int) -> float:
    """Bytes of the packed weight tensor alone (``CB`` / ``qweight``): one byte per weight at 8 bits,
    half a byte at 4."""
    return d_in * d_out if fmt in ("int8", "gptq-int8") else d_in * d_out / 2


def groups_of(d_in: int, group: int) -> int:
    """Quantization groups along a projection's input rows: ``ceil(d_in / group_size)``; ``group_size``
    -1 is per-channel, one group over all rows (AutoGPTQ / GPTQModel ``QuantLinear``:
    ``self.group_size = group_size if group_size != -1 else infeatures``; ``qzeros`` and ``scales`` have
    ``ceil(infeatures / group_size)`` rows)."""
    return 1 if group < 1 else -(-d_in // group)


def _tensor_bytes(fmt: str, d_in: int, d_out: int, group: int = GROUP) -> float:
    weight = packed_weight_bytes(fmt, d_in, d_out)
    if fmt == "int8":
        return weight + 4 * d_out
    groups = groups_of(d_in, group)
    if fmt == "gptq-int8":
        return weight + groups * d_out * (2 + 1) + 4 * d_in
    return weight + groups * d_out * (2 + 0.5) + (4 * d_in if fmt == "gptq" else 0)


def quantized_bytes(a: DecoderArch, setup: LlmSetup) -> int:
    """Bytes of every projection inside the model's layers (every stack) stored in ``setup.base_quant`` at
    ``setup.quant_group`` rows per group: the ones the base quantizes (`quantized_linear`), less the
    layers' copies a checkpoint's skip list keeps unquantized (`kept_layers`)."""
    kept = kept_layers(a, setup.quant_skip) if setup.quant_skip else {}
    total = 0.0
    fmt, group = setup.base_quant, setup.quant_group
    for index, kind in enumerate(layer_kinds(a)):
        for lin in kind.linears(a):
            if quantized_linear(a, setup, lin):
                n = kind.count - kept.get((index, lin.name), 0)
                total += n * lin.copies * _tensor_bytes(fmt, lin.d_in, lin.d_out, group)
    return round(total)


def skips(pattern: str, name: str) -> bool:
    """Whether one ``llm_int8_skip_modules`` / ``modules_to_not_convert`` entry keeps a module unquantized:
    transformers 5.24.0 ``should_convert_module`` (quantizers/quantizers_utils.py lines 26-37) skips a
    module whose full name the entry matches from the start up to a module boundary (``model.layers.1``:
    layer 1, not 11) or ends with (``down_proj``, ``mlp.down_proj``: every layer's). The entry is taken
    literally (transformers also reads it as a regular expression; real lists name modules)."""
    return name == pattern or name.startswith(pattern + ".") or name.endswith(pattern)


def _full_name(stack: str, index: int, lin: Linear) -> str:
    """A projection's module name as a Llama-layout transformers model names it (``model.layers.3.mlp.
    down_proj``): attention under ``self_attn``, the MLP, experts and shared expert under ``mlp``."""
    root = "model.encoder.layers" if stack == "encoder" else "model.layers"
    return f"{root}.{index}.{'self_attn' if lin.role == 'attn' else 'mlp'}.{lin.name}"


@lru_cache(maxsize=64)
def kept_layers(a: DecoderArch, skip: str) -> dict[tuple[int, str], int]:
    """Per (index in `layer_kinds`, projection name): how many layers' copies of it a checkpoint's skip list
    (comma-joined entries, `skips`) keeps unquantized. Decoder layers are numbered dense kind first, then
    MoE (DeepSeek's ``first_k_dense_replace`` order; a layer-numbered entry on a model that interleaves them
    counts the same number of layers)."""
    patterns = [p for p in skip.split(",") if p]
    out: dict[tuple[int, str], int] = {}
    start = 0
    for index, kind in enumerate(layer_kinds(a)):
        first = start if kind.stack == "decoder" else 0
        for lin in kind.linears(a):
            names = (_full_name(kind.stack, i, lin) for i in range(first, first + kind.count))
            n = sum(1 for name in names if any(skips(p, name) for p in patterns))
            if n:
                out[(index, lin.name)] = n
        start += kind.count if kind.stack == "decoder" else 0
    return out
