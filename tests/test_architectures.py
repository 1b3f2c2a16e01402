"""Exact parameter counts per model_type: fitcheck's table-driven converter against transformers.

Each case is a small config written with the keys the published config.json files use; transformers
builds the same config with its own configuration class and the model on the meta device (no weights),
and the totals must agree to the parameter. Remote-code families are checked against published counts
in test_remote_code_counts.
"""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine.params import count_params
from fitcheck.errors import ModelSourceError
from fitcheck.sources.hf_config import FAMILIES, MULTIMODAL, arch_from_hf_config, supported_types

S: dict[str, Any] = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "pad_token_id": 0,
                     "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 256}  # fmt: skip
GPT: dict[str, Any] = {"n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256}
MOE = {"num_experts_per_tok": 2}
ENC = {**S, "num_key_value_heads": None, "max_position_embeddings": 40}

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("causal", {**S, "tie_word_embeddings": False}),
    "mistral": ("causal", {**S, "head_dim": 32}),
    "qwen2": ("causal", {**S, "tie_word_embeddings": True}),
    "qwen3": ("causal", {**S, "head_dim": 24}),
    "gemma": ("causal", {**S, "head_dim": 16}),
    "gemma2": ("causal", {**S, "head_dim": 16}),
    "gemma3_text": ("causal", {**S, "head_dim": 16}),
    "phi3": ("causal", S),
    "mixtral": ("causal", {**S, "num_local_experts": 4, **MOE}),
    "qwen2_moe": (
        "causal",
        {
            **S,
            "num_experts": 4,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 48,
            **MOE,
            "decoder_sparse_step": 2,
        },
    ),
    "qwen3_moe": (
        "causal",
        {**S, "num_experts": 4, "moe_intermediate_size": 32, **MOE, "mlp_only_layers": [0]},
    ),
    "gpt2": ("causal", GPT),
    "granite": ("causal", S),
    "helium": ("causal", {**S, "head_dim": 16}),
    "smollm3": ("causal", S),
    "glm": ("causal", S),
    "glm4": ("causal", S),
    "olmo": ("causal", S),
    "olmo2": ("causal", S),
    "olmoe": ("causal", {**S, "num_experts": 4, **MOE}),
    "exaone": ("causal", S),
    "exaone4": ("causal", S),
    "cohere": ("causal", S),
    "cohere2": ("causal", S),
    "stablelm": ("causal", {**S, "use_qkv_bias": True}),
    "starcoder2": ("causal", S),
    "nemotron": ("causal", S),
    "arcee": ("causal", S),
    "gpt_neox": ("causal", {**S, "num_key_value_heads": None}),
    "gptj": ("causal", GPT),
    "phi": ("causal", {**S, "num_key_value_heads": None}),
    "falcon": ("causal", {**S, "num_key_value_heads": None}),
    "bloom": ("causal", {"hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 256}),
    "opt": (
        "causal",
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "ffn_dim": 96,
            "vocab_size": 256,
            "max_position_embeddings": 40,
            "word_embed_proj_dim": 64,
        },
    ),
    "mpt": ("causal", {"d_model": 64, "n_layers": 2, "n_heads": 4, "vocab_size": 256}),
    "granitemoe": ("causal", {**S, "num_local_experts": 4, **MOE}),
    "granitemoeshared": ("causal", {**S, "num_local_experts": 4, **MOE, "shared_intermediate_size": 40}),
    "deepseek_v2": (
        "causal",
        {
            **S,
            "num_key_value_heads": None,
            "kv_lora_rank": 16,
            "q_lora_rank": None,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 12,
            "n_routed_experts": 4,
            "n_shared_experts": 2,
            "moe_intermediate_size": 24,
            "first_k_dense_replace": 1,
            **MOE,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
    "deepseek_v3": (
        "causal",
        {
            **S,
            "num_hidden_layers": 3,
            "num_key_value_heads": None,
            "kv_lora_rank": 16,
            "q_lora_rank": 24,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 12,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "moe_intermediate_size": 24,
            "first_k_dense_replace": 1,
            **MOE,
            "n_group": 1,
            "topk_group": 1,
        },
    ),
    # 2025-26 families (docs/methodology.md, "Architectures": gpt-oss to Apertus)
    "gpt_oss": ("causal", {**S, "head_dim": 16, "num_local_experts": 4, **MOE}),
    "glm4_moe": (
        "causal",
        {
            **S,
            "num_hidden_layers": 3,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "moe_intermediate_size": 24,
            **MOE,
            "first_k_dense_replace": 1,
            "use_qk_norm": True,
            "attention_bias": True,
        },
    ),
    "dots1": (
        "causal",
        {
            **S,
            "n_routed_experts": 4,
            "n_shared_experts": 2,
            "moe_intermediate_size": 24,
            **MOE,
            "first_k_dense_replace": 1,
        },
    ),
    "ernie4_5": ("causal", {**S, "head_dim": 16, "use_bias": True, "tie_word_embeddings": False}),
    "ernie4_5_moe": (
        "causal",
        {
            **S,
            "num_hidden_layers": 4,
            "moe_num_experts": 4,
            "moe_k": 2,
            "moe_intermediate_size": 24,
            "moe_num_shared_experts": 2,
            "moe_layer_interval": 2,
            "moe_layer_start_index": 0,
            "use_bias": True,
            "tie_word_embeddings": False,
        },
    ),
    "phimoe": ("causal", {**S, "num_local_experts": 4, **MOE, "attention_bias": True, "lm_head_bias": True}),
    "seed_oss": ("causal", {**S, "head_dim": 16, "attention_out_bias": True}),
    "hunyuan_v1_dense": ("causal", {**S, "head_dim": 16, "attention_bias": True}),
    "hunyuan_v1_moe": ("causal", {**S, "head_dim": 16, "num_experts": 4, "moe_topk": [2, 2]}),
    "apertus": ("causal", S),
    "olmo3": ("causal", S),
    "ministral": ("causal", {**S, "head_dim": 16}),
    "ministral3": ("causal", {**S, "head_dim": 16}),
    "bert": ("classify", ENC),
    "roberta": ("classify", ENC),
    "deberta-v2": (
        "classify",
        {
            **ENC,
            "relative_attention": True,
            "position_buckets": 16,
            "norm_rel_ebd": "layer_norm",
            "share_att_key": True,
            "pos_att_type": "p2c|c2p",
            "position_biased_input": False,
            "type_vocab_size": 0,
        },
    ),
    "t5": (
        "seq2seq",
        {
            "d_model": 64,
            "d_kv": 16,
            "d_ff": 96,
            "num_layers": 2,
            "num_decoder_layers": 3,
            "num_heads": 4,
            "vocab_size": 256,
            "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False,
        },
    ),
    "mt5": (
        "seq2seq",
        {
            "d_model": 64,
            "d_kv": 16,
            "d_ff": 96,
            "num_layers": 2,
            "num_decoder_layers": 3,
            "num_heads": 4,
            "vocab_size": 256,
            "tie_word_embeddings": False,
        },
    ),
}
_TEXT = {**S, "model_type": "llama"}
MM_CASES: dict[str, dict[str, Any]] = {
    "llava": {"text_config": _TEXT, "vision_config": {"model_type": "clip_vision_model", "hidden_size": 32,
              "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 28, "patch_size": 14}, "image_token_index": 255},
    "qwen2_vl": {**S, "vision_config": {"embed_dim": 32, "depth": 2, "num_heads": 2, "hidden_size": 64}},
    "qwen2_5_vl": {**S, "vision_config": {"hidden_size": 32, "intermediate_size": 48, "depth": 2,
                                          "num_heads": 2, "out_hidden_size": 64}},
    "gemma3": {"text_config": {**S, "head_dim": 16, "model_type": "gemma3_text"},
               "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                 "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                                 "vision_use_head": False}, "mm_tokens_per_image": 4},
    "llama4": {"text_config": {**S, "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 1,
                               "intermediate_size_mlp": 80, "interleave_moe_layer_step": 2},
               "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                 "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
                                 "vision_output_dim": 40, "projector_input_dim": 48,
                                 "projector_output_dim": 40, "pixel_shuffle_ratio": 0.5}},
    "mistral3": {"text_config": {**S, "head_dim": 16, "model_type": "mistral"},
                 "vision_config": {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
                                   "num_attention_heads": 2, "head_dim": 16, "image_size": 28,
                                   "patch_size": 14}, "vision_feature_layer": [-1, -2],
                 "tie_word_embeddings": True},
    "qwen3_vl": {"text_config": {**S, "head_dim": 16}, "tie_word_embeddings": True,
                 "vision_config": {"hidden_size": 32, "intermediate_size": 48, "depth": 3, "num_heads": 2,
                                   "out_hidden_size": 64, "deepstack_visual_indexes": [0, 1],
                                   "num_position_embeddings": 16}},
    "qwen3_vl_moe": {"text_config": {**S, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2,
                                     "moe_intermediate_size": 24, "mlp_only_layers": [0]},
                     "vision_config": {"hidden_size": 32, "intermediate_size": 48, "depth": 2, "num_heads": 2,
                                       "out_hidden_size": 64, "deepstack_visual_indexes": [1],
                                       "num_position_embeddings": 16}},
}  # fmt: skip

NUM_LABELS = 3


def _hf_count(model_type: str, task: str, cfg: dict[str, Any]) -> int:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    kw = {k: v for k, v in cfg.items() if v is not None or k == "q_lora_rank"}
    if task == "classify":
        kw["num_labels"] = NUM_LABELS
    config = tf.AutoConfig.for_model(model_type, **kw)
    auto = {
        "causal": tf.AutoModelForCausalLM,
        "classify": tf.AutoModelForSequenceClassification,
        "seq2seq": tf.AutoModelForSeq2SeqLM,
        "vision": tf.AutoModelForImageTextToText,
    }[task]
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def _ours(model_type: str, task: str, cfg: dict[str, Any]) -> int:
    mine = {"model_type": model_type, **cfg}
    if task == "classify":
        mine["num_labels"] = NUM_LABELS
    return count_params(arch_from_hf_config(mine))


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_count_matches_transformers(model_type: str) -> None:
    task, cfg = CASES[model_type]
    assert _ours(model_type, task, cfg) == _hf_count(model_type, task, cfg)


@pytest.mark.parametrize("model_type", sorted(MM_CASES))
def test_multimodal_count_matches_transformers(model_type: str) -> None:
    cfg = MM_CASES[model_type]
    assert _ours(model_type, "vision", cfg) == _hf_count(model_type, "vision", cfg)


def test_every_transformers_type_has_a_case() -> None:
    remote = {t for t, f in FAMILIES.items() if f.source == "remote"}
    covered = set(CASES) | set(MM_CASES)
    # language models built only inside their multimodal model (covered through MM_CASES)
    assert set(FAMILIES) - remote - {"llama4_text", "qwen3_vl_text", "qwen3_vl_moe_text"} <= covered
    assert set(MULTIMODAL) <= covered
    assert len(supported_types()) >= 35


@pytest.mark.parametrize("model_type", ["mamba", "mamba2", "rwkv", "jamba"])
def test_state_space_models_refused(model_type: str) -> None:
    with pytest.raises(ModelSourceError, match="state-space"):
        arch_from_hf_config({"model_type": model_type, **S})


#: Remote-code families (trust_remote_code: no class in transformers to build), each with a published
#: config (keys as the repository's config.json states them) and the parameter count printed by a
#: tool that loaded the real checkpoint:
#: - THUDM/chatglm3-6b (= chatglm2-6b's shape): config.json of the repository; 6,243,584,000 in the
#:   calflops README table (github.com/MrYxJ/calculate-flops.pytorch, "chatglm2-6b ... 6243584000").
#: - baichuan-inc/Baichuan-7B: 7,000,559,616, same calflops table ("baichuan-7B ... 7000559616").
#: - internlm/internlm2_5-7b-chat: 7,737,708,544, ChatLLM.cpp's loader banner ("You are served by
#:   InternLM, with 7737708544 (7.7B) parameters", github.com/foldl/chatllm.cpp docs).
#: - Qwen/Qwen-7B: 7,721,324,544, the same calflops table ("Qwen-7B ... 7721324544"); the config.json of
#:   the repository (Qwen/Qwen-7B @e7a368b, 2023-11-30, mirrored at github.com/zhangningboo/Qwen-7B).
#: - openbmb/MiniCPM-2B-sft-bf16: 2,724,880,896, the same banner ("You are served by MiniCPM, with
#:   2724880896 (2.7B) parameters") and MTEB's model metadata for MiniCPM-based embedders
#:   (n_parameters=2724880896).
#: - tiiuae/falcon-7b (``RefinedWebModel``, the 2023 remote-code config, as copied verbatim with the
#:   checkpoint in tenstorrent/tt-buda pybuda/test/falcon/models/falcon7b/ @97caab79): 6,921,720,704, from
#:   that checkpoint's pytorch_model.bin.index.json (total_size 14,434,379,520 bytes of bf16, less the tied
#:   lm_head.weight it also stores, 65,024 x 4,544 x 2 bytes).
REMOTE: dict[str, tuple[dict[str, Any], int]] = {
    "chatglm3-6b": ({"model_type": "chatglm", "add_bias_linear": False, "add_qkv_bias": True,
                     "ffn_hidden_size": 13696, "hidden_size": 4096, "kv_channels": 128,
                     "multi_query_attention": True, "multi_query_group_num": 2, "num_attention_heads": 32,
                     "num_layers": 28, "padded_vocab_size": 65024, "post_layer_norm": True, "rmsnorm": True,
                     "tie_word_embeddings": False, "vocab_size": 65024}, 6_243_584_000),
    "baichuan-7b": ({"model_type": "baichuan", "hidden_size": 4096, "intermediate_size": 11008,
                     "num_attention_heads": 32, "num_hidden_layers": 32, "vocab_size": 64000,
                     "tie_word_embeddings": False}, 7_000_559_616),
    "internlm2_5-7b-chat": ({"model_type": "internlm2", "hidden_size": 4096, "num_hidden_layers": 32,
                             "intermediate_size": 14336, "num_attention_heads": 32, "num_key_value_heads": 8,
                             "vocab_size": 92544, "bias": False, "tie_word_embeddings": False},
                            7_737_708_544),
    "qwen-7b": ({"model_type": "qwen", "hidden_size": 4096, "intermediate_size": 22016, "kv_channels": 128,
                 "num_attention_heads": 32, "num_hidden_layers": 32, "no_bias": True, "vocab_size": 151936,
                 "tie_word_embeddings": False}, 7_721_324_544),
    "minicpm-2b": ({"model_type": "minicpm", "hidden_size": 2304, "intermediate_size": 5760,
                    "num_attention_heads": 36, "num_key_value_heads": 36, "num_hidden_layers": 40,
                    "vocab_size": 122753, "scale_emb": 12, "dim_model_base": 256, "scale_depth": 1.4},
                   2_724_880_896),
    "falcon-7b": ({"model_type": "RefinedWebModel", "hidden_size": 4544, "n_head": 71, "n_layer": 32,
                   "multi_query": True, "parallel_attn": True, "bias": False, "vocab_size": 65024},
                  6_921_720_704),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(REMOTE))
def test_remote_code_counts_match_published(name: str) -> None:
    cfg, published = REMOTE[name]
    assert count_params(arch_from_hf_config(cfg)) == published


def test_remote_code_families_are_all_checked() -> None:
    remote = {t for t, f in FAMILIES.items() if f.source == "remote"}
    assert remote == {cfg["model_type"] for cfg, _ in REMOTE.values()}


def test_qwen1_layout_and_first_key_names() -> None:
    """Qwen-1 (modeling_qwen.py): c_attn with a bias, c_proj and the MLP without (no_bias), w1/w2 of
    intermediate_size // 2; the Aug 2023 config keys (n_embd, n_layer, n_head, ffn_hidden_size) give the
    same model as the later ones."""
    from fitcheck.engine.params import attention_linears, layer_linears

    new, published = REMOTE["qwen-7b"]
    old = {"model_type": "qwen", "n_embd": 4096, "n_layer": 32, "n_head": 32, "kv_channels": 128,
           "ffn_hidden_size": 22016, "no_bias": True, "padded_vocab_size": 151936, "vocab_size": 151936,
           "tie_word_embeddings": False}  # fmt: skip
    a = arch_from_hf_config(new)
    assert arch_from_hf_config(old) == a
    assert (a.intermediate_size, a.qkv_bias, a.o_bias, a.mlp_bias) == (11008, True, False, False)
    names = {lin.name: (lin.d_in, lin.d_out, lin.bias) for lin in layer_linears(a, False)}
    assert names == {
        "c_attn": (4096, 3 * 4096, True),
        "c_proj": (4096, 4096, False),
        "w2": (4096, 11008, False),
        "w1": (4096, 11008, False),
        "mlp.c_proj": (11008, 4096, False),
    }
    assert [x.name for x in attention_linears(a)] == ["c_attn", "c_proj"]
    biased = arch_from_hf_config({**new, "no_bias": False})
    assert count_params(biased) == published + 32 * (4096 + 2 * 11008 + 4096)


FALLBACK = {"model_type": "persimmon", "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 256}  # fmt: skip


def test_meta_fallback_takes_transformers_count_and_warns() -> None:
    pytest.importorskip("transformers")
    from fitcheck.sources.resolve import spec_from_config

    assert "persimmon" not in supported_types()
    spec = spec_from_config(dict(FALLBACK), id="x", name="x", source="test")
    expected = _hf_count("persimmon", "causal", {k: v for k, v in FALLBACK.items() if k != "model_type"})
    assert count_params(spec.arch) == expected
    assert spec.notes and "not modelled natively" in spec.notes[0] and "generic" in spec.notes[0]


def test_unknown_type_without_the_torch_extra_names_types_and_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from fitcheck.sources.resolve import spec_from_config

    monkeypatch.setitem(sys.modules, "torch", None)  # import torch -> ImportError
    with pytest.raises(
        ModelSourceError, match=r"not read natively; supported: .*llama.*fitcheck-train\[torch\]"
    ):
        spec_from_config(dict(FALLBACK), id="x", name="x", source="test")


def test_unknown_type_transformers_does_not_know_either() -> None:
    pytest.importorskip("transformers")
    from fitcheck.sources.resolve import spec_from_config

    with pytest.raises(ModelSourceError, match="not read natively"):
        spec_from_config({**FALLBACK, "model_type": "no_such_family"}, id="x", name="x", source="test")


def test_class_defaults_table_matches_installed_transformers() -> None:
    pytest.importorskip("transformers")
    from bench_helpers import bench_module
    from fitcheck.sources.hf_config import class_defaults

    mod = bench_module("arch_defaults")
    assert class_defaults() == mod.class_defaults_from_transformers(), "regenerate: bench/arch_defaults.py"


@pytest.mark.parametrize("model_type", sorted(CASES))
def test_saved_config_with_defaults_left_out(model_type: str) -> None:
    """save_pretrained writes only the keys that differ from the class defaults (to_diff_dict); the
    converter must fill the rest with the same defaults transformers uses."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    task, cfg = CASES[model_type]
    kw = {k: v for k, v in cfg.items() if v is not None or k == "q_lora_rank"}
    if task == "classify":
        kw["num_labels"] = NUM_LABELS
    config = tf.AutoConfig.for_model(model_type, **kw)
    saved = config.to_diff_dict()
    auto = {"causal": tf.AutoModelForCausalLM, "classify": tf.AutoModelForSequenceClassification,
            "seq2seq": tf.AutoModelForSeq2SeqLM}[task]  # fmt: skip
    with torch.device("meta"):
        model = auto.from_config(config)
    assert count_params(arch_from_hf_config(saved)) == sum(p.numel() for p in model.parameters())


def test_refined_web_reads_as_transformers_converts_it() -> None:
    """Falcon-7B's 2023 ``RefinedWebModel`` config sizes as the ``falcon`` config that transformers'
    falcon/convert_custom_code_checkpoint.py makes of it (n_head, n_layer renamed; no n_head_kv, so
    new_decoder_architecture false)."""
    legacy, _ = REMOTE["falcon-7b"]
    converted = {k: v for k, v in legacy.items() if k not in ("n_head", "n_layer")}
    converted |= {"model_type": "falcon", "num_attention_heads": legacy["n_head"]}
    converted |= {"num_hidden_layers": legacy["n_layer"], "new_decoder_architecture": False}
    old, new = arch_from_hf_config(legacy), arch_from_hf_config(converted)
    assert old.model_copy(update={"model_type": "falcon"}) == new


def test_a_config_that_breaks_a_whole_model_rule_reads_as_one_plain_line() -> None:
    """A rule over several fields (pydantic model validator) names the rule, without pydantic's
    'Value error,' prefix or an empty field path."""
    cfg = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 64, "intermediate_size": 11008, "vocab_size": 32000}  # fmt: skip
    with pytest.raises(ModelSourceError) as err:
        arch_from_hf_config(cfg)
    assert str(err.value) == "config.json: num_attention_heads must be a multiple of num_key_value_heads"
