"""Emulate DeepSpeed v0.7.7's ZeRO-3 parameter coordinator on one rank and count the gathered bytes.

What it reproduces (DeepSpeed @v0.7.7, 2076bf23; read, not imported: DeepSpeed needs CUDA):

- the hooks of ``runtime/zero/parameter_offload.py``: registered recursively on every module; a forward
  pre-hook fetches the module's own parameters, a forward hook releases them; ``PreBackwardFunction`` on
  the module's output tensors fetches them again in backward, ``PostBackwardFunction`` on its input tensors
  releases them once every input's gradient has passed;
- ``PartitionedParameterCoordinator`` (``runtime/zero/partitioned_param_coordinator.py``): the first step
  records the module order and releases everything after use; from the second step on the recorded
  parameter queue drives the prefetch (``min(max_live - n_available, prefetch_bucket)`` elements started
  per module call, L319-349), the release keeps what ``__params_to_release`` keeps (the reuse distance,
  L424-455), ``n_available`` rises with each gather (L395) and falls with each release (L420);
- the memory of ``all_gather_coalesced`` (``runtime/zero/partition_parameters.py`` L806-874): one
  parameter, a full-size buffer plus, for the moment of the copy, the GPU copy of its host partition; several,
  a flat buffer plus the copies, then at ``wait`` each parameter's own ``torch.cat`` copy, the flat buffer
  alive until every parameter of the handle has been waited for (L484-533).

The model runs on the meta device in today's transformers and peft (module structure as in the 2022 stack
the PEFT README ran, up to peft's ``base_layer`` child), fp32, persistence threshold 1e5, reuse distance 1e9.
Default: bigscience/T0_3B's shape (T5 v1.1 XL, 24 + 24 layers, untied lm_head) with LoRA r=8 on q and v,
batch 8 x 56 encoder and 5 decoder tokens (tests/data/published/peft-readme-memory.yaml).

    PYTHONPATH=src python bench/zero3_prefetch_emulation.py [--max-live 1e9] [--prefetch 5e7]

Result (session 15): the second step holds 1.02e9-1.06e9 elements gathered in forward and backward
(3.8-4.0 GiB), where one fetch's window with the kept layers is 0.51e9 (engine/distributed.py
``gather_window``, ``prefetch_fill_bytes``).
"""

from __future__ import annotations

import argparse
import collections
from typing import Any

import torch

NOT_AVAILABLE, INFLIGHT, AVAILABLE = 0, 1, 2
GIB = 2**30


class Gpu:
    """The gathered parameters' bytes on the GPU: each parameter's own storage and the live flat buffers."""

    def __init__(self) -> None:
        self.own: dict[Any, int] = {}
        self.flats: dict[int, list[Any]] = {}
        self.peak = 0
        self.now = 0

    def note(self, transient: int = 0) -> None:
        self.now = sum(self.own.values()) + sum(f[0] for f in self.flats.values())
        self.peak = max(self.peak, self.now + transient)


class Coordinator:
    def __init__(self, params: list[Any], max_live: int, prefetch: int, reuse: int, persist: int) -> None:
        self.gpu = Gpu()
        self.max_live, self.prefetch, self.reuse = max_live, prefetch, reuse
        self.persist = {p for p in params if p.numel() < persist}
        self.status = {p: AVAILABLE if p in self.persist else NOT_AVAILABLE for p in params}
        self.handles: dict[Any, tuple[int, bool]] = {}
        self.next_handle = 0
        self.recording = True
        self.order: list[Any] = []
        self.param_order: list[tuple[Any, int]] = []
        self.fetched_for: dict[int, collections.deque[int]] = collections.defaultdict(collections.deque)
        self.active: dict[Any, set[int]] = collections.defaultdict(set)
        self.cache: dict[tuple[int, int], set[Any]] = {}
        self.max_available = 0
        self.reset()

    def reset(self) -> None:
        self.queue = collections.deque(self.param_order)
        self.recent: dict[Any, int] = collections.defaultdict(lambda: -(10**10))
        self.step = 0
        self.available = 0

    def _gather(self, params: list[Any]) -> None:
        params = [p for p in params if self.status[p] == NOT_AVAILABLE]
        if not params:
            return
        n = 4 * sum(p.numel() for p in params)
        self.next_handle += 1
        for p in params:
            self.status[p] = INFLIGHT
            self.handles[p] = (self.next_handle, len(params) == 1)
        if len(params) == 1:
            self.gpu.own[params[0]] = n
        else:
            self.gpu.flats[self.next_handle] = [n, set(params)]
        self.gpu.note(transient=n)  # the GPU copies of the host partitions, freed after the copy

    def _wait(self, p: Any) -> None:
        if self.status[p] != INFLIGHT:
            return
        h, single = self.handles.pop(p)
        self.status[p] = AVAILABLE
        if not single:
            self.gpu.own[p] = 4 * p.numel()
            flat = self.gpu.flats[h]
            flat[1].discard(p)
            self.gpu.note()
            if not flat[1]:
                del self.gpu.flats[h]
        self.gpu.note()

    def fetch(self, mod: Any) -> None:
        if self.recording:
            self.order.append(mod)
            self.fetched_for[id(mod)].append(self.step)
        own = list(mod.parameters(recurse=False))
        self.available += sum(p.numel() for p in own if self.status[p] == NOT_AVAILABLE)
        self._gather(own)
        for p in own:
            self.active[p].add(id(mod))
            self._wait(p)
        if not self.recording:
            fresh = {p for p in own if self.recent[p] < self.step}
            popped: set[Any] = set()
            while self.queue and len(popped) < len(fresh):
                p, sid = self.queue.popleft()
                self.recent[p] = sid
                popped.add(p)
            quota, chosen, numel = min(self.max_live - self.available, self.prefetch), set(), 0
            while self.queue and numel < quota:
                p, sid = self.queue.popleft()
                take = self.status[p] == NOT_AVAILABLE and p not in chosen
                self.recent[p] = max(self.recent[p], sid)
                if take:
                    chosen.add(p)
                    numel += p.numel()
            self.available += numel
            self._gather(list(chosen))
        self.max_available = max(self.max_available, self.available)
        self.step += 1

    def _to_release(self, mod: Any) -> set[Any]:
        key = (id(mod), self.step)
        if key not in self.cache:
            own = list(mod.parameters(recurse=False))
            out = {p for p in own if p not in self.persist and self.recent[p] <= self.step}
            walked = 0
            for m in self.order[self.step :]:
                if walked >= self.reuse:
                    break
                for p in m.parameters(recurse=False):
                    out.discard(p)
                    walked += p.numel()
            self.cache[key] = out
        return self.cache[key]

    def release(self, mod: Any) -> None:
        own = list(mod.parameters(recurse=False))
        drop = set(own) if self.recording else self._to_release(mod)
        for p in own:
            self.active[p].discard(id(mod))
            if p in drop and p not in self.persist and self.status[p] == AVAILABLE and not self.active[p]:
                self.status[p] = NOT_AVAILABLE
                self.gpu.own.pop(p, None)
                self.gpu.note()
                self.available -= p.numel()

    def end_of_step(self) -> None:
        """``reset_step`` after backward, then the optimizer's ``_partition_all_parameters``."""
        if self.recording:
            for mod in self.order:
                sid = self.fetched_for[id(mod)].popleft()
                self.param_order += [(p, sid) for p in sorted(set(mod.parameters(recurse=False)), key=id)]
            self.recording = False
        self.reset()
        for p, s in self.status.items():
            self.active[p].clear()
            if s == AVAILABLE and p not in self.persist:
                self.status[p] = NOT_AVAILABLE
                self.gpu.own.pop(p, None)
        self.gpu.note()


