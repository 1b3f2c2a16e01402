"""Pydantic models: the data contracts between sources, engine, hardware, planner and renderers.

All models are frozen and forbid unknown fields, so a typo in a preset or a JSON document is an
error rather than a silently ignored key. Byte counts are integers and their names end in
``_bytes`` (style.md rule 5).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from fitcheck.vocab import (
    PREFIX,
    Attention,
    Backend,
    BaseQuant,
    DiffusionTrainer,
    Dtype,
    KbitPath,
    Kind,
    Lengths,
    LlmTrainer,
    Loss,
    Method,
    MoeLayout,
    Offload,
    Optimizer,
    OptimizerImpl,
    PhaseName,
    Precision,
    QuantStorage,
    Strategy,
    Task,
    Trainer,
    VerdictName,
)

SCHEMA_VERSION = 2

OPTIMIZERS: tuple[str, ...] = Optimizer.__args__  # type: ignore[attr-defined]
ATTENTIONS: tuple[str, ...] = Attention.__args__  # type: ignore[attr-defined]
TRAINERS: tuple[str, ...] = Trainer.__args__  # type: ignore[attr-defined]
METHODS: tuple[str, ...] = Method.__args__  # type: ignore[attr-defined]
PRECISIONS: tuple[str, ...] = Precision.__args__  # type: ignore[attr-defined]
BACKENDS: tuple[str, ...] = Backend.__args__  # type: ignore[attr-defined]
TASKS: tuple[str, ...] = Task.__args__  # type: ignore[attr-defined]
STRATEGIES: tuple[str, ...] = Strategy.__args__  # type: ignore[attr-defined]
OFFLOADS: tuple[str, ...] = Offload.__args__  # type: ignore[attr-defined]


class Frozen(BaseModel):
    """Base: immutable, strict about unknown keys."""

    model_config = ConfigDict(frozen=True, extra="forbid")


class DecoderArch(Frozen):
    """A decoder-only transformer, in the terms that decide its memory.

    Field names follow the Hugging Face ``config.json`` vocabulary where one exists; derived values
    (head_dim, kv heads) are resolved when the architecture is built from a config
    (``fitcheck.sources.hf_config``), so every field here is explicit.
    """

    model_type: str = Field(description="Hugging Face model_type: llama, qwen2, gemma2, mixtral, gpt2, ...")
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    num_kv_heads: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    intermediate_size: int = Field(gt=0, description="dense MLP width (0-expert models) or dense-layer width")
    vocab_size: int = Field(gt=0)
    tie_embeddings: bool = False
    mlp: Literal["gated", "plain"] = "gated"
    activation: str = "silu"
    norm: Literal["rms", "layer"] = "rms"
    norms_per_layer: int = Field(default=2, ge=1, description="2 (pre-attn, pre-MLP); 4 for Gemma 2/3")
    qk_norm: bool = Field(default=False, description="per-head RMSNorm on q and k (Qwen3, Gemma 3)")
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    fused_qkv: bool = Field(default=False, description="one qkv projection (Phi-3 qkv_proj, GPT-2 c_attn)")
    fused_gate_up: bool = Field(default=False, description="one gate+up projection (Phi-3 gate_up_proj)")
    learned_positions: int = Field(default=0, ge=0, description="rows of a learned position table (GPT-2)")
    num_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    moe_intermediate_size: int = Field(default=0, ge=0)
    shared_expert_intermediate_size: int = Field(default=0, ge=0)
    moe_layers: int = Field(default=0, ge=0, description="how many layers are MoE (the rest are dense)")
    final_logit_softcapping: float | None = None
    attn_logit_softcapping: float | None = None
    sliding_window: int | None = None
    sliding_layers: int = Field(
        default=0, ge=0, description="layers attending only to the last sliding_window keys (the rest: all)"
    )
    attn_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="dropout on attention probabilities")
    resid_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="dropout on residual branches")
    mlp_dropout: float = Field(
        default=0.0, ge=0.0, lt=1.0, description="dropout between the MLP activation and its down projection"
    )
    embd_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="dropout on the embeddings")
    extra_params: int = Field(
        default=0, ge=0, description="frozen parameters outside the decoder (a vision tower), kept in memory"
    )
    tower_linears: tuple[tuple[int, int, int], ...] = Field(
        default=(),
        description="the nn.Linear layers among extra_params as (d_in, d_out, how many): what peft's "
        "all-linear also wraps in a vision tower and projector",
    )
    tower_convs: tuple[tuple[int, int, int], ...] = Field(
        default=(),
        description="tower convolutions peft wraps when a linear's leaf name also names them "
        "(linear-modules), as (in x kernel volume, out, how many)",
    )
    # Families beyond the Llama shape (docs/methodology.md, "Architectures"); defaults keep Llama's.
    structure: Literal["decoder", "encoder", "encoder_decoder"] = "decoder"
    encoder_layers: int = Field(default=0, ge=0, description="encoder-decoder: layers of the encoder stack")
    parallel_block: bool = Field(default=False, description="attention and MLP read one input (GPT-J)")
    norm_bias: bool | None = Field(default=None, description="norms carry a bias; None: LayerNorm yes")
    norm_weight: bool = Field(default=True, description="False: OLMo's non-parametric LayerNorm")
    qk_norm_full: bool = Field(default=False, description="q/k norms span all heads, not one head_dim")
    final_norm: bool = True
    embed_norm: bool = Field(default=False, description="a norm right after the embedding (BLOOM, BERT)")
    lm_head_bias: bool = False
    router_bias: bool = False
    expert_bias: bool = Field(default=False, description="routed experts carry biases (gpt-oss)")
    attn_sinks: bool = Field(default=False, description="one learned attention-sink logit per head (gpt-oss)")
    rel_terms: int = Field(
        default=0, ge=0, le=2, description="DeBERTa's disentangled terms (c2p, p2c) each layer computes"
    )
    rel_span: int = Field(default=0, ge=0, description="DeBERTa's relative span: att_span (position_buckets)")
    conv_kernel: int = Field(default=0, ge=0, description="DeBERTa-v2's ConvLayer (first layer): kernel")
    shared_expert_gate: bool = Field(default=False, description="a sigmoid gate on the shared expert")
    # Multi-head latent attention (DeepSeek-V2/V3): low-rank q and a compressed kv.
    q_lora_rank: int = Field(default=0, ge=0)
    kv_lora_rank: int = Field(default=0, ge=0, description="> 0: multi-head latent attention")
    qk_rope_head_dim: int = Field(default=0, ge=0)
    v_head_dim: int = Field(default=0, ge=0)
    misc_params: int = Field(
        default=0, ge=0, description="trainable tensors outside the layers (token types, relative bias)"
    )
    pooler: bool = Field(default=False, description="encoder classification: a dense h x h before the labels")
    num_labels: int = Field(default=0, ge=0, description="classification head width (encoders)")

    @model_validator(mode="after")
    def _check(self) -> DecoderArch:
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.num_experts and not (0 < self.experts_per_token <= self.num_experts):
            raise ValueError("num_experts_per_tok must be between 1 and num_experts")
        if self.moe_layers > self.num_layers:
            raise ValueError("more MoE layers than layers")
        return self

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def has_norm_bias(self) -> bool:
        return self.norm == "layer" if self.norm_bias is None else self.norm_bias


class TensorGroup(Frozen):
    """Parameters of one kind, with the dtype they are stored in on disk (from safetensors headers)."""

    name: str
    numel: int = Field(ge=0)
    dtype: str


class ModelSpec(Frozen):
    """A model as fitcheck knows it: where it came from, its architecture, exact counts when known."""

    id: str
    name: str
    source_kind: Literal["size", "preset", "hf_config", "safetensors"]
    hf_id: str | None = None
    source: str | None = Field(default=None, description="where the architecture figures come from")
    arch: DecoderArch
    declared_params: int | None = Field(default=None, description="published or header-exact count")
    file_groups: tuple[TensorGroup, ...] = Field(
        default=(), description="tensor groups read from safetensors headers (exact counts and dtypes)"
    )
    hf_config: dict[str, Any] | None = Field(
        default=None, description="the config.json mapping the architecture came from (for `measure`)"
    )
    notes: tuple[str, ...] = ()


class SetupBase(Frozen):
    """Options every workload takes. Defaults are documented in docs/cli.md."""

    kind: Kind
    method: Method = "lora"
    batch_size: int = Field(default=1, ge=1, le=65536)
    grad_accum: int = Field(default=1, ge=1, le=65536)
    keep_grads: bool = Field(
        default=False,
        description="gradients zeroed in place between steps (zero_grad(set_to_none=False), torch < 2.0's "
        "default): every gradient stays allocated beside the next step's activations",
    )
    precision: Precision = "bf16"
    optimizer: Optimizer = "adamw"
    grad_ckpt: bool = False
    attn: Attention = "sdpa"
    lora_rank: int = Field(default=16, ge=1, le=65536)
    lora_alpha: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="defaults to 2 x rank"
    )
    lora_targets: str = Field(
        default="all-linear",
        description="attn, all-linear, linear-modules, llamafactory-all, or comma-separated names",
    )
    lora_dropout: float = Field(default=0.0, ge=0.0, lt=1.0, allow_inf_nan=False)
    backend: Backend = "cuda"
    gpus: int = Field(default=1, ge=1, le=4096, description="GPUs per node")
    # Several GPUs (docs/distributed.md): world size = gpus x nodes.
    strategy: Strategy | None = Field(default=None, description="None: ddp with several GPUs, else one GPU")
    offload: Offload = "none"
    nodes: int = Field(default=1, ge=1, le=4096)
    fsdp_version: Literal[1, 2] = 2

    @property
    def alpha(self) -> float:
        return self.lora_alpha if self.lora_alpha is not None else 2.0 * self.lora_rank

    @property
    def world_size(self) -> int:
        return self.gpus * self.nodes

    @property
    def data_ranks(self) -> int:
        """Processes that each train on their own micro-batch: one under ``device-map``, where a single
        process drives every GPU in turn (docs/distributed.md#device-map); else every rank."""
        return 1 if self.strategy == "device-map" else self.world_size

    @property
    def distributed(self) -> bool:
        """Several ranks, or a sharding/offload engine asked for on one GPU."""
        return self.world_size > 1 or self.strategy is not None or self.offload != "none"

    @property
    def effective_strategy(self) -> Strategy:
        return self.strategy or "ddp"

    @property
    def grads_between_steps(self) -> bool:
        """Whether every gradient is allocated before the step's forward: accumulation (the earlier
        micro-batches' sums), or a loop that zeroes them in place (``keep_grads``: ``zero_grad`` with
        ``set_to_none=False``, torch < 2.0's default, pytorch#92731), so from the second step on they sit
        beside the activations."""
        return self.grad_accum > 1 or self.keep_grads


class LlmSetup(SetupBase):
    """A decoder (LLM) training run: the closed-form engine (`fitcheck.engine`)."""

    kind: Literal["llm"] = "llm"
    dora: bool = False
    lora_fa: bool = Field(
        default=False, description="LoRA-FA: lora_A frozen, only lora_B trains (peft create_lorafa_optimizer)"
    )
    seq_len: int = Field(default=2048, ge=1, le=10_000_000)
    master_weights: bool = False
    double_quant: bool = True
    base_quant: BaseQuant = Field(default="none", description="LoRA on an int8 / GPTQ / AWQ base")
    train_modules: str = Field(default="", description="modules trained in full (modules_to_save)")
    loss: Loss | None = Field(default=None, description="cross-entropy kernel; the trainer's own when unset")
    offload_activations: bool = Field(default=False, description="saved activations kept on the CPU")
    optimizer_in_bwd: bool = Field(
        default=False, description="each parameter's optimizer step runs in backward as its gradient is made"
    )
    keep_logits: bool = Field(
        default=False,
        description="the loop holds the model's output (logits) through backward and the optimizer step",
    )
    bnb_keeps_input: bool | None = Field(
        default=None,
        description="QLoRA: bitsandbytes < 0.43.2, whose MatMul4Bit keeps every 4-bit matmul's input "
        "(ctx.tensors) until backward; None: no (no trainer's current release pins one; litgpt pinned "
        "0.41-0.42 until 2024-12)",
    )
    ckpt_reentrant: bool | None = Field(
        default=None,
        description="gradient checkpointing with use_reentrant=True; None: the trainer's own. Changes an "
        "estimate with bnb_keeps_input, whose stacks (transformers 4.x, torch <= 2.3) ran reentrant by "
        "default (non-reentrant checkpointing cannot drop what MatMul4Bit keeps outside save_for_backward), "
        "and under FSDP1 with LoRA / QLoRA, where reentrant recomputes (true only; None: not, transformers "
        "5.x's default) leave FSDP's reshard-only hooks keeping each layer's input and gradient to the end "
        "of backward",
    )
    autocast: bool | None = Field(
        default=None,
        description="None: the trainer's own; False: no torch.autocast, the model runs in its load dtype",
    )
    compile: bool | None = Field(
        default=None,
        description="torch.compile on the model and loss (docs/methodology.md, 'torch.compile'); None: the "
        "trainer's own (off)",
    )
    kbit_prep: bool | None = Field(
        default=None,
        description="a 4-bit/8-bit bitsandbytes base: True, peft's prepare_model_for_kbit_training ran "
        "(non-quantized params fp32, fp32 adapters); False, none (TRL >= 0.26 SFTTrainer: load "
        "dtype, adapters cast to bf16); None: the trainer's own (docs/methodology.md, 'k-bit preparation')",
    )
    kbit_path: KbitPath | None = Field(
        default=None,
        description="hf, a 4-bit/8-bit bitsandbytes base: peft (prepare_model_for_kbit_training: "
        "non-quantized params and adapters fp32), trl-legacy (TRL 0.9-0.25 SFTTrainer: prepared, then with "
        "bf16 norms fp32 and embed_tokens / lm_head back to bf16, adapters fp32), none (plain HF Trainer "
        "script: load dtype, fp32 adapters), trl (TRL >= 0.26: load dtype, bf16 adapters); None: from "
        "kbit_prep (True peft, False trl), else the trainer's own (docs/methodology.md, 'k-bit preparation')",
    )
    optimizer_impl: OptimizerImpl | None = Field(
        default=None,
        description="AdamW's step: fused (no temporaries) or foreach (a copy of the second moments); "
        "foreach-2.0: torch 2.0.x's foreach step (the copy and denom); None: the trainer's own",
    )
    trainer: LlmTrainer = "generic"
    # What the model is trained for (docs/methodology.md, "Tasks"); None: the model's own
    # (causal-lm for decoders, classification for encoders, seq2seq for encoder-decoders).
    task: Task | None = None
    num_labels: int | None = Field(default=None, ge=1, le=1_000_000, description="classification labels")
    target_len: int | None = Field(default=None, ge=1, le=10_000_000, description="seq2seq target tokens")
    image_tokens: int = Field(default=0, ge=0, le=1_000_000, description="image tokens per example")
    quant_storage: QuantStorage | None = Field(
        default=None, description="bnb_4bit_quant_storage; None: the compute dtype when the strategy shards"
    )
    quant_skip: str = Field(
        default="",
        description="a pre-quantized checkpoint's llm_int8_skip_modules / modules_to_not_convert, "
        "comma-joined: the layer projections they name stay unquantized (docs/methodology.md, "
        "'Pre-quantized checkpoints')",
    )
    quant_group: int = Field(
        default=128,
        ge=-1,
        le=10**7,
        description="GPTQ / AWQ group_size of a --base-quant gptq/gptq-int8/awq base (-1: one group per "
        "column, per-channel); set from a pre-quantized checkpoint's quantization_config",
    )
    zero_bucket_size: int | None = Field(
        default=None,
        ge=1,
        le=10**12,
        description="DeepSpeed reduce_bucket_size (elements) as a config states it; None: the trainer's "
        "own (HF 'auto': hidden_size^2; DeepSpeed's default 5e8) (docs/distributed.md#buckets)",
    )
    zero_overlap_comm: bool | None = Field(
        default=None,
        description="DeepSpeed overlap_comm as a config states it (ZeRO-1/2: a second IPG buffer when on); "
        "None: the trainer's own (HF family: on, as fitcheck's emitted config; DeepSpeed: on at ZeRO-3 only)",
    )
    device_map_version: Literal[4, 5] = Field(
        default=5,
        description="--strategy device-map: the transformers major version whose placement rule applies",
    )
    moe_layout: MoeLayout = Field(
        default="fused",
        description="MoE models: how transformers holds the routed experts: fused (transformers 5's 3-D "
        "parameters; bitsandbytes leaves them in the compute dtype, LoRA adapts them through peft's "
        "ParamWrapper) or per-expert (transformers 4.x: one nn.Linear per expert, quantized and adapted "
        "module by module) (docs/methodology.md#moe-experts-layout)",
    )
    fsdp_embedding_units: bool = Field(
        default=False,
        description="FSDP2: the input embedding and the lm_head are their own fully_shard units (torchtune "
        "custom_sharded_layers ['tok_embeddings', 'output']), gathered only while they run, not kept by the "
        "root from forward to backward (docs/distributed.md#fsdp-embedding-units)",
    )

    prefix_tokens: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="--method prefix-tuning: virtual tokens per layer (peft num_virtual_tokens, ChatGLM "
        "pre_seq_len); required with that method",
    )
    prefix_projection: bool = Field(
        default=False,
        description="--method prefix-tuning: the prefix comes out of peft's two-layer MLP "
        "(prefix_projection)",
    )
    prefix_hidden: int | None = Field(
        default=None,
        ge=1,
        le=1_000_000,
        description="--prefix-projection's MLP width (peft encoder_hidden_size); None: the key/value width",
    )

    @field_validator("lora_targets")
    @classmethod
    def _one_of_each(cls, value: str) -> str:
        """Each target once, spaces around names dropped (peft matches each name once; ``attn,attn`` is
        ``attn``)."""
        if "," not in value:
            return value.strip()
        return ",".join(dict.fromkeys(t.strip() for t in value.split(",") if t.strip()))

    @model_validator(mode="before")
    @classmethod
    def _prefix_targets(cls, data: Any) -> Any:
        """Prefix tuning wraps no projection: its LoRA targets are empty (a named target is refused)."""
        if not isinstance(data, dict) or data.get("method") != PREFIX:
            return data
        targets = data.get("lora_targets", "")
        if targets not in ("", "all-linear"):
            raise ValueError("--lora-targets applies to LoRA, not --method prefix-tuning")
        return {**data, "lora_targets": ""}

    lengths: Lengths = Field(
        default="fixed",
        description="fixed: every step at seq_len; varying: unpacked data padded to the longest of each "
        "batch, steps at many lengths up to seq_len (docs/methodology.md, 'Allocator history over varying "
        "lengths'); longest-first: padded the same way, the longest batch first (HF Trainer's "
        "group_by_length), so no later step cuts segments for a new maximum",
    )

    padding_free: bool = Field(
        default=False,
        description="TRL's padding-free batches (padding_free, packing_strategy 'bfd'): the micro-batch's "
        "examples flattened into one row with position_ids restarting per example; under transformers' "
        "SDPA a block-diagonal mask over the whole row (docs/methodology.md, 'Padding-free batches')",
    )

    @property
    def masked_rows(self) -> bool:
        """Whether transformers hands SDPA an explicit mask for the batch's rows: padded examples
        (`padded_batches`) or a padding-free row of packed examples (``padding_free``)."""
        return self.padded_batches or self.padding_free

    @property
    def mask_keys(self) -> int:
        """Key positions of that mask per query: the sequence, or under ``padding_free`` the whole
        flattened row (``batch_size x seq_len``)."""
        return self.seq_len * (self.batch_size if self.padding_free else 1)

    @property
    def padded_batches(self) -> bool:
        """Whether a micro-batch holds several examples padded to its longest (``lengths`` not ``fixed``):
        the batch carries a padding mask (SDPA's per-layer mask copies, T5's per-batch position bias)."""
        return self.lengths != "fixed" and self.batch_size > 1

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The dump, ``lengths``, ``quant_skip``, ``quant_group`` and ``padding_free`` left out at their
        defaults so a setup's JSON without them is unchanged (additive fields, docs/json.md)."""
        data: dict[str, object] = handler(self)
        if self.lengths == "fixed":
            data.pop("lengths", None)
        if not self.quant_skip:
            data.pop("quant_skip", None)
        if self.quant_group == 128:
            data.pop("quant_group", None)
        if not self.padding_free:
            data.pop("padding_free", None)
        return data

    @property
    def tokens(self) -> int:
        return self.batch_size * self.seq_len


