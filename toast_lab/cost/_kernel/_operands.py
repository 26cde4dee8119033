"""Phase 2, operand classification: what each operand holds, what its op wants, and which
reshard the partitioner will run between the two.

Per operand row (one dim of an operand, TypeTables.rows), a ROW_STATE record (_state.py):
`held` the axes it holds, `removed` those the op does not want there, `added` those the op
wants and it lacks, `onto_whole` the added axes of a dim held whole (a free local slice).

Per operand type (TypeTables.operands), an OPERAND_STATE record:
- `gather`: axes to all-gather; `a2a`: axes that move between dims; `sliced`: axes only
  added, sliced locally first;
- `onto`: where one dim's axes are all handed to axes the operand lacks, the new axes
  (HANDED_DIM); `compatible`/`compatible_held`: COMPATIBLE_GATHER or COMPATIBLE_SLICE (0:
  neither) and the axes the operand ends with; `remat`: gathered whole and sliced
  (FULL_REMAT);
- `reorder`: the axes a collective-permute puts back in the plan's order, `reorder_first`:
  permuted before the reshard (SPLIT_FINER, GATHER_MAJOR_AXIS), `reorder_reduced`: the op's
  reduced result is permuted (AXIS_ORDER after an all-reduce), `reorder_pattern` which;
- `only_sliced`: the axes of an operand only sliced locally, by axes it does not hold.
"""

from __future__ import annotations

import numpy as np

from ._jit import inline, jit
from .._operand_rows import ROW_FROM_WHOLE, ROW_GROUP, ROW_RESULT
from ._axis_order import compound_split, gathered_out_of_order, order_of, out_of_order
from ._patterns import AXIS_ORDER, COMPATIBLE_GATHER, COMPATIBLE_SLICE, GATHER_MAJOR_AXIS, \
    SPLIT_FINER
from ._views import OperandView


@jit
def classify_rows(plan, tables, mesh, ws, only):
    """Fills ws.row_state: what each operand row holds and what its op wants there (only the
    rows `only` marks, where it is not empty)."""
    eff, consensus, rstate = ws.eff, ws.consensus, ws.row_state
    mask, value_classes, rows = plan.mask, tables.value_classes, tables.rows
    for r in range(rows.shape[0]):
        if only.shape[0] and not only[r]:
            continue
        row = rows[r]
        actual = 0 if row.kind == ROW_FROM_WHOLE else eff[row.value_type, row.dim]
        if row.compound > 0:  # a compound dim's axes, split between its parts
            held = eff[row.value_type, row.dim]
            major = compound_split(held, order_of(mask, value_classes, row.value_type, row.dim),
                                   row.compound, mesh)
            actual = held & ~major if row.kind == ROW_FROM_WHOLE else major
        if row.kind == ROW_RESULT or row.kind == ROW_FROM_WHOLE:
            want = eff[row.source_type, row.source_dim]
            if row.src_compound != 0:  # a merged dim's axes, split between its parts
                major = compound_split(want, order_of(mask, value_classes, row.source_type,
                                                      row.source_dim),
                                       abs(row.src_compound), mesh)
                want = major if row.src_compound > 0 else want & ~major
        elif row.kind == ROW_GROUP:
            want = consensus[row.group]
        else:
            want = 0
        state = rstate[r]
        state.held = actual
        state.removed = actual & ~want
        state.added = want & ~actual
        state.onto_whole = state.added if actual == 0 else 0


