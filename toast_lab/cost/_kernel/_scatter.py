"""A combining scatter's partitioning, as XLA's gather/scatter handler picks it: the patterns
OPERAND_PASSTHROUGH, REGROUPED_INDICES and UPDATES_KEEP_SHARDING (_patterns.py).

A scatter-add whose operand and updates both hold an axis (an FSDP embedding gradient: the
table on `embed`, the tokens' gradient on `batch`, both over one axis) can be partitioned
several ways; XLA runs a dry run of each method and keeps the cheapest
(xla/service/spmd/gather_scatter_handler.cc). These functions price the one it keeps.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit
from .._operand_rows import ROW_RESULT
from ._charge import A2A, AG, AR, a2a_time, charge, gather_time, permute
from ._patterns import OPERAND_PASSTHROUGH, REGROUPED_INDICES


@jit
def scatter_passthrough(coll, op, eff, vmask, psum, res_mask, mesh, w, ledger, row):
    """A combining scatter whose operand is sharded on its pass-through (window) dims over
    axes that also shard the updates' scatter dims (an FSDP embedding gradient: the table on
    `embed`, the tokens' gradient on `batch`, both over one axis). XLA's SPMD partitioner
    picks the cheaper of its methods by ScatterPartitionMethodCostModel
    (xla/service/spmd/gather_scatter_handler.cc; ties go to operand passthrough):
    - operand passthrough: the updates' axes move to their window dims (an all-to-all), the
      indices are all-gathered, and no partial sums are left over those axes;
    - index passthrough: whole operand + updates and indices as they are: partial sums.
    Its costs are those of a dry run of each method (EvaluatePartitionCost), by memory first:
    the largest of the partitioned scatter's operands (in place: no result counted) and each
    collective's operand + result. Operand passthrough: max(operand shard + updates resharded
    like the operand + whole indices, the reshard of the updates): an all-to-all (its operand
    and result, each a shard of the moved updates), or the updates all-gathered whole where a
    dim of theirs holds both contested axes and partial-sum axes that stay (XLA's reshard
    cannot split one dim's axes). Index passthrough: whole operand +
    updates and indices as they are (its all-reduce reads only the operand). Checked against
    what XLA compiles for an FSDP embedding gradient with a small and a large vocabulary
    (tests/test_gathers.py).
    Returns (the axes operand passthrough takes, seconds, bytes of the new buffers); no
    axes where index passthrough wins or nothing is contested. Ledger rows `row` (the
    all-to-all) and `row + 1` (the all-gather), and those of regrouped_indices, which
    partitions the rest of the mesh the way XLA does after it."""
    window = np.int64(0)  # (a literal 0 would compile regrouped_indices twice)
    for d in range(eff.shape[1]):
        if op.scatter_window >> d & 1:
            window |= eff[op.result_type, d]
    contested = psum & window
    if contested == 0:
        return 0, 0.0, 0.0
    updates = op.scatter_updates / mesh[vmask[op.scatter_updates_type]].ways
    indices = op.scatter_indices / mesh[vmask[op.scatter_indices_type]].ways
    # the updates sharded like the operand's pass-through dims: what the all-to-all moves
    moved = op.scatter_updates / mesh[window].ways
    # The contested axes leave the updates' dims by one all-to-all (axes the updates hold on
    # their window dims that the operand does not are gathered before it), unless a dim
    # also holds partial-sum axes that stay: XLA then gathers the updates whole.
    reshard = 2.0 * moved
    for d in range(eff.shape[1]):
        held = eff[op.scatter_updates_type, d]
        if held & contested != 0 and held & psum & ~contested != 0:
            reshard = op.scatter_updates
    passthrough = max(op.result_nbytes / mesh[res_mask].ways + moved + op.scatter_indices,
                      reshard)
    if passthrough > op.result_nbytes + updates + indices:
        return 0, 0.0, 0.0
    t = a2a_time(moved, contested, mesh)
    charge(coll, A2A, contested, w, moved, t, ledger, row, OPERAND_PASSTHROUGH)
    regrouped = regrouped_indices(coll, op, vmask, contested, res_mask, window, moved, mesh,
                                   w, ledger, row)
    if regrouped[0] >= 0.0:
        return contested, t + regrouped[0], moved + regrouped[1]
    gathered = indices * mesh[contested].ways
    tg = gather_time(gathered, contested, mesh)
    charge(coll, AG, contested, w, gathered, tg, ledger, row + 1, OPERAND_PASSTHROUGH)
    return contested, t + tg, moved + gathered

@jit  # rare (a contested scatter): a call, not inlined into the sweep
def regrouped_indices(coll, op, vmask, contested, res_mask, window, moved, mesh, w, ledger,
                       row):
    """The indices and the rest of the mesh after operand passthrough over `contested`, where
    the indices and the updates are sharded over exactly those axes and the mesh has others
    (`rest`: an FSDP embedding gradient under FSDP x TP, tokens on `data`, the table's
    vocabulary on `model`; the updates come from the all-to-all in the table's embed sharding,
    whatever axes they held before). XLA's partitioner groups the devices by the contested axes and
    partitions each group's scatter again (gather_scatter_handler.cc):
    - First it regroups the indices over the replicated rest (GroupShardingOnReplicatedDim): it
      needs `n` = ways(contested) groups; with r = ways(rest) a multiple of n the indices keep
      their n-way tiling inside each group, else (n a multiple of r) it borrows n / r of their
      own ways and all-gathers them. Either way each device's shard is collective-permuted to
      the device that now holds it (the groups are aligned with the updates', which lie across
      the replicated axes): data=4 x model=2, tokens on data, a permute of the 1/4 shard and an
      all-gather to 1/2 (jax 0.10.2, tests/test_gathers.py).
    - It only does so where operand passthrough comes first among the methods: a dry run of
      each, memory first (EvaluatePartitionCost: the largest of the scatter's operands and each
      collective's operand + result, the method's inner group replicated), where partitioning
      by the vocabulary first (trivially sliced, the indices replicated over its axes already)
      can be cheaper: then the indices are all-gathered whole over the contested axes, as
      without a rest.
    - Inside each group, the table is sharded on its vocabulary over `R` (trivially sliced:
      each device scatters the tokens of its rows, the indices all-gathered whole) or not, and
      the indices `w` ways: index passthrough scatters each device's tokens into the group's
      whole table and all-reduces it. By the same dry run, index passthrough wins where
      table + updates / w + indices / w beats table / R + updates + indices (and the gather of
      the table to whole, which XLA skips for the zeros a gradient scatter starts from).
    Returns (seconds, bytes of the new buffers), or (-1, 0) where this does not apply (the
    caller gathers the indices whole over the contested axes). Ledger rows `row + 4` (the
    permute), `row + 1` (the borrowed gather), `row + 5` (the group's gather of the indices),
    `row + 6` (the group's all-reduce of the table)."""
    full = mesh.shape[0] - 1
    rest = full & ~contested
    if rest == 0 or vmask[op.scatter_indices_type] != contested or window & rest != 0:
        return -1.0, 0.0
    n = mesh[contested].ways
    r = mesh[rest].ways
    if r % n == 0:
        borrowed = 1.0
    elif n % r == 0:
        borrowed = n / r
    else:
        return -1.0, 0.0  # replicated: gathered whole
    ways_in_group = n / borrowed
    table = op.result_nbytes / n   # one group's table: whole but for the contested axes
    vocab = mesh[res_mask & rest].ways
    indices = op.scatter_indices
    # which method comes first at the top: operand passthrough or the vocabulary's
    if vocab > 1.0:
        # each dry run's largest buffer: the group's scatter, the all-to-all (or the updates'
        # gather), the gather of the group's table
        shard = op.result_nbytes / mesh[res_mask].ways
        rows = op.result_nbytes / vocab
        updates = op.scatter_updates
        passthrough = max(table + moved + indices, 2.0 * moved, table / vocab + table)
        by_vocab = max(rows + updates + indices, updates / n + updates, shard + rows)
        if by_vocab < passthrough:
            return -1.0, 0.0
    seconds = 0.0
    made = 0.0
    piece = indices / n
    seconds += permute(coll, full, w, piece, mesh, ledger, row + 4, REGROUPED_INDICES)
    made += piece
    if borrowed > 1.0:
        b = piece * borrowed
        t = gather_time(b, contested, mesh)  # over part of the contested axes
        charge(coll, AG, contested, w, b, t, ledger, row + 1, REGROUPED_INDICES)
        seconds += t
        made += b
    if ways_in_group <= 1.0:
        return seconds, made
    trivially_sliced = table / vocab + moved + indices
    index_passthrough = table + moved / ways_in_group + indices / ways_in_group
    if vocab > 1.0:
        index_passthrough = max(index_passthrough, table / vocab + table)
    if vocab > 1.0 and trivially_sliced <= index_passthrough:
        t = gather_time(indices, rest, mesh)
        charge(coll, AG, rest, w, indices, t, ledger, row + 5, REGROUPED_INDICES)
        return seconds + t, made + indices
    t = 2.0 * gather_time(table, rest, mesh)  # an all-reduce: a reduce-scatter + all-gather
    charge(coll, AR, rest, w, table, t, ledger, row + 6, REGROUPED_INDICES)
    return seconds + t, made

@jit
def updates_window(v, ot, eff):
    """(axes lost, axes held) on the window dims of a combining scatter's updates (operand
    type `ot`): those the op would gather, as it wants them sharded like the result's.

    Where the result holds the lost axes on its indexed dims instead (a segment_sum's sums
    sharded on the segments, its messages on their features), two factors of the op want one
    axis. Shardy's aggressive propagation gives it to the factor of the larger tensor
    (aggressive_factor_propagation.h): updates larger than the result keep their sharding,
    the scatter runs on it (operand passthrough; its broadcast operand is made in that
    sharding), and its result is resharded to the plan's afterwards: an all-to-all of the
    result's shard where the window dims lose every axis they hold to the indexed dims (the
    GNN's segment sums, jax 0.10.2); otherwise (the window dims keep some, or some are
    dropped) XLA's reshard replicates the whole result and slices it (its "involuntary full
    rematerialization": an all-gather over the axes held)."""
    rows = v.rows
    held = 0
    lost = 0
    for k in range(v.operands[ot].start, v.operands[ot].end):
        r = v.operand_rows[k]
        if rows[r].kind == ROW_RESULT:
            held |= eff[rows[r].value_type, rows[r].dim]
            lost |= v.rstate[r].removed
    return lost, held
