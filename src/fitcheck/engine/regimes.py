"""Precision regimes: which dtype each kind of tensor really has under each trainer.

A regime is a named fact about a trainer's code, not a tunable: ``--trainer`` picks it so that an
estimate for a config emitted for trainer X is an estimate of what X will do. Each row cites the
code that decides it (docs/methodology.md, "Precision regimes").

Summary (bytes per trainable parameter for full fine-tuning with AdamW, before activations):

=============  =========================================================  ==========
regime         weights / grads / AdamW states                             B/param
=============  =========================================================  ==========
generic        compute-dtype weights and grads, fp32 moments (the seeds)   12 (16 with master)
hf             bf16 weights (transformers 5 loads dtype="auto"), bf16      8
               grads, fused AdamW states in the param dtype; autocast on
hf + master    fp32 weights (AMP), fp32 grads and states; autocast on      16
torchtune      bf16 everywhere, fused AdamW, chunked cross-entropy         8
axolotl        as hf (HF Trainer underneath)                               8
llamafactory   trainable params cast to fp32 (AMP), fp32 grads and states  16
mlx            model dtype everywhere (no autocast), states zeros_like     8
=============  =========================================================  ==========

LoRA: peft keeps adapters in fp32 (``autocast_adapter_dtype=True``), so under ``hf`` each wrapped
module saves its own cast copy of its input; torchtune builds adapters in the model dtype; ``generic``
is the textbook accounting (adapters in the compute dtype, no framework quirks), which is what the
seeds' rules of thumb assume. QLoRA under hf follows the setup's ``kbit_prep`` (`kbit_prep`): TRL's
SFTTrainer (>= 0.26, what ``trl sft`` runs) never calls ``prepare_model_for_kbit_training`` and casts the
adapters to bf16, so the non-quantized parameters keep the load dtype; a script that calls it
(``--kbit-prep``, peft's documented recipe) has every non-quantized parameter (embeddings, norms, lm_head)
in fp32 and fp32 adapters; ``kbit_path`` names two more (`_hf`): TRL 0.9-0.25 (prepared, then norms fp32
and embeddings / lm_head cast back to bf16) and a plain script (load dtype, fp32 adapters). axolotl and
LLaMA-Factory do not keep that upcast (axolotl casts norms and
embeddings back to the load dtype, LLaMA-Factory never calls it). QLoRA under hf with FSDP or ZeRO-3
("sharded QLoRA") has no k-bit preparation either, whatever the TRL release.
mlx-lm builds LoRA adapters in fp32 (``mx.random.uniform`` / ``mx.zeros`` default dtype) on a model
kept in its stored dtype, with no autocast.
"""

from __future__ import annotations

import re

from fitcheck.facts import mlx
from fitcheck.models import Dtype, KbitPath, LlmSetup, ModelSpec, Regime
from fitcheck.vocab import Strategy

SRC_SEEDS = "seeds/002 (12 B/param: 16-bit weight + 16-bit grad + two fp32 Adam moments)"
SRC_HF = "transformers 5.x Trainer (bf16=True autocast, optim adamw_torch_fused default), peft defaults"
SRC_TT = (
    "torchtune recipes (dtype bf16, fused AdamW, CEWithChunkedOutputLoss num_output_chunks=8); QLoRA bases "
    "are torchao NF4Tensor (modules/low_precision/nf4_linear.py FrozenNF4Linear, modules/peft/lora.py "
    "LoRALinear quantize_base -> to_nf4 / linear_nf4 @30b8519e; torchao dtypes/nf4tensor.py @v0.5.0)"
)
SRC_KBIT = "peft utils/other.py prepare_model_for_kbit_training: non-INT8/4-bit params cast to fp32"
SRC_AXO = (
    "axolotl loaders/model.py _configure_embedding_dtypes @067b021c: norms and embeddings cast back to "
    "torch_dtype after prepare_model_for_kbit_training; HF Trainer otherwise"
)
SRC_LMF = (
    "LLaMA-Factory model/adapter.py init_adapter @ff6d4d12: trainable params cast to fp32 unless pure_bf16; "
    "no prepare_model_for_kbit_training (model_utils/checkpointing.py prepare_model_for_training)"
)
SRC_LITGPT = (
    "litgpt finetune/lora.py @01fe959c (precision bf16-true by default; quantize=bnb.* -> lightning "
    "BitsandbytesPrecision, every nn.Linear incl. lm_head 4-bit; bnb.optim.PagedAdamW when quantized, "
    "torch.optim.AdamW otherwise; model(input_ids, lm_head_chunk_size=128) + chunked_cross_entropy, "
    "finetune/full.py model(input_ids) unchunked); litgpt/lora.py LoRA modules built in the model dtype; "
    "no activation checkpointing on one device; lightning 2.4.0 _FabricModule.forward casts the logits "
    "to fp32 (precision.convert_output)"
)
SRC_LITGPT_MIXED = (
    "lightning fabric plugins/precision/amp.py MixedPrecision (bf16-mixed / 16-mixed): forward_context "
    "torch.autocast(dtype=bfloat16 / float16), no module conversion (fp32 weights), convert_output to the "
    "default dtype (fp32); plugins/precision/fsdp.py FSDPPrecision: bf16-mixed / 16-mixed init the module in "
    "fp32 and gather in param_dtype bfloat16 / float16 under autocast (lightning @7f0c3436); litgpt "
    "utils.py get_default_supported_precision(training=True) -> bf16-mixed"
)
SRC_UNSLOTH = (
    "Unsloth FastLanguageModel on the HF/TRL Trainer: bitsandbytes 4-bit base, peft adapters, "
    "use_gradient_checkpointing='unsloth' offloads each checkpoint to the CPU "
    "(Unsloth_Offloaded_Gradient_Checkpointer, unsloth_zoo gradient_checkpointing.py), Triton "
    "Fast_CrossEntropyLoss (unsloth/kernels/cross_entropy_loss.py @0050c73e); its own k-bit preparation "
    "keeps embeddings and lm_head in the load dtype"
)
SRC_MLX = (
    "mlx-lm tuner/lora.py LoRALinear @d78bf58e (adapters mx.random.uniform/mx.zeros, float32), "
    "mlx.optimizers states zeros_like(param), tuner/trainer.py default_loss (cross_entropy on model-dtype "
    "logits); no autocast in MLX"
)


