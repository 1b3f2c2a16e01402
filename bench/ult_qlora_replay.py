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


def _quantize(model: nn.Module) -> None:
    for module in list(model.model.layers.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                emulated = q.EmulatedLinear4bit(child.in_features, child.out_features, torch.bfloat16)
                setattr(module, name, emulated)


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
    out = model(input_ids=ids)
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
    traced, base, events = q.step_events(hf_config, setup, reentrant=True, holds=False)
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
    for record_id in argv or ROWS:
        print(row(record_id), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
