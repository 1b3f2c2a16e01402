"""universal-llm-trainer's QLoRA and LoRA rows traced by emulation, their step replayed through an allocator.

The rows (tests/data/published/universal-llm-trainer.yaml) run transformers' model under the trainer's own
loop: no autocast, ``nn.CrossEntropyLoss`` on ``output.logits[:, :-1, :].reshape(...)`` with the output
deleted in forward (src/models/phi3.py ``Phi3.forward``, del_logits_after_forward, @1aced26), Hugging Face
checkpointing (``enable_input_require_grads`` + ``gradient_checkpointing_enable()``, reentrant under
transformers 4.49), LoRA r8/alpha 16/dropout 0.05 on every linear. QLoRA (bit 4) loads every unquantized
tensor in fp32 (``torch_dtype=torch.float32`` for an int bit) with bitsandbytes NF4, compute dtype bf16
(config_quant/bnb_4bit.yaml), so the residual stream and the logits are fp32; LoRA loads bf16.

bitsandbytes cannot run on fake tensors: every decoder linear of a QLoRA row is bench/qlora2023_trace.py's
``EmulatedLinear4bit`` with a bf16 compute dtype and the >= 0.43.2 behaviour (the input is not kept;
bitsandbytes 0.45.0 is pinned at the runs' commits). The step is traced with fitcheck's tracer
(transformers and peft as installed here, SDPA, no attention mask: the runs' padded 4-D mask is left out)
and its second step's allocations and frees are replayed through bench/swift_loss.py's model of the CUDA
caching allocator (best fit, split and merge within segments, no release), beside the engine's figures for
the record as bench/published.py poses it.

    PYTHONPATH=src python bench/ult_qlora_replay.py                       # the eight rows below, ~3 min
    PYTHONPATH=src python bench/ult_qlora_replay.py phi-3-mini-qlora-a100
    PYTHONPATH=src python bench/ult_qlora_replay.py --stack               # with the runs' stack, ~4 min

``--stack`` adds what the runs' own stack does beyond that and transformers 5 does not: the dataset's
padded ``src_attention_mask`` (src/data_collection/qa_dataset.py ``_pad``/``get_mask``, kept under
``--gpu_test``) and transformers 4.49's SDPA mask from it, one ``b x 1 x s x s`` tensor in the residual
dtype shared by every layer, built with 4.49's ops (`mask_449`); 4.49's ``sdpa_attention_forward``
``.contiguous()`` on query, key and value; bitsandbytes 0.45.0's dequantization (fp32 absmax, the weight in
the quant_state's fp32, then its compute-dtype copy, in forward and backward: `MatMul4Bit045`); peft 0.14
``Linear4bit``'s ``result.clone()`` (`Linear4bit045`).
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

import torch
from torch import nn

sys.path.insert(0, "bench")
sys.path.insert(0, "tests")

import qlora2023_trace as q

from bench_helpers import bench_module

GIB = 2**30
_PHI3 = {
    "model_type": "phi3",
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "num_hidden_layers": 32,
    "vocab_size": 32064,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "pad_token_id": 0,
    "sliding_window": 262144,
}
_LLAMA = {
    "model_type": "llama",
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}
#: Shapes of the models the rows load (config.json of microsoft/Phi-3-mini-128k-instruct,
#: meta-llama/Llama-3.1-8B-Instruct, meta-llama/Llama-2-13b-hf, google/gemma-7b; the presets' numbers)
#: and the LoRA targets.
SHAPES: dict[str, tuple[dict[str, Any], list[str]]] = {
    "phi-3-mini": (_PHI3, ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
    "llama-3.1-8b": (
        {
            **_LLAMA,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "num_key_value_heads": 8,
            "vocab_size": 128256,
            "max_position_embeddings": 131072,
            "rope_theta": 500000.0,
        },
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    "llama-2-13b": (
        {
            **_LLAMA,
            "hidden_size": 5120,
            "intermediate_size": 13824,
            "num_attention_heads": 40,
            "num_key_value_heads": 40,
            "num_hidden_layers": 40,
            "vocab_size": 32000,
            "max_position_embeddings": 4096,
        },
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
    "gemma-7b": (
        {
            **_LLAMA,
            "model_type": "gemma",
            "hidden_size": 3072,
            "intermediate_size": 24576,
            "num_attention_heads": 16,
            "num_key_value_heads": 16,
            "head_dim": 256,
            "num_hidden_layers": 28,
            "vocab_size": 256000,
            "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True,
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_activation": "gelu_pytorch_tanh",
        },
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    ),
}
_MODELS = ("phi-3-mini", "llama-3.1-8b", "llama-2-13b", "gemma-7b")
ROWS = [f"{m}-{k}-a100" for m in _MODELS for k in ("qlora", "lora")]


class MatMul4Bit045(torch.autograd.Function):
    """bitsandbytes 0.45.0 ``MatMul4Bit`` as far as memory goes: ``F.dequantize_4bit(B, quant_state)``
    makes the double-quantized absmax in fp32 (``dequantize_blockwise``, one scale per 64 weights), then
    the weight in the quant_state's dtype (fp32: the rows load every tensor in fp32 before quantizing),
    and ``.to(A.dtype)`` copies it to the compute dtype; forward and backward alike; the input is not kept
    (``ctx.tensors = (None, B)``; bitsandbytes autograd/_functions.py @0.45.0)."""

    @staticmethod
    def forward(ctx: Any, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        out = nn.functional.linear(a, MatMul4Bit045.weight(b, shape, a.dtype))
        ctx.shape, ctx.b = shape, b
        return out

    @staticmethod
    def weight(b: torch.Tensor, shape: tuple[int, int], dtype: torch.dtype) -> torch.Tensor:
        absmax = b.new_empty((shape[0] * shape[1] // 64,), dtype=torch.float32)
        full = b.new_empty(shape, dtype=torch.float32)
        del absmax
        return full.to(dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None]:
        return torch.matmul(grad, MatMul4Bit045.weight(ctx.b, ctx.shape, grad.dtype)), None, None


class Linear4bit045(q.EmulatedLinear4bit):
    """``bnb.nn.Linear4bit.forward`` @0.45.0 (input cast to the compute dtype, output cast back) with
    peft 0.14's ``Linear4bit.forward`` ``result = result.clone()`` after the base layer (peft
    tuners/lora/bnb.py @v0.14.0: peft wraps this layer in its plain ``Linear`` here, which has no clone,
    so the base layer makes it: the pre-clone output dies as it returns, as in peft)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inp_dtype = x.dtype
        x = x.to(self.compute_dtype)
        out = MatMul4Bit045.apply(x, self.weight, (self.out_features, self.in_features))
        return out.to(inp_dtype).clone()


