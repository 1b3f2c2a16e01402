"""kohya sd-scripts: a ``--config_file`` TOML and a ``--dataset_config`` TOML from a plan.

sd-scripts reads ``--config_file`` with the ``toml`` package, flattens every table, and never
applies argparse ``type``/``choices`` to the values (trainer_formats.md section 1.2): a misspelt key
is silently ignored and a string where a number belongs fails later. So this writer only emits keys
of the chosen script's parser (``tests/data/kohya_args.tsv``, sd-scripts 48d368f) in their TOML
type: flags as booleans, ``int``/``float`` options as numbers, ``resolution`` as the string
``"W,H"`` the code splits, ``nargs="*"`` options as arrays of strings. The dataset file follows
``config_util.ConfigSanitizer`` (strict voluptuous schema): ``resolution`` is an int there, and the
DreamBooth-style keys (``caption_extension``, ``class_tokens``) are refused by ``fine_tune.py``.

The header comment carries the command line that runs the files and the estimate they were sized
with. Paths are placeholders for the user to point at their files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fitcheck import __version__
from fitcheck.diffusion.spec import DiffusionSpec
from fitcheck.emitters.common import smallest_change_line, tight_line
from fitcheck.errors import OptionError
from fitcheck.models import DiffusionSetup, Estimate, Target
from fitcheck.planner import kernels
from fitcheck.terminal import printable
from fitcheck.units import GIB

if TYPE_CHECKING:
    from fitcheck.emitters.common import EmitContext
    from fitcheck.planner.models import Change, Plan

NAME = "kohya.toml"
TRAINER = "kohya"
DESCRIPTION = "kohya sd-scripts training config (--config_file) and its dataset config"
CONFIG = "kohya_config.toml"
DATASET = "kohya_dataset.toml"

#: (family, method) -> training script. Full fine-tuning of SD 1.x/2.x is fine_tune.py (or
#: train_db.py for DreamBooth); SDXL, SD3 and FLUX have one script each for both styles.
SCRIPTS: dict[tuple[str, str], str] = {
    ("sd1", "lora"): "train_network.py",
    ("sd2", "lora"): "train_network.py",
    ("sdxl", "lora"): "sdxl_train_network.py",
    ("sd3", "lora"): "sd3_train_network.py",
    ("flux", "lora"): "flux_train_network.py",
    ("sd1", "full"): "fine_tune.py",
    ("sd2", "full"): "fine_tune.py",
    ("sdxl", "full"): "sdxl_train.py",
    ("sd3", "full"): "sd3_train.py",
    ("flux", "full"): "flux_train.py",
}
NETWORK_MODULES = {"sd1": "networks.lora", "sd2": "networks.lora", "sdxl": "networks.lora"}
NETWORK_MODULES |= {"sd3": "networks.lora_sd3", "flux": "networks.lora_flux"}
#: fitcheck optimizer -> sd-scripts ``optimizer_type`` (train_util.get_optimizer's names).
OPTIMIZERS = {
    "adamw": "AdamW",
    "adamw8bit": "AdamW8bit",
    "paged-adamw": "PagedAdamW32bit",
    "paged-adamw8bit": "PagedAdamW8bit",
    "adafactor": "Adafactor",
    "lion": "Lion",
    "lion8bit": "Lion8bit",
    "prodigy": "Prodigy",
    "sgd": "SGDNesterov",
}
#: Adafactor with a fixed learning rate, as sd-scripts' SDXL docs recommend (docs/train_SDXL-en.md).
ADAFACTOR_ARGS = ["scale_parameter=False", "relative_step=False", "warmup_init=False"]


def script_for(spec: DiffusionSpec, setup: DiffusionSetup, dreambooth: bool = False) -> str:
    """The sd-scripts entry point that trains ``spec`` with ``setup``."""
    if dreambooth and setup.method == "full" and spec.family in ("sd1", "sd2"):
        return "train_db.py"
    return SCRIPTS[(spec.family, setup.method)]


def _res(spec: DiffusionSpec, setup: DiffusionSetup) -> str:
    res = setup.resolution or spec.native_resolution
    return f"{res},{res}"


def _learning_rate(setup: DiffusionSetup) -> float:
    if setup.optimizer == "prodigy":
        return 1.0  # Prodigy estimates the step size; sd-scripts docs use lr 1
    return 1e-4 if setup.method == "lora" else 1e-5


def training_config(
    spec: DiffusionSpec, setup: DiffusionSetup, dreambooth: bool = False, dataset_name: str = DATASET
) -> dict[str, dict[str, Any]]:
    """The ``--config_file`` content as tables of sd-scripts option names (tables are cosmetic)."""
    res = setup.resolution or spec.native_resolution
    dataset: dict[str, Any] = {"dataset_config": dataset_name, "resolution": f"{res},{res}"}
    if setup.cache_latents:
        dataset |= {"cache_latents": True, "cache_latents_to_disk": True}
    out = {
        "model_arguments": _model_arguments(spec),
        "dataset_arguments": dataset,
        "training_arguments": _training_arguments(spec, setup, dreambooth),
    }
    out["optimizer_arguments"] = _optimizer_arguments(setup)
    if setup.method != "full":
        out["network_arguments"] = _network_arguments(spec, setup)
    return out


def _model_arguments(spec: DiffusionSpec) -> dict[str, Any]:
    """The checkpoint and, for SD 2 / SD3 / FLUX, the flags and separate encoder files the scripts read."""
    model: dict[str, Any] = {"pretrained_model_name_or_path": f"/path/to/{spec.id}.safetensors"}
    if spec.family == "sd2":
        model["v2"] = True
        model["v_parameterization"] = spec.native_resolution >= 768  # the 768-v model predicts v
    if spec.family == "flux":
        model |= {"clip_l": "/path/to/clip_l.safetensors", "t5xxl": "/path/to/t5xxl_fp16.safetensors"}
        model["ae"] = "/path/to/ae.safetensors"
    if spec.family == "sd3":
        model |= {"clip_l": "/path/to/clip_l.safetensors", "clip_g": "/path/to/clip_g.safetensors"}
        model["t5xxl"] = "/path/to/t5xxl_fp16.safetensors"
    return model


def _training_arguments(spec: DiffusionSpec, setup: DiffusionSetup, dreambooth: bool) -> dict[str, Any]:
    """Batch, precision, checkpointing, attention and caching options of the training table."""
    script = script_for(spec, setup, dreambooth).removesuffix(".py")
    full = setup.method == "full"
    mp = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[setup.precision]
    training: dict[str, Any] = {
        "output_dir": "/path/to/output",
        "output_name": f"{spec.id}-{'lora' if not full else 'finetune'}",
        "save_model_as": "safetensors",
        "save_precision": "fp16" if setup.precision == "fp16" else "bf16",
        "train_batch_size": setup.batch_size,
        "gradient_accumulation_steps": setup.grad_accum,
        "max_train_epochs": 10,
        "mixed_precision": mp,
        "gradient_checkpointing": setup.grad_ckpt,
        "seed": 42,
    }
    training |= _attention_flags(spec, setup)
    if setup.full_bf16:
        training["full_bf16"] = True
    if setup.full_fp16:
        training["full_fp16"] = True
    if setup.fp8_base:
        training["fp8_base"] = True
    if setup.cache_text_encoder_outputs:
        training |= {"cache_text_encoder_outputs": True, "cache_text_encoder_outputs_to_disk": True}
    if full and setup.train_text_encoder and script in ("fine_tune", "sdxl_train", "sd3_train"):
        training["train_text_encoder"] = True
    if spec.family == "flux":
        # sd-scripts' FLUX.1 recipe (docs/flux_train_network.md)
        training |= {"guidance_scale": 1.0, "timestep_sampling": "shift", "discrete_flow_shift": 3.1582}
        training["model_prediction_type"] = "raw"
    return training


def _attention_flags(spec: DiffusionSpec, setup: DiffusionSetup) -> dict[str, bool]:
    """``sdpa`` / ``xformers`` for the UNet scripts; SD3 / FLUX run their own attention and read no flag
    (kernels.KOHYA_ATTN_SOURCE)."""
    if not kernels.kohya_reads_attention_flags(spec.family):
        return {}
    if setup.attn in ("sdpa", "flash"):
        return {"sdpa": True}
    if setup.attn == "xformers" and setup.backend != "mps":
        return {"xformers": True}
    return {}


def _optimizer_arguments(setup: DiffusionSetup) -> dict[str, Any]:
    """sd-scripts' optimizer name, learning rate and schedule (Adafactor with a fixed rate)."""
    optimizer: dict[str, Any] = {
        "optimizer_type": OPTIMIZERS[setup.optimizer],
        "learning_rate": _learning_rate(setup),
        "lr_scheduler": "constant_with_warmup",
        "lr_warmup_steps": 100,
    }
    if setup.optimizer == "adafactor":
        optimizer["optimizer_args"] = list(ADAFACTOR_ARGS)
    return optimizer


