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

from ._plan_arrays import PlanArrays
from ._fusion import KERNEL_ATTENTION, KERNEL_INSIDE
from ._static import DIM_BATCH, DIM_M, ROW_GROUP, ROW_RESULT
from ._tables import MemoryTables, TypeTables

AR, AG, RS, A2A = 0, 1, 2, 3
# totals[...] layout
T_COMPUTE, T_COMM, T_FLOPS, T_TEMP, T_ARG, T_OUT, T_ALIAS, T_STATE = range(8)
NUM_TOTALS = 8
# The most distinct shardings one shared value is gathered to (more are charged, not kept).
MAX_SHARDINGS = 16


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
def _charge(coll, kind, mask, weight, nbytes, seconds):
    """Adds `weight` collectives of one kind over `mask`, each moving nbytes in seconds."""
    coll[kind, mask, 0] += weight
    coll[kind, mask, 1] += nbytes * weight
    coll[kind, mask, 2] += seconds * weight


@njit(cache=True, inline="always")
def _reshard(coll, gather, a2a, nbytes, weight, mesh):
    """One operand brought to the sharding its op wants: the axes in `gather` all-gathered,
    those in `a2a` moved between dims; nbytes is the operand's per-device size. Charges
    `weight` of each; returns (seconds, bytes) of one."""
    seconds = 0.0
    moved = 0.0
    if gather != 0:
        b = nbytes * mesh[gather].ways
        t = _gather_time(b, gather, mesh)
        seconds += t
        moved += b
        _charge(coll, AG, gather, weight, b, t)
    if a2a != 0:
        t = _a2a_time(nbytes, a2a, mesh)
        seconds += t
        moved += nbytes
        _charge(coll, A2A, a2a, weight, nbytes, t)
    return seconds, moved


@njit(cache=True, inline="always")
def _tiles(size, tile):
    return np.ceil(size / tile)