#: What ``--stack`` adds to the emulation (module docstring).
STACK = {"on": False}


def _quantize(model: nn.Module) -> None:
    cls = Linear4bit045 if STACK["on"] else q.EmulatedLinear4bit
    for module in list(model.model.layers.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                emulated = cls(child.in_features, child.out_features, torch.bfloat16)
                setattr(module, name, emulated)


def mask_449(
    config: Any, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, **_: Any
) -> torch.Tensor:
    """transformers 4.49's 4-D mask for SDPA from a padded 2-D ``attention_mask`` (Phi3Model and
    LlamaModel ``_update_causal_mask``, ``_prepare_4d_causal_attention_mask_with_cache_position``, then
    ``AttentionMaskConverter._unmask_unattended`` on CUDA): the same ops in the same order, in the
    residual stream's dtype (fp32 for the QLoRA rows). A batch with padding takes this path (the
    ``torch.all(attention_mask == 1)`` test fails), so the mask is one ``b x 1 x s x s`` tensor shared by
    every layer."""
    min_dtype = torch.finfo(inputs_embeds.dtype).min
    causal = _prepare_449(config, inputs_embeds, attention_mask, min_dtype)
    return causal.mul(~torch.all(causal == min_dtype, dim=-1, keepdim=True))


def _prepare_449(
    config: Any, inputs_embeds: torch.Tensor, attention_mask: torch.Tensor, min_dtype: float
) -> torch.Tensor:
    """4.49's ``_prepare_4d_causal_attention_mask_with_cache_position`` (its locals die as it returns)."""
    dtype, dev = inputs_embeds.dtype, inputs_embeds.device
    b, s = inputs_embeds.shape[:2]
    cache_position = torch.arange(s, device=dev)
    causal = torch.full((s, s), fill_value=min_dtype, dtype=dtype, device=dev)
    diagonal = torch.arange(s, device=dev) > cache_position.reshape(-1, 1)
    window = getattr(config, "sliding_window", None)
    if window is not None:
        diagonal.bitwise_or_(torch.arange(s, device=dev) <= (cache_position.reshape(-1, 1) - window))
    causal *= diagonal
    causal = causal[None, None, :, :].expand(b, 1, -1, -1)
    causal = causal.clone()
    padding = causal[:, :, :, :s] + attention_mask[:, None, None, :].to(dev)
    padding = padding == 0
    causal[:, :, :, :s] = causal[:, :, :, :s].masked_fill(padding, min_dtype)
    return causal


def _sdpa_449(
    module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any, **kw: Any
) -> Any:
    """transformers 4.49 ``sdpa_attention_forward`` makes ``query``, ``key`` and ``value`` contiguous
    (Phi-3's value is a view of the fused qkv output: its own copy, saved by the kernel)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(
        module, query.contiguous(), key.contiguous(), value.contiguous(), *args, **kw
    )


def stack_patches(model_type: str) -> Any:
    """Install the 4.49 mask and SDPA behaviour; returns an undo function."""
    import importlib

    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    mod = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    saved = {
        n: getattr(mod, n)
        for n in ("create_causal_mask", "create_sliding_window_causal_mask")
        if hasattr(mod, n)
    }
    for n in saved:
        setattr(mod, n, mask_449)
    sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"]
    ALL_ATTENTION_FUNCTIONS["sdpa"] = _sdpa_449

    def undo() -> None:
        for n, f in saved.items():
            setattr(mod, n, f)
        ALL_ATTENTION_FUNCTIONS["sdpa"] = sdpa

    return undo


def build(hf_config: dict[str, Any], targets: list[str], quantized: bool) -> Any:
    """The trainer's model: fp32 load with emulated 4-bit linears (QLoRA) or bf16 (LoRA), ckpt, LoRA."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from fitcheck.measure.build import Built, hf_config_object

    dtype = torch.float32 if quantized else torch.bfloat16
    model = AutoModelForCausalLM.from_config(
        hf_config_object(hf_config), dtype=dtype, attn_implementation="sdpa"
    )
    model.train()
    if quantized:
        _quantize(model)
    for p in model.parameters():
        p.requires_grad_(False)
    model.enable_input_require_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules=targets, task_type="CAUSAL_LM")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        peft_model = get_peft_model(model, cfg, autocast_adapter_dtype=True)
    return Built(model=peft_model, model_type=hf_config["model_type"], notes=["emulated"])