def _network_arguments(spec: DiffusionSpec, setup: DiffusionSetup) -> dict[str, Any]:
    """The LoRA network table: module, rank, alpha, and conv LoRA when the targets include convolutions."""
    network: dict[str, Any] = {
        "network_module": NETWORK_MODULES[spec.family],
        "network_dim": setup.lora_rank,
        "network_alpha": float(setup.alpha),
        "network_train_unet_only": not setup.train_text_encoder,
    }
    if setup.lora_targets == "conv":
        # networks/lora.py create_network: conv_dim / conv_alpha (LyCORIS's names too) add LoRA to
        # the 3x3 convolutions; without conv_alpha sd-scripts uses 1.0, so it is written explicitly
        network["network_args"] = [f"conv_dim={setup.lora_rank}", f"conv_alpha={setup.alpha:g}"]
    return network


def dataset_config(spec: DiffusionSpec, setup: DiffusionSetup, dreambooth: bool = False) -> dict[str, Any]:
    """The ``--dataset_config`` content (ConfigSanitizer's general / datasets / subsets)."""
    script = script_for(spec, setup, dreambooth)
    res = setup.resolution or spec.native_resolution
    steps = 64  # divisible by 32 (SDXL/FLUX LoRA), 64 (fine_tune) and 16 (flux_train)
    # bucket_no_upscale: buckets follow each image's own size (at most resolution^2 pixels), and
    # sd-scripts ignores min/max_bucket_reso (library/train_util.py BaseDataset.make_buckets, with a
    # warning), so they are not written
    ds: dict[str, Any] = {
        "resolution": res,
        "batch_size": setup.batch_size,
        "enable_bucket": True,
        "bucket_reso_steps": steps,
        "bucket_no_upscale": True,
    }
    if script == "fine_tune.py":
        ds["subsets"] = [{"image_dir": "/path/to/images", "metadata_file": "/path/to/meta_lat.json"}]
        return {"datasets": [ds]}
    subset: dict[str, Any] = {"image_dir": "/path/to/images", "num_repeats": 10}
    if script == "train_db.py":
        subset["class_tokens"] = "sks person"
        ds["subsets"] = [subset, {"image_dir": "/path/to/regularization", "is_reg": True, "num_repeats": 1}]
    else:
        ds["subsets"] = [subset]
    general: dict[str, Any] = {"caption_extension": ".txt"}
    if not setup.cache_text_encoder_outputs:
        general["shuffle_caption"] = False  # cached text-encoder outputs require unshuffled captions
    return {"general": general, "datasets": [ds]}


