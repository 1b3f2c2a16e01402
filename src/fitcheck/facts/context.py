"""Memory the GPU runtime holds outside PyTorch's caching allocator, per backend (one table).

CUDA: PyTorch with lazy module loading, "around 400MB" (ptrblck, github.com/pytorch/pytorch/issues/109888;
unsloth-zoo PR #1053 saw 426 MiB on an RTX 6000 Ada); HIP: ollama's 457 MiB reserve (ml/device.go).
The engine's context term and the hardware budget rules both read this table.
"""

from __future__ import annotations

DEFAULT_CONTEXT_MIB: dict[str, int] = {"cuda": 400, "rocm": 457, "mps": 0, "cpu": 0}

#: Hopper (compute capability 9.x), measured by this project on an H200 (torch 2.11.0+cu130, driver
#: 580.159.04; tests/data/measured/h200*.yaml, bench/measured.py): NVML's used memory beyond torch's
#: ``max_memory_reserved`` at a training step's peak, the median of every setup whose NVML peak was the
#: step's (1382-1390 MiB; tests/test_hw_catalog.py derives it from the files). The bare context after
#: ``torch.cuda.init`` read 529 MiB; the rest is the kernel modules and library workspaces (cuBLAS,
#: cuBLASLt, flash attention) a step loads. The catalog's Hopper entries carry the same figure.
HOPPER_CONTEXT_MIB = 1386
