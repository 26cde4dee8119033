"""Phase 1, masks: where every value type lives under a plan.

Reads the plan (PlanArrays: per split class its mesh-axis mask and rank, per conflict its
resolution) and the type tables; writes `eff[T, D]`, the mesh-axis bits of each dim of each
value type, `vmask[T]`, their union, and `consensus[G]`, the axes every member of a
contraction group shares (what the op computes on).
"""

from __future__ import annotations


from ._jit import inline, jit
from .._plan_arrays import AXES


@jit
def type_masks(plan, tables, eff, vmask, ranks, dims):
    """Fills eff[T, D] and vmask[T] (ranks[D] and dims[D] are scratch)."""
    for t in range(tables.value_classes.shape[0]):
        vmask[t] = type_mask(t, plan, tables, eff, ranks, dims)


@inline
def type_mask(t, plan, tables, eff, ranks, dims):
    """Fills eff[t] and returns value type t's vmask (ranks[D] and dims[D] are scratch).

    Where a conflict resolution drops a dim, it is replicated; where two classes want one axis,
    the class decided first (lower rank) keeps it.
    """
    mask, rank, res = plan.mask, plan.rank, plan.resolution
    value_classes, value_tags = tables.value_classes, tables.value_tags
    tag_conflict, tag_dropped, conflict_class = (tables.tag_conflict, tables.tag_dropped,
                                                 tables.conflict_class)
    n = 0
    for d in range(value_classes.shape[1]):
        eff[t, d] = 0
        c = value_classes[t, d]
        if c < 0 or mask[c] == 0:
            continue
        tag = value_tags[t, d]
        if tag >= 0:
            k = tag_conflict[tag]
            if mask[conflict_class[k]] != 0 and tag_dropped[tag, res[k]]:
                continue
        # insertion by rank
        r = rank[c]
        j = n
        while j > 0 and ranks[j - 1] > r:
            ranks[j] = ranks[j - 1]
            dims[j] = dims[j - 1]
            j -= 1
        ranks[j] = r
        dims[j] = d
        n += 1
    used = 0
    for i in range(n):
        d = dims[i]
        m = mask[value_classes[t, d]] & AXES  # (the order: _axis_order.order_of)
        if m & used == 0:
            eff[t, d] = m
            used |= m
    return used


@jit
def group_consensus(tables, eff, consensus):
    """Fills consensus[G]: the axes all members of each contraction group share."""
    for g in range(tables.groups.shape[0]):
        consensus[g] = consensus_of(g, tables, eff)


@inline
def consensus_of(g, tables, eff):
    """The axes all members of contraction group g share."""
    groups, members = tables.groups, tables.group_members
    c = -1
    for i in range(groups[g].start, groups[g].end):
        c &= eff[members[i].value_type, members[i].dim]
    return c
