"""Class colours: Paul Tol's colour-blind-safe "muted" scheme, then his "light" one.

The legend shows the classes the plan shards and the LEGEND_TOP largest by bytes at stake that
are not minor, each in a colour no other shown class has; every other class is NEUTRAL, like
replicated tensors, so the colours on the graph are the classes the plan shards. The largest
classes take the first colours whatever the plan, so a pin does not repaint them; the other
shown classes take the next colours, largest first. Colours depend on the analysis and the
set shown only: the same plan is drawn alike in the Lab, a plan file and `display(plan)`.

Tol, "Colour Schemes", SRON/EPS/TN/09-002 (2021): the muted scheme stays distinct for the
common colour-vision deficiencies and readable on white; the light scheme (without its grey)
adds eight more for plans that shard many classes.
"""

from __future__ import annotations

import colorsys

MUTED = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677",
         "#882255", "#AA4499")
NEUTRAL = "#9AA0A6"        # replicated tensors, edges with no sharded class
GROUP_FILL = "#EEF1F5"     # collapsed groups
CONFLICT = "#B3261E"       # conflict sites' border
COLLECTIVE = "#8A4B00"     # collective badges on edges
IDLE = "#B0B5BB"           # a conflict site whose class is replicated: no warning
LIGHT = ("#77AADD", "#EE8866", "#EEDD88", "#FFAABB", "#99DDFF", "#44BB99", "#BBCC33",
         "#AAAA00")
PALETTE = MUTED + LIGHT
LEGEND_TOP = 5             # classes the legend shows besides those the plan shards


def top_classes(classes, top: int = LEGEND_TOP) -> tuple[int, ...]:
    """Ids of the `top` classes with the most bytes at stake that are not minor, largest
    first."""
    order = sorted((c for c in classes if not c.minor), key=lambda c: (-c.bytes, c.id))
    return tuple(c.id for c in order[:top])


def legend_classes(classes, sharded, top: int = LEGEND_TOP) -> tuple[int, ...]:
    """Ids of the classes the legend shows: the top classes and every class in `sharded`
    (ids), largest at stake first."""
    shown = set(top_classes(classes, top)) | set(sharded)
    return tuple(c.id for c in sorted(classes, key=lambda c: (-c.bytes, c.id)) if c.id in shown)


def class_colors(classes, shown, top: int = LEGEND_TOP) -> tuple[str, ...]:
    """The colour of each class (index == class id): the top classes the first colours of
    PALETTE, the other `shown` ones (ids) the next ones, largest first; every other class
    NEUTRAL. No two shown classes share a colour (past PALETTE, hues are spread evenly)."""
    first = top_classes(classes, top)
    out = [NEUTRAL] * len(classes)
    for i, k in enumerate(first):
        out[k] = PALETTE[i]
    rest = [c for c in sorted(classes, key=lambda c: (-c.bytes, c.id))
            if c.id in set(shown) and c.id not in first]
    for j, c in enumerate(rest, start=len(first)):
        out[c.id] = PALETTE[j] if j < len(PALETTE) else _spread(j - len(PALETTE))
    return tuple(out)


def _spread(i: int) -> str:
    """The i-th of as many more colours as needed: hues a golden angle apart, mid-tone."""
    r, g, b = colorsys.hls_to_rgb((0.11 + i * 0.381966) % 1.0, 0.45, 0.55)
    return f"#{round(r * 255):02X}{round(g * 255):02X}{round(b * 255):02X}"


def tint(color: str, amount: float = 0.82) -> str:
    """`color` mixed with white (amount 1: white): a light fill that keeps the hue."""
    r, g, b = (int(color[i:i + 2], 16) for i in (1, 3, 5))
    mix = lambda c: round(c + (255 - c) * amount)  # noqa: E731
    return f"#{mix(r):02X}{mix(g):02X}{mix(b):02X}"
