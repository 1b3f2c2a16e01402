"""CUDA's autocast op lists, applied to CPU (and fake CPU) tensors while tracing.

CPU autocast casts far fewer ops than CUDA autocast. Under CUDA autocast ``layer_norm``, ``pow``,
``exp``, ``rsqrt``, ... run in fp32 (inputs cast up, outputs fp32) and ``softmax``, ``sum``,
``cumsum``, ... produce fp32 outputs; on CPU they stay in bf16. That changes the saved tensors of,
for instance, GPT-2 (LayerNorm, ``gelu_new``'s ``pow``) and the MoE combine (``sum``). This module
registers ``AutocastCPU`` kernels with CUDA's policies for the ops CPU autocast does not already
handle, for the duration of a trace.

Lists: ``AT_FORALL_FP32``, ``AT_FORALL_FP32_SET_OPT_DTYPE`` and ``AT_FORALL_LOWER_PRECISION_FP`` in
aten/src/ATen/autocast_mode.h (the CUDA registrations in autocast_mode.cpp). Weight-cast caching of
the C++ policy is not reproduced for the few lower-precision ops added here (einsum, mv, addmv,
addr); linear/matmul/mm/bmm/baddbmm/addmm and SDPA already have CPU kernels with the cache.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from fitcheck.measure._internals import (
    destroy_library,
    exclude_autocast_cpu,
    has_autocast_cpu_kernel,
    tree_map,
)

#: CUDA fp32 policy: floating inputs are cast to fp32.
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "group_norm", "frobenius_norm.dim", "nuclear_norm",
    "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
)  # fmt: skip
#: CUDA fp32_set_opt_dtype policy: compute and return fp32 unless the caller chose a dtype.
SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "sum", "sum.dim_IntList",
)  # fmt: skip
#: CUDA lower_precision_fp ops that CPU autocast leaves alone.
LOWER = ("einsum", "mv", "addmv", "addr", "chain_matmul", "linalg_multi_dot")

_LOW = (torch.bfloat16, torch.float16)


def _overload(name: str) -> Any | None:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != torch.float64


def _fp32(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        up = lambda t: t.float() if _eligible(t) and t.dtype in _LOW else t  # noqa: E731
        with exclude_autocast_cpu():
            return op(*tree_map(up, args), **tree_map(up, kwargs))

    return kernel


def _set_opt_dtype(op: Any) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    pos = names.index("dtype") if "dtype" in names else None

    def kernel(*args: Any, **kwargs: Any) -> Any:
        if pos is not None and _eligible(args[0]):
            if len(args) > pos:
                if args[pos] is None:
                    args = (*args[:pos], torch.float32, *args[pos + 1 :])
            elif kwargs.get("dtype") is None:
                kwargs = {**kwargs, "dtype": torch.float32}
        with exclude_autocast_cpu():
            return op(*args, **kwargs)

    return kernel


def _lower(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = torch.get_autocast_dtype("cpu")
        down = lambda t: t.to(dtype) if _eligible(t) and t.dtype != dtype else t  # noqa: E731
        with exclude_autocast_cpu():
            return op(*tree_map(down, args), **tree_map(down, kwargs))

    return kernel


@contextlib.contextmanager
def cuda_autocast_policy() -> Iterator[list[str]]:
    """Register CUDA's policies on ``AutocastCPU`` for ops CPU autocast does not cover; yield their names."""
    lib = torch.library.Library("aten", "IMPL")
    added: list[str] = []
    try:
        for names, wrap in ((FP32, _fp32), (SET_OPT_DTYPE, _set_opt_dtype), (LOWER, _lower)):
            for name in names:
                op = _overload(name)
                if op is None or has_autocast_cpu_kernel(op):
                    continue
                lib.impl(name, wrap(op), "AutocastCPU")
                added.append(name)
        yield added
    finally:
        destroy_library(lib)
