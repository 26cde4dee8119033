"""Compress the program into *types* so a plan costs hundreds of table rows, not thousands.

Values with the same classes on the same dims (and the same conflict sides) shard alike under
every plan: one *value type*. Operand rows, operands and ops with the same value types, sizes
and trip counts cost alike: one type each, with a multiplicity. A 12-layer transformer with
grouped layers has about as many types as a 1-layer one, so evaluation time barely grows with
depth (only memory liveness stays per value).

The tables themselves (`TypeTables`, one record per type) are described in _tables.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..analysis import domain_boundaries
from ._plan_arrays import split_classes
from ._operand_rows import ROW_FROM_WHOLE, ROW_GROUP, ROW_REPLICATE, ROW_RESULT
from ._static import Static
from ._tables import (
    GROUP, GROUP_MEMBER, HALO, OP, OP_DIM, OP_IO, OP_OPERAND, OPERAND, ROW, SHARED_READ,
    SPAN, TypeTables,
)

_I, _F = np.int64, np.float64


class Types(NamedTuple):
    value_type: np.ndarray      # [V] the type of each value
    op_type: np.ndarray         # [N] the type of each op
    tables: TypeTables
    # Where each of Static's operands (one per op and operand tensor) is costed: its member of
    # its op type's run (an index into tables.op_operands), or its shared read (an index into
    # tables.shared_reads); -1 for the other. CostModel.op_collectives reads charges back to ops
    # through them.
    operand_member: np.ndarray  # [O]
    operand_read: np.ndarray    # [O]
    # [S] the loop each shared read is hoisted out of (Static.passes.invariant_loop; -1: none): XLA
    # reshards it once before that loop, and its buffer lives until the loop ends.
    read_loop: np.ndarray


class _Interner(dict):
    def id(self, key) -> int:
        i = self.get(key)
        if i is None:
            i = self[key] = len(self)
        return i


def _records(dtype, **columns) -> np.ndarray:
    n = len(next(iter(columns.values())))
    out = np.zeros(n, dtype)
    for name, column in columns.items():
        out[name] = column
    return out


def _runs(lists) -> tuple[np.ndarray, np.ndarray, list]:
    """(start, end, flattened members) of a list of member lists."""
    lengths = np.array([len(lst) for lst in lists], _I)
    end = np.cumsum(lengths)
    return end - lengths, end, [m for lst in lists for m in lst]


def build_types(st: Static, an, dev_ops) -> Types:
    """The types of `an` for one device's compiler (`dev_ops`, a _device_tables.DeviceOps:
    each op's flops, rate, bytes moved, kernel, reducing leader, workspace, launches, and how
    the partitioner reads each of st's rows)."""
    peak, io, kernel, flop_scale = dev_ops.peak, dev_ops.io, dev_ops.kernel, dev_ops.flop_scale
    sum_leader, workspace, flops = dev_ops.sum_leader, dev_ops.workspace, dev_ops.flops
    row_kind, launches = dev_ops.row_kind, dev_ops.launches
    V = st.num_values
    # --- conflict-side tags -------------------------------------------------------------------
    tags = _Interner()
    slot_tag = {}
    tag_conflict, tag_drop_rows = [], []
    for k, c in enumerate(an.conflicts):
        res = list(c.resolutions)
        sides = c.sides or ()
        for s, side in enumerate(sides):
            t = tags.id((k, s))
            tag_conflict.append(k)
            tag_drop_rows.append([r == "replicate" or side.resolution != r for r in res])
            for slot in side.members:
                slot_tag[slot] = t
        if not sides:
            t = tags.id((k, -1))
            tag_conflict.append(k)
            tag_drop_rows.append([True] * len(res))
            vc = an.value_classes
            for v in c.values:
                for d, cls in enumerate(vc[v]):
                    if cls == c.class_id:
                        slot_tag[(v, d)] = t
    R = max((len(r) for r in tag_drop_rows), default=1)
    tag_dropped = np.zeros((len(tag_drop_rows), R), bool)
    for i, row in enumerate(tag_drop_rows):
        tag_dropped[i, :len(row)] = row

    # --- value types --------------------------------------------------------------------------
    vtypes = _Interner()
    value_type = np.empty(V, _I)
    keys = [(tuple(int(c) for c in st.values.slot_class[v]),
             tuple(slot_tag.get((v, d), -1) for d in range(st.values.width))) for v in range(V)]
    for v in range(V):
        value_type[v] = vtypes.id((*keys[v], -1, -1))
    # A value held like another (Static.passes.held_like) is a type apart, in bytes only: its masks
    # are its classes', its buffers sized by that value's type's
    for v in np.nonzero(st.passes.held_like >= 0)[0]:
        value_type[v] = vtypes.id((*keys[v], int(value_type[st.passes.held_like[v]]), -1))
    # So is a shard_map's result: XLA holds it as its out_specs shards (CostModel's
    # MemoryTables.fixed_held), whatever layout its classes take
    for op in an.program.ops:
        if op.primitive == "shard_map":
            for v in op.results:
                value_type[v] = vtypes.id((*keys[v], -1, v))
    T = len(vtypes)
    value_classes = np.array([k[0] for k in vtypes], _I).reshape(T, st.values.width)
    value_tags = np.array([k[1] for k in vtypes], _I).reshape(T, st.values.width)
    held_type = np.array([t if k[2] < 0 else k[2] for t, k in enumerate(vtypes)], _I)

    # --- group types --------------------------------------------------------------------------
    G = len(st.groups.op)
    group_rows = [[] for _ in range(G)]
    for i in np.nonzero(row_kind == ROW_GROUP)[0]:
        group_rows[st.rows.group[i]].append(i)
    gtypes = _Interner()
    group_type = np.empty(G, _I)
    for g, rows in enumerate(group_rows):
        key = (tuple(sorted((int(value_type[st.rows.value[i]]), int(st.rows.dim[i]))
                            for i in rows)), bool(st.groups.is_reduction[g]))
        group_type[g] = gtypes.id(key)
    start, end, members = _runs([m for m, _ in gtypes])
    groups = _records(GROUP, start=start, end=end, is_reduction=[red for _, red in gtypes])
    group_members = np.array(members, GROUP_MEMBER)

    # --- row types ----------------------------------------------------------------------------
    rtypes = _Interner()
    row_type = np.empty(len(st.rows.op), _I)
    for i in range(len(st.rows.op)):
        kind = int(row_kind[i])
        vt, d = int(value_type[st.rows.value[i]]), int(st.rows.dim[i])
        compound = int(st.rows.compound[i])
        if kind in (ROW_RESULT, ROW_FROM_WHOLE):
            key = (vt, d, kind, int(value_type[st.rows.src_value[i]]), int(st.rows.src_dim[i]), -1,
                   compound, int(st.rows.src_compound[i]))
        elif kind == ROW_GROUP:
            key = (vt, d, kind, -1, 0, int(group_type[st.rows.group[i]]), compound, 0)
        else:
            key = (vt, d, ROW_REPLICATE, -1, 0, -1, compound, 0)
        row_type[i] = rtypes.id(key)
    rk = np.array(list(rtypes), _I).reshape(-1, 8)
    rows = _records(ROW, value_type=rk[:, 0], dim=rk[:, 1], kind=rk[:, 2], source_type=rk[:, 3],
                    source_dim=rk[:, 4], group=rk[:, 5], compound=rk[:, 6],
                    src_compound=rk[:, 7])

    # --- operand types ------------------------------------------------------------------------
    num_operands = len(st.operands.op)
    rows_of_operand = [[] for _ in range(num_operands)]
    for i, o in enumerate(st.rows.operand):
        rows_of_operand[o].append(int(row_type[i]))
    otypes = _Interner()
    operand_type = np.empty(num_operands, _I)
    for o in range(num_operands):
        key = (int(value_type[st.operands.value[o]]), tuple(rows_of_operand[o]),
               bool(st.operands.uniform[o]), bool(st.operands.sliced_first[o]))
        operand_type[o] = otypes.id(key)
    start, end, operand_rows = _runs([k[1] for k in otypes])
    operands = _records(OPERAND, value_type=[k[0] for k in otypes], start=start, end=end,
                        uniform=[k[2] for k in otypes], sliced_first=[k[3] for k in otypes])

    # --- op types -----------------------------------------------------------------------------
    N = st.num_ops
    groups_of_op = [[] for _ in range(N)]
    for g in range(G):
        if st.groups.is_reduction[g]:
            groups_of_op[st.groups.op[g]].append(int(group_type[g]))
    # A value read by several ops of one CSE group (remat regions are their own groups); a
    # read of a relayout of a value is a read of that value (see gather_sources).
    group_of_op = np.array([op.cse_group for op in an.program.ops], _I)
    source = gather_sources(an.program)
    # A loop-invariant read (a scan's constant, or a relayout of one) is resharded before the
    # loop (Static.passes.invariant_loop): once per loop and sharding, whichever ops read it there.
    read_of = source[st.operands.value]
    loop_of = st.passes.invariant_loop[read_of]
    hoisted = loop_of >= 0
    read_of = np.where(hoisted, source[st.passes.invariant_source[read_of]], read_of)
    groups_count = group_of_op.max(initial=0) + 2  # a program of no ops has no groups
    unit = read_of * groups_count + np.where(hoisted, groups_count - 1,
                                             group_of_op[st.operands.op])
    # Reads of their own: a loop's gather of its stack, not CSE'd with other reads (_static,
    # scans), and a relayout's read of its operand (it reshards nothing there, passing the
    # sharding through: its readers' reads are the value's).
    ops = an.program.ops
    linked = np.array([ops[n].primitive in _RELAYOUT and len(ops[n].results) == 1
                       and source[ops[n].results[0]] != ops[n].results[0]
                       for n in st.operands.op.tolist()], bool)
    own = st.ops.is_region[st.operands.op] | linked
    unit = np.where(own, -1 - np.arange(len(unit)), unit)
    _, unit_id, uses = np.unique(unit, return_inverse=True, return_counts=True)
    shared = (uses[unit_id] >= 2) | hoisted
    operands_of_op = [[] for _ in range(N)]
    for o in range(num_operands):
        if not shared[o]:
            operands_of_op[st.operands.op[o]].append(o)
    io_of_op = [[] for _ in range(N)]
    for opi, v in zip(*io):
        io_of_op[opi].append(int(v))
    updates = _fresh_scatter_updates(an.program, st)

    def member_key(o):  # an OP_OPERAND record
        return (int(operand_type[o]), float(st.operands.nbytes[o]),
                bool(st.passes.early[st.operands.value[o]]), bool(updates[o]))

    ptypes = _Interner()
    op_type = np.empty(N, _I)
    for n in range(N):
        r = int(st.ops.result[n])
        key = (int(value_type[r]) if r >= 0 else -1, float(st.values.nbytes[r]) if r >= 0 else 0.0,
               tuple(sorted(groups_of_op[n])), float(flops[n]), float(st.ops.trip[n]),
               float(peak[n]),
               tuple(sorted((int(value_type[v]), float(st.values.nbytes[v])) for v in io_of_op[n])),
               tuple(sorted(member_key(o) for o in operands_of_op[n])),
               st.ops.matmul[n] or (0.0, ()), int(kernel[n]), float(flop_scale[n]),
               float(workspace[n]), int(value_type[st.ops.workspace_value[n]]),
               *_scatter_key(st, value_type, n), *_batch_key(st, value_type, n),
               float(st.ops.gathered_partials[n]), float(st.ops.copies[n]),
               float(launches[n]), st.ops.halo[n] or (0.0, -1, ()), *_gather_key(st, value_type, n))
        op_type[n] = ptypes.id(key)  # no name scope in the key: layers share types
    # An op whose partial sums another reduces carries that op's type: a second interning,
    # where a leader (never itself led) keeps a type of its own.
    first, first_keys, ptypes = op_type.copy(), list(ptypes), _Interner()
    for n in range(N):
        lead = int(sum_leader[n])
        op_type[n] = ptypes.id((int(first[n]), int(first[lead]) if lead >= 0 else -1))
    leader_type = np.full(len(ptypes), -1, _I)
    for n in np.nonzero(sum_leader >= 0)[0]:
        leader_type[op_type[n]] = op_type[sum_leader[n]]
    keys = [first_keys[k[0]] for k in ptypes]
    count = np.bincount(op_type, minlength=len(keys)).astype(_F)
    column = lambda i, dt=_F: np.array([k[i] for k in keys], dt)  # noqa: E731
    g_start, g_end, op_groups = _runs([k[2] for k in keys])
    io_start, io_end, io = _runs([k[6] for k in keys])
    o_start, o_end, opnds = _runs([k[7] for k in keys])
    d_start, d_end, dims = _runs([k[8][1] for k in keys])
    h_start, h_end, halos = _runs([k[28][2] for k in keys])
    ops = _records(OP, weight=count * column(4), count=count, flops=column(3), peak=column(5),
                   result_type=column(0, _I), result_nbytes=column(1), groups_start=g_start,
                   groups_end=g_end, io_start=io_start, io_end=io_end,
                   operands_start=o_start, operands_end=o_end,
                   matmul_k=[k[8][0] for k in keys], dims_start=d_start, dims_end=d_end,
                   kernel=column(9, _I), flop_scale=column(10), sum_leader=leader_type,
                   workspace=column(11), workspace_type=column(12, _I),
                   scatter_indices=column(13), scatter_indices_type=column(14, _I),
                   scatter_updates=column(15), scatter_updates_type=column(16, _I),
                   scatter_window=column(17, _I), batch_nbytes=column(18),
                   batch_type=column(19, _I), batch_dims=column(20, _I),
                   batch_indexed=column(21, _I), batch_indices_type=column(22, _I),
                   batch_index_dims=column(23, _I), batch_indices_nbytes=column(24),
                   gathered_partials=column(25), copies=column(26), launches=column(27),
                   halo_start=h_start, halo_end=h_end, halo_nbytes=[k[28][0] for k in keys],
                   halo_batch=[k[28][1] for k in keys], gather=column(29, _I),
                   gather_indices=column(30, _I))
    # Each op's unshared operands in the order of its type's run (the order of the key).
    operand_member = np.full(num_operands, -1, _I)
    for n in range(N):
        for k, o in enumerate(sorted(operands_of_op[n], key=member_key)):
            operand_member[o] = o_start[op_type[n]] + k
    op_io = np.array(io, OP_IO)
    op_operands = np.array(opnds, OP_OPERAND)
    op_dims = np.array(dims, OP_DIM)

    # --- shared reads -------------------------------------------------------------------------
    inst = np.nonzero(shared)[0]
    inst = inst[np.lexsort((st.operands.op[inst], unit_id[inst]))]
    units = unit_id[inst]
    ptr = np.r_[0, np.nonzero(np.diff(units))[0] + 1, len(units)].astype(_I) \
        if len(units) else np.zeros(1, _I)
    op_of_read = st.operands.op[inst]
    shared_values = _records(SPAN, start=ptr[:-1], end=ptr[1:])
    pinned = np.zeros(len(an.program.values), bool)  # what plan.jit pins under overrides
    pinned[list(domain_boundaries(an))] = True
    read_loop = loop_of[inst]
    at = np.where(read_loop >= 0, read_loop, op_of_read)  # where the reshard runs
    shared_reads = _records(SHARED_READ, operand_type=operand_type[inst],
                            op_type=op_type[op_of_read], position=at,
                            trip=st.ops.trip[at], nbytes=st.operands.nbytes[inst],
                            early=st.passes.early[st.operands.value[inst]],
                            pinned=gather_sources(an.program, pinned)[st.operands.value[inst]],
                            memory_position=at, ready=at,
                            copy_of=np.where(materialised(an.program, source)[
                                st.operands.value[inst]], st.operands.value[inst], -1))
    operand_read = np.full(num_operands, -1, _I)
    operand_read[inst] = np.arange(len(inst))

    tables = TypeTables(
        value_classes=value_classes, value_tags=value_tags, held_type=held_type,
        tag_conflict=np.array(tag_conflict, _I), tag_dropped=tag_dropped,
        conflict_class=st.values.conflict_class,
        groups=groups, group_members=group_members, rows=rows, operands=operands,
        operand_rows=np.array(operand_rows, _I), ops=ops, op_groups=np.array(op_groups, _I),
        op_io=op_io, op_operands=op_operands, op_dims=op_dims, shared_values=shared_values,
        shared_reads=shared_reads, split_base=split_classes(an).base,
        halos=np.array(halos, HALO).reshape(-1), num_ops=N, **_dependencies(ops, op_io))
    return Types(value_type, op_type, tables, operand_member, operand_read, read_loop)


