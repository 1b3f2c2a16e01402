"""The load phase: what loading the model holds on the device before the first step.

``torch.cuda.max_memory_allocated`` covers loading too, so a run whose training step is small can
peak while its weights arrive. Each trainer's loading path, from its code (docs/methodology.md,
"Load phase"):

* transformers ``from_pretrained`` (HF, TRL, axolotl, LLaMA-Factory, Unsloth) places one tensor at a
  time; with bitsandbytes each projection arrives on the CPU and ``Params4bit(...).to(device)``
  quantizes it on the device (``quantizer_bnb_4bit.py create_quantized_param`` @009ba7ca), so one
  16-bit projection is alive beside the packed weights; ``adjust_max_memory`` keeps 10% free "for
  buffers that are created during quantization". peft's ``prepare_model_for_kbit_training`` then
  casts each unquantized tensor to fp32: one 16-bit original beside its fp32 copy at a time.
* litgpt builds the model on the device (``fabric.init_module(empty_init=(devices > 1))``,
  finetune/lora.py @01fe959c) under lightning's ``BitsandbytesPrecision``: each ``_Linear4bit`` is
  created in 16 bits and quantized in its constructor from a ``.half()`` copy
  (fabric/plugins/precision/bitsandbytes.py @003e3070), and ``load_state_dict`` re-quantizes each
  checkpoint tensor the same way; so the peak is the packed weights plus one 16-bit projection and its
  fp16 copy, the largest being lm_head, which litgpt quantizes too. The code quantizes per layer: the
  whole 16-bit model is never on the device at once.
* torchtune builds the model on the device in the model dtype; ``FrozenNF4Linear`` converts its weight
  with torchao ``to_nf4`` in its constructor (modules/low_precision/nf4_linear.py @0e08081e), one layer
  at a time, and the checkpoint is loaded on the CPU and copied in: torchao's ``copy_`` moves each
  16-bit tensor to the device and runs ``NF4Tensor.from_tensor`` on it (nf4tensor.py @v0.5.0), so the
  peak is the packed weights plus one projection being quantized (`fitcheck.engine.nf4.quantize_bytes`).
"""

from __future__ import annotations

from fitcheck.engine import nf4
from fitcheck.engine.params import Linear, inventory, layer_linears
from fitcheck.engine.quant import expert_modules, is_fused_expert, quantized_linear
from fitcheck.facts.dtypes import nbytes
from fitcheck.models import DecoderArch, LlmSetup, Regime

#: Bytes per weight held while one projection is quantized on the device: the 16-bit tensor, plus the
#: fp16 copy lightning's ``_quantize_weight`` makes (``weight.contiguous().to("cuda", torch.half)``).
QUANTIZE_TRANSIENT_BYTES: dict[str, int] = {"litgpt": 4, "default": 2}


def _whole_stack(a: DecoderArch, setup: LlmSetup | None, lin: Linear) -> bool:
    """Unsloth quantizes and dequantizes a fused expert parameter as one stack (every expert at once):
    unsloth-zoo's Bnb4bit quantizer patch turns the 3-D parameter into one ``Params4bit`` (unsloth-zoo
    issue #850) and its grouped-mm forward dequantizes the whole stack (unsloth-zoo PR #862: "One fused
    dequant gives (E, out, in)")."""
    if setup is None or setup.trainer != "unsloth":
        return False
    return is_fused_expert(lin) and not expert_modules(a, setup)


def largest_projection(a: DecoderArch, with_head: bool, setup: LlmSetup | None = None) -> int:
    """Elements of the largest quantized matrix (lm_head included when the trainer quantizes it; the
    fused MoE experts bitsandbytes leaves in 16 bits left out, `quant.quantized_linear`)."""
    lins = layer_linears(a, a.is_moe)
    keep = [x for x in lins if x.role != "router" and (setup is None or quantized_linear(a, setup, x))]
    sizes = [x.d_in * x.d_out * (x.copies if _whole_stack(a, setup, x) else 1) for x in keep]
    if with_head:
        sizes.append(a.vocab_size * a.hidden_size)
    return max(sizes, default=0)


def load_transient_bytes(a: DecoderArch, setup: LlmSetup, regime: Regime, quantized: bool) -> int:
    """Bytes alive during loading beyond the weights as they end up (16-bit tensors being quantized or
    upcast). Zero for an unquantized model: tensors are placed where they stay."""
    if not quantized:
        return 0
    n = largest_projection(a, regime.quantized_lm_head, setup)
    per = QUANTIZE_TRANSIENT_BYTES.get(regime.name, QUANTIZE_TRANSIENT_BYTES["default"])
    fmt = regime.nf4_format if setup.method == "qlora" else "bitsandbytes"
    torchao = nf4.quantize_bytes(fmt, n, nbytes(regime.weight_dtype))
    quant = per * n if torchao is None else torchao
    upcast = 0
    if regime.kbit_upcast or regime.kbit_norms_fp32:
        inv = inventory(a)
        upcast = max(inv.embedding, inv.lm_head) * nbytes(regime.weight_dtype)
    if regime.kbit_norms_fp32:
        # TRL 0.9-0.24 ran peft's full upcast before casting embeddings / lm_head back: until then they are
        # fp32 (TRL 0.25's own preparation upcasts only the norms: this is its upper bound)
        upcast += (inv.embedding + inv.positions + inv.lm_head) * (4 - nbytes(regime.weight_dtype))
    return max(quant, upcast)