#: Trainers whose own model code never ties the output layer to the embedding. litgpt's ``GPT`` always builds
#: ``lm_head`` as its own ``nn.Linear`` and its converter copies a tied checkpoint's embedding into it
#: (litgpt/model.py and litgpt/scripts/convert_hf_checkpoint.py @00af8b0d: ``if "lm_head.weight" not in
#: state_dict: state_dict["lm_head.weight"] = state_dict["transformer.wte.weight"]``); the finetune scripts
#: refuse ``train.tie_embeddings`` (finetune/lora.py, full.py ``validate_args``).
UNTIED_TRAINERS = ("litgpt",)
SRC_UNTIED = (
    "litgpt model.py / scripts/convert_hf_checkpoint.py @00af8b0d: lm_head is a separate nn.Linear, a tied "
    "checkpoint's embedding is copied into it"
)


#: Trainers whose attention adapts the query, key and value parts of one fused qkv module each on its own
#: (litgpt ``LoRAQKVLinear``: ``enable_lora = (lora_query, lora_key, lora_value)``, ``lora_A`` r x (parts)
#: rows, ``lora_B`` as wide as the enabled parts, litgpt/lora.py @00af8b0d and lit-gpt lora.py @8641822):
#: a model whose config fuses qkv is posed with q, k and v as separate projections (same weights), so
#: ``--lora-targets q_proj,v_proj`` says ``lora_query`` + ``lora_value``; what the fused module keeps
#: beyond that is litgpt's rules (engine/litgpt.py: fused output kept, ``zero_pad`` source, one dropout).
QKV_PARTS_TRAINERS = ("litgpt",)
#: Per trainer, the model types whose fused Hub projections its own model code builds apart: torchtune's
#: Phi-3 and Phi-4 (model_type ``phi3``) are ``MultiHeadAttention(q_proj=, k_proj=, v_proj=,
#: output_proj=)`` and ``FeedForward(gate_proj=, down_proj=, up_proj=)`` (torchtune/models/phi3/
#: _component_builders.py ``phi3`` / ``phi3_mlp`` @bd2a0fc7; phi4/_model_builders.py ``phi4_14b`` calls
#: ``phi3``), and its checkpointer splits the Hub's fused ``qkv_proj`` / ``gate_up_proj``
#: (models/phi3/_convert_weights.py). The same weights, posed as separate projections.
UNFUSED_TRAINERS: dict[str, tuple[str, ...]] = {"torchtune": ("phi3",)}
#: Trainers whose plain (non-gated) MLP runs its GELU as one torch op, whatever formula the Hub config
#: names: litgpt ``GptNeoxMLP.forward`` calls ``torch.nn.functional.gelu(x, approximate=
#: config.gelu_approximate)`` (lit_gpt/model.py @8641822, litgpt/model.py @00af8b0d; Phi's litgpt configs
#: set ``gelu_approximate="tanh"``), so the Python tanh formulas (``gelu_new`` and kin, which keep several
#: tensors) are posed as ``gelu_pytorch_tanh`` (one op that saves its input).
FUSED_GELU_TRAINERS = ("litgpt",)
PYTHON_GELUS = ("gelu_new", "gelu_python", "gelu_fast", "gelu_accurate")


