"""The reduction of an op's partial sums: patterns PARTIAL_SUMS, ROW_GATHER, DOT_SLICED_RESULT
and VARIADIC_REDUCE (_patterns.py).

An op whose contraction (or reduced) factor is sharded alike on all its operands computes
partial sums over those axes (`psum`). They are reduced after it: reduce-scattered over the
axes its result is sharded on, all-reduced over the others; a gather of rows and a matmul with
free axes take XLA's shortcuts; a variadic reduce (an argmax) gathers its partial results.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._jit import inline, jit
from ._charge import AG, AR, RS, charge, gather_time, permute
from ._ledger import OP_ROWS, OP_SLICED_RESULT
from ._patterns import DOT_SLICED_RESULT, PARTIAL_SUMS, ROW_GATHER, VARIADIC_REDUCE


class Reduction(NamedTuple):
    """What a reduction reads: the contraction GROUP records and each op type's reduction
    entries (TypeTables.groups, op_groups), the groups' consensus axes, the OP_STATE records
    (whose gathered, reduced and reduces it writes), and the value types' masks."""

    groups: np.ndarray
    op_groups: np.ndarray
    consensus: np.ndarray
    pstate: np.ndarray
    vmask: np.ndarray
    eff: np.ndarray


@inline
def reduce_partials(p, op, psum, res_mask, red, mesh, dev, coll, ledger, layout):
    """Charges the reduction of op type p's (OP record `op`) partial sums over `psum` (its
    result sharded over `res_mask`; `red` a Reduction); returns the seconds of one execution.
    Adds the temporaries it holds at the op to its OP_STATE's `gathered`, the buffer an
    all-reduce writes to `reduced`, and marks `reduces`."""
    w = op.weight
    ps = red.pstate[p]
    ptime = 0.0
    lead = op.sum_leader
    if psum != 0 and op.gathered_partials > 0.0:
        # A variadic reduce (an argmax's value and index): XLA all-gathers each shard's
        # partial results over the reduced axes and reduces them again (_op_facts.
        # _gathered_partials); the gathered buffer is a temporary at the op.
        size = op.gathered_partials / mesh[res_mask].ways * mesh[psum].ways
        t = gather_time(size, psum, mesh)
        charge(coll, AG, psum, w, size, t, ledger, layout.group + 2 * op.groups_start,
               VARIADIC_REDUCE)
        ps.gathered += size
        ptime += t
    elif psum != 0 and not (lead >= 0 and red.pstate[lead].psum == psum
                            and red.pstate[lead].res == res_mask):
        # (an op whose partial sums are added to its leader's, sharded alike, is reduced
        # there, once: XLA's AllReduceReassociate)
        ps.reduces = True
        result_bytes = op.result_nbytes / mesh[res_mask].ways
        partial = result_bytes * mesh[psum & res_mask].ways
        # before a reduce-scatter the partial sums are whole on the scattered dims: a
        # temporary larger than the result, at this op
        ps.gathered += partial - result_bytes
        ptime += _reduction_chain(p, op, psum, res_mask, result_bytes, partial, red, mesh, dev,
                                  coll, ledger, layout)
    return ptime


