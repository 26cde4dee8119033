"""Phase 4, op costs: per op type, the reshards of its own operands, the partitioner's special
cases, the reduction of its partial sums, the collectives a shard_map body runs inside it, and
its compute time by roofline.

Reads the masks and the operand classification from the workspace; writes per op type an
OP_STATE record (_state.py): `psum` (the axes it computes partial sums over), `res` (its
result's axes), `compute` and `comm` (seconds per step), `gathered` (bytes of the buffers it
holds while it runs), `pre_early`, `pre_late` and `post` (seconds of one execution of the
reshards of its early operands, of the others, and of the reduction after it: the schedule's
input), `inline` (seconds of one execution of a shard_map body's own collectives, which the
op waits for), `reduced` and `reduces` (liveness); and `member_bytes` per operand member, and the
totals.
"""

from __future__ import annotations

import numpy as np

from ._jit import inline, jit
from .._fusion import KERNEL_ATTENTION, KERNEL_INSIDE, KERNEL_MANUAL
from .._op_facts import DIM_BATCH, DIM_M
from ._charge import A2A, AG, CP, a2a_time, charge, gather_time, permute_time
from ._halo import halo_exchange
from ._indexing import batched_indexing
from ._ledger import OP_BATCHED_OPERAND, OP_ROWS, OP_SCATTER_UPDATES
from ._patterns import SHARD_MAP_BODY, UPDATES_KEEP_SHARDING
from ._reductions import Reduction, reduce_partials
from ._reshard import reduced_reorder, reshard
from ._result import T_COMM, T_COMPUTE, T_FLOPS, T_FLOPS_ONCE
from ._scatter import scatter_passthrough, updates_window
from ._views import OperandView


@jit
def op_masks(tables, ws):
    """Fills the `psum` (the axes of each op type's sharded reductions) and `res` (its
    result's axes) of ws.op_state."""
    pstate = ws.op_state
    for p in range(tables.ops.shape[0]):
        pstate[p].psum, pstate[p].res = op_mask(p, tables, ws.consensus, ws.vmask)


@inline
def op_mask(p, tables, consensus, vmask):
    """(psum, res) of op type p under the groups' `consensus` and the types' `vmask`."""
    ops, groups, op_groups = tables.ops, tables.groups, tables.op_groups
    psum = 0
    for i in range(ops[p].groups_start, ops[p].groups_end):
        g = op_groups[i]
        if groups[g].is_reduction:
            psum |= consensus[g]
    return psum, (vmask[ops[p].result_type] if ops[p].result_type >= 0 else 0)


@jit
def op_costs(tables, mesh, dev, ws, coll, ledger, layout, only):
    """Every op type's collectives and compute (see the module docstring); where `only` (bool
    [P]) is not empty, only the op types it marks (the others keep their OP_STATE)."""
    ops, pstate, eff, vmask = tables.ops, ws.op_state, ws.eff, ws.vmask
    v = OperandView(tables.operands, tables.operand_rows, tables.rows, ws.row_state,
                    ws.operand_state, vmask)
    op_operands, member_bytes = tables.op_operands, ws.member_bytes
    op_dims, op_io = tables.op_dims, tables.op_io
    red = Reduction(tables.groups, tables.op_groups, ws.consensus, pstate, vmask, eff)
    for p in range(ops.shape[0]):
        if only.shape[0] and not only[p]:
            continue
        op = ops[p]
        w = op.weight
        ps = pstate[p]
        ps.pre_early = 0.0
        ps.pre_late = 0.0
        ps.reduced = 0.0
        ps.reduces = False
        gtime = _member_reshards(p, op, ps, op_operands, v, eff, member_bytes, mesh, coll,
                                 ledger, layout)
        if op.halo_end > op.halo_start:
            t, b = halo_exchange(coll, op, tables.halos, eff, ps.psum, mesh, w, ledger,
                                 layout.halo)
            gtime += t
            ps.pre_late += t
            ps.gathered += b
        if op.workspace > 0.0:
            ps.gathered += op.workspace / mesh[vmask[op.workspace_type]].ways
        psum = ps.psum
        res_mask = ps.res
        if op.scatter_updates > 0.0 and psum != 0:
            taken, t, b = scatter_passthrough(coll, op, eff, vmask, psum, res_mask, mesh, w,
                                              ledger, layout.op + OP_ROWS * p
                                              + OP_SCATTER_UPDATES)
            psum &= ~taken
            gtime += t
            ps.gathered += b
            ps.pre_late += t
        # a gather's operand re-tiled before it, a scatter's result after it
        after = 0.0
        if op.batch_index_dims != 0:
            t, b = batched_indexing(coll, op, eff, vmask, mesh, w, ledger,
                                    layout.op + OP_ROWS * p + OP_BATCHED_OPERAND, tables,
                                    ws.retiled)
            ps.gathered += b
            if op.scatter_updates > 0.0:
                after += t
            else:
                gtime += t
                ps.pre_late += t
        ptime = reduce_partials(p, op, psum, res_mask, red, mesh, dev, coll, ledger, layout)
        compute, flops = _compute(op, psum, res_mask, op_dims, op_io, eff, vmask, mesh, dev)
        ps.compute = compute
        ptime += after
        inline = _shard_map_body(p, tables.fixed, tables.fixed_by_op, coll, ledger,
                                 layout.fixed, vmask, mesh)
        ps.inline = inline / w if w > 0.0 else 0.0
        ps.own_comm = (gtime + ptime) * w + inline
        ps.post = ptime
        ps.flops = flops
        ps.own_gathered = ps.gathered