def model_as_trained(spec: ModelSpec, setup: LlmSetup) -> ModelSpec:
    """The model as the trainer builds it: untied output layer under trainers that never tie it; q, k
    and v as separately adaptable parts under trainers that adapt a fused qkv's parts
    (`QKV_PARTS_TRAINERS`); no fused projection under trainers that build them apart
    (`UNFUSED_TRAINERS`); one-op GELU under trainers whose model code calls torch's (`FUSED_GELU_TRAINERS`).
    """
    update: dict[str, bool | str] = {}
    notes: list[str] = []
    if setup.trainer in UNTIED_TRAINERS and spec.arch.tie_embeddings:
        update["tie_embeddings"] = False
        notes.append(f"{setup.trainer} keeps lm_head untied from the embedding: both are counted")
    if setup.trainer in QKV_PARTS_TRAINERS and spec.arch.fused_qkv:
        update["fused_qkv"] = False
        notes.append(
            f"{setup.trainer} adapts the q, k and v parts of the fused qkv separately "
            "(lora_query / lora_key / lora_value): they are named q_proj, k_proj, v_proj"
        )
    fused = spec.arch.fused_qkv or spec.arch.fused_gate_up
    if fused and spec.arch.model_type in UNFUSED_TRAINERS.get(setup.trainer, ()):
        update.update(fused_qkv=False, fused_gate_up=False)
        notes.append(
            f"{setup.trainer} builds q, k, v and the MLP's gate and up as separate projections "
            "(its checkpointer splits the fused ones): q_proj, k_proj, v_proj, gate_proj, up_proj"
        )
    if setup.trainer in FUSED_GELU_TRAINERS and spec.arch.activation in PYTHON_GELUS:
        update["activation"] = "gelu_pytorch_tanh"
        notes.append(f"{setup.trainer} runs the MLP's GELU as torch's gelu(approximate='tanh')")
    if not update:
        return spec
    arch = spec.arch.model_copy(update=update)
    return spec.model_copy(update={"arch": arch, "notes": (*spec.notes, *notes)})


def _compute(setup: LlmSetup) -> Dtype:
    return setup.precision


#: Trainers whose regime runs the forward under ``torch.autocast`` (the HF Trainer and those built on it:
#: ``Trainer.compute_loss`` under ``accelerator.autocast()`` when bf16/fp16 is set); the others already run
#: the model in its own dtype, so ``--no-autocast`` changes nothing there.
AUTOCAST_TRAINERS = ("hf", "axolotl", "llamafactory", "unsloth")
SRC_NO_AUTOCAST = (
    "no torch.autocast (setup autocast=false: a plain loop, or HF Trainer with bf16=fp16=False on a 16-bit "
    "model): every op runs in its inputs' dtype; torch 2.13 optim/adam.py _init_group states "
    "zeros_like(param) (AdamW subclasses Adam); peft 0.21.2 tuners/lora/layer.py Linear.forward "
    "_cast_input_dtype(x, lora_A.weight.dtype) per wrapped module; bitsandbytes nn/modules.py @005a63c2 "
    "Linear4bit.forward returns matmul_4bit(...).to(inp_dtype)"
)


def regime_for(setup: LlmSetup) -> Regime:
    """The trainer's regime, run without autocast when the setup says so (`without_autocast`), with the
    AdamW step the setup names (`with_optimizer_impl`)."""
    base = _trainer_regime(setup)
    if setup.autocast is False and base.autocast:
        base = without_autocast(base)
    from fitcheck.engine.prefix import with_prefix_dtype

    return with_prefix_dtype(with_optimizer_impl(base, setup.optimizer_impl), setup)


def without_autocast(base: Regime) -> Regime:
    """The regime with the forward outside ``torch.autocast``: weights, grads and optimizer states keep
    their dtypes (AdamW's states follow the param), but activations are now in the weights' dtype, and
    fp32 adapters (peft) get fp32 copies of their inputs. Only the flag, the words and the source change
    here (the name stays: it names the trainer); the activation rules read ``autocast``
    (engine/activations.py ``context``)."""
    return base.model_copy(
        update={
            "description": re.sub(r"autocast (bf16|fp16)", "no autocast", base.description),
            "autocast": False,
            "source": base.source + "; " + SRC_NO_AUTOCAST,
        }
    )


