"""Which projections LoRA wraps, and how many adapter parameters that makes.

``attn``: the attention projections; ``all-linear``: every projection inside the decoder layers
(peft's ``all-linear`` excludes the output layer; with transformers >= 5 and peft >= 0.18 it also
reaches MoE routers and the 3-D expert parameters, through ``ParamWrapper``); ``linear-modules``: the
leaf names of every ``nn.Linear`` module but the output layer, handed to peft as a list (what axolotl's
``lora_target_linear`` does, `LINEAR_MODULES`); otherwise a comma-separated list of module names as
peft matches them (a name matches a module whose name ends with it).
"""

from __future__ import annotations

from fitcheck.engine.params import LayerKind, Linear, layer_kinds, peft_moe_renames
from fitcheck.engine.quant import expert_modules, is_fused_expert
from fitcheck.errors import OptionError
from fitcheck.models import DecoderArch, LlmSetup
from fitcheck.vocab import LINEAR_MODULES, LMF_ALL, PREFIX

#: `LINEAR_MODULES`, the token for axolotl's ``lora_target_linear: true``: ``find_all_linear_names`` (axolotl
#: src/axolotl/loaders/adapter.py @067b021c) collects the last name component of every module that is an
#: ``nn.Linear`` (or bitsandbytes ``Linear4bit``/``Linear8bitLt``, or whose class name holds ``Linear``),
#: drops the output embedding's name (``lm_head``) and hands the list to ``LoraConfig(target_modules=...)``.
#: Unlike peft's ``all-linear``, the names are fixed before peft sees the model, so on transformers 5 the
#: 3-D experts and a router that is no ``nn.Linear`` are reached only through peft's v4->v5 conversion of
#: names that dense or shared MLP modules carry (`peft_moe_renames`). It may stand beside other names.

#: MoE types whose router is (or holds) an ``nn.Linear`` module, so ``find_all_linear_names`` lists it
#: (the class, checked on the meta device with transformers 5.24; held by tests/test_peft_reach.py).
#: Other routers are ``nn.Module`` subclasses with a bare weight (``Qwen3MoeTopKRouter``,
#: ``MixtralTopKRouter``, ``DeepseekV3TopkRouter``, ...).
ROUTER_LINEAR: dict[str, str] = {
    "phimoe": "PhimoeTopKRouter(nn.Linear)",
    "llama4": "Llama4Router(nn.Linear)",
    "llama4_text": "Llama4Router(nn.Linear)",
    # the module's leaf is ``wg``; fitcheck names the router ``gate``, which peft's conversion maps onto
    # the router too: the same r(h + E) adapter
    "hunyuan_v1_moe": "HunYuanMoEV1Gate holds wg = nn.Linear(hidden, experts)",
}


#: `LMF_ALL`, LLaMA-Factory's ``lora_target: all`` (the default of ``lora_target``, hparams/
#: finetuning_args.py @ff6d4d12): ``find_all_linear_modules`` (model/model_utils/misc.py @ff6d4d12)
#: collects the last name component of every module whose CLASS NAME holds ``Linear`` (and not
#: ``Embedding``), skipping ``lm_head`` (and chatglm's ``output_layer``, internlm2's ``output``), on a
#: composite model also the projector keys and, with ``freeze_vision_tower`` (default true), the vision
#: tower keys (model_utils/visual.py COMPOSITE_MODELS); ``patch_target_modules`` then turns the names
#: into the full names of the language model's modules. By class name, not ``isinstance``: the
#: ``nn.Linear`` subclasses ``PhimoeTopKRouter`` and ``Llama4Router`` are left out, where axolotl's
#: rule takes them (`ROUTER_LINEAR`); HunYuan's ``wg`` is an ``nn.Linear`` and is taken.
ROUTER_CLASS_LINEAR: tuple[str, ...] = ("hunyuan_v1_moe",)
#: The tokens that stand for a list of leaf names fixed before peft sees the model.
NAME_RULES = (LINEAR_MODULES, LMF_ALL)