@jit
def classify_operands(plan, tables, mesh, ws, only):
    """Fills ws.operand_state (see the module docstring); only the operand types `only` marks,
    where it is not empty.

    The axes only added, onto a dim each device holds whole, are sliced first, locally: XLA's
    reshard takes its part of that dim before it communicates, so a gather or an all-to-all
    moves 1/ways of the operand (P("data") to P(None, "model") on data=4 x model=2 all-gathers
    a [64, 32] shard of a [64, 64] array, not all of it; jax 0.10.2). An axis added onto a dim
    sharded otherwise (P(None, "data") to P(None, "model")) is not local."""
    v = OperandView(tables.operands, tables.operand_rows, tables.rows, ws.row_state,
                    ws.operand_state, ws.vmask)
    operands, operand_rows, rstate, ostate = v.operands, v.operand_rows, v.rstate, v.ostate
    for o in range(operands.shape[0]):
        if only.shape[0] and not only[o]:
            continue
        rem = 0
        add = 0
        local = 0
        for i in range(operands[o].start, operands[o].end):
            rem |= rstate[operand_rows[i]].removed
            add |= rstate[operand_rows[i]].added
            local |= rstate[operand_rows[i]].onto_whole
        s = ostate[o]
        s.gather = rem & ~add
        s.a2a = rem & add
        s.sliced = local & ~rem
        s.onto = 0
        s.reorder = 0
        s.reorder_reduced = False
        s.reorder_first = False
        s.remat = False
        s.reorder_pattern = 0
        s.compatible = 0
        s.compatible_held = 0
        held = v.vmask[operands[o].value_type]
        if s.a2a != 0 and not operands[o].uniform:
            s.compatible = compatible_kind(o, v, mesh, held)
            if s.compatible != 0:
                s.compatible_held = (held & ~rem) | add
                continue
        if s.gather != 0 and s.a2a != 0:
            _full_rematerialization(o, v)
        if s.a2a != 0 and s.gather == 0 and _split_finer(o, v, mesh, rem, add):
            continue
        if operands[o].uniform:
            # A constant of one number throughout (optax.set_to_zero's zeros for a frozen
            # parameter under ZeRO-1): XLA all-gathers nothing, the gathered form is the same
            # broadcast of the scalar; an all-to-all of it stays (jax 0.10.2).
            s.gather = 0
        elif s.gather != 0 and s.a2a == 0 and s.sliced == 0:
            s.onto = _handed_dim(o, v, ws.eff, mesh)
        if s.onto != 0 or (s.gather != 0 and s.gather == held):
            continue  # permuted, or gathered whole and sliced as wanted: in order
        _axis_order(o, v, plan.mask, tables.value_classes, mesh)
    for o in range(operands.shape[0]):
        if only.shape[0] and not only[o]:
            continue
        s = ostate[o]
        s.only_sliced = 0
        if s.gather == 0 and s.a2a == 0 and s.sliced & v.vmask[operands[o].value_type] == 0:
            # (An axis that also shards a contracted dim, a ZeRO-1 weight gradient's on data
            # like the batch it sums over, slices nothing: XLA computes the whole partial sums
            # and reduce-scatters them.)
            s.only_sliced = s.sliced


@inline
def compatible_kind(o, v, mesh, held):
    """Whether operand type o, some of whose axes move to other dims, is one that XLA's
    partitioner reshards without an all-to-all (spmd_partitioner.cc: ReshardNoCache tries
    these first; the compatible sharding is spmd_partitioner_util.cc's
    PartialReplicateReshardCompatibleSharding), each dim read by one row (no compound dims):
    - COMPATIBLE_GATHER: every dim keeps a number of tiles that divides what it has (the
      wanted sharding uses fewer devices; ReshardToPartialReplicateWithAllGather): the shard
      is collective-permuted to the devices of a sharding of as many tiles per dim whose
      replicated devices tile the dims that narrow, then all-gathered there;
    - COMPATIBLE_SLICE: every dim ends with a multiple of the tiles it has, the operand
      partially replicated (ReshardFromPartialReplicateWithDynamicSlice): each device slices
      its new tile out of what it holds, and a collective-permute puts the tiles on the
      devices the plan wants them on.
    An axis that moves between dims puts its tiles on other devices than the compatible
    sharding's either way, so the collective-permute is always there. 0: neither."""
    rows = v.rows
    gather_ok = True
    slice_ok = held != mesh.shape[0] - 1  # the operand partially replicated
    seen = 0
    for i in range(v.operands[o].start, v.operands[o].end):
        r = v.operand_rows[i]
        if rows[r].compound > 0 or rows[r].kind == ROW_FROM_WHOLE or seen >> rows[r].dim & 1:
            return 0
        seen |= 1 << rows[r].dim
        state = v.rstate[r]
        a, b = mesh[state.held].ways, mesh[(state.held & ~state.removed) | state.added].ways
        gather_ok = gather_ok and a % b == 0.0
        slice_ok = slice_ok and b % a == 0.0
    if gather_ok:
        return COMPATIBLE_GATHER
    if slice_ok:
        return COMPATIBLE_SLICE
    return 0


@inline
def _full_rematerialization(o, v):
    """An axis that leaves a dim together with one that moves to another dim
    (P(("data", "model")) to P(None, "model")) is a reshard XLA's partitioner cannot split:
    "involuntary full rematerialization", it all-gathers the operand whole and slices the
    target out of it (spmd_partitioner.cc; jax 0.10.2). An axis that only changes place
    within its dim (a reshape's merged dim on ("data", "model") whose major factor wants
    "model") is gathered, then moved."""
    operands, operand_rows, rows, rstate = v.operands, v.operand_rows, v.rows, v.rstate
    s = v.ostate[o]
    for i in range(operands[o].start, operands[o].end):
        r = rstate[operand_rows[i]].removed
        if r & s.gather == 0 or r & s.a2a == 0:
            continue
        back = 0  # the moving axes added again on this dim
        for j in range(operands[o].start, operands[o].end):
            if rows[operand_rows[j]].dim == rows[operand_rows[i]].dim:
                back |= rstate[operand_rows[j]].added
        if r & s.a2a & ~back != 0:
            s.gather = v.vmask[operands[o].value_type]
            s.a2a = 0
            s.sliced = 0
            s.remat = True
            return