@njit(cache=True, inline="always")
def _matmul_efficiency(op, dims, eff, psum, mesh, dev):
    """The fraction of peak a matmul reaches at its per-device shape: the device's large-
    matmul ceiling, times the useful share of the tiles it computes (M, N and K padded to
    whole tiles; the M x N tiles of a batch run in waves of `units` at a time)."""
    m = 1.0
    n = 1.0
    batch = 1.0
    for i in range(op.dims_start, op.dims_end):
        size = dims[i].size / mesh[eff[op.result_type, dims[i].dim]].ways
        if dims[i].role == DIM_BATCH:
            batch *= size
        elif dims[i].role == DIM_M:
            m *= size
        else:
            n *= size
    k = op.matmul_k / mesh[psum].ways
    tiles = _tiles(m, dev.tile_m) * _tiles(n, dev.tile_n) * batch
    waves = np.ceil(tiles / dev.units)
    computed = waves * dev.units * dev.tile_m * dev.tile_n * _tiles(k, dev.tile_k) * dev.tile_k
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
            m = mask[value_classes[t, d]]
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
def evaluate_types(plan, tables, mesh, device):
    """Everything but the liveness sweep: per type, so cheap whatever the depth."""
    dev = device[0]
    eff, vmask = type_masks(plan, tables)
    totals = np.zeros(NUM_TOTALS)
    coll = np.zeros((4, mesh.shape[0], 3))  # count, bytes, time
    # Contractions: the axes all operands of a factor share.
    groups, members = tables.groups, tables.group_members
    consensus = np.zeros(groups.shape[0], np.int64)
    for g in range(groups.shape[0]):
        c = -1
        for i in range(groups[g].start, groups[g].end):
            c &= eff[members[i].value_type, members[i].dim]
        consensus[g] = c
    # Operand rows: what each has, what the op wants.
    rows = tables.rows
    removed = np.zeros(rows.shape[0], np.int64)
    added = np.zeros(rows.shape[0], np.int64)
    for r in range(rows.shape[0]):
        row = rows[r]
        actual = eff[row.value_type, row.dim]
        if row.kind == ROW_RESULT:
            want = eff[row.source_type, row.source_dim]
        elif row.kind == ROW_GROUP:
            want = consensus[row.group]
        else:
            want = 0
        removed[r] = actual & ~want
        added[r] = want & ~actual
    # Operands: the axes to all-gather (removed, not added elsewhere) and to move (both).
    operands, operand_rows = tables.operands, tables.operand_rows
    gather = np.zeros(operands.shape[0], np.int64)
    a2a = np.zeros(operands.shape[0], np.int64)
    for o in range(operands.shape[0]):
        rem = 0
        add = 0
        for i in range(operands[o].start, operands[o].end):
            rem |= removed[operand_rows[i]]
            add |= added[operand_rows[i]]
        gather[o] = rem & ~add
        a2a[o] = rem & add
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
    for p in range(P):
        op = ops[p]
        w = op.weight
        gtime = 0.0
        gbytes = 0.0
        for i in range(op.operands_start, op.operands_end):
            ot = tables.op_operands[i].operand_type
            pdb = tables.op_operands[i].nbytes / mesh[vmask[operands[ot].value_type]].ways
            t, b = _reshard(coll, gather[ot], a2a[ot], pdb, w, mesh)
            gtime += t
            gbytes += b
        gathered[p] = gbytes
        psum = op_psum[p]
        res_mask = op_res[p]
        ptime = 0.0
        lead = op.sum_leader
        if psum != 0 and not (lead >= 0 and op_psum[lead] == psum and op_res[lead] == res_mask):
            # (an op whose partial sums are added to its leader's, sharded alike, is reduced
            # there, once: XLA's AllReduceReassociate)
            result_bytes = op.result_nbytes / mesh[res_mask].ways
            partial = result_bytes * mesh[psum & res_mask].ways
            # before a reduce-scatter the partial sums are whole on the scattered dims: a
            # temporary larger than the result, at this op
            gathered[p] += partial - result_bytes
            # Reduce-scatter over the axes the result is sharded on, then all-reduce only the
            # shard over the others (the gradient over a slow data-parallel axis), as NCCL's
            # and XLA's hierarchical reductions do.
            rs = psum & res_mask
            ar = psum & ~res_mask
            if rs != 0:
                t = _gather_time(partial, rs, mesh)
                ptime += t
                _charge(coll, RS, rs, w, partial, t)
            if ar != 0:
                shard = partial / mesh[rs].ways
                t = 2.0 * _gather_time(shard, ar, mesh)
                ptime += t
                _charge(coll, AR, ar, w, shard, t)
        flops = op.flops / mesh[res_mask | psum].ways
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
        compute = max(flops / rate, traffic / dev.memory_bandwidth) * w
        op_compute[p] = compute
        op_comm[p] = (gtime + ptime) * w
        totals[T_COMPUTE] += compute
        totals[T_COMM] += op_comm[p]
        totals[T_FLOPS] += flops * w
    # Values read by several ops: gathered once per sharding, the buffer kept until its last
    # reader (XLA's CSE of all-gathers: FSDP gathers a weight once for forward and backward).
    gdelta = np.zeros(tables.num_ops + 2)
    kept_gather = np.empty(MAX_SHARDINGS, np.int64)
    kept_a2a = np.empty(MAX_SHARDINGS, np.int64)
    kept_bytes = np.empty(MAX_SHARDINGS)
    kept_start = np.empty(MAX_SHARDINGS, np.int64)
    kept_end = np.empty(MAX_SHARDINGS, np.int64)
    reads = tables.shared_reads
    for v in range(tables.shared_values.shape[0]):
        nk = 0
        for j in range(tables.shared_values[v].start, tables.shared_values[v].end):
            read = reads[j]
            ot = read.operand_type
            g = gather[ot]
            a = a2a[ot]
            if g == 0 and a == 0:
                continue
            found = -1
            for k in range(nk):
                if kept_gather[k] == g and kept_a2a[k] == a:
                    found = k
                    break
            if found >= 0:
                kept_end[found] = read.position + 1
                continue
            pdb = read.nbytes / mesh[vmask[operands[ot].value_type]].ways
            t, b = _reshard(coll, g, a, pdb, read.trip, mesh)
            op_comm[read.op_type] += t * read.trip
            totals[T_COMM] += t * read.trip
            if nk < MAX_SHARDINGS:
                kept_gather[nk] = g
                kept_a2a[nk] = a
                kept_bytes[nk] = b
                kept_start[nk] = read.position
                kept_end[nk] = read.position + 1
                nk += 1
        for k in range(nk):
            gdelta[kept_start[k]] += kept_bytes[k]
            gdelta[kept_end[k]] -= kept_bytes[k]
    return totals, coll, op_compute, op_comm, gathered, eff, vmask, gdelta


