"""One colour per component, the same in every chart (estimate bars, plan, timeline).

Components are grouped into the categories a user reads a memory picture by (weights, gradients,
optimizer states, activations, temporaries, overhead); each category has a hue, each component in
it a shade of that hue, so a stacked bar reads by colour family before its legend is read. The
timeline of a traced step (categories only) uses the category colours themselves. The category of a
component is the registry's (`fitcheck.components.ComponentId.category`). Pure data: no plotting
library is imported here.
"""

from __future__ import annotations

import hashlib

from fitcheck.components import REGISTRY

#: The chart's own segments that are not phase components: the estimate's reserve and context lines.
OVERHEAD_SEGMENTS = ("allocator_reserve", "cuda_context")

#: Category of each component id: the registry's (fitcheck.components), plus the overhead segments.
CATEGORY_OF: dict[str, str] = {row.id: row.category for row in REGISTRY.values()}
CATEGORY_OF |= dict.fromkeys(OVERHEAD_SEGMENTS, "overhead")

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
    """The category a component id belongs to; ``other`` for a name the registry does not hold."""
    return CATEGORY_OF.get(component, "other")


def _shade(hex_colour: str, step: int, count: int) -> str:
    """Step ``step`` of ``count`` shades: darker (odd steps) or lighter (even steps), further out as the
    step grows, spread so the last one stays within 60% of the way to black or white."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    k = 0.6 * ((step + 1) // 2) / (count // 2 + 1)
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
        step, count = members.index(component), len(members)
    else:  # a name the registry does not hold: a stable shade from its name
        step, count = int(hashlib.sha256(component.encode()).hexdigest(), 16) % 4, 4
    return _shade(base, step, count) if step else base
