"""ZeRO-3's gathered parameters: none on one rank unless its parameters are offloaded, the last layers
kept from forward to backward by ``stage3_max_reuse_distance`` (DeepSpeed v0.12.3 @6ea44d02), and the
prefetcher's fill to ``stage3_max_live_parameters`` (v0.7.7 to edaa7221); docs/distributed.md#zero3-gather."""

from __future__ import annotations

import dataclasses

import pytest

from fitcheck.engine.distributed import Shares, gather_window, reuse_kept_layers
from fitcheck.engine.estimate import estimate
from fitcheck.facts.deepspeed import ZERO_DEFAULTS
from fitcheck.models import Estimate, LlmSetup, ModelSpec
from fitcheck.sources.resolve import resolve_model


@pytest.fixture(scope="module")
def spec7b() -> ModelSpec:
    return resolve_model("7B")


def run(spec: ModelSpec, **kw: object) -> Estimate:
    base: dict[str, object] = {"method": "full", "grad_ckpt": True, "trainer": "hf", "strategy": "zero3"}
    base.update(kw)
    return estimate(spec, LlmSetup(**base))  # type: ignore[arg-type]


def comp(e: Estimate, name: str, phase: str) -> int:
    return sum(c.bytes for c in e.phase(phase).components if c.name == name)  # type: ignore[arg-type]


def shares_of(layer: int, head: int, layers: int = 32) -> Shares:
    """Shares with only the fields the reuse rule reads set to round numbers."""
    zero = {f.name: 0 for f in dataclasses.fields(Shares)}
    return Shares(**{**zero, "unit_params": layer, "lm_head_params": head, "layers": layers})


def test_one_rank_gathers_nothing(spec7b: ModelSpec) -> None:
    """partition_parameters.py: with one partition ``all_gather_coalesced`` returns
    ``_no_gather_coalesced`` (L1109-1110), whose handle sets ``param.data`` to a view of ``ds_tensor``
    (``.to`` the device it is on: the same storage, L44-56): one GPU holds no gathered copy."""
    one = run(spec7b, gpus=1)
    two = run(spec7b, gpus=2)
    for phase in ("forward", "backward"):
        assert comp(one, "gathered_params", phase) == 0
        assert comp(two, "gathered_params", phase) > 0


def test_one_rank_with_offloaded_parameters_copies_what_it_fetches(spec7b: ModelSpec) -> None:
    """With ``offload_param`` the partition lives on the host, and ``NoGatherHandle``'s ``.to(device)``
    allocates a GPU copy of each fetched module: one rank then holds what several ranks gather (session 10,
    docs/distributed.md#zero3-gather)."""
    one = run(spec7b, gpus=1, offload="all")
    two = run(spec7b, gpus=2, offload="all")
    for phase in ("forward", "backward"):
        assert comp(one, "gathered_params", phase) == comp(two, "gathered_params", phase) > 0
    assert comp(run(spec7b, gpus=1, offload="optimizer"), "gathered_params", "forward") == 0


def test_a_module_beyond_max_live_parameters_is_fetched_whole() -> None:
    """``stage3_max_live_parameters`` caps prefetching, not the module being fetched: Qwen-72B's
    1.25e9-element embedding (152,064 x 8,192) is gathered whole above the 1e9 default."""
    spec = resolve_model("qwen2.5-72b")
    assert isinstance(spec, ModelSpec)
    e = run(spec, gpus=4, method="lora", precision="bf16")
    assert comp(e, "gathered_params", "forward") >= 152_064 * 8_192 * 2


def test_kept_layers_follow_the_reuse_distance_with_checkpointing() -> None:
    """With checkpointing a layer with k layers behind it comes back after (3k + 1) L + 2 H elements."""
    layer, head = 100, 150
    sh = shares_of(layer, head)
    limit = (3 * 2 + 1) * layer + 2 * head  # the third-last layer's distance
    assert reuse_kept_layers(sh, True, limit) == 2  # strict: a distance equal to the limit is released
    assert reuse_kept_layers(sh, True, limit + 1) == 3
    assert reuse_kept_layers(sh, True, layer + 2 * head) == 0


def test_kept_layers_without_checkpointing() -> None:
    """Without checkpointing the layer's backward comes after (2k + 2) L + 2 H elements."""
    layer, head = 100, 150
    sh = shares_of(layer, head)
    assert reuse_kept_layers(sh, False, (2 * 1 + 2) * layer + 2 * head) == 1
    assert reuse_kept_layers(sh, False, (2 * 1 + 2) * layer + 2 * head + 1) == 2
    assert reuse_kept_layers(sh, False, 10**12) == 32  # never more than the model has


def test_tied_head_counts_the_embedding() -> None:
    """A tied lm_head is the embedding's parameter (``lm_head_params`` 0): its elements count twice."""
    zero = {f.name: 0 for f in dataclasses.fields(Shares)}
    sh = Shares(**{**zero, "unit_params": 100, "embedding_params": 150, "layers": 4})
    assert reuse_kept_layers(sh, True, 100 + 300) == 0
    assert reuse_kept_layers(sh, True, 100 + 301) == 1


def test_the_window_adds_the_kept_layers() -> None:
    """Llama-2-7B (layer 202M, untied head 131M) with DeepSpeed's default distance 1e9: one layer kept
    with and without checkpointing (the second-last is 4 L + 2 H = 1.07e9 away), beside the largest module
    and the HF "auto" prefetch bucket."""
    sh_layer = 4096 * 4096 * 4 + 3 * 4096 * 11008 + 2 * 4096
    head = 32000 * 4096
    prefetch = int(0.9 * 4096 * 4096)
    assert ZERO_DEFAULTS["stage3_max_reuse_distance"] == 1_000_000_000
    sh = dataclasses.replace(shares_of(sh_layer, head), head_params=head)
    z = {**ZERO_DEFAULTS, "stage3_prefetch_bucket_size": prefetch}
    for ckpt in (True, False):
        assert gather_window(sh, ckpt, z) == (max(sh_layer, head) + prefetch + sh_layer, 1)


def test_the_prefetcher_fills_max_live_parameters() -> None:
    """Once the trace is recorded every module call prefetches up to ``min(max_live - n_available,
    prefetch_bucket)`` elements (partitioned_param_coordinator.py @v0.7.7 L319-349, edaa7221 L452-457), so
    Llama-2-7B on 4 GPUs holds ``stage3_max_live_parameters`` gathered, plus one parameter fetched past it
    (the 131M lm_head bounds it), more than one fetch's window with its kept layer."""
    e = run(resolve_model("llama-2-7b"), gpus=4)
    head = 32000 * 4096
    assert comp(e, "gathered_params", "forward") == 2 * (ZERO_DEFAULTS["stage3_max_live_parameters"] + head)
    assert comp(e, "gathered_params", "backward") == comp(e, "gathered_params", "forward")
    rule = next(c.rule for c in e.phase("forward").components if c.name == "gathered_params")
    assert "stage3_max_live_parameters" in rule


def test_a_model_under_max_live_parameters_is_gathered_whole() -> None:
    """The recorded queue holds only the partitioned parameters: a 0.5B model under the 1e9 cap ends up
    gathered whole (its partitions on each of 2 GPUs are half of it)."""
    e = run(resolve_model("qwen2.5-0.5b"), gpus=2)
    parts = comp(e, "param_partitions", "forward")
    assert comp(e, "gathered_params", "forward") == pytest.approx(2 * parts, abs=2)
