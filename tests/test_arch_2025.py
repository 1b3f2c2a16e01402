"""The 2025-26 families (gpt-oss, GLM-4.5, ERNIE 4.5, Phi-3.5-MoE, Seed-OSS, Hunyuan, Apertus, dots.llm1,
OLMo 3, Ministral, Mistral 3, Qwen3-VL): counts against published figures, the hybrid types refused, MXFP4
checkpoints, and ``fitcheck estimate <hub id>`` end to end on a local Hugging Face cache (no network).

Exact counts against transformers itself are in tests/test_architectures.py (CASES, MM_CASES); the traced
check is bench/arch_trace.py (docs/methodology.md, "Architectures").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fitcheck.engine.params import count_params
from fitcheck.errors import ModelSourceError
from fitcheck.sources.hf_config import HYBRID_TYPES, arch_from_hf_config
from fitcheck.sources.resolve import MXFP4_NOTE, spec_from_path
from test_architectures import CASES, MM_CASES
from test_hub import COMMIT, SRC, _cache_repo, run_cli, safetensors_bytes

ARCH_DATA = Path(__file__).parent / "data" / "arch"

#: The types this round added (tests/data/arch/README.md lists their sources).
NEW_TYPES = ("gpt_oss", "glm4_moe", "dots1", "ernie4_5", "ernie4_5_moe", "phimoe", "seed_oss",
             "hunyuan_v1_dense", "hunyuan_v1_moe", "apertus", "olmo3", "ministral", "ministral3")  # fmt: skip
NEW_MULTIMODAL = ("mistral3", "qwen3_vl", "qwen3_vl_moe")

#: Hub configs stored under tests/data/arch (README there: where each was read, Hub revision) and the
#: parameter count the Hub API reports for the same revision's safetensors (``safetensors.total`` of
#: https://huggingface.co/api/models/<id>, in the same public copy). MXFP4 checkpoints (gpt-oss): the API's
#: "U8" figure counts each expert value once plus one scale per block of 32 values, so the model holds
#: ``U8 x 32 / 33`` expert values; every other figure is the count itself.
HUB_TOTALS: dict[str, dict[str, int]] = {
    "openai/gpt-oss-20b": {"BF16": 1_804_459_584, "U8": 19_707_494_400},
    "openai/gpt-oss-120b": {"BF16": 2_167_371_072, "U8": 118_244_966_400},
    # F32: the 27 MoE routers (64 x 2,560, kept fp32) and their e_score_correction_bias (64 each)
    "baidu/ERNIE-4.5-21B-A3B-Thinking": {"F32": 4_425_408, "BF16": 21_821_012_480},
    # the Pixtral tower and projector included
    "mistralai/Magistral-Small-2509": {"BF16": 24_011_361_280},
}
#: Totals the publishers print (gpt-oss model card, OpenAI 2025-08-05, arXiv 2508.10925, Table 1).
CARD_FIGURES = {"openai/gpt-oss-20b": 20.91e9, "openai/gpt-oss-120b": 116.83e9}


def _hub_config(repo: str) -> dict[str, Any]:
    return dict(json.loads((ARCH_DATA / repo / "config.json").read_text()))


def _model_params(totals: dict[str, int]) -> int:
    return sum(n * 32 // 33 if dtype == "U8" else n for dtype, n in totals.items())


@pytest.mark.parametrize("repo", sorted(HUB_TOTALS))
def test_hub_configs_count_the_published_safetensors(repo: str) -> None:
    assert count_params(arch_from_hf_config(_hub_config(repo))) == _model_params(HUB_TOTALS[repo])


@pytest.mark.parametrize("repo", sorted(CARD_FIGURES))
def test_gpt_oss_counts_round_to_the_model_card(repo: str) -> None:
    n = count_params(arch_from_hf_config(_hub_config(repo)))
    assert round(n / 1e7) * 1e7 == CARD_FIGURES[repo]


#: GLM-4.5-Air as pufanyi/Megatron-Bridge docs/models/llm/glm45.md states it (46 layers, the first dense;
#: hidden 4096, FFN 10944; 96 heads, 8 query groups; 128 experts of 1408, top-8, one shared expert of
#: 1408; no QK norm; vocabulary 151,552; untied; qkv bias and head size 128 from the same model's
#: Megatron arguments there, ``--add-qkv-bias``, ``--kv-channels 128``). "106B total parameters" (model
#: card, and transformers docs/source/en/model_doc/glm4_moe.md) is stated to 3 digits and excludes the
#: multi-token-prediction layer the checkpoint also stores (transformers does not build it).
GLM45_AIR: dict[str, Any] = {
    "model_type": "glm4_moe", "hidden_size": 4096, "num_hidden_layers": 46, "first_k_dense_replace": 1,
    "intermediate_size": 10944, "num_attention_heads": 96, "num_key_value_heads": 8, "head_dim": 128,
    "n_routed_experts": 128, "moe_intermediate_size": 1408, "num_experts_per_tok": 8, "n_shared_experts": 1,
    "use_qk_norm": False, "vocab_size": 151552, "tie_word_embeddings": False, "attention_bias": True,
}  # fmt: skip


def test_glm45_air_count_within_its_rounded_figure() -> None:
    n = count_params(arch_from_hf_config(GLM45_AIR))
    assert n == 106_852_245_504  # 106.85B: "106B" stated to 3 digits, the MTP layer left out
    assert 0 <= n - 106e9 < 1e9  # within one unit of the figure's last digit (+0.8%)


def test_stored_configs_resolve_as_folders() -> None:
    spec = spec_from_path(ARCH_DATA / "openai" / "gpt-oss-20b")
    assert MXFP4_NOTE in spec.notes  # the Hub config names quant_method mxfp4
    a = spec.arch
    assert (a.num_experts, a.experts_per_token, a.attn_sinks, a.expert_bias, a.router_bias) == (
        32,
        4,
        True,
        True,
        True,
    )
    assert (a.qkv_bias, a.o_bias, a.sliding_window) == (True, True, 128)


@pytest.mark.parametrize("model_type", sorted(HYBRID_TYPES))
def test_hybrid_types_refused_by_name(model_type: str) -> None:
    with pytest.raises(ModelSourceError, match=f"'{model_type}' interleaves attention with") as err:
        arch_from_hf_config({"model_type": model_type, "hidden_size": 64, "num_hidden_layers": 2})
    assert HYBRID_TYPES[model_type].split(" (")[0] in str(err.value)


def test_qwen3_next_hub_config_refused() -> None:
    with pytest.raises(ModelSourceError, match="Gated DeltaNet"):
        arch_from_hf_config(_hub_config("Qwen/Qwen3-Next-80B-A3B-Instruct"))


def test_magistral_lm_head_stays_untied() -> None:
    """Mistral3Config defaults tie_word_embeddings to true; Magistral's config states it on neither level
    and its checkpoint stores lm_head apart (the total above), which from_pretrained keeps."""
    a = arch_from_hf_config(_hub_config("mistralai/Magistral-Small-2509"))
    assert not a.tie_embeddings
    assert a.extra_params > 0  # the Pixtral tower and projector


def test_hybrid_refusal_is_one_line_exit_2(tmp_path: Path) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "lfm2", "hidden_size": 1024, "num_hidden_layers": 16}))
    proc = run_cli(["estimate", str(cfg), "--on", "none"], {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fitcheck: error:") and "short-convolution" in lines[0]


#: A one-layer gpt-oss in the layout of openai/gpt-oss-20b's MXFP4 checkpoint: expert weights as
#: ``_blocks`` (E, out, in / 32, 16) uint8 and ``_scales`` (E, out, in / 32) uint8, the rest bf16.
TINY_OSS = {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_local_experts": 4,
            "num_experts_per_tok": 2, "vocab_size": 256, "tie_word_embeddings": False,
            "quantization_config": {"quant_method": "mxfp4"}}  # fmt: skip


def _tiny_oss_tensors() -> dict[str, tuple[str, list[int]]]:
    h, e, i, v = 64, 4, 64, 256
    p = "model.layers.0."
    bf = "BF16"
    return {
        "model.embed_tokens.weight": (bf, [v, h]), "lm_head.weight": (bf, [v, h]),
        "model.norm.weight": (bf, [h]),
        p + "input_layernorm.weight": (bf, [h]), p + "post_attention_layernorm.weight": (bf, [h]),
        p + "self_attn.q_proj.weight": (bf, [64, h]), p + "self_attn.q_proj.bias": (bf, [64]),
        p + "self_attn.k_proj.weight": (bf, [32, h]), p + "self_attn.k_proj.bias": (bf, [32]),
        p + "self_attn.v_proj.weight": (bf, [32, h]), p + "self_attn.v_proj.bias": (bf, [32]),
        p + "self_attn.o_proj.weight": (bf, [h, 64]), p + "self_attn.o_proj.bias": (bf, [h]),
        p + "self_attn.sinks": (bf, [4]),
        p + "mlp.router.weight": (bf, [e, h]), p + "mlp.router.bias": (bf, [e]),
        p + "mlp.experts.gate_up_proj_blocks": ("U8", [e, 2 * i, h // 32, 16]),
        p + "mlp.experts.gate_up_proj_scales": ("U8", [e, 2 * i, h // 32]),
        p + "mlp.experts.gate_up_proj_bias": (bf, [e, 2 * i]),
        p + "mlp.experts.down_proj_blocks": ("U8", [e, h, i // 32, 16]),
        p + "mlp.experts.down_proj_scales": ("U8", [e, h, i // 32]),
        p + "mlp.experts.down_proj_bias": (bf, [e, h]),
    }  # fmt: skip


def test_mxfp4_checkpoint_counts_unpacked_and_notes_bf16_training(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TINY_OSS))
    (tmp_path / "model.safetensors").write_bytes(safetensors_bytes(_tiny_oss_tensors()))
    spec = spec_from_path(tmp_path)
    assert spec.source_kind == "safetensors"
    assert spec.declared_params == count_params(spec.arch)  # blocks x 2, scales not parameters
    assert MXFP4_NOTE in spec.notes
    assert {g.dtype for g in spec.file_groups if g.name == "layers"} == {"bf16", "mxfp4"}


def _hub_cases() -> dict[str, dict[str, Any]]:
    """One cached repository per new type: the stored published configs, and the test configs of
    tests/test_architectures.py for the rest."""
    out = {f"acme/{t}": {"model_type": t, **CASES[t][1]} for t in NEW_TYPES}
    out |= {f"acme/{t}": {"model_type": t, **MM_CASES[t]} for t in NEW_MULTIMODAL}
    out |= {repo: _hub_config(repo) for repo in HUB_TOTALS}
    return out


def test_hub_ids_estimate_end_to_end_from_the_cache(tmp_path: Path) -> None:
    """``fitcheck estimate <hub id>`` offline against an HF cache holding each new family (one process:
    the CLI's main() per id, JSON out, exit codes collected)."""
    cases = _hub_cases()
    for repo, cfg in cases.items():
        _cache_repo(tmp_path / "hub", repo, {"config.json": json.dumps(cfg).encode()})
    mxfp4 = {
        "config.json": json.dumps(TINY_OSS).encode(),
        "model.safetensors": safetensors_bytes(_tiny_oss_tensors()),
    }
    _cache_repo(tmp_path / "hub", "acme/oss-mxfp4", mxfp4)
    ids = [*cases, "acme/oss-mxfp4"]
    argv = "['estimate', hub_id, '--on', 'none', '--method', 'full', '--format', 'json']"
    keep = "[rc, doc.get('params', {}).get('total'), doc.get('model_source'), doc.get('warnings')]"
    code = (
        "import io, json, sys, contextlib\nfrom fitcheck.cli import main\nout = {}\n"
        f"for hub_id in {ids!r}:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        try:\n"
        f"            rc = main({argv})\n"
        "        except SystemExit as e:\n"
        "            rc = e.code or 0\n"
        "    doc = json.loads(buf.getvalue()) if rc == 0 else {}\n"
        f"    out[hub_id] = {keep}\n"
        "print(json.dumps(out))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE"))}
    env |= {"PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    for repo, cfg in cases.items():
        rc, total, source, _ = got[repo]
        assert (rc, source) == (0, "hf_config"), (repo, got[repo], proc.stderr[-2000:])
        assert total == count_params(arch_from_hf_config(cfg)), repo
    rc, total, source, warnings = got["acme/oss-mxfp4"]
    assert (rc, source, total) == (0, "safetensors", count_params(arch_from_hf_config(TINY_OSS)))
    assert any("MXFP4 checkpoint" in w for w in warnings or [])
    assert not any("safetensors headers hold" in w for w in warnings or [])
    assert COMMIT  # the cache layout test_hub builds


#: (model_type, method, LoRA targets) held to the traced step within the calibration tolerance; phimoe's
#: LoRA runs on attention only (peft 0.21 wraps its router, an nn.Linear whose forward returns a tuple,
#: under all-linear and the adapter's forward fails).
TRACED = [
    (t, m, "attn" if t == "phimoe" and m == "lora" else "all-linear")
    for t in NEW_TYPES
    for m in ("lora", "full")
]


@pytest.mark.slow
@pytest.mark.parametrize(("model_type", "method", "targets"), TRACED)
def test_new_families_within_3pct_of_the_traced_step(model_type: str, method: str, targets: str) -> None:
    """bench/arch_trace.py's shape (h = 1024, 4 layers, batch 2 x 512, bf16) on transformers' own model
    class under fitcheck's fake-tensor tracer: forward and backward peaks within 3%."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from bench_helpers import bench_module
    from fitcheck.engine.estimate import estimate
    from fitcheck.measure.trace import trace_step
    from fitcheck.models import LlmSetup
    from fitcheck.sources.resolve import spec_from_config

    cfg = bench_module("arch_trace").widen(model_type, CASES[model_type][1])
    setup = LlmSetup(method=method, seq_len=512, batch_size=2, lora_targets=targets)
    est = estimate(spec_from_config(dict(cfg), id=model_type, name=model_type, source="test"), setup)
    traced = {p.name: p.peak_bytes for p in trace_step(dict(cfg), setup, steps=2).phases}
    for phase in ("forward", "backward"):
        assert abs(est.phase(phase).total_bytes / traced[phase] - 1) <= 0.03, phase
