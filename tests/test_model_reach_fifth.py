"""Model reach, fifth pass: published Hub configs fitcheck had not been checked on, resolved offline from
their folders and held against a primary-source parameter count; each estimated end to end (LoRA, and full
fine-tuning as JSON whose components add up); the out-of-scope ones refused in one line naming the type.

The configs are stored byte for byte under tests/data/arch/<org>/<name>/config.json; tests/data/arch/README.md
("Fifth pass") gives where each was read, the Hub revision and where its count comes from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fitcheck.engine.params import count_params
from fitcheck.sources.hf_config import arch_from_hf_config
from fitcheck.sources.resolve import spec_from_path
from test_hub import SRC, _cache_repo

ARCH_DATA = Path(__file__).parent / "data" / "arch"

#: Exact counts: the Hub API's ``safetensors.total`` for the revision the config was read at (the
#: ``model.json`` beside each config in github.com/daniel-p-green/alain-ai-learning-platform @ 1b337752,
#: ``out/research-<model>/sources/huggingface/``; one dtype each, so the total is the parameter count).
HUB_TOTALS: dict[str, int] = {
    "Alibaba-NLP/Tongyi-DeepResearch-30B-A3B": 30_532_122_624,  # qwen3_moe, BF16
    "dphn/dolphin-2.9.1-yi-1.5-34b": 34_388_917_248,  # llama (Yi-1.5), BF16
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": 8_030_261_248,  # llama, BF16
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": 32_763_876_352,  # qwen2, BF16
    "bigscience/bloomz-560m": 559_214_592,  # bloom (width under "n_embed"), F16
}

#: Rounded counts as published, with the tolerance the rounding allows (half a unit of the last stated
#: digit; a size in a model's name, one unit, since names truncate as often as they round).
#: - Llama 4 Scout: "17B (Activated) 109B (Total)", meta-llama/Llama-4-Scout-17B-16E-Instruct model card
#:   (table mirrored at https://www.fitmyllm.com/model/llama-4-scout-109b, read 2026-12-02); the FP8 copy
#:   quantizes the same tensors (compressed-tensors, weights stay parameters). Vision tower included.
#: - DeepSeek-V2-Lite: "15.7B" total, its model card (as quoted at https://drose.io/aitools/tools/deepseek-v2-lite,
#:   "15.7B reported in the model card", read 2026-12-02).
#: - OLMoE-1B-7B: "6.9B total / 1.3B active", arXiv 2409.02060 (as summarised at
#:   https://labindex.ai/outputs/ai2/olmoe, read 2026-12-02); the 0125 Instruct model keeps the shape.
#: - CodeLlama-34b, codet5p-220m: the size in the model's name.
FIGURES: dict[str, tuple[float, float]] = {
    "RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic": (109e9, 0.5e9),
    "deepseek-ai/DeepSeek-V2-Lite": (15.7e9, 0.05e9),
    "allenai/OLMoE-1B-7B-0125-Instruct": (6.9e9, 0.05e9),
    "codellama/CodeLlama-34b-Instruct-hf": (34e9, 1e9),
    "Salesforce/codet5p-220m": (220e6, 10e6),
}

#: Counted against transformers itself only: google/mt5-small's checkpoint stores an untied lm_head (300M
#: in the mT5 paper, arXiv 2010.11934), but transformers 5 ties it to the shared embedding whatever the
#: config says (configuration_mt5.py forces tie_word_embeddings=True), so the model a run trains has
#: transformers' count; fitcheck follows the library that builds the model, as for T5.
TRANSFORMERS_ONLY = ("google/mt5-small",)

#: Out of scope, with the words the one-line refusal must carry besides the model_type.
REFUSED: dict[str, tuple[str, str]] = {
    # inclusionAI/Ling-flash-2.0: remote code only (transformers has no bailing_moe class); Hub API total
    # 102,889,705,216 (BF16 102,889,697,280 + F32 7,936), recorded for when it is modelled
    "inclusionAI/Ling-flash-2.0": ("bailing_moe", "remote code"),
    # Helsinki-NLP/opus-mt-en-fr: a Marian translation encoder-decoder, keys fitcheck's shape does not read
    "Helsinki-NLP/opus-mt-en-fr": ("marian", "num_attention_heads"),
}

COUNTED = sorted({*HUB_TOTALS, *FIGURES, *TRANSFORMERS_ONLY})


def _folder(repo: str) -> Path:
    return ARCH_DATA / repo


def _config(repo: str) -> dict[str, Any]:
    return dict(json.loads((_folder(repo) / "config.json").read_text()))


def _ours(repo: str) -> int:
    return count_params(spec_from_path(_folder(repo)).arch)


@pytest.mark.parametrize("repo", sorted(HUB_TOTALS))
def test_count_equals_the_hub_safetensors_total(repo: str) -> None:
    assert _ours(repo) == HUB_TOTALS[repo]


@pytest.mark.parametrize("repo", sorted(FIGURES))
def test_count_within_the_published_figure(repo: str) -> None:
    figure, tolerance = FIGURES[repo]
    assert abs(_ours(repo) - figure) <= tolerance


def _transformers_count(cfg: dict[str, Any], kind: str | None = None) -> int:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    config = tf.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    kind = kind or {"t5": "seq2seq", "mt5": "seq2seq", "llama4": "vision"}.get(cfg["model_type"], "causal")
    auto = {
        "causal": tf.AutoModelForCausalLM,
        "seq2seq": tf.AutoModelForSeq2SeqLM,
        "vision": tf.AutoModelForImageTextToText,
    }[kind]
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("repo", COUNTED)
def test_count_equals_transformers_on_the_published_config(repo: str) -> None:
    """The exact check behind the rounded figures: the model transformers builds from the same file."""
    assert _ours(repo) == _transformers_count(_config(repo))


def test_bloom_width_read_from_n_embed() -> None:
    a = spec_from_path(_folder("bigscience/bloomz-560m")).arch
    assert (a.hidden_size, a.num_layers, a.num_heads) == (1024, 24, 16)


def test_mt5_read_natively() -> None:
    spec = spec_from_path(_folder("google/mt5-small"))
    assert spec.arch.model_type == "mt5" and spec.notes == ()
    assert (spec.arch.encoder_layers, spec.arch.num_layers, spec.arch.mlp) == (8, 8, "gated")


def _cli_runs(argvs: list[list[str]], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Each argv through the CLI's main() in one process: exit code, stdout, stderr."""
    code = (
        "import io, json, sys, contextlib\nfrom fitcheck.cli import main\nout = []\n"
        f"for argv in {argvs!r}:\n"
        "    o, e = io.StringIO(), io.StringIO()\n"
        "    with contextlib.redirect_stdout(o), contextlib.redirect_stderr(e):\n"
        "        try:\n            rc = main(argv)\n"
        "        except SystemExit as exc:\n            rc = exc.code\n"
        "    out.append([rc, o.getvalue(), e.getvalue()])\n"
        "print(json.dumps(out))\n"
    )
    env = {"PYTHONPATH": str(SRC), "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", **(env or {})}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    return dict(zip([" ".join(a) for a in argvs], results, strict=True))


