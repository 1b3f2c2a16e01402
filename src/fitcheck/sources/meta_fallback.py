"""Size a ``model_type`` without a table row from transformers itself, on the meta device.

transformers builds the model from the config with no weights (``torch.device("meta")``), which gives
the exact parameter inventory. The shape fields the engine needs (width, depth, heads, MLP width,
vocabulary) come from the shared config keys, so activations follow the generic decoder rule; the
parameters the generic shape does not account for are carried as ``misc_params`` so the total is the
model's own. Both facts are returned as a warning for the estimate. Only types transformers ships are
built (no ``trust_remote_code``: fitcheck never runs a repository's code).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from fitcheck.engine.params import count_params
from fitcheck.errors import ModelSourceError
from fitcheck.models import DecoderArch
from fitcheck.sources.hf_config import FAMILIES, KEYS, UnsupportedTypeError, _fields
from fitcheck.terminal import clipped

#: The head classes tried, in order: a causal LM, then a multimodal or encoder-decoder model with its
#: lm_head (GLM-4.1V, SmolVLM, Idefics3, LLaVA-NeXT are not causal-LM types; their bare AutoModel leaves the
#: lm_head out), then the bare model.
_AUTO_CLASSES = ("AutoModelForCausalLM", "AutoModelForImageTextToText", "AutoModelForSeq2SeqLM", "AutoModel")

#: Sequence mixers that are not attention, by the class names transformers 5.24 gives them: Gated DeltaNet
#: (Qwen3_5GatedDeltaNet, also inside MiniCPM-V 4.6/4.7), delta attention (BailingHybridDeltaAttention),
#: short convolutions (Lfm3ShortConv, InklingShortConvolution), Mamba mixers, linear / lightning attention,
#: recurrent blocks. A model holding one is a hybrid the attention rule does not size (`HYBRID_TYPES`).
_NON_ATTENTION = re.compile(
    r"DeltaNet|DeltaAttention|ShortConv|Mamba|LinearAttention|LightningAttention|RecurrentBlock|RGLRU"
)


def _first_line(exc: BaseException) -> str:
    """The first sentence of an exception's message on one line, clipped: one line a person reads. A
    message whose first line only introduces the next ("Validation error for field 'x':", transformers'
    strict dataclass check) keeps that next line."""
    text = " ".join(line.strip() for line in str(exc).strip().splitlines() if line.strip())
    return clipped((text or type(exc).__name__).split(". ")[0], 240)


def _build_on_meta(cfg: Mapping[str, Any]) -> Any:
    """The model transformers builds from ``cfg`` on the meta device (no weights)."""
    import torch
    import transformers as tf

    model_type = str(cfg["model_type"])
    kw = {k: v for k, v in cfg.items() if k != "model_type"}
    with _quiet_transformers():
        return _build_quietly(tf, torch, model_type, kw)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' own logger held at errors while it reads and builds: its configuration classes warn
    on stderr about keys they do not check (Qwen2.5-Omni's token ids "must be within the vocabulary", seven
    lines), and fitcheck's stderr carries its own warnings and one error line only."""
    from transformers.utils import logging as tf_logging

    level = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        yield
    finally:
        tf_logging.set_verbosity(level)


#: transformers' strict config check on a JSON integer where its dataclass types a float (DBRX's published
#: ``ffn_config.moe_normalize_expert_weights: 1`` against ``float | None`` in transformers 5.24): JSON has
#: one number type, so the value is read as the float it stands for and the config read again.
_INT_FOR_FLOAT = re.compile(r"Field '(\w+)' with value (-?\d+) doesn't match any type in \(<class 'float'>")
#: At most this many such fields are mended before the error stands.
MAX_FLOAT_MENDS = 8


def _as_float(kw: Any, field: str) -> bool:
    """Turn every integer value of ``field`` in ``kw`` (nested configs included) into a float; whether one
    changed."""
    changed = False
    if isinstance(kw, dict):
        for key, value in kw.items():
            if key == field and isinstance(value, int) and not isinstance(value, bool):
                kw[key] = float(value)
                changed = True
            else:
                changed = _as_float(value, field) or changed
    return changed


def _read_config(tf: Any, model_type: str, kw: dict[str, Any]) -> Any:
    """transformers' config for ``kw``, an integer read as the float its field types (`_INT_FOR_FLOAT`)."""
    for _ in range(MAX_FLOAT_MENDS + 1):
        try:
            return tf.AutoConfig.for_model(model_type, **kw)
        except Exception as exc:  # transformers' own validation, whatever it raises
            found = _INT_FOR_FLOAT.search(str(exc))
            if found is None or not _as_float(kw, found.group(1)):
                raise ModelSourceError(
                    f"transformers cannot read this {model_type} config: {_first_line(exc)}"
                ) from None
    raise ModelSourceError(f"transformers cannot read this {model_type} config: too many integer floats")


