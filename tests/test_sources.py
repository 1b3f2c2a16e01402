"""Model sources: size strings, configs, safetensors headers."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck.engine.params import count_params
from fitcheck.errors import InputError
from fitcheck.sources.resolve import resolve_model
from fitcheck.sources.size import spec_from_size


@pytest.mark.parametrize(
    ("text", "n"),
    [
        ("7B", 7_000_000_000),
        ("1.5B", 1_500_000_000),
        ("350M", 350_000_000),
        ("1.1e9", 1_100_000_000),
        ("25M", 25_000_000),
        ("70B", 70 * 10**9),
    ],
)
def test_size_strings_exact(text: str, n: int) -> None:
    spec = spec_from_size(text)
    assert count_params(spec.arch) == n
    a = spec.arch
    assert a.num_heads * a.head_dim == a.hidden_size
    assert 1.5 <= a.intermediate_size / a.hidden_size <= 4.0


@given(st.integers(1, 400).map(lambda k: k * 10**8))
def test_round_sizes_are_exact(n: int) -> None:
    assert count_params(spec_from_size(str(n)).arch) == n


@pytest.mark.parametrize("bad", ["7Q", "-3B", "0B", "1e40", "B7", ""])
def test_bad_sizes(bad: str) -> None:
    with pytest.raises(InputError):
        spec_from_size(bad)


def _st_file(path: Path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    header: dict[str, object] = {}
    offset = 0
    size = {"BF16": 2, "F32": 4}
    for name, (dtype, shape) in tensors.items():
        n = size[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * offset)


def test_safetensors_exact_counts(tmp_path: Path) -> None:
    cfg = {
        "model_type": "llama",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
        "tie_word_embeddings": True,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _st_file(
        tmp_path / "model.safetensors",
        {
            "model.embed_tokens.weight": ("BF16", [100, 64]),
            "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64]),
            "model.norm.weight": ("F32", [64]),
        },
    )
    spec = resolve_model(str(tmp_path))
    assert spec.source_kind == "safetensors"
    assert spec.declared_params == 100 * 64 + 64 * 64 + 64
    assert {g.dtype for g in spec.file_groups} == {"bf16", "fp32"}


LLAMA_SHAPE = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 4, "vocab_size": 1000,
}  # fmt: skip


@pytest.mark.parametrize(
    ("keys", "read_as", "where"),
    [
        ({"auto_map": {"AutoConfig": "configuration_llama.LlamaConfig"}}, "llama", "auto_map"),
        (
            {"auto_map": {"AutoConfig": "org/repo--configuration_mistral.MistralConfig"}},
            "mistral",
            "auto_map",
        ),
        ({"architectures": ["LlamaForCausalLM"]}, "llama", "architectures"),
        ({"architectures": ["Qwen2ForCausalLM"]}, "qwen2", "architectures"),
    ],
)
def test_a_config_without_model_type_is_read_from_its_classes(
    tmp_path: Path, keys: dict[str, object], read_as: str, where: str
) -> None:
    """transformers reads a remote-code repo's type from the config class its auto_map names; fitcheck
    reads the module name (configuration_<type>), else the architectures class, and says so."""
    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_SHAPE, **keys}))
    spec = resolve_model(str(tmp_path))
    assert spec.arch.model_type == read_as  # type: ignore[union-attr]
    assert any(f"read as '{read_as}' from {where}" in w for w in spec.notes)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "keys", [{}, {"architectures": ["FooForCausalLM"]}, {"auto_map": {"AutoConfig": "x.FooConfig"}}]
)
def test_a_config_without_a_readable_type_is_refused(tmp_path: Path, keys: dict[str, object]) -> None:
    from fitcheck.errors import FitcheckError

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA_SHAPE, **keys}))
    with pytest.raises(FitcheckError, match="model_type must name the architecture"):
        resolve_model(str(tmp_path))
