"""Phase 0 of an incremental evaluation: what changed since the last plan this workspace costed.

An edit of one decision (IncrementalEstimator.set_axes) changes the masks of the value types
whose dims are in that class, and through them some operand rows, operands and op types; the
rest cost what they cost before. `mark_dirty` computes the new masks, compares them with the
workspace's (and the plan's class masks with the last plan's: an axis order that changes
moves no bit of a type's masks but may move its tiles), and marks what the operand
classification and the op costs must redo (the `dirty_*` arrays of the Workspace). Shared
reads, the schedule and the memory sweep are redone whole: they add up every op.
"""

from __future__ import annotations

from ._jit import jit
from ._masks import group_consensus, type_masks
from ._ops import op_masks
from .._operand_rows import ROW_FROM_WHOLE, ROW_GROUP, ROW_RESULT


@jit
def mark_dirty(plan, tables, ws):
    """Sets ws.eff, vmask, consensus and the op types' psum and res for `plan`, and the
    dirty_* arrays: everything where the workspace has no earlier evaluation."""
    first = not ws.evaluated[0]
    ws.evaluated[0] = True
    _dirty_types(plan, tables, ws, first)
    group_consensus(tables, ws.eff, ws.consensus_new)
    consensus, consensus_new, dirty_group = ws.consensus, ws.consensus_new, ws.dirty_group
    for g in range(consensus.shape[0]):
        dirty_group[g] = first or consensus_new[g] != consensus[g]
        consensus[g] = consensus_new[g]
    _dirty_rows(tables, ws)
    _dirty_operands(tables, ws)
    pstate = ws.op_state
    for p in range(pstate.shape[0]):
        ws.prev_psum[p] = pstate[p].psum
        ws.prev_res[p] = pstate[p].res
    op_masks(tables, ws)
    _dirty_ops(tables, ws, first)


@jit
def _dirty_types(plan, tables, ws, first):
    """The new masks into ws.eff and vmask; dirty_type where they, or the mask of a class on
    one of the type's dims, changed."""
    type_masks(plan, tables, ws.eff_new, ws.vmask_new, ws.ranks, ws.dims)
    mask, prev = plan.mask, ws.prev_mask
    eff, eff_new, vmask, vmask_new = ws.eff, ws.eff_new, ws.vmask, ws.vmask_new
    value_classes, dirty = tables.value_classes, ws.dirty_type
    T, D = value_classes.shape
    for t in range(T):
        changed = first or vmask_new[t] != vmask[t]
        for d in range(D):
            c = value_classes[t, d]
            changed = changed or eff_new[t, d] != eff[t, d] or (c >= 0 and mask[c] != prev[c])
            eff[t, d] = eff_new[t, d]
        vmask[t] = vmask_new[t]
        dirty[t] = changed
    for s in range(mask.shape[0]):
        prev[s] = mask[s]


@jit
def _dirty_rows(tables, ws):
    """dirty_row: a row of a dirty type, read as one (its source), or of a changed group."""
    rows, dirty_type, dirty_group, dirty = tables.rows, ws.dirty_type, ws.dirty_group, \
        ws.dirty_row
    for r in range(rows.shape[0]):
        row = rows[r]
        d = dirty_type[row.value_type]
        if row.kind == ROW_RESULT or row.kind == ROW_FROM_WHOLE:
            d = d or dirty_type[row.source_type]
        elif row.kind == ROW_GROUP:
            d = d or dirty_group[row.group]
        dirty[r] = d


@jit
def _dirty_operands(tables, ws):
    """dirty_operand: an operand of a dirty type or with a dirty row."""
    operands, operand_rows = tables.operands, tables.operand_rows
    dirty_type, dirty_row, dirty = ws.dirty_type, ws.dirty_row, ws.dirty_operand
    for o in range(operands.shape[0]):
        d = dirty_type[operands[o].value_type]
        for i in range(operands[o].start, operands[o].end):
            d = d or dirty_row[operand_rows[i]]
        dirty[o] = d


@jit
def _dirty_ops(tables, ws, first):
    """dirty_op: an op type whose partial-sum or result axes (or its reducing leader's)
    changed, with a dirty operand, a changed group or a dirty value type it depends on; and
    every explicitly batched gather or scatter (they re-tile their indices once between them,
    in order)."""
    ops, op_operands, op_groups = tables.ops, tables.op_operands, tables.op_groups
    depends, depends_on = tables.op_depends, tables.op_depends_on
    pstate, prev_psum, prev_res = ws.op_state, ws.prev_psum, ws.prev_res
    dirty_type, dirty_operand, dirty_group, dirty = ws.dirty_type, ws.dirty_operand, \
        ws.dirty_group, ws.dirty_op
    for p in range(ops.shape[0]):
        op = ops[p]
        d = first or op.batch_index_dims != 0 or pstate[p].psum != prev_psum[p] \
            or pstate[p].res != prev_res[p]
        lead = op.sum_leader
        if lead >= 0:
            d = d or pstate[lead].psum != prev_psum[lead] or pstate[lead].res != prev_res[lead]
        for i in range(op.operands_start, op.operands_end):
            d = d or dirty_operand[op_operands[i].operand_type]
        for i in range(op.groups_start, op.groups_end):
            d = d or dirty_group[op_groups[i]]
        for i in range(depends[p].start, depends[p].end):
            d = d or dirty_type[depends_on[i]]
        dirty[p] = d
