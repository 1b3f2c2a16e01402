"""torch.compile (`engine.compiled`) against the partition traces bench/compile_trace.py recorded.

tests/data/compile/partition.yaml holds, per traced layer, the tensors the min-cut partitioner saved
(shape, dtype) and their per-token sum; the engine's compiled layer rule must give the same bytes per
token (and per key for eager scores) for every traced family and method, exactly. The loss records fix
what the compiled cross-entropy keeps: the compute-dtype logits and 8 bytes per row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from fitcheck.engine import activations as act
from fitcheck.engine import compiled, loss
from fitcheck.engine.estimate import estimate
from fitcheck.engine.params import layer_linears
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup, ModelSpec
from fitcheck.sources.hf_config import arch_from_hf_config

DATA = yaml.safe_load((Path(__file__).parent / "data" / "compile" / "partition.yaml").read_text("utf-8"))
LAYERS = [r for r in DATA["records"] if r["id"].endswith("-layer")]
#: The traced methods as fitcheck setups: torchtune's dtypes (bf16, no autocast) and HF Trainer's autocast.
METHODS: dict[str, dict[str, Any]] = {
    "full": {"method": "full", "trainer": "torchtune"},
    "full-autocast": {"method": "full", "trainer": "hf"},
    "lora": {"method": "lora", "trainer": "torchtune"},
    "lora-autocast": {"method": "lora", "trainer": "hf"},
}


def _setup(rec: dict[str, Any], **kw: Any) -> LlmSetup:
    lora = DATA["lora"]
    return LlmSetup(
        **METHODS[rec["method"]],
        batch_size=DATA["batch"],
        seq_len=DATA["seq_len"],
        lora_rank=lora["rank"],
        lora_targets=lora["targets"],
        lora_dropout=lora["dropout"],
        attn=rec["attn"],
        **kw,
    )


def _arch(rec: dict[str, Any]) -> Any:
    return arch_from_hf_config(DATA["hf_configs"][rec["family"]])


def test_trace_covers_four_families_and_every_method() -> None:
    assert {r["family"] for r in LAYERS} == {"llama", "qwen2", "mistral", "gemma2"}
    assert {r["method"] for r in LAYERS} == set(METHODS)
    assert DATA["tool_versions"]["torch"]


@pytest.mark.parametrize("rec", LAYERS, ids=[r["id"] for r in LAYERS])
def test_compiled_layer_matches_partition_trace(rec: dict[str, Any]) -> None:
    a, setup = _arch(rec), _setup(rec, compile=True)
    regime = regime_for(setup)
    assert compiled.untraced(a, setup, regime) == ""
    acts = act.layer_activations(a, setup, regime)
    assert sum(acts.parts.values()) == pytest.approx(rec["bytes_per_token"], abs=1e-6)
    assert acts.scores == pytest.approx(rec["score_bytes_per_token_per_key"], abs=1e-6)


@pytest.mark.parametrize("rec", LAYERS, ids=[r["id"] for r in LAYERS])
def test_compiled_layer_saves_less_than_eager(rec: dict[str, Any]) -> None:
    a = _arch(rec)
    on, off = _setup(rec, compile=True), _setup(rec)
    regime = regime_for(off)
    assert act.layer_activations(a, on, regime).total(64) < act.layer_activations(a, off, regime).total(64)


@pytest.mark.parametrize("rec", [r for r in DATA["records"] if "logits_wide_bytes_per_entry" in r])
def test_compiled_loss_keeps_the_logits_and_two_fp32_values_per_row(rec: dict[str, Any]) -> None:
    assert rec["logits_wide_bytes_per_entry"] == 2.0
    # besides amax and log: the int64 labels (HF pads them by one position to shift), a scalar
    labels = 8 * (DATA["seq_len"] + (0 if rec["id"] == "torchtune-chunk-ce" else 1)) / DATA["seq_len"]
    rest = rec["row_bytes_per_token"] - compiled.LSE_BYTES_PER_ROW - labels
    assert 0 <= rest < 0.1


def test_checkpointed_whole_model_keeps_one_input_per_layer() -> None:
    (rec,) = [r for r in DATA["records"] if r["id"].endswith("model-ckpt")]
    assert rec["hidden_wide_saved"] == DATA["hf_configs"]["llama"]["num_hidden_layers"]


def _spec(family: str) -> ModelSpec:
    return ModelSpec(
        id=family, name=family, source_kind="hf_config", arch=arch_from_hf_config(DATA["hf_configs"][family])
    )


@pytest.mark.parametrize("trainer,kernel", [("torchtune", "chunked"), ("hf", "standard")])
def test_compiled_loss_hump_is_the_logits(trainer: str, kernel: str) -> None:
    setup = LlmSetup(method="lora", trainer=trainer, batch_size=2, seq_len=512, compile=True)
    regime = regime_for(setup)
    a = _spec("llama").arch
    assert loss.kernel_for(setup, regime) == kernel
    h = loss.hump(a, setup, regime, 2)
    tv = setup.tokens * a.vocab_size
    assert h.forward == 2 * tv + 8 * setup.tokens
    assert h.forward < loss.hump(a, setup.model_copy(update={"compile": False}), regime, 2).forward


def test_compile_off_moves_nothing() -> None:
    for family in ("llama", "gemma2"):
        setup = LlmSetup(method="lora", trainer="torchtune", batch_size=2, seq_len=256, grad_ckpt=True)
        none, off = (
            estimate(_spec(family), setup),
            estimate(_spec(family), setup.model_copy(update={"compile": False})),
        )
        assert none.peak_allocated_bytes == off.peak_allocated_bytes


def test_untraced_architecture_keeps_the_eager_rule_and_says_so() -> None:
    cfg = {**DATA["hf_configs"]["llama"], "model_type": "gpt2", "n_embd": 256, "n_layer": 2, "n_head": 4}
    spec = ModelSpec(id="g", name="g", source_kind="hf_config", arch=arch_from_hf_config(cfg))
    setup = LlmSetup(method="full", batch_size=1, seq_len=128, compile=True)
    est = estimate(spec, setup)
    assert any("torch.compile" in w for w in est.warnings)


@pytest.mark.parametrize(
    "fmt,text,want",
    [
        (
            "torchtune",
            "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\ncompile: 1\n",
            True,
        ),
        ("trl", "model_name_or_path: meta-llama/Llama-3.2-1B\ntorch_compile: true\n", True),
        (
            "llamafactory",
            "model_name_or_path: meta-llama/Llama-3.2-1B\nstage: sft\ntorch_compile: no\n",
            False,
        ),
        ("axolotl", "base_model: meta-llama/Llama-3.2-1B\ntorch_compile: true\n", True),
        ("axolotl", "base_model: meta-llama/Llama-3.2-1B\ntorch_compile: auto\n", None),
    ],
)
def test_from_readers_take_compile(tmp_path: Path, fmt: str, text: str, want: bool | None) -> None:
    from fitcheck.readers import read_config

    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    got = read_config(str(path), fmt)
    assert got.values.get("compile") is want
    if want is None:
        assert any("torch_compile: auto" in n for n in got.notes)


def test_cli_takes_compile_and_echoes_it(capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fitcheck.cli import main

    base = ["estimate", "llama-3.1-8b", "--method", "lora", "--trainer", "torchtune", "--grad-ckpt"]
    base += ["--batch-size", "2", "--seq-len", "2048", "--on", "rtx-4090", "-f", "json"]
    docs = []
    for flag in ("--compile", "--no-compile"):
        main([*base, flag])
        docs.append(json.loads(capsys.readouterr().out))
    on, off = docs
    assert on["setup"]["compile"] is True and off["setup"]["compile"] is False
    assert on["device_bytes"] < off["device_bytes"]
    assert any("torch.compile" in w for w in on["warnings"])
    assert (
        main(["estimate", "llama-3.2-1b", "--compile", "--trainer", "mlx", "--on", "apple-m2-max-32gb"]) == 2
    )


@pytest.mark.parametrize("rec", [r for r in DATA["records"] if "inductor_buffers" in r])
def test_inductor_allocates_nothing_vocabulary_wide_but_the_bf16_gradient(rec: dict[str, Any]) -> None:
    """Inductor's own generated code (CPU): the forward allocates per-row fp32 values only, the backward
    one compute-dtype gradient of the logits: the fp32 upcast and log-softmax never exist."""
    vocab = rec["saved"][0]["shape"][-1]
    bufs = rec["inductor_buffers"]
    assert not [b for b in bufs["forward"] if b["shape"][-1:] == [vocab]]
    wide = [b for b in bufs["backward"] if b["shape"][-1:] == [vocab]]
    assert [b["dtype"] for b in wide] == ["bfloat16"]


NF4 = [r for r in DATA["records"] if r["id"] == "torchao-linear-nf4"]


@pytest.mark.parametrize("rec", NF4, ids=[r["id"] for r in NF4])
def test_compiled_nf4_saves_the_dequantized_weight_and_fuses_its_making(rec: dict[str, Any]) -> None:
    """torchao's linear_nf4 compiled: the partitioner saves the compute-dtype weight (not the NF4 data);
    Inductor's forward writes it in one buffer (no int64 indices or halves) and its backward makes none."""
    ((shape, dtype),) = [(t["shape"], t["dtype"]) for t in rec["saved"]]
    assert dtype == "bfloat16"
    numel = shape[0] * shape[1]
    fwd, bwd = rec["inductor_buffers"]["forward"], rec["inductor_buffers"]["backward"]
    assert not [b for b in fwd + bwd if b["dtype"] == "int64"]

    def size(b: dict[str, Any]) -> int:
        out = 1
        for d in b["shape"]:
            out *= d
        return out

    assert [b["dtype"] for b in fwd if size(b) == numel] == ["bfloat16"]
    assert not [b for b in bwd if size(b) == numel]
    assert compiled.nf4_dequant_bytes(numel, 2) == 2 * numel


def test_compiled_qlora_layer_keeps_its_weights_in_bf16() -> None:
    """The traced NF4 rule at model scale: one compiled QLoRA layer saves its projections in bf16, so
    without checkpointing every layer does (a compiled QLoRA run without checkpointing holds a bf16 copy of
    its quantized weights); with checkpointing only the recomputed layer."""
    from fitcheck.sources.resolve import resolve_model

    spec = resolve_model("llama-3.1-8b")
    a = spec.arch
    setup = LlmSetup(method="qlora", trainer="torchtune", batch_size=2, seq_len=2048, compile=True)
    layer = sum(x.d_in * x.d_out for x in layer_linears(a, False))
    assert compiled.nf4_saved_bytes(a, setup, regime_for(setup)) == 2 * layer
    no_ckpt, ckpt = estimate(spec, setup), estimate(spec, setup.model_copy(update={"grad_ckpt": True}))
    assert no_ckpt.peak_allocated_bytes - ckpt.peak_allocated_bytes > 2 * layer * (a.num_layers - 2)
