"""The cost model's inner loops, compiled with numba.

`evaluate_types` costs a plan (`PlanArrays`) over the type tables of _types.py (`TypeTables`,
read by field name); `add_temps` / `move_temps` and `peak_live` do the liveness sweep over the
`MemoryTables`, and `arguments_and_outputs` the argument and output bytes. `run` strings them
together in one call from Python (each such call pays for checking its arguments' types). The
model itself is documented in _model.py. Masks are integers with one bit per mesh axis; the
`mesh` table (MESH records: ways, bandwidth, latency) is indexed by mask; `device` is one
DEVICE record.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._plan_arrays import AXES, ORDER_SHIFT, PlanArrays
from ._fusion import KERNEL_ATTENTION, KERNEL_INSIDE, KERNEL_MANUAL
from ._static import DIM_BATCH, DIM_M, ROW_FROM_WHOLE, ROW_GROUP, ROW_RESULT
from ._tables import MemoryTables, ScheduleTables, TypeTables

# collective kinds (COLLECTIVE_KINDS, in order); the kernel charges CP where XLA's dot
# partitioner moves a matmul's reduced shard, where a dim's axes all leave for others
# (_reshard) or move between dims without an all-to-all (_compatible_reshard), where a
# reshard leaves a dim's axes out of order (_out_of_order), for a scatter's regrouped
# indices (_regrouped_indices), around a re-tiled batched gather (_batched_indexing) and for
# a convolution's halos (_halo_exchange); a shard_map body's ppermute is one too
# (CostModel._manual_tables adds it)
AR, AG, RS, A2A, CP = 0, 1, 2, 3, 4
NUM_KINDS = 5
# totals[...] layout: T_SCHEDULED is the step with collectives overlapped as XLA schedules
# them (see `schedule`), T_EXPOSED the communication it leaves on the critical path.
T_COMPUTE, T_COMM, T_FLOPS, T_TEMP, T_ARG, T_OUT, T_ALIAS, T_STATE, T_SCHEDULED, T_EXPOSED, \
    T_FLOPS_ONCE = range(11)
NUM_TOTALS = 11
# The most distinct shardings one shared value is gathered to (more are charged, not kept).
MAX_SHARDINGS = 16
# The ledger (`charges`): one row per place the kernel may charge a collective, so that each
# charge can be read back to its op (CostModel.op_collectives). Rows, with M op-type operands
# (TypeTables.op_operands), G op-type reductions (op_groups) and S shared reads: 2m and 2m + 1
# the all-gather and all-to-all of operand m; 2M + 2g and + 1 the reduce-scatter and all-reduce
# of group entry g (a contraction sharded on the result's axes and on others pays both; a
# variadic reduce's all-gather of its partial results is in the first entry's first row);
# 2M + 2G + 2s and + 1 the all-gather and all-to-all of shared read s; with S shared reads,
# 2M + 2G + 2S + OP_ROWS p and + 1 the all-to-all of the updates and the all-gather of the
# indices of op type p when it is a scatter partitioned by operand passthrough, + 2 the
# all-to-all of an explicitly batched gather's operand or scatter's result (_batched_indexing),
# + 3 the collective-permute of a matmul's reduced shard (evaluate_types), + 4, + 5 and + 6 the
# collective-permute and all-gather of the scatter's indices regrouped after operand
# passthrough and the all-reduce of its table there (_regrouped_indices), + 7, + 8 and + 9 the
# collective-permutes of a re-tiled batched gather's or scatter's indices, updates and result
# (_batched_indexing); with P op types, row
# 2M + 2G + 2S + OP_ROWS P + m the collective-permute that puts operand m's axes in order.
# then with M op-type operands, row 2M + 2G + 2S + OP_ROWS P + M + h the collective-permutes
# of halo record h (_halo_exchange); with H halo records, row 2M + 2G + 2S + OP_ROWS P + M +
# H + s the collective-permute that puts shared read s's axes in order.
# Columns below; a count of 0 is no charge. The hot path (`run`) passes a ledger of no rows
# and records nothing.
L_KIND, L_MASK, L_COUNT, L_BYTES, L_SECONDS = range(5)
LEDGER_WIDTH = 5
OP_ROWS = 10  # ledger rows per op type
# the operand each of them is charged to (-1: the op's partial sums, or its result)
OP_ROW_OPERANDS = (2, 1, 0, -1, 1, 1, -1, 1, 2, -1)


@njit(cache=True)
def ledger_layout(tables):
    """Where each part of the ledger starts (see above), and its length: (group rows, shared
    read rows, op-type rows, reorder rows, halo rows, shared read reorder rows, all rows). The
    kernel and CostModel.op_collectives both read it from here."""
    group_rows = 2 * tables.op_operands.shape[0]
    read_rows = group_rows + 2 * tables.op_groups.shape[0]
    scatter_rows = read_rows + 2 * tables.shared_reads.shape[0]
    reorder_rows = scatter_rows + OP_ROWS * tables.ops.shape[0]
    halo_rows = reorder_rows + tables.op_operands.shape[0]
    read_reorder_rows = halo_rows + tables.halos.shape[0]
    return (group_rows, read_rows, scatter_rows, reorder_rows, halo_rows, read_reorder_rows,
            read_reorder_rows + tables.shared_reads.shape[0])


@njit(cache=True, inline="always")
def _gather_time(nbytes, mask, mesh):
    """Seconds of an all-gather producing, or a reduce-scatter consuming, a buffer of nbytes
    per device over the axes of `mask` (an all-reduce is one of each)."""
    cost = mesh[mask]
    if nbytes <= 0.0 or cost.ways <= 1.0:
        return 0.0
    return nbytes * cost.gather_beta + cost.gather_alpha


@njit(cache=True, inline="always")
def _a2a_time(nbytes, mask, mesh):
    """Seconds of an all-to-all of a shard of nbytes per device over the axes of `mask`."""
    cost = mesh[mask]
    if nbytes <= 0.0 or cost.ways <= 1.0:
        return 0.0
    return nbytes * cost.a2a_beta + cost.gather_alpha


@njit(cache=True, inline="always")
def _charge(coll, kind, mask, weight, nbytes, seconds, ledger, row):
    """Adds `weight` collectives of one kind over `mask`, each moving nbytes in seconds, and
    records them in ledger row `row` (when the ledger has rows)."""
    coll[kind, mask, 0] += weight
    coll[kind, mask, 1] += nbytes * weight
    coll[kind, mask, 2] += seconds * weight
    if row < ledger.shape[0]:
        ledger[row, L_KIND] = kind
        ledger[row, L_MASK] = mask
        ledger[row, L_COUNT] = weight
        ledger[row, L_BYTES] = nbytes
        ledger[row, L_SECONDS] = seconds


@njit(cache=True, inline="always")
def _permute(coll, mask, weight, nbytes, mesh, ledger, row):
    """Charges `weight` collective-permutes over the axes of `mask`, each device sending
    nbytes, one hop; returns the seconds of one."""
    hop = mesh[mask]
    t = nbytes * hop.permute_beta + hop.permute_alpha
    _charge(coll, CP, mask, weight, nbytes, t, ledger, row)
    return t


@njit(cache=True, inline="always")
def _reshard(coll, gather, a2a, onto, nbytes, weight, mesh, ledger, row):
    """One operand brought to the sharding its op wants: the axes in `gather` all-gathered,
    those in `a2a` moved between dims, or, where `onto` is set, the one dim that `gather`
    shards handed to the axes of `onto` instead; nbytes is the operand's per-device size.
    Charges `weight` of each (ledger rows `row` and `row + 1`); returns (seconds, bytes) of
    one.

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
        seconds += _permute(coll, gather | onto, weight, nbytes, mesh, ledger, row + 1)
        moved += nbytes
        if old > new:  # the gather's group: part of `gather`, priced as those axes
            b = nbytes * old / new
            t = _gather_time(b, gather, mesh)
            _charge(coll, AG, gather, weight, b, t, ledger, row)
            seconds += t
            moved = b
        return seconds, moved
    if gather != 0:
        b = nbytes * mesh[gather].ways
        t = _gather_time(b, gather, mesh)
        seconds += t
        moved += b
        _charge(coll, AG, gather, weight, b, t, ledger, row)
        nbytes = b
    if a2a != 0:
        t = _a2a_time(nbytes, a2a, mesh)
        seconds += t
        moved += nbytes
        _charge(coll, A2A, a2a, weight, nbytes, t, ledger, row + 1)
    return seconds, moved


# How XLA reshards an operand some of whose axes move between dims (`_compatible_kind`)
CR_NONE, CR_GATHER, CR_SLICE = 0, 1, 2


@njit(cache=True, inline="always")
def _compatible_kind(o, operands, operand_rows, rows, held_rows, removed, added, held, mesh):
    """Whether operand type o, some of whose axes move to other dims, is one that XLA's
    partitioner reshards without an all-to-all (xla/service/spmd/spmd_partitioner.cc:
    ReshardNoCache tries these first; the compatible sharding is spmd_partitioner_util.cc's
    PartialReplicateReshardCompatibleSharding), each dim read by one row (no compound dims):
    - CR_GATHER: every dim keeps a number of tiles that divides what it has (the wanted
      sharding uses fewer devices; ReshardToPartialReplicateWithAllGather): the shard is
      collective-permuted to the devices of a sharding of as many tiles per dim whose
      replicated devices tile the dims that narrow, then all-gathered there;
    - CR_SLICE: every dim ends with a multiple of the tiles it has, the operand partially
      replicated (ReshardFromPartialReplicateWithDynamicSlice): each device slices its new
      tile out of what it holds, and a collective-permute puts the tiles on the devices the
      plan wants them on.
    An axis that moves between dims puts its tiles on other devices than the compatible
    sharding's either way, so the collective-permute is always there."""
    gather_ok = True
    slice_ok = held != mesh.shape[0] - 1  # the operand partially replicated
    seen = 0
    for i in range(operands[o].start, operands[o].end):
        r = operand_rows[i]
        if rows[r].compound > 0 or rows[r].kind == ROW_FROM_WHOLE or seen >> rows[r].dim & 1:
            return CR_NONE
        seen |= 1 << rows[r].dim
        have = held_rows[r]
        a, b = mesh[have].ways, mesh[(have & ~removed[r]) | added[r]].ways
        gather_ok = gather_ok and a % b == 0.0
        slice_ok = slice_ok and b % a == 0.0
    if gather_ok:
        return CR_GATHER
    if slice_ok:
        return CR_SLICE
    return CR_NONE