def _dependencies(ops, op_io) -> dict:
    """TypeTables.op_depends and op_depends_on (see _tables.py)."""
    lists = []
    for p, op in enumerate(ops):
        types = {int(op["result_type"])}
        if op["workspace"] > 0:
            types.add(int(op["workspace_type"]))
        types |= {int(op_io[i]["value_type"]) for i in range(op["io_start"], op["io_end"])}
        if op["scatter_updates"] > 0:
            types |= {int(op["scatter_indices_type"]), int(op["scatter_updates_type"])}
        if op["batch_index_dims"]:
            types |= {int(op["batch_type"]), int(op["batch_indices_type"])}
        if op["gather"] > 0:
            types |= {int(op["gather"]) - 1, int(op["gather_indices"]) - 1}
        lists.append(sorted(t for t in types if t >= 0))
    start, end, flat = _runs(lists)
    return {"op_depends": _records(SPAN, start=start, end=end),
            "op_depends_on": np.array(flat, _I)}


# Ops that only relayout their operand: same elements, same dtype, no arithmetic.
_RELAYOUT = frozenset({"rev", "transpose", "reshape", "squeeze", "expand_dims", "copy"})
# Those the compiler writes out as a buffer of their own: a reverse moves every element
# (XLA:CPU keeps `reverse(all-gather(w))` as its own op feeding a convolution's input
# gradient, cnn fsdp, jax 0.10.2); a reshape, squeeze or expand_dims is a bitcast, and a
# transpose is mostly folded into its reader's layout.
_MATERIALISED = frozenset({"rev"})