def _check_json_adds_up(doc: dict[str, Any]) -> None:
    for phase in doc["phases"]:
        assert sum(c["bytes"] for c in phase["components"]) == phase["total_bytes"], phase["name"]
    peak = next(p for p in doc["phases"] if p["name"] == doc["peak_phase"])
    assert doc["peak_allocated_bytes"] == peak["total_bytes"] == max(p["total_bytes"] for p in doc["phases"])
    assert doc["peak_reserved_bytes"] == doc["peak_allocated_bytes"] + doc["allocator_reserve_bytes"]
    assert doc["device_bytes"] == doc["peak_reserved_bytes"] + doc["context_bytes"]


def test_each_model_estimates_end_to_end() -> None:
    """``estimate <folder> --method lora`` and ``--method full --format json`` on every counted model:
    exit 0, the JSON's phases add up, and its parameter total is the count held above."""
    argvs = []
    for repo in COUNTED:
        folder = str(_folder(repo))
        argvs += [["estimate", folder, "--method", "lora", "--on", "none"]]
        argvs += [["estimate", folder, "--method", "full", "--format", "json", "--on", "none"]]
    runs = _cli_runs(argvs)
    for repo in COUNTED:
        folder = str(_folder(repo))
        rc, out, err = runs[f"estimate {folder} --method lora --on none"]
        assert rc == 0 and "Traceback" not in err and out.strip(), (repo, err[-500:])
        rc, out, err = runs[f"estimate {folder} --method full --format json --on none"]
        assert rc == 0 and "Traceback" not in err, (repo, err[-500:])
        doc = json.loads(out)
        _check_json_adds_up(doc)
        assert doc["params"]["total"] == doc["params"]["trainable"] == _ours(repo)


def test_out_of_scope_models_refused_in_one_line() -> None:
    argvs = [["estimate", str(_folder(repo)), "--on", "none"] for repo in sorted(REFUSED)]
    runs = _cli_runs(argvs)
    for argv in argvs:
        rc, out, err = runs[" ".join(argv)]
        model_type, word = REFUSED[argv[1].removeprefix(str(ARCH_DATA) + "/")]
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1, err[-500:]
        assert lines[0].startswith("fitcheck: error:") and f"'{model_type}'" in lines[0] and word in lines[0]