class DiffusionSetup(SetupBase):
    """A diffusion (UNet/DiT) run as kohya sd-scripts trains it (the simulator, `fitcheck.diffusion`)."""

    kind: Literal["diffusion"] = "diffusion"
    trainer: DiffusionTrainer = "kohya"
    resolution: int | None = Field(default=None, ge=64, le=8192, description="image side in pixels")
    cache_latents: bool = Field(default=False, description="VAE encodes once before training (VAE off)")
    cache_text_encoder_outputs: bool = Field(default=False, description="text encoders off the device")
    train_text_encoder: bool = Field(default=False, description="train the text encoder(s) too")
    fp8_base: bool = Field(default=False, description="frozen base weights stored in fp8 (e4m3)")
    full_bf16: bool = Field(default=False, description="trainable weights and grads in bf16 (kohya)")
    full_fp16: bool = Field(default=False, description="trainable weights and grads in fp16 (kohya)")


#: The setup of one run, by workload: JSON carries ``kind`` and only the fields that apply to it.
TrainingSetup = Annotated[LlmSetup | DiffusionSetup, Field(discriminator="kind")]
#: The same union for type hints (and for records written before ``kind`` existed: smart-mode union).
AnySetup = LlmSetup | DiffusionSetup
SetupKind = Kind


