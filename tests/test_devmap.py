"""--strategy device-map: accelerate's balanced placement and the per-GPU step (distributed.md#device-map)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fitcheck.cli import main
from fitcheck.engine import devmap
from fitcheck.engine.devmap_place import balanced_quota, per_device, place
from fitcheck.engine.estimate import estimate
from fitcheck.errors import OptionError
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.sources.resolve import resolve_model

GIB = 2**30


@pytest.fixture(scope="module")
def spec70b() -> ModelSpec:
    return resolve_model("llama-3.1-70b")


def run(spec: ModelSpec, **kw: object) -> Estimate:
    base: dict[str, object] = {"method": "qlora", "gpus": 2, "strategy": "device-map", "grad_ckpt": True}
    base.update(kw)
    return estimate(spec, LlmSetup(**base))  # type: ignore[arg-type]


# --- the placement (pure) ------------------------------------------------------------------------

blocks = st.lists(st.integers(min_value=0, max_value=10**10), min_size=1, max_size=120)


@given(blocks, st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=10**10))
def test_placement_covers_every_module_once_in_order(sizes: list[int], gpus: int, block: int) -> None:
    quota = balanced_quota(sizes, gpus, block)
    devs = place(sizes, gpus, quota)
    assert len(devs) == len(sizes)
    assert all(0 <= d < gpus for d in devs)
    assert list(devs) == sorted(devs), "modules go to the GPUs in order, never back"
    totals = per_device(sizes, devs, gpus)
    assert sum(totals) == sum(sizes)
    # the bottleneck can never hold less than an even share
    assert max(totals) * gpus >= sum(sizes)
    # every GPU but the last stays within its balanced quota (the first keeps room besides)
    assert all(t <= quota for t in totals[:-1])


@given(blocks, st.integers(min_value=1, max_value=8))
def test_placement_with_free_memory_caps_stays_under_them(sizes: list[int], gpus: int) -> None:
    caps = [max(sizes) * 3] * gpus
    devs = place(sizes, gpus, balanced_quota(sizes, gpus, max(sizes)), caps)
    totals = per_device(sizes, devs, gpus)
    assert all(t <= c for t, c in zip(totals[:-1], caps[:-1], strict=True))
    assert list(devs) == sorted(devs)


def test_placement_by_hand_follows_accelerate() -> None:
    """embeddings 4, six layers of 2, norm 0, lm_head 4 on 2 GPUs: total 20, quota 20 // 2 +
    int(1.25 x 2) = 12; GPU 0 keeps room for the largest module still to place (the lm_head, 4), so it
    takes the embeddings and two layers (4 + 2 + 2 = 8 <= 12 - 4; a third layer would make 10)."""
    sizes = [4, 2, 2, 2, 2, 2, 2, 0, 4]
    quota = balanced_quota(sizes, 2, 2)
    assert quota == 12
    assert place(sizes, 2, quota) == (0, 0, 0, 1, 1, 1, 1, 1, 1)


def test_one_gpu_takes_everything() -> None:
    assert place([5, 3, 3], 1, 0) == (0, 0, 0)
    with pytest.raises(ValueError):
        place([1], 0, 1)


# --- the layout of a real model ------------------------------------------------------------------


def test_llama_70b_qlora_layout(spec70b: ModelSpec) -> None:
    setup = LlmSetup(method="qlora", gpus=2, strategy="device-map")
    lay = devmap.layout(spec70b, setup)
    assert lay.names[0] == "embed_tokens" and lay.names[-2:] == ("norm", "lm_head")
    assert lay.first == 0 and lay.head == 1 and lay.norm == 1
    # 4-bit layers are small beside the bf16 embeddings the first GPU must keep room for: the last
    # GPU takes more layers (the balanced quota leaves it whatever is left)
    assert lay.layers_on(0) + lay.layers_on(1) == 80 and lay.layers_on(1) > lay.layers_on(0)
    # by hand: embeddings = lm_head = 128,256 x 8,192 x 2 B = 2.10 GB; a 4-bit layer = 855.6M weights x
    # 0.5 B + norms = 0.428 GB; total 38.43 GB; quota = (19.21 + 1.25 x 2.10) x 0.9 (bnb) = 19.66 GB; GPU 0
    # keeps the lm_head's 2.10 GB free: 2.10 + n x 0.428 <= 17.56 -> n = 36
    emb = 128_256 * 8_192 * 2
    assert lay.sizes[0] == lay.sizes[-1] == emb
    quota = int((sum(lay.sizes) // 2 + int(1.25 * emb)) * 0.9)
    assert lay.layers_on(0) == (quota - 2 * emb) // lay.sizes[1] == 36
    # the first layer of GPU 1 gets its input from GPU 0: its checkpoint is counted on both GPUs
    # (transformers 4.x keeps it on GPU 0, 5.x on GPU 1)
    assert lay.checkpoints_on(0) == lay.layers_on(0) + 1
    assert lay.checkpoints_on(1) == lay.layers_on(1)
    assert lay.checkpoints_on(0) + lay.checkpoints_on(1) == 81


def test_tied_lm_head_goes_with_the_embeddings() -> None:
    spec = resolve_model("qwen2.5-0.5b")
    assert spec.arch.tie_embeddings
    lay = devmap.layout(spec, LlmSetup(method="lora", gpus=2, strategy="device-map"))
    assert lay.sizes[-1] == 0 and lay.head == lay.first == 0 and lay.norm == 1
    e = estimate(spec, LlmSetup(method="lora", gpus=2, strategy="device-map"))
    assert e.distributed is not None
    # the logits and loss are on GPU 0 with the embeddings
    assert "lm_head (tied)" in e.distributed.per_gpu[0].modules


# --- the per-GPU estimate ------------------------------------------------------------------------


def test_one_gpu_device_map_is_the_single_gpu_step(spec70b: ModelSpec) -> None:
    one = run(spec70b, gpus=1, strategy=None)
    dm = run(spec70b, gpus=1)
    assert [p.total_bytes for p in dm.phases] == [p.total_bytes for p in one.phases]
    assert dm.device_bytes == one.device_bytes


def test_two_gpus_split_the_states_and_report_the_bottleneck(spec70b: ModelSpec) -> None:
    one = run(spec70b, gpus=1, strategy=None)
    dm = run(spec70b)
    d = dm.distributed
    assert d is not None and d.strategy == "device-map" and d.world_size == 1 and len(d.per_gpu) == 2
    assert d.bottleneck_gpu == max(d.per_gpu, key=lambda g: g.device_bytes).gpu
    assert dm.device_bytes == d.per_gpu[d.bottleneck_gpu].device_bytes
    # every GPU holds less than the whole step, and together at least the model states of one
    assert all(g.device_bytes < one.device_bytes for g in d.per_gpu)
    assert sum(g.peak_allocated_bytes for g in d.per_gpu) >= one.phase("optimizer_step").total_bytes
    # the 4-bit weights are dealt out by layers
    w = {c.name: c.bytes for c in dm.phase("load").components}
    whole = {c.name: c.bytes for c in one.phase("load").components}
    share = d.per_gpu[d.bottleneck_gpu].layers / 80
    assert w["weights_4bit"] == pytest.approx(whole["weights_4bit"] * share, rel=1e-6)


def test_logits_live_on_the_last_gpu_and_a_copy_returns_to_the_first(spec70b: ModelSpec) -> None:
    dm = run(spec70b, seq_len=8192)
    d = dm.distributed
    assert d is not None and d.bottleneck_gpu == 1
    names = {c.name: c.bytes for c in dm.phase("backward").components}
    assert names.get("logits_loss", 0) > 0
    # GPU 0's own forward: its checkpoints plus the output copied back (io_same_device)
    lay = devmap.layout(spec70b, dm.setup)  # type: ignore[arg-type]
    assert lay.head == 1


def test_gpu0_forward_holds_the_returned_logits_copy(spec70b: ModelSpec) -> None:
    from fitcheck.engine.estimate import model_states, saved_activations
    from fitcheck.engine.regimes import regime_for

    setup = LlmSetup(method="qlora", gpus=2, strategy="device-map", grad_ckpt=True, seq_len=4096)
    regime = regime_for(setup)
    ms = model_states(spec70b, setup, regime)
    sv = saved_activations(spec70b, setup, regime)
    lay = devmap.layout(spec70b, setup)
    s0, s1 = devmap.shares(lay, spec70b, setup)
    out = 4096 * spec70b.arch.vocab_size * 2
    load = estimate(spec70b, setup.model_copy(update={"strategy": None, "gpus": 1})).phase("load")
    fwd0 = devmap.gpu_phases(ms, sv, setup, lay, s0, out, load)[1]
    fwd1 = devmap.gpu_phases(ms, sv, setup, lay, s1, out, load)[1]
    c0 = {c.name: c.bytes for c in fwd0.components}
    c1 = {c.name: c.bytes for c in fwd1.components}
    assert c0.get("output_copy") == out and "logits_loss" not in c0
    assert c1.get("logits_loss", 0) > 0 and c1.get("output_copy", 0) == 0
    assert c0.get("final_norm", 0) == 0 and c1["final_norm"] > 0


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"nodes": 2}, "one machine"),
        ({"offload": "all"}, "offload"),
        ({"backend": "mps"}, "CUDA/ROCm"),
    ],
)
def test_refused(spec70b: ModelSpec, kw: dict[str, object], needle: str) -> None:
    with pytest.raises(OptionError, match=needle):
        run(spec70b, **kw)


def test_cli_json_reports_every_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["estimate", "llama-3.1-70b", "--method", "qlora", "--grad-ckpt", "--on", "2xa100-80gb"]
    rc = main([*args, "--strategy", "device-map", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    d = doc["distributed"]
    assert d["strategy"] == "device-map" and d["engine"] == "accelerate-device-map"
    assert [g["gpu"] for g in d["per_gpu"]] == [0, 1]
    assert doc["device_bytes"] == d["per_gpu"][d["bottleneck_gpu"]]["device_bytes"]
    assert doc["setup"]["strategy"] == "device-map"


def test_cli_plan_refuses_device_map_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    """plan searches device-map for --trainer hf only (tests/test_plan_device_map.py has the rest)."""
    args = ["plan", "llama-3.1-8b", "--on", "2x4090", "--strategy", "device-map", "--trainer", "axolotl"]
    rc = main(args)
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("fitcheck: error: plan does not search --strategy device-map")
    assert err.count("\n") == 1


def test_the_band_upper_edge_covers_every_gpu(spec70b: ModelSpec) -> None:
    """device_bytes is the largest GPU's; the band's upper edge is raised to any GPU's higher edge, so the
    verdict (fits on the upper edge, does_not_fit on device_bytes) holds for every GPU."""
    from fitcheck.engine.devmap import _run_band
    from fitcheck.models import GpuShare

    dm = run(spec70b)
    assert dm.band is not None and dm.distributed is not None
    d = dm.distributed
    assert dm.band.high_bytes == max(g.high_bytes for g in d.per_gpu)
    other = GpuShare(
        gpu=0,
        modules=("embed_tokens",),
        layers=1,
        weights_bytes=1,
        peak_phase="backward",
        peak_allocated_bytes=1,
        peak_reserved_bytes=1,
        device_bytes=dm.device_bytes - 1,
        high_bytes=dm.band.high_bytes + GIB,
    )
    band = _run_band(dm, [other, d.per_gpu[1]], 1)
    assert band is not None and band.high_bytes == dm.band.high_bytes + GIB and "GPU 0" in band.basis
    assert band.low_bytes == dm.band.low_bytes


def test_a_small_model_on_many_gpus_fills_the_first_ones() -> None:
    """A tied 135M model on 8 GPUs: the buffer of every quota is 1.25 x the embeddings (the biggest leaf,
    transformers 5.x), so the first GPUs take everything in order and the last ones hold only their CUDA
    context."""
    spec = resolve_model("smollm2-135m")
    e = estimate(spec, LlmSetup(method="lora", gpus=8, strategy="device-map"))
    d = e.distributed
    assert d is not None and d.bottleneck_gpu == 0
    assert "lm_head (tied)" in d.per_gpu[0].modules and "embed_tokens" in d.per_gpu[0].modules
    assert sum(g.layers for g in d.per_gpu) == spec.arch.num_layers
    used = [g.gpu for g in d.per_gpu if g.modules]
    assert used == list(range(len(used))) and len(used) < 8
    assert all(g.peak_allocated_bytes == 0 for g in d.per_gpu[len(used) :])


def test_transformers4_placement_uses_accelerates_mean_leaf(spec70b: ModelSpec) -> None:
    """--device-map-version 4: accelerate's get_balanced_memory sizes the buffer on the first decoder layer
    or the mean leaf (here the layer), transformers 5 on the biggest leaf (here the 2.1 GB embeddings):
    the first GPU's quota is smaller by 1.25 x (embeddings - layer) (here less than a layer)."""
    setup5 = LlmSetup(method="lora", gpus=2, strategy="device-map")
    setup4 = setup5.model_copy(update={"device_map_version": 4})
    lay5, lay4 = devmap.layout(spec70b, setup5), devmap.layout(spec70b, setup4)
    assert lay4.sizes == lay5.sizes  # bf16: sized alike
    emb, layer = lay5.sizes[0], lay5.sizes[1]
    assert emb > layer
    total = sum(lay5.sizes)
    for lay, block in ((lay5, emb), (lay4, layer)):
        quota = total // 2 + int(1.25 * block)
        assert lay.layers_on(0) == (quota - 2 * emb) // layer
    assert lay4.layers_on(0) <= lay5.layers_on(0)


def test_device_map_version_needs_device_map(spec70b: ModelSpec) -> None:
    with pytest.raises(OptionError, match="--device-map-version applies to --strategy device-map"):
        run(spec70b, strategy="fsdp", device_map_version=4)