#: Kimi K2 (moonshotai/Kimi-K2-Instruct) as its "Model Summary" states it (github.com/MoonshotAI/Kimi-K2
#: README @ 11062d11: 61 layers, 1 dense; hidden 7168; expert width 2048; 64 heads; 384 experts, 8 selected,
#: 1 shared; vocabulary "160K"; MLA), with the keys the summary leaves to DeepSeek-V3's architecture, which
#: Kimi K2 reuses under model_type kimi_k2 (the repository's docs/deploy_guidance.md): dense FFN 18,432
#: (DeepSeek-V3's), query rank 1,536, latent 512, rope/nope/value head widths 64/128/128, vocabulary
#: 163,840 (as a public Kimi-K2 text config lists them). Not a verbatim Hub file: no copy was found here.
KIMI_K2: dict[str, Any] = {
    "model_type": "kimi_k2", "architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168,
    "intermediate_size": 18432, "num_hidden_layers": 61, "first_k_dense_replace": 1,
    "num_attention_heads": 64, "num_key_value_heads": 64, "n_routed_experts": 384, "num_experts_per_tok": 8,
    "n_shared_experts": 1,
    "moe_intermediate_size": 2048, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 163840, "tie_word_embeddings": False,
}  # fmt: skip


def test_kimi_k2_read_as_deepseek_v3() -> None:
    a = arch_from_hf_config(KIMI_K2)
    assert a.model_type == "deepseek_v3" and a.num_experts == 384 and a.kv_lora_rank == 512
    n = count_params(a)
    assert n == _transformers_count({**KIMI_K2, "model_type": "deepseek_v3"})
    assert abs(n - 1e12) <= 0.05e12  # "1T" total (README), a figure stated to one digit: 1.026T


def test_meta_fallback_reads_a_wrappers_text_config() -> None:
    """A type sized by transformers on the meta device whose width sits under text_config (Gemma 3n's
    layout: a per-layer list of MLP widths) takes its shape from there, the list at its widest layer."""
    from fitcheck.sources.meta_fallback import shape_config

    cfg = {
        "model_type": "wrapper",
        "vision_config": {"hidden_size": 1152},
        "text_config": {
            "hidden_size": 2048,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "intermediate_size": [8192, 16384, 8192],
        },
    }
    shape = shape_config(cfg)
    assert (shape["hidden_size"], shape["intermediate_size"], shape["model_type"]) == (2048, 16384, "wrapper")
    assert (
        shape_config({"model_type": "x", "hidden_size": 64, "intermediate_size": 96})["intermediate_size"]
        == 96
    )


def test_per_layer_mlp_widths_pass_the_size_check_and_bad_ones_do_not() -> None:
    from fitcheck.errors import ModelSourceError
    from fitcheck.sources.hf_config import check_sizes

    check_sizes({"intermediate_size": [8192, 16384]})
    check_sizes({"moe_intermediate_size": [1536, 512]})  # ERNIE-4.5-VL: text experts, vision experts
    for bad in ([], [8192, 0], [8192, "x"], [True]):
        with pytest.raises(ModelSourceError, match="intermediate_size must be a whole number"):
            check_sizes({"intermediate_size": bad})
    with pytest.raises(ModelSourceError, match="hidden_size must be a whole number"):
        check_sizes({"hidden_size": [2048]})  # only MLP widths may be given per layer


def _meta_spec(cfg: dict[str, Any]) -> Any:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from fitcheck.sources.resolve import spec_from_config

    return spec_from_config(cfg, id="x", name="x", source="test")


def test_meta_fallback_counts_a_multimodal_models_lm_head() -> None:
    """LLaVA-NeXT is not a causal-LM type: its bare AutoModel leaves the lm_head out (7,062,906,880 with it,
    6,931,834,880 without, transformers 5.24's defaults); the fallback builds the image-text-to-text class."""
    tf = pytest.importorskip("transformers")
    cfg = {**tf.AutoConfig.for_model("llava_next").to_dict(), "model_type": "llava_next"}
    spec = _meta_spec(cfg)
    assert count_params(spec.arch) == _transformers_count(cfg | {"model_type": "llava_next"}, "vision")


