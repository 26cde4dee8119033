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

from typing import NamedTuple

import numpy as np

from ._jit import inline, jit
from ._reshard import reduced_reorder, reshard
from ._result import T_COMM
from ._views import OperandView

# The most distinct shardings one shared value is gathered to (more are charged, not kept).
MAX_SHARDINGS = 16
# One sharding a shared value was resharded to: the reshard that made it (gather, a2a, the
# pin it counts as a read of, sliced, onto, reorder, compatible: the key), the bytes of its
# buffer and where that buffer lives [start, end).
# (start_at, start_weight, end_at, end_weight: where in the memory sweep its start and end
# count, and how many times: SHARED_READ's ready_at ... of the reads that set them.)
KEPT = np.dtype([("gather", np.int64), ("a2a", np.int64), ("pin", np.int64),
                 ("sliced", np.int64), ("onto", np.int64), ("reorder", np.int64),
                 ("compatible", np.int64), ("bytes", np.float64), ("start", np.int64),
                 ("end", np.int64), ("start_at", np.int64), ("start_weight", np.float64),
                 ("end_at", np.int64), ("end_weight", np.float64)], align=True)
# A relayout the compiler writes out from a kept buffer: (relayout value, kept) as one key,
# its bytes and where it lives.
COPY = np.dtype([("key", np.int64), ("bytes", np.float64), ("start", np.int64),
                 ("end", np.int64), ("start_at", np.int64), ("start_weight", np.float64),
                 ("end_at", np.int64), ("end_weight", np.float64)], align=True)


class Reads(NamedTuple):
    """What pricing one shared read touches: the SHARED_READ and OP tables, the OP_STATE
    records (their `comm`), each read's seconds, and the value's KEPT and COPY records."""

    reads: np.ndarray
    ops: np.ndarray
    pstate: np.ndarray
    read_time: np.ndarray
    kept: np.ndarray
    copies: np.ndarray


@jit
def shared_reads(plan, tables, mesh, ws, coll, ledger, layout, totals):
    """Prices every shared read (see the module docstring): adds their seconds to the OP_STATE
    `comm`, totals and ws.read_time (per execution of the read), their buffers to
    ws.gdelta."""
    mask, split_base = plan.mask, tables.split_base
    overridden = False
    for s in range(split_base.shape[0]):
        if mask[s] != mask[split_base[s]]:
            overridden = True
    v = OperandView(tables.operands, tables.operand_rows, tables.rows, ws.row_state,
                    ws.operand_state, ws.vmask)
    r = Reads(tables.shared_reads, tables.ops, ws.op_state, ws.read_time, ws.kept, ws.copies)
    shared_values, gdelta, num_ops = tables.shared_values, ws.gdelta, tables.num_ops
    for value in range(shared_values.shape[0]):
        nk = 0
        nc = np.int64(0)  # (a literal 0 would compile _copy twice)
        for j in range(shared_values[value].start, shared_values[value].end):
            nk, nc = _read(j, overridden, nk, nc, num_ops, v, r, mesh, coll, ledger, layout,
                           totals)
        for k in range(nk):
            kept = r.kept[k]
            if kept.end > kept.start:
                gdelta[kept.start_at] += kept.bytes * kept.start_weight
                gdelta[kept.end_at] -= kept.bytes * kept.end_weight
        for k in range(nc):
            copy = r.copies[k]
            gdelta[copy.start_at] += copy.bytes * copy.start_weight
            gdelta[copy.end_at] -= copy.bytes * copy.end_weight