def _build_quietly(tf: Any, torch: Any, model_type: str, kw: dict[str, Any]) -> Any:
    config = _read_config(tf, model_type, copy.deepcopy(kw))
    # a config with a vision tower builds its image-text-to-text class first: transformers maps some such
    # types' causal LM to the text model alone (mllama -> MllamaForCausalLM, without the tower and projector
    # the checkpoint holds: Llama-3.2-11B-Vision sized 9.78B against its 10.67B)
    order: tuple[str, ...] = _AUTO_CLASSES
    if isinstance(kw.get("vision_config"), Mapping):
        vlm = "AutoModelForImageTextToText"
        order = (vlm, *(n for n in _AUTO_CLASSES if n != vlm))
    with torch.device("meta"):
        for name in order:
            try:
                return getattr(tf, name).from_config(config)
            except (ValueError, KeyError):
                continue
            except ImportError as exc:  # a tower needing a package transformers lacks here (Gemma 3n: timm)
                why = _first_line(exc)
                raise ModelSourceError(
                    f"transformers cannot build model_type '{model_type}' here to count it: {why}"
                ) from None
            except Exception as exc:  # the modeling code rejects this config (a key it needs left null:
                # Chameleon's vocabulary_map, DBRX's attn_config rope_theta)
                raise ModelSourceError(
                    f"transformers cannot build model_type '{model_type}' from this config: "
                    f"{type(exc).__name__}: {_first_line(exc)}"
                ) from None
    raise ModelSourceError(f"transformers has no model class for model_type '{model_type}'")


def non_attention_mixers(model: Any) -> list[str]:
    """The class names of the model's sequence mixers that are not attention (`_NON_ATTENTION`)."""
    return sorted({type(m).__name__ for m in model.modules() if _NON_ATTENTION.search(type(m).__name__)})


def meta_parameter_count(cfg: Mapping[str, Any]) -> int:
    """``sum(p.numel() for p in model.parameters())`` of the model transformers builds from ``cfg``.

    Raises:
        ModelSourceError: transformers cannot build it, or it interleaves attention with other mixers.
    """
    return _meta_facts(cfg)[0]


def _meta_facts(cfg: Mapping[str, Any]) -> tuple[int, bool]:
    """The built model's parameter count and whether its output head is the input embedding (tied, or
    no head): what the config's keys cannot say for a type without a table row (GPT-BigCode ties by its
    class default, which a config leaves out)."""
    model = _build_on_meta(cfg)
    mixers = non_attention_mixers(model)
    if mixers:
        raise ModelSourceError(
            f"model_type '{cfg['model_type']}' interleaves attention with layers that are not attention "
            f"({', '.join(mixers)}); fitcheck models transformer layers only, so it cannot estimate it yet"
        )
    return sum(p.numel() for p in model.parameters()), _ties_its_head(model)


def _ties_its_head(model: Any) -> bool:
    """Whether the built model's output head is its input embedding (or it has no head). A model whose
    accessors are not implemented (PP-FormulaNet: ``get_input_embeddings`` raises NotImplementedError)
    reads as tied: the generic shape then counts no separate head, and `misc_params` carries the rest."""
    try:
        out = model.get_output_embeddings()
        inp = model.get_input_embeddings()
    except Exception:  # transformers' own accessors, whatever a subclass raises
        return True
    head = getattr(out, "weight", None)
    return head is None or (inp is not None and head is getattr(inp, "weight", None))


#: Where a multimodal or encoder-decoder wrapper keeps its language model's keys (transformers
#: ``text_config`` for GLM-4.1V / 4.5V, SmolVLM, Idefics3, Gemma 3n; ``llm_config`` / ``language_config``
#: in InternVL-style remote configs; ``decoder`` for T5Gemma).
_NESTED_TEXT = ("text_config", "llm_config", "language_config", "decoder")


def _flat_width(value: Any) -> Any:
    """A per-layer list of MLP widths (Gemma 3n) as its widest layer: the activation rule takes one width,
    and the widest layer bounds what any layer saves."""
    return max(value) if isinstance(value, list) and value else value


#: Aliases the generic shape also reads: XGLM's ``attention_heads`` and ``ffn_dim``.
_MORE_KEYS = {"num_heads": ("attention_heads",), "intermediate_size": ("ffn_dim",)}
#: Shape keys a config nests in per-block sub-configs, under the names the generic shape reads: DBRX's
#: ``ffn_config`` (each expert's width, experts per token) and ``attn_config`` (key/value heads), as
#: transformers' DbrxFFNConfig / DbrxAttentionConfig name them (configuration_dbrx.py).
_BLOCK_KEYS = {
    "ffn_config": {"ffn_hidden_size": "moe_intermediate_size", "moe_top_k": "num_experts_per_tok"},
    "attn_config": {"kv_n_heads": "num_key_value_heads"},
}


def _has_shape(cfg: Mapping[str, Any]) -> bool:
    return all(
        any(cfg.get(k) is not None for k in KEYS[f]) for f in ("hidden_size", "num_layers", "num_heads")
    )


