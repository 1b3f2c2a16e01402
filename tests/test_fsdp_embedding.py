"""--fsdp-embedding-units: FSDP2 with the embedding and the lm_head as their own units (torchtune's
custom_sharded_layers ['tok_embeddings', 'output']; docs/distributed.md#fsdp-embedding-units).

Per-phase moments hand-computed from the rule (engine/fsdp_embedding.py), exact bytes for Llama 3.1 70B on
8 GPUs, the torchtune reader, and the CLI's one-line refusals. The traced FSDP2 records fsdp-15..18
(tests/test_fsdp_calibration.py) check the same rule against torch's FSDPMemTracker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fitcheck.cli import main
from fitcheck.engine.estimate import estimate
from fitcheck.engine.fsdp_embedding import UnitSizes, embedding_units
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.readers import read_config
from fitcheck.sources.resolve import resolve_model

# Llama 3.1 70B (its preset): vocabulary 128,256 x hidden 8192; one decoder layer (q, k, v, o, gate, up,
# down and two RMSNorms) 8192 x (8192 + 1024 + 1024 + 8192) + 3 x 8192 x 28672 + 2 x 8192 parameters.
HEAD = 128_256 * 8192
LAYER = 8192 * (8192 + 1024 + 1024 + 8192) + 3 * 8192 * 28672 + 2 * 8192
NORM = 8192


def sizes(layer: int, emb: int, head: int, *, full: bool) -> UnitSizes:
    return UnitSizes(
        layer=layer,
        layer_grads=layer if full else 1,
        embedding=emb,
        embedding_grads=emb if full else 0,
        head=head,
        head_grads=head if full else 0,
        prefetch=2,
    )


def test_big_vocabulary_full_fine_tune_peaks_at_the_lm_head_backward() -> None:
    u = embedding_units(sizes(10, 30, 30, full=True))
    # forward: embedding + first layer 40, two layers 20, last layer + lm_head 40: a tie goes to the later
    assert (u.forward.gathered, u.forward.grads) == (40, 0) and "lm_head" in u.forward.moment
    # backward start: the lm_head gathered again and the last layer prefetched, no gradient yet
    assert (u.backward_start.gathered, u.backward_start.grads) == (40, 0)
    # backward: lm_head 40 + 30 grads; a layer 20 + 10; first layer + embedding 40 + 10; embedding 30 + 30
    assert (u.backward.gathered, u.backward.grads) == (40, 30) and "lm_head" in u.backward.moment


def test_lora_never_gathers_the_frozen_embedding_in_backward() -> None:
    u = embedding_units(sizes(10, 300, 30, full=False))
    assert u.forward.gathered == 310  # the embedding still runs in forward
    assert (u.backward.gathered, u.backward.grads) == (40, 0)  # lm_head + last layer: its input needs a grad


def test_large_layers_peak_at_a_layer() -> None:
    u = embedding_units(sizes(50, 30, 30, full=True))
    assert u.forward.gathered == 100 and "layer" in u.forward.moment
    assert (u.backward.gathered, u.backward.grads) == (100, 50)


@pytest.fixture(scope="module")
def spec70b() -> ModelSpec:
    return resolve_model("llama-3.1-70b")


def run(spec: ModelSpec, **kw: object) -> Estimate:
    base: dict[str, object] = {
        "method": "full",
        "gpus": 8,
        "strategy": "fsdp",
        "trainer": "torchtune",
        "grad_ckpt": True,
        "batch_size": 2,
        "seq_len": 2048,
    }
    return estimate(spec, LlmSetup(**{**base, **kw}))  # type: ignore[arg-type]


def parts(e: Estimate, phase: str) -> dict[str, int]:
    return {c.name: c.bytes for c in e.phase(phase).components}


def test_70b_per_phase_bytes_are_the_rule_exactly(spec70b: ModelSpec) -> None:
    e = run(spec70b, fsdp_embedding_units=True)
    fwd, bwd, step = parts(e, "forward"), parts(e, "backward"), parts(e, "optimizer_step")
    assert fwd["root_params"] == bwd["root_params"] == NORM * 2  # the root keeps the final norm only
    assert fwd["gathered_units"] == (LAYER + HEAD) * 2  # the last layer and the lm_head
    assert bwd["gathered_units"] == (LAYER + HEAD) * 2
    assert bwd["unit_grads"] == (HEAD + NORM) * 2  # the lm_head's grad before its reduce-scatter, the root's
    assert "gathered_units" not in step and "root_params" not in step


def test_the_flag_moves_only_what_the_units_hold(spec70b: ModelSpec) -> None:
    off, on = run(spec70b), run(spec70b, fsdp_embedding_units=True)
    for phase in ("forward", "backward", "optimizer_step"):
        a, b = parts(off, phase), parts(on, phase)
        same = set(a) - {"root_params", "gathered_units", "unit_grads"}
        assert {k: a[k] for k in same} == {k: b.get(k) for k in same}
    assert off.phase("forward").total_bytes - on.phase("forward").total_bytes == (
        (2 * HEAD + NORM) * 2 + 2 * LAYER * 2 - (LAYER + HEAD) * 2 - NORM * 2
    )  # the root's embedding + lm_head and two layers, against the last layer and the lm_head
    assert on.peak_allocated_bytes < off.peak_allocated_bytes


def test_lora_backward_holds_no_embedding_gradient(spec70b: ModelSpec) -> None:
    e = run(
        spec70b, method="lora", lora_rank=16, lora_targets="q_proj,k_proj,v_proj", fsdp_embedding_units=True
    )
    bwd = parts(e, "backward")
    lora = 16 * 8192 + 8192 * 16 + 2 * (16 * 8192 + 1024 * 16)  # q, k, v adapters of one layer (its unit)
    assert bwd["gathered_units"] == (LAYER + lora + HEAD) * 2  # the lm_head's backward, the last layer
    assert (
        bwd.get("unit_grads", 0) == 0
    )  # a frozen lm_head makes no gradient; that moment outweighs a layer's
    assert bwd["root_params"] == NORM * 2


TT_CONFIG = """\
model:
  _component_: torchtune.models.llama3_1.llama3_1_70b
