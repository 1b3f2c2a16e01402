"""What torch.compile saves for backward: AOTAutograd's partitioned forward graphs, recorded on the CPU.

torch.compile changes training memory in two ways: the min-cut rematerialization partitioner
(``functorch.compile.min_cut_rematerialization_partition``, the partitioner Inductor runs) decides which
forward tensors are saved for backward and recomputes cheap pointwise ones instead, and Inductor fuses
pointwise chains so their intermediates never exist. This script compiles one decoder layer (the
second of a two-layer model, so its input needs a gradient as a middle layer's does) and the loss with
a backend that runs Inductor's own decompositions and partition function (joint-graph passes included)
but records the graphs instead of generating kernels: the forward graph's outputs past the user
outputs are the saved tensors, with shape and dtype from ``node.meta["val"]``.

Cases: HF Llama, Qwen2, Mistral and Gemma 2 layers in bf16, full and LoRA (peft, all-linear, rank 16), each
without and under bf16 autocast,
compiled per layer as torchtune compiles its layers (training/_compile.py @30b8519e: ``m.compile()`` on
each ``TransformerSelfAttentionLayer`` before activation checkpointing wraps it, so a checkpointed run
recomputes with the same compiled forward and saves the same set); torchtune's chunked cross-entropy
step (``compute_cross_entropy``: ``F.cross_entropy(logits.float(), labels, reduction="sum")``, the only
part ``compile_loss`` compiles) and transformers' ``ForCausalLMLoss`` on bf16 logits (HF Trainer's
``torch_compile`` compiles the whole model, the loss with it); and a whole two-layer model compiled with
non-reentrant checkpointing (what the partitioner keeps when the checkpoint is inside the graph). For the
losses it also runs Inductor itself (CPU code generation) and records the buffers its generated code
allocates, forward and backward: what exists at all once the pointwise chain is fused.

    PYTHONPATH=src python bench/compile_trace.py   # writes tests/data/compile/partition.yaml (~2 min)

Needs the torch extra (torch, transformers, peft); no GPU. The partitioner's choices can change with the
torch version: the file records the versions used.
"""

from __future__ import annotations

import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "compile" / "partition.yaml"
BATCH, SEQ = 2, 40

#: Shrunken configs of the families fitcheck's tracer uses; widths distinct so each saved tensor's
#: width names it (hidden, q, kv, MLP width). Gemma 2 runs eager attention (soft-capping), as the engine
#: poses it (``uses_eager_scores``); the others SDPA.
ARCHS: dict[str, dict[str, Any]] = {
    "llama": {
        "model_type": "llama", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48, "vocab_size": 512,
        "tie_word_embeddings": False, "max_position_embeddings": 512,
    },
    "qwen2": {
        "model_type": "qwen2", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "tie_word_embeddings": True, "max_position_embeddings": 512, "use_sliding_window": False,
    },
    "mistral": {
        "model_type": "mistral", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48, "vocab_size": 512,
        "max_position_embeddings": 512, "sliding_window": None,
    },
    "gemma2": {
        "model_type": "gemma2", "hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 48, "vocab_size": 512,
        "query_pre_attn_scalar": 48, "sliding_window": 4096, "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0, "max_position_embeddings": 512,
    },
}  # fmt: skip
ATTN = {"gemma2": "eager"}
LORA_RANK = 16
#: ``full``: bf16 weights, no autocast (torchtune). ``lora``: LoRA with bf16 adapters, no autocast
#: (torchtune's LoRA). ``lora-autocast``: peft's fp32 adapters under bf16 autocast (HF Trainer, bf16=True).
#: ``full-autocast``: bf16 weights, all trained, under bf16 autocast (HF Trainer full fine-tuning, bf16=True).
METHODS = ("full", "full-autocast", "lora", "lora-autocast")
AUTOCAST_METHODS = ("full-autocast", "lora-autocast")