@njit(cache=True)
def run(plan, tables, mesh, device, memory, delta, old_vmask, fresh):
    """One plan, whole: (totals, collectives, per-op-type compute and communication s,
    value-type masks). plan, tables and memory: PlanArrays, TypeTables and MemoryTables as
    plain tuples (see _tables.py).

    fresh: size the temporaries from scratch (delta and old_vmask are not read). Otherwise
    delta holds the live-range deltas of the temporaries sized under `old_vmask`; they are
    moved, in place, to the plan's masks (incremental evaluation).
    """
    tables = TypeTables(*tables)
    memory = MemoryTables(*memory)
    totals, coll, op_compute, op_comm, gathered, eff, vmask, gdelta = evaluate_types(
        PlanArrays(*plan), tables, mesh, device)
    if fresh:
        delta = np.zeros(tables.num_ops + 2)
        add_temps(delta, vmask, mesh, memory)
    else:
        move_temps(delta, old_vmask, vmask, mesh, memory)
    totals[T_TEMP] = peak_live(delta, gdelta, gathered, memory.op_type)
    arguments_and_outputs(totals, eff, vmask, mesh, memory)
    return totals, coll, op_compute, op_comm, vmask


@njit(cache=True)
def fill_temps(delta, vmask, mesh, memory):
    """add_temps for MemoryTables given as a plain tuple."""
    add_temps(delta, vmask, mesh, MemoryTables(*memory))


@njit(cache=True, inline="always")
def add_temps(delta, vmask, mesh, memory):
    """Adds the live range of every temporary, at its size under `vmask`, to `delta`."""
    for i in range(memory.temps.shape[0]):
        temp = memory.temps[i]
        s = temp.nbytes / mesh[vmask[temp.value_type]].ways
        delta[temp.start] += s
        delta[temp.end] -= s


@njit(cache=True, inline="always")
def move_temps(delta, old_vmask, new_vmask, mesh, memory):
    """Re-sizes the live ranges of the temporaries whose value type changed sharding."""
    for t in range(old_vmask.shape[0]):
        if old_vmask[t] == new_vmask[t]:
            continue
        scale = 1.0 / mesh[new_vmask[t]].ways - 1.0 / mesh[old_vmask[t]].ways
        for j in range(memory.temps_by_type[t].start, memory.temps_by_type[t].end):
            temp = memory.temps[memory.temps_of_type[j]]
            s = temp.nbytes * scale
            delta[temp.start] += s
            delta[temp.end] -= s


@njit(cache=True, inline="always")
def peak_live(delta, gdelta, gathered, op_type):
    """The largest live temporary bytes at any op, gathered buffers included."""
    live = 0.0
    peak = 0.0
    for n in range(op_type.shape[0]):
        live += delta[n] + gdelta[n]
        here = live + gathered[op_type[n]]
        if here > peak:
            peak = here
    return peak


@njit(cache=True, inline="always")
def arguments_and_outputs(totals, eff, vmask, mesh, memory):
    arg = 0.0
    state = 0.0
    for i in range(memory.inputs.shape[0]):
        b = memory.inputs[i].nbytes / mesh[vmask[memory.inputs[i].value_type]].ways
        arg += b
        if memory.inputs[i].is_state:
            state += b
    out = 0.0
    outputs = memory.outputs
    for i in range(outputs.shape[0]):
        out += outputs[i].nbytes / mesh[vmask[outputs[i].value_type]].ways
    totals[T_ARG] = arg
    # XLA returns several outputs as a tuple: a table of 8-byte buffer pointers
    totals[T_OUT] = out + (8.0 * outputs.shape[0] if outputs.shape[0] > 1 else 0.0)
    totals[T_STATE] = state
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
    totals[T_ALIAS] = alias
