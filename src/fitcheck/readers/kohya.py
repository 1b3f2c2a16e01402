"""kohya sd-scripts ``--config_file`` TOML (with its ``--dataset_config``) and kohya_ss GUI presets.

sd-scripts flattens every table of the TOML onto its argparse namespace (``train_util.
read_config_from_file``), so table names do not matter. Mapping, after sd-scripts @48d368f
(library/train_util.py, train_network.py, library/config_util.py; trainer_formats.md section 1):
``network_module`` makes a LoRA run (none: full fine-tuning), ``network_dim`` is the rank,
``network_alpha`` alpha (default 1), ``network_args`` ``conv_dim`` adds the conv layers,
``network_train_unet_only`` keeps the text encoders frozen; ``resolution`` ("W,H") and
``train_batch_size``, both overridden by the dataset file's ``resolution`` / ``batch_size``
(config_util's dataset blueprint takes precedence); ``mixed_precision`` (default ``no``),
``full_bf16``/``full_fp16``, ``fp8_base``; ``cache_latents``, ``cache_text_encoder_outputs``
(``_to_disk`` turns them on too); attention ``mem_eff_attn`` > ``xformers`` > ``sdpa`` (the order
``replace_unet_modules`` applies), none of them: plain attention; ``optimizer_type``
(case-insensitive), or the legacy ``use_8bit_adam`` / ``use_lion_optimizer``.

kohya_ss (bmaltais/kohya_ss ``presets/lora/*.json``) saves the GUI's fields: ``LoRA_type``,
``max_resolution``, ``optimizer``, ``xformers`` ("xformers", "sdpa" or "none"), ``sdxl``,
``sdxl_cache_text_encoder_outputs``, and trains the text encoder unless ``text_encoder_lr`` is 0
(kohya_gui/lora_gui.py: network_train_unet_only when only the U-Net has a learning rate).
"""

from __future__ import annotations

import math

from fitcheck.errors import InputError
from fitcheck.readers import names
from fitcheck.readers.accelerate import PRECISION as AUTOCAST
from fitcheck.readers.base import Doc, Keys, Reading, ReadResult, _short, as_bool, as_float, as_int, as_word
from fitcheck.terminal import clipped

FORMAT = "kohya"
FORMAT_GUI = "kohya_ss"
TRAINER = "kohya"
#: kohya_ss LoRA_type values sized as plain LoRA, and those that add the conv layers (LoCon).
GUI_LORA = {"Standard": "lora", "Kohya LoCon": "conv", "LyCORIS/LoCon": "conv", "Kohya DyLoRA": "lora"}


#: mixed_precision -> the run's compute dtype: accelerate's autocast words, and "no" (sd-scripts loads its
#: weights in fp32: library/train_util.py load_target_model, weight_dtype from mixed_precision only).
PRECISION = {"no": "fp32", **AUTOCAST}


def dataset_file(data: Doc) -> str | None:
    """The ``dataset_config`` path the training TOML names (read beside it), if any."""
    for table in (data, *(v for v in data.values() if isinstance(v, dict))):
        value = table.get("dataset_config")
        if isinstance(value, str) and value:
            return value
    return None


def _flatten(data: Doc) -> dict[str, object]:
    """sd-scripts' flattening: every table's keys at the top, a later table winning."""
    flat: dict[str, object] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    return flat


def read(data: Doc, path: str, dataset: Doc | None = None) -> ReadResult:
    """Read an sd-scripts training TOML; ``dataset`` is its ``--dataset_config`` file when found."""
    k = Keys(_flatten(data))
    r = Reading(FORMAT, TRAINER, k, path)
    model = k.get("pretrained_model_name_or_path")
    r.model = str(model) if model else None
    module = k.get("network_module")
    refuse_controlnet(data, path)
    if module:
        r.set("method", "lora", "network_module")
        if module not in ("networks.lora", "networks.lora_flux", "networks.lora_sd3"):
            r.note(f"network_module {module}: sized as LoRA")
        _network(r, k)
    else:
        r.set("method", "full", "network_module")
        te = as_bool(k.get("train_text_encoder"), "train_text_encoder", path)
        stop = as_int(k.get("stop_text_encoder_training"), "stop_text_encoder_training", path)
        if te is None and stop is not None:  # only train_db.py reads it (train_db.py @48d368f)
            te, key = stop >= 0, "stop_text_encoder_training"
        else:
            key = "train_text_encoder"
        r.set("train_text_encoder", te, key)
        if te is None:
            r.note(
                "train_text_encoder unset: sdxl_train.py and fine_tune.py keep the text encoder frozen, "
                "train_db.py (DreamBooth, SD 1.x/2.x) trains it: give --train-text-encoder for that one"
            )
    r.set("resolution", _resolution(k.get("resolution"), "resolution", r), "resolution")
    r.set("batch_size", as_int(k.get("train_batch_size"), "train_batch_size", path), "train_batch_size")
    _common(r, k)
    k.touch("dataset_config")
    named = k.get("dataset_config")
    if named is not None and not (isinstance(named, str) and named):
        raise InputError(f"--from {path}: dataset_config is a file name (got {clipped(repr(named))})")
    if dataset is not None:
        _dataset(r, dataset)
    return r.result()