class Recorder:
    """A torch.compile backend: Inductor's decompositions and partitioner, graphs recorded, run eagerly."""

    def __init__(self) -> None:
        self.forward: list[Any] = []
        self.saved_counts: list[int] = []

    def backend(self) -> Callable[..., Any]:
        from functorch.compile import make_boxed_func
        from torch._dynamo.backends.common import aot_autograd
        from torch._inductor.compile_fx import partition_fn
        from torch._inductor.decomposition import select_decomp_table

        def fw(gm: Any, _inputs: Any) -> Any:
            self.forward.append(gm)
            return make_boxed_func(gm.forward)

        def bw(gm: Any, _inputs: Any) -> Any:
            names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
            self.saved_counts.append(sum(1 for n in names if not n.startswith("tangents")))
            return make_boxed_func(gm.forward)

        return aot_autograd(
            fw_compiler=fw, bw_compiler=bw, partition_fn=partition_fn, decompositions=select_decomp_table()
        )

    def saved(self) -> list[dict[str, Any]]:
        """The saved tensors of every recorded graph: name, op, shape, dtype, whether a graph input."""
        out: list[dict[str, Any]] = []
        for gm, n_saved in zip(self.forward, self.saved_counts, strict=True):
            (ret,) = [n for n in gm.graph.nodes if n.op == "output"]
            for node in list(ret.args[0])[len(ret.args[0]) - n_saved :]:
                val = node.meta.get("val")
                if val is None or not hasattr(val, "shape"):
                    continue
                out.append(
                    {
                        "name": node.name,
                        "op": "input" if node.op == "placeholder" else str(node.target),
                        "shape": [int(d) for d in val.shape],
                        "dtype": str(val.dtype).replace("torch.", ""),
                        "bytes": int(val.numel() * val.element_size()),
                    }
                )
        return out

    def forward_ops(self) -> list[str]:
        return sorted(
            {str(n.target) for gm in self.forward for n in gm.graph.nodes if n.op == "call_function"}
        )


def _model(arch: str, method: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = dict(ARCHS[arch])
    config = AutoConfig.for_model(**cfg)
    config._attn_implementation = ATTN.get(arch, "sdpa")
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if method.startswith("lora"):
        from peft import LoraConfig, get_peft_model

        lcfg = LoraConfig(r=LORA_RANK, lora_alpha=16, target_modules="all-linear", lora_dropout=0.0)
        model = get_peft_model(model, lcfg)
        if method == "lora":
            model = model.to(torch.bfloat16)  # torchtune's dtypes: adapters in the model's bf16
    model.train()
    return model


def _layers(model: Any) -> Any:
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    return inner.model.layers


def _tokens() -> Any:
    import torch

    torch.manual_seed(1)
    return torch.randint(0, 512, (BATCH, SEQ))


def _classify(t: dict[str, Any], arch: dict[str, Any]) -> str:
    """What a saved tensor is, for the per-token tally: a weight (or a cast copy of one: no token
    dimension), the rotary tables or the eager causal mask the model shares across layers, a
    ``b x heads x s x s`` score tensor, or a per-token activation."""
    shape = t["shape"]
    if len(shape) >= 2 and shape[-1] == SEQ and shape[-2] == SEQ:
        return "mask" if t["op"] == "input" else "scores"
    if SEQ not in shape and (not shape or shape[0] != BATCH * SEQ):
        return "weight"
    if shape[0] == 1:
        return "rotary"
    return "activation"


def _tally(saved: list[dict[str, Any]], arch: dict[str, Any]) -> dict[str, Any]:
    tokens = BATCH * SEQ
    per_token = 0.0
    scores = 0.0
    for t in saved:
        kind = _classify(t, arch)
        t["kind"] = kind
        if kind == "activation":
            per_token += t["bytes"] / tokens
        elif kind == "scores":
            scores += t["bytes"] / (tokens * SEQ)
    return {"bytes_per_token": per_token, "score_bytes_per_token_per_key": scores}


def trace_layer(arch: str, method: str) -> dict[str, Any]:
    """One decoder layer compiled on its own (torchtune's per-layer compile), forward and backward."""
    import torch

    model = _model(arch, method)
    rec = Recorder()
    layer = _layers(model)[1]
    layer.compile(backend=rec.backend(), dynamic=False)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=method in AUTOCAST_METHODS):
        out = model(input_ids=_tokens())
    out.logits.float().sum().backward()
    torch._dynamo.reset()
    saved = rec.saved()
    return {
        "id": f"{arch}-{method}-layer",
        "family": arch,
        "method": method,
        "what": "decoder layer 1 of 2, compiled per layer",
        "attn": ATTN.get(arch, "sdpa"),
        **_tally(saved, ARCHS[arch]),
        "saved": saved,
        "forward_ops": rec.forward_ops(),
    }


