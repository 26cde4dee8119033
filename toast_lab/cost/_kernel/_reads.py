"""Phase 5, shared reads: values read by several ops, gathered once per sharding.

XLA's CSE of all-gathers (and its partitioner's reshard cache) reshards a value once per
sharding its readers want and reuses the buffer: FSDP gathers a weight once for the forward
and the backward. Per shared value (TypeTables.shared_values, its reads in program order),
each read is priced by _reshard.reshard unless an earlier read made the same sharding (a KEPT
record, up to MAX_SHARDINGS per value; more are charged, not kept); the buffer lives from the
first read that makes it until its last reader (ws.gdelta, the liveness phase's input).

Under per-domain overrides, a relayout plan.jit pins is gathered apart (SHARED_READ.pinned).
A read of a relayout the compiler writes out (a `rev` of the gathered kernel) shares the gather
but holds a buffer of its own (a COPY record), from when the relayout runs to its reader; the
gathered value lives until then. Where the compiler runs each op as soon as it can (XLA:CPU)
the reverse runs right after the gather, and the gathered kernel is freed after the forward;
elsewhere it runs by its reader, and the gathered kernel is held from the forward to the
backward.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._reshard import reduced_reorder, reshard
from ._result import T_COMM

# The most distinct shardings one shared value is gathered to (more are charged, not kept).
MAX_SHARDINGS = 16
# One sharding a shared value was resharded to: the reshard that made it (gather, a2a, the
# pin it counts as a read of, sliced, onto, reorder, compatible: the key), the bytes of its
# buffer and where that buffer lives [start, end).
KEPT = np.dtype([("gather", np.int64), ("a2a", np.int64), ("pin", np.int64),
                 ("sliced", np.int64), ("onto", np.int64), ("reorder", np.int64),
                 ("compatible", np.int64), ("bytes", np.float64), ("start", np.int64),
                 ("end", np.int64)], align=True)
# A relayout the compiler writes out from a kept buffer: (relayout value, kept) as one key,
# its bytes and where it lives.
COPY = np.dtype([("key", np.int64), ("bytes", np.float64), ("start", np.int64),
                 ("end", np.int64)], align=True)


@njit(cache=True)
def shared_reads(plan, tables, mesh, ws, coll, ledger, layout, totals):
    """Prices every shared read (see the module docstring): adds their seconds to
    ws.op_comm, totals and ws.read_time (per execution of the read), their buffers to
    ws.gdelta."""
    overridden = False
    for s in range(tables.split_base.shape[0]):
        if plan.mask[s] != plan.mask[tables.split_base[s]]:
            overridden = True
    for v in range(tables.shared_values.shape[0]):
        nk = 0
        nc = 0
        for j in range(tables.shared_values[v].start, tables.shared_values[v].end):
            nk, nc = _read(j, overridden, nk, nc, tables, mesh, ws, coll, ledger, layout,
                           totals)
        for k in range(nk):
            kept = ws.kept[k]
            if kept.end > kept.start:
                ws.gdelta[kept.start] += kept.bytes
                ws.gdelta[kept.end] -= kept.bytes
        for k in range(nc):
            copy = ws.copies[k]
            ws.gdelta[copy.start] += copy.bytes
            ws.gdelta[copy.end] -= copy.bytes


@njit(cache=True)
def _read(j, overridden, nk, nc, tables, mesh, ws, coll, ledger, layout, totals):
    """Shared read j of the value whose nk KEPT and nc COPY records are in the workspace;
    returns the new (nk, nc)."""
    read = tables.shared_reads[j]
    ot = read.operand_type
    g = ws.gather[ot]
    a = ws.a2a[ot]
    p = read.op_type
    # the reading op's result, put in order after its reduction: at every reader
    t = reduced_reorder(ws, ot, tables.ops[p].result_nbytes / mesh[ws.op_res[p]].ways,
                        read.trip, mesh, coll, ledger, layout.read_reorder + j)
    if t != 0.0:
        ws.op_comm[p] += t * read.trip
        totals[T_COMM] += t * read.trip
        ws.read_time[j] += t
    if g == 0 and a == 0:
        return nk, nc
    pin = read.pinned if overridden else -1
    found = _kept_sharding(ot, g, a, pin, nk, tables, ws)
    if found < 0:
        t, b = reshard(tables, ws, ot, read.nbytes, g, read.trip, mesh, coll, ledger,
                       layout.read + 2 * j, layout.read_reorder + j, 0.0)
        ws.op_comm[p] += t * read.trip
        totals[T_COMM] += t * read.trip
        ws.read_time[j] += t
        if nk == MAX_SHARDINGS:
            return nk, nc
        found = nk
        nk += 1
        kept = ws.kept[found]
        kept.gather = g
        kept.a2a = a
        kept.pin = pin
        kept.sliced = ws.sliced[ot]
        kept.onto = ws.onto[ot]
        kept.reorder = ws.reorder[ot]
        kept.compatible = ws.compatible[ot]
        kept.bytes = b
        kept.start = tables.num_ops + 1  # empty until a direct read
        kept.end = 0
    kept = ws.kept[found]
    at = read.memory_position
    if read.copy_of < 0:
        kept.start = min(kept.start, read.ready)
        kept.end = max(kept.end, at + 1)
        return nk, nc
    key = read.copy_of * MAX_SHARDINGS + found
    c = -1
    for k in range(nc):
        if ws.copies[k].key == key:
            c = k
            break
    if c < 0:
        if nc == MAX_SHARDINGS:
            return nk, nc
        c = nc
        nc += 1
        copy = ws.copies[c]
        copy.key = key
        copy.bytes = kept.bytes
        copy.start = read.ready
        copy.end = at + 1
    copy = ws.copies[c]
    copy.start = min(copy.start, read.ready)
    copy.end = max(copy.end, at + 1)
    # the gathered value lives until the relayout is made from it
    kept.start = min(kept.start, read.ready)
    kept.end = max(kept.end, read.ready + 1)
    return nk, nc


@njit(cache=True)
def _kept_sharding(ot, g, a, pin, nk, tables, ws):
    """The KEPT record an earlier read of this value made that read j can reuse (-1: none).

    A reshard that both gathers and moves axes, of a value the step has already gathered
    whole, reuses that copy (REPLICATED_COPY): XLA's partitioner slices it locally
    (ReshardNoCache's last resort is Replicate(), which takes a replicated copy from its
    reshard cache). Seen on gpt_scan with the tied embedding table on (model, data): gathered
    whole for the logits, then sliced, not moved, for the input gradient's `embed` on data
    (jax 0.10.2, spmd_partitioner.cc)."""
    sl = ws.sliced[ot]
    for k in range(nk):
        kept = ws.kept[k]
        if (kept.gather == g and kept.a2a == a and kept.pin == pin and kept.sliced == sl
                and kept.onto == ws.onto[ot] and kept.reorder == ws.reorder[ot]
                and kept.compatible == ws.compatible[ot]):
            return k
    if g != 0 and a != 0:
        whole = ws.vmask[tables.operands[ot].value_type]
        for k in range(nk):
            kept = ws.kept[k]
            if (kept.gather == whole and kept.a2a == 0 and kept.pin == pin
                    and kept.sliced == 0 and kept.onto == 0):
                return k
    return -1