def trainer_loss(model: Any, ids: torch.Tensor, labels: torch.Tensor, held: Any = None) -> torch.Tensor:
    """src/models/phi3.py (and llama3.py, llama2.py) ``forward``: CE on the sliced logits, output deleted."""
    # --stack: the dataset's padded src_attention_mask (qa_dataset.py get_mask/_pad; --gpu_test keeps it)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids)) if STACK["on"] else model(input_ids=ids)
    logits = out.logits
    flat = logits[:, :-1, :].reshape(-1, logits.size(-1))
    loss = nn.CrossEntropyLoss()(flat, labels[:, 1:].reshape(-1))
    del out, logits, flat
    return loss


def row(record_id: str) -> str:
    """One row: measured, traced allocated peak, replayed reserved peak, the engine's (both with errors)."""
    import fitcheck.measure.step as step_mod

    pub = bench_module("published")
    rec = next(r for _, rs in pub.corpus().values() for r in rs if r.id == record_id)
    model = record_id.split("-qlora")[0].split("-lora")[0]
    hf_config, targets = SHAPES[model]
    quantized = "-qlora-" in record_id
    _, setup, _ = pub.pose(rec)
    q.EmulatedLinear4bit.holds_input = False
    q.build_emulated = lambda c, s, r, reentrant: build(c, targets, quantized)
    step_mod.model_loss = trainer_loss  # type: ignore[assignment]
    undo = stack_patches(hf_config["model_type"]) if STACK["on"] else (lambda: None)
    try:
        traced, base, events = q.step_events(hf_config, setup, reentrant=True, holds=False)
    finally:
        undo()
    alloc = q.replay(base, events, 2)
    score = pub.score(rec)
    est, meas = score.estimate, rec.measured_bytes
    peak = max(p.peak_bytes for p in traced.phases)
    return (
        f"{record_id}: measured {meas / GIB:.2f} GiB; traced allocated {peak / GIB:.2f}, replayed reserved "
        f"{alloc.peak_reserved / GIB:.2f} ({100 * (alloc.peak_reserved - meas) / meas:+.1f}%); engine "
        f"allocated {est.peak_allocated_bytes / GIB:.2f}, reserved {est.peak_reserved_bytes / GIB:.2f} "
        f"({100 * score.error:+.1f}%)"
    )


def main(argv: list[str]) -> int:
    if "--stack" in argv:
        STACK["on"] = True
        argv = [a for a in argv if a != "--stack"]
    for record_id in argv or ROWS:
        print(row(record_id), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
