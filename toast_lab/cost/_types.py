"""Compress the program into *types* so a plan costs hundreds of table rows, not thousands.

Values with the same classes on the same dims (and the same conflict sides) shard alike under
every plan: one *value type*. Operand rows, operands and ops with the same value types, sizes
and trip counts cost alike: one type each, with a multiplicity. A 12-layer transformer with
grouped layers has about as many types as a 1-layer one, so evaluation time barely grows with
depth (only memory liveness stays per value).

This module numbers the conflict-side tags and the value, group, row and operand types, and
composes the TypeTables (described in _tables.py); the op types are _op_types.py's, the shared
reads _shared_reads.py's.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._change_maps import change_maps
from ._device_tables import DeviceOps
from ._interning import Interner, records, runs
from ._op_types import op_dependencies, op_types
from ._operand_rows import ROW_FROM_WHOLE, ROW_GROUP, ROW_REPLICATE, ROW_RESULT
from ._plan_arrays import split_classes
from ._shared_reads import read_sharing, shared_reads
from ._static import Static
from ._tables import GROUP, GROUP_MEMBER, OPERAND, ROW, TypeTables

_I = np.int64


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
    # [S] the loop each shared read is hoisted out of (PassAnalyses.invariant_loop; -1: none):
    # XLA reshards it once before that loop, and its buffer lives until the loop ends.
    read_loop: np.ndarray


def build_types(*, static: Static, analysis, device_ops: DeviceOps) -> Types:
    """The types of `analysis` (its plan-independent tables `static`) for one device's
    compiler (`device_ops`: each op's flops, rate, bytes moved, kernel, reducing leader,
    workspace, launches, and how the partitioner reads each operand row)."""
    st, an, row_kind = static, analysis, device_ops.row_kind
    tags = _conflict_tags(an)
    values = _value_types(st, an, tags.slot_tag)
    groups = _group_types(st, row_kind, values.value_type)
    rows = _row_types(st, row_kind, values.value_type, groups.group_type)
    operands = _operand_types(st, values.value_type, rows.row_type)
    sharing = read_sharing(st, an.program)
    ops = op_types(st, an.program, device_ops, values.value_type, groups.group_type,
                   operands.operand_type, sharing.shared)
    reads = shared_reads(st, an, sharing, operands.operand_type, ops.op_type)
    tables = TypeTables(
        value_classes=values.value_classes, value_tags=values.value_tags,
        held_type=values.held_type, tag_conflict=tags.tag_conflict,
        tag_dropped=tags.tag_dropped, conflict_class=st.values.conflict_class,
        groups=groups.groups, group_members=groups.group_members, rows=rows.rows,
        operands=operands.operands, operand_rows=operands.operand_rows, ops=ops.ops,
        op_groups=ops.op_groups, op_io=ops.op_io, op_operands=ops.op_operands,
        op_dims=ops.op_dims, shared_values=reads.shared_values,
        shared_reads=reads.shared_reads, split_base=split_classes(an).base, halos=ops.halos,
        num_ops=st.num_ops, changes=None, **op_dependencies(ops.ops, ops.op_io))
    tables = tables._replace(changes=change_maps(tables))
    return Types(values.value_type, ops.op_type, tables, ops.operand_member,
                 reads.operand_read, reads.read_loop)


class _ConflictTags(NamedTuple):
    slot_tag: dict              # {(value, dim): its tag}: a conflict's side it is on
    tag_conflict: np.ndarray    # [K] the conflict of each tag
    tag_dropped: np.ndarray     # [K, resolutions] bool: the tag's dims drop their axes there


def _conflict_tags(an) -> _ConflictTags:
    """A tag per side of each conflict (one for a conflict without sides), and the slots it
    marks: values whose dims are on different sides shard differently under a resolution."""
    tags = Interner()
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
    return _ConflictTags(slot_tag, np.array(tag_conflict, _I), tag_dropped)


class _ValueTypes(NamedTuple):
    value_type: np.ndarray      # [V]
    value_classes: np.ndarray   # [T, D] TypeTables.value_classes
    value_tags: np.ndarray      # [T, D]
    held_type: np.ndarray       # [T]


def _value_types(st: Static, an, slot_tag: dict) -> _ValueTypes:
    """Values with the same split classes and conflict tags on the same dims: one type."""
    V, width = st.num_values, st.values.width
    vtypes = Interner()
    value_type = np.empty(V, _I)
    keys = [(tuple(int(c) for c in st.values.slot_class[v]),
             tuple(slot_tag.get((v, d), -1) for d in range(width))) for v in range(V)]
    for v in range(V):
        value_type[v] = vtypes.id((*keys[v], -1, -1))
    # A value held like another (PassAnalyses.held_like) is a type apart, in bytes only: its
    # masks are its classes', its buffers sized by that value's type's
    held_like = st.passes.held_like
    for v in np.nonzero(held_like >= 0)[0]:
        value_type[v] = vtypes.id((*keys[v], int(value_type[held_like[v]]), -1))
    # So is a shard_map's result: XLA holds it as its out_specs shards (CostModel's
    # MemoryTables.fixed_held), whatever layout its classes take
    for op in an.program.ops:
        if op.primitive == "shard_map":
            for v in op.results:
                value_type[v] = vtypes.id((*keys[v], -1, v))
    T = len(vtypes)
    return _ValueTypes(
        value_type, np.array([k[0] for k in vtypes], _I).reshape(T, width),
        np.array([k[1] for k in vtypes], _I).reshape(T, width),
        np.array([t if k[2] < 0 else k[2] for t, k in enumerate(vtypes)], _I))


class _GroupTypes(NamedTuple):
    group_type: np.ndarray      # [G]
    groups: np.ndarray          # GROUP records
    group_members: np.ndarray   # GROUP_MEMBER records


def _group_types(st: Static, row_kind: np.ndarray, value_type: np.ndarray) -> _GroupTypes:
    """Groups whose rows are on the same (value type, dim)s, reducing or not: one type."""
    G = len(st.groups.op)
    group_rows = [[] for _ in range(G)]
    for i in np.nonzero(row_kind == ROW_GROUP)[0]:
        group_rows[st.rows.group[i]].append(i)
    gtypes = Interner()
    group_type = np.empty(G, _I)
    for g, rows in enumerate(group_rows):
        key = (tuple(sorted((int(value_type[st.rows.value[i]]), int(st.rows.dim[i]))
                            for i in rows)), bool(st.groups.is_reduction[g]))
        group_type[g] = gtypes.id(key)
    start, end, members = runs([m for m, _ in gtypes])
    return _GroupTypes(group_type,
                       records(GROUP, start=start, end=end,
                               is_reduction=[red for _, red in gtypes]),
                       np.array(members, GROUP_MEMBER))


class _RowTypes(NamedTuple):
    row_type: np.ndarray        # [R]
    rows: np.ndarray            # ROW records


def _row_types(st: Static, row_kind: np.ndarray, value_type: np.ndarray,
               group_type: np.ndarray) -> _RowTypes:
    """Rows of the same value type and dim that want the same (source type and dim, group
    type, compound sizes): one type. `row_kind`: as the device's partitioner reads them."""
    rows = st.rows
    rtypes = Interner()
    row_type = np.empty(len(rows.op), _I)
    for i in range(len(rows.op)):
        kind = int(row_kind[i])
        vt, d = int(value_type[rows.value[i]]), int(rows.dim[i])
        compound = int(rows.compound[i])
        if kind in (ROW_RESULT, ROW_FROM_WHOLE):
            key = (vt, d, kind, int(value_type[rows.src_value[i]]), int(rows.src_dim[i]), -1,
                   compound, int(rows.src_compound[i]))
        elif kind == ROW_GROUP:
            key = (vt, d, kind, -1, 0, int(group_type[rows.group[i]]), compound, 0)
        else:
            key = (vt, d, ROW_REPLICATE, -1, 0, -1, compound, 0)
        row_type[i] = rtypes.id(key)
    rk = np.array(list(rtypes), _I).reshape(-1, 8)
    return _RowTypes(row_type, records(
        ROW, value_type=rk[:, 0], dim=rk[:, 1], kind=rk[:, 2], source_type=rk[:, 3],
        source_dim=rk[:, 4], group=rk[:, 5], compound=rk[:, 6], src_compound=rk[:, 7]))


