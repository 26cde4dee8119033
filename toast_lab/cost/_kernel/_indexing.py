"""Explicitly batched gathers and scatters re-tiled like their indices: the BATCHED_RETILE
pattern (_patterns.py).

A take_along_axis of the logits by the labels (and its gradient, a scatter-add) is an
explicitly batched gather: its batching dims pair with the indices'. Where its indexed dim is
sharded over axes the indices also shard, XLA's gather/scatter handler frees those axes from
the indices and re-tiles the operand like them (xla/service/spmd/gather_scatter_handler.cc).
"""

from __future__ import annotations


from ._jit import jit
from ._charge import A2A, a2a_time, charge, permute
from ._patterns import BATCHED_RETILE


@jit
def batched_indexing(coll, op, eff, vmask, mesh, w, ledger, row, tables, retiled):
    """An explicitly batched gather or scatter (take_along_axis of the logits by the labels,
    and its gradient) whose indexed dim is sharded over axes M that the indices also shard.
    XLA partitions it as "trivially sliced operand" (xla/service/spmd/
    gather_scatter_handler.cc): each M-shard gathers or scatters the rows it holds, masked,
    and the indices must be whole over M. GroupShardingOnReplicatedDim frees M from the
    indices by replicating their lowest-priority dims first (the leading batching dims), so
    the indices keep their tile count but tile their batching dims differently; the operand
    (for a scatter, its result) is then tiled like them (GatherScatterOperandsShardedAcross
    ParallelDims): an all-to-all of its shard over the axes of its batching dims, where the
    tilings differ and have as many tiles (a vocabulary-sharded logits tensor whose labels
    shard the sequence: measured on jax 0.10.2, tests/test_indexing_reshards.py).

    The indices and what is tiled like them follow: each device's shard of the indices is
    collective-permuted to the device whose new tile it is part of (before their all-gather
    over M, charged where they are read), once per indices value however many ops re-tile by
    it (XLA reshards a value once per sharding; `retiled` marks the indices types done); a
    scatter's updates tiled like the indices the same way (unless uniform: a constant's copy
    is made in place); and a gather's result, made in the new tiling, is permuted back to the
    indices' tiling (data=4 x model=2, labels P("data", "model") of logits P("data", None,
    "model"): three permutes of a label-sized shard in a training step, jax 0.10.2).
    Returns (seconds, bytes moved) of one; ledger rows `row` (the all-to-all), `row + 5`,
    `row + 6` and `row + 7` (the permutes of the indices, updates and result)."""
    bt = op.batch_type
    idx = op.batch_indices_type
    # the ways of M the indices must give up
    owed = int(mesh[dims_mask(eff, bt, op.batch_indexed) & vmask[idx]].ways)
    if owed <= 1:
        return 0.0, 0.0
    dims = op.batch_dims
    index_dims = op.batch_index_dims
    same = True
    tiles = 1
    own_tiles = 1
    axes = 0
    for _ in range(eff.shape[1]):
        if dims == 0 or index_dims == 0:
            break
        d = 0
        while not dims >> d & 1:
            d += 1
        k = 0
        while not index_dims >> k & 1:
            k += 1
        dims &= ~(1 << d)
        index_dims &= ~(1 << k)
        t = int(mesh[eff[idx, k]].ways)
        a, b = t, owed  # gcd: how much of what is owed this dim gives up
        while b:
            a, b = b, a % b
        t //= a
        owed //= a
        own = int(mesh[eff[bt, d]].ways)
        same = same and t == own
        tiles *= t
        own_tiles *= own
        axes |= eff[bt, d]
    if owed != 1 or same or tiles != own_tiles or axes == 0:
        return 0.0, 0.0
    nbytes = op.batch_nbytes / mesh[vmask[bt]].ways
    t = a2a_time(nbytes, axes, mesh)
    charge(coll, A2A, axes, w, nbytes, t, ledger, row, BATCHED_RETILE)
    held = vmask[idx]
    if not retiled[idx]:
        retiled[idx] = True
        piece = op.batch_indices_nbytes / mesh[held].ways
        t += permute(coll, held | axes, w, piece, mesh, ledger, row + 5, BATCHED_RETILE)
        nbytes += piece
    if op.scatter_updates > 0.0:
        ut = op.scatter_updates_type
        if vmask[ut] == held and not uniform_operand(tables, op, ut):
            piece = op.scatter_updates / mesh[held].ways
            t += permute(coll, held | axes, w, piece, mesh, ledger, row + 6, BATCHED_RETILE)
            nbytes += piece
    elif op.result_type >= 0 and vmask[op.result_type] == held:
        piece = op.result_nbytes / mesh[held].ways
        t += permute(coll, held | axes, w, piece, mesh, ledger, row + 7, BATCHED_RETILE)
        nbytes += piece
    return t, nbytes

@jit
def uniform_operand(tables, op, value_type):
    """Whether op's operand of `value_type` is a constant of one number (OPERAND.uniform)."""
    for i in range(op.operands_start, op.operands_end):
        ot = tables.op_operands[i].operand_type
        if tables.operands[ot].value_type == value_type:
            return tables.operands[ot].uniform
    return False

@jit
def dims_mask(eff, t, dims):
    """The mesh axes value type t is sharded on over the dims in bit mask `dims`."""
    m = 0
    for d in range(eff.shape[1]):
        if dims >> d & 1:
            m |= eff[t, d]
    return m