def hook(model: torch.nn.Module, c: Coordinator) -> None:
    class PreBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, mod: Any, out: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            ctx.mod = mod
            mod._pre_refs = getattr(mod, "_pre_refs", 0) + 1
            return out.detach()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # type: ignore[override]
            if ctx.mod._pre_refs > 0:
                c.fetch(ctx.mod)
                ctx.mod._pre_refs -= 1
            return None, grad

    class PostBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, mod: Any, inp: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
            ctx.mod = mod
            if inp.requires_grad:
                mod._grads_left += 1
            return inp.detach()

        @staticmethod
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor]:  # type: ignore[override]
            ctx.mod._grads_left -= 1
            if ctx.mod._grads_left == 0:
                c.release(ctx.mod)
            return None, grad

    def wrap(fn: Any, mod: Any, x: Any) -> Any:
        if isinstance(x, (tuple, list)):
            return x.__class__(wrap(fn, mod, y) for y in x)
        if isinstance(x, dict):
            for k in x:
                x[k] = wrap(fn, mod, x[k])
            return x
        return fn.apply(mod, x) if type(x) is torch.Tensor else x

    def post_backward(mod: Any, args: Any) -> Any:
        mod._grads_left = 0
        return wrap(PostBackward, mod, args)

    def register(mod: torch.nn.Module) -> None:
        for child in mod.children():
            register(child)
        mod.register_forward_pre_hook(lambda m, _a: c.fetch(m))
        mod.register_forward_hook(lambda m, _i, _o: c.release(m))
        mod.register_forward_hook(lambda m, _i, o: wrap(PreBackward, m, o))
        mod.register_forward_pre_hook(post_backward)

    register(model)


def t0_3b_lora() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model
    from transformers import T5Config, T5ForConditionalGeneration

    cfg = T5Config(
        vocab_size=32128, d_model=2048, d_ff=5120, num_heads=32, d_kv=64, num_layers=24,
        num_decoder_layers=24, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
        dropout_rate=0.1, decoder_start_token_id=0, pad_token_id=0,
    )  # fmt: skip
    cfg._attn_implementation = "eager"
    with torch.device("meta"):
        model = T5ForConditionalGeneration(cfg)
    lora = LoraConfig(
        task_type="SEQ_2_SEQ_LM", r=8, lora_alpha=32, lora_dropout=0.1, target_modules=["q", "v"]
    )
    return get_peft_model(model, lora)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--max-live", type=float, default=1e9)
    ap.add_argument("--prefetch", type=float, default=5e7)
    ap.add_argument("--steps", type=int, default=3)
    args = ap.parse_args()
    model = t0_3b_lora()
    model.train()
    c = Coordinator(list(model.parameters()), int(args.max_live), int(args.prefetch), 10**9, 10**5)
    hook(model, c)
    ids = torch.zeros((8, 56), dtype=torch.long, device="meta")
    labels = torch.zeros((8, 5), dtype=torch.long, device="meta")
    for step in range(1, args.steps + 1):
        c.gpu.peak, c.max_available = 0, 0
        loss = model(input_ids=ids, labels=labels).loss
        forward_peak, forward_end = c.gpu.peak, c.gpu.now
        c.gpu.peak = 0
        loss.backward()
        backward_peak = c.gpu.peak
        c.end_of_step()
        print(
            f"step {step}: gathered forward peak {forward_peak / GIB:.2f} GiB, "
            f"at its end {forward_end / GIB:.2f}, backward peak {backward_peak / GIB:.2f}; "
            f"n_available at most {c.max_available / 1e9:.3f}e9 elements"
        )


if __name__ == "__main__":
    main()
