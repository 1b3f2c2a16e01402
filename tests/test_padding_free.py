"""TRL's padding-free batches (``--padding-free``: ``padding_free``, or ``packing`` with its default
``bfd`` strategy): the micro-batch's examples flattened into one row, ``position_ids`` restarting at each
example and no ``attention_mask`` (trl/trainer/sft_trainer.py ``DataCollatorForLanguageModeling``,
trl 1.16.0). transformers finds the packed sequences from the position ids (masking_utils
``find_packed_sequence_indices``, with no cache: TRL's ``compute_loss`` passes ``use_cache=False``) and
hands SDPA a block-diagonal mask over the whole row, so every layer keeps a ``(b s)^2`` mask copy and
expands grouped K/V (engine/activations.py ``sdpa_mask_copy_bytes``, ``masked_gqa``). FlashAttention-2
attends per example from the position ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli import main
from fitcheck.engine.estimate import estimate
from fitcheck.errors import OptionError
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config
from saved_helpers import forward_lines, saved_bytes

LLAMA: dict[str, Any] = {
    "model_type": "llama", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 512,
}  # fmt: skip


def _spec(cfg: dict[str, Any]) -> ModelSpec:
    return ModelSpec(id="t", name="t", source_kind="hf_config", arch=arch_from_hf_config(dict(cfg)))


def test_a_padding_free_row_saves_what_the_engine_counts() -> None:
    """A real bf16 step of transformers' Llama on the CPU: the flattened row of b examples (position ids
    restarting) against the same row as one sequence saves exactly the engine's added lines (a
    ``(b s)^2`` mask copy per layer, K/V expanded to every head)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**{k: v for k, v in LLAMA.items() if k != "model_type"})
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).train()
    b, s = 4, 64
    ids = torch.randint(0, LLAMA["vocab_size"], (1, b * s))
    packed = torch.arange(s).repeat(b)[None]  # TRL's position ids: each example from 0
    plain = torch.arange(b * s)[None]
    run = {"input_ids": ids, "labels": ids, "use_cache": False}
    measured = saved_bytes(model, **run, position_ids=packed) - saved_bytes(model, **run, position_ids=plain)

    setups = [
        LlmSetup(method="full", precision="bf16", trainer="hf", seq_len=s, batch_size=b, padding_free=free)
        for free in (True, False)
    ]
    assert measured > 0
    assert forward_lines(_spec(LLAMA), setups[0]) - forward_lines(_spec(LLAMA), setups[1]) == measured


@pytest.mark.parametrize("attn", ["flash", "sdpa"])
def test_flash_attends_per_example_sdpa_holds_the_rows_mask(attn: str) -> None:
    base = {"method": "lora", "trainer": "hf", "seq_len": 512, "batch_size": 4, "attn": attn}
    plain, free = (estimate(_spec(LLAMA), LlmSetup(**base, padding_free=f)) for f in (False, True))
    if attn == "flash":
        assert free.device_bytes == plain.device_bytes
    else:  # a 2048 x 2048 mask copy per layer, in bf16
        assert free.device_bytes - plain.device_bytes >= LLAMA["num_hidden_layers"] * 2048 * 2048 * 2


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"attn": "eager"}, "computes every score of the flattened row"),
        ({"backend": "mps"}, "computes every score of the flattened row"),
        ({"method": "prefix-tuning", "prefix_tokens": 16}, "not modelled with --method prefix-tuning"),
    ],
)
def test_what_padding_free_does_not_model_is_refused(change: dict[str, Any], words: str) -> None:
    setup = LlmSetup(**{"method": "lora", "trainer": "hf", "padding_free": True, **change})
    with pytest.raises(OptionError, match=words):
        estimate(_spec(LLAMA), setup)


@pytest.mark.parametrize(
    ("text", "free"),
    [
        ("packing: true\n", True),  # packing_strategy defaults to bfd, which turns padding_free on
        ("packing: true\npacking_strategy: bfd_split\n", True),
        ("packing: true\npacking_strategy: wrapped\n", False),
        ("padding_free: true\n", True),
        ("", False),
    ],
)
def test_a_trl_file_poses_padding_free_as_trl_decides_it(
    text: str, free: bool, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "sft.yaml"
    path.write_text("model_name_or_path: Qwen/Qwen2.5-0.5B\nuse_peft: true\nmax_length: 1024\n" + text)
    assert main(["estimate", "qwen2.5-0.5b", "--from", str(path), "--on", "none", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"].get("padding_free", False) is free


def test_a_padding_free_plan_is_written_for_trl_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    args = ["plan", "qwen2.5-0.5b", "--on", "rtx-4090", "--padding-free"]
    assert main([*args, "--emit", "hf.yaml", "-o", str(tmp_path)]) == 0
    assert yaml.safe_load((tmp_path / "hf.yaml").read_text())["padding_free"] is True
    assert main([*args, "--emit", "axolotl.yaml", "-o", str(tmp_path / "ax")]) == 2
    assert "emit hf.yaml for it" in capsys.readouterr().err


def test_the_rows_mask_is_told_and_flash_offered() -> None:
    from fitcheck import api

    est = api.estimate(
        "llama-3.1-8b", on="rtx-4090", method="lora", batch_size=4, trainer="hf", padding_free=True
    )
    assert any(w.startswith("padding-free under SDPA") and "8,192 x 8,192" in w for w in est.warnings)
    assert est.target is not None and "--attn flash" in [s.flag for s in est.target.suggestions]
