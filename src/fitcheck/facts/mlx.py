"""What MLX's own evaluation of mlx-lm's compiled, checkpointed LoRA step holds beyond the saved tensors.

MLX evaluates the whole step (``nn.value_and_grad`` and the optimizer update, ``mx.compile``'d) as one lazy
graph in its own order, so torch's autograd rules (fp32 softmax and log-softmax, one layer's activations
recomputed at a time) neither bound nor describe it. These figures were measured on MLX's CPU backend (mlx
0.32.0 [cpu], mlx-lm 0.31.3), which runs the same unfused training attention as Metal (``use_fallback``), at
MLX's default memory limit; every run is a line of tests/data/mlx_cpu/runs.jsonl and tests/test_mlx_eval.py
re-derives each figure from those lines (docs/methodology.md, "NF4 formats", the MLX paragraphs).

* ``LAYERS_HELD``: bench/mlx_cpu_step.py, 16 checkpointed layers (bf16, unquantized, hidden 1,024, 8 heads
  of 128, 2 KV heads, vocabulary 2,048) at 512 / 1,024 / 2,048 tokens and the default limit fix the step's
  marginal as c + a per token + b U exactly; less the 16 checkpoints, ``a`` is this many times one layer's
  activations a token as the mlx regime counts them (its scores aside): what MLX keeps of the layers its
  evaluation order has in flight (bounded: from 16 to 36 layers the step grows by exactly the checkpoint a
  layer).
* ``SCORE_TENSORS``: ``b`` of the same fit, in U = b x heads x s^2 x the compute dtype's bytes (one score
  tensor): the attention backward's moment beside those layers.
* ``FORWARD_SCORE_TENSORS``: bench/mlx_sdpa_op.py, the isolated causal SDPA's forward peak over its inputs
  at the default limit, the largest of 1,024 / 2,048 / 4,096 tokens: what a checkpointed (unsaved) forward
  holds of the attention beside its q, k and v.
"""

from __future__ import annotations

LAYERS_HELD = 2.95
SCORE_TENSORS = 1.96
FORWARD_SCORE_TENSORS = 1.31
SOURCE = (
    "MLX's CPU backend at its default memory limit (mlx 0.32.0, mlx-lm 0.31.3): bench/mlx_cpu_step.py and "
    "bench/mlx_sdpa_op.py, tests/data/mlx_cpu/runs.jsonl (docs/methodology.md, NF4 formats)"
)