class ModelInfo(Frozen):
    """One model preset as ``fitcheck models`` lists it."""

    id: str
    name: str
    kind: Kind
    params: int
    model_type: str
    layers: int | None = None
    hidden: int | None = None
    vocab: int | None = None
    experts: int = 0
    hf_id: str | None = None


class Component(Frozen):
    """One named line of a phase: bytes alive at that phase's peak, the rule and its source."""

    name: str
    bytes: int = Field(ge=0)
    rule: str
    source: str


class Phase(Frozen):
    """What is alive at the peak of one phase of a training step; components sum to total_bytes."""

    name: PhaseName
    components: tuple[Component, ...]
    total_bytes: int = Field(ge=0)

    @model_validator(mode="after")
    def _sum(self) -> Phase:
        if sum(c.bytes for c in self.components) != self.total_bytes:
            raise ValueError(f"phase {self.name}: components do not sum to the total")
        return self


class ParamCounts(Frozen):
    """Parameter counts by role."""

    total: int
    trainable: int
    adapter: int
    frozen: int
    quantized: int = Field(description="base parameters stored in 4 bits (QLoRA)")
    embedding: int
    lm_head: int


class Regime(Frozen):
    """The dtypes a trainer really uses for each kind of tensor (engine/regimes.py)."""

    name: str
    description: str
    weight_dtype: Dtype
    trainable_dtype: Dtype
    adapter_dtype: Dtype
    grad_dtype: Dtype
    optimizer_state_dtype: Literal["fp32", "param"]
    master_weights: bool
    autocast: bool
    logits_fp32: bool
    kbit_upcast: bool = Field(description="QLoRA: non-quantized weights upcast to fp32")
    kbit_norms_fp32: bool = Field(
        default=False,
        description="QLoRA: only the norms (and biases) kept fp32 after k-bit preparation, embeddings and "
        "lm_head cast back to the load dtype (TRL 0.9-0.25 peft_module_casting_to_bf16)",
    )
    fused_optimizer: bool
    foreach_denom: bool = Field(
        default=False,
        description="AdamW foreach step as torch 2.0.x ran it: denom = _foreach_add(sqrt(v), eps) is a "
        "second list beside sqrt(v) (in place from torch 2.1, pytorch/pytorch#104898)",
    )
    loss_chunks: int = Field(default=1, ge=1, description="cross-entropy computed in this many chunks")
    loss_kernel: str = Field(default="standard", description="cross-entropy kernel (engine/loss.py KERNELS)")
    offload_checkpoints: bool = Field(default=False, description="checkpointed layer inputs kept on the CPU")
    quantized_lm_head: bool = Field(default=False, description="QLoRA quantizes the output layer too")
    quantized_embedding: bool = Field(default=False, description="QLoRA quantizes the input embedding too")
    nf4_format: Literal["bitsandbytes", "torchao", "mlx"] = Field(
        default="bitsandbytes",
        description="QLoRA's 4-bit base: bitsandbytes Params4bit, torchao NF4Tensor or MLX affine 4-bit",
    )
    evaluation: Literal["torch", "mlx"] = Field(
        default="torch",
        description="what evaluates the step: torch's autograd (one op after another), or MLX's lazy graph, "
        "whose own order holds more of a checkpointed backward at once (facts/mlx.py)",
    )
    source: str


