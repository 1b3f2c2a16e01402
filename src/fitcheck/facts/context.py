"""Memory the GPU runtime holds outside PyTorch's caching allocator, per backend (one table).

CUDA: PyTorch with lazy module loading, "around 400MB" (ptrblck, github.com/pytorch/pytorch/issues/109888;
unsloth-zoo PR #1053 saw 426 MiB on an RTX 6000 Ada); HIP: ollama's 457 MiB reserve (ml/device.go).
The engine's context term and the hardware budget rules both read this table.
"""

from __future__ import annotations

DEFAULT_CONTEXT_MIB: dict[str, int] = {"cuda": 400, "rocm": 457, "mps": 0, "cpu": 0}