#: Trainers whose AdamW is ``torch.optim.AdamW`` (or the HF Trainer's ``adamw_torch`` /
#: ``adamw_torch_fused``), so ``--optimizer-impl`` picks its step; litgpt's QLoRA runs bitsandbytes'
#: PagedAdamW instead.
TORCH_ADAMW_TRAINERS = ("hf", "axolotl", "llamafactory", "unsloth", "torchtune", "litgpt")
SRC_OPTIMIZER_IMPL = (
    "torch optim/adamw.py: torch.optim.AdamW() picks foreach on CUDA tensors (_default_to_fused_or_foreach), "
    "whose _multi_tensor_adamw holds torch._foreach_sqrt(exp_avg_sq) for every tensor at once; fused=True "
    "(HF optim adamw_torch_fused) updates in place; HF optim adamw_torch is foreach"
)


SRC_FOREACH_20 = (
    "torch 2.0.x optim/adamw.py _multi_tensor_adamw, per (device, dtype) group: exp_avg_sq_sqrt = "
    "torch._foreach_sqrt(device_exp_avg_sqs), then denom = torch._foreach_add(exp_avg_sq_sqrt, eps), two "
    "lists alive at the addcdiv_ and both still bound while the next group's are made (read in the torch 2.0 "
    "copy github.com/S-Lab-System-Group/Hydro hydro/optim/adamw.py @7a6a2f3b, 'Pytorch 2.0'); "
    "pytorch/pytorch#104898 ('[foreach][AdamW] Minimize intermediates to save peak memory', merged "
    "2023-07-10, first in torch 2.1; issue #97712) made the eps add in place"
)


def with_optimizer_impl(base: Regime, impl: str | None) -> Regime:
    """The regime with the AdamW step the setup names (``--optimizer-impl``); None keeps the trainer's own.
    Only ``fused_optimizer`` and ``foreach_denom`` (what `engine.states.adam_impl` reads), the words and
    the source change."""
    fused, denom = impl == "fused", impl == "foreach-2.0"
    if impl is None or (fused, denom) == (base.fused_optimizer, base.foreach_denom):
        return base
    words = base.description.replace("fused AdamW", "AdamW") if not fused else base.description
    return base.model_copy(
        update={
            "description": f"{words}; {impl} AdamW step",
            "fused_optimizer": fused,
            "foreach_denom": denom,
            "source": base.source + "; " + (SRC_FOREACH_20 if denom else SRC_OPTIMIZER_IMPL),
        }
    )


def _trainer_regime(setup: LlmSetup) -> Regime:
    """The regime for the setup's trainer, method and precision.

    axolotl and LLaMA-Factory train through the HF Trainer, so their regimes start from ``hf`` and
    change what their own model loading changes (the names keep the ``(hf)`` suffix). kohya is for
    diffusion models and maps to ``generic`` until its own issue models it.
    """
    trainer = setup.trainer
    if trainer == "axolotl":
        return _axolotl(setup)
    if trainer == "llamafactory":
        return _llamafactory(setup)
    if trainer == "mlx":
        return _mlx(setup)
    if trainer == "kohya":
        base = _trainer_regime(setup.model_copy(update={"trainer": "generic"}))
        return base.model_copy(update={"name": f"{trainer} (generic)"})
    if trainer == "hf":
        return _hf(setup)
    if trainer == "litgpt":
        return _litgpt(setup)
    if trainer == "unsloth":
        return _unsloth(setup)
    if trainer == "torchtune":
        return _torchtune(setup)
    return _generic(setup)


def _generic(setup: LlmSetup) -> Regime:
    c = _compute(setup)
    return Regime(
        name="generic",
        description="weights and grads in the compute dtype, fp32 optimizer moments"
        + (", fp32 master copy" if setup.master_weights else "")
        + "; LoRA adapters in the compute dtype (textbook, no framework quirks)",
        weight_dtype=c,
        trainable_dtype=c,
        adapter_dtype=c,
        grad_dtype=c,
        optimizer_state_dtype="fp32",
        master_weights=setup.master_weights and c != "fp32",
        autocast=False,
        logits_fp32=True,
        kbit_upcast=False,
        fused_optimizer=False,
        source=SRC_SEEDS,
    )


