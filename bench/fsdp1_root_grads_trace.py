"""FSDP1 as litgpt's finetune/full.py runs it on several devices, traced on CPU: what each moment holds.

litgpt @00af8b0d (finetune/full.py L99-106, L253-263) builds lightning
``FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block})`` for devices > 1: torch
FSDP1 ``FullyShardedDataParallel``, FULL_SHARD, ``use_orig_params=True``, ``MixedPrecision`` bf16 for
``bf16-true``, the model built in bf16 (lightning 2.4.0 src/lightning/fabric/strategies/fsdp.py,
plugins/precision/fsdp.py), every Block checkpointed, and ``fabric.no_backward_sync`` (``no_sync()``) on the
accumulating micro-batches. This script runs a litgpt-shaped toy (wte, parallel-residual Blocks, ln_f,
untied lm_head) that way on two gloo ranks and follows every storage an op returns (and FSDP's ``resize_``
of its flat parameters), printing rank 0's peak per micro-batch and optimizer step and what stays after
each, beside the sizes the engine adds up (engine/distributed.py ``_flat_root_grads``, ``Plan.step_grads``):

* the last micro-batch reduce-scatters the accumulated gradients and frees them: after it, parameter shards
  and gradient shards only (the optimizer step does not see ``no_sync_grads``);
* an accumulating micro-batch with small logits peaks at the end of backward: shards, optimizer states, the
  accumulated unsharded gradients, the root's unsharded parameters and twice the root's gradient (each
  view's gradient, held until the embedding's arrives, and their concatenation into the flat gradient).

Written and run with torch 2.13.0 (CPU), in seconds on 2 cores:

    PYTHONPATH=src python bench/fsdp1_root_grads_trace.py              # vocabulary 16384, 32 tokens
    PYTHONPATH=src python bench/fsdp1_root_grads_trace.py --vocab 32768

Rank 0 at 16384 / 32768: the second window's accumulating micro-batches peak at 105.07 / 195.07 MiB against
103.07 / 191.07 MiB added up; without the second root gradient the sum would be 87.07 / 159.07.
"""

from __future__ import annotations

import argparse
import os
import warnings
import weakref
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

D, LAYERS, ACCUM = 256, 4, 4
MIB = 1 << 20


class Live(TorchDispatchMode):
    """Live bytes of the storages ops return (views counted once), FSDP's ``UntypedStorage.resize_``
    followed (it is not a dispatched op), and the peak since the last reset."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: Any = WeakIdKeyDictionary()
        self.total = self.peak = 0
        original = torch.UntypedStorage.resize_

        def resize_(st: Any, n: int) -> Any:
            out = original(st, n)
            box = self.seen.get(st)
            if box is not None:
                self.total += st.nbytes() - box[0]
                box[0] = st.nbytes()
                self.peak = max(self.peak, self.total)
            return out

        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]

    def _drop(self, box: list[int]) -> None:
        self.total -= box[0]

    def track(self, t: Any) -> None:
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        st = t.untyped_storage()
        if st in self.seen:
            return
        box = [st.nbytes()]
        self.seen[st] = box
        weakref.finalize(st, self._drop, box)
        self.total += box[0]
        self.peak = max(self.peak, self.total)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten((out, args, kwargs))[0]:
            self.track(t)
        return out


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm_1, self.norm_2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.qkv, self.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
        self.fc, self.mproj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(self.norm_1(x)).view(b, t, 3, 4, D // 4).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, D)
        return x + self.proj(a) + self.mproj(F.gelu(self.fc(self.norm_2(x))))


class GPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, D)
        self.h = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln_f = nn.LayerNorm(D)
        self.lm_head = nn.Linear(D, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def rank_main(rank: int, args: argparse.Namespace, queue: Any) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", "29611"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    live, out = Live(), {}

    def mark(name: str) -> None:
        out[name] = (live.peak, live.total)
        live.peak = live.total

    bf = torch.bfloat16
    with live:
        torch.set_default_dtype(bf)  # FSDPPrecision.module_init_context for bf16-true
        model: Any = GPT(args.vocab)
        torch.set_default_dtype(torch.float32)
        model = FullyShardedDataParallel(
            model,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            mixed_precision=MixedPrecision(bf, bf, bf),
            sharding_strategy=ShardingStrategy.FULL_SHARD,
            use_orig_params=True,
            limit_all_gathers=True,
            device_id=torch.device("cpu"),
        )
        apply_activation_checkpointing(
            model, checkpoint_wrapper_fn=checkpoint_wrapper, check_fn=lambda m: isinstance(m, Block)
        )
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for window in range(2):
            for i in range(ACCUM):
                ids = torch.randint(0, args.vocab, (1, args.seq))
                sync = i == ACCUM - 1
                ctx = (
                    model.no_sync()
                    if not sync
                    else torch.autograd.graph.saved_tensors_hooks(*[lambda x: x] * 2)
                )
                with ctx:
                    logits = model(ids).float()  # Fabric's convert_output
                    F.cross_entropy(logits[0, :-1], ids[0, 1:]).backward()
                del logits
                mark(f"w{window}.mb{i}{' (sync)' if sync else ''}")
            opt.step()
            mark(f"w{window}.step")
            opt.zero_grad()
            mark(f"w{window}.zero_grad")
    if rank == 0:
        queue.put(out)
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--seq", type=int, default=32)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    queue = mp.get_context("spawn").Queue()
    mp.spawn(rank_main, args=(args, queue), nprocs=2)
    out = queue.get()
    layer = 4 * D + 3 * D * D + 3 * D + D * D + D + 4 * D * D + 4 * D + 4 * D * D + D
    root = 2 * args.vocab * D + 2 * D
    n = 2 * (LAYERS * layer + root)  # bf16 bytes of the model
    r = 2 * root
    summed = (
        n // 2 + n + n + r + 2 * r
    )  # shards, AdamW states, accumulated grads, root params, 2 x root grads
    print(f"model {n / MIB:.2f} MiB bf16, root unit {r / MIB:.2f} MiB; 2 ranks")
    for k, (peak, after) in out.items():
        print(f"{k:20s} peak {peak / MIB:8.2f} MiB   after {after / MIB:8.2f} MiB")
    print(
        f"added up for an accumulating micro-batch: {summed / MIB:.2f} MiB "
        f"(shards {n / 2 / MIB:.2f} + AdamW {n / MIB:.2f} + accumulated {n / MIB:.2f} + root {r / MIB:.2f} "
        f"+ 2 x root grads {2 * r / MIB:.2f}); after the sync micro-batch: shards and gradient shards, "
        f"{n / MIB:.2f} MiB"
    )


if __name__ == "__main__":
    main()
