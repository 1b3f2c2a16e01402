"""One colour per component, the same in every chart (estimate bars, plan, timeline).

Components are grouped into the categories a user reads a memory picture by (weights, gradients,
optimizer states, activations, temporaries, overhead); each category has a hue, each component in
it a shade of that hue, so a stacked bar reads by colour family before its legend is read. The
timeline of a traced step (categories only) uses the category colours themselves. Pure data: no
plotting library is imported here.
"""

from __future__ import annotations

import hashlib

#: Category of each component id (docs/json.md lists them; diffusion parts end in ``_weights``).
CATEGORY_OF: dict[str, str] = {
    "weights": "weights",
    "weights_frozen": "weights",
    "weights_4bit": "weights",
    "weights_unquantized": "weights",
    "adapters": "weights",
    "merged_expert_weights": "temporaries",
    "autocast_weight_copies": "temporaries",
    "weight_casts": "temporaries",
    "dequant_transient": "temporaries",
    "gradients": "gradients",
    "tied_embedding_grads": "gradients",
    "activation_gradients": "gradients",
    "optimizer_states": "optimizer states",
    "master_weights": "optimizer states",
    "optimizer_transient": "temporaries",
    "inputs": "activations",
    "activations": "activations",
    "attention_scores": "activations",
    "checkpoints": "activations",
    "final_norm": "activations",
    "logits_loss": "activations",
    "held_logits": "activations",
    "layer_recompute": "activations",
    "vae_encode": "activations",
    "text_encoder_activations": "activations",
    "backward_temporaries": "temporaries",
    "allocator_reserve": "overhead",
    "cuda_context": "overhead",
}

#: Category colours (Okabe-Ito based: distinguishable with the common colour-vision deficiencies).
CATEGORY_COLOUR: dict[str, str] = {
    "weights": "#0072B2",
    "gradients": "#E69F00",
    "optimizer states": "#CC79A7",
    "activations": "#009E73",
    "temporaries": "#D55E00",
    "overhead": "#999999",
    "other": "#56B4E9",
}

#: Order of categories from the bottom of a stack to its top.
CATEGORY_ORDER: tuple[str, ...] = (
    "weights", "gradients", "optimizer states", "activations", "temporaries", "overhead", "other",
)  # fmt: skip


def category(component: str) -> str:
    """The category a component id belongs to (``*_weights`` parts of diffusion models are weights)."""
    if component in CATEGORY_OF:
        return CATEGORY_OF[component]
    if component.endswith("_weights"):
        return "weights"
    return "other"


def _shade(hex_colour: str, step: int) -> str:
    """Lighten (even steps) or darken (odd steps) a colour by a step-sized fraction."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    k = 0.18 * ((step + 1) // 2)
    if step % 2:  # darker
        r, g, b = (round(v * (1 - k)) for v in (r, g, b))
    else:  # lighter
        r, g, b = (round(v + (255 - v) * k) for v in (r, g, b))
    return f"#{r:02x}{g:02x}{b:02x}"


def colour(component: str) -> str:
    """The component's colour: its category's hue, shaded by its place among that category's ids."""
    cat = category(component)
    base = CATEGORY_COLOUR[cat]
    members = sorted(c for c, k in CATEGORY_OF.items() if k == cat)
    if component in members:
        step = members.index(component)
    else:  # a part name (unet_weights) or a new id: a stable shade from its name
        step = int(hashlib.sha256(component.encode()).hexdigest(), 16) % 4
    return _shade(base, step) if step else base