#: Whether each trainer's current release runs peft's ``prepare_model_for_kbit_training`` on a bitsandbytes
#: 4-bit/8-bit base when the setup does not say (``kbit_prep: None``). hf: TRL 1.16.0's SFTTrainer
#: (trainer/sft_trainer.py) never calls it (trl 2af35fb0 / v0.26 removed the call) and casts the trainable
#: parameters of a model ``is_loaded_in_4bit`` / ``is_loaded_in_8bit`` to ``torch.bfloat16`` (the DoRA
#: magnitude excepted); with gradient checkpointing it calls ``model.enable_input_require_grads()`` only.
#: axolotl calls it, then casts norms and embeddings back (`SRC_AXO`); LLaMA-Factory never calls it
#: (`SRC_LMF`); Unsloth runs its own preparation, which keeps the load dtype (`SRC_UNSLOTH`); the other
#: trainers have no bitsandbytes path or quantize another way (torchao, litgpt, MLX).
KBIT_PREP_DEFAULT: dict[str, bool] = {"hf": False, "axolotl": True}
SRC_TRL_KBIT = (
    "TRL 1.16.0 trainer/sft_trainer.py SFTTrainer.__init__: no prepare_model_for_kbit_training (removed in "
    "trl 2af35fb0 / v0.26); a model is_loaded_in_4bit or is_loaded_in_8bit has every trainable param except "
    "lora_magnitude_vector cast to torch.bfloat16 after get_peft_model; gradient checkpointing only adds "
    "enable_input_require_grads"
)


def kbit_base(setup: LlmSetup) -> bool:
    """A base that transformers loads "in k-bit" through bitsandbytes (``is_loaded_in_4bit`` /
    ``is_loaded_in_8bit``): QLoRA or LoRA on an int8 base. GPTQ and AWQ bases are not, and skip both
    peft's preparation and TRL's bf16 cast."""
    return setup.method == "qlora" or (setup.method == "lora" and setup.base_quant == "int8")


#: Whether each ``kbit_path`` runs a k-bit preparation (peft's, or TRL 0.25's own norm-only one).
KBIT_PATH_PREPARES: dict[KbitPath, bool] = {"peft": True, "trl-legacy": True, "none": False, "trl": False}
SRC_TRL_LEGACY = (
    "TRL 0.9-0.25 SFTTrainer: prepare_model_for_kbit_training on a 4-bit model that is not sharded, "
    "get_peft_model (adapters fp32, peft autocast_adapter_dtype), then with args.bf16 "
    "peft_module_casting_to_bf16: modules named *norm* to fp32, lm_head / embed_tokens / wte / wpe whose "
    "weight is fp32 to bf16 (trl v0.13.0 4ea33ced trainer/sft_trainer.py:182-233, trainer/utils.py:872; "
    "v0.25.1 074d9113 models/utils.py prepare_peft_model, its own norm-only prepare_model_for_kbit_training "
    "from fda88c64); trl 99f2c94b (#1644, v0.9) stopped casting the LoRA layers to bf16"
)
SRC_PLAIN_KBIT = (
    "a plain HF Trainer script without prepare_model_for_kbit_training: get_peft_model builds fp32 adapters "
    "(peft tuners_utils autocast_adapter_dtype=True), the base keeps its load dtype"
)


def kbit_path(setup: LlmSetup) -> KbitPath | None:
    """The hf k-bit path of a k-bit base (None for any other base or trainer): the setup's ``kbit_path``,
    else its ``kbit_prep`` (True: peft's recipe, False: TRL >= 0.26), else TRL 1.16's SFTTrainer."""
    if setup.trainer != "hf" or not kbit_base(setup):
        return None
    if setup.kbit_path is not None:
        return setup.kbit_path
    return "peft" if setup.kbit_prep else "trl"


def kbit_prep(setup: LlmSetup) -> bool:
    """Whether a k-bit preparation runs: under hf its ``kbit_path`` (`KBIT_PATH_PREPARES`), else the setup's
    ``kbit_prep``, else the trainer's own (`KBIT_PREP_DEFAULT`); only a k-bit base is prepared."""
    path = kbit_path(setup)
    if path is not None:
        return KBIT_PATH_PREPARES[path]
    own = KBIT_PREP_DEFAULT.get(setup.trainer, False)
    return kbit_base(setup) and (own if setup.kbit_prep is None else setup.kbit_prep)


def _hf(setup: LlmSetup) -> Regime:
    """The HF Trainer on a k-bit base, by `kbit_path`: ``peft`` keeps `_hf_trainer`'s fp32 upcast, ``trl``
    and sharded QLoRA take `_no_kbit_prep`, ``trl-legacy`` `_trl_legacy`, ``none`` `_plain_kbit`."""
    base = _hf_trainer(setup)
    path = kbit_path(setup)
    if path is None or path == "peft":
        return base
    if path == "trl" or (path == "trl-legacy" and sharded_qlora(setup)):
        return _no_kbit_prep(setup, base)
    return _trl_legacy(setup, base) if path == "trl-legacy" else _plain_kbit(base)


