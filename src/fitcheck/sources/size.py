"""Size strings (``7B``, ``350M``) -> a generic Llama-shaped decoder with exactly that many parameters.

How the shape is chosen (docs/methodology.md, "Size strings"):

1. A natural width ``h`` and depth ``L`` for the size are log-interpolated from real Llama-family
   models (table `_ANCHORS`: TinyStories-33M, GPT-2, TinyLlama, Llama 2/3 widths and depths).
2. ``h`` is moved to the nearest width that divides the count exactly (a Llama decoder without
   biases has ``P = h * (L*(2h + 2kv + 3I + 2) + 2V + 1)``, so ``h`` must divide ``P``), preferring
   multiples of 128, then 64, 32, ... so heads stay whole.
3. Heads of 128 (64 below h=1024) dimensions; multi-head attention below 30B, about 8 query heads
   per KV head from 30B (Llama 2 70B style); untied embeddings; vocabulary 32,000 (Llama 2) for 50M and up.
4. The intermediate size is about 8/3 h (SwiGLU); the last few parameters are absorbed by the
   vocabulary size (a change of at most a few rows), which makes the total exact.
"""

from __future__ import annotations

import itertools
import math

from fitcheck.engine.params import count_params
from fitcheck.errors import InputError
from fitcheck.models import DecoderArch, ModelSpec
from fitcheck.units import fmt_count, parse_param_count

# (parameters, hidden size, layers) of real models, used as interpolation anchors.
_ANCHORS: tuple[tuple[float, int, int], ...] = (
    (1e5, 64, 2),
    (1e6, 128, 4),
    (3.3e7, 768, 4),  # roneneldan/TinyStories-33M: 4 layers, 768 wide
    (1.24e8, 768, 12),  # GPT-2
    (3.5e8, 1024, 24),  # GPT-2 medium / OPT-350M
    (1.1e9, 2048, 22),  # TinyLlama 1.1B
    (3.2e9, 3072, 28),  # Llama 3.2 3B
    (6.7e9, 4096, 32),  # Llama 2 7B
    (1.3e10, 5120, 40),  # Llama 2 13B
    (3.4e10, 8192, 48),  # CodeLlama 34B
    (7e10, 8192, 80),  # Llama 2 70B
    (4.05e11, 16384, 126),  # Llama 3.1 405B
)
_VOCAB = 32000


def _interp(n: float) -> tuple[float, float]:
    pts = _ANCHORS
    if n <= pts[0][0]:
        return pts[0][1], pts[0][2]
    for (n0, h0, l0), (n1, h1, l1) in itertools.pairwise(pts):
        if n <= n1:
            t = (math.log(n) - math.log(n0)) / (math.log(n1) - math.log(n0))
            return h0 * (h1 / h0) ** t, l0 + (l1 - l0) * t
    n0, h0, l0 = pts[-1]
    scale = (n / n0) ** (1 / 3)
    return h0 * scale, l0 * scale


def _widths(n: int, target: float) -> list[int]:
    """Widths dividing ``n`` near ``target`` whose heads stay whole (multiples of 8 or more)."""
    lo, hi = max(8, int(target * 0.7)), int(target * 1.4) + 1
    return [h for h in range(lo - lo % 8, hi, 8) if h and n % h == 0]


def _head_dim(h: int) -> int:
    for d in (128, 64, 32, 16, 8) if h >= 1024 else (64, 32, 16, 8):
        if h % d == 0:
            return d
    return h


def _shape(n: int, h: int, depth: int) -> DecoderArch | None:
    """The exact shape for width h and this depth, or None if the integers do not work out."""
    d = _head_dim(h)
    heads = h // d
    # From 30B on, grouped-query attention with about 8 query heads per KV head (Llama 2 70B).
    kv = min(k for k in range(1, heads + 1) if heads % k == 0 and k * 8 >= heads) if n >= 30e9 else heads
    q = n // h  # P / h = L*(2h + 2*kv*d + 3I + 2) + 2V + 1
    vocab0 = _VOCAB if n >= 5e7 else max(64, n // (8 * h))
    rest = q - 1 - 2 * vocab0 - depth * (2 * h + 2 * kv * d + 2)
    inter = rest // (3 * depth)
    for i in (inter, inter - 1):
        rem = rest - 3 * depth * i
        if i >= 8 and rem >= 0 and rem % 2 == 0:
            return DecoderArch(
                model_type="llama",
                hidden_size=h,
                num_layers=depth,
                num_heads=heads,
                num_kv_heads=kv,
                head_dim=d,
                intermediate_size=i,
                vocab_size=vocab0 + rem // 2,
                tie_embeddings=False,
            )
    return None


def _cost(a: DecoderArch, h_t: float, l_t: float, n: int) -> float:
    """Distance from the natural shape: width, SwiGLU ratio 8/3, depth, and head size."""
    cost = abs(math.log(a.hidden_size / h_t)) + abs(math.log(a.intermediate_size / (8 / 3 * a.hidden_size)))
    cost += abs(math.log(a.num_layers / l_t))
    cost += 0.5 * abs(math.log(a.head_dim / (128 if a.hidden_size >= 1024 else 64)))
    return cost


def arch_for_size(n: int) -> DecoderArch:
    """A Llama-shaped decoder with exactly ``n`` parameters, as close to the natural shape as exists."""
    h_t, l_t = _interp(float(n))
    best: DecoderArch | None = None
    depths = range(max(1, int(l_t * 0.6)), int(l_t * 1.5) + 2)
    for h in _widths(n, h_t):
        for depth in depths:
            arch = _shape(n, h, depth)
            if arch is not None and (best is None or _cost(arch, h_t, l_t, n) < _cost(best, h_t, l_t, n)):
                best = arch
    if best is None or count_params(best) != n:
        raise InputError(
            f"no Llama-shaped decoder has exactly {n:,} parameters at a sensible width; "
            "round the size (e.g. 7B, 1.5B, 350M)"
        )
    return best


def spec_from_size(text: str) -> ModelSpec:
    """Parse a size string and build its generic model."""
    n = parse_param_count(text)
    arch = arch_for_size(n)
    return ModelSpec(
        id=text.strip(),
        name=f"generic {fmt_count(n)} Llama-shaped decoder",
        source_kind="size",
        arch=arch,
        declared_params=n,
        source="fitcheck size rule (docs/methodology.md, 'Size strings')",
        hf_config=hf_config_from_arch(arch),
    )


def hf_config_from_arch(a: DecoderArch) -> dict[str, object]:
    """The ``config.json`` of a generic Llama decoder, so `measure` can build the same model."""
    return {
        "model_type": "llama",
        "hidden_size": a.hidden_size,
        "num_hidden_layers": a.num_layers,
        "num_attention_heads": a.num_heads,
        "num_key_value_heads": a.num_kv_heads,
        "head_dim": a.head_dim,
        "intermediate_size": a.intermediate_size,
        "vocab_size": a.vocab_size,
        "tie_word_embeddings": a.tie_embeddings,
        "max_position_embeddings": 131072,
    }