def test_meta_fallback_refuses_a_hybrid_it_finds_in_the_built_model() -> None:
    """A type outside `HYBRID_TYPES` whose built model holds a mixer that is not attention (LFM3's short
    convolutions) is refused by name, not sized as attention."""
    from fitcheck.errors import ModelSourceError

    tf = pytest.importorskip("transformers")
    cfg = {**tf.AutoConfig.for_model("lfm3").to_dict(), "model_type": "lfm3"}
    with pytest.raises(ModelSourceError, match=r"'lfm3' interleaves attention with .*Lfm3ShortConv"):
        _meta_spec(cfg)


def test_meta_fallback_mlp_width_when_the_config_states_none() -> None:
    from fitcheck.sources.meta_fallback import shape_config

    gpt = {
        "model_type": "gpt_bigcode",
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_inner": None,
        "vocab_size": 256,
    }
    spec = _meta_spec(gpt)
    assert spec.arch.intermediate_size == 256 and "4 x hidden" in spec.notes[0]
    assert count_params(spec.arch) == _transformers_count(gpt)
    moe = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "moe_intermediate_size": 32}
    assert shape_config({**moe, "num_experts_per_tok": 2, "n_shared_experts": 1})["intermediate_size"] == 96
    assert shape_config({**moe, "attention_heads": 4, "ffn_dim": 80})["intermediate_size"] == 80


def test_a_json_integer_is_read_as_the_float_its_field_types() -> None:
    """DBRX's published config states ``ffn_config.moe_normalize_expert_weights: 1``, which transformers
    5.24's strict check refuses against ``float | None``; JSON has one number type, so the fallback reads it
    as 1.0 (a small DBRX of the published key set, counted as transformers counts it). A wrong type that is
    not an integer for a float still stands as one error line."""
    from fitcheck.errors import ModelSourceError

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ffn = {"ffn_hidden_size": 96, "moe_num_experts": 4, "moe_top_k": 2, "moe_normalize_expert_weights": 1}
    cfg = {
        "model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 2, "vocab_size": 256,
        "max_seq_len": 128, "attn_config": {"kv_n_heads": 2, "rope_theta": 500000}, "ffn_config": ffn,
    }  # fmt: skip
    spec = _meta_spec(cfg)
    mended = {**cfg, "ffn_config": {**ffn, "moe_normalize_expert_weights": 1.0}}
    assert count_params(spec.arch) == _transformers_count(mended)
    # its nested ffn_config / attn_config give the active experts' width (96 x 2) and the key/value heads
    assert spec.arch.intermediate_size == 192 and "active experts" in spec.notes[0]
    assert spec.arch.num_kv_heads in (2, 1)
    with pytest.raises(ModelSourceError, match="transformers cannot read this dbrx config"):
        _meta_spec({**cfg, "ffn_config": {**ffn, "moe_normalize_expert_weights": "one"}})


def test_a_config_transformers_cannot_build_is_one_error_line(tmp_path: Path) -> None:
    """Chameleon's modeling code needs its vocabulary_map; a config leaving it null fails inside
    transformers, which fitcheck reports in one line (exit 2), not as an internal error."""
    pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    cfg = {
        **tf.AutoConfig.for_model("chameleon").to_dict(),
        "model_type": "chameleon",
        "vocabulary_map": None,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    rc, out, err = _cli_runs([["estimate", str(tmp_path), "--on", "none"]])[f"estimate {tmp_path} --on none"]
    lines = err.strip().splitlines()
    assert rc == 2 and out == "" and len(lines) == 1 and "internal error" not in err
    assert lines[0].startswith("fitcheck: error: transformers cannot build model_type 'chameleon'")


def test_hub_ids_resolve_from_the_cache(tmp_path: Path) -> None:
    """``fitcheck estimate <hub id>`` offline, each published config in an HF cache under its real id, and
    Kimi K2 under moonshotai/Kimi-K2-Instruct: the same totals as from the folders."""
    repos = {repo: (_folder(repo) / "config.json").read_bytes() for repo in COUNTED}
    repos["moonshotai/Kimi-K2-Instruct"] = json.dumps(KIMI_K2).encode()
    for repo, data in repos.items():
        _cache_repo(tmp_path / "hub", repo, {"config.json": data})
    argvs = [["estimate", repo, "--method", "full", "--format", "json", "--on", "none"] for repo in repos]
    runs = _cli_runs(argvs, {"HF_HOME": str(tmp_path)})
    for argv in argvs:
        rc, out, err = runs[" ".join(argv)]
        assert rc == 0, (argv[1], err[-500:])
        doc = json.loads(out)
        assert doc["model_source"] == "hf_config"
        repo = argv[1]
        cfg = json.loads(repos[repo])
        expected = _ours(repo) if repo in COUNTED else count_params(arch_from_hf_config(cfg))
        assert doc["params"]["total"] == expected, repo