def _plain_kbit(base: Regime) -> Regime:
    """A plain HF Trainer script that never prepares its k-bit base (`SRC_PLAIN_KBIT`): non-quantized params
    in the load dtype, fp32 adapters with fp32 gradients and AdamW states."""
    return base.model_copy(
        update={
            "description": base.description.replace(
                "; non-4-bit params upcast to fp32 by prepare_model_for_kbit_training",
                "; no k-bit preparation, non-4-bit params in the load dtype",
            ),
            "kbit_upcast": False,
            "source": SRC_HF + "; " + SRC_PLAIN_KBIT,
        }
    )


def _trl_legacy(setup: LlmSetup, base: Regime) -> Regime:
    """TRL 0.9-0.25's SFTTrainer (`SRC_TRL_LEGACY`): prepared, then, for a 4-bit model under ``bf16``, the
    norms kept fp32 and embed_tokens / lm_head cast back to bf16; adapters stay fp32. An 8-bit model or a run
    without bf16 keeps peft's full upcast (the cast-back is skipped)."""
    if setup.method != "qlora" or setup.autocast is False or _compute(setup) != "bf16":
        return base.model_copy(update={"source": base.source + "; " + SRC_TRL_LEGACY})
    return base.model_copy(
        update={
            "description": base.description.replace(
                "non-4-bit params upcast to fp32 by prepare_model_for_kbit_training",
                "TRL 0.9-0.25: prepare_model_for_kbit_training, then norms fp32 and embeddings / lm_head "
                "cast back to bf16",
            ),
            "kbit_upcast": False,
            "kbit_norms_fp32": True,
            "source": SRC_HF + "; " + SRC_TRL_LEGACY,
        }
    )


#: Strategies whose framework keeps the fp32 master copy itself, apart from the module the forward runs:
#: DeepSpeed ZeRO casts the module to the 16-bit dtype (engine.py ``_configure_distributed_model``:
#: ``module.half()`` / ``module.bfloat16()``) and holds the fp32 master in its optimizer's flat partition
#: (counted by engine/distributed.py as ``fp32_master_partition``; accelerate turns its own autocast off
#: under DeepSpeed: accelerator.py @16cb6eb8 ``native_amp`` is set only when ``distributed_type`` is not
#: DEEPSPEED); FSDP under accelerate's mixed precision gathers each unit in ``param_dtype`` (its
#: ``MixedPrecision`` policy) from fp32 shards (``shard_bytes``), so autocast finds 16-bit weights and
#: casts none. Under these an HF run with ``--master-weights`` is not an fp32 model under AMP.
FRAMEWORK_MASTER_STRATEGIES: tuple[Strategy, ...] = (
    "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "fsdp-hybrid", "fsdp-no-shard"
)  # fmt: skip


def fp32_module_under_autocast(setup: LlmSetup) -> bool:
    """``--master-weights`` as the module holds it: an fp32 model under autocast in the compute dtype (the
    HF Trainer's AMP, litgpt's ``-mixed`` precisions), unless the strategy's framework keeps the fp32
    master apart from the module it runs (`FRAMEWORK_MASTER_STRATEGIES`)."""
    return (
        setup.master_weights
        and setup.precision != "fp32"
        and setup.strategy not in FRAMEWORK_MASTER_STRATEGIES
    )


def _hf_trainer(setup: LlmSetup) -> Regime:
    c = _compute(setup)
    amp = c == "fp32" or fp32_module_under_autocast(setup)
    weights: Dtype = "fp32" if amp else c
    # peft's prepare_model_for_kbit_training on a k-bit base (is_loaded_in_4bit / is_loaded_in_8bit)
    kbit = kbit_base(setup)
    return Regime(
        name="hf",
        description=(
            "HF Trainer: "
            + ("fp32 model with autocast (AMP)" if amp and c != "fp32" else f"{weights} model, autocast {c}")
            + ", fused AdamW with states in the param dtype; peft adapters fp32"
            + ("; non-4-bit params upcast to fp32 by prepare_model_for_kbit_training" if kbit else "")
        ),
        weight_dtype=weights,
        trainable_dtype=weights,
        adapter_dtype="fp32",
        grad_dtype=weights if setup.method == "full" else "fp32",
        optimizer_state_dtype="param",
        master_weights=False,
        autocast=c != "fp32",
        logits_fp32=True,
        kbit_upcast=kbit,
        fused_optimizer=True,
        source=SRC_HF + ("; " + SRC_KBIT if kbit else ""),
    )


