"""A plan as the kernel reads it: one bit mask and one rank per class, one index per conflict.

Both the cost model (from a `Plan`) and the search (from a choice vector) build these, through
`plan_arrays`, so the encoding lives here once.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

import numpy as np

# The rank of a class never decided: after every decided one.
UNDECIDED = 1 << 30


class PlanArrays(NamedTuple):
    """mask[class]: its mesh axes as bits (see `axis_bits`); rank[class]: its place in the
    decision order (the class decided first keeps an axis two classes of one value want);
    resolution[conflict]: the index of its resolution in `Conflict.resolutions`."""

    mask: np.ndarray
    rank: np.ndarray
    resolution: np.ndarray


def axis_bits(mesh) -> dict[str, int]:
    """{mesh axis name: its bit}, in mesh order."""
    return {a: 1 << i for i, a in enumerate(mesh.axis_names)}


def plan_arrays(analysis, class_masks: Iterable[tuple[int, int]],
                resolutions: Iterable[tuple[int, int]] = ()) -> PlanArrays:
    """The PlanArrays of (class id, mask) decisions in order and (conflict id, resolution
    index) pairs; classes not listed are replicated, conflicts not listed keep resolution 0."""
    mask = np.zeros(len(analysis.classes), np.int64)
    rank = np.full(len(analysis.classes), UNDECIDED, np.int64)
    for i, (k, m) in enumerate(class_masks):
        mask[k] = m
        rank[k] = i
    resolution = np.zeros(len(analysis.conflicts), np.int64)
    for k, r in resolutions:
        resolution[k] = r
    return PlanArrays(mask, rank, resolution)


def as_plan_arrays(mask, rank, resolution) -> PlanArrays:
    """PlanArrays of int64 arrays, the only kind the compiled kernel takes."""
    return PlanArrays(np.asarray(mask, np.int64), np.asarray(rank, np.int64),
                      np.asarray(resolution, np.int64))
