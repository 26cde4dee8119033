"""A plan as the kernel reads it: one bit mask and one rank per *split class*, one index per
conflict.

A split class is a class within one domain (analysis/_domains.py): `embed` among the
activations, `embed` among the parameters, `embed` in the optimizer state. The kernel sees each
as a class of its own, so a plan that shards a class differently in two domains (MaxText's
weights on FSDP and activations on the tensor axis; ZeRO's optimizer state over the data
devices) is costed with no new kernel code: an op that reads one domain and writes another —
a matmul reading a weight, an Adam update reading a gradient, the parameter update reading
the step — finds its operands and results sharded differently and pays the reshard there, like
any other. Split class `c` is class `c` in its main domain (compute where it has any); the
others follow, numbered after the classes. Without overrides every split class of a class has
the class's mask and rank, so the estimate is the one without domains.

Both the cost model (from a `Plan`) and the search (from a choice vector) build these, through
`plan_arrays`, so the encoding lives here once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, NamedTuple

import numpy as np

from ..analysis import DOMAINS, NO_CLASS, domains

# The rank of a class never decided: after every decided one.
UNDECIDED = 1 << 30
# A class's mask holds its mesh axes as bits below ORDER_SHIFT, and above it, where the plan
# lists them out of mesh order (("model", "data")), that order: 4 bits per place, major first,
# each the axis's bit index + 1 (0 above ORDER_SHIFT: mesh order). XLA tiles a dim in the
# order its axes are listed, and reshards that leave them in another pay a collective-permute
# (the kernel's _out_of_order); everything else reads `mask & AXES`.
ORDER_SHIFT = 32
AXES = (1 << ORDER_SHIFT) - 1


class PlanArrays(NamedTuple):
    """mask[class]: its mesh axes as bits (see `axis_bits`), and their order where it is not
    mesh order (ORDER_SHIFT); rank[class]: its place in the decision order (the class decided
    first keeps an axis two classes of one value want); resolution[conflict]: the index of its
    resolution in `Conflict.resolutions`."""

    mask: np.ndarray
    rank: np.ndarray
    resolution: np.ndarray


def axis_bits(mesh) -> dict[str, int]:
    """{mesh axis name: its bit}, in mesh order."""
    return {a: 1 << i for i, a in enumerate(mesh.axis_names)}


def axes_mask(axis_bit: dict[str, int], axes) -> int:
    """The mask of mesh axes `axes` (names, in the plan's order) under `axis_bit`: their bits,
    and their order above ORDER_SHIFT where it is not mesh order (an axis of bit 0, a size-1
    axis, takes no place)."""
    bits = [axis_bit[a] for a in axes if axis_bit[a]]
    mask = sum(bits)
    if bits != sorted(bits):
        for place, bit in enumerate(bits):
            mask |= bit.bit_length() << (ORDER_SHIFT + 4 * place)
    return mask


def live_axis_bits(mesh) -> dict[str, int]:
    """axis_bits with the bit of each axis of one device cleared: such an axis splits nothing
    (XLA emits no collective over it), so a class over it costs what it costs replicated."""
    return {a: b if mesh.axis_size(a) > 1 else 0 for a, b in axis_bits(mesh).items()}


@dataclass(frozen=True, eq=False)
class SplitClasses:
    """The split classes of one analysis (see the module docstring).

    base[s]: the class of split class s; domain[s]: its domain (a name in DOMAINS).
    index: {(class id, domain): split class}. splits_of[c]: the split classes of class c.
    value_classes[v]: per dim of value v, its split class (NO_CLASS for size-1 dims).
    conflict_class[k]: the split class a conflict is about (its class in its site's domain).
    """

    base: np.ndarray
    domain: tuple[str, ...]
    index: dict
    splits_of: tuple[tuple[int, ...], ...]
    value_classes: tuple[tuple[int, ...], ...]
    conflict_class: np.ndarray

    @property
    def trivial(self) -> bool:
        """Every class lives in one domain: split classes are the classes."""
        return len(self.base) == len(self.splits_of)


def split_classes(analysis) -> SplitClasses:
    """The SplitClasses of `analysis`, built once and kept with it."""
    return analysis.derived("cost.split_classes", lambda: _build_split(analysis))


def _build_split(an) -> SplitClasses:
    dom = domains(an).of_value
    present = [set() for _ in an.classes]
    for v, classes in enumerate(an.value_classes):
        for c in classes:
            if c != NO_CLASS:
                present[c].add(int(dom[v]))
    C = len(an.classes)
    base, domain = list(range(C)), [DOMAINS[min(p, default=0)] for p in present]
    index = {(c, domain[c]): c for c in range(C)}
    for c in range(C):
        for d in sorted(present[c]):
            if (c, DOMAINS[d]) not in index:
                index[(c, DOMAINS[d])] = len(base)
                base.append(c)
                domain.append(DOMAINS[d])
    splits_of = [[] for _ in range(C)]
    for s, c in enumerate(base):
        splits_of[c].append(s)
    value_classes = tuple(
        tuple(c if c == NO_CLASS else index[(c, DOMAINS[dom[v]])] for c in classes)
        for v, classes in enumerate(an.value_classes))
    conflict_class = np.array([index[(k.class_id, DOMAINS[dom[k.site_value]])]
                               for k in an.conflicts], np.int64)
    return SplitClasses(np.array(base, np.int64), tuple(domain), index,
                        tuple(tuple(s) for s in splits_of), value_classes, conflict_class)


def plan_arrays(analysis, class_masks: Iterable[tuple[int, int]],
                resolutions: Iterable[tuple[int, int]] = (),
                overrides: Iterable[tuple[int, str, int]] = ()) -> PlanArrays:
    """The PlanArrays of (class id, mask) decisions in order, (conflict id, resolution index)
    pairs and (class id, domain, mask) overrides; classes not listed are replicated, conflicts
    not listed keep resolution 0. A split class takes its domain's override, else its class's
    mask, and always its class's rank (an override does not move a class in the decision order;
    list a class with an override among the decisions, replicated if need be, to rank it)."""
    mask = np.zeros(len(analysis.classes), np.int64)
    rank = np.full(len(analysis.classes), UNDECIDED, np.int64)
    for i, (k, m) in enumerate(class_masks):
        mask[k] = m
        rank[k] = i
    resolution = np.zeros(len(analysis.conflicts), np.int64)
    for k, r in resolutions:
        resolution[k] = r
    overrides = tuple(overrides)
    split = split_classes(analysis)
    if split.trivial and not overrides:
        return PlanArrays(mask, rank, resolution)
    mask, rank = mask[split.base], rank[split.base]
    for k, domain, m in overrides:
        s = split.index.get((k, domain))
        if s is not None:  # the class has no value in that domain: nothing to shard
            mask[s] = m
    return PlanArrays(mask, rank, resolution)


def as_plan_arrays(mask, rank, resolution) -> PlanArrays:
    """PlanArrays of int64 arrays, the only kind the compiled kernel takes."""
    return PlanArrays(np.ascontiguousarray(mask, np.int64),
                      np.ascontiguousarray(rank, np.int64),
                      np.ascontiguousarray(resolution, np.int64))
