"""Generate the calibration records under tests/data/calibration/ (one YAML file per architecture).

Each record is one training setup of a small random-weight model of a real family, traced on fake
tensors (`fitcheck.measure.trace.trace_step`): the exact ``hf_config``, the `LlmSetup` fields,
the per-phase peaks with their breakdown and largest tensors, tool versions, device semantics, the
command that regenerates it, and ``split: fit|holdout`` (a hash of the record id and setup, fixed
up front, so engine rules can be checked on records they were not fitted on).

Run by hand (not in CI); needs the torch extra. The whole grid takes about two minutes on 2 cores:

    PYTHONPATH=src python bench/calibrate.py                 # all records
    PYTHONPATH=src python bench/calibrate.py --only llama3-05 # one record (rewrites its file entry)
    PYTHONPATH=src python bench/calibrate.py --report        # engine estimate vs records, by split
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "calibration"
TOP = 6

#: Shrunken configs of real families: few layers and a narrow hidden size, but the real vocabulary
#: (32000 / 128256 / 151936 / 256000 / 50257) so the logits hump weighs as it does in the full model.
ARCHS: dict[str, dict[str, Any]] = {
    "llama3": {
        "model_type": "llama", "hidden_size": 1024, "intermediate_size": 3584, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 128256,
        "tie_word_embeddings": False, "rope_theta": 500000.0, "max_position_embeddings": 8192,
    },
    "llama2": {
        "model_type": "llama", "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
        "num_attention_heads": 8, "num_key_value_heads": 8, "vocab_size": 32000,
        "tie_word_embeddings": False, "max_position_embeddings": 8192,
    },
    "qwen2": {
        "model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 2,
        "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
        "tie_word_embeddings": True, "max_position_embeddings": 32768, "use_sliding_window": False,
    },
    "gemma2": {
        "model_type": "gemma2", "hidden_size": 512, "intermediate_size": 1536, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, "vocab_size": 256000,
        "query_pre_attn_scalar": 128, "sliding_window": 4096, "final_logit_softcapping": 30.0,
        "attn_logit_softcapping": 50.0, "max_position_embeddings": 8192,
    },
    "mixtral": {
        "model_type": "mixtral", "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 2,
        "num_attention_heads": 8, "num_key_value_heads": 2, "num_local_experts": 8,
        "num_experts_per_tok": 2, "vocab_size": 32000, "max_position_embeddings": 8192,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe", "hidden_size": 512, "intermediate_size": 1536,
        "moe_intermediate_size": 256, "num_experts": 16, "num_experts_per_tok": 4,
        "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 64,
        "vocab_size": 151936, "max_position_embeddings": 8192,
    },
    "gpt2": {
        "model_type": "gpt2", "n_embd": 768, "n_layer": 2, "n_head": 12, "vocab_size": 50257,
        "n_positions": 8192,
    },
}  # fmt: skip

#: Setup templates, applied to every architecture (13 x 7 = 91 records). Optimizer of template 11
#: rotates over sgd / adafactor / lion so each is traced on several families; templates 9 and 10 (LoRA
#: dropout, DoRA) target attention only on MoE models: peft refuses both on expert tensors.
TEMPLATES: list[dict[str, Any]] = [
    dict(method="full", trainer="generic", attn="sdpa", batch_size=1, seq_len=512),
    dict(method="full", trainer="hf", attn="sdpa", grad_ckpt=True, batch_size=2, seq_len=2048),
    dict(method="full", trainer="torchtune", attn="sdpa", grad_ckpt=True, batch_size=4, seq_len=1024),
    dict(method="full", trainer="hf", attn="eager", batch_size=1, seq_len=1024),
    dict(method="lora", trainer="hf", attn="sdpa", lora_targets="all-linear", lora_rank=16,
         batch_size=2, seq_len=1024),
    dict(method="lora", trainer="generic", attn="eager", lora_targets="attn", lora_rank=8,
         batch_size=1, seq_len=512),
    dict(method="lora", trainer="torchtune", attn="sdpa", grad_ckpt=True, lora_targets="all-linear",
         lora_rank=64, batch_size=8, seq_len=512),
    dict(method="lora", trainer="hf", attn="sdpa", grad_ckpt=True, lora_targets="attn", lora_rank=16,
         batch_size=1, seq_len=8192),
    dict(method="lora", trainer="hf", attn="eager", grad_ckpt=True, lora_targets="all-linear", lora_rank=16,
         lora_dropout=0.05, batch_size=4, seq_len=256),
    dict(method="lora", trainer="generic", attn="sdpa", lora_targets="all-linear", lora_rank=32, dora=True,
         batch_size=1, seq_len=2048),
    dict(method="full", trainer="generic", attn="eager", grad_ckpt=True, batch_size=8, seq_len=128),
    dict(method="lora", trainer="hf", attn="sdpa", lora_targets="attn", lora_rank=16, master_weights=True,
         batch_size=2, seq_len=512),
    dict(method="full", trainer="hf", attn="sdpa", grad_accum=2, batch_size=1, seq_len=4096),
]  # fmt: skip
#: Records outside the template grid, for engine gaps found off it (issue 13): eager attention with and
#: without checkpointing at 4k and 8k tokens (the attention's own transients and the checkpoints still
#: held while the last layer recomputes), a full fine-tune there, and rank-256 fp32 adapters under
#: autocast (their compute-dtype casts).
EXTRA: list[tuple[str, str, dict[str, Any]]] = [
    # prefix tuning (peft PREFIX_TUNING, engine/prefix.py): GQA and MHA, with and without autocast, projection
    ("llama3-16", "llama3", dict(method="prefix-tuning", prefix_tokens=128, trainer="hf", attn="sdpa",
                                 batch_size=2, seq_len=512)),
    ("qwen2-16", "qwen2", dict(method="prefix-tuning", prefix_tokens=256, trainer="hf", precision="fp16",
                               autocast=False, attn="sdpa", batch_size=2, seq_len=1024)),
    ("llama2-24", "llama2", dict(method="prefix-tuning", prefix_tokens=64, prefix_projection=True,
                                 trainer="hf", attn="sdpa", batch_size=4, seq_len=512)),
    ("llama2-25", "llama2", dict(method="prefix-tuning", prefix_tokens=512, trainer="hf", attn="sdpa",
                                 batch_size=4, seq_len=256)),
    ("qwen2-17", "qwen2", dict(method="prefix-tuning", prefix_tokens=1024, trainer="hf", attn="sdpa",
                               batch_size=4, seq_len=256)),
    ("llama2-14", "llama2", dict(method="lora", trainer="hf", attn="eager", grad_ckpt=True, batch_size=1,
                                 seq_len=4096)),
    ("llama2-15", "llama2", dict(method="lora", trainer="hf", attn="eager", grad_ckpt=True, batch_size=1,
                                 seq_len=8192)),
    ("llama2-16", "llama2", dict(method="full", trainer="hf", attn="eager", grad_ckpt=True, batch_size=1,
                                 seq_len=4096)),
    ("llama2-17", "llama2", dict(method="lora", trainer="hf", attn="eager", batch_size=1, seq_len=4096)),
    ("qwen2-14", "qwen2", dict(method="lora", trainer="hf", attn="eager", grad_ckpt=True, batch_size=1,
                               seq_len=4096)),
    ("llama3-14", "llama3", dict(method="lora", trainer="hf", attn="sdpa", lora_rank=256, batch_size=1,
                                 seq_len=1024)),
    # without autocast (--no-autocast): an fp16 model with peft's fp32 adapters (fp32 input copies per
    # wrapped module), eager and SDPA, with and without checkpointing; a pure-bf16 full fine-tune
    ("llama2-18", "llama2", dict(method="lora", trainer="hf", precision="fp16", autocast=False, attn="sdpa",
                                 lora_targets="q_proj,k_proj,v_proj,o_proj", lora_rank=32, batch_size=2,
                                 seq_len=1024)),
    ("qwen2-15", "qwen2", dict(method="lora", trainer="hf", precision="fp16", autocast=False, attn="eager",
                               grad_ckpt=True, lora_targets="q_proj,k_proj,v_proj,o_proj", lora_rank=32,
                               batch_size=1, seq_len=2048)),
    ("llama3-15", "llama3", dict(method="full", trainer="hf", precision="bf16", autocast=False, attn="sdpa",
                                 batch_size=1, seq_len=1024)),
    ("gemma2-14", "gemma2", dict(method="lora", trainer="hf", precision="fp16", autocast=False, attn="sdpa",
                                 lora_targets="all-linear", lora_rank=16, batch_size=1, seq_len=512)),
    ("llama2-19", "llama2", dict(method="lora", trainer="hf", precision="fp16", autocast=False, attn="eager",
                                 lora_targets="all-linear", lora_rank=16, batch_size=1, seq_len=2048)),
    ("gpt2-14", "gpt2", dict(method="full", trainer="hf", precision="bf16", autocast=False, attn="eager",
                             batch_size=2, seq_len=1024)),
    # a plain loop that holds the model's output through backward and the step (--keep-logits), and fp32
    # models (fp32 logits: no upcast copy; eager scores saved once, ``.to(fp32)`` being the same tensor)
    ("llama2-20", "llama2", dict(method="lora", trainer="hf", precision="fp16", autocast=False,
                                 keep_logits=True, attn="sdpa", lora_targets="q_proj,k_proj,v_proj,o_proj",
                                 lora_rank=32, batch_size=2, seq_len=1024)),
    ("llama2-23", "llama2", dict(method="lora", trainer="hf", precision="fp16", autocast=False,
                                 keep_logits=True, grad_accum=2, attn="sdpa",
                                 lora_targets="q_proj,k_proj,v_proj,o_proj", lora_rank=32, batch_size=2,
                                 seq_len=1024)),
    ("llama2-21", "llama2", dict(method="full", trainer="hf", precision="fp32", attn="sdpa", batch_size=1,
                                 seq_len=1024)),
    ("llama2-22", "llama2", dict(method="lora", trainer="hf", precision="fp32", attn="eager",
                                 lora_targets="q_proj,k_proj,v_proj,o_proj", lora_rank=32, batch_size=1,
                                 seq_len=2048)),
]  # fmt: skip
#: Configs outside the template grid whose vocabulary is cut to 512, so that no logits hide what one
#: layer holds at long sequences: Phi-3 mini's and Llama 2 13B's layer shapes (4 layers). They check the
#: LoRA projection transients (engine/lora_transient.py): the MLP's LoRA-wrapped projections at 2 x 8192.
LAYER_ARCHS: dict[str, dict[str, Any]] = {
    "phi3_mlp": {
        "model_type": "phi3", "hidden_size": 3072, "intermediate_size": 8192, "num_hidden_layers": 4,
        "num_attention_heads": 32, "num_key_value_heads": 32, "vocab_size": 512, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "sliding_window": 262144,
        "max_position_embeddings": 131072,
    },
    "llama2_mlp": {
        "model_type": "llama", "hidden_size": 5120, "intermediate_size": 13824, "num_hidden_layers": 4,
        "num_attention_heads": 40, "num_key_value_heads": 40, "vocab_size": 512, "pad_token_id": 0,
        "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False, "max_position_embeddings": 8192,
    },
}  # fmt: skip
_MLP_LORA = dict(method="lora", trainer="hf", attn="sdpa", grad_ckpt=True, lora_targets="all-linear",
                 lora_rank=8, lora_alpha=16, batch_size=2, seq_len=8192)  # fmt: skip
LAYER_EXTRA: list[tuple[str, str, dict[str, Any]]] = [
    ("phi3_mlp-01", "phi3_mlp", dict(_MLP_LORA, autocast=False, lora_dropout=0.05)),
    ("phi3_mlp-02", "phi3_mlp", dict(_MLP_LORA, lora_dropout=0.05)),
    ("llama2_mlp-01", "llama2_mlp", dict(_MLP_LORA, autocast=False)),
    ("llama2_mlp-02", "llama2_mlp", dict(_MLP_LORA, lora_rank=64, lora_dropout=0.1, batch_size=1)),
]  # fmt: skip
ALL_ARCHS = {**ARCHS, **LAYER_ARCHS}
ROTATE = ["sgd", "adafactor", "lion"]
MOE = ("mixtral", "qwen3_moe")


def grid() -> list[tuple[str, str, dict[str, Any]]]:
    """(record id, architecture, setup fields) for every record, in a fixed order."""
    out = []
    for a, arch in enumerate(ARCHS):
        for i, template in enumerate(TEMPLATES, start=1):
            setup = dict(template)
            if i == 11:
                setup["optimizer"] = ROTATE[a % len(ROTATE)]
            if arch in MOE and (setup.get("lora_dropout") or setup.get("dora")):
                # peft wraps transformers-5 expert tensors with ParamWrapper, which refuses both
                setup["lora_targets"] = "attn"
            out.append((f"{arch}-{i:02d}", arch, setup))
    for rid, arch, setup in EXTRA + LAYER_EXTRA:
        out.append((rid, arch, dict(setup)))
    return out


def split_of(record_id: str, setup: dict[str, Any]) -> str:
    """``holdout`` for about a third of the records, decided by a hash, before anything is measured."""
    key = record_id + json.dumps(setup, sort_keys=True)
    return "holdout" if int(hashlib.sha256(key.encode()).hexdigest(), 16) % 3 == 0 else "fit"


def measure_record(record_id: str, arch: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Trace one record and return it as a plain mapping."""
    from fitcheck.measure.trace import trace_step
    from fitcheck.models import LlmSetup

    setup = LlmSetup(**fields)
    measured = trace_step(ALL_ARCHS[arch], setup, top=TOP)
    return {
        "id": record_id,
        "split": split_of(record_id, fields),
        "command": f"PYTHONPATH=src python bench/calibrate.py --only {record_id}",
        "hf_config": ALL_ARCHS[arch],
        "setup": setup.model_dump(mode="json"),
        "measured": measured.model_dump(mode="json"),
    }


