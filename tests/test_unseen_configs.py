"""Unseen-model sweep: published Hub configs of models fitcheck had not been checked on, read from their
folders (what ``fitcheck estimate ./folder`` reads) and held against the parameter count published for the
model; each estimated end to end, and the ones fitcheck cannot model refused in one line with exit 2.

The configs are stored under tests/data/unseen_configs/<org>/<name>/config.json; that folder's README gives
where each was read (repository, path, commit) and what the copy changed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fitcheck.engine.params import count_params
from fitcheck.sources.resolve import spec_from_path
from test_hub import SRC
from test_model_reach_fifth import _check_json_adds_up, _cli_runs

DATA = Path(__file__).parent / "data" / "unseen_configs"

#: Published totals as (figure, tolerance): half a unit of the last digit the source states (a size in a
#: model's name: its own rounding). Sources in tests/data/unseen_configs/README.md.
FIGURES: dict[str, tuple[float, float]] = {
    # GPT-BigCode, sized on the meta device: multi-query attention and tied embeddings (1.41B / 18.72B
    # before the fallback read them; now transformers' own count, as the warning says)
    "WizardLMTeam/WizardCoder-15B-V1.0": (15.5e9, 0.05e9),  # StarCoder's "15.5B parameter models"
    "bigcode/gpt_bigcode-santacoder": (1.1e9, 0.05e9),  # SantaCoder's "1.1B parameter models"
    # MiniCPM-MoE: the 8 experts of every layer (2.72B, the dense sibling, before)
    "openbmb/MiniCPM-MoE-8x2B": (14e9, 0.5e9),
    "nvidia/Nemotron-Mini-4B-Instruct": (4e9, 0.5e9),
    "allenai/OLMo-2-1124-7B": (7.3e9, 0.05e9),
    "CohereForAI/aya-23-8B": (8.0e9, 0.05e9),
    "bigcode/starcoder2-7b": (7.17e9, 0.005e9),
    "Qwen/Qwen1.5-MoE-A2.7B": (14.3e9, 0.05e9),
    "stabilityai/stablelm-2-zephyr-1_6b": (1.64e9, 0.005e9),
    "microsoft/Phi-4-mini-instruct": (3.84e9, 0.005e9),
    "llava-hf/llava-1.5-7b-hf": (7.06e9, 0.005e9),
    "Qwen/Qwen3-VL-4B-Instruct": (4.44e9, 0.005e9),
    "Qwen/Qwen2.5-VL-3B-Instruct": (3.75e9, 0.005e9),
    "openbmb/MiniCPM4-8B": (8e9, 0.5e9),
    "Qwen/Qwen1.5-4B-Chat": (3.95e9, 0.005e9),
    # mllama, sized on the meta device: its image-text-to-text class, with the vision tower and projector
    # (9.78B before: transformers' AutoModelForCausalLM builds the text model alone for mllama)
    "meta-llama/Llama-3.2-11B-Vision-Instruct": (10.7e9, 0.05e9),
    # DBRX, sized on the meta device: its published ffn_config's moe_normalize_expert_weights: 1 (an integer
    # where transformers 5.24 types a float) is read as 1.0 (refused in one line before); "132B total
    # parameters" (Databricks' model card)
    "mlx-community/dbrx-instruct-4bit": (132e9, 0.5e9),
}

#: Remote-code or wrapper models the tests hold to a hand count (transformers cannot build them here).
#: MiniCPM-MoE-8x2B (modeling_minicpm.py MiniCPMMoE: num_experts MLPs of intermediate_size, a bias-free
#: router): per layer 8 x 3 x 2304 x 5760 experts + 2304 x 8 router + 4 x 2304^2 attention + 2 x 2304
#: norms = 339,761,664; x 40 layers + 122,753 x 2304 tied embedding + 2304 final norm.
HAND: dict[str, int] = {"openbmb/MiniCPM-MoE-8x2B": 40 * 339_761_664 + 122_753 * 2304 + 2304}

#: Refused in one line, with the words the line must carry.
REFUSED: dict[str, tuple[str, ...]] = {
    # no model_type; its auto_map names MiniCPM3Config (latent attention) in configuration_minicpm.py: it
    # was read as MiniCPM (4.86B against the card's 4B) from the module's name
    "openbmb/MiniCPM3-4B": ("model_type", "MiniCPM3Config"),
    # no class transformers builds; transformers' own config warnings (7 lines) used to precede the error
    "Qwen/Qwen2.5-Omni-7B": ("qwen2_5_omni",),
}


def _folder(repo: str) -> Path:
    return DATA / repo


def _ours(repo: str) -> int:
    return count_params(spec_from_path(_folder(repo)).arch)


def test_every_stored_config_is_tested() -> None:
    stored = {str(p.parent.relative_to(DATA)) for p in DATA.glob("*/*/config.json")}
    assert stored == {*FIGURES, *REFUSED}


@pytest.mark.parametrize("repo", sorted(FIGURES))
def test_count_within_the_published_figure(repo: str) -> None:
    if repo in (
        "WizardLMTeam/WizardCoder-15B-V1.0",
        "bigcode/gpt_bigcode-santacoder",
        "meta-llama/Llama-3.2-11B-Vision-Instruct",
        "mlx-community/dbrx-instruct-4bit",
    ):
        pytest.importorskip("transformers")  # sized by the meta-device fallback
    figure, tolerance = FIGURES[repo]
    assert abs(_ours(repo) - figure) <= tolerance


@pytest.mark.parametrize("repo", sorted(HAND))
def test_count_equals_the_hand_count(repo: str) -> None:
    assert _ours(repo) == HAND[repo]


def _transformers_count(cfg: dict[str, Any]) -> int:
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    config = tf.AutoConfig.for_model(cfg["model_type"], **{k: v for k, v in cfg.items() if k != "model_type"})
    vision = cfg["model_type"] in ("llava", "qwen2_5_vl", "qwen3_vl", "mllama")
    auto = tf.AutoModelForImageTextToText if vision else tf.AutoModelForCausalLM
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


#: The transformers types among them, each held to the model transformers builds from the same file.
TRANSFORMERS_TYPES = sorted(
    r
    for r in FIGURES
    if json.loads((_folder(r) / "config.json").read_text())["model_type"] not in ("minicpm", "dbrx")
)


def test_dbrx_is_transformers_count_with_its_integer_read_as_a_float() -> None:
    """transformers refuses DBRX's published file as it stands (an integer where it types a float), so it
    is held to transformers' count of the same file with that value as 1.0."""
    cfg = json.loads((_folder("mlx-community/dbrx-instruct-4bit") / "config.json").read_text())
    cfg["ffn_config"]["moe_normalize_expert_weights"] = 1.0
    assert _ours("mlx-community/dbrx-instruct-4bit") == _transformers_count(cfg) == 131_596_523_520


