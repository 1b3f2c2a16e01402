"""``mlx.yaml``: an mlx-lm LoRA/DoRA/full fine-tuning config (``mlx_lm.lora --config mlx.yaml``).

The native path on Apple silicon. mlx-lm merges the YAML onto its argparse namespace and silently
ignores unknown keys, so the keys are checked in the tests against its option list
(tests/data/trainer_keys/mlx_lm_lora_keys.txt, ml-explore/mlx-lm @d78bf58e = PyPI 0.32.2).
``num_layers: -1`` adapts every layer (the estimate assumes all of them). mlx-lm's LoRA ``scale``
multiplies the update directly, so it is written as alpha / rank (peft's scaling). QLoRA trains on
a model quantized ahead of time: the file names a local 4-bit MLX folder and the header says how
to make it with ``mlx_lm.convert -q``; a 16-bit model other than bf16 is converted the same way.
"""

from __future__ import annotations

from fitcheck.emitters.common import (
    EmitContext,
    Item,
    chosen,
    comment_block,
    header,
    learning_rate,
    lora_modules,
    model_ref,
    yaml_text,
)
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.planner import kernels
from fitcheck.planner.models import Plan

NAME = "mlx.yaml"
TRAINER = "mlx"
DESCRIPTION = "mlx-lm LoRA config (Apple silicon)"

#: fitcheck optimizer -> mlx-lm --optimizer (mlx_lm/lora.py choices: adam, adamw, muon, sgd, adafactor).
OPTIM = {"adamw": "adamw", "adafactor": "adafactor", "sgd": "sgd"}
#: Where each projection lives inside an mlx-lm decoder block (mlx_lm/models/llama.py and kin).
BLOCK_PATH = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "qkv_proj": "self_attn.qkv_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
    "gate_up_proj": "mlp.gate_up_proj",
}
#: mlx-lm iterations per run when no --dataset-tokens is given (its CONFIG_DEFAULTS).
DEFAULT_ITERS = 1000
Q_GROUP = 64
DTYPE = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


def lora_keys(a: DecoderArch, setup: LlmSetup) -> list[str] | None:
    """``lora_parameters.keys``: module paths inside a block; None for every linear layer."""
    names = lora_modules(a, setup)
    if names is None:
        return None
    missing = [n for n in names if n.split(".")[-1] not in BLOCK_PATH]
    if missing:
        raise OptionError(
            f"{NAME} cannot name the module(s) {', '.join(missing)}; use --lora-targets all-linear"
        )
    return [BLOCK_PATH[n.split(".")[-1]] for n in names]


def converted(ref: str, setup: LlmSetup) -> tuple[str, str] | None:
    """(local folder, mlx_lm.convert command) when the model must be converted first."""
    stem = ref.rstrip("/").split("/")[-1]
    if setup.method == "qlora":
        path = f"./{stem}-4bit-mlx"
        return (
            path,
            f"mlx_lm.convert --hf-path {ref} -q --q-bits 4 --q-group-size {Q_GROUP} --mlx-path {path}",
        )
    if setup.precision != "bf16":
        path = f"./{stem}-{setup.precision}-mlx"
        return path, f"mlx_lm.convert --hf-path {ref} --dtype {DTYPE[setup.precision]} --mlx-path {path}"
    return None


def check(plan: Plan, ctx: EmitContext) -> None:
    """Refuse a plan mlx-lm cannot run as written."""
    s = chosen(plan).setup
    if s.trainer != TRAINER:
        raise OptionError(f"{NAME} runs the mlx regime; this plan was made for --trainer {s.trainer}")
    if s.padding_free:
        raise OptionError(f"{NAME}: --padding-free is TRL's padding-free batch; emit hf.yaml for it")
    if s.optimizer not in OPTIM:
        raise OptionError(f"mlx-lm has no --optimizer {s.optimizer}; it offers adamw, adafactor or sgd")
    why = kernels.refusal(ctx.arch, TRAINER, "mps", None, s.attn)
    if why is not None:
        raise OptionError(why)
    why = kernels.precision_refusal(TRAINER, s.method, s.precision)
    if why is not None:
        raise OptionError(why)
    if s.method != "full":
        lora_keys(ctx.arch, s)
    model_ref(ctx, NAME)


def iters(plan: Plan) -> int:
    """mlx-lm counts micro-batches: optimizer steps x accumulation. Without a step count, mlx-lm's
    default rounded up to a whole number of optimizer steps: mlx-lm updates the model every
    ``grad_accumulation_steps`` iterations (tuner/trainer.py), so a remainder would be computed and
    never applied."""
    c = chosen(plan)
    accum = c.setup.grad_accum
    steps = c.throughput.optimizer_steps or -(-DEFAULT_ITERS // accum)
    return steps * accum


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{file name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    return {ctx.filename or NAME: text(plan, ctx)}


def text(plan: Plan, ctx: EmitContext) -> str:
    """The mlx-lm config text."""
    check(plan, ctx)
    c = chosen(plan)
    s = c.setup
    ref = model_ref(ctx, NAME)
    conv = converted(ref, s)
    fine_tune = "full" if s.method == "full" else ("dora" if s.dora else "lora")
    items = [
        Item("model", conv[0] if conv else ref, "4-bit MLX model: QLoRA" if s.method == "qlora" else ""),
        Item("train", True),
        Item("fine_tune_type", fine_tune),
        Item("optimizer", OPTIM[s.optimizer]),
        Item("data", "data", "folder with train.jsonl and valid.jsonl; replace with yours"),
        Item("num_layers", -1, "every layer (the estimate assumes all of them)"),
        Item("batch_size", s.batch_size, "micro-batch"),
        Item("grad_accumulation_steps", s.grad_accum, f"effective batch {c.effective_batch}"),
        Item(
            "iters",
            iters(plan),
            "micro-batches, a multiple of the accumulation"
            + ("" if c.throughput.optimizer_steps else f" (mlx-lm's {DEFAULT_ITERS} rounded up)"),
        ),
        Item("learning_rate", learning_rate(s)),
        Item("max_seq_length", s.seq_len, "tokens per example (memory grows with it)"),
        Item("grad_checkpoint", s.grad_ckpt),
        Item("adapter_path", "adapters"),
        Item("save_every", 100),
        Item("steps_per_report", 10),
    ]
    if s.method != "full":
        params: dict[str, object] = {}
        keys = lora_keys(ctx.arch, s)
        if keys is not None:
            params["keys"] = keys
        params.update(rank=s.lora_rank, scale=float(s.alpha / s.lora_rank), dropout=float(s.lora_dropout))
        items.append(Item("lora_parameters", params, "scale = alpha / rank"))
    run = f"mlx_lm.lora --config {NAME}"
    if conv:
        run = f"{conv[1]} && {run}"
    head = header(plan, ctx, "mlx-lm config", run)
    return comment_block(head) + yaml_text(items)