@njit(cache=True, inline="always")
def _compatible_reshard(coll, kind, o, operands, operand_rows, rows, held_rows, removed,
                        added, gone, shard, target, weight, mesh, ledger, row):
    """Charges the reshard `_compatible_kind` found for operand type o: one
    collective-permute, over the axes the operand holds or takes, of the shard it holds
    (`shard`, per device) for CR_GATHER or of the `target` shard it slices for CR_SLICE; and
    for CR_GATHER one all-gather per dim that narrows, the last dim first, each of the
    buffer the ones before made grown by that dim's factor (ReplicatePartial ->
    AllGatherShards). On data=4 x model=2, [8, 128, 64] from P("model", None, "data") to
    P(None, None, "model") is a permute of the 32 KiB shard and all-gathers to 64 and then
    128 KiB over halves of data, and back a local slice and a permute of the 32 KiB shard
    (jax 0.10.2); the model had charged an all-to-all of 128 KiB each way. The all-gathers
    are charged over `gone`, the axes the operand no longer holds anywhere (their groups are
    parts of those), in ledger row `row` as one record of their mean size; the permute in
    `row + 1`. Returns (seconds, bytes of the buffer made) of one."""
    moved = 0
    last = 0
    for i in range(operands[o].start, operands[o].end):
        r = operand_rows[i]
        moved |= held_rows[r] | added[r]
        last = max(last, rows[r].dim)
    if kind == CR_SLICE:
        return _permute(coll, moved, weight, target, mesh, ledger, row + 1), target
    seconds = _permute(coll, moved, weight, shard, mesh, ledger, row + 1)
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
            have = held_rows[r]
            f = mesh[have].ways / mesh[(have & ~removed[r]) | added[r]].ways
            if f > 1.0:
                size *= f
                n += 1.0
                total += size
                gather_seconds += _gather_time(size, gone, mesh)
        d -= 1
    if n > 0.0:
        _charge(coll, AG, gone, weight * n, total / n, gather_seconds / n, ledger, row)
    return seconds + gather_seconds, size


@njit(cache=True, inline="always")
def _order_of(plan, tables, t, d):
    """The order of the axes of dim d of value type t (ORDER_SHIFT: 0 for mesh order)."""
    c = tables.value_classes[t, d]
    return 0 if c < 0 else plan.mask[c] >> ORDER_SHIFT


@njit(cache=True, inline="always")
def _place(order, b):
    """Where axis bit `b` (its index) comes among a dim's axes listed in `order` (_order_of):
    smaller is more major."""
    if order == 0:
        return b
    for p in range(ORDER_SHIFT // 4):
        if (order >> (4 * p)) & 15 == b + 1:
            return p
    return 64 + b


@njit(cache=True, inline="always")
def _compound_split(held, order, size, mesh):
    """The axes of `held` (listed in `order`) on the major part, of `size` elements, of a
    compound dim: its axes tile the dim major first, so where the leading ones' ways make up
    `size` exactly they tile the major part and the rest the minor one; otherwise all are the
    major part's (an axis that straddles the two is not split)."""
    prefix = 0
    last = -1
    while True:
        nxt, at = 0, 1 << 30
        b = 0
        while (1 << b) < mesh.shape[0]:
            if held & (1 << b) != 0:
                p = _place(order, b)
                if last < p < at:
                    nxt, at = 1 << b, p
            b += 1
        if nxt == 0:
            return held
        prefix |= nxt
        last = at
        ways = mesh[prefix].ways
        if ways == size:
            return prefix
        if ways > size:
            return held


@njit(cache=True, inline="always")
def _out_of_order(kept, sliced, moved, held_order, want_order, moved_order, mesh):
    """Whether a dim that keeps the axes `kept` (listed in `held_order`), slices `sliced`
    locally and receives `moved` by all-to-all (or from the op's partial sums) ends up with
    its axes in another order than the plan's (`want_order`).

    XLA's reshard only ever subdivides a dim's tiles: a new axis lands minor to the axes the
    dim already has, the locally sliced ones before those an all-to-all brings (it slices
    first). Where the plan wants a new axis major to one the dim keeps (tokens on (data,
    model) whose micro-batches held data and examples model: data comes back minor), the
    devices hold the right tiles in the wrong order, and a collective-permute of the shard
    puts them in place (pairs (0,0),(1,2),(2,4),...: the transpose of data=4 x model=2;
    jax 0.10.2). Axes one all-to-all moves from one dim keep the order they had there
    (`moved_order`; -1 where they come from several dims: not compared): a width on (data,
    model) moved to channels the plan lists (model, data) arrives (data, model) and is
    permuted (nnx-cnn random0's pooling gradient, jax 0.10.2)."""
    b = 0
    while (1 << b) < mesh.shape[0]:
        x = 1 << b
        if (kept | sliced | moved) & x != 0:
            gx = 0 if kept & x != 0 else (1 if sliced & x != 0 else 2)
            c = 0
            while (1 << c) < mesh.shape[0]:
                y = 1 << c
                if c != b and (kept | sliced | moved) & y != 0 \
                        and _place(want_order, b) < _place(want_order, c):
                    gy = 0 if kept & y != 0 else (1 if sliced & y != 0 else 2)
                    # x is wanted before y: it must not arrive after it
                    if gx > gy or (gx == gy == 0
                                   and _place(held_order, b) > _place(held_order, c)):
                        return True
                    if (gx == gy == 2 and moved_order >= 0 and moved & x != 0
                            and moved & y != 0
                            and _place(moved_order, b) > _place(moved_order, c)):
                        return True
                c += 1
        b += 1
    return False


@njit(cache=True, inline="always")
def _gathered_out_of_order(kept, gone, held_order, mesh):
    """Whether a dim that all-gathers the axes `gone` and keeps `kept` (both listed in
    `held_order`) gathers an axis listed major to one it keeps.

    XLA's all-gather concatenates the tiles of a group in the group's device order, which
    only makes whole tiles of the kept axes where the gathered axes are the dim's minor ones
    (P(None, ("data", "model")) to P(None, "data"): each data tile's two model halves).
    Gathering a major axis (("model", "data") to "data"; ("data", "model") to "model") would
    interleave another tile's pieces: XLA first collective-permutes each device's shard so
    that the dim lists its axes kept first (pairs (0,0),(2,1),(4,2),...: the transpose of
    data=4 x model=2), then gathers (jax 0.10.2, tests/test_cost.py)."""
    b = 0
    while (1 << b) < mesh.shape[0]:
        if gone & (1 << b) != 0:
            c = 0
            while (1 << c) < mesh.shape[0]:
                if kept & (1 << c) != 0 and _place(held_order, b) < _place(held_order, c):
                    return True
                c += 1
        b += 1
    return False


@njit(cache=True, inline="always")
def _scatter_passthrough(coll, op, eff, vmask, psum, res_mask, mesh, w, ledger, row):
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
    all-to-all) and `row + 1` (the all-gather), and those of _regrouped_indices, which
    partitions the rest of the mesh the way XLA does after it."""
    window = 0
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
    t = _a2a_time(moved, contested, mesh)
    _charge(coll, A2A, contested, w, moved, t, ledger, row)
    regrouped = _regrouped_indices(coll, op, vmask, contested, res_mask, window, moved, mesh,
                                   w, ledger, row)
    if regrouped[0] >= 0.0:
        return contested, t + regrouped[0], moved + regrouped[1]
    gathered = indices * mesh[contested].ways
    tg = _gather_time(gathered, contested, mesh)
    _charge(coll, AG, contested, w, gathered, tg, ledger, row + 1)
    return contested, t + tg, moved + gathered


@njit(cache=True)  # rare (a contested scatter): a call, not inlined into the sweep
def _regrouped_indices(coll, op, vmask, contested, res_mask, window, moved, mesh, w, ledger,
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
    seconds += _permute(coll, full, w, piece, mesh, ledger, row + 4)
    made += piece
    if borrowed > 1.0:
        b = piece * borrowed
        t = _gather_time(b, contested, mesh)  # over part of the contested axes
        _charge(coll, AG, contested, w, b, t, ledger, row + 1)
        seconds += t
        made += b
    if ways_in_group <= 1.0:
        return seconds, made
    trivially_sliced = table / vocab + moved + indices
    index_passthrough = table + moved / ways_in_group + indices / ways_in_group
    if vocab > 1.0:
        index_passthrough = max(index_passthrough, table / vocab + table)
    if vocab > 1.0 and trivially_sliced <= index_passthrough:
        t = _gather_time(indices, rest, mesh)
        _charge(coll, AG, rest, w, indices, t, ledger, row + 5)
        return seconds + t, made + indices
    t = 2.0 * _gather_time(table, rest, mesh)  # an all-reduce: a reduce-scatter + all-gather
    _charge(coll, AR, rest, w, table, t, ledger, row + 6)
    return seconds + t, made


@njit(cache=True, inline="always")
def _updates_window(tables, ot, eff, removed):
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
    rows = tables.rows
    held = 0
    lost = 0
    for k in range(tables.operands[ot].start, tables.operands[ot].end):
        r = tables.operand_rows[k]
        if rows[r].kind == ROW_RESULT:
            held |= eff[rows[r].value_type, rows[r].dim]
            lost |= removed[r]
    return lost, held


@njit(cache=True, inline="always")
def _dims_mask(eff, t, dims):
    """The mesh axes value type t is sharded on over the dims in bit mask `dims`."""
    m = 0
    for d in range(eff.shape[1]):
        if dims >> d & 1:
            m |= eff[t, d]
    return m


@njit(cache=True, inline="always")
def _batched_indexing(coll, op, eff, vmask, mesh, w, ledger, row, tables, retiled):
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
    owed = int(mesh[_dims_mask(eff, bt, op.batch_indexed) & vmask[idx]].ways)
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
    t = _a2a_time(nbytes, axes, mesh)
    _charge(coll, A2A, axes, w, nbytes, t, ledger, row)
    held = vmask[idx]
    if not retiled[idx]:
        retiled[idx] = True
        piece = op.batch_indices_nbytes / mesh[held].ways
        t += _permute(coll, held | axes, w, piece, mesh, ledger, row + 5)
        nbytes += piece
    if op.scatter_updates > 0.0:
        ut = op.scatter_updates_type
        if vmask[ut] == held and not _uniform_operand(tables, op, ut):
            piece = op.scatter_updates / mesh[held].ways
            t += _permute(coll, held | axes, w, piece, mesh, ledger, row + 6)
            nbytes += piece
    elif op.result_type >= 0 and vmask[op.result_type] == held:
        piece = op.result_nbytes / mesh[held].ways
        t += _permute(coll, held | axes, w, piece, mesh, ledger, row + 7)
        nbytes += piece
    return t, nbytes


@njit(cache=True, inline="always")
def _uniform_operand(tables, op, value_type):
    """Whether op's operand of `value_type` is a constant of one number (OPERAND.uniform)."""
    for i in range(op.operands_start, op.operands_end):
        ot = tables.op_operands[i].operand_type
        if tables.operands[ot].value_type == value_type:
            return tables.operands[ot].uniform
    return False


