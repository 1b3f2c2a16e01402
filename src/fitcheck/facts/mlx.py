"""What MLX's own evaluation of mlx-lm's compiled LoRA step holds beyond the saved tensors.

MLX evaluates the whole step (``nn.value_and_grad`` and the optimizer update, ``mx.compile``'d) as one lazy
graph in its own order, so torch's autograd rules (fp32 softmax and log-softmax, one layer's activations
recomputed at a time) neither bound nor describe it. These figures were measured on MLX's CPU backend (mlx
0.32.0 [cpu], mlx-lm 0.31.3), which runs the same unfused training attention as Metal (``use_fallback``), at
MLX's default memory limit; every run is a line of tests/data/mlx_cpu/runs.jsonl and tests/test_mlx_eval.py
re-derives each figure from those lines (docs/methodology.md, "NF4 formats", the MLX paragraphs).

* ``LAYERS_HELD``: bench/mlx_cpu_step.py, 16 checkpointed layers (bf16, unquantized, vocabulary 2,048) at 512
  / 1,024 / 2,048 tokens and the default limit fix the step's marginal as c + a per token + b U exactly; less
  the 16 checkpoints, ``a`` is this many times one layer's activations a token as the mlx regime counts them
  (its scores aside): what MLX keeps of the layers its evaluation order has in flight (bounded: from 16 to 36
  layers the step grows by exactly the checkpoint a layer). The larger of two widths' fits: 3.20 at hidden 512
  (4 heads of 128, one KV head), 2.95 at hidden 1,024 (8 heads, 2 KV heads).
* ``SCORE_TENSORS``: ``b`` of the same fits, in U = b x heads x s^2 x the compute dtype's bytes (one score
  tensor), the larger of 1.62 (hidden 512) and 1.96 (hidden 1,024): the attention backward's moment beside
  those layers.
* ``FORWARD_SCORE_TENSORS``: bench/mlx_sdpa_op.py, the isolated causal SDPA's forward peak over its inputs
  at the default limit, the largest of 1,024 / 2,048 / 4,096 tokens: what a checkpointed (unsaved) forward
  holds of the attention beside its q, k and v.

Without checkpointing (mlx-lm's default: ``--grad-checkpoint`` off), bench/mlx_cpu_step.py ``--no-ckpt`` at 4
and 16 layers and 1,024 and 2,048 tokens (the same shape, the default limit) fix the step's marginal as
c + L x (a per token + p U) + b U exactly: ``a`` is 0.88 of one layer's activations as the mlx regime counts
them (its scores aside; counted whole, the upper side), and

* ``SAVED_SCORE_TENSORS``: ``p``, what each layer keeps of its attention for the backward, in U: about one
  score tensor (the softmax output the vjp needs), where torch's eager rule keeps three;
* ``BACKWARD_SCORE_TENSORS``: ``b``, the attention backward's moment beside every layer's saved tensors.

Counted that way the estimate is 2-9% over those four probes and +2.2-2.4% over two run after the fit at
another shape (hidden 512, 4 heads, 8 layers: held out).
"""

from __future__ import annotations

LAYERS_HELD = 3.2
SCORE_TENSORS = 1.96
FORWARD_SCORE_TENSORS = 1.31
SAVED_SCORE_TENSORS = 0.92
BACKWARD_SCORE_TENSORS = 4.46
SOURCE = (
    "MLX's CPU backend at its default memory limit (mlx 0.32.0, mlx-lm 0.31.3): bench/mlx_cpu_step.py "
    "(with and without checkpointing) and bench/mlx_sdpa_op.py, tests/data/mlx_cpu/runs.jsonl "
    "(docs/methodology.md, NF4 formats)"
)