#: Types whose projections are transformers' ``Conv1D`` (modeling_gpt2.py: ``c_attn``, ``c_proj``, ``c_fc``),
#: neither an ``nn.Linear`` nor a class named ``*Linear*``: both trainers' rules find no module there, and
#: peft refuses the empty list ("No `target_modules` passed", peft 0.21; tests/test_emitters_load.py
#: built it), while peft's ``all-linear`` takes ``Conv1D`` too.
CONV1D_TYPES = ("gpt2",)


def linear_module_names(a: DecoderArch, by_class: bool = False) -> list[str]:
    """The names axolotl's ``lora_target_linear`` targets on this model (`LINEAR_MODULES`), or with
    ``by_class`` LLaMA-Factory's ``lora_target: all`` (`LMF_ALL`, routers by class name)."""
    if a.model_type in CONV1D_TYPES:
        return []
    lins = [lin for k in layer_kinds(a) for lin in k.linears(a)]
    router = a.model_type in (ROUTER_CLASS_LINEAR if by_class else ROUTER_LINEAR)
    return sorted({x.name.split(".")[-1] for x in lins if x.is_module or (router and x.role == "router")})


def expand_targets(a: DecoderArch, targets: str) -> str:
    """The targets with the `LINEAR_MODULES` / `LMF_ALL` tokens replaced by this model's names."""
    wanted = _wanted(targets)
    if not set(NAME_RULES) & set(wanted):
        return targets
    out: list[str] = []
    for w in wanted:
        if w in NAME_RULES:
            out += linear_module_names(a, by_class=w == LMF_ALL)
        else:
            out.append(w)
    return ",".join(dict.fromkeys(out))


def _names(a: DecoderArch) -> list[str]:
    seen: list[str] = []
    for kind in layer_kinds(a):
        for lin in kind.linears(a):
            if lin.name not in seen:
                seen.append(lin.name)
    return seen


def _converted(a: DecoderArch, wanted: list[str]) -> tuple[list[str], set[str]]:
    """peft's MoE conversion of named targets (`peft_moe_renames`): the names left as module targets, and
    the projections the converted names now target. peft matches a v4 name by equality or a ``.name``
    suffix."""
    renames = peft_moe_renames(a)
    left = [w for w in wanted if w.split(".")[-1] not in renames]
    return left, {renames[w.split(".")[-1]] for w in wanted if w not in left}


def _module_leaves(a: DecoderArch) -> set[str]:
    return {lin.name.split(".")[-1] for k in layer_kinds(a) for lin in k.linears(a) if lin.is_module}


def targeted(a: DecoderArch, targets: str, lin: Linear) -> bool:
    """Whether LoRA wraps this projection under the targets spec. Named targets match module names by
    suffix; a 3-D expert parameter by its own name, its leaf when no module shares it (peft matches
    modules, so ``down_proj`` on Qwen2-MoE wraps the dense and shared MLPs only), or through peft's MoE
    conversion (`peft_moe_renames`)."""
    if targets == "all-linear":
        return lin.all_linear
    if targets == "attn":
        return lin.role == "attn"
    if set(NAME_RULES) & set(_wanted(targets)):
        return targeted(a, expand_targets(a, targets), lin)
    wanted, converted = _converted(a, _wanted(targets))
    if lin.name in converted:
        return True
    short = lin.name.split(".")[-1]
    if lin.role == "expert" and not lin.is_module:
        return lin.name in wanted or (short in wanted and short not in _module_leaves(a))
    return any(_matches(lin.name, w) for w in wanted)


def _matches(name: str, w: str) -> bool:
    """peft's rule for a named target: the module's full name, or its last component(s)."""
    return name == w or name.split(".")[-1] == w or name.endswith("." + w)


#: Modules outside the decoder layers that peft can wrap when named: the output layer (a Linear) and the
#: input embedding (``lora.Embedding``: ``lora_embedding_A`` r x V, ``lora_embedding_B`` h x r). peft's
#: ``all-linear`` leaves the output layer out (peft tuners_utils ``_maybe_include_all_linear_layers``),
#: so they are adapted only when named.
HEAD_MODULES = ("lm_head", "embed_tokens")