class _OperandTypes(NamedTuple):
    operand_type: np.ndarray    # [O]
    operands: np.ndarray        # OPERAND records
    operand_rows: np.ndarray    # row types, OPERAND.start/end runs


def _operand_types(st: Static, value_type: np.ndarray, row_type: np.ndarray) -> _OperandTypes:
    """Operands of the same value type with the same row types (in order), reading a uniform
    constant or not, sliced first or not: one type."""
    operands = st.operands
    num_operands = len(operands.op)
    rows_of_operand = [[] for _ in range(num_operands)]
    for i, o in enumerate(st.rows.operand):
        rows_of_operand[o].append(int(row_type[i]))
    otypes = Interner()
    operand_type = np.empty(num_operands, _I)
    for o in range(num_operands):
        key = (int(value_type[operands.value[o]]), tuple(rows_of_operand[o]),
               bool(operands.uniform[o]), bool(operands.sliced_first[o]))
        operand_type[o] = otypes.id(key)
    start, end, operand_rows = runs([k[1] for k in otypes])
    return _OperandTypes(
        operand_type,
        records(OPERAND, value_type=[k[0] for k in otypes], start=start, end=end,
                uniform=[k[2] for k in otypes], sliced_first=[k[3] for k in otypes]),
        np.array(operand_rows, _I))