class Thumb(Frozen):
    """The source documents' rule of thumb, beside the detailed figure."""

    bytes: int
    low_bytes: int
    high_bytes: int
    rule: str
    source: str


class BudgetLine(Frozen):
    """One step of the usable-memory arithmetic (total, minus context, minus other processes, ...)."""

    name: str
    bytes: int
    note: str = ""


class Target(Frozen):
    """The machine an estimate is judged against: a detected device, a catalog entry or a plain size."""

    id: str
    name: str
    backend: Backend
    gpus: int = 1
    memory_bytes: int = Field(gt=0, description="memory of one device (unified memory on a Mac)")
    usable_bytes: int = Field(gt=0, description="what a training process can get, before headroom")
    headroom_bytes: int = Field(ge=0)
    budget_lines: tuple[BudgetLine, ...] = ()
    context_bytes: int = Field(default=0, ge=0, description="CUDA context of this GPU generation")
    bf16: bool = True
    host_memory_bytes: int | None = Field(default=None, description="CPU RAM of one node, when known")
    detected: bool = False
    source: str = ""
    notes: tuple[str, ...] = ()

    @property
    def budget_bytes(self) -> int:
        return max(0, self.usable_bytes - self.headroom_bytes)


class Suggestion(Frozen):
    """A change that would make the run fit, with what it saves."""

    change: str
    flag: str
    saves_bytes: int
    device_bytes_after: int
    fits: bool
    changes: int = Field(default=1, description="how many single changes this suggestion combines")
    high_bytes_after: int | None = Field(
        default=None, description="the band's upper edge after the change (None: not re-estimated)"
    )
    verdict_after: VerdictName | None = Field(
        default=None, description="fits, tight or does_not_fit after the change, by the verdict's one rule"
    )


