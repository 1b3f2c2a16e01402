"""Prefix tuning (P-Tuning v2): trained key/value prefixes in every layer on a frozen base.

peft's ``PREFIX_TUNING`` (peft 0.21.2 ``tuners/prefix_tuning/model.py`` ``PrefixEncoder``) trains one
``nn.Embedding(num_virtual_tokens, num_layers * 2 * token_dim)``, or with ``prefix_projection`` an
``Embedding(num_virtual_tokens, token_dim)`` followed by ``Linear(token_dim, encoder_hidden_size)``, ``Tanh``,
``Linear(encoder_hidden_size, num_layers * 2 * token_dim)``. ``token_dim`` is the key/value width: peft's
``_prepare_prompt_learning_config`` (utils/other.py, "For grouped-query attention, see #1901") sets it to
``head_dim x num_key_value_heads``, and ``encoder_hidden_size`` to ``token_dim`` when unset. The encoder
is built in torch's default dtype (fp32) and peft never casts it (``_setup_prompt_encoder`` moves it to the
device only); ``get_prompt`` casts its output to the base model's dtype. ChatGLM's own prefix encoder
(``config.pre_seq_len``, THUDM ChatGLM3 finetune_demo/finetune_hf.py @9484f82) has the same embedding
without projection, and the script casts it to fp32 (``_prepare_model_for_training``).

Memory beyond a frozen base: those parameters with their gradients and optimizer states, and in every
layer keys and values ``p`` positions longer, which the attention kernel saves for backward (eager: scores
s x (s + p); engine/activations.py ``_prefix_acts``, ``prefix_cache_bytes``). The encoder's output (b x p x
L x 2 x token_dim) is not held at the peaks: each layer's cache concatenates its slice into a new tensor and
drops it, so it is gone by the loss (traced, tests/data/calibration llama2-25), and its gradient gathers only
at the end of backward, when the activations are freed.
"""

from __future__ import annotations

from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup, Regime
from fitcheck.vocab import PREFIX

#: Where the prefix rules come from (the planner's and the docs' reason strings).
SRC_PREFIX = (
    "peft 0.21.2 tuners/prefix_tuning/model.py PrefixEncoder; utils/other.py _prepare_prompt_learning_config "
    "(token_dim = head_dim x kv heads); peft_model.py get_prompt (prefix cast to the base dtype)"
)
#: Trainers whose scripts run peft's PREFIX_TUNING (or a model's own prefix encoder): the plain HF Trainer
#: family. torchtune, mlx-lm, litgpt, unsloth, axolotl and LLaMA-Factory have no prefix-tuning method.
PREFIX_TRAINERS = ("generic", "hf")


def is_prefix(setup: LlmSetup) -> bool:
    return setup.method == PREFIX


def tokens(setup: LlmSetup) -> int:
    """Virtual tokens per layer (0 for other methods)."""
    return (setup.prefix_tokens or 0) if is_prefix(setup) else 0


def token_dim(a: DecoderArch) -> int:
    """Width of one layer's prefix keys (or values): head_dim x kv heads (peft #1901)."""
    return a.num_kv_heads * a.head_dim


def shapes(a: DecoderArch, setup: LlmSetup) -> list[tuple[int, int, int]]:
    """(rows, cols, how many) of the prefix encoder's trainable tensors; vectors have cols = 1."""
    p, d, out = tokens(setup), token_dim(a), a.num_layers * 2 * token_dim(a)
    if not setup.prefix_projection:
        return [(p, out, 1)]
    e = setup.prefix_hidden or d
    return [(p, d, 1), (e, d, 1), (e, 1, 1), (out, e, 1), (out, 1, 1)]


def params(a: DecoderArch, setup: LlmSetup) -> int:
    """Trainable parameters of the prefix encoder."""
    return sum(r * c * k for r, c, k in shapes(a, setup)) if is_prefix(setup) else 0


def matmul_params(a: DecoderArch, setup: LlmSetup) -> int:
    """The prefix encoder's weights that a matmul reads (the projection MLP's two ``Linear``), which
    autocast casts to the compute dtype; the ``Embedding`` table is indexed, not multiplied, and
    ``F.embedding`` is on no autocast list, so it is never cast (traced: no cast of the table)."""
    if not is_prefix(setup) or not setup.prefix_projection:
        return 0
    return sum(r * c * k for r, c, k in shapes(a, setup)[1:] if c > 1)


def with_prefix_dtype(base: Regime, setup: LlmSetup) -> Regime:
    """The prefix encoder and its gradients are fp32 whatever the base (see the module docstring)."""
    if not is_prefix(setup):
        return base
    update = {"adapter_dtype": "fp32", "grad_dtype": "fp32", "source": base.source + "; " + SRC_PREFIX}
    return base.model_copy(update=update)


def check(setup: LlmSetup) -> None:
    """Refuse what prefix tuning is not modelled with, in one line each."""
    if not is_prefix(setup):
        if setup.prefix_tokens is not None or setup.prefix_projection or setup.prefix_hidden is not None:
            raise OptionError(
                "--prefix-tokens/--prefix-projection/--prefix-hidden apply to --method prefix-tuning"
            )
        return
    if setup.prefix_tokens is None:
        raise OptionError("--method prefix-tuning needs --prefix-tokens N (peft's num_virtual_tokens)")
    if setup.prefix_hidden is not None and not setup.prefix_projection:
        raise OptionError("--prefix-hidden is the width of --prefix-projection's MLP: give both")
    if setup.trainer not in PREFIX_TRAINERS:
        raise OptionError(
            f"--method prefix-tuning: --trainer {setup.trainer} has no prefix tuning; "
            "use --trainer hf or generic"
        )
    if setup.dora or setup.lora_fa or setup.base_quant != "none" or setup.train_modules:
        raise OptionError(
            "--dora, --lora-fa, --base-quant and --train-modules are LoRA options, not prefix tuning"
        )
    if setup.distributed or setup.compile or (setup.task not in (None, "causal-lm")):
        raise OptionError(
            "--method prefix-tuning is modelled for a causal LM on one GPU without torch.compile"
        )