def _mlp_width(cfg: Mapping[str, Any], hidden: int) -> tuple[int, str]:
    """The per-token MLP width the activation rule takes, and where it came from: the config's dense width;
    else a mixture of experts' routed width (``moe_intermediate_size`` x experts per token, plus any shared
    experts'); else 4 x hidden, the width GPT-2-style models take when ``n_inner`` is null (GPT-2, GPT-Neo,
    CodeGen, GPT-BigCode modeling files)."""
    for key in (*KEYS["intermediate_size"], *_MORE_KEYS["intermediate_size"]):
        if cfg.get(key) is not None:
            return int(_flat_width(cfg[key])), key
    expert = cfg.get("moe_intermediate_size")
    top_k = cfg.get("num_experts_per_tok") or cfg.get("moe_k") or cfg.get("moe_topk")
    if isinstance(expert, int) and isinstance(top_k, int):
        shared = cfg.get("n_shared_experts") or cfg.get("num_shared_experts") or 0
        return expert * (top_k + (shared if isinstance(shared, int) else 0)), "the active experts' width"
    return 4 * hidden, "4 x hidden, as GPT-2-style models take it"


def shape_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The keys the generic decoder shape reads: the top level, or, when the top level does not give the
    width, depth and heads, the language model's nested config (a wrapper's own keys stay out); a per-layer
    list of MLP widths as its widest layer; the MLP width from `_mlp_width` when none is stated."""
    top = dict(cfg)
    if not _has_shape(top):
        for sub in _NESTED_TEXT:
            inner = cfg.get(sub)
            if isinstance(inner, Mapping) and _has_shape(inner):
                top = {**inner, "model_type": cfg.get("model_type")}
                break
    for block, names in _BLOCK_KEYS.items():
        inner = top.get(block)
        if isinstance(inner, Mapping):
            top.update(
                {
                    ours: inner[theirs]
                    for theirs, ours in names.items()
                    if top.get(ours) is None and theirs in inner
                }
            )
    for key in _MORE_KEYS["num_heads"]:
        if top.get(key) is not None and not any(top.get(k) is not None for k in KEYS["num_heads"]):
            top["num_attention_heads"] = top[key]
    hidden = next((top[k] for k in KEYS["hidden_size"] if isinstance(top.get(k), int)), None)
    if hidden is not None:
        top["intermediate_size"], top["_mlp_width_from"] = _mlp_width(top, hidden)
    return top


def _closest(base: DecoderArch, exact: int) -> DecoderArch:
    """Of the generic variants (gated or plain MLP, RMS or LayerNorm, with or without biases; the key/value
    heads the config states, or one, as a multi-query model's ``multi_query`` flag gives them to
    GPT-BigCode and Falcon, whose configs name no ``num_key_value_heads``), the one whose count is closest
    below the exact total (else the smallest overcount)."""
    variants = [
        base.model_copy(
            update={"mlp": mlp, "norm": norm, "qkv_bias": b, "o_bias": b, "mlp_bias": b, "num_kv_heads": kv}
        )
        for kv in dict.fromkeys((base.num_kv_heads, 1))
        for mlp in ("gated", "plain")
        for norm in ("rms", "layer")
        for b in (False, True)
    ]
    below = [v for v in variants if count_params(v) <= exact]
    if below:
        return min(below, key=lambda v: exact - count_params(v))
    return min(variants, key=lambda v: count_params(v) - exact)


def arch_from_meta(cfg: Mapping[str, Any], why: UnsupportedTypeError) -> tuple[DecoderArch, tuple[str, ...]]:
    """A generic decoder shape for ``cfg`` whose total is transformers' exact count, and the warning.

    Raises:
        UnsupportedTypeError: the torch extra is not installed (its message names the supported types
            and the extra), or transformers does not know the type either.
    """
    try:
        import torch  # noqa: F401
        import transformers
    except ImportError:
        raise why from None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = str(cfg.get("model_type"))
    if model_type not in CONFIG_MAPPING_NAMES:
        raise UnsupportedTypeError(why.model_type, transformers.__version__) from None
    exact, tied = _meta_facts(cfg)
    try:
        shape = shape_config(cfg)
        fields = _fields(shape, FAMILIES["llama"], model_type)
        arch = DecoderArch(**{**fields, "tie_embeddings": tied})
    except (ModelSourceError, ValueError, TypeError) as exc:
        raise ModelSourceError(
            f"model_type '{model_type}': transformers counts {exact:,} parameters but its config lacks the "
            f"shape keys fitcheck needs for activations ({exc})"
        ) from None
    arch = _closest(arch, exact)
    generic = count_params(arch)
    note = (
        f"model_type '{model_type}' is not modelled natively: parameters are transformers' own count "
        f"({exact:,}, built on the meta device with transformers {transformers.__version__}); activations "
        f"follow the generic decoder rule ({arch.mlp} MLP, {arch.norm} norm, MLP width "
        f"{arch.intermediate_size:,} from {shape.get('_mlp_width_from', 'intermediate_size')})"
    )
    if exact < generic:
        # the total would not be the model's: an estimate on it is wrong by construction, so refuse
        raise ModelSourceError(
            f"model_type '{model_type}' is not modelled natively and transformers counts {exact:,} "
            f"parameters, fewer than the generic decoder shape its config gives ({generic:,}), so fitcheck "
            "cannot estimate it yet"
        )
    return arch.model_copy(update={"misc_params": exact - generic}), (note,)