class Verdict(Frozen):
    """Whether the estimate fits the target's budget."""

    hardware: str
    backend: Backend
    budget_bytes: int
    usable_bytes: int
    device_bytes: int
    high_bytes: int = Field(description="the band's upper edge: fits only when it fits the budget")
    verdict: VerdictName
    headroom_bytes: int = Field(
        ge=0, description="the safety margin kept free (--headroom), as on the target"
    )
    spare_bytes: int = Field(
        description="budget_bytes - device_bytes + paged_host_bytes: left after the run (negative: short by)"
    )
    spare_pct: float = Field(description="100 x spare_bytes / usable_bytes, one decimal")
    detected: bool = Field(default=False, description="the target is this machine, as detected (--on auto)")
    budget_lines: tuple[BudgetLine, ...] = ()
    suggestions: tuple[Suggestion, ...] = ()
    notes: tuple[str, ...] = ()
    host_budget_bytes: int | None = Field(default=None, description="CPU RAM of one node, when known")
    host_verdict: Literal["fits", "does_not_fit"] | None = None
    paged_bytes: int = Field(
        default=0, ge=0, description="paged optimizer states counted in device_bytes (CUDA managed memory)"
    )
    paged_host_bytes: int = Field(
        default=0,
        ge=0,
        description="of paged_bytes, those over the budget: they page to the host (slower steps)",
    )


