"""Phase 3, reshard pricing: one function prices bringing an operand from the sharding it holds
to the one its op wants, for an op's own operands and for shared reads alike (the way XLA's
auto-sharding prices `ReshardingCost(shape, src, dst)` or PyTorch AutoParallel its
`redistribute_cost`).

What to do was decided by the operand classification (_operands.py); here it is priced:
all-gathers and all-to-alls (GATHER, ALL_TO_ALL, FULL_REMAT), a dim handed to other axes
(HANDED_DIM), the compatible reshards (COMPATIBLE_GATHER, COMPATIBLE_SLICE) and the permute
that puts a dim's axes in the plan's order (SPLIT_FINER, GATHER_MAJOR_AXIS, AXIS_ORDER).
"""

from __future__ import annotations


from ._jit import inline, jit
from ._charge import A2A, AG, a2a_time, charge, gather_time, permute
from ._patterns import ALL_TO_ALL, COMPATIBLE_SLICE, FULL_REMAT, GATHER, HANDED_DIM


@inline
def reshard(o, nbytes, gone, weight, seconds, v, mesh, coll, ledger, row, reorder_row):
    """Brings operand type o (whole-tensor `nbytes`; `v` an OperandView) to its op's sharding,
    `weight` times, the axes `gone` all-gathered (its gather, less any its op takes over);
    charges the ledger rows `row` (gathers), `row + 1` (all-to-alls and permutes) and
    `reorder_row` (the permute that puts its axes in order). Returns (`seconds` + the seconds
    of one, bytes of the buffer it makes); the reorder of an op's reduced result is the
    caller's (reduced_reorder)."""
    s = v.ostate[o]
    vmask = v.vmask[v.operands[o].value_type]
    shard = nbytes / mesh[vmask].ways
    if s.compatible != 0:
        t, made = compatible_reshard(o, s.compatible, gone, shard,
                                     nbytes / mesh[s.compatible_held].ways, weight, v, mesh,
                                     coll, ledger, row)
    else:
        t, made = gather_and_move(gone, s.a2a, s.onto, shard / mesh[s.sliced].ways, weight,
                                  mesh, coll, ledger, row, FULL_REMAT if s.remat else GATHER)
    seconds += t
    if s.reorder != 0 and not s.reorder_reduced:
        if s.reorder_first:  # the operand's shard, after its local slices
            size = nbytes / mesh[vmask | s.sliced].ways
        else:
            size = nbytes / mesh[(vmask & ~gone) | s.sliced | s.reorder].ways
        # (its buffer takes the place of the reshard's: no new bytes)
        seconds += permute(coll, s.reorder, weight, size, mesh, ledger, reorder_row,
                           s.reorder_pattern)
    return seconds, made


@inline
def reduced_reorder(s, result_bytes, weight, mesh, coll, ledger, row):
    """The permute that puts an op's reduced result in order, where the axes a reshard of an
    operand (OPERAND_STATE `s`) brings are the op's partial sums (an all-reduce, then a slice
    in the wrong order): of the result's shard, `result_bytes`. Returns its seconds (0 where
    the operand needs none)."""
    if s.reorder == 0 or not s.reorder_reduced:
        return 0.0
    return permute(coll, s.reorder, weight, result_bytes, mesh, ledger, row, s.reorder_pattern)