@inline
def _read(j, overridden, nk, nc, num_ops, v, r, mesh, coll, ledger, layout, totals):
    """Shared read j of the value whose nk KEPT and nc COPY records are in `r` (Reads);
    returns the new (nk, nc)."""
    read = r.reads[j]
    ot = read.operand_type
    s = v.ostate[ot]
    g = s.gather
    a = s.a2a
    ps = r.pstate[read.op_type]
    # the reading op's result, put in order after its reduction: at every reader
    t = reduced_reorder(s, r.ops[read.op_type].result_nbytes / mesh[ps.res].ways, read.trip,
                        mesh, coll, ledger, layout.read_reorder + j)
    if t != 0.0:
        ps.comm += t * read.trip
        totals[T_COMM] += t * read.trip
        r.read_time[j] += t
    if g == 0 and a == 0:
        return nk, nc
    pin = read.pinned if overridden else -1
    found = _kept_sharding(ot, g, a, pin, nk, v, r.kept)
    if found < 0:
        t, b = reshard(ot, read.nbytes, g, read.trip, 0.0, v, mesh, coll, ledger,
                       layout.read + 2 * j, layout.read_reorder + j)
        ps.comm += t * read.trip
        totals[T_COMM] += t * read.trip
        r.read_time[j] += t
        if nk == MAX_SHARDINGS:
            return nk, nc
        found = nk
        nk += 1
        kept = r.kept[found]
        kept.gather = g
        kept.a2a = a
        kept.pin = pin
        kept.sliced = s.sliced
        kept.onto = s.onto
        kept.reorder = s.reorder
        kept.compatible = s.compatible
        kept.bytes = b
        kept.start = num_ops + 1  # empty until a direct read
        kept.end = 0
    kept = r.kept[found]
    if read.copy_of < 0:
        _starts(kept, read)
        if read.memory_position + 1 > kept.end:
            kept.end, kept.end_at, kept.end_weight = (read.memory_position + 1, read.end_at,
                                                      read.end_weight)
        return nk, nc
    return nk, _copy(found, read, nc, r.copies, kept)


@inline
def _starts(record, read):
    """A KEPT or COPY record starting where `read` is ready, if that is earlier."""
    if read.ready < record.start:
        record.start, record.start_at, record.start_weight = (read.ready, read.ready_at,
                                                              read.ready_weight)


@jit
def _copy(found, read, nc, copies, kept):
    """Records a read of a relayout of the value's KEPT record `found` that the compiler writes
    out (a COPY record); returns the new number of COPY records."""
    key = read.copy_of * MAX_SHARDINGS + found
    c = -1
    for k in range(nc):
        if copies[k].key == key:
            c = k
            break
    if c < 0:
        if nc == MAX_SHARDINGS:
            return nc
        c = nc
        nc += 1
        copy = copies[c]
        copy.key = key
        copy.bytes = kept.bytes
        copy.start = 1 << 62
        copy.end = -1
    copy = copies[c]
    _starts(copy, read)
    if read.memory_position + 1 > copy.end:
        copy.end, copy.end_at, copy.end_weight = (read.memory_position + 1, read.end_at,
                                                  read.end_weight)
    # the gathered value lives until the relayout is made from it
    _starts(kept, read)
    if read.ready + 1 > kept.end:
        kept.end, kept.end_at, kept.end_weight = (read.ready + 1, read.ready_end_at,
                                                  read.ready_end_weight)
    return nc


@inline
def _kept_sharding(ot, g, a, pin, nk, v, kept_records):
    """The KEPT record an earlier read of this value made that a read of operand type ot can
    reuse (-1: none).

    A reshard that both gathers and moves axes, of a value the step has already gathered
    whole, reuses that copy (REPLICATED_COPY): XLA's partitioner slices it locally
    (ReshardNoCache's last resort is Replicate(), which takes a replicated copy from its
    reshard cache). Seen on gpt_scan with the tied embedding table on (model, data): gathered
    whole for the logits, then sliced, not moved, for the input gradient's `embed` on data
    (jax 0.10.2, spmd_partitioner.cc)."""
    s = v.ostate[ot]
    for k in range(nk):
        kept = kept_records[k]
        if (kept.gather == g and kept.a2a == a and kept.pin == pin and kept.sliced == s.sliced
                and kept.onto == s.onto and kept.reorder == s.reorder
                and kept.compatible == s.compatible):
            return k
    if g != 0 and a != 0:
        whole = v.vmask[v.operands[ot].value_type]
        for k in range(nk):
            kept = kept_records[k]
            if (kept.gather == whole and kept.a2a == 0 and kept.pin == pin
                    and kept.sliced == 0 and kept.onto == 0):
                return k
    return -1