class HostPhase(Frozen):
    """Host (CPU) memory of one node in one phase: loading the model, or training with offload."""

    name: Literal["loading", "training"]
    components: tuple[Component, ...]
    total_bytes: int = Field(ge=0)

    @model_validator(mode="after")
    def _sum(self) -> HostPhase:
        if sum(c.bytes for c in self.components) != self.total_bytes:
            raise ValueError(f"host phase {self.name}: components do not sum to the total")
        return self


class GpuShare(Frozen):
    """One GPU of a ``device-map`` run (layers split over the GPUs): what accelerate placed on it and
    its own peak; the estimate's phases are those of the bottleneck GPU (docs/distributed.md#device-map)."""

    gpu: int = Field(ge=0, description="device index")
    modules: tuple[str, ...] = Field(
        description="the modules placed on it, in order (embed_tokens, layers 0-39, ...)"
    )
    layers: int = Field(ge=0, description="decoder layers placed on it")
    weights_bytes: int = Field(
        ge=0, description="its modules' bytes as accelerate sizes them for the placement"
    )
    peak_phase: PhaseName
    peak_allocated_bytes: int = Field(ge=0)
    peak_reserved_bytes: int = Field(ge=0)
    device_bytes: int = Field(ge=0)
    high_bytes: int = Field(ge=0, description="the upper edge of this GPU's own band")