@pytest.mark.parametrize("repo", TRANSFORMERS_TYPES)
def test_count_equals_transformers_on_the_published_config(repo: str) -> None:
    cfg = json.loads((_folder(repo) / "config.json").read_text())
    assert _ours(repo) == _transformers_count(cfg)


def test_each_model_estimates_end_to_end() -> None:
    """LoRA, QLoRA and full fine-tuning (JSON) on every counted model: exit 0, no traceback, the JSON's
    phases add up, its parameter total is the count held above and every phase holds activations."""
    pytest.importorskip("transformers")
    argvs = []
    for repo in sorted(FIGURES):
        folder = str(_folder(repo))
        for method in ("lora", "qlora"):
            argvs.append(["estimate", folder, "--method", method, "--on", "none"])
        argvs.append(["estimate", folder, "--method", "full", "--format", "json", "--on", "none"])
    runs = _cli_runs(argvs)
    for repo in sorted(FIGURES):
        folder = str(_folder(repo))
        for method in ("lora", "qlora"):
            rc, out, err = runs[f"estimate {folder} --method {method} --on none"]
            assert rc == 0 and "Traceback" not in err and out.strip(), (repo, method, err[-500:])
        rc, out, err = runs[f"estimate {folder} --method full --format json --on none"]
        assert rc == 0 and "Traceback" not in err, (repo, err[-500:])
        doc = json.loads(out)
        _check_json_adds_up(doc)
        assert doc["params"]["total"] == doc["params"]["trainable"] == _ours(repo)
        forward = next(p for p in doc["phases"] if p["name"] == "forward")
        acts = [c["bytes"] for c in forward["components"] if "activation" in c["name"]]
        assert acts and min(acts) > 0, (repo, forward["components"])