def dataset_name(config_name: str) -> str:
    """The dataset file beside a kohya config: ``kohya.toml`` -> ``dataset.toml``,
    ``sdxl.kohya.toml`` -> ``sdxl.dataset.toml``."""
    return config_name.removesuffix("kohya.toml") + "dataset.toml"


def check(plan: Plan, ctx: EmitContext) -> None:
    """Only a plan with a choice (fits, or tight) is written, for a diffusion model."""
    if plan.chosen is None:
        raise OptionError("no configuration fits, so there is nothing to write")
    if not isinstance(ctx.spec, DiffusionSpec) or plan.kind != "diffusion":
        raise OptionError(
            "kohya.toml is a kohya sd-scripts config for diffusion models; for a language model emit "
            "hf.yaml, axolotl.yaml, llamafactory.yaml or mlx.yaml"
        )


def emit(plan: Plan, ctx: EmitContext) -> dict[str, str]:
    """{config name: text, dataset name: text} (the emitter protocol, `fitcheck.emitters.Emitter`)."""
    check(plan, ctx)
    assert isinstance(ctx.spec, DiffusionSpec)
    c, est = plan.chosen, plan.estimate
    assert c is not None and est is not None and isinstance(c.setup, DiffusionSetup)  # check() made sure
    config = ctx.filename or NAME
    names = (config, dataset_name(config))
    return emit_kohya(ctx.spec, c.setup, est, plan.target, names=names, changes=plan.changes)