class Distributed(Frozen):
    """How the run is spread over GPUs: the strategy, its shard group and its buffer settings."""

    strategy: Strategy
    engine: Literal["torch-ddp", "deepspeed", "fsdp", "accelerate-device-map"]
    offload: Offload
    nodes: int
    gpus_per_node: int
    world_size: int
    shard_group: int = Field(description="ranks one copy of the sharded states is spread over")
    fsdp_version: Literal[1, 2] | None = None
    quant_storage: QuantStorage | None = None
    zero_config: dict[str, int | float | bool] = Field(
        default_factory=dict, description="DeepSpeed buffer sizes modelled (elements), HF 'auto' resolved"
    )
    per_gpu: tuple[GpuShare, ...] = Field(
        default=(),
        description="device-map: every GPU's placement and peak (other strategies: every rank alike)",
    )
    bottleneck_gpu: int | None = Field(
        default=None, description="device-map: the GPU with the largest device_bytes, whose phases are shown"
    )
    source: str = "docs/distributed.md"


class Band(Frozen):
    """Where the real device peak is likely to be, around ``device_bytes`` (engine/band.py)."""

    low_bytes: int = Field(ge=0)
    high_bytes: int = Field(ge=0)
    basis: str = Field(description="one line: what the spread was derived from")

    @model_validator(mode="after")
    def _order(self) -> Band:
        if self.low_bytes > self.high_bytes:
            raise ValueError("band: low_bytes > high_bytes")
        return self