def header(arch: str) -> str:
    return (
        f"# Calibration records: {arch} ("
        + (
            "real layer shapes, vocabulary cut to 512"
            if arch in LAYER_ARCHS
            else "shrunken config of the real family, real vocabulary"
        )
        + ").\n"
        "# Traced training steps on fake tensors (fitcheck.measure.trace, CUDA semantics; docs/measure.md).\n"
        "# Generated by bench/calibrate.py; regenerate with: PYTHONPATH=src python bench/calibrate.py\n"
        "# split: holdout records are for checking engine rules, never for fitting them.\n"
    )


def write(arch: str, records: list[dict[str, Any]], out: Path) -> Path:
    path = out / f"{arch}.yaml"
    body = yaml.safe_dump({"architecture": arch, "records": records}, sort_keys=False, width=110)
    path.write_text(header(arch) + body, encoding="utf-8")
    return path


def load(out: Path, arch: str) -> list[dict[str, Any]]:
    path = out / f"{arch}.yaml"
    if not path.exists():
        return []
    return list(yaml.safe_load(path.read_text(encoding="utf-8"))["records"])


def generate(only: set[str] | None, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    by_arch: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for rid, arch, fields in grid():
        by_arch.setdefault(arch, []).append((rid, fields))
    count = 0
    for arch, items in by_arch.items():
        if only is not None and not any(rid in only for rid, _ in items):
            continue
        kept = {r["id"]: r for r in load(out, arch)} if only is not None else {}
        for rid, fields in items:
            if only is not None and rid not in only:
                continue
            t = time.perf_counter()
            kept[rid] = measure_record(rid, arch, fields)
            count += 1
            peak = kept[rid]["measured"]["peak_allocated_bytes"] / 2**30
            print(f"{rid:<14} {peak:9.3f} GiB  {time.perf_counter() - t:5.1f} s", file=sys.stderr)
        order = [rid for rid, _ in items if rid in kept]
        write(arch, [kept[rid] for rid in order], out)
    print(f"{count} records in {time.perf_counter() - started:.0f} s -> {out}", file=sys.stderr)


def report(out: Path) -> None:
    """Engine estimate vs each record (per phase and peak), with mean |error| by split."""
    from fitcheck.engine.estimate import estimate
    from fitcheck.models import LlmSetup, ModelSpec
    from fitcheck.sources.hf_config import arch_from_hf_config

    errors: dict[str, list[float]] = {"fit": [], "holdout": []}
    cols = f"{'record':<14}{'split':<9}{'measured GiB':>13}{'estimate GiB':>13}{'error':>9}"
    print(cols + "  peak phase (measured/estimate)")
    for arch in ALL_ARCHS:
        for rec in load(out, arch):
            spec = ModelSpec(
                id=rec["id"], name=rec["id"], source_kind="hf_config",
                arch=arch_from_hf_config(rec["hf_config"]), hf_config=rec["hf_config"],
            )  # fmt: skip
            setup = LlmSetup(**{**rec["setup"], "backend": "cuda"})
            try:
                est = estimate(spec, setup)
            except Exception as exc:  # an engine gap is a result too
                print(f"{rec['id']:<14}{rec['split']:<9}  estimate failed: {exc}")
                continue
            m = rec["measured"]
            err = 100.0 * (est.peak_allocated_bytes - m["peak_allocated_bytes"]) / m["peak_allocated_bytes"]
            errors[rec["split"]].append(abs(err))
            print(
                f"{rec['id']:<14}{rec['split']:<9}{m['peak_allocated_bytes'] / 2**30:13.3f}"
                f"{est.peak_allocated_bytes / 2**30:13.3f}{err:+8.1f}%  {m['peak_phase']}/{est.peak_phase}"
            )
    for split, errs in errors.items():
        if errs:
            mean = sum(errs) / len(errs)
            print(f"{split}: {len(errs)} records, mean |error| {mean:.1f}%, max {max(errs):.1f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", help="record ids to (re)generate; the rest of their files is kept")
    ap.add_argument("--out", type=Path, default=OUT, help="output folder")
    ap.add_argument("--report", action="store_true", help="compare the engine with the records instead")
    ap.add_argument("--list", action="store_true", help="print the grid (id, split, setup) and exit")
    args = ap.parse_args()
    if args.list:
        for rid, _arch, fields in grid():
            print(rid, split_of(rid, fields), json.dumps(fields))
        return
    if args.report:
        report(args.out)
        return
    generate(set(args.only) if args.only else None, args.out)


if __name__ == "__main__":
    main()