@jit
def _reduction_chain(p, op, psum, res_mask, result_bytes, partial, red, mesh, dev, coll,
                     ledger, layout):
    """One collective per sharded contraction factor, as XLA emits them (a weight gradient
    contracted over batch on `data` and sequence on `model` is reduced over `data`, then over
    `model`); the reduce-scatters over the axes the result is sharded on first, so that the
    all-reduces over the others (a slow data-parallel axis) carry only the shard, as NCCL's
    and XLA's hierarchical reductions do. Returns the seconds of one execution."""
    w = op.weight
    groups, op_groups, consensus, ps = red.groups, red.op_groups, red.consensus, red.pstate[p]
    ptime = 0.0
    size = partial
    done = 0
    for scatter in (True, False):
        for i in range(op.groups_start, op.groups_end):
            g = op_groups[i]
            if not groups[g].is_reduction:
                continue
            m = consensus[g] & ~done & (res_mask if scatter else ~res_mask)
            if m == 0:
                continue
            done |= m
            free = (mesh.shape[0] - 1) & ~res_mask & ~psum
            if (scatter and m == psum and op.gather > 0 and op.batch_nbytes == 0.0
                    and red.vmask[op.gather - 1] == m
                    and red.vmask[op.gather_indices - 1] & m == 0):
                t, size = _row_gather(op, ps, m, free, size, result_bytes, partial, red.eff,
                                      mesh, coll, ledger, layout.group + 2 * i + 1,
                                      layout.op + OP_ROWS * p + OP_SLICED_RESULT)
            elif (scatter and m == psum and op.matmul_k > 0.0 and free != 0
                    and mesh[free].ways % mesh[m].ways == 0.0):
                # A matmul whose partial sums all go to the axes its result is sharded on,
                # with mesh axes its result is replicated over (`free`) of a multiple of their
                # ways: XLA's dot partitioner computes each device's result already sliced
                # over part of `free` (a local slice of the operand), all-reduces that shard
                # over `m`, and moves it to the device that holds it in the result's
                # sharding: a collective-permute of the shard (x: P(None, None, "model") @ w:
                # P("model") to P(None, None, "model") on data=4 x model=2: an all-reduce of
                # 1/2 of the result over model, a permute of the same 1/2, no reduce-scatter;
                # free axes of too few ways, or none, keep the reduce-scatter; jax 0.10.2,
                # tests/test_cost.py). It comes from the SPMD partitioner, so every
                # platform's XLA emits it.
                size /= mesh[m].ways
                t = 2.0 * gather_time(size, m, mesh)
                charge(coll, AR, m, w, size, t, ledger, layout.group + 2 * i + 1,
                       DOT_SLICED_RESULT)
                t += permute(coll, m | free, w, size, mesh, ledger,
                             layout.op + OP_ROWS * p + OP_SLICED_RESULT, DOT_SLICED_RESULT)
                # the partial sums are never whole: no temporary beyond the shard
                ps.gathered -= partial - result_bytes
                ps.reduced = max(ps.reduced, size)
            elif scatter:
                t = gather_time(size, m, mesh)
                charge(coll, RS, m, w, size, t, ledger, layout.group + 2 * i, PARTIAL_SUMS)
                if not dev.reduce_scatter:  # XLA:CPU: an all-reduce of it all,
                    ps.reduced = max(ps.reduced, size)  # then a slice
                size /= mesh[m].ways  # what the next reduction carries, either way
            else:
                t = 2.0 * gather_time(size, m, mesh)
                charge(coll, AR, m, w, size, t, ledger, layout.group + 2 * i + 1, PARTIAL_SUMS)
                # the all-reduce writes a new buffer; of a chain of them (one per factor),
                # each reads the last one's: two are live at once
                ps.reduced = max(ps.reduced, size)
            ptime += t
    return ptime


@jit
def _row_gather(op, ps, m, free, size, result_bytes, partial, eff, mesh, coll, ledger,
                reduce_row, permute_row):
    """A gather of rows sliced over `m` (trivially sliced operand, sharded on nothing else) by
    indices whole over `m`, its result sharded on the rows' features over `m` too (the indices'
    dims cannot hold it): XLA's gather partitioner all-reduces the masked partial result and
    reshards it, no reduce-scatter. Before the all-reduce it slices the partial over the axes
    that are the same within each `m` group (the result's other axes, then `free` up to m's
    ways); where that slice is not a superset of the device's tile (sliced over `free`, or a
    dim holding `m` after other axes) a collective-permute of the tile brings it (x: P("data")
    gathered to P(None, "data") on data=4 x model=2: an all-reduce of 1/2 over data, a permute
    of 1/4; x: P("model") to P(None, "model"): 1/2 and 1/2; jax 0.10.2, tests/test_gathers.py).
    Returns (seconds of one, the size the next reduction carries)."""
    w = op.weight
    res_mask = ps.res
    s = min(mesh[m].ways, mesh[free].ways)
    size /= s
    t = 2.0 * gather_time(size, m, mesh)
    charge(coll, AR, m, w, size, t, ledger, reduce_row, ROW_GATHER)
    mixed = False
    for d in range(eff.shape[1]):
        a = eff[op.result_type, d]
        mixed = mixed or (a & m != 0 and a & ~m != 0)
    if s > 1.0 or mixed:  # a piece: moved to its own tile
        t += permute(coll, m | free | res_mask, w, result_bytes, mesh, ledger, permute_row,
                     ROW_GATHER)
    ps.gathered -= partial - size
    ps.reduced = max(ps.reduced, size)
    return t, size