def materialised(prog, source: np.ndarray) -> np.ndarray:
    """[V] bool: the value is a relayout, somewhere along its chain back to its gather source
    (`source`: gather_sources), that the compiler writes out: reading it costs a buffer of its
    own."""
    out = np.zeros(len(prog.values), bool)
    for op in prog.ops:  # program order, as in gather_sources
        if op.primitive not in _RELAYOUT or op.body or len(op.operands) != 1 \
                or len(op.results) != 1 or source[op.results[0]] == op.results[0]:
            continue
        out[op.results[0]] = op.primitive in _MATERIALISED or out[op.operands[0]]
    return out


def gather_sources(prog, pinned=None) -> np.ndarray:
    """[V] the value each value is a relayout of (itself where it is none): follows chains of
    _RELAYOUT ops back to the value they start from, stopping at `pinned` values ([V] bool).

    XLA gathers a relayout's source rather than the relayout: the SPMD partitioner reshards
    a reverse's or transpose's operand to the op's own sharding (spmd_partitioner.cc,
    HandleReverse), and sharding propagation gives the op the sharding its reader asks for,
    so the all-gather lands on the source and is CSE'd with that value's other gathers. A
    convolution's input gradient reads its kernel through `rev`; with FSDP XLA gathers the
    kernel once, for the forward and the backward (cnn, jax 0.10.2: `reverse(all-gather(w))`),
    where gathering `rev(w)` again would double the kernel's gather bytes. A value plan.jit
    pins with a sharding constraint keeps its own sharding, so propagation stops there."""
    values = prog.values
    source = np.arange(len(values), dtype=_I)
    for op in prog.ops:  # program order: an operand's source is known before its readers
        if op.primitive not in _RELAYOUT or op.body or len(op.operands) != 1 \
                or len(op.results) != 1:
            continue
        u, v = op.operands[0], op.results[0]
        if pinned is not None and pinned[v]:
            continue
        if values[u].nbytes == values[v].nbytes and values[u].dtype == values[v].dtype:
            source[v] = source[u]
    return source