@jit
def op_totals(tables, ws, totals):
    """The op types' compute, communication and flops into totals, in order; each op's comm
    starts from its own (shared reads add theirs after)."""
    ops, pstate = tables.ops, ws.op_state
    for p in range(ops.shape[0]):
        ps = pstate[p]
        op = ops[p]
        ps.comm = ps.own_comm
        totals[T_COMPUTE] += ps.compute
        totals[T_COMM] += ps.comm
        totals[T_FLOPS] += ps.flops * op.weight
        totals[T_FLOPS_ONCE] += ps.flops * op.count * op.copies


@inline
def _shard_map_body(p, fixed, fixed_by_op, coll, ledger, first, vmask, mesh):
    """Charges the collectives the shard_map bodies of op type p run (FIXED records, ledger
    rows from `first`); returns their seconds per step. Each is what its body fixes, whatever
    the plan, but a permute of shards (scale_type >= 0): the plan's sharding of what it moves
    over the other axes divides its bytes."""
    if fixed.shape[0] == 0:
        return 0.0
    seconds = 0.0
    for i in range(fixed_by_op[p].start, fixed_by_op[p].end):
        f = fixed[i]
        nbytes = f.nbytes
        once = f.seconds
        if f.scale_type >= 0 and f.kind == CP:
            nbytes = f.nbytes / mesh[vmask[f.scale_type] & ~f.mask].ways
            once = permute_time(nbytes, f.mask, mesh)
        charge(coll, f.kind, f.mask, f.count, nbytes, once, ledger, first + i,
               SHARD_MAP_BODY)
        seconds += f.count * once
    return seconds


@inline
def _member_reshards(p, op, ps, op_operands, v, eff, member_bytes, mesh, coll, ledger, layout):
    """The reshards of op type p's own operands (not shared reads), each priced by
    _reshard.reshard; fills member_bytes, and the op's OP_STATE `ps` (pre_early, pre_late,
    gathered). Returns their seconds in one execution."""
    w = op.weight
    gtime = 0.0
    gbytes = 0.0
    for i in range(op.operands_start, op.operands_end):
        member = op_operands[i]
        ot = member.operand_type
        s = v.ostate[ot]
        g = s.gather
        t = 0.0
        b = 0.0
        if member.scatter_updates and s.a2a == 0 and member.nbytes > op.result_nbytes:
            lost, held = updates_window(v, ot, eff)
            if lost & ps.res != 0:  # the result moves, not the updates
                g &= ~lost
                t, b = _result_moves(op, ps.res, lost, held, mesh, coll, ledger,
                                     layout.member + 2 * i)
        t, made = reshard(ot, member.nbytes, g, w, t, v, mesh, coll, ledger,
                          layout.member + 2 * i, layout.member_reorder + i)
        b += made
        t += reduced_reorder(s, op.result_nbytes / mesh[ps.res].ways, w, mesh, coll, ledger,
                             layout.member_reorder + i)
        gtime += t
        gbytes += b
        member_bytes[i] = b
        if member.early:
            ps.pre_early += t
        else:
            ps.pre_late += t
    ps.gathered = gbytes
    return gtime


@jit
def _result_moves(op, res, lost, held, mesh, coll, ledger, row):
    """A scatter whose updates keep their sharding (UPDATES_KEEP_SHARDING, see
    _scatter.updates_window): its result (sharded over `res` by the plan) is resharded after
    it, an all-to-all where the window dims lose every axis they hold to the indexed dims,
    else a gather of the whole result. Returns (seconds, bytes) of one."""
    if lost == held and lost & ~res == 0:
        b = op.result_nbytes / mesh[res].ways
        t = a2a_time(b, lost, mesh)
        charge(coll, A2A, lost, op.weight, b, t, ledger, row + 1, UPDATES_KEEP_SHARDING)
    else:  # XLA's "involuntary full rematerialization" of the result
        b = op.result_nbytes
        t = gather_time(b, held, mesh)
        charge(coll, AG, held, op.weight, b, t, ledger, row, UPDATES_KEEP_SHARDING)
    return t, b


@inline
def _compute(op, psum, res_mask, op_dims, op_io, eff, vmask, mesh, dev):
    """(compute seconds per step, flops of one execution) of an op: a roofline of its flops at
    its rate and the bytes it moves at the memory bandwidth, never under the device's floor
    per kernel."""
    # a shard_map's flops are one device's run of its body already
    flops = op.flops if op.kernel == KERNEL_MANUAL else op.flops / mesh[res_mask | psum].ways
    rate = op.peak
    if op.kernel == KERNEL_ATTENTION:
        rate *= dev.attention / op.flop_scale
    elif op.kernel == KERNEL_INSIDE:
        rate = np.inf  # runs inside a fused kernel, charged with its matmuls
    elif op.matmul_k > 0.0:
        rate *= matmul_efficiency(op, op_dims, eff, psum, mesh, dev)
    traffic = 0.0
    for i in range(op.io_start, op.io_end):
        traffic += op_io[i].nbytes / mesh[vmask[op_io[i].value_type]].ways
    # no kernel runs faster than the device's floor (launch and ramp: Efficiency.launch_s)
    return max(flops / rate, traffic / dev.memory_bandwidth,
               op.launches * dev.launch_s) * op.weight, flops


@inline
def matmul_efficiency(op, dims, eff, psum, mesh, dev):
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
    blocks = np.ceil(m / dev.tile_m) * np.ceil(n / dev.tile_n) * batch \
        * np.ceil(k / dev.tile_k)
    waves = np.ceil(blocks / dev.units)
    computed = waves * dev.units * dev.tile_m * dev.tile_n * dev.tile_k
    return dev.matmul * m * n * batch * k / computed
