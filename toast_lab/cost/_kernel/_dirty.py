"""Phase 0 of an incremental evaluation: what changed since the last plan this workspace costed.

An edit of one decision (IncrementalEstimator.set_axes) changes the mask or rank of a few split
classes (or a conflict's resolution), through them the masks of the value types whose dims
they are on, and through those some groups, operand rows, operands and op types; the rest cost
what they cost before. `mark_dirty` compares the plan with the last one and follows the model's
fixed maps (ChangeMaps, _change_maps.py) from what changed: it recomputes the masks of the
types reached, and the consensus of their groups and the partial-sum and result axes of their
op types, and marks what the operand classification and the op costs must redo (the `dirty_*`
arrays of the Workspace). An edit visits what it reaches, not every type. Shared reads, the
schedule and the memory sweep are redone whole: they add up every op.
"""

from __future__ import annotations

from ._jit import inline, jit
from ._masks import consensus_of, group_consensus, type_mask, type_masks
from ._ops import op_mask, op_masks


@jit
def mark_dirty(plan, tables, ws):
    """Sets ws.eff, vmask, consensus and the op types' psum and res for `plan`, and the
    dirty_* arrays: everything where the workspace has no earlier evaluation."""
    if ws.evaluated[0]:
        for a in (ws.dirty_type, ws.dirty_group, ws.dirty_row, ws.dirty_operand, ws.dirty_op):
            a[:] = False
        _changed_types(plan, tables, ws)
        _changed_groups(tables, ws)
        _reached(tables, ws)
    else:
        type_masks(plan, tables, ws.eff, ws.vmask, ws.ranks, ws.dims)
        group_consensus(tables, ws.eff, ws.consensus)
        op_masks(tables, ws)
        for a in (ws.dirty_type, ws.dirty_group, ws.dirty_row, ws.dirty_operand, ws.dirty_op):
            a[:] = True
        ws.evaluated[0] = True
    for s in range(plan.mask.shape[0]):  # (loops: an array copy compiles numba's error text)
        ws.prev_mask[s] = plan.mask[s]
        ws.prev_rank[s] = plan.rank[s]
    for k in range(plan.resolution.shape[0]):
        ws.prev_resolution[k] = plan.resolution[k]


@jit
def _changed_types(plan, tables, ws):
    """New masks for the value types reading a split class whose mask or rank changed, or a
    conflict whose resolution did; dirty_type where a type's masks, or the mask of a class on
    one of its dims (its axis order: _axis_order.order_of), changed."""
    mask, rank, res = plan.mask, plan.rank, plan.resolution
    prev_mask, prev_rank, prev_res = ws.prev_mask, ws.prev_rank, ws.prev_resolution
    maps = tables.changes
    for s in range(mask.shape[0]):
        if mask[s] != prev_mask[s] or rank[s] != prev_rank[s]:
            for i in range(maps.class_types.start[s], maps.class_types.start[s + 1]):
                _new_type_mask(maps.class_types.items[i], plan, tables, ws)
    for k in range(res.shape[0]):
        if res[k] != prev_res[k]:
            for i in range(maps.conflict_types.start[k], maps.conflict_types.start[k + 1]):
                _new_type_mask(maps.conflict_types.items[i], plan, tables, ws)


@jit
def _new_type_mask(t, plan, tables, ws):
    """Value type t's masks under `plan` into ws.eff and vmask, dirty_type[t] set where they
    or a class mask on its dims changed (a type reached twice stays dirty: its second visit
    finds its masks changed already)."""
    eff, eff_new, mask, prev_mask = ws.eff, ws.eff_new, plan.mask, ws.prev_mask
    value_classes = tables.value_classes
    vmask = type_mask(t, plan, tables, eff_new, ws.ranks, ws.dims)
    changed = vmask != ws.vmask[t]
    for d in range(eff.shape[1]):
        c = value_classes[t, d]
        changed = changed or eff_new[t, d] != eff[t, d] or (c >= 0 and mask[c] != prev_mask[c])
        eff[t, d] = eff_new[t, d]
    ws.vmask[t] = vmask
    if changed:
        ws.dirty_type[t] = True


@jit
def _changed_groups(tables, ws):
    """The consensus of the groups with a member of a dirty type; dirty_group where it
    changed."""
    type_groups, dirty_type, consensus = tables.changes.type_groups, ws.dirty_type, ws.consensus
    for t in range(dirty_type.shape[0]):
        if not dirty_type[t]:
            continue
        for i in range(type_groups.start[t], type_groups.start[t + 1]):
            g = type_groups.items[i]
            c = consensus_of(g, tables, ws.eff)
            if c != consensus[g]:
                consensus[g] = c
                ws.dirty_group[g] = True


@jit
def _reached(tables, ws):
    """dirty_row: a row of a dirty type, read as one (its source), or of a changed group;
    dirty_operand: an operand of a dirty type or with a dirty row; dirty_op: an op type with a
    dirty operand, a changed group or a dirty value type its result axes or costs read, one
    whose reducing leader's partial-sum or result axes changed, and every explicitly batched
    gather or scatter (they re-tile their indices once between them, in order). The psum and
    res of the op types marked anew (no other op type's can change)."""
    maps, dirty_op = tables.changes, ws.dirty_op
    for t in range(ws.dirty_type.shape[0]):
        if ws.dirty_type[t]:
            _mark(maps.type_rows, t, ws.dirty_row)
            _mark(maps.type_operands, t, ws.dirty_operand)
            _mark(maps.type_ops, t, dirty_op)
    for g in range(ws.dirty_group.shape[0]):
        if ws.dirty_group[g]:
            _mark(maps.group_rows, g, ws.dirty_row)
            _mark(maps.group_operands, g, ws.dirty_operand)
            _mark(maps.group_ops, g, dirty_op)
    for i in range(maps.batched.shape[0]):
        dirty_op[maps.batched[i]] = True
    pstate = ws.op_state
    for p in range(dirty_op.shape[0]):
        if dirty_op[p]:
            psum, res = op_mask(p, tables, ws.consensus, ws.vmask)
            if psum != pstate[p].psum or res != pstate[p].res:
                pstate[p].psum = psum
                pstate[p].res = res
                _mark(maps.sum_followers, p, dirty_op)


@inline
def _mark(fanout, i, dirty):
    """Marks every target of source i in `fanout` (a Fanout) in `dirty`."""
    for j in range(fanout.start[i], fanout.start[i + 1]):
        dirty[fanout.items[j]] = True
