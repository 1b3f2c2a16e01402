"""FSDP1 with frozen per-Linear units (universal-llm-trainer's wrap), traced on CPU: what a LoRA step holds.

universal-llm-trainer wraps every ``nn.Linear`` of a peft LoRA model in its own FSDP1 unit
(``size_based_auto_wrap_policy``, ``min_num_params`` 10000, src/trainer/build.py ``get_wrapped_model`` at
9efd14b5), FULL_SHARD, ``MixedPrecision(param_dtype=float16, cast_forward_inputs=True)``, with transformers'
reentrant gradient checkpointing. Its Llama-3.1-70B LoRA rows on 2 GPUs measure about 16 GiB per GPU above
the estimate (tests/test_published.py ``_ULT_FSDP``). This script runs a shrunken Llama of that shape on two
gloo ranks on the CPU and answers two questions (docs/distributed.md#fsdp-offload-checked):

* ``--units``: how many units are unsharded at once during backward (FlatParamHandle.unshard patched to
  list the units whose unsharded flat parameter has storage). Frozen base units are resharded by the
  post-backward reshard-only hooks FSDP registers on their inputs; the hooks fire.
* default: the step's peak live bytes (torch.profiler memory timeline, rank 0) at two depths, beside the same
  model without FSDP: the per-layer slope. Under LoRA (frozen base units) FSDP1 adds one b x s x h
  activation-sized tensor per layer to the peak; under full fine-tuning it adds nothing.
* ``--drop-hooks``: the same with each frozen unit's reshard-only hook removed as soon as it fires: the
  extra goes, so those hooks (kept until backward ends) hold it.

Versions: the installed torch / transformers / peft (2.13 / 5.24 / 0.21 when written), not the runs'
2.5.1 / 4.49 / 0.14; transformers 5.x checkpoints inside the FSDP unit (``GradientCheckpointingLayer``),
4.49 outside it (``_gradient_checkpointing_func(decoder_layer.__call__, ...)``). About 2-4 minutes a run on
2 cores:

    PYTHONPATH=src python bench/fsdp1_frozen_trace.py               # LoRA, slope at 2 and 4 layers
    PYTHONPATH=src python bench/fsdp1_frozen_trace.py --full        # full fine-tuning
    PYTHONPATH=src python bench/fsdp1_frozen_trace.py --seq 2048    # the slope doubles with the tokens
    PYTHONPATH=src python bench/fsdp1_frozen_trace.py --units       # units unsharded during backward
"""

from __future__ import annotations

import argparse
import functools
import os
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HIDDEN, INTER, VOCAB, BATCH = 512, 1408, 2000, 2
MIB = 1 << 20


def build(layers: int, full: bool) -> Any:
    """A Llama of ``layers`` layers, reentrant checkpointing, LoRA r8 on every Linear unless ``full``."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=layers, num_attention_heads=8,
        num_key_value_heads=8, vocab_size=VOCAB, tie_word_embeddings=False,
    )  # fmt: skip
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    model.enable_input_require_grads()
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    if full:
        return model
    return get_peft_model(
        model, LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, target_modules="all-linear")
    )


def wrap(model: Any) -> Any:
    """FSDP1 as the trainer wraps it (``min_num_params`` scaled down with the model: every Linear a unit)."""
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    return FullyShardedDataParallel(
        model,
        auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=1000),
        sharding_strategy=ShardingStrategy.FULL_SHARD,
        device_id=torch.device("cpu"),
        mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, cast_forward_inputs=True),
    )


def step(model: Any, seq: int) -> None:
    """One forward and backward on random tokens (the trainer's own loss is irrelevant to the question)."""
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().mean()
    loss.backward()


def peak_bytes(model: Any, seq: int) -> int:
    """Peak live CPU bytes of the second step (the profiler's memory timeline, every category)."""
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler._memory_profiler import MemoryProfileTimeline

    step(model, seq)
    with profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    ) as p:
        step(model, seq)
    _, sizes = MemoryProfileTimeline(p._memory_profile())._coalesce_timeline("cpu")
    return max(sum(s) for s in sizes)