tokenizer:
  _component_: torchtune.models.llama3.llama3_tokenizer
  path: /tmp/tokenizer.model
  max_seq_len: 2048
batch_size: 2
enable_activation_checkpointing: True
fsdp_cpu_offload: True
custom_sharded_layers: {layers}
dtype: bf16
"""


def test_torchtune_reader_reads_custom_sharded_layers(tmp_path: Path) -> None:
    cfg = tmp_path / "70B_full.yaml"
    cfg.write_text(TT_CONFIG.format(layers="['tok_embeddings', 'output']"))
    r = read_config(str(cfg))
    assert r.values["fsdp_embedding_units"] is True
    assert r.keys["fsdp_embedding_units"] == "custom_sharded_layers"
    assert "custom_sharded_layers" not in r.unused


def test_torchtune_reader_notes_other_sharded_layers(tmp_path: Path) -> None:
    cfg = tmp_path / "scout.yaml"
    cfg.write_text(TT_CONFIG.format(layers="['tok_embeddings']"))
    r = read_config(str(cfg))
    assert "fsdp_embedding_units" not in r.values
    assert any("custom_sharded_layers ['tok_embeddings']" in n for n in r.notes)


def test_json_echoes_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3.1-70b", "--method", "full", "--on", "8xa100-80gb", "--strategy", "fsdp"]
    assert main([*args, "--fsdp-embedding-units", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["fsdp_embedding_units"] is True


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["llama-3.1-70b"], "not one GPU"),
        (["llama-3.1-70b", "--on", "8xa100-80gb", "--strategy", "zero3"], "not zero3"),
        (["llama-3.1-70b", "--on", "8xa100-80gb", "--strategy", "fsdp-grad-op"], "not fsdp-grad-op"),
        (["llama-3.1-70b", "--on", "8xa100-80gb", "--strategy", "fsdp", "--fsdp-version", "1"], "FSDP2"),
        (["llama-3.2-1b", "--on", "8xa100-80gb", "--strategy", "fsdp"], "cannot put in two units"),
    ],
)
def test_refusals_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], needle: str
) -> None:
    rc = main(["estimate", *args, "--fsdp-embedding-units"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("fitcheck: error: --fsdp-embedding-units") and err.count("\n") == 1
    assert needle in err


def test_step_time_counts_the_units_extra_collectives() -> None:
    from fitcheck.planner.comm import embedding_units_seconds, link_gbps
    from fitcheck.units import GB

    s = LlmSetup(method="full", gpus=8, strategy="fsdp", trainer="torchtune", fsdp_embedding_units=True)
    link = link_gbps(s, "a100-sxm4-80gb") * GB
    # full, 8 chunk calls: the lm_head 16 gathers + 8 reduce-scatters where two gathers and one reduce-scatter
    # are already counted per parameter: 21 more; the embedding as counted (gathered twice, reduced once)
    full = embedding_units_seconds(s, "a100-sxm4-80gb", 100, 30, 8, True)
    assert full == pytest.approx(7 / 8 * 21 * 100 / link)
    # frozen (LoRA): the lm_head 16 gathers (its input needs a gradient), the embedding one gather, not two
    lora = embedding_units_seconds(s, "a100-sxm4-80gb", 100, 30, 8, False)
    assert lora == pytest.approx(7 / 8 * (14 * 100 - 30) / link)


def test_plan_with_the_flag_writes_no_config_that_cannot_express_it(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["plan", "llama-3.1-70b", "--on", "8xa100-80gb", "--method", "full", "--strategy", "fsdp"]
    rc = main([*args, "--fsdp-embedding-units", "--emit", "accelerate.yaml", "-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("fitcheck: error: --fsdp-embedding-units: no emitted config")
    assert not list(tmp_path.iterdir())


def test_traced_forward_matches_the_forward_rule() -> None:
    """fsdp-15..18 (FSDPMemTracker, torch 2.13, embedding and lm_head as their own units): the engine's
    forward phase within 5% of the traced forward peak (the overall peak, at the start of backward, is
    tests/test_fsdp_calibration.py's)."""
    import yaml

    from fitcheck.sources.hf_config import arch_from_hf_config

    path = Path(__file__).parent / "data" / "calibration" / "fsdp" / "records.yaml"
    recs = [r for r in yaml.safe_load(path.read_text())["records"] if r["setup"].get("fsdp_embedding_units")]
    assert len(recs) == 4
    for r in recs:
        spec = ModelSpec(id="r", name="r", source_kind="hf_config", arch=arch_from_hf_config(r["hf_config"]))
        e = estimate(spec, LlmSetup(**r["setup"]))
        nccl = parts(e, "forward").get("nccl_communicators", 0)
        fwd = e.phase("forward").total_bytes - nccl
        assert abs(fwd / r["traced_phase_peaks_bytes"]["forward"] - 1) <= 0.05, r["id"]