def _wanted(targets: str) -> list[str]:
    return [t.strip() for t in targets.split(",") if t.strip()]


def head_targets(targets: str) -> tuple[str, ...]:
    """Which of lm_head / embed_tokens the targets name explicitly."""
    if targets in ("all-linear", "attn"):
        return ()
    return tuple(m for m in HEAD_MODULES if m in _wanted(targets))


def head_adapter_params(a: DecoderArch, setup: LlmSetup) -> int:
    """LoRA parameters on lm_head / embed_tokens: r (h + V) each (+ V with DoRA on lm_head)."""
    per = setup.lora_rank * (a.hidden_size + a.vocab_size)
    total = 0
    for m in head_targets(setup.lora_targets):
        total += per + (a.vocab_size if setup.dora and m == "lm_head" else 0)
    return total


def trained_modules(setup: LlmSetup) -> tuple[str, ...]:
    """``--train-modules``: modules peft trains in full beside the adapters (``modules_to_save``), each
    once: peft matches the list by module name, so a name given twice is still one trained copy."""
    return tuple(dict.fromkeys(_wanted(setup.train_modules)))


def _parameter_target(a: DecoderArch, lin: Linear) -> bool:
    """Adapted through peft's ``lora.ParamWrapper`` (a target parameter, not a module): the 3-D experts,
    and the router's weight on the types peft's MoE conversion rewrites (``gate`` -> ``gate.weight``)."""
    return (lin.role == "expert" and not lin.is_module) or (
        lin.role == "router" and "gate" in peft_moe_renames(a)
    )


#: axolotl's ``load_lora`` (src/axolotl/loaders/adapter.py @067b021c): with ``lora_dropout`` set and no
#: ``lora_target_parameters`` of its own, when peft's v4->v5 conversion would turn the targets into
#: parameter targets (``_peft_will_auto_convert_target_params``), axolotl patches ``ParamWrapper`` to
#: build with dropout 0 (``_patch_peft_param_wrapper_dropout``), so the run starts: the experts' adapters
#: get no dropout, the others keep it. DoRA is not patched.
AXOLOTL_DROPOUT_PATCH = "axolotl loaders/adapter.py @067b021c _patch_peft_param_wrapper_dropout"


def validate_parameter_targets(a: DecoderArch, setup: LlmSetup) -> None:
    """peft 0.21's ``lora.ParamWrapper`` (tuners/lora/layer.py ``__init__``) refuses DoRA and a LoRA
    dropout ("does not work with use_dora=True" / "with lora_dropout != 0"), so with targets that reach
    the experts (``all-linear`` on most MoE types, or the v4 MLP names on the converted ones) the run
    cannot start. axolotl lets a dropout through when peft's conversion made the parameter targets
    (`AXOLOTL_DROPOUT_PATCH`)."""
    what = "--dora" if setup.dora else f"--lora-dropout {setup.lora_dropout:g}" if setup.lora_dropout else ""
    if not what or setup.method == "full":
        return
    lins = [lin for k in layer_kinds(a) for lin in k.linears(a)]
    named = _wanted(setup.lora_targets)
    explicit = any(x.role == "expert" and not x.is_module and x.name in named for x in lins)
    if setup.trainer == "axolotl" and not setup.dora and not explicit:
        return
    hit = [
        lin
        for lin in lins
        if _parameter_target(a, lin)
        and not per_expert_modules(a, setup, lin)
        and targeted(a, setup.lora_targets, lin)
    ]
    if hit:
        raise OptionError(
            f"{what} with --lora-targets {setup.lora_targets} on {a.model_type}: the targets reach "
            f"{hit[0].name}, a parameter peft adapts through lora.ParamWrapper, which refuses DoRA and "
            f"LoRA dropout (peft 0.21); leave out {what.split()[0]} or use --lora-targets attn"
        )