def emit_kohya(
    spec: DiffusionSpec,
    setup: DiffusionSetup,
    estimate: Estimate,
    target: Target | None = None,
    dreambooth: bool = False,
    names: tuple[str, str] = (CONFIG, DATASET),
    changes: Sequence[Change] = (),
) -> dict[str, str]:
    """The two files, by name: the training config (``--config_file``) and the dataset config.

    ``names`` are the two file names (the config names the dataset file in ``dataset_config``, and its
    header's run line names the config); ``changes``: a tight plan's, the first named in the header.
    """
    config_name, dataset_name = names
    script = script_for(spec, setup, dreambooth)
    head = _header(spec, setup, estimate, target, script, names, changes)
    train = head + to_toml(training_config(spec, setup, dreambooth, dataset_name))
    data = (
        f"# kohya sd-scripts --dataset_config for {script} (fitcheck {__version__}); resolution and batch\n"
        "# match the training config. Buckets keep about resolution^2 pixels, so other aspect ratios\n"
        "# cost about the same memory. Paths are placeholders.\n\n"
    ) + to_toml(dataset_config(spec, setup, dreambooth))
    return {config_name: train, dataset_name: data}


def _header(
    spec: DiffusionSpec,
    setup: DiffusionSetup,
    est: Estimate,
    target: Target | None,
    script: str,
    names: tuple[str, str] = (CONFIG, DATASET),
    changes: Sequence[Change] = (),
) -> str:
    lines = [
        f"# kohya sd-scripts training config for {spec.name} ({spec.id}), written by fitcheck {__version__}.",
        f"# Run:  accelerate launch --num_cpu_threads_per_process 1 {script} --config_file {names[0]}",
        f"# ({script} reads {names[1]} through dataset_config; both files sit in the sd-scripts folder.)",
        f"# Estimated peak: {est.peak_allocated_bytes / GIB:.2f} GiB allocated ({est.peak_phase}), "
        f"{est.device_bytes / GIB:.2f} GiB on the device.",
    ]
    if target is not None:
        lines.append(f"# Target {target.id}: budget {target.budget_bytes / GIB:.2f} GiB.")
    if est.target is not None and est.target.verdict == "tight":
        lines.append(f"# {tight_line(est.target.high_bytes, est.target.budget_bytes)}.")
        fix = smallest_change_line(changes)
        lines += [f"# {fix}."] if fix else []
    if script == "fine_tune.py":
        lines += [
            "# fine_tune.py trains from a metadata file, not from caption files: make it first with",
            "#   python finetune/merge_captions_to_metadata.py --full_path /path/to/images meta_cap.json",
            "#   python finetune/prepare_buckets_latents.py --full_path /path/to/images meta_cap.json \\",
            f"#     meta_lat.json /path/to/{spec.id}.safetensors --max_resolution {_res(spec, setup)}"
            + " --mixed_precision "
            + setup.precision.replace("fp32", "no"),
            "# (sd-scripts docs/train_README-ja.md, fine-tuning); meta_lat.json is the dataset's",
            "# metadata_file.",
        ]
    if setup.cache_latents:
        lines.append("# cache_latents: color_aug and random_crop must stay off.")
    lines.append("# Paths are placeholders: point them at your files.")
    return "\n".join(printable(line) for line in lines) + "\n\n"  # a name's line break stays escaped


# --- a small TOML writer (the emitter stays pure: no tomli_w at runtime) -------------------------


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        return text if any(c in text for c in ".en") else text + ".0"
    if isinstance(v, str):
        return json.dumps(v)  # a TOML basic string: JSON escapes are TOML escapes
    if isinstance(v, Sequence):
        items = [_value(x) for x in v]
        if len({type(x) for x in v}) > 1:
            raise ValueError("sd-scripts reads TOML 0.5: arrays must hold one type")
        return "[" + ", ".join(items) + "]"
    raise TypeError(f"no TOML form for {type(v).__name__}")


def to_toml(doc: Mapping[str, Any]) -> str:
    """Tables of scalars and arrays, and arrays of tables (``[[datasets]]``, ``[[datasets.subsets]]``)."""
    out: list[str] = []
    for name, table in doc.items():
        if isinstance(table, Mapping):
            out.append(f"[{name}]")
            out += _scalars(table)
            out.append("")
        else:
            for item in table:
                out.append(f"[[{name}]]")
                out += _scalars(item)
                for sub_name, subs in item.items():
                    if _is_table_array(subs):
                        for sub in subs:
                            out.append("")
                            out.append(f"  [[{name}.{sub_name}]]")
                            out += ["  " + line for line in _scalars(sub)]
                out.append("")
    return "\n".join(out).rstrip() + "\n"


def _is_table_array(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, Mapping) for x in v)


def _scalars(table: Mapping[str, Any]) -> list[str]:
    return [f"{k} = {_value(v)}" for k, v in table.items() if not _is_table_array(v)]
