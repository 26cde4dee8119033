"""Class colours: Paul Tol's colour-blind-safe "muted" scheme, one colour per class.

Colours go to classes by bytes at stake (largest first), so the classes a person decides first
get the most distinct colours, and the same analysis always gets the same colours. More classes
than colours cycle through the scheme again. Replicated tensors are drawn in NEUTRAL, so the
colours on the graph are the classes the plan shards.

Tol, "Colour Schemes", SRON/EPS/TN/09-002 (2021): the muted scheme stays distinct for the
common colour-vision deficiencies and readable on white.
"""

from __future__ import annotations

MUTED = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677",
         "#882255", "#AA4499")
NEUTRAL = "#9AA0A6"        # replicated tensors, edges with no sharded class
GROUP_FILL = "#EEF1F5"     # collapsed groups
CONFLICT = "#B3261E"       # conflict sites' border
COLLECTIVE = "#8A4B00"     # collective badges on edges


def class_colors(classes) -> tuple[str, ...]:
    """The colour of each class (index == class id), stable for a given analysis."""
    order = sorted(classes, key=lambda c: (-c.bytes, c.id))
    out = [""] * len(order)
    for rank, c in enumerate(order):
        out[c.id] = MUTED[rank % len(MUTED)]
    return tuple(out)


def tint(color: str, amount: float = 0.82) -> str:
    """`color` mixed with white (amount 1: white): a light fill that keeps the hue."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c + (255 - c) * amount)  # noqa: E731
    return f"#{mix(r):02X}{mix(g):02X}{mix(b):02X}"