def trace_checkpointed_model(arch: str) -> dict[str, Any]:
    """The whole model compiled with non-reentrant checkpointing inside the graph (HF Trainer's
    ``torch_compile`` with ``gradient_checkpointing``): per layer the partitioner keeps the checkpoint."""
    import torch

    model = _model(arch, "full")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    rec = Recorder()
    compiled = torch.compile(model, backend=rec.backend(), dynamic=False)
    ids = _tokens()
    out = compiled(input_ids=ids, labels=ids)
    out.loss.backward()
    torch._dynamo.reset()
    saved = rec.saved()
    hidden = [t for t in saved if t["shape"][-1:] == [ARCHS[arch]["hidden_size"]] and len(t["shape"]) == 3]
    return {
        "id": f"{arch}-full-model-ckpt",
        "family": arch,
        "method": "full",
        "what": "whole 2-layer model + HF loss compiled, non-reentrant checkpointing on each layer",
        "attn": ATTN.get(arch, "sdpa"),
        "hidden_wide_saved": len(hidden),
        "saved": saved,
        "forward_ops": rec.forward_ops(),
    }


def _loss_inputs(vocab: int) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(2)
    logits = torch.randn(BATCH, SEQ, vocab, dtype=torch.bfloat16, requires_grad=True)
    return logits, torch.randint(0, vocab, (BATCH, SEQ))


def _loss_case(name: str, fn: Callable[..., Any], vocab: int) -> dict[str, Any]:
    import torch

    rec = Recorder()
    compiled = torch.compile(fn, backend=rec.backend(), dynamic=False)
    rows = BATCH * SEQ
    loss = compiled(*_loss_inputs(vocab))
    loss.backward()
    torch._dynamo.reset()
    saved = rec.saved()
    entries = rows * vocab
    logits_wide = sum(t["bytes"] for t in saved if t["shape"][-1:] == [vocab])
    return {
        "id": name,
        "what": f"loss on bf16 logits ({BATCH} x {SEQ} x {vocab})",
        "logits_wide_bytes_per_entry": logits_wide / entries,
        "row_bytes_per_token": sum(t["bytes"] for t in saved if t["shape"][-1:] != [vocab]) / rows,
        "saved": saved,
        "forward_ops": rec.forward_ops(),
    }


def inductor_buffers(fn: Callable[..., Any], *args: Any) -> dict[str, list[dict[str, Any]]]:
    """The buffers Inductor's generated code allocates (``empty_strided`` calls), forward and backward:
    what exists beside the graph's inputs when the compiled graphs run (CPU code generation)."""
    import re

    import torch
    from torch._inductor.utils import run_and_get_code

    compiled = torch.compile(fn, dynamic=False)

    def step() -> Any:
        out = compiled(*args)
        out.backward()
        return out

    _, codes = run_and_get_code(step)
    torch._dynamo.reset()
    pattern = r"empty_strided\w*\(\(([^)]*)\), \([^)]*\), torch\.(\w+)\)"
    out: dict[str, list[dict[str, Any]]] = {}
    for name, code in zip(("forward", "backward"), codes, strict=False):
        found = re.findall(pattern, code)
        out[name] = [
            {"shape": [int(d) for d in dims.split(",") if d.strip()], "dtype": dt} for dims, dt in found
        ]
    return out