def refuse_controlnet(data: Doc, path: str) -> None:
    """ControlNet training is a run fitcheck has no model for: ``cond_emb_dim`` is ControlNet-LLLite's
    (sdxl_train_control_net_lllite.py @48d368f: ``unet.apply_lllite(args.cond_emb_dim, args.network_dim,
    ...)`` trains small conditioning modules beside the frozen U-Net, no ``network_module``), and
    ``controlnet_model_name_or_path`` without a ``network_module`` is ControlNet training
    (train_control_net.py, sdxl_train_control_net.py, flux_train_control_net.py: a trained copy of the
    U-Net's encoder). Read as full fine-tuning, either would size another run."""
    flat = _flatten(data)
    if flat.get("cond_emb_dim") is not None:
        raise InputError(
            f"--from {path}: cond_emb_dim {_short(flat['cond_emb_dim'])} means ControlNet-LLLite training "
            "(sdxl_train_control_net_lllite.py), which fitcheck does not model"
        )
    if flat.get("controlnet_model_name_or_path") and not flat.get("network_module"):
        raise InputError(
            f"--from {path}: controlnet_model_name_or_path without network_module means ControlNet "
            "training (train_control_net.py), which fitcheck does not model"
        )


def _network(r: Reading, k: Keys) -> None:
    p = r.path
    r.set("lora_rank", as_int(k.get("network_dim"), "network_dim", p), "network_dim")
    r.set("lora_alpha", as_float(k.get("network_alpha"), "network_alpha", p), "network_alpha")
    r.set("lora_dropout", as_float(k.get("network_dropout"), "network_dropout", p), "network_dropout")
    args = names.modules(k.get("network_args"), "network_args", p)
    conv = [a.split("=", 1)[1].strip() for a in args if a.replace(" ", "").startswith("conv_dim=")]
    if conv:
        _conv_dim(r, conv[-1])
    unet_only = as_bool(k.get("network_train_unet_only"), "network_train_unet_only", p)
    if unet_only is not None:
        r.set("train_text_encoder", not unet_only, "network_train_unet_only")


def _conv_dim(r: Reading, text: str) -> None:
    """``network_args conv_dim=N`` (networks/lora.py create_network: ``int(conv_dim)``): N > 0 adds LoRA to
    the 3x3 convolutions, sized at the network's rank; 0 adds none (create_modules skips a module of rank
    0); text or a negative N would fail in sd-scripts and is refused."""
    dim = as_int(text, "network_args conv_dim", r.path)
    if dim is None or dim < 0:
        raise InputError(
            f"{r.path}: network_args conv_dim must be a whole number, 0 or more (got {text!r:.40})"
        )
    if dim == 0:
        r.note("network_args conv_dim=0: sd-scripts adds no LoRA to the 3x3 convolutions")
        return
    r.set("lora_targets", "conv", "network_args")
    rank = r.values.get("lora_rank")
    if rank is not None and rank != dim:
        r.note(
            f"network_args conv_dim={dim}: the 3x3 convolutions are sized at network_dim {rank} (an estimate)"
        )