def validate_train_modules(setup: LlmSetup) -> None:
    """Only the output layer and the embedding can be trained in full beside LoRA (named as peft does)."""
    mods = trained_modules(setup)
    bad = [m for m in mods if m not in HEAD_MODULES]
    if bad:
        raise OptionError(f"--train-modules: '{bad[0]}' is not one of {', '.join(HEAD_MODULES)}")
    if mods and setup.method == "full":
        raise OptionError(
            "--train-modules applies to LoRA and QLoRA; --method full already trains everything"
        )
    both = set(mods) & set(head_targets(setup.lora_targets))
    if both:
        raise OptionError(f"{sorted(both)[0]} is both a LoRA target and in --train-modules; pick one")


#: Families whose router peft wraps but cannot run: Phi-3.5-MoE's ``PhimoeTopKRouter`` is an ``nn.Linear``
#: whose forward returns a tuple (modeling_phimoe.py, transformers 5.24), and peft 0.21's ``lora.Linear``
#: forward reads ``result.dtype`` from it (peft tuners/lora/layer.py ``Linear.forward``): the first forward
#: step raises AttributeError (run on CPU with a small PhimoeConfig, ``all-linear``), so no run starts.
LORA_BREAKS: dict[str, str] = {
    "phimoe": "peft wraps its router (PhimoeTopKRouter, an nn.Linear whose forward returns a tuple) and "
    "the first LoRA forward fails (peft 0.21, transformers 5.24)",
}


def _check_breaks(a: DecoderArch, targets: str) -> None:
    why = LORA_BREAKS.get(a.model_type)
    routers = [lin for k in layer_kinds(a) for lin in k.linears(a) if lin.role == "router"]
    if why and any(targeted(a, targets, lin) for lin in routers):
        raise OptionError(
            f"--lora-targets {targets} on {a.model_type}: {why}; name targets without the router, "
            "e.g. --lora-targets attn or q_proj,k_proj,v_proj,o_proj"
        )


#: Multimodal types where `LINEAR_MODULES` (leaf names fixed before peft sees the model) name a module
#: peft cannot wrap, so the run cannot start: the Qwen2-VL / Qwen2.5-VL patch merger's ``mlp`` is an
#: ``nn.Sequential`` whose linears' leaves are ``0`` and ``2`` (modeling_qwen2_vl.py ``PatchMerger``,
#: modeling_qwen2_5_vl.py ``Qwen2_5_VLPatchMerger``, transformers 5.24), and peft matches ``0`` as a
#: suffix of ``visual.blocks.0`` too, a vision block it refuses ("Target module ... is not supported",
#: peft 0.21 tuners/lora/model.py ``_create_new_module``; held by tests/test_peft_reach.py).
LEAF_NAME_BREAKS: dict[str, str] = dict.fromkeys(
    ("qwen2_vl", "qwen2_5_vl"),
    "the patch merger's linears are named 0 and 2, which also name the vision blocks (visual.blocks.0, "
    ".2), and peft refuses to wrap a vision block, so the run cannot start",
)


def _check_leaf_names(a: DecoderArch, wanted: list[str]) -> None:
    rules = [w for w in wanted if w in NAME_RULES]
    if rules and a.model_type in CONV1D_TYPES and len(rules) == len(wanted):
        raise OptionError(
            f"--lora-targets {rules[0]} on {a.model_type}: its projections are transformers Conv1D layers, "
            "which the trainer's rule does not list (no nn.Linear, no 'Linear' in the class name), and peft "
            "refuses the empty list; name them (c_attn,c_proj,c_fc) or use all-linear"
        )
    why = LEAF_NAME_BREAKS.get(a.model_type)
    if why and a.tower_linears and LINEAR_MODULES in wanted:
        raise OptionError(
            f"--lora-targets {LINEAR_MODULES} on {a.model_type}: {why}; use all-linear, "
            "llamafactory-all or named projections"
        )