def _fresh_scatter_updates(prog, st: Static) -> np.ndarray:
    """[O] bool: the operand is the updates of a combining scatter into a broadcast (a
    segment_sum's zeros, a gather's gradient), which XLA can make in any sharding for free."""
    out = np.zeros(len(st.operands.op), bool)
    for o, (n, t) in enumerate(zip(st.operands.op.tolist(), st.operands.slot.tolist())):
        if t != 2 or st.ops.scatter_updates[n] < 0:
            continue
        made = prog.values[prog.ops[n].operands[0]].producer
        out[o] = made >= 0 and prog.ops[made].primitive == "broadcast_in_dim"
    return out


def _scatter_key(st: Static, value_type: np.ndarray, n: int) -> tuple:
    """(indices bytes, indices type, updates bytes, updates type, pass-through dims) of a
    combining scatter; zeros for other ops."""
    i, u = int(st.ops.scatter_indices[n]), int(st.ops.scatter_updates[n])
    if i < 0 or u < 0:
        return 0.0, 0, 0.0, 0, 0
    return (float(st.values.nbytes[i]), int(value_type[i]), float(st.values.nbytes[u]), int(value_type[u]),
            int(st.ops.scatter_window[n]))


def _gather_key(st: Static, value_type: np.ndarray, n: int) -> tuple:
    """(operand type + 1, indices type + 1) of a gather; zeros for other ops."""
    x, i = (int(v) for v in st.ops.gather[n])
    return (int(value_type[x]) + 1, int(value_type[i]) + 1) if x >= 0 else (0, 0)


def _batch_key(st: Static, value_type: np.ndarray, n: int) -> tuple:
    """(bytes, type, batching dims, indexed dims, indices type, indices batching dims, indices
    bytes) of an explicitly batched gather or scatter (_static._batched_indexing); zeros for
    other ops."""
    v, i = int(st.ops.batch_value[n]), int(st.ops.batch_indices[n])
    if v < 0 or i < 0:
        return 0.0, 0, 0, 0, 0, 0, 0.0
    return (float(st.values.nbytes[v]), int(value_type[v]), int(st.ops.batch_dims[n]),
            int(st.ops.batch_indexed[n]), int(value_type[i]), int(st.ops.batch_index_dims[n]),
            float(st.values.nbytes[i]))