def unsharded_during_backward(model: Any, seq: int) -> tuple[int, list[str]]:
    """The most units unsharded at once during the second step's backward, and which they were."""
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._flat_param import FlatParamHandle

    names = {id(m._handle): n for n, m in model.named_modules() if isinstance(m, FullyShardedDataParallel)}
    handles = [m._handle for m in model.modules() if isinstance(m, FullyShardedDataParallel) and m._handle]
    seen: dict[str, Any] = {"on": False, "most": (0, [])}
    original = FlatParamHandle.unshard

    def unshard(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        if seen["on"]:
            live = [
                names.get(id(h), "?")
                for h in handles
                if h._get_padded_unsharded_flat_param().untyped_storage().size()
            ]
            if len(live) > seen["most"][0]:
                seen["most"] = (len(live), live)
        return out

    FlatParamHandle.unshard = unshard  # type: ignore[method-assign]
    step(model, seq)
    ids = torch.randint(0, VOCAB, (BATCH, seq))
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().mean()
    seen["on"] = True
    loss.backward()
    return seen["most"]  # type: ignore[no-any-return]


def drop_hooks_when_fired() -> None:
    """Remove each frozen unit's reshard-only hook as soon as it has fired (torch keeps it registered until
    ``_finalize_params`` at the end of backward): the experiment that names what holds the extra."""
    import torch.distributed.fsdp._runtime_utils as ru

    fired = ru._post_backward_reshard_only_hook

    def hook(state: Any, handle: Any, *unused: Any) -> None:
        fired(state, handle, *unused)
        kept = getattr(handle.flat_param, "_post_backward_hook_state", None)
        if kept:
            kept[-1].remove()

    ru._post_backward_reshard_only_hook = hook


def rank_main(rank: int, layers: int, args: argparse.Namespace, queue: Any) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(29500 + layers)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    if args.drop_hooks:
        drop_hooks_when_fired()
    model = wrap(build(layers, args.full))
    result = unsharded_during_backward(model, args.seq) if args.units else peak_bytes(model, args.seq)
    if rank == 0:
        queue.put(result)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--layers", default="2,4", help="two depths for the per-layer slope")
    ap.add_argument("--units", action="store_true", help="list the units unsharded at once in backward")
    ap.add_argument("--drop-hooks", action="store_true", help="remove each reshard-only hook once fired")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    depths = [int(x) for x in args.layers.split(",")]
    method = "full" if args.full else "LoRA"
    unit = BATCH * args.seq * HIDDEN * 2  # one bf16 b x s x h tensor
    peaks: dict[int, tuple[int, int]] = {}
    for layers in depths:
        queue = mp.get_context("spawn").Queue()
        mp.spawn(rank_main, args=(layers, args, queue), nprocs=2)
        got = queue.get()
        if args.units:
            print(f"{method}, {layers} layers: at most {got[0]} units unsharded in backward: {got[1]}")
            continue
        plain = peak_bytes(build(layers, args.full).to(torch.bfloat16), args.seq)
        peaks[layers] = (got, plain)
        where = f"{method}, {layers} layers, {args.seq} tokens"
        print(f"{where}: FSDP1 rank 0 {got / MIB:.1f} MiB, no FSDP {plain / MIB:.1f} MiB")
    if len(peaks) == 2:
        (a, pa), (b, pb) = (peaks[d] for d in depths)
        n = depths[1] - depths[0]
        print(
            f"per layer: FSDP1 {(b - a) / n / MIB:.2f} MiB, no FSDP {(pb - pa) / n / MIB:.2f} MiB "
            f"(its fp32 half shards weigh what the bf16 model does); b x s x h bf16 = {unit / MIB:.2f} MiB"
        )


if __name__ == "__main__":
    main()
