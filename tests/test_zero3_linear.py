"""DeepSpeed ZeRO-3's ``F.linear`` replacement keeps every projection's input (`zero3_linear_keeps_inputs`).

``zero.Init`` sets ``torch.nn.functional.linear = zero3_linear_wrap`` for the rest of the process, and
``LinearFunctionForZeroStage3`` saves its input whether or not a gradient needs it (DeepSpeed
runtime/zero/linear.py, v0.7.7 to edaa7221): under LoRA the frozen projections keep inputs that torch's
own linear would not. Held here to a CPU step of a T5 v1.1 LoRA model run with DeepSpeed's own wrapper.
"""

from __future__ import annotations

from typing import Any

import pytest

from fitcheck.engine import activations as act
from fitcheck.engine.regimes import regime_for
from fitcheck.models import LlmSetup
from fitcheck.sources.hf_config import arch_from_hf_config
from fitcheck.sources.resolve import resolve_model

D, DFF, HEADS, DKV = 64, 160, 4, 16


def _t5(layers: int) -> dict[str, Any]:
    return {"model_type": "t5", "vocab_size": 128, "d_model": D, "d_ff": DFF, "num_heads": HEADS, "d_kv": DKV,
            "num_layers": layers, "num_decoder_layers": 2, "feed_forward_proj": "gated-gelu",
            "tie_word_embeddings": False, "dropout_rate": 0.1, "decoder_start_token_id": 0,
            "pad_token_id": 0}  # fmt: skip


def _lora(**kw: Any) -> LlmSetup:
    base: dict[str, Any] = {"method": "lora", "precision": "fp32", "autocast": False, "lora_dropout": 0.1}
    return LlmSetup(**{**base, **kw})


def _layer_extra(a: Any, **kw: Any) -> float:
    """Bytes per token one layer keeps more under ZeRO-3 than without it."""
    plain, zero3 = _lora(**kw), _lora(strategy="zero3", gpus=4, **kw)
    more = act.layer_activations(a, zero3, regime_for(zero3)).total(1)
    return more - act.layer_activations(a, plain, regime_for(plain)).total(1)


def test_lora_under_zero3_keeps_the_frozen_projections_inputs() -> None:
    """Llama-2-7B, LoRA on q_proj and v_proj in fp32: each layer keeps, per token, the normed input of
    q/k/v (once), o_proj's input, the normed input of gate/up (once) and down_proj's input:
    4 B x (h + h + h + I). Without LoRA dropout lora_A saves that normed input itself already."""
    a = resolve_model("llama-2-7b").arch
    assert _layer_extra(a, lora_targets="q_proj,v_proj") == 4 * (3 * 4096 + 11008)
    assert _layer_extra(a, lora_targets="q_proj,v_proj", lora_dropout=0.0) == 4 * (2 * 4096 + 11008)
    full = LlmSetup(method="full", precision="fp32", autocast=False, strategy="zero3", gpus=4)
    assert not act.zero3_linear_keeps_inputs(full)
    assert not act.zero3_linear_keeps_inputs(_lora(strategy="zero3", gpus=4, base_quant="int8"))
    assert not act.zero3_linear_keeps_inputs(_lora(strategy="zero2", gpus=4))


def _traced_extra(layers: int, seq: int) -> int:
    """Saved bytes (parameters excepted) of a T5 v1.1 LoRA(q, v) step with DeepSpeed's ``zero3_linear_wrap``
    as ``F.linear``, less the same step with torch's own."""
    torch = pytest.importorskip("torch")
    tf = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    linear_mod = pytest.importorskip("deepspeed.runtime.zero.linear")
    import torch.nn.functional as F

    def saved(patched: bool) -> int:
        torch.manual_seed(0)
        cfg = tf.T5Config(**{k: v for k, v in _t5(layers).items() if k != "model_type"})
        cfg._attn_implementation = "eager"
        lora = peft.LoraConfig(task_type="SEQ_2_SEQ_LM", r=8, lora_alpha=32, lora_dropout=0.1,
                               target_modules=["q", "v"])  # fmt: skip
        model = peft.get_peft_model(tf.T5ForConditionalGeneration(cfg), lora).train()
        params = {p.untyped_storage().data_ptr() for p in model.parameters()}
        sizes: dict[int, int] = {}

        def pack(t: Any) -> Any:
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                sizes[st.data_ptr()] = max(sizes.get(st.data_ptr(), 0), st.nbytes())
            return t

        ids = torch.randint(0, 128, (4, seq))
        labels = torch.randint(0, 128, (4, 5))
        orig = F.linear
        F.linear = linear_mod.zero3_linear_wrap if patched else orig
        try:
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
        finally:
            F.linear = orig
        return sum(sizes.values())

    return saved(True) - saved(False)


def test_the_kept_inputs_match_a_traced_t5_step() -> None:
    """Per encoder token and layer (differences over encoder depth and source length cancel the decoder,
    the head and the scalar tensors the wrapper saves): the engine's layer difference, 4 B x (d + inner + d
    + d_ff) for T5 v1.1's gated MLP, is what the traced step keeps more."""
    traced = (_traced_extra(3, 48) - _traced_extra(2, 48)) - (_traced_extra(3, 24) - _traced_extra(2, 24))
    per_token = traced / (4 * 24)
    engine = _layer_extra(arch_from_hf_config(_t5(2)), lora_targets="q,v")
    assert per_token == engine == 4 * (D + HEADS * DKV + D + DFF)