def trace_losses() -> list[dict[str, Any]]:
    import torch.nn.functional as F
    from transformers.loss.loss_utils import ForCausalLMLoss

    vocab = 4096

    def torchtune_chunk(logits: Any, labels: Any) -> Any:
        # CEWithChunkedOutputLoss.compute_cross_entropy (torchtune modules/loss/ce_chunked_output_loss.py
        # @30b8519e), on one chunk flattened to (rows, vocab) as its forward does
        return F.cross_entropy(
            logits.reshape(-1, logits.size(-1)).float(),
            labels.reshape(-1),
            ignore_index=-100,
            reduction="sum",
        )

    def hf_loss(logits: Any, labels: Any) -> Any:
        return ForCausalLMLoss(logits, labels, vocab_size=vocab)

    cases = [("torchtune-chunk-ce", torchtune_chunk), ("hf-for-causal-lm-loss", hf_loss)]
    out = []
    for name, fn in cases:
        rec = _loss_case(name, fn, vocab)
        rec["inductor_buffers"] = inductor_buffers(fn, *_loss_inputs(vocab))
        out.append(rec)
    return out


#: A frozen NF4 projection (out x in) for the torchao case: torchtune's QLoRA base layers call
#: ``linear_nf4(x, weight)`` inside the compiled decoder layer (modules/peft/lora.py @30b8519e).
NF4_SHAPE = (704, 256)


def trace_nf4() -> list[dict[str, Any]]:
    """torchao's ``linear_nf4`` compiled: the partitioner's saved set and the buffers Inductor's generated
    code allocates (no record when torchao is not importable; its version is recorded when it is). torchao
    is not a fitcheck dependency: install it beside torch to regenerate this record."""
    try:
        import torchao
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import linear_nf4, to_nf4
    except ImportError:
        print("torchao not importable: no NF4 record", file=sys.stderr)
        return []
    import torch

    torch.manual_seed(3)
    weight = to_nf4(torch.randn(*NF4_SHAPE, dtype=torch.bfloat16))
    x = torch.randn(BATCH, SEQ, NF4_SHAPE[1], dtype=torch.bfloat16, requires_grad=True)

    def fn(x: Any) -> Any:
        return linear_nf4(x, weight).float().sum()

    rec = Recorder()
    torch.compile(fn, backend=rec.backend(), dynamic=False)(x).backward()
    torch._dynamo.reset()
    return [
        {
            "id": "torchao-linear-nf4",
            "what": f"linear_nf4, frozen {NF4_SHAPE[0]} x {NF4_SHAPE[1]} NF4 weight, input {BATCH} x {SEQ}",
            "torchao": str(torchao.__version__),
            "saved": rec.saved(),
            "inductor_buffers": inductor_buffers(fn, x),
        }
    ]


def versions() -> dict[str, str]:
    import peft
    import torch
    import transformers

    return {
        "torch": str(torch.__version__),
        "transformers": str(transformers.__version__),
        "peft": str(peft.__version__),
        "python": platform.python_version(),
    }


def main() -> int:
    records: list[dict[str, Any]] = []
    for arch in ARCHS:
        for method in METHODS:
            records.append(trace_layer(arch, method))
            print(records[-1]["id"], f"{records[-1]['bytes_per_token']:.1f} B/token", file=sys.stderr)
    records.append(trace_checkpointed_model("llama"))
    records.extend(trace_losses())
    records.extend(trace_nf4())
    doc = {
        "tool_versions": versions(),
        "device": "cpu (real bf16 tensors; Inductor's decompositions and partition_fn, graphs run eagerly)",
        "batch": BATCH,
        "seq_len": SEQ,
        "lora": {"rank": LORA_RANK, "targets": "all-linear", "dropout": 0.0},
        "methods": {
            "full": "bf16 weights, all trained, no autocast (torchtune)",
            "full-autocast": "bf16 weights, all trained, torch.autocast bf16 (HF Trainer bf16=True)",
            "lora": "peft LoRA, adapters cast to bf16, no autocast (torchtune's dtypes)",
            "lora-autocast": "peft LoRA, fp32 adapters, torch.autocast bf16 (HF Trainer bf16=True)",
        },
        "hf_configs": ARCHS,
        "attn": {a: ATTN.get(a, "sdpa") for a in ARCHS},
        "records": records,
    }
    header = (
        "# torch.compile partition traces: saved tensors of AOTAutograd's partitioned forward graphs.\n"
        "# Generated by bench/compile_trace.py; regenerate: PYTHONPATH=src python bench/compile_trace.py\n"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(header + yaml.safe_dump(doc, sort_keys=False, width=110), encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