@inline
def _split_finer(o, v, mesh, rem, add):
    """Each dim only split finer (its new ways a multiple of its old on every part), where the
    compatible reshards do not apply (a compound dim: x [32, 16] read as [4, 8, 16], the
    examples' part of the batch on data, the micro-batches' on model): every device's new tile
    lies inside some device's old one, and XLA slices it there and collective-permutes it,
    rather than run an all-to-all (one permute of the 256 B shard on data=4 x model=2, jax
    0.10.2; tests/test_cost.py). Returns whether it applies (and records it)."""
    for i in range(v.operands[o].start, v.operands[o].end):
        state = v.rstate[v.operand_rows[i]]
        new = (state.held & ~state.removed) | state.added
        if mesh[new].ways % mesh[state.held].ways != 0.0:
            return False
    s = v.ostate[o]
    s.reorder = rem | add
    s.reorder_first = True
    s.reorder_pattern = SPLIT_FINER
    s.sliced = add
    s.a2a = 0
    return True


@inline
def _handed_dim(o, v, eff, mesh):
    """One dim whose axes all leave for axes the operand does not hold, nothing else changing:
    permuted, not gathered whole (_reshard.gather_and_move's HANDED_DIM), where one axis
    group's ways divide the other's. Returns the new axes (0: not this pattern)."""
    operands, operand_rows, rows, rstate = v.operands, v.operand_rows, v.rows, v.rstate
    dim = -1
    held = 0
    for i in range(operands[o].start, operands[o].end):
        r = operand_rows[i]
        if rstate[r].removed != 0:
            if dim >= 0 and rows[r].dim != dim:
                return 0
            dim = rows[r].dim
            held = eff[rows[r].value_type, dim]
    if dim < 0:
        return 0
    new = 0
    for i in range(operands[o].start, operands[o].end):
        r = operand_rows[i]
        if rows[r].dim == dim:
            new |= rstate[r].added
    old = v.ostate[o].gather
    a, b = mesh[old].ways, mesh[new].ways
    if (new != 0 and held == old and new & v.vmask[operands[o].value_type] == 0
            and (a % b == 0.0 or b % a == 0.0)):
        return new
    return 0


@jit
def _axis_order(o, v, mask, value_classes, mesh):
    """A dim whose axes arrive out of the plan's order (_axis_order.out_of_order): one
    collective-permute over its axes, of the resharded operand's shard, or of the result's
    where the new axes are the op's partial sums (an all-reduce then a slice); or, where a
    gather takes a dim's major axis (gathered_out_of_order), of the shard before the gather."""
    operands, operand_rows, rows, rstate = v.operands, v.operand_rows, v.rows, v.rstate
    s = v.ostate[o]
    rem = s.gather | s.a2a
    for i in range(operands[o].start, operands[o].end):
        r = operand_rows[i]
        row = rows[r]
        if row.kind != ROW_RESULT and row.kind != ROW_FROM_WHOLE:
            continue
        state = rstate[r]
        kept = state.held & ~state.removed
        gone = state.removed & s.gather
        held_order = order_of(mask, value_classes, row.value_type, row.dim)
        if gone != 0 and kept != 0 and gathered_out_of_order(kept, gone, held_order, mesh):
            s.reorder |= state.held
            s.reorder_first = True
            s.reorder_pattern = GATHER_MAJOR_AXIS
            continue
        want = kept | state.added
        if want & (want - 1) == 0:
            continue  # one axis or none: nothing to order
        want_order = order_of(mask, value_classes, row.source_type, row.source_dim)
        if state.added == 0 and held_order == want_order:
            continue  # nothing arrives and the order is the same (most rows, every search)
        moved = state.added & s.a2a
        # Axes the operand keeps on a dim a reduction sums over, where plan.jit pins the
        # read sliced like the result (OPERAND.sliced_first): they come after that slice,
        # from the all-reduced partial sums (a bias gradient summed over a batch on `model`
        # into features on (model, data): data sliced, model after, permuted; cnn random1,
        # jax 0.10.2). Elsewhere XLA reduces the operand whole on the result's dims and
        # slices the all-reduced sums in the plan's order (a matmul's or convolution's, an
        # unpinned reduce_sum's: no permute).
        reduced = 0
        if operands[o].sliced_first:
            reduced = state.added & v.vmask[operands[o].value_type] & ~rem
        moved_order = np.int64(-1)  # (a literal -1 would compile out_of_order twice)
        if moved & (moved - 1) != 0 and reduced == 0:
            for j in range(operands[o].start, operands[o].end):
                if rstate[operand_rows[j]].removed & moved == moved:
                    moved_order = order_of(mask, value_classes, rows[operand_rows[j]].value_type,
                                           rows[operand_rows[j]].dim)
        if out_of_order(kept, state.added & ~moved & ~reduced, moved | reduced, held_order,
                        want_order, moved_order, mesh):
            s.reorder |= want
            if s.reorder_pattern == 0:
                s.reorder_pattern = AXIS_ORDER
            if state.added & v.vmask[operands[o].value_type] & ~rem != 0:
                s.reorder_reduced = True
