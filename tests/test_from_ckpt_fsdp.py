"""``--from``: a trainer file's reentrant checkpointing (axolotl / TrainingArguments
``gradient_checkpointing_kwargs.use_reentrant``, LLaMA-Factory ``use_reentrant_gc``), kept as
``ckpt_reentrant`` only for QLoRA with checkpointing and set aside with a note otherwise (docs/from.md,
"Reentrant checkpointing"); axolotl FSDP without ``fsdp_version`` (docs/from.md, "FSDP version")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fitcheck.cli import main
from fitcheck.readers import read_config


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def components(d: dict[str, Any]) -> set[str]:
    return {c["name"] for phase in d["phases"] for c in phase["components"]}


def estimate(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | None, str]:
    rc = main(["estimate", "llama-2-7b", *args, "--format", "json"])
    out, err = capsys.readouterr()
    return rc, (json.loads(out) if rc == 0 else None), err


AXOLOTL_QLORA = """base_model: meta-llama/Llama-2-7b-hf
adapter: {adapter}
load_in_4bit: {four}
gradient_checkpointing: true
gradient_checkpointing_kwargs:
  use_reentrant: false
sequence_len: 1024
"""


def test_axolotl_use_reentrant_reaches_a_qlora_run_and_moves_its_kept_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, "ax.yaml", AXOLOTL_QLORA.format(adapter="qlora", four="true"))
    rc, d, err = estimate(["--from", path, "--bnb-keeps-input"], capsys)
    assert rc == 0 and d is not None, err
    assert d["setup"]["ckpt_reentrant"] is False and d["setup_origin"]["ckpt_reentrant"] == "file"
    assert "held_4bit_inputs" in components(d)  # non-reentrant checkpointing keeps bitsandbytes' inputs
    # the same file with use_reentrant true (axolotl's own default) holds none of them
    reentrant = write(
        tmp_path, "ax2.yaml", AXOLOTL_QLORA.format(adapter="qlora", four="true").replace("false", "true")
    )
    rc, d2, err = estimate(["--from", reentrant, "--bnb-keeps-input"], capsys)
    assert rc == 0 and d2 is not None, err
    assert d2["setup"]["ckpt_reentrant"] is True
    assert "held_4bit_inputs" not in components(d2)


def test_use_reentrant_outside_qlora_with_checkpointing_is_a_note_not_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lora = write(tmp_path, "lora.yaml", AXOLOTL_QLORA.format(adapter="lora", four="false"))
    rc, d, err = estimate(["--from", lora], capsys)
    assert rc == 0 and d is not None, err
    assert d["setup"]["ckpt_reentrant"] is None and d["setup_origin"]["ckpt_reentrant"] == "fitcheck default"
    assert (
        "gradient_checkpointing_kwargs.use_reentrant: read only for QLoRA" in err and "(method lora)" in err
    )
    # the command line turns checkpointing off: the file's use_reentrant no longer applies, still exit 0
    qlora = write(tmp_path, "qlora.yaml", AXOLOTL_QLORA.format(adapter="qlora", four="true"))
    rc, d, err = estimate(["--from", qlora, "--no-grad-ckpt"], capsys)
    assert rc == 0 and d is not None, err
    assert d["setup"]["ckpt_reentrant"] is None and "(no gradient checkpointing)" in err


def test_training_arguments_kwargs_json_text_and_the_new_name(tmp_path: Path) -> None:
    body = "model_name_or_path: meta-llama/Llama-2-7b-hf\nuse_peft: true\nload_in_4bit: true\n"
    text = write(
        tmp_path, "t.yaml", body + """gradient_checkpointing_kwargs: '{"use_reentrant": false, "x": 1}'\n"""
    )
    got = read_config(text, "trl")
    assert got.values["ckpt_reentrant"] is False
    assert got.keys["ckpt_reentrant"] == "gradient_checkpointing_kwargs.use_reentrant"
    assert "gradient_checkpointing_kwargs.x" in got.unused  # what is not read is listed
    both = (
        body
        + "gradient_checkpointing_kwargs: {use_reentrant: false}\n"
        + "activation_checkpointing_kwargs: {use_reentrant: true}\n"
    )
    got = read_config(write(tmp_path, "b.yaml", both), "trl")
    assert got.values["ckpt_reentrant"] is True  # transformers 5.23+: the new name wins
    assert got.keys["ckpt_reentrant"] == "activation_checkpointing_kwargs.use_reentrant"
    bad = write(tmp_path, "bad.yaml", body + "gradient_checkpointing_kwargs: '{\"use_reentrant\": }'\n")
    with pytest.raises(Exception, match="gradient_checkpointing_kwargs"):
        read_config(bad, "trl")


def test_trl_forces_reentrant_for_peft_under_zero3(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "z3.yaml",
        "model_name_or_path: meta-llama/Llama-2-7b-hf\nuse_peft: true\nload_in_4bit: true\n"
        "accelerate_config: zero3\ngradient_checkpointing_kwargs: {use_reentrant: false}\n",
    )
    rc, d, err = estimate(["--from", path, "--on", "2xh100-80gb"], capsys)
    assert rc == 0 and d is not None, err
    assert d["setup"]["strategy"] == "zero3" and d["setup"]["ckpt_reentrant"] is True
    assert "forces reentrant checkpointing for PEFT under ZeRO-3" in err


def test_llamafactory_use_reentrant_gc_with_its_default_checkpointing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path,
        "lmf.yaml",
        "model_name_or_path: meta-llama/Llama-2-7b-hf\nstage: sft\ndo_train: true\nfinetuning_type: lora\n"
        "quantization_bit: 4\nuse_reentrant_gc: false\n",
    )
    rc, d, err = estimate(["--from", path], capsys)
    assert rc == 0 and d is not None, err
    # checkpointing is LLaMA-Factory's default, so the QLoRA run keeps the file's kind
    assert d["setup"]["grad_ckpt"] is True and d["setup"]["ckpt_reentrant"] is False


AXOLOTL_FSDP = """base_model: meta-llama/Llama-2-7b-hf
adapter: lora
sequence_len: 1024
fsdp_config:
  auto_wrap_policy: TRANSFORMER_BASED_WRAP
  transformer_layer_cls_to_wrap: LlamaDecoderLayer
{extra}"""


@pytest.mark.parametrize(
    ("extra", "version", "origin_key"),
    [
        ("", 1, "fsdp_config (fsdp_version unset: axolotl pins 1)"),
        ("fsdp_version: 2\n", 2, "fsdp_version"),
        ("  fsdp_version: 2\n", 2, "fsdp_version"),
        ("  version: 1\n", 1, "fsdp_version"),
    ],
)
def test_axolotl_fsdp_without_a_version_is_fsdp1_as_axolotl_pins_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: str, version: int, origin_key: str
) -> None:
    path = write(tmp_path, "fsdp.yaml", AXOLOTL_FSDP.format(extra=extra))
    got = read_config(path)
    assert got.values["fsdp_version"] == version and got.keys["fsdp_version"] == origin_key
    pinned = [n for n in got.notes if n.startswith("fsdp_version unset")]
    assert bool(pinned) == (extra == "")
    rc, d, err = estimate(["--from", path, "--on", "2xh100-80gb"], capsys)
    assert rc == 0 and d is not None, err
    assert d["setup"]["fsdp_version"] == version and d["setup_origin"]["fsdp_version"] == "file"
    assert ("axolotl pins FSDP1" in err) == (extra == "")  # the user sees why it is FSDP1