class Estimate(Frozen):
    """The engine's answer; the JSON contract (docs/json.md) is this model's dump."""

    schema_version: int = SCHEMA_VERSION
    model: str
    model_name: str
    model_source: str
    setup: TrainingSetup
    regime: Regime
    params: ParamCounts
    phases: tuple[Phase, ...]
    peak_phase: PhaseName
    peak_allocated_bytes: int
    allocator_reserve_bytes: int
    peak_reserved_bytes: int
    context_bytes: int
    device_bytes: int
    thumb: Thumb | None = None
    band: Band | None = None
    target: Verdict | None = None
    warnings: tuple[str, ...] = ()
    world_size: int = 1
    distributed: Distributed | None = None
    host_bytes: int | None = Field(default=None, description="CPU memory one node needs (largest host phase)")
    host_phases: tuple[HostPhase, ...] = ()
    cache_history: Component | None = Field(
        default=None,
        description="cached segments the caching allocator keeps above the step's own peak: from shorter "
        "steps (--lengths varying) and beside DeepSpeed ZeRO's optimizer-step flat copies; in "
        "max_memory_reserved and nvidia-smi, released when a cudaMalloc fails, so not in device_bytes",
    )

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, object]:
        """The dump, ``cache_history`` left out when there is none (additive field, docs/json.md)."""
        data: dict[str, object] = handler(self)
        if self.cache_history is None:
            data.pop("cache_history", None)
        return data

    @model_validator(mode="after")
    def _peak(self) -> Estimate:
        top = max(self.phases, key=lambda p: p.total_bytes)
        if top.total_bytes != self.peak_allocated_bytes:
            raise ValueError("peak_allocated_bytes must be the largest phase total")
        if self.peak_reserved_bytes != self.peak_allocated_bytes + self.allocator_reserve_bytes:
            raise ValueError("peak_reserved_bytes = peak_allocated_bytes + allocator_reserve_bytes")
        if self.device_bytes != self.peak_reserved_bytes + self.context_bytes:
            raise ValueError("device_bytes = peak_reserved_bytes + context_bytes")
        if self.band and not self.band.low_bytes <= self.device_bytes <= self.band.high_bytes:
            raise ValueError("band must contain device_bytes")
        return self

    def phase(self, name: str) -> Phase:
        return next(p for p in self.phases if p.name == name)