#: Strategies under which transformers leaves a bitsandbytes 4-bit model's ``Params4bit`` on the CPU (or the
#: meta device) after loading: FSDP with ``cpu_ram_efficient_loading`` (what fitcheck emits) and ZeRO-3.
SHARDED_LOAD_STRATEGIES = ("fsdp", "fsdp-grad-op", "fsdp-hybrid", "zero3")
SRC_SHARDED_QLORA = (
    "sharded QLoRA: transformers modeling_utils _load_state_dict_into_meta_model (4.39 and later) quantizes "
    "each weight on the GPU and moves the Params4bit to the CPU (meta on other ranks) when is_fsdp_enabled() "
    "or is_deepspeed_zero3_enabled(); TRL SFTTrainer then skips prepare_model_for_kbit_training and "
    "peft_module_casting_to_bf16 (is_sharded_qlora, trl 58c0888 / v0.8.0 to v0.25) or never calls them "
    "(trl 2af35fb0 / v0.26 and later, which casts QLoRA adapters to bf16); peft < 0.12 built adapters in "
    "the base weight's dtype (the bf16 quant storage); transformers distributed/fsdp.py "
    "update_fsdp_plugin_peft (5.24.0) sets the FSDP mixed precision to the quant storage dtype"
)


def sharded_qlora(setup: LlmSetup) -> bool:
    """QLoRA under TRL's SFTTrainer with FSDP or ZeRO-3: the non-quantized parameters stay in the load
    dtype (no k-bit preparation, in every TRL release since 0.8) and the adapters compute in bf16
    (`SRC_SHARDED_QLORA`). ``kbit_prep`` resolves to False here unless the setup says True."""
    return (
        setup.trainer == "hf"
        and setup.method == "qlora"
        and setup.distributed
        and setup.effective_strategy in SHARDED_LOAD_STRATEGIES
    )


def _no_kbit_prep(setup: LlmSetup, base: Regime) -> Regime:
    """The hf regime of a k-bit base that peft's preparation never touched (TRL's SFTTrainer, `SRC_TRL_KBIT`;
    sharded QLoRA, `SRC_SHARDED_QLORA`): no fp32 upcast of embeddings, norms and lm_head; adapters, their
    gradients and AdamW states in bf16 (FSDP/DeepSpeed re-deal the stored shards: engine/distributed.py)."""
    sharded = sharded_qlora(setup)
    words = "sharded QLoRA: no k-bit preparation" if sharded else "TRL SFTTrainer: no k-bit preparation"
    return base.model_copy(
        update={
            "description": base.description.replace(
                "peft adapters fp32; non-4-bit params upcast to fp32 by prepare_model_for_kbit_training",
                f"{words}, non-4-bit params in the load dtype, adapters cast to bf16",
            ),
            "adapter_dtype": "bf16",
            "grad_dtype": "bf16",
            "kbit_upcast": False,
            "source": SRC_HF + "; " + (SRC_SHARDED_QLORA if sharded else SRC_TRL_KBIT),
        }
    )


def _torchtune(setup: LlmSetup) -> Regime:
    c = _compute(setup)
    return Regime(
        name="torchtune",
        description=f"torchtune: everything in {c} (adapters too), fused AdamW, chunked cross-entropy"
        + ("; torchao NF4 base" if setup.method == "qlora" else ""),
        weight_dtype=c,
        trainable_dtype=c,
        adapter_dtype=c,
        grad_dtype=c,
        optimizer_state_dtype="param",
        master_weights=False,
        autocast=False,
        logits_fp32=True,
        kbit_upcast=False,
        fused_optimizer=True,
        loss_chunks=8,
        loss_kernel="chunked",
        nf4_format="torchao",
        source=SRC_TT,
    )


def _axolotl(setup: LlmSetup) -> Regime:
    """axolotl: the HF Trainer regime, except that QLoRA keeps norms and embeddings in the load dtype."""
    base = _hf_trainer(setup)
    if setup.method != "qlora":
        return base.model_copy(update={"name": "axolotl (hf)", "source": SRC_HF + "; " + SRC_AXO})
    return base.model_copy(
        update={
            "name": "axolotl (hf)",
            "description": base.description.replace(
                "non-4-bit params upcast to fp32 by prepare_model_for_kbit_training",
                "norms and embeddings cast back to the load dtype after prepare_model_for_kbit_training",
            ),
            "kbit_upcast": False,
            "source": SRC_HF + "; " + SRC_AXO,
        }
    )


def _llamafactory(setup: LlmSetup) -> Regime:
    """LLaMA-Factory: trainable params upcast to fp32 (full fine-tuning becomes AMP), no kbit upcast."""
    full = setup.method == "full"
    base = _hf_trainer(setup.model_copy(update={"master_weights": True}) if full else setup)
    c = _compute(setup)
    if full:
        what = f"trainable params cast to fp32, autocast {c}, fp32 grads and AdamW states"
    else:
        what = f"{c} base, adapters fp32 (cast_trainable_params_to_fp32), autocast {c}"
    return base.model_copy(
        update={
            "name": "llamafactory (hf)",
            "description": "LLaMA-Factory on HF Trainer: " + what,
            "kbit_upcast": False,
            "source": SRC_HF + "; " + SRC_LMF,
        }
    )