def test_out_of_scope_models_refused_in_one_line() -> None:
    pytest.importorskip("transformers")
    argvs = [
        ["estimate", str(_folder(repo)), "--method", method, "--on", "none"]
        for repo in sorted(REFUSED)
        for method in ("lora", "full")
    ]
    runs = _cli_runs(argvs)
    for argv in argvs:
        rc, out, err = runs[" ".join(argv)]
        repo = argv[1].removeprefix(str(DATA) + "/")
        lines = err.strip().splitlines()
        assert rc == 2 and out == "" and len(lines) == 1, (repo, err[-800:])
        assert lines[0].startswith("fitcheck: error:"), lines[0]
        for word in REFUSED[repo]:
            assert word in lines[0], (repo, lines[0])


def test_transformers_own_warnings_stay_off_stderr() -> None:
    """A real process (transformers' logger holds the process's stderr, which an in-process redirect does
    not catch): the Qwen2.5-Omni refusal is its one error line, without the seven "must be within the
    vocabulary" warnings transformers' configuration class logs while fitcheck asks it for the model."""
    pytest.importorskip("transformers")
    env = {"PYTHONPATH": SRC, "HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    folder = str(_folder("Qwen/Qwen2.5-Omni-7B"))
    argv = [sys.executable, "-m", "fitcheck", "estimate", folder, "--on", "none"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and proc.stdout == "" and len(lines) == 1, proc.stderr[-1500:]
    assert "qwen2_5_omni" in lines[0]


#: cli99/llm-analysis llm_analysis/model_configs/upstage_Llama-2-70b-instruct-v2.json @ d841e40a: that tool's
#: own format (``hidden_dim``, ``ffn_embed_dim``), not a Hub config, under model_type llama. transformers
#: builds LlamaConfig's default width from it, and so does fitcheck (14.1B for a 70B model), now saying so.
LLM_ANALYSIS_70B: dict[str, Any] = {
    "name": "upstage_Llama-2-70b-instruct-v2", "num_layers": 80, "n_head": 64, "hidden_dim": 8192,
    "vocab_size": 32000, "max_seq_len": 4096, "num_key_value_heads": 8, "ffn_embed_dim": 28672,
    "model_type": "llama", "mlp_gated_linear_units": True,
}  # fmt: skip


def test_a_shape_left_to_class_defaults_is_named() -> None:
    from fitcheck.sources.resolve import spec_from_config

    spec = spec_from_config(dict(LLM_ANALYSIS_70B), id="x", name="x", source="test")
    assert spec.arch.hidden_size == 4096  # LlamaConfig's default, as transformers builds it
    notes = [n for n in spec.notes if "states no" in n]
    assert len(notes) == 1 and "hidden_size 4,096" in notes[0] and "intermediate_size 11,008" in notes[0]
    # a Hub config that states its shape, and a multimodal wrapper whose text_config relies on its
    # class (llava-1.5's), are not flagged
    for repo in ("allenai/OLMo-2-1124-7B", "llava-hf/llava-1.5-7b-hf"):
        assert not [n for n in spec_from_path(_folder(repo)).notes if "states no" in n]


def test_a_model_without_embedding_accessors_reads_as_tied() -> None:
    """PP-FormulaNet's ``get_input_embeddings`` raises NotImplementedError in transformers 5.24: the
    fallback's tie check must not let it through as a traceback."""
    from fitcheck.sources.meta_fallback import _ties_its_head

    class NoAccessors:
        def get_output_embeddings(self) -> None:
            return None

        def get_input_embeddings(self) -> None:
            raise NotImplementedError("not auto-handled")

    assert _ties_its_head(NoAccessors()) is True


def test_a_type_the_generic_shape_overcounts_is_refused() -> None:
    """HRM's default config: transformers counts 1,447,822,848 parameters and the generic decoder shape
    its keys give counts more (3.29B was reported, beside a warning that claimed transformers' count)."""
    tf = pytest.importorskip("transformers")
    from fitcheck.errors import ModelSourceError
    from fitcheck.sources.resolve import spec_from_config

    cfg = {**tf.AutoConfig.for_model("hrm_text").to_dict(), "model_type": "hrm_text"}
    with pytest.raises(ModelSourceError, match="fewer than the generic decoder shape"):
        spec_from_config(cfg, id="x", name="x", source="test")