@njit(cache=True, inline="always")
def _halo_sizes(h, n):
    """(left, right, span) of windowed dim `h` (a HALO record) of a convolution whose result
    is sharded `n` ways on it: the most input rows a shard takes from its left and its right
    neighbours' shards, and the rows of input each shard's windows span; (0, 0, 0) where
    XLA's partitioner does not exchange halos (then it computes the convolution from the
    whole input it was given and slices the result, no communication).

    PartitionedHlo::ReshardAsWindowedInput (spmd_partitioner.cc), which the convolution
    handler's PartitionConvolutionTiledOutput calls once it has sliced the input like the
    result: each of the n shards computes p = out / n windows; on the input padded with
    E = lo / b rows and dilated by b, shard j reads [start(j), limit(j)) with
        start(j) = (s p j + b - 1 - lo % b) / b
        limit(j) = (s p j + s (p - 1) + (k - 1) d + 1 + b - 1 - lo % b) / b
    (s stride, k window, d its dilation, b the input's, integer division), and holds
    [L j + E, L (j + 1) + E), L = ceil(in / n). Its left halo is L j + E - start(j), its right
    limit(j) - L (j + 1) - E; ExchangeHalo sends the largest left halo of shards 1..n-1 and
    the largest right halo of shards 0..n-2, in pieces of at most L rows, one
    collective-permute per piece and side (3x3 SAME stride 1: one row each way; stride 2:
    one row from the right only; 7x7 SAME stride 2: 2 rows from the left, 3 from the right;
    checked on 8 CPU devices, jax 0.10.2, tests/test_cost_halo.py). C++ division: E and
    lo % b truncate toward zero (a transposed convolution's padding may be negative). It
    gives up (returns nullopt, and the input stays whole) where s != 1 and s p is not a
    multiple of b, and ExchangeHalo where the halos and the shard cover every shard's rows
    while one side reaches past the next shard (left + right + L >= n L and left or right
    > L: a kernel gradient with the kernel's rows over data=4, halos of 9 rows over shards
    of 4; over model=2 it exchanges 6 of 8), or no row of its own shard is useful; halos of
    more than twice the span take ExchangeHaloCompact, which is not modelled: nothing is
    charged there."""
    k = h.window
    s = h.stride
    b = h.base_dilation
    lo = h.padding_low
    p = h.out_size // n
    dilated = (k - 1) * h.window_dilation + 1
    if p <= 0 or (s != 1 and (s * p) % b != 0):
        return 0, 0, 0
    E = abs(lo) // b if lo >= 0 else -(abs(lo) // b)
    plo = lo - E * b  # in (-b, b): the numerators below are never negative
    L = -(-h.in_size // n)
    span_s = s * (p - 1) + dilated
    left = -(1 << 62)
    right = -(1 << 62)
    left_all = -(1 << 62)
    right_all = -(1 << 62)
    span = 0
    for j in range(n):
        start = (s * p * j + b - 1 - plo) // b
        limit = (s * p * j + span_s + b - 1 - plo) // b
        left_all = max(left_all, L * j + E - start)
        right_all = max(right_all, limit - L * (j + 1) - E)
        if j >= 1:
            left = max(left, L * j + E - start)
        if j <= n - 2:
            right = max(right, limit - L * (j + 1) - E)
        span = max(span, limit - start)
    if (left + right + L >= L * n and (left > L or right > L)) or -left_all >= L + right_all \
            or max(left, right) > 2 * span:
        return 0, 0, 0
    return left, right, span


@njit(cache=True, inline="always")
def _halo_exchange(coll, op, halos, eff, psum, mesh, w, ledger, row):
    """The halo exchanges of a convolution whose result shards windowed dims (OP.halo_start;
    _halo_sizes says how many rows): charges their collective-permutes over each dim's axes
    (ledger rows row + h) and returns (seconds, bytes of the input shard with its halos, a
    buffer at the op).

    XLA slices the input like the result (its batch like the result's batch, its features on
    the axes the contraction is sharded over), then exchanges each sharded windowed dim in
    the input's dim order, the rows it sends spanning the dims done before with their halos
    (ReshardAsWindowedInput's loop over dims; height on data and width on model: the width
    halo is 1 + 4 + 1 rows high). plan.jit hands it the input whole on those dims (the rule's
    need-replication), so this comes on top of that all-gather: the partitioner slices the
    gathered input to the result's sharding first, then exchanges halos of the slice.

    An axis that shards the contracted features as well as a windowed dim of the result (a
    random plan's collision) is the dot handler's first: it partitions the contraction over
    that axis and the windowed dim stays whole within each group, to be sliced after the
    reduction (haiku-resnet: features and rows on model, columns on data: halos of
    [8, 4, 1, 4], rows whole, over data only; jax 0.10.2)."""
    rt = op.result_type
    mask = psum | eff[rt, op.halo_batch]
    unit = op.halo_nbytes / mesh[mask].ways
    held = 1.0  # the input's rows per device before the exchanges (its slice)
    for i in range(op.halo_start, op.halo_end):
        h = halos[i]
        unit /= h.in_size
        n = int(mesh[eff[rt, h.result_dim] & ~psum].ways)
        held *= h.in_size if n <= 1 else -(-h.in_size // n)
    seconds = 0.0
    exchanged = False
    done = 1.0  # extents of the dims exchanged so far, with their halos, over their slices
    for i in range(op.halo_start, op.halo_end):
        h = halos[i]
        m = eff[rt, h.result_dim] & ~psum
        n = int(mesh[m].ways)
        if n <= 1:
            continue
        L = -(-h.in_size // n)
        left, right, span = _halo_sizes(h, n)
        if span == 0:
            continue
        rows = max(left, 0) + max(right, 0)
        count = -(-max(left, 0) // L) + -(-max(right, 0) // L)
        if count > 0:
            nbytes = unit * held * done / L * rows
            hop = mesh[m]
            t = nbytes * hop.permute_beta + count * hop.permute_alpha
            _charge(coll, CP, m, w * count, nbytes / count, t / count, ledger, row + i)
            seconds += t
            exchanged = True
        done *= span / L
    return seconds, unit * held * done if exchanged else 0.0


@njit(cache=True, inline="always")
def _tiles(size, tile):
    return np.ceil(size / tile)


@njit(cache=True, inline="always")
def _matmul_efficiency(op, dims, eff, psum, mesh, dev):
    """The fraction of peak a matmul reaches at its per-device shape: the device's large-
    matmul ceiling, times the useful share of the blocks it computes. M, N and K are padded
    to whole tiles, and the tile x K-step blocks run in waves of `units` at a time: Hopper's
    cuBLAS and CUTLASS split K across SMs when M x N has too few tiles (stream-K, Osama et al.
    2023, arXiv 2301.03598). Before a reduce-scatter the partial result is whole on the
    scattered dims, so those count whole."""
    m = 1.0
    n = 1.0
    batch = 1.0
    for i in range(op.dims_start, op.dims_end):
        size = dims[i].size / mesh[eff[op.result_type, dims[i].dim] & ~psum].ways
        if dims[i].role == DIM_BATCH:
            batch *= size
        elif dims[i].role == DIM_M:
            m *= size
        else:
            n *= size
    k = op.matmul_k / mesh[psum].ways
    blocks = _tiles(m, dev.tile_m) * _tiles(n, dev.tile_n) * batch * _tiles(k, dev.tile_k)
    waves = np.ceil(blocks / dev.units)
    computed = waves * dev.units * dev.tile_m * dev.tile_n * dev.tile_k
    return dev.matmul * m * n * batch * k / computed


@njit(cache=True, inline="always")
def type_masks(plan, tables):
    """eff[T, D] bit masks per value type and dim; vmask[T] their union.

    Where a conflict resolution drops a dim, it is replicated; where two classes want one axis,
    the class decided first (lower rank) keeps it.
    """
    mask, rank, res = plan.mask, plan.rank, plan.resolution
    value_classes = tables.value_classes
    T, D = value_classes.shape
    eff = np.zeros((T, D), np.int64)
    vmask = np.zeros(T, np.int64)
    ranks = np.empty(D, np.int64)
    dims = np.empty(D, np.int64)
    for t in range(T):
        n = 0
        for d in range(D):
            c = value_classes[t, d]
            if c < 0 or mask[c] == 0:
                continue
            tag = tables.value_tags[t, d]
            if tag >= 0:
                k = tables.tag_conflict[tag]
                if mask[tables.conflict_class[k]] != 0 and tables.tag_dropped[tag, res[k]]:
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
            m = mask[value_classes[t, d]] & AXES  # (the order: _order_of)
            if m & used == 0:
                eff[t, d] = m
                used |= m
        vmask[t] = used
    return eff, vmask


@njit(cache=True)
def value_type_masks(plan, tables):
    """type_masks for PlanArrays and TypeTables given as plain tuples."""
    return type_masks(PlanArrays(*plan), TypeTables(*tables))


@njit(cache=True, inline="always")
def evaluate_types(plan, tables, mesh, device, ledger):
    """Everything but the liveness sweep: per type, so cheap whatever the depth. Records
    every charge in `ledger` when it has rows (see L_KIND)."""
    dev = device[0]
    group_rows, read_rows, scatter_rows, reorder_rows, halo_rows, read_reorder_rows, _ = \
        ledger_layout(tables)
    eff, vmask = type_masks(plan, tables)
    totals = np.zeros(NUM_TOTALS)
    coll = np.zeros((NUM_KINDS, mesh.shape[0], 3))  # count, bytes, time
    # Contractions: the axes all operands of a factor share.
    groups, members = tables.groups, tables.group_members
    consensus = np.zeros(groups.shape[0], np.int64)
    retiled = np.zeros(eff.shape[0], np.bool_)  # indices types a batched gather re-tiled
    for g in range(groups.shape[0]):
        c = -1
        for i in range(groups[g].start, groups[g].end):
            c &= eff[members[i].value_type, members[i].dim]
        consensus[g] = c
    # Operand rows: what each has, what the op wants.
    rows = tables.rows
    removed = np.zeros(rows.shape[0], np.int64)
    added = np.zeros(rows.shape[0], np.int64)
    onto_whole = np.zeros(rows.shape[0], np.int64)  # added on a dim that is whole now
    held_rows = np.zeros(rows.shape[0], np.int64)  # the axes each row's part of its dim holds
    for r in range(rows.shape[0]):
        row = rows[r]
        actual = 0 if row.kind == ROW_FROM_WHOLE else eff[row.value_type, row.dim]
        if row.compound > 0:  # a compound dim's axes, split between its parts
            held = eff[row.value_type, row.dim]
            major = _compound_split(held, _order_of(plan, tables, row.value_type, row.dim),
                                    row.compound, mesh)
            actual = held & ~major if row.kind == ROW_FROM_WHOLE else major
        held_rows[r] = actual
        if row.kind == ROW_RESULT or row.kind == ROW_FROM_WHOLE:
            want = eff[row.source_type, row.source_dim]
            if row.src_compound != 0:  # a merged dim's axes, split between its parts
                major = _compound_split(want, _order_of(plan, tables, row.source_type,
                                                        row.source_dim),
                                        abs(row.src_compound), mesh)
                want = major if row.src_compound > 0 else want & ~major
        elif row.kind == ROW_GROUP:
            want = consensus[row.group]
        else:
            want = 0
        removed[r] = actual & ~want
        added[r] = want & ~actual
        if actual == 0:
            onto_whole[r] = added[r]
    # Operands: the axes to all-gather (removed, not added elsewhere) and to move (both). The
    # axes only added, onto a dim each device holds whole, are sliced first, locally: XLA's
    # reshard takes its part of that dim before it communicates, so a gather or an all-to-all
    # moves 1/ways of the operand (P("data") to P(None, "model") on data=4 x model=2
    # all-gathers a [64, 32] shard of a [64, 64] array, not all of it; jax 0.10.2). An axis
    # added onto a dim sharded otherwise (P(None, "data") to P(None, "model")) is not local.
    operands, operand_rows = tables.operands, tables.operand_rows
    gather = np.zeros(operands.shape[0], np.int64)
    a2a = np.zeros(operands.shape[0], np.int64)
    sliced = np.zeros(operands.shape[0], np.int64)
    onto = np.zeros(operands.shape[0], np.int64)  # a dim's new axes, where it is permuted
    reorder = np.zeros(operands.shape[0], np.int64)  # a dim's axes, where put back in order
    reorder_reduced = np.zeros(operands.shape[0], np.bool_)  # ... as the op's result
    reorder_first = np.zeros(operands.shape[0], np.bool_)  # ... before it is gathered
    compatible = np.zeros(operands.shape[0], np.int64)  # _compatible_kind, where not CR_NONE
    compatible_held = np.zeros(operands.shape[0], np.int64)  # ... the axes it ends with
    for o in range(operands.shape[0]):
        rem = 0
        add = 0
        local = 0
        for i in range(operands[o].start, operands[o].end):
            rem |= removed[operand_rows[i]]
            add |= added[operand_rows[i]]
            local |= onto_whole[operand_rows[i]]
        gather[o] = rem & ~add
        a2a[o] = rem & add
        sliced[o] = local & ~rem
        held = vmask[operands[o].value_type]
        if a2a[o] != 0 and not operands[o].uniform:
            compatible[o] = _compatible_kind(o, operands, operand_rows, rows, held_rows,
                                             removed, added, held, mesh)
            if compatible[o] != CR_NONE:
                compatible_held[o] = (held & ~rem) | add
                continue
        if gather[o] != 0 and a2a[o] != 0:
            # An axis that leaves a dim together with one that moves to another dim
            # (P(("data", "model")) to P(None, "model")) is a reshard XLA's partitioner
            # cannot split: "involuntary full rematerialization", it all-gathers the operand
            # whole and slices the target out of it (spmd_partitioner.cc; jax 0.10.2). An
            # axis that only changes place within its dim (a reshape's merged dim on
            # ("data", "model") whose major factor wants "model") is gathered, then moved.
            for i in range(operands[o].start, operands[o].end):
                r = removed[operand_rows[i]]
                if r & gather[o] == 0 or r & a2a[o] == 0:
                    continue
                back = 0  # the moving axes added again on this dim
                for j in range(operands[o].start, operands[o].end):
                    if rows[operand_rows[j]].dim == rows[operand_rows[i]].dim:
                        back |= added[operand_rows[j]]
                if r & a2a[o] & ~back != 0:
                    gather[o] = vmask[operands[o].value_type]
                    a2a[o] = 0
                    sliced[o] = 0
                    break
        if a2a[o] != 0 and gather[o] == 0:
            # Each dim only split finer (its new ways a multiple of its old on every part, an
            # axis leaving a dim that gains more: heads on model read as heads on data and
            # their features on model): every device's new tile lies inside some device's
            # old one, and XLA slices it there and collective-permutes it, rather than run an
            # all-to-all (jax 0.10.2: [8, 4, 8] P(None, "model") to P(None, "data",
            # "model") on data=4 x model=2 permutes the 128 B shard; tests/test_cost.py).
            finer = True
            for i in range(operands[o].start, operands[o].end):
                r = operand_rows[i]
                new = (held_rows[r] & ~removed[r]) | added[r]
                if mesh[new].ways % mesh[held_rows[r]].ways != 0.0:
                    finer = False
            if finer:
                reorder[o] = rem | add
                reorder_first[o] = True
                sliced[o] = add
                a2a[o] = 0
                continue
        if operands[o].uniform:
            # A constant of one number throughout (optax.set_to_zero's zeros for a frozen
            # parameter under ZeRO-1): XLA all-gathers nothing, the gathered form is the same
            # broadcast of the scalar; an all-to-all of it stays (jax 0.10.2).
            gather[o] = 0
        elif gather[o] != 0 and a2a[o] == 0 and sliced[o] == 0:
            # One dim whose axes all leave for axes the operand does not hold, nothing else
            # changing: permuted, not gathered whole (_reshard), where one axis group's ways
            # divide the other's.
            dim = -1
            new = 0
            held = 0
            for i in range(operands[o].start, operands[o].end):
                r = operand_rows[i]
                if removed[r] != 0:
                    if dim >= 0 and rows[r].dim != dim:
                        dim = -2
                        break
                    dim = rows[r].dim
                    held = eff[rows[r].value_type, dim]
            if dim >= 0:
                for i in range(operands[o].start, operands[o].end):
                    r = operand_rows[i]
                    if rows[r].dim == dim:
                        new |= added[r]
                old = gather[o]
                a, b = mesh[old].ways, mesh[new].ways
                if (new != 0 and held == old and new & vmask[operands[o].value_type] == 0
                        and (a % b == 0.0 or b % a == 0.0)):
                    onto[o] = new
        if onto[o] != 0 or (gather[o] != 0 and gather[o] == vmask[operands[o].value_type]):
            continue  # permuted, or gathered whole and sliced as wanted: in order
        # A dim whose axes arrive out of the plan's order (_out_of_order): one
        # collective-permute over its axes, of the resharded operand's shard, or of the
        # result's where the new axes are the op's partial sums (an all-reduce then a slice).
        rem = gather[o] | a2a[o]
        for i in range(operands[o].start, operands[o].end):
            r = operand_rows[i]
            if rows[r].kind != ROW_RESULT and rows[r].kind != ROW_FROM_WHOLE:
                continue
            kept = held_rows[r] & ~removed[r]
            gone = removed[r] & gather[o]
            if gone != 0 and kept != 0 and _gathered_out_of_order(
                    kept, gone, _order_of(plan, tables, rows[r].value_type, rows[r].dim), mesh):
                # the shard is permuted before the gather (_gathered_out_of_order)
                reorder[o] |= held_rows[r]
                reorder_first[o] = True
                continue
            want = kept | added[r]
            if want & (want - 1) == 0:
                continue  # one axis or none: nothing to order
            held_order = _order_of(plan, tables, rows[r].value_type, rows[r].dim)
            want_order = _order_of(plan, tables, rows[r].source_type, rows[r].source_dim)
            if added[r] == 0 and held_order == want_order:
                continue  # nothing arrives and the order is the same (most rows, every search)
            moved = added[r] & a2a[o]
            # Axes the operand keeps on a dim a reduction sums over, where plan.jit pins the
            # read sliced like the result (OPERAND.sliced_first): they come after that slice,
            # from the all-reduced partial sums (a bias gradient summed over a batch on
            # `model` into features on (model, data): data sliced, model after, permuted;
            # cnn random1, jax 0.10.2). Elsewhere XLA reduces the operand whole on the
            # result's dims and slices the all-reduced sums in the plan's order (a matmul's
            # or convolution's, an unpinned reduce_sum's: no permute).
            reduced = 0
            if operands[o].sliced_first:
                reduced = added[r] & vmask[operands[o].value_type] & ~rem
            moved_order = -1
            if moved & (moved - 1) != 0 and reduced == 0:
                for j in range(operands[o].start, operands[o].end):
                    if removed[operand_rows[j]] & moved == moved:
                        moved_order = _order_of(plan, tables, rows[operand_rows[j]].value_type,
                                                rows[operand_rows[j]].dim)
            if _out_of_order(kept, added[r] & ~moved & ~reduced, moved | reduced, held_order,
                             want_order, moved_order, mesh):
                reorder[o] |= want
                if added[r] & vmask[operands[o].value_type] & ~rem != 0:
                    reorder_reduced[o] = True
    # Op types: the axes each computes partial sums over, and its result's axes.
    ops = tables.ops
    P = ops.shape[0]
    op_psum = np.zeros(P, np.int64)
    op_res = np.zeros(P, np.int64)
    for p in range(P):
        for i in range(ops[p].groups_start, ops[p].groups_end):
            g = tables.op_groups[i]
            if groups[g].is_reduction:
                op_psum[p] |= consensus[g]
        if ops[p].result_type >= 0:
            op_res[p] = vmask[ops[p].result_type]
    op_compute = np.zeros(P)
    op_comm = np.zeros(P)
    gathered = np.zeros(P)
    member_bytes = np.zeros(tables.op_operands.shape[0])  # the buffer each reshard makes
    # per execution of each op type: operand reshards of early values (prefetchable), of
    # others, and the reduction of its partial sums after it
    pre_early = np.zeros(P)
    pre_late = np.zeros(P)
    post = np.zeros(P)
    reduced = np.zeros(P)
    reduces = np.zeros(P, np.bool_)  # the op reduces partial sums (a scalar's too)
    for p in range(P):
        op = ops[p]
        w = op.weight
        gtime = 0.0
        gbytes = 0.0
        for i in range(op.operands_start, op.operands_end):
            member = tables.op_operands[i]
            ot = member.operand_type
            pdb = member.nbytes / mesh[vmask[operands[ot].value_type]].ways
            g = gather[ot]
            resliced = pdb / mesh[sliced[ot]].ways
            t = 0.0
            b = 0.0
            if member.scatter_updates and a2a[ot] == 0 and member.nbytes > op.result_nbytes:
                lost, held = _updates_window(tables, ot, eff, removed)
                if lost & op_res[p] != 0:  # the result moves, not the updates
                    g &= ~lost
                    if lost == held and lost & ~op_res[p] == 0:
                        b = op.result_nbytes / mesh[op_res[p]].ways
                        t = _a2a_time(b, lost, mesh)
                        _charge(coll, A2A, lost, w, b, t, ledger, 2 * i + 1)
                    else:  # XLA's "involuntary full rematerialization" of the result
                        b = op.result_nbytes
                        t = _gather_time(b, held, mesh)
                        _charge(coll, AG, held, w, b, t, ledger, 2 * i)
            if compatible[ot] != CR_NONE:
                tg, bg = _compatible_reshard(coll, compatible[ot], ot, operands, operand_rows,
                                             rows, held_rows, removed, added, g, pdb,
                                             member.nbytes / mesh[compatible_held[ot]].ways,
                                             w, mesh, ledger, 2 * i)
            else:
                tg, bg = _reshard(coll, g, a2a[ot], onto[ot], resliced, w, mesh, ledger,
                                  2 * i)
            t += tg
            b += bg
            if reorder[ot] != 0:
                if reorder_first[ot]:  # the operand's shard, after its local slices
                    shard = member.nbytes / mesh[vmask[operands[ot].value_type]
                                                 | sliced[ot]].ways
                elif reorder_reduced[ot]:
                    shard = op.result_nbytes / mesh[op_res[p]].ways
                else:
                    final = (vmask[operands[ot].value_type] & ~g) | sliced[ot] | reorder[ot]
                    shard = member.nbytes / mesh[final].ways
                # (its buffer takes the place of the reshard's: no new bytes)
                t += _permute(coll, reorder[ot], w, shard, mesh, ledger, reorder_rows + i)
            gtime += t
            gbytes += b
            member_bytes[i] = b
            if member.early:
                pre_early[p] += t
            else:
                pre_late[p] += t
        gathered[p] = gbytes
        if op.halo_end > op.halo_start:
            t, b = _halo_exchange(coll, op, tables.halos, eff, op_psum[p], mesh, w, ledger,
                                  halo_rows)
            gtime += t
            pre_late[p] += t
            gathered[p] += b
        if op.workspace > 0.0:
            gathered[p] += op.workspace / mesh[vmask[op.workspace_type]].ways
        psum = op_psum[p]
        res_mask = op_res[p]
        ptime = 0.0
        if op.scatter_updates > 0.0 and psum != 0:
            taken, t, b = _scatter_passthrough(coll, op, eff, vmask, psum, res_mask, mesh, w,
                                               ledger, scatter_rows + OP_ROWS * p)
            psum &= ~taken
            gtime += t
            gathered[p] += b
            pre_late[p] += t
        # a gather's operand re-tiled before it, a scatter's result after it
        after = 0.0
        if op.batch_index_dims != 0:
            t, b = _batched_indexing(coll, op, eff, vmask, mesh, w, ledger,
                                     scatter_rows + OP_ROWS * p + 2, tables, retiled)
            gathered[p] += b
            if op.scatter_updates > 0.0:
                after += t
            else:
                gtime += t
                pre_late[p] += t
        lead = op.sum_leader
        if psum != 0 and op.gathered_partials > 0.0:
            # A variadic reduce (an argmax's value and index): XLA all-gathers each shard's
            # partial results over the reduced axes and reduces them again (_static.
            # _gathered_partials); the gathered buffer is a temporary at the op.
            size = op.gathered_partials / mesh[res_mask].ways * mesh[psum].ways
            t = _gather_time(size, psum, mesh)
            _charge(coll, AG, psum, w, size, t, ledger, group_rows + 2 * op.groups_start)
            gathered[p] += size
            ptime += t
        elif psum != 0 and not (lead >= 0 and op_psum[lead] == psum
                                and op_res[lead] == res_mask):
            # (an op whose partial sums are added to its leader's, sharded alike, is reduced
            # there, once: XLA's AllReduceReassociate)
            reduces[p] = True
            result_bytes = op.result_nbytes / mesh[res_mask].ways
            partial = result_bytes * mesh[psum & res_mask].ways
            # before a reduce-scatter the partial sums are whole on the scattered dims: a
            # temporary larger than the result, at this op
            gathered[p] += partial - result_bytes
            # One collective per sharded contraction factor, as XLA emits them (a weight
            # gradient contracted over batch on `data` and sequence on `model` is reduced over
            # `data`, then over `model`); the reduce-scatters over the axes the result is
            # sharded on first, so that the all-reduces over the others (a slow data-parallel
            # axis) carry only the shard, as NCCL's and XLA's hierarchical reductions do.
            size = partial
            done = 0
            for scatter in (True, False):
                for i in range(op.groups_start, op.groups_end):
                    g = tables.op_groups[i]
                    if not groups[g].is_reduction:
                        continue
                    m = consensus[g] & ~done & (res_mask if scatter else ~res_mask)
                    if m == 0:
                        continue
                    done |= m
                    free = (mesh.shape[0] - 1) & ~res_mask & ~psum
                    if (scatter and m == psum and op.gather > 0 and op.batch_nbytes == 0.0
                            and vmask[op.gather - 1] == m
                            and vmask[op.gather_indices - 1] & m == 0):
                        # A gather of rows sliced over `m` (trivially sliced operand, sharded
                        # on nothing else) by indices whole over `m`, its result sharded on
                        # the rows' features over `m` too (the indices' dims cannot hold it):
                        # XLA's gather partitioner all-reduces the masked partial result and
                        # reshards it, no reduce-scatter. Before the all-reduce it slices the
                        # partial over the axes that are the same within each `m` group (the
                        # result's other axes, then `free` up to m's ways); where that slice
                        # is not a superset of the device's tile (sliced over `free`, or a
                        # dim holding `m` after other axes) a collective-permute of the tile
                        # brings it (x: P("data") gathered to P(None, "data") on data=4 x
                        # model=2: an all-reduce of 1/2 over data, a permute of 1/4; x:
                        # P("model") to P(None, "model"): 1/2 and 1/2; jax 0.10.2,
                        # tests/test_gathers.py).
                        s = min(mesh[m].ways, mesh[free].ways)
                        size /= s
                        t = 2.0 * _gather_time(size, m, mesh)
                        _charge(coll, AR, m, w, size, t, ledger, group_rows + 2 * i + 1)
                        mixed = False
                        for d in range(eff.shape[1]):
                            a = eff[op.result_type, d]
                            mixed = mixed or (a & m != 0 and a & ~m != 0)
                        if s > 1.0 or mixed:  # a piece: moved to its own tile
                            t += _permute(coll, m | free | res_mask, w, result_bytes, mesh,
                                          ledger, scatter_rows + OP_ROWS * p + 3)
                        gathered[p] -= partial - size
                        reduced[p] = max(reduced[p], size)
                    elif (scatter and m == psum and op.matmul_k > 0.0 and free != 0
                            and mesh[free].ways % mesh[m].ways == 0.0):
                        # A matmul whose partial sums all go to the axes its result is
                        # sharded on, with mesh axes its result is replicated over (`free`)
                        # of a multiple of their ways: XLA's dot partitioner computes each
                        # device's result already sliced over part of `free` (a local slice
                        # of the operand), all-reduces that shard over `m`, and moves it to
                        # the device that holds it in the result's sharding: a
                        # collective-permute of the shard (x: P(None, None, "model") @ w:
                        # P("model") to P(None, None, "model") on data=4 x model=2: an
                        # all-reduce of 1/2 of the result over model, a permute of the same
                        # 1/2, no reduce-scatter; free axes of too few ways, or none, keep
                        # the reduce-scatter; jax 0.10.2, tests/test_cost.py). It comes from
                        # the SPMD partitioner, so every platform's XLA emits it.
                        size /= mesh[m].ways
                        t = 2.0 * _gather_time(size, m, mesh)
                        _charge(coll, AR, m, w, size, t, ledger, group_rows + 2 * i + 1)
                        t += _permute(coll, m | free, w, size, mesh, ledger,
                                      scatter_rows + OP_ROWS * p + 3)
                        # the partial sums are never whole: no temporary beyond the shard
                        gathered[p] -= partial - result_bytes
                        reduced[p] = max(reduced[p], size)
                    elif scatter:
                        t = _gather_time(size, m, mesh)
                        _charge(coll, RS, m, w, size, t, ledger, group_rows + 2 * i)
                        if not dev.reduce_scatter:  # XLA:CPU: an all-reduce of it all,
                            reduced[p] = max(reduced[p], size)  # then a slice
                        size /= mesh[m].ways  # what the next reduction carries, either way
                    else:
                        t = 2.0 * _gather_time(size, m, mesh)
                        _charge(coll, AR, m, w, size, t, ledger, group_rows + 2 * i + 1)
                        # the all-reduce writes a new buffer; of a chain of them (one per
                        # factor), each reads the last one's: two are live at once
                        reduced[p] = max(reduced[p], size)
                    ptime += t
        # a shard_map's flops are one device's run of its body already
        flops = op.flops if op.kernel == KERNEL_MANUAL else op.flops / mesh[res_mask | psum].ways
        rate = op.peak
        if op.kernel == KERNEL_ATTENTION:
            rate *= dev.attention / op.flop_scale
        elif op.kernel == KERNEL_INSIDE:
            rate = np.inf  # runs inside a fused kernel, charged with its matmuls
        elif op.matmul_k > 0.0:
            rate *= _matmul_efficiency(op, tables.op_dims, eff, psum, mesh, dev)
        traffic = 0.0
        for i in range(op.io_start, op.io_end):
            traffic += tables.op_io[i].nbytes / mesh[vmask[tables.op_io[i].value_type]].ways
        # no kernel runs faster than the device's floor (launch and ramp: Efficiency.launch_s)
        compute = max(flops / rate, traffic / dev.memory_bandwidth,
                      op.launches * dev.launch_s) * w
        op_compute[p] = compute
        ptime += after
        op_comm[p] = (gtime + ptime) * w
        post[p] = ptime
        totals[T_COMPUTE] += compute
        totals[T_COMM] += op_comm[p]
        totals[T_FLOPS] += flops * w
        totals[T_FLOPS_ONCE] += flops * op.count * op.copies
    # Values read by several ops: gathered once per sharding, the buffer kept until its last
    # reader (XLA's CSE of all-gathers: FSDP gathers a weight once for forward and backward).
    # Under per-domain overrides, a relayout plan.jit pins is gathered apart (SHARED_READ).
    # A read of a relayout the compiler writes out (a `rev` of the gathered kernel) shares the
    # gather but holds a buffer of its own, from when the relayout runs to its reader; the
    # gathered value lives until then. Where the compiler runs each op as soon as it can
    # (XLA:CPU) the reverse runs right after the gather, and the gathered kernel is freed
    # after the forward; elsewhere it runs by its reader, and the gathered kernel is held
    # from the forward to the backward.
    gdelta = np.zeros(tables.num_ops + 2)
    read_time = np.zeros(tables.shared_reads.shape[0])  # per execution, where charged
    overridden = False
    for s in range(tables.split_base.shape[0]):
        if plan.mask[s] != plan.mask[tables.split_base[s]]:
            overridden = True
    kept_gather = np.empty(MAX_SHARDINGS, np.int64)
    kept_a2a = np.empty(MAX_SHARDINGS, np.int64)
    kept_pin = np.empty(MAX_SHARDINGS, np.int64)
    kept_sliced = np.empty(MAX_SHARDINGS, np.int64)
    kept_onto = np.empty(MAX_SHARDINGS, np.int64)
    kept_reorder = np.empty(MAX_SHARDINGS, np.int64)
    kept_compatible = np.empty(MAX_SHARDINGS, np.int64)
    kept_bytes = np.empty(MAX_SHARDINGS)
    kept_start = np.empty(MAX_SHARDINGS, np.int64)
    kept_end = np.empty(MAX_SHARDINGS, np.int64)
    copy_key = np.empty(MAX_SHARDINGS, np.int64)
    copy_bytes = np.empty(MAX_SHARDINGS)
    copy_start = np.empty(MAX_SHARDINGS, np.int64)
    copy_end = np.empty(MAX_SHARDINGS, np.int64)
    reads = tables.shared_reads
    for v in range(tables.shared_values.shape[0]):
        nk = 0
        nc = 0
        for j in range(tables.shared_values[v].start, tables.shared_values[v].end):
            read = reads[j]
            ot = read.operand_type
            g = gather[ot]
            a = a2a[ot]
            if reorder_reduced[ot]:
                # the reading op's result, put in order after its reduction: at every reader
                p = read.op_type
                t = _permute(coll, reorder[ot], read.trip,
                             ops[p].result_nbytes / mesh[op_res[p]].ways, mesh, ledger,
                             read_reorder_rows + j)
                op_comm[p] += t * read.trip
                totals[T_COMM] += t * read.trip
                read_time[j] += t
            if g == 0 and a == 0:
                continue
            pin = read.pinned if overridden else -1
            sl = sliced[ot]
            found = -1
            for k in range(nk):
                if (kept_gather[k] == g and kept_a2a[k] == a and kept_pin[k] == pin
                        and kept_sliced[k] == sl and kept_onto[k] == onto[ot]
                        and kept_reorder[k] == reorder[ot]
                        and kept_compatible[k] == compatible[ot]):
                    found = k
                    break
            if found < 0 and g != 0 and a != 0:
                # A reshard that both gathers and moves axes, of a value the step has already
                # gathered whole: XLA's partitioner slices that replicated copy locally
                # (ReshardNoCache's last resort is Replicate(), which takes a replicated copy
                # from its reshard cache). Seen on gpt_scan with the tied embedding table on
                # (model, data): gathered whole for the logits, then sliced, not moved, for
                # the input gradient's `embed` on data (jax 0.10.2, spmd_partitioner.cc).
                whole = vmask[operands[ot].value_type]
                for k in range(nk):
                    if (kept_gather[k] == whole and kept_a2a[k] == 0 and kept_pin[k] == pin
                            and kept_sliced[k] == 0 and kept_onto[k] == 0):
                        found = k
                        break
            at = read.memory_position
            if found < 0:
                pdb = read.nbytes / mesh[vmask[operands[ot].value_type]].ways
                if compatible[ot] != CR_NONE:
                    t, b = _compatible_reshard(coll, compatible[ot], ot, operands,
                                               operand_rows, rows, held_rows, removed, added,
                                               g, pdb,
                                               read.nbytes / mesh[compatible_held[ot]].ways,
                                               read.trip, mesh, ledger, read_rows + 2 * j)
                else:
                    t, b = _reshard(coll, g, a, onto[ot], pdb / mesh[sl].ways, read.trip,
                                    mesh, ledger, read_rows + 2 * j)
                if reorder[ot] != 0 and not reorder_reduced[ot]:
                    # put in order once, as the reshard it ends (XLA's reshard cache)
                    final = (vmask[operands[ot].value_type] & ~g) | sl | reorder[ot]
                    t += _permute(coll, reorder[ot], read.trip, read.nbytes / mesh[final].ways,
                                  mesh, ledger, read_reorder_rows + j)
                op_comm[read.op_type] += t * read.trip
                totals[T_COMM] += t * read.trip
                read_time[j] += t
                if nk == MAX_SHARDINGS:
                    continue
                found = nk
                nk += 1
                kept_gather[found] = g
                kept_a2a[found] = a
                kept_pin[found] = pin
                kept_sliced[found] = sl
                kept_onto[found] = onto[ot]
                kept_reorder[found] = reorder[ot]
                kept_compatible[found] = compatible[ot]
                kept_bytes[found] = b
                kept_start[found] = tables.num_ops + 1  # empty until a direct read
                kept_end[found] = 0
            if read.copy_of < 0:
                kept_start[found] = min(kept_start[found], read.ready)
                kept_end[found] = max(kept_end[found], at + 1)
                continue
            c = -1
            for k in range(nc):
                if copy_key[k] == read.copy_of * MAX_SHARDINGS + found:
                    c = k
                    break
            if c < 0:
                if nc == MAX_SHARDINGS:
                    continue
                c = nc
                nc += 1
                copy_key[c] = read.copy_of * MAX_SHARDINGS + found
                copy_bytes[c] = kept_bytes[found]
                copy_start[c] = read.ready
                copy_end[c] = at + 1
            copy_start[c] = min(copy_start[c], read.ready)
            copy_end[c] = max(copy_end[c], at + 1)
            # the gathered value lives until the relayout is made from it
            kept_start[found] = min(kept_start[found], read.ready)
            kept_end[found] = max(kept_end[found], read.ready + 1)
        for k in range(nk):
            if kept_end[k] > kept_start[k]:
                gdelta[kept_start[k]] += kept_bytes[k]
                gdelta[kept_end[k]] -= kept_bytes[k]
        for k in range(nc):
            gdelta[copy_start[k]] += copy_bytes[k]
            gdelta[copy_end[k]] -= copy_bytes[k]
    reshards = (pre_early, pre_late, post, read_time)
    # the operands only sliced locally (nothing gathered or moved), by axes the operand does
    # not hold on another dim: by what. (An axis that also shards a contracted dim, a
    # ZeRO-1 weight gradient's on data like the batch it sums over, slices nothing: XLA
    # computes the whole partial sums and reduce-scatters them.)
    only_sliced = np.zeros(operands.shape[0], np.int64)
    for o in range(operands.shape[0]):
        if gather[o] == 0 and a2a[o] == 0 and sliced[o] & vmask[operands[o].value_type] == 0:
            only_sliced[o] = sliced[o]
    return (totals, coll, op_compute, op_comm, gathered, eff, vmask, gdelta, reshards, reduced,
            member_bytes, reduces, only_sliced)


@njit(cache=True, inline="always")
def schedule(sched, ops, reads, op_compute, reshards):
    """The step's length with collectives overlapping compute the way XLA's latency-hiding
    scheduler runs them: asynchronously, one at a time on a communication stream, each
    started as soon as its data and the stream allow.

    - A reshard of a value known before any compute (a parameter: FSDP's all-gathers) is
      prefetched: it starts as soon as the stream is free (XLA's latency-hiding scheduler
      moves such collectives as early as its memory limit allows; that limit is not modelled).
    - A reshard of a computed value starts once the op making it has finished.
    - An op waits for its operands' reshards; a reduction of partial sums (a gradient's
      reduce-scatter or all-reduce) starts after its op and is waited for only by the first
      op reading the result (the optimizer, for a gradient), so later compute hides it.
    - A loop body is walked twice: the first iteration, then one in the steady state (whose
      prefetches overlap the iteration before), which stands for the remaining ones.
    Returns the step's seconds.
    """
    pre_early, pre_late, post, read_time = reshards
    P = op_compute.shape[0]
    run = np.empty(P)  # seconds of one execution
    busy = np.zeros(P, np.bool_)  # the type has collectives of its own
    for p in range(P):
        w = ops[p].weight
        run[p] = op_compute[p] / w if w > 0.0 else 0.0
        busy[p] = pre_early[p] > 0.0 or pre_late[p] > 0.0 or post[p] > 0.0
    order = sched.reads_in_order
    N = sched.op_type.shape[0]
    finish = np.empty(N)
    wait = np.zeros(N + 1)
    clock = 0.0     # when the next op may start
    stream = 0.0    # when the communication stream is free
    k = 0           # the next shared read, in program order
    loop_start = 0  # the loop body being walked: its first op and shared read
    loop_k = 0
    second = False  # walking its steady-state iteration
    loop_clock = 0.0
    loop_stream = 0.0
    n = 0
    while n < N:
        p = sched.op_type[n]
        if wait[n] > clock:
            clock = wait[n]
        if not (busy[p] or sched.event[n]):
            clock += run[p]
            finish[n] = clock
            n += 1
            continue
        if sched.body_first[n] and not second:
            loop_start = n
            loop_k = k
        early = pre_early[p]
        late = pre_late[p]
        while k < order.shape[0] and reads[order[k]].position == n:
            if reads[order[k]].early:
                early += read_time[order[k]]
            else:
                late += read_time[order[k]]
            k += 1
        start = clock
        if early > 0.0:
            stream += early
            start = max(start, stream)
        if late > 0.0:
            r = sched.ready[n]
            stream = max(stream, finish[r] if r >= 0 else 0.0) + late
            start = max(start, stream)
        clock = start + run[p]
        finish[n] = clock
        if post[p] > 0.0:
            stream = max(stream, clock) + post[p]
            d = sched.deadline[n]
            if stream > wait[d]:
                wait[d] = stream
        trip = sched.body_last_trip[n]
        if trip > 1.0:
            if not second:  # walk the body again, in the steady state
                second = True
                loop_clock = clock
                loop_stream = stream
                n = loop_start
                k = loop_k
                continue
            second = False
            clock = loop_clock + (clock - loop_clock) * (trip - 1.0)
            stream = max(stream, loop_stream + (stream - loop_stream) * (trip - 1.0))
        n += 1
    return max(clock, wait[N], stream)



@njit(cache=True)
def run(plan, tables, mesh, device, memory, sched, delta, old_vmask, fresh):
    """One plan, whole: (totals, collectives, per-op-type compute and communication s,
    the value-type masks the temporaries are sized under: held_masks). plan, tables and
    memory: PlanArrays, TypeTables and MemoryTables as plain tuples (see _tables.py), and
    sched a ScheduleTables.

    fresh: size the temporaries from scratch (delta and old_vmask are not read). Otherwise
    delta holds the live-range deltas of the temporaries sized under `old_vmask`; they are
    moved, in place, to the plan's masks (incremental evaluation).
    """
    tables = TypeTables(*tables)
    memory = MemoryTables(*memory)
    totals, coll, op_compute, op_comm, gathered, eff, vmask, gdelta, reshards, reduced, \
        member_bytes, reduces, only_sliced = evaluate_types(PlanArrays(*plan), tables, mesh,
                                                            device, np.zeros((0, LEDGER_WIDTH)))
    step = schedule(ScheduleTables(*sched), tables.ops, tables.shared_reads, op_compute,
                    reshards)
    totals[T_SCHEDULED] = step
    totals[T_EXPOSED] = max(0.0, step - totals[T_COMPUTE])
    held = held_masks(vmask, tables.held_type) | memory.fixed_held
    if fresh:
        delta = np.zeros(tables.num_ops + 2)
        add_temps(delta, held, mesh, memory)
    else:
        move_temps(delta, old_vmask, held, mesh, memory)
    hoisted_reshards(gdelta, gathered, member_bytes, tables, memory)
    early_slices(gdelta, only_sliced, vmask, mesh, memory)
    reduced_buffers(gdelta, gathered, reduced, reduces, memory, tables.ops, vmask, mesh)
    arguments_and_outputs(totals, eff, vmask, mesh, memory, gdelta)
    totals[T_TEMP] = peak_live(delta, gdelta, gathered, memory.op_type)
    return totals, coll, op_compute, op_comm, held


@njit(cache=True, inline="always")
def held_masks(vmask, held_type):
    """[T] the axes each value type's buffers are divided over: its own, or those of the type
    that sizes them (TypeTables.held_type); `run` adds the axes a shard_map's results are
    held over (MemoryTables.fixed_held). Read after the masks are resolved, so that the
    layout (eff, what plan.jit exports) stays the classes'."""
    return vmask[held_type]


@njit(cache=True)
def charges(plan, tables, mesh, device):
    """(the ledger of one plan (see L_KIND): every collective the kernel charges, in the row of
    the place that charges it; compute s per op type). Not the hot path: `run` gives the same
    totals without the ledger."""
    tables = TypeTables(*tables)
    ledger = np.zeros((ledger_layout(tables)[6], LEDGER_WIDTH))
    op_compute = evaluate_types(PlanArrays(*plan), tables, mesh, device, ledger)[2]
    return ledger, op_compute


@njit(cache=True, inline="always")
def hoisted_reshards(gdelta, gathered, member_bytes, tables, memory):
    """A compiler that runs each op as soon as its operands are ready (XLA:CPU's breadth-first
    schedule) reshards an operand as soon as the value is made, not when its reader runs:
    the new buffer lives from then until the reader (memory.operand_reads, one per op and
    operand; none where reshards run at their op, charged there in `gathered`)."""
    if memory.operand_reads.shape[0] == 0:
        return
    ops = tables.ops
    for p in range(ops.shape[0]):
        for i in range(ops[p].operands_start, ops[p].operands_end):
            gathered[p] -= member_bytes[i]
    for j in range(memory.operand_reads.shape[0]):
        read = memory.operand_reads[j]
        b = member_bytes[read.member]
        if b > 0.0:
            gdelta[read.ready] += b
            gdelta[read.position + 1] -= b


@njit(cache=True, inline="always")
def early_slices(gdelta, only_sliced, vmask, mesh, memory):
    """A temporary that a dot (or another op XLA:CPU fuses nothing into) reads as a local
    slice is sliced by a dynamic-slice fusion of its own, which a breadth-first schedule runs
    as soon as the temporary is made: the slice's buffer lives from there to the reader, and
    the whole temporary only until its last reader that reads it whole. ZeRO-1's weight
    gradients, sharded like the optimizer state, slice the forward activations they read
    (relu(x)[:, shard] for w_out's gradient, h[senders][:, shard] for w_send's): XLA keeps
    those f32[256, 8] and f32[256, 4] slices from the forward pass to the backward, and frees
    the f32[256, 64] and f32[256, 32] activations after the forward matmuls (the zoo GNN,
    jax 0.10.2; tests/test_cost.py). Elsewhere (a slice an elementwise reader fuses in) the
    temporary is read whole by its reader."""
    reads = memory.slice_reads
    for i in range(memory.temp_slices.shape[0]):
        span = memory.temp_slices[i]
        if span.end == span.start:
            continue
        temp = memory.temps[i]
        ways = mesh[vmask[temp.value_type]].ways
        s = _written(temp, ways)
        if s == 0.0:
            continue
        whole = temp.nbytes / ways
        last = span.whole_end
        sliced = False
        for j in range(span.start, span.end):
            if only_sliced[reads[j].operand_type] == 0:
                last = max(last, reads[j].position + 1)
            else:
                sliced = True
        if not sliced:
            continue
        for j in range(span.start, span.end):
            m = only_sliced[reads[j].operand_type]
            if m == 0:
                continue
            first = True  # one slice per sharding, read by all that want it (CSE)
            end = reads[j].position + 1
            for k in range(span.start, span.end):
                if only_sliced[reads[k].operand_type] == m:
                    if k < j:
                        first = False
                    end = max(end, reads[k].position + 1)
            if first:
                b = whole / mesh[m].ways
                gdelta[temp.start] += b
                gdelta[end] -= b
        if last < temp.end:
            gdelta[last] -= s
            gdelta[temp.end] += s


@njit(cache=True, inline="always")
def reduced_buffers(gdelta, gathered, reduced, reduces, memory, ops, vmask, mesh):
    """An all-reduce writes its result to a new buffer, its input (the partial sums) still
    live. XLA:CPU combines the all-reduces of each computation (the step's, a loop body's)
    into one after the last of them (AllReduceCombiner), but it can only combine all-reduces
    that do not depend on each other: one whose result another reducing op reads, directly
    or through other ops (an activation gradient: a message-passing scatter's sum, Megatron's
    input gradient; a gradient whose global norm is reduced after it) runs at its op. Those
    combined keep their partial sums live until the combined one, which writes all their
    results at once (whatever reads them waits for it; a result sharded where the partial
    sums are not is sliced from it there); the others, and all of them elsewhere (GPU, TPU),
    hold both buffers at the op. The buffers live in the order the compiler runs the ops
    (memory.position). An unrolled loop body holds the partial sums of each of its copies
    (memory.iteration_copies), all of them until its combined all-reduce."""
    if not memory.combine_all_reduces:
        for p in range(reduced.shape[0]):
            gathered[p] += reduced[p]
        return
    comp = memory.computation
    C = memory.num_computations
    feeds = _feeds_a_reduction(reduces, memory)
    combined = np.full(C, -1, np.int64)  # where the combined all-reduce runs: after the last
    for p in range(reduced.shape[0]):
        if reduced[p] > 0.0:
            span = memory.instances_by_type[p]
            for i in range(span.start, span.end):
                n = memory.instances[i]
                if not feeds[n]:
                    combined[comp[n]] = max(combined[comp[n]], memory.position[n])
    for p in range(reduced.shape[0]):
        if reduced[p] > 0.0:
            span = memory.instances_by_type[p]
            for i in range(span.start, span.end):
                n = memory.instances[i]
                c = comp[n]
                at = memory.position[n]
                size = reduced[p]
                if not feeds[n]:
                    # the partial sums, whole, until the combined all-reduce (the op's
                    # result, a temporary, is only their shard where it is sharded: an FSDP
                    # step accumulating gradients combines 34 whole gradients per
                    # micro-batch, jax 0.10.2), its new buffer there
                    end = memory.result_end[n]
                    stop = combined[c] + 1
                    if end > at + 1 and ops[p].result_type >= 0:
                        rest = size - ops[p].result_nbytes / mesh[
                            vmask[ops[p].result_type]].ways
                        if rest > 0.0:
                            gdelta[at + 1] += rest
                            gdelta[max(at + 1, min(end, stop))] -= rest
                    if end < stop:
                        gdelta[end] += size
                        gdelta[stop] -= size
                    # an unrolled body's earlier copies of the op: their partial sums wait
                    # too, and the combined all-reduce writes every copy's result
                    earlier = size * (memory.iteration_copies[n] - 1.0)
                    gdelta[at] += earlier
                    gdelta[stop] -= earlier
                    gdelta[combined[c]] += size + earlier
                    gdelta[combined[c] + 1] -= size + earlier
                else:
                    gdelta[at] += size
                    gdelta[at + 1] -= size
                    # XLA:CPU's reduce-scatter: the all-reduced whole stays live until the
                    # last fusion that slices its shard from it (memory.sliced_read; -1 where
                    # a reader cannot, and the shard is sliced at once)
                    end = min(memory.result_end[n], memory.sliced_read[n] + 1)
                    if end > at + 1 and ops[p].result_type >= 0:
                        rest = size - ops[p].result_nbytes / mesh[
                            vmask[ops[p].result_type]].ways
                        if rest > 0.0:
                            gdelta[at + 1] += rest
                            gdelta[end] -= rest


@njit(cache=True, inline="always")
def _feeds_a_reduction(reduces, memory):
    """[N] (program order) whether an op's result reaches an op that reduces partial sums
    (a scalar's too), directly or through other ops: an all-reduce that does cannot be
    combined with that one. A metric reduced after the update (an accuracy) reads no
    gradient, and leaves the gradients' all-reduces combined."""
    N = memory.computation.shape[0]
    reducing = np.zeros(N, np.bool_)
    for p in range(reduces.shape[0]):
        if reduces[p]:
            span = memory.instances_by_type[p]
            for i in range(span.start, span.end):
                reducing[memory.instances[i]] = True
    feeds = np.zeros(N, np.bool_)
    for n in range(N - 1, -1, -1):  # readers come later in program order
        for j in range(memory.reader_start[n], memory.reader_start[n + 1]):
            r = memory.readers[j]
            if reducing[r] or feeds[r]:
                feeds[n] = True
                break
    return feeds


@njit(cache=True)
def fill_temps(delta, vmask, mesh, memory):
    """add_temps for MemoryTables given as a plain tuple."""
    add_temps(delta, vmask, mesh, MemoryTables(*memory))


@njit(cache=True, inline="always")
def add_temps(delta, vmask, mesh, memory):
    """Adds the live range of every temporary, at its size under `vmask`, to `delta`."""
    for i in range(memory.temps.shape[0]):
        temp = memory.temps[i]
        s = _written(temp, mesh[vmask[temp.value_type]].ways)
        delta[temp.start] += s
        delta[temp.end] -= s


@njit(cache=True, inline="always")
def _written(temp, ways):
    """The per-device bytes a temporary takes when its value is sharded `ways` ways (none
    below its min_nbytes)."""
    s = temp.nbytes / ways
    return s if s >= temp.min_nbytes else 0.0


@njit(cache=True, inline="always")
def move_temps(delta, old_vmask, new_vmask, mesh, memory):
    """Re-sizes the live ranges of the temporaries whose value type changed sharding."""
    for t in range(old_vmask.shape[0]):
        if old_vmask[t] == new_vmask[t]:
            continue
        new_ways, old_ways = mesh[new_vmask[t]].ways, mesh[old_vmask[t]].ways
        for j in range(memory.temps_by_type[t].start, memory.temps_by_type[t].end):
            temp = memory.temps[memory.temps_of_type[j]]
            s = _written(temp, new_ways) - _written(temp, old_ways)
            delta[temp.start] += s
            delta[temp.end] -= s


@njit(cache=True, inline="always")
def peak_live(delta, gdelta, gathered, op_type):
    """The largest live temporary bytes at any op, gathered buffers included (gdelta also
    takes away the output buffers not yet written: see arguments_and_outputs)."""
    live = 0.0
    peak = 0.0
    for n in range(op_type.shape[0]):
        live += delta[n] + gdelta[n]
        here = live + gathered[op_type[n]]
        if here > peak:
            peak = here
    return peak


@njit(cache=True, inline="always")
def arguments_and_outputs(totals, eff, vmask, mesh, memory, gdelta):
    """Argument, output, state and aliased bytes into totals. An output's buffer, unless a
    donated argument holds it, is free from the start until the op that writes it: XLA's
    buffer assignment places temporaries there, so gdelta takes it off the live bytes."""
    arg = 0.0
    state = 0.0
    for i in range(memory.inputs.shape[0]):
        b = memory.inputs[i].nbytes / mesh[vmask[memory.inputs[i].value_type]].ways
        arg += b
        if memory.inputs[i].is_state:
            state += b
    out = 0.0
    outputs = memory.outputs
    aliased = np.zeros(outputs.shape[0], np.bool_)
    # a donated buffer holds its output where both are sharded alike, dim for dim
    alias = 0.0
    for i in range(memory.aliases.shape[0]):
        pair = memory.aliases[i]
        same = True
        for d in range(eff.shape[1]):
            if eff[pair.input_type, d] != eff[pair.output_type, d]:
                same = False
        if same:
            alias += pair.nbytes / mesh[vmask[pair.input_type]].ways
            aliased[pair.output] = True
    for i in range(outputs.shape[0]):
        b = outputs[i].nbytes / mesh[vmask[outputs[i].value_type]].ways
        out += b
        if not aliased[i] and outputs[i].position > 0:
            gdelta[0] -= b
            gdelta[outputs[i].position] += b
    totals[T_ARG] = arg
    # XLA returns several outputs as a tuple: a table of 8-byte buffer pointers
    totals[T_OUT] = out + (8.0 * outputs.shape[0] if outputs.shape[0] > 1 else 0.0)
    totals[T_STATE] = state
    totals[T_ALIAS] = alias