def _check_fused(a: DecoderArch, wanted: list[str]) -> None:
    """peft refuses to convert one of two v4 names fused into one expert parameter without the other
    (``_convert_peft_config_moe``: "Cannot convert PEFT target(s) ... because they are fused")."""
    renames = peft_moe_renames(a)
    named = {w.split(".")[-1] for w in wanted} & set(renames)
    for target in {renames[n] for n in named}:
        together = sorted(k for k, v in renames.items() if v == target)
        if len(together) > 1 and not set(together) <= named:
            raise OptionError(
                f"--lora-targets on {a.model_type}: peft fuses {' and '.join(together)} into {target} "
                f"and needs both named (it targets the fused experts at rank 2r)"
            )


def _missing(a: DecoderArch, left: list[str]) -> list[str]:
    """The names among ``left`` (named targets peft's MoE conversion left as module names) that match no
    module of this model."""
    names = [*_names(a), *HEAD_MODULES]
    return [w for w in left if not any(_matches(n, w) for n in names)]


def unmatched_targets(a: DecoderArch, targets: str) -> list[str]:
    """Named targets that match no module of this model (none for ``attn`` / ``all-linear``).

    peft's ``inject_adapter`` raises only when nothing at all is targeted ("Target modules ... not found
    in the base model", peft 0.21 tuners/tuners_utils.py); names that match nothing beside names that do
    are ignored, so fitcheck warns about them (`validate_targets` refuses the all-unmatched case)."""
    if targets in ("all-linear", "attn"):
        return []
    return _missing(a, _converted(a, _wanted(expand_targets(a, targets)))[0])


#: Trainers that build LoRA with their own code and refuse a module name their model lacks (torchtune's
#: ``lora_attn_modules`` Literal and builders, litgpt's ``lora_*`` config flags, mlx-lm's ``keys``), so
#: every named target must exist; peft-based trainers ignore unmatched names beside matched ones.
OWN_LORA_TRAINERS = ("torchtune", "litgpt", "mlx")


def validate_targets(a: DecoderArch, targets: str, every_name: bool = False) -> None:
    """Raise `OptionError` when the named targets match no projection of this model at all (peft's own
    error), or any of them matches nothing with ``every_name`` (`OWN_LORA_TRAINERS`), or they reach a
    module that LoRA cannot run on (`LORA_BREAKS`)."""
    _check_breaks(a, targets)
    if targets in ("all-linear", "attn"):
        return
    _check_leaf_names(a, _wanted(targets))
    wanted = _wanted(expand_targets(a, targets))
    if not wanted:
        raise OptionError("--lora-targets is empty: use attn, all-linear or module names")
    _check_fused(a, wanted)
    left, converted = _converted(a, wanted)
    missing = _missing(a, left)
    if missing and (every_name or (not converted and len(missing) == len(left))):
        which = "no module " + ", ".join(f"'{w}'" for w in missing)
        raise OptionError(
            f"--lora-targets: this model has {which}; it has {', '.join([*_names(a), *HEAD_MODULES])} "
            "(or use attn / all-linear)"
        )


def adapter_params_per_layer(a: DecoderArch, setup: LlmSetup, kind: LayerKind) -> int:
    """LoRA parameters in one layer: r(d_in + d_out) per wrapped projection, + d_out with DoRA."""
    total = 0
    for lin in kind.linears(a):
        if targeted(a, setup.lora_targets, lin):
            n, r, d_in, d_out = wrapped(a, setup, lin)
            total += n * (r * (d_in + d_out) + (d_out if setup.dora else 0))
    return total


def per_expert_modules(a: DecoderArch, setup: LlmSetup, lin: Linear) -> bool:
    """A fused 3-D expert parameter that this run holds as per-expert modules instead
    (`quant.expert_modules`: a GPTQ / AWQ base, or transformers 4.x's layout): peft wraps each expert's
    gate, up and down one by one."""
    return is_fused_expert(lin) and expert_modules(a, setup)


