"""PyTorch's CUDA caching allocator: its size constants and the backends it runs on.

Source: c10/cuda/CUDACachingAllocator.cpp (read at 001074d; the same constants in ROCm's hipified build):
``kMinBlockSize`` 512 (every request rounded up to it), ``kSmallSize`` 1 MiB (the largest request the small
pool serves), ``kSmallBuffer`` 2 MiB (the small pool's segment), ``kMinLargeAlloc`` 10 MiB (up to which a
large request shares a ``kLargeBuffer`` segment), ``kLargeBuffer`` 20 MiB, ``kRoundLarge`` 2 MiB (the
rounding of a larger segment). One table: the engine's reserve (engine/overhead.py), the allocator's
history over varying lengths (engine/cache_history.py) and the bench replays (bench/swift_loss.py) read
it from here.
"""

from __future__ import annotations

from fitcheck.units import MIB

MIN_BLOCK = 512
SMALL_SIZE = 1 * MIB
SMALL_BUFFER = 2 * MIB
MIN_LARGE_ALLOC = 10 * MIB
LARGE_BUFFER = 20 * MIB
ROUND_LARGE = 2 * MIB
#: The backends whose PyTorch memory goes through this allocator (elsewhere: no reserve, no history).
BACKENDS = ("cuda", "rocm")