def _common(r: Reading, k: Keys) -> None:
    """The keys the TOML and the GUI preset share."""
    p = r.path
    r.set(
        "grad_accum",
        as_int(k.get("gradient_accumulation_steps"), "gradient_accumulation_steps", p),
        "gradient_accumulation_steps",
    )
    r.set(
        "grad_ckpt",
        as_bool(k.get("gradient_checkpointing"), "gradient_checkpointing", p),
        "gradient_checkpointing",
    )
    mp = as_word(k.get("mixed_precision"), "mixed_precision", p)
    if mp is not None:
        # sd-scripts hands mixed_precision to accelerate's Accelerator: its words (`accelerate.PRECISION`);
        # its weights load in fp32, so "no" (no autocast) is an fp32 run
        r.set("precision", PRECISION.get(mp), "mixed_precision")
        if mp not in PRECISION:
            r.note(f"mixed_precision {_short(mp)} has no fitcheck model (no, fp16, bf16); fp32 is assumed")
    for key in ("full_bf16", "full_fp16"):
        if as_bool(k.get(key), key, p):
            r.set(key, True, key)
    for key in ("fp8_base", "fp8_base_unet"):
        if as_bool(k.get(key), key, p):
            r.set("fp8_base", True, key)
    for key in ("cache_latents", "cache_latents_to_disk"):
        if as_bool(k.get(key), key, p):
            r.set("cache_latents", True, key)
    for key in ("cache_text_encoder_outputs", "cache_text_encoder_outputs_to_disk"):
        if as_bool(k.get(key), key, p):
            r.set("cache_text_encoder_outputs", True, key)
    _attention(r, k)
    _optimizer(r, k)
    if as_bool(k.get("cpu_offload_checkpointing"), "cpu_offload_checkpointing", p):
        r.set("offload_activations", True, "cpu_offload_checkpointing")
    _upper_bounds(r, k)


#: Settings that lower the peak by means fitcheck does not model (sd-scripts @48d368f: blocks_to_swap in
#: flux_train_network.py / sd3_train_network.py, fused_backward_pass and fused_optimizer_groups in
#: sdxl_train.py; kohya_ss GUI's per-model copies): the estimate is an upper bound, said so.
SWAP_KEYS = ("blocks_to_swap", "double_blocks_to_swap", "single_blocks_to_swap")
FUSED_KEYS = (
    "fused_backward_pass",
    "flux_fused_backward_pass",
    "sd3_fused_backward_pass",
    "blockwise_fused_optimizers",
)


def _upper_bounds(r: Reading, k: Keys) -> None:
    p = r.path
    for key in SWAP_KEYS:
        swap = as_int(k.get(key), key, p)
        if swap:
            r.note(f"{key} {swap}: block swapping to the CPU is not modelled (an upper bound)")
    for key in FUSED_KEYS:
        if as_bool(k.get(key), key, p):
            r.note(f"{key}: gradients freed during backward are not modelled (an upper bound)")
    groups = as_int(k.get("fused_optimizer_groups"), "fused_optimizer_groups", p)
    if groups:
        r.note(
            f"fused_optimizer_groups {groups}: per-group steps in backward are not modelled (an upper bound)"
        )


def _attention(r: Reading, k: Keys) -> None:
    xf = k.get("xformers")
    if isinstance(xf, str):  # kohya_ss GUI: "xformers", "sdpa" or "none"
        kernel = {"xformers": "xformers", "sdpa": "sdpa", "none": "eager"}.get(xf)
        r.set("attn", kernel, "xformers")
        k.touch("mem_eff_attn", "sdpa")
        return
    flags = {key: as_bool(k.get(key), key, r.path) for key in ("mem_eff_attn", "xformers", "sdpa")}
    if flags["mem_eff_attn"]:
        r.set("attn", "flash", "mem_eff_attn")  # sd-scripts' own FlashAttention-style kernel: O(s)
    elif flags["xformers"]:
        r.set("attn", "xformers", "xformers")
    elif flags["sdpa"]:
        r.set("attn", "sdpa", "sdpa")
    elif any(v is False for v in flags.values()):
        r.set("attn", "eager", "sdpa")


def _optimizer(r: Reading, k: Keys) -> None:
    p = r.path
    key = "optimizer_type" if k.has("optimizer_type") else "optimizer"
    k.touch("optimizer_type", "optimizer")
    opt = as_word(k.get(key), key, p)
    if opt is not None:
        r.set("optimizer", names.optimizer(names.KOHYA_OPTIM, opt, key, r.notes), key)
    elif as_bool(k.get("use_8bit_adam"), "use_8bit_adam", p):
        r.set("optimizer", "adamw8bit", "use_8bit_adam")
    elif as_bool(k.get("use_lion_optimizer"), "use_lion_optimizer", p):
        r.set("optimizer", "lion", "use_lion_optimizer")
    k.touch("optimizer_args")


def _resolution(value: object, key: str, r: Reading) -> int | None:
    """One side in pixels: ``"W,H"``, ``W``, ``[W, H]``; a non-square size as the side of equal area."""
    if value is None or value == "":
        return None

    def bad() -> InputError:
        return InputError(f"--from {r.path}: {key} must be a size in pixels, W or W,H (got {_short(value)})")

    if isinstance(value, str):
        # sd-scripts reads the string with int() per side (library/train_util.py prepare_dataset_args:
        # ``tuple([int(r) for r in args.resolution.split(",")])``): "1e3" or "1024.0" stops it
        try:
            sides: list[int | None] = [int(side) for side in value.split(",")]
        except ValueError:
            raise bad() from None
    else:
        parts = value if isinstance(value, list) else [value]
        sides = [as_int(str(v).strip(), key, r.path) for v in parts]
    whole = [s for s in sides if s is not None and s > 0]
    if len(whole) != len(sides) or not 1 <= len(whole) <= 2:
        raise bad()
    w, h = whole[0], whole[-1]
    if w != h:
        side = math.isqrt(w * h)
        r.note(f"{key} {w}x{h}: sized as {side}x{side} (the same number of pixels)")
        return side
    return w