def wrapped(a: DecoderArch, setup: LlmSetup, lin: Linear) -> tuple[int, int, int, int]:
    """How peft adapts one targeted projection, per layer: (how many adapted pieces, rank, d_in, d_out)
    of each. A fused expert parameter is one piece per expert at rank ``lora_factor x r``
    (``ParamWrapper``); on a per-expert base it is ``lora_factor`` modules per expert (gate and up for
    ``gate_up_proj``), each at rank r with its own share of the outputs."""
    if per_expert_modules(a, setup, lin):
        k = lin.lora_factor
        return lin.copies * k, setup.lora_rank, lin.d_in, lin.d_out // k
    return lin.copies, setup.lora_rank * lin.lora_factor, lin.d_in, lin.d_out


def tower_targets(a: DecoderArch, targets: str) -> tuple[tuple[int, int, int], ...]:
    """The vision tower's and projector's ``nn.Linear`` layers LoRA wraps, as (d_in, d_out, how many):
    all of them under ``all-linear`` (peft resolves it to every ``nn.Linear`` of the model but the output
    layer), none under ``attn`` or module names (which fitcheck matches in the language model only).
    `LINEAR_MODULES` takes them all too: ``find_all_linear_names`` lists the tower's leaf names and peft
    matches each in the tower. `LMF_ALL` leaves the tower and projector out (``freeze_vision_tower``
    and ``freeze_multi_modal_projector`` at their default, true). Leaf names also reach the tower
    convolutions that share one (``tower_convs``: Qwen3-VL's ``patch_embed.proj``, a Conv3d peft wraps)."""
    if LINEAR_MODULES in _wanted(targets):
        return (*a.tower_linears, *a.tower_convs)
    return a.tower_linears if targets == "all-linear" else ()


def tower_adapter_params(a: DecoderArch, setup: LlmSetup) -> int:
    """LoRA parameters on the tower's linears: r (d_in + d_out) each (+ d_out with DoRA)."""
    r, dora = setup.lora_rank, setup.dora
    return sum(n * (r * (i + o) + (o if dora else 0)) for i, o, n in tower_targets(a, setup.lora_targets))


def adapter_params(a: DecoderArch, setup: LlmSetup) -> int:
    """All LoRA (and DoRA magnitude) parameters of the model; under prefix tuning the prefix encoder's."""
    if setup.method == PREFIX:
        from fitcheck.engine import prefix

        return prefix.params(a, setup)
    layers = sum(k.count * adapter_params_per_layer(a, setup, k) for k in layer_kinds(a))
    return layers + head_adapter_params(a, setup) + tower_adapter_params(a, setup)


#: LoRA-FA (``--lora-fa``): peft's ``create_lorafa_optimizer`` calls ``requires_grad_(False)`` on every
#: parameter whose name holds ``lora_A`` and keeps AdamW states for ``lora_B`` only (``exp_avg_B``,
#: ``exp_avg_sq_B`` = ``zeros_like(B)``), src/peft/optimizers/lorafa.py @01ee6424. An embedding's factor
#: is ``lora_embedding_A``, which the name test misses: it still trains.
SRC_LORA_FA = "peft src/peft/optimizers/lorafa.py @01ee6424 create_lorafa_optimizer: lora_A frozen"


def frozen_a_params(a: DecoderArch, setup: LlmSetup) -> int:
    """LoRA ``A`` factors that LoRA-FA freezes: r x d_in per wrapped projection, and lm_head's r x h."""
    if not setup.lora_fa or setup.method == "full":
        return 0
    total = 0
    for kind in layer_kinds(a):
        per_layer = sum(
            n * r * d_in
            for n, r, d_in, _ in (
                wrapped(a, setup, lin) for lin in kind.linears(a) if targeted(a, setup.lora_targets, lin)
            )
        )
        total += kind.count * per_layer
    if "lm_head" in head_targets(setup.lora_targets):
        total += setup.lora_rank * a.hidden_size
    total += sum(n * setup.lora_rank * i for i, _, n in tower_targets(a, setup.lora_targets))
    return total