@inline
def gather_and_move(gather, a2a, onto, nbytes, weight, mesh, coll, ledger, row, pattern):
    """One operand brought to the sharding its op wants: the axes in `gather` all-gathered,
    those in `a2a` moved between dims, or, where `onto` is set, the one dim that `gather`
    shards handed to the axes of `onto` instead (HANDED_DIM); nbytes is the operand's
    per-device size. Charges `weight` of each (ledger rows `row` and `row + 1`, the gathers
    as `pattern`); returns (seconds, bytes) of one.

    A dim that leaves its axes for others (P("data") to P("model"), `onto` the new axes) is not
    gathered whole: XLA's partitioner collective-permutes each device's shard to the device
    that needs it, after a local slice where the new axes have more ways, before an
    all-gather over part of the old axes where they have more (data=4 x model=2: P("data") to
    P("model") a permute of the 1/4 shard and an all-gather to 1/2; P("model") to P("data") a
    permute of a 1/4 slice of the 1/2 shard; jax 0.10.2, tests/test_cost.py).

    Where it does both, XLA's partitioner gathers first (to the target's partially replicated
    form, ReshardToPartialReplicateWithAllGather) and then moves the gathered buffer: the
    all-to-all carries nbytes x the gathered ways (P("data", "model") to P(None, None,
    "model") on data=4 x model=2: an all-gather over data, then an all-to-all of 4 shards'
    worth; jax 0.10.2)."""
    seconds = 0.0
    moved = 0.0
    if onto != 0:
        old, new = mesh[gather].ways, mesh[onto].ways
        if new > old:
            nbytes = nbytes * old / new  # the local slice the device sends
        seconds += permute(coll, gather | onto, weight, nbytes, mesh, ledger, row + 1,
                           HANDED_DIM)
        moved += nbytes
        if old > new:  # the gather's group: part of `gather`, priced as those axes
            b = nbytes * old / new
            t = gather_time(b, gather, mesh)
            charge(coll, AG, gather, weight, b, t, ledger, row, HANDED_DIM)
            seconds += t
            moved = b
        return seconds, moved
    if gather != 0:
        b = nbytes * mesh[gather].ways
        t = gather_time(b, gather, mesh)
        seconds += t
        moved += b
        charge(coll, AG, gather, weight, b, t, ledger, row, pattern)
        nbytes = b
    if a2a != 0:
        t = a2a_time(nbytes, a2a, mesh)
        seconds += t
        moved += nbytes
        charge(coll, A2A, a2a, weight, nbytes, t, ledger, row + 1, ALL_TO_ALL)
    return seconds, moved


@jit
def compatible_reshard(o, kind, gone, shard, target, weight, v, mesh, coll, ledger, row):
    """Charges the compatible reshard of operand type o (_operands.compatible_kind): one
    collective-permute, over the axes the operand holds or takes, of the shard it holds
    (`shard`, per device) for COMPATIBLE_GATHER or of the `target` shard it slices for
    COMPATIBLE_SLICE; and for COMPATIBLE_GATHER one all-gather per dim that narrows, the last
    dim first, each of the buffer the ones before made grown by that dim's factor
    (ReplicatePartial -> AllGatherShards). On data=4 x model=2, [8, 128, 64] from P("model",
    None, "data") to P(None, None, "model") is a permute of the 32 KiB shard and all-gathers
    to 64 and then 128 KiB over halves of data, and back a local slice and a permute of the
    32 KiB shard (jax 0.10.2). The all-gathers are charged over `gone`, the axes the operand
    no longer holds anywhere (their groups are parts of those), in ledger row `row` as one
    record of their mean size; the permute in `row + 1`. Returns (seconds, bytes of the
    buffer made) of one."""
    operands, operand_rows, rows, rstate = v.operands, v.operand_rows, v.rows, v.rstate
    moved = 0
    last = 0
    for i in range(operands[o].start, operands[o].end):
        r = operand_rows[i]
        moved |= rstate[r].held | rstate[r].added
        last = max(last, rows[r].dim)
    if kind == COMPATIBLE_SLICE:
        return permute(coll, moved, weight, target, mesh, ledger, row + 1, kind), target
    seconds = permute(coll, moved, weight, shard, mesh, ledger, row + 1, kind)
    size = shard
    n = 0.0
    total = 0.0
    gather_seconds = 0.0
    d = last
    while d >= 0:
        for i in range(operands[o].start, operands[o].end):
            r = operand_rows[i]
            if rows[r].dim != d:
                continue
            have = rstate[r].held
            f = mesh[have].ways / mesh[(have & ~rstate[r].removed) | rstate[r].added].ways
            if f > 1.0:
                size *= f
                n += 1.0
                total += size
                gather_seconds += gather_time(size, gone, mesh)
        d -= 1
    if n > 0.0:
        charge(coll, AG, gone, weight * n, total / n, gather_seconds / n, ledger, row, kind)
    return seconds + gather_seconds, size