def _dataset(r: Reading, doc: Doc) -> None:
    """The dataset file's ``resolution`` and ``batch_size``: each dataset's own, else ``[general]``'s, else
    the config's. sd-scripts draws every batch from one dataset (library/config_util.py
    generate_dataset_group_by_blueprint, train_util.DatasetGroup @48d368f), so the dataset with the most
    pixels per step (batch x side^2) sets the peak and sizes the run."""
    general = doc.get("general") if isinstance(doc.get("general"), dict) else {}
    listed = doc.get("datasets")
    sets = [d for d in listed if isinstance(d, dict)] if isinstance(listed, list) else []
    assert isinstance(general, dict)
    steps = [_step(r, ds, general) for ds in sets or [{}]]
    side0, batch0 = r.values.get("resolution"), r.values.get("batch_size")
    side_cfg = side0 if isinstance(side0, int) else 0
    batch_cfg = batch0 if isinstance(batch0, int) else 1

    def pixels(step: tuple[int | None, int | None]) -> int:
        return (step[0] or side_cfg) ** 2 * (step[1] or batch_cfg)

    best = max(range(len(steps)), key=lambda i: pixels(steps[i]))
    side, batch = steps[best]
    r.set("resolution", side, "dataset_config resolution")
    r.set("batch_size", batch, "dataset_config batch_size")
    if len(sets) > 1:
        r.note(
            f"dataset_config has {len(sets)} datasets: "
            f"sized with dataset {best + 1}, the most pixels per step"
        )


def _step(r: Reading, ds: dict[str, object], general: dict[str, object]) -> tuple[int | None, int | None]:
    """One dataset's (side, batch), falling back to ``[general]``; None where neither says."""
    res, batch = (
        ds.get("resolution", general.get("resolution")),
        ds.get("batch_size", general.get("batch_size")),
    )
    side = _resolution(res, "dataset_config resolution", r) if res is not None else None
    return side, as_int(batch, "dataset_config batch_size", r.path) if batch is not None else None


#: kohya_ss textual-inversion tab keys (kohya_gui/textual_inversion_gui.py): only new token embeddings train.
TI_KEYS = ("token_string", "init_word", "num_vectors_per_token")
#: LyCORIS LoKr takes a dim this large as "do not decompose": full-matrix Kronecker factors, not a rank
#: (LyCORIS docs/Network-Args.md "Dimension": a value > 10240/2 stops the second block's decomposition;
#: lycoris/modules/lokr.py "using full matrix mode").
LOKR_FULL_DIM = 10240 // 2
#: kohya_ss passes the cached text-encoder outputs only for the model kind checked (kohya_gui/
#: dreambooth_gui.py, lora_gui.py: ``(sdxl and sdxl_cache_...) or (sd3_checkbox and sd3_cache_...) or
#: (flux1_checkbox and flux1_cache_...)``, @45088f04).
GUI_TE_CACHE = (
    ("sdxl", "sdxl_cache_text_encoder_outputs"),
    ("sd3_checkbox", "sd3_cache_text_encoder_outputs"),
    ("sd3_checkbox", "sd3_cache_text_encoder_outputs_to_disk"),
    ("flux1_checkbox", "flux1_cache_text_encoder_outputs"),
    ("flux1_checkbox", "flux1_cache_text_encoder_outputs_to_disk"),
)


def gui_refusal(data: Doc, path: str) -> str | None:
    """Why a kohya_ss preset is not a run fitcheck can pose, or None."""
    for key in TI_KEYS:
        if data.get(key) not in (None, ""):
            return (
                f"--from {path}: {key}: a textual-inversion preset (only new token embeddings train) is not "
                "a run fitcheck models"
            )
    kind, dim = str(data.get("LoRA_type", "")), data.get("network_dim")
    if "LoKr" in kind and isinstance(dim, (int, float)) and dim > LOKR_FULL_DIM:
        return (
            f"--from {path}: network_dim {dim} with LoRA_type {kind}: LyCORIS keeps full-matrix Kronecker "
            "factors at this size (no rank), which fitcheck does not model"
        )
    return None


