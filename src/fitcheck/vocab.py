"""The option vocabulary as plain ``Literal`` types (no pydantic): the models, the API and the CLI
share these names, and `fitcheck.api` can name them without importing pydantic at start-up."""

from __future__ import annotations

from typing import Literal

#: ``prefix-tuning``: peft's PREFIX_TUNING (P-Tuning v2): trained key/value prefixes in every layer on a
#: frozen base (docs/methodology.md, "Prefix tuning").
Method = Literal["full", "lora", "qlora", "prefix-tuning"]
MethodChoice = Literal["auto", "full", "lora", "qlora", "prefix-tuning"]
#: The method word for prefix tuning (P-Tuning v2).
PREFIX = "prefix-tuning"
Precision = Literal["bf16", "fp16", "fp32"]
Optimizer = Literal[
    "adamw", "paged-adamw", "adamw8bit", "paged-adamw8bit", "adafactor", "lion", "lion8bit", "prodigy", "sgd"
]
#: AdamW's step (docs/methodology.md, "Optimizer step"): one fused kernel, or torch's foreach path, which
#: holds a copy of every second moment (``torch._foreach_sqrt(exp_avg_sq)``) inside ``optimizer.step()``;
#: ``foreach-2.0`` is that path as torch 2.0.x ran it, which also held ``denom`` (a second copy) until
#: pytorch/pytorch#104898 (torch 2.1) made the step in place.
OptimizerImpl = Literal["fused", "foreach", "foreach-2.0"]
Attention = Literal["eager", "sdpa", "flash", "xformers"]
LlmTrainer = Literal["generic", "hf", "torchtune", "axolotl", "llamafactory", "mlx", "litgpt", "unsloth"]
DiffusionTrainer = Literal["kohya"]
Trainer = Literal[
    "generic", "hf", "torchtune", "axolotl", "llamafactory", "mlx", "kohya", "litgpt", "unsloth"
]
#: ``--lora-targets`` words beside module names: ``attn``, peft's ``all-linear``, and ``linear-modules``,
#: the leaf names of every ``nn.Linear`` fixed before peft sees them (axolotl's ``lora_target_linear``;
#: docs/methodology.md, "LoRA targets").
LINEAR_MODULES = "linear-modules"
#: ``llamafactory-all``: LLaMA-Factory's ``lora_target: all`` (its default), ``find_all_linear_modules``:
#: leaf names of the modules whose class name holds ``Linear``, the vision tower and projector left out
#: (docs/methodology.md, "LoRA targets").
LMF_ALL = "llamafactory-all"
Backend = Literal["cuda", "rocm", "mps", "cpu"]
Kind = Literal["llm", "diffusion"]
PhaseName = Literal["load", "forward", "backward", "optimizer_step"]
#: Cross-entropy kernels (docs/methodology.md, "Logits and loss"): the trainer's own when not given.
Loss = Literal["standard", "hf-legacy", "hf-4.46", "chunked", "liger", "trl", "cce", "plain"]
#: A quantized base under LoRA other than QLoRA's NF4 (docs/methodology.md, "Quantized bases").
BaseQuant = Literal["none", "int8", "gptq", "gptq-int8", "awq"]
#: Which k-bit path a bitsandbytes 4-/8-bit base took under ``--trainer hf`` (docs/methodology.md, "k-bit
#: preparation"): ``peft`` (prepare_model_for_kbit_training, everything non-quantized fp32), ``trl-legacy``
#: (TRL 0.9-0.25 SFTTrainer: prepared, then norms fp32 and embeddings / lm_head back to bf16), ``none`` (a
#: plain HF Trainer script: load dtype, fp32 adapters), ``trl`` (TRL >= 0.26: load dtype, bf16 adapters).
KbitPath = Literal["peft", "trl-legacy", "none", "trl"]
VerdictName = Literal["fits", "tight", "does_not_fit"]
#: How a run's sequence lengths go (docs/methodology.md, "Allocator history over varying lengths"):
#: ``fixed``, every step at seq_len (packed, or padded to max_length); ``varying``, unpacked data padded to
#: the longest of each batch: steps at many lengths up to seq_len, and the caching allocator keeps what
#: the shorter ones cut; ``longest-first``, padded the same way but the longest batch runs first (HF
#: Trainer's ``group_by_length``): every later step is shorter, so no step cuts segments for a new maximum.
Lengths = Literal["fixed", "varying", "longest-first"]
Dtype = Literal["fp32", "bf16", "fp16", "fp8", "int8", "nf4", "fp4"]
Task = Literal["causal-lm", "classification", "seq2seq"]
#: ``device-map``: one process, the model's layers split in order over the GPUs by accelerate's
#: ``device_map="auto"`` placement (naive model parallelism; docs/distributed.md, "device-map").
#: ``fsdp-no-shard``: FSDP1's ``ShardingStrategy.NO_SHARD`` (a whole replica per GPU under FSDP's flat
#: parameters; docs/distributed.md#fsdp-no-shard).
Strategy = Literal[
    "ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-grad-op", "fsdp-hybrid", "fsdp-no-shard", "device-map"
]
Offload = Literal["none", "optimizer", "all"]
QuantStorage = Literal["uint8", "bf16", "fp16", "fp32"]
#: How a transformers MoE model holds its routed experts (docs/methodology.md, "MoE experts: layout"):
#: ``fused``: transformers 5's 3-D ``gate_up_proj`` / ``down_proj`` parameters (current releases);
#: ``per-expert``: transformers 4.x's one ``nn.Linear`` per expert and projection.
MoeLayout = Literal["fused", "per-expert"]