def _mlx(setup: LlmSetup) -> Regime:
    """mlx-lm: no autocast, the model dtype everywhere, fp32 adapters; the optimizer update is functional."""
    c = _compute(setup)
    full = setup.method == "full"
    return Regime(
        name="mlx",
        description=f"mlx-lm: {c} model (no autocast), "
        + ("states in the param dtype" if full else "LoRA adapters, their grads and states fp32")
        + "; the optimizer builds new state arrays before the old ones are freed",
        weight_dtype=c,
        trainable_dtype=c,
        adapter_dtype="fp32",
        grad_dtype=c if full else "fp32",
        optimizer_state_dtype="param",
        master_weights=False,
        autocast=False,
        logits_fp32=False,
        kbit_upcast=False,
        fused_optimizer=False,
        # mlx_lm.convert quantizes every module with to_quantized whose input width the group divides:
        # each Linear, lm_head and the embedding (mlx-lm utils.py quantize_model @v0.31.3)
        quantized_lm_head=setup.method == "qlora",
        quantized_embedding=setup.method == "qlora",
        nf4_format="mlx" if setup.method == "qlora" else "bitsandbytes",
        # nn.losses.cross_entropy on the logits as they come (engine/loss.py `_mlx`)
        loss_kernel="mlx",
        evaluation="mlx",
        source=SRC_MLX + "; MLX's evaluation: " + mlx.SOURCE,
    )


def _litgpt(setup: LlmSetup) -> Regime:
    """litgpt: bf16-true (no autocast, everything in the compute dtype), Fabric's fp32 logits, chunked
    head (adapter scripts) and loss; QLoRA quantizes every Linear including lm_head and trains with
    bitsandbytes' 32-bit PagedAdamW. ``--master-weights`` is litgpt's ``bf16-mixed`` / ``16-mixed``
    (`SRC_LITGPT_MIXED`): an fp32 model under autocast on one device or DDP (`fp32_module_under_autocast`);
    under FSDP the shards are fp32 and each unit is gathered in the compute dtype (Fabric
    ``FSDPPrecision``'s ``param_dtype``), so the model the forward runs is 16-bit."""
    c = _compute(setup)
    qlora = setup.method == "qlora"
    full = setup.method == "full"
    autocast = setup.master_weights and c != "fp32"
    mixed = fp32_module_under_autocast(setup)
    w: Dtype = "fp32" if mixed else c
    head = ("; cross-entropy in 128-row chunks" if full else "; lm_head and loss in 128-position chunks") + (
        "; every Linear (lm_head too) 4-bit, PagedAdamW with fp32 states" if qlora else "; AdamW (foreach)"
    )
    if mixed:
        words = (
            f"litgpt {c}-mixed: fp32 weights, adapters, grads and AdamW states, forward under autocast {c}"
        )
    elif autocast:
        words = f"litgpt {c}-mixed under FSDP: fp32 shards, units gathered in {c}, autocast {c}"
    else:
        words = f"litgpt {c}-true: weights, adapters, grads in {c}, no autocast"
    return Regime(
        name="litgpt",
        description=words + "; logits cast to fp32 by Fabric" + head,
        weight_dtype=w,
        trainable_dtype=w,
        adapter_dtype=w,
        grad_dtype=w,
        optimizer_state_dtype="fp32" if qlora else "param",
        master_weights=False,
        autocast=autocast,
        logits_fp32=True,
        kbit_upcast=False,
        fused_optimizer=qlora,
        loss_kernel="litgpt_full" if full else "litgpt",
        quantized_lm_head=qlora,
        source=SRC_LITGPT + ("; " + SRC_LITGPT_MIXED if setup.master_weights else ""),
    )


def _unsloth(setup: LlmSetup) -> Regime:
    """Unsloth: the HF Trainer regime with its own loss kernel, offloaded checkpoints and no fp32 upcast of
    the unquantized layers."""
    base = _hf_trainer(setup)
    return base.model_copy(
        update={
            "name": "unsloth (hf)",
            "description": base.description.replace(
                "; non-4-bit params upcast to fp32 by prepare_model_for_kbit_training", ""
            )
            + "; checkpoints offloaded to the CPU, fused cross-entropy",
            "kbit_upcast": False,
            "loss_kernel": "unsloth",
            "offload_checkpoints": True,
            "source": SRC_HF + "; " + SRC_UNSLOTH,
        }
    )