def read_gui(data: Doc, path: str, dataset: Doc | None = None) -> ReadResult:
    """Read a kohya_ss GUI preset (JSON); ``dataset`` is the ``dataset_config`` file it names, if found."""
    why = gui_refusal(data, path)
    if why is not None:
        raise InputError(why)
    k = Keys(data)
    r = Reading(FORMAT_GUI, TRAINER, k, path)
    model = k.get("pretrained_model_name_or_path")
    r.model = str(model) if model else _gui_model(k, r)
    k.touch(*GUI_MODEL_KIND)  # a named model file decides the family these checkboxes name
    kind = k.get("LoRA_type")
    if kind is not None or k.has("network_dim"):
        style = GUI_LORA.get(str(kind), "lora")
        if kind is not None and str(kind) not in GUI_LORA:
            r.note(f"LoRA_type {kind}: sized as LoRA")
        r.set("method", "lora", "LoRA_type")
        _network(r, k)
        if style == "conv":
            r.set("lora_targets", "conv", "LoRA_type")
        te = as_float(k.get("text_encoder_lr"), "text_encoder_lr", path)
        if te is not None:
            r.set("train_text_encoder", te != 0.0, "text_encoder_lr")
    else:
        r.set("method", "full", "LoRA_type")
        _gui_text_encoder(r, k)
    r.set("resolution", _resolution(k.get("max_resolution"), "max_resolution", r), "max_resolution")
    r.set("batch_size", as_int(k.get("train_batch_size"), "train_batch_size", path), "train_batch_size")
    _common(r, k)
    for flag, key in GUI_TE_CACHE:
        if as_bool(k.get(key), key, path) and _flag(k, flag, path):
            r.set("cache_text_encoder_outputs", True, key)
    k.touch("conv_dim", "conv_alpha", "unet_lr", "dataset_config")
    if dataset is not None:
        _dataset(r, dataset)
    return r.result()


def _flag(k: Keys, flag: str, path: str) -> bool:
    """A GUI model-kind checkbox (``sdxl`` is ``sdxl_checkbox`` in the finetune tab)."""
    names = (flag, "sdxl_checkbox") if flag == "sdxl" else (flag,)
    return any(as_bool(k.get(name), name, path) for name in names)


def _gui_text_encoder(r: Reading, k: Keys) -> None:
    """Full fine-tuning from the GUI: does the text encoder train? The finetune tab passes its
    ``train_text_encoder`` checkbox (finetune_gui.py); the DreamBooth tab, for SDXL, trains it when
    ``learning_rate_te1`` or ``_te2`` is over 0 (dreambooth_gui.py, kohya_ss @45088f04), and for SD 1.x/2.x
    runs train_db.py, which trains it unless ``stop_text_encoder_training`` is negative (train_db.py @48d368f;
    the GUI passes 0 as unset)."""
    p = r.path
    given = as_bool(k.get("train_text_encoder"), "train_text_encoder", p)
    if given is not None:
        r.set("train_text_encoder", given, "train_text_encoder")
        return
    stop = as_int(k.get("stop_text_encoder_training"), "stop_text_encoder_training", p)
    if stop is None or _flag(k, "sd3_checkbox", p) or _flag(k, "flux1_checkbox", p):
        return
    if _flag(k, "sdxl", p):
        rates = [as_float(k.get(key), key, p) for key in ("learning_rate_te1", "learning_rate_te2")]
        if any(rate is not None for rate in rates):
            r.set("train_text_encoder", any((rate or 0.0) > 0 for rate in rates), "learning_rate_te1")
        return
    r.set("train_text_encoder", stop >= 0, "stop_text_encoder_training")


#: kohya_ss's model-kind checkboxes (kohya_gui class_source_model.py; ``sdxl_checkbox`` in the finetune tab).
GUI_MODEL_KIND = ("flux1_checkbox", "sd3_checkbox", "sdxl", "sdxl_checkbox", "v2", "v_parameterization")


def _gui_model(k: Keys, r: Reading) -> str | None:
    """A kohya_ss preset names no model file; its model-kind flags name the family's preset."""
    for key, preset in (
        ("flux1_checkbox", "flux.1-dev"),
        ("sd3_checkbox", "sd35-medium"),
        ("sdxl", "sdxl"),
        ("sdxl_checkbox", "sdxl"),  # the finetune tab's name for it (kohya_gui/finetune_gui.py)
        ("v2", "sd21"),
    ):
        if as_bool(k.get(key), key, r.path):
            r.note(f"{key}: the preset names no model file; sized as {preset} unless MODEL is given")
            return preset
    return None
