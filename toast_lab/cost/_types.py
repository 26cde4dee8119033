"""Compress the program into *types* so a plan costs hundreds of array entries, not thousands.

Values with the same classes on the same dims (and the same conflict sides) shard alike under
every plan: one *value type*. Operand rows, operands and ops with the same value types, sizes
and trip counts cost alike: one type each, with a multiplicity. A 12-layer transformer with
grouped layers has about as many types as a 1-layer one, so evaluation time barely grows with
depth (only memory liveness stays per value).

Ragged tables (per type, a list of member indices) are stored as CSR for the compiled kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._static import ROW_GROUP, ROW_REPLICATE, ROW_RESULT, Static


@dataclass(frozen=True, eq=False)
class Csr:
    """A ragged table: the members of row k are indices[indptr[k]:indptr[k + 1]]."""

    indptr: np.ndarray
    indices: np.ndarray

    @classmethod
    def of(cls, lists) -> "Csr":
        indptr = np.zeros(len(lists) + 1, np.int64)
        indptr[1:] = np.cumsum([len(lst) for lst in lists])
        flat = [i for lst in lists for i in lst]
        return cls(indptr, np.array(flat, np.int64))


class _Interner(dict):
    def id(self, key) -> int:
        i = self.get(key)
        if i is None:
            i = self[key] = len(self)
        return i


@dataclass(frozen=True, eq=False)
class Types:
    # value types
    value_type: np.ndarray          # [V]
    vt_class: np.ndarray            # [T, D]
    vt_tag: np.ndarray              # [T, D] conflict-side tag (-1 none)
    tag_conflict: np.ndarray        # [K] conflict of each tag
    tag_dropped: np.ndarray         # [K, R] tag dropped under resolution r (if class sharded)
    # group types: consensus = AND of member (value type, dim) masks
    gt_members: Csr            # members index into gt_vt/gt_d flattened pairs
    gm_vt: np.ndarray
    gm_d: np.ndarray
    gt_is_reduction: np.ndarray
    # row types
    rt_vt: np.ndarray
    rt_d: np.ndarray
    rt_kind: np.ndarray
    rt_src_vt: np.ndarray
    rt_src_d: np.ndarray
    rt_group: np.ndarray            # group type (-1)
    # operand types: OR over their row types; weights summed over instances
    ot_rows: Csr
    ot_vt: np.ndarray
    ot_nbytes_trip: np.ndarray      # sum over instances of whole-tensor bytes x trip
    ot_count_trip: np.ndarray       # sum over instances of trip
    # op types
    op_type: np.ndarray             # [N]
    pt_count: np.ndarray            # instances
    pt_trip: np.ndarray
    pt_flops: np.ndarray
    pt_peak: np.ndarray
    pt_res_vt: np.ndarray           # -1: no result with dims
    pt_res_nbytes: np.ndarray
    pt_groups: Csr             # reduction group types of the op
    pt_io: Csr                 # io members: index into io_vt / io_nbytes
    io_vt: np.ndarray
    io_nbytes: np.ndarray           # 0 where fused
    pt_opnds: Csr              # operand members: index into po_ot / po_nbytes
    po_ot: np.ndarray
    po_nbytes: np.ndarray
    # operands of values read by several ops: XLA gathers such a value once per sharding and
    # reuses the buffer, so these are costed per instance, in program order, deduplicated
    sv_ptr: np.ndarray              # CSR over shared values -> their instances
    si_ot: np.ndarray               # operand type of the instance
    si_pt: np.ndarray               # op type
    si_pos: np.ndarray              # op position (program order)
    si_trip: np.ndarray
    si_nbytes: np.ndarray           # whole-tensor bytes of the value


def build_types(st: Static, an, peak: np.ndarray) -> Types:
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
    value_type = np.empty(V, np.int64)
    for v in range(V):
        cls = tuple(int(c) for c in st.slot_class[v])
        tg = tuple(slot_tag.get((v, d), -1) for d in range(st.width))
        value_type[v] = vtypes.id((cls, tg))
    T = len(vtypes)
    vt_class = np.array([k[0] for k in vtypes], np.int64).reshape(T, st.width)
    vt_tag = np.array([k[1] for k in vtypes], np.int64).reshape(T, st.width)

    # --- group types --------------------------------------------------------------------------
    G = len(st.group_op)
    group_rows = [[] for _ in range(G)]
    for i in np.nonzero(st.row_kind == ROW_GROUP)[0]:
        group_rows[st.row_group[i]].append(i)
    gtypes = _Interner()
    group_type = np.empty(G, np.int64)
    for g, rows in enumerate(group_rows):
        key = (tuple(sorted((int(value_type[st.row_value[i]]), int(st.row_dim[i]))
                            for i in rows)), bool(st.group_is_reduction[g]))
        group_type[g] = gtypes.id(key)
    gm_vt, gm_d, gt_lists = [], [], []
    for members, _ in gtypes:
        gt_lists.append(list(range(len(gm_vt), len(gm_vt) + len(members))))
        for vt, d in members:
            gm_vt.append(vt)
            gm_d.append(d)
    gt_is_reduction = np.array([red for _, red in gtypes], bool)

    # --- row types ----------------------------------------------------------------------------
    rtypes = _Interner()
    row_type = np.empty(len(st.row_op), np.int64)
    for i in range(len(st.row_op)):
        kind = int(st.row_kind[i])
        vt, d = int(value_type[st.row_value[i]]), int(st.row_dim[i])
        if kind == ROW_RESULT:
            key = (vt, d, kind, int(value_type[st.row_src_value[i]]), int(st.row_src_dim[i]), -1)
        elif kind == ROW_GROUP:
            key = (vt, d, kind, -1, 0, int(group_type[st.row_group[i]]))
        else:
            key = (vt, d, ROW_REPLICATE, -1, 0, -1)
        row_type[i] = rtypes.id(key)
    rk = np.array(list(rtypes), np.int64).reshape(-1, 6)

    # --- operand types ------------------------------------------------------------------------
    O = len(st.operand_op)
    operand_rows = [[] for _ in range(O)]
    for i, o in enumerate(st.row_operand):
        operand_rows[o].append(int(row_type[i]))
    otypes = _Interner()
    operand_type = np.empty(O, np.int64)
    for o in range(O):
        key = (int(value_type[st.operand_value[o]]), tuple(operand_rows[o]))
        operand_type[o] = otypes.id(key)
    ot_nbytes_trip = np.zeros(len(otypes))
    ot_count_trip = np.zeros(len(otypes))
    trip_of_operand = st.op_trip[st.operand_op]
    np.add.at(ot_nbytes_trip, operand_type, st.nbytes[st.operand_value] * trip_of_operand)
    np.add.at(ot_count_trip, operand_type, trip_of_operand)

    # --- op types -----------------------------------------------------------------------------
    N = st.num_ops
    op_groups = [[] for _ in range(N)]
    for g in range(G):
        if st.group_is_reduction[g]:
            op_groups[st.group_op[g]].append(int(group_type[g]))
    # A value read by several ops of one CSE group (remat regions are their own groups).
    group_of_op = np.array([op.cse_group for op in an.program.ops], np.int64)
    unit = st.operand_value.astype(np.int64) * (group_of_op.max() + 1) + \
        group_of_op[st.operand_op]
    _, unit_id, uses = np.unique(unit, return_inverse=True, return_counts=True)
    shared = uses[unit_id] >= 2
    op_operands = [[] for _ in range(N)]
    for o in range(O):
        if not shared[o]:
            op_operands[st.operand_op[o]].append(o)
    op_io = [[] for _ in range(N)]
    for opi, v in zip(st.io_op, st.io_val):
        op_io[opi].append(int(v))
    ptypes = _Interner()
    op_type = np.empty(N, np.int64)
    for n in range(N):
        r = int(st.op_result[n])
        key = (int(value_type[r]) if r >= 0 else -1, float(st.nbytes[r]) if r >= 0 else 0.0,
               tuple(sorted(op_groups[n])), float(st.op_flops[n]), float(st.op_trip[n]),
               float(peak[n]),
               tuple(sorted((int(value_type[v]), 0.0 if st.fused[v] else float(st.nbytes[v]))
                            for v in op_io[n])),
               tuple(sorted((int(operand_type[o]), float(st.nbytes[st.operand_value[o]]))
                            for o in op_operands[n])))
        op_type[n] = ptypes.id(key)  # no name scope in the key: layers share types
    P = len(ptypes)
    pt_count = np.bincount(op_type, minlength=P).astype(np.float64)
    keys = list(ptypes)
    io_vt, io_nb, io_lists, po_ot, po_nb, po_lists = [], [], [], [], [], []
    for key in keys:
        io_lists.append(list(range(len(io_vt), len(io_vt) + len(key[6]))))
        for vt, nb in key[6]:
            io_vt.append(vt)
            io_nb.append(nb)
        po_lists.append(list(range(len(po_ot), len(po_ot) + len(key[7]))))
        for ot, nb in key[7]:
            po_ot.append(ot)
            po_nb.append(nb)
    f = lambda i, dt=np.float64: np.array([k[i] for k in keys], dt)  # noqa: E731
    inst = np.nonzero(shared)[0]
    inst = inst[np.lexsort((st.operand_op[inst], unit_id[inst]))]
    units = unit_id[inst]
    sv = st.operand_value[inst]
    sv_ptr = np.r_[0, np.nonzero(np.diff(units))[0] + 1, len(units)].astype(np.int64) \
        if len(units) else np.zeros(1, np.int64)
    return Types(
        value_type=value_type, vt_class=vt_class, vt_tag=vt_tag,
        tag_conflict=np.array(tag_conflict, np.int64), tag_dropped=tag_dropped,
        gt_members=Csr.of(gt_lists), gm_vt=np.array(gm_vt, np.int64),
        gm_d=np.array(gm_d, np.int64), gt_is_reduction=gt_is_reduction,
        rt_vt=rk[:, 0], rt_d=rk[:, 1], rt_kind=rk[:, 2], rt_src_vt=rk[:, 3], rt_src_d=rk[:, 4],
        rt_group=rk[:, 5],
        ot_rows=Csr.of([list(k[1]) for k in otypes]),
        ot_vt=np.array([k[0] for k in otypes], np.int64),
        ot_nbytes_trip=ot_nbytes_trip, ot_count_trip=ot_count_trip,
        op_type=op_type, pt_count=pt_count, pt_trip=f(4), pt_flops=f(3), pt_peak=f(5),
        pt_res_vt=f(0, np.int64), pt_res_nbytes=f(1),
        pt_groups=Csr.of([list(k[2]) for k in keys]),
        pt_io=Csr.of(io_lists), io_vt=np.array(io_vt, np.int64),
        io_nbytes=np.array(io_nb, np.float64),
        pt_opnds=Csr.of(po_lists), po_ot=np.array(po_ot, np.int64),
        po_nbytes=np.array(po_nb, np.float64),
        sv_ptr=sv_ptr, si_ot=operand_type[inst], si_pt=op_type[st.operand_op[inst]],
        si_pos=st.operand_op[inst].astype(np.int64), si_trip=st.op_trip[st.operand_op[inst]],
        si_nbytes=st.nbytes[sv])
