"""Op types: ops that cost alike under every plan, numbered once per device's compiler.

Two ops share a type where everything the kernel reads of them is the same: their result's
value type and bytes, their reduction groups, flops, trip count and rate, the bytes they move,
their operands that are not shared reads (_shared_reads.py), their matmul shape, kernel,
workspace, the partitioner's geometry of scatters, gathers and convolutions, and their copies
and launches. No name scope enters the key, so a transformer's layers share their types. An
op whose partial sums another op reduces (AllReduceReassociate) carries that op's type too.

Built from the static tables (_static.py), one device's DeviceOps (_device_tables.py) and the
value, group and operand types (_types.py).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._interning import Interner, records, runs
from ._static import Static
from ._tables import HALO, OP, OP_DIM, OP_IO, OP_OPERAND, SPAN

_I, _F = np.int64, np.float64


class _OpKey(NamedTuple):
    """What makes two ops cost alike (a tuple: interned by value). The fields an OP record
    takes under the same name are _FLOAT_COLUMNS and _INT_COLUMNS."""

    result_type: int            # -1: no result
    result_nbytes: float
    groups: tuple               # the types of its reduction groups, sorted
    flops: float
    trip: float
    peak: float
    io: tuple                   # OP_IO records, sorted
    operands: tuple             # OP_OPERAND records of its unshared operands, sorted
    matmul: tuple               # (K, ((result dim, role, size), ...)); (0.0, ()) for none
    kernel: int
    flop_scale: float
    workspace: float
    workspace_type: int
    scatter_indices: float      # _scatter_key
    scatter_indices_type: int
    scatter_updates: float
    scatter_updates_type: int
    scatter_window: int
    batch_nbytes: float         # _batch_key
    batch_type: int
    batch_dims: int
    batch_indexed: int
    batch_indices_type: int
    batch_index_dims: int
    batch_indices_nbytes: float
    gathered_partials: float
    copies: float
    launches: float
    halo: tuple                 # (input bytes, batch dim, (HALO records)); (0.0, -1, ())
    gather: int                 # _gather_key
    gather_indices: int


_FLOAT_COLUMNS = ("flops", "peak", "result_nbytes", "flop_scale", "workspace",
                  "scatter_indices", "scatter_updates", "batch_nbytes", "batch_indices_nbytes",
                  "gathered_partials", "copies", "launches")
_INT_COLUMNS = ("result_type", "kernel", "workspace_type", "scatter_indices_type",
                "scatter_updates_type", "scatter_window", "batch_type", "batch_dims",
                "batch_indexed", "batch_indices_type", "batch_index_dims", "gather",
                "gather_indices")


class OpTypes(NamedTuple):
    op_type: np.ndarray         # [N] the type of each op
    ops: np.ndarray             # OP records, one per op type
    op_groups: np.ndarray       # [*] group types, OP.groups_start/end runs
    op_io: np.ndarray           # OP_IO records, OP.io_start/end runs
    op_operands: np.ndarray     # OP_OPERAND records, OP.operands_start/end runs
    op_dims: np.ndarray         # OP_DIM records, OP.dims_start/end runs
    halos: np.ndarray           # HALO records, OP.halo_start/end runs
    operand_member: np.ndarray  # [O] each unshared operand's place in op_operands (-1)


def op_types(st: Static, prog, dev_ops, value_type: np.ndarray, group_type: np.ndarray,
             operand_type: np.ndarray, shared: np.ndarray) -> OpTypes:
    """The OpTypes of static tables `st` of program `prog` on one device (`dev_ops`), given
    the value, group and operand types and which operands are shared reads (`shared`, [O])."""
    N = st.num_ops
    groups_of_op = [[] for _ in range(N)]
    for g in range(len(st.groups.op)):
        if st.groups.is_reduction[g]:
            groups_of_op[st.groups.op[g]].append(int(group_type[g]))
    operands_of_op = [[] for _ in range(N)]
    for o in range(len(st.operands.op)):
        if not shared[o]:
            operands_of_op[st.operands.op[o]].append(o)
    io_of_op = [[] for _ in range(N)]
    for opi, v in zip(*dev_ops.io):
        io_of_op[opi].append(int(v))
    member = _member_keys(st, prog, operand_type)
    first = Interner()
    first_type = np.empty(N, _I)
    for n in range(N):
        first_type[n] = first.id(_op_key(st, dev_ops, value_type, n, groups_of_op[n],
                                         io_of_op[n], [member[o] for o in operands_of_op[n]]))
    op_type, leader_type, keys = _led_types(first_type, list(first), dev_ops.sum_leader)
    ops, op_groups, op_io, op_operands, op_dims, halos = _op_records(keys, op_type, leader_type)
    # Each op's unshared operands in the order of its type's run (the order of the key).
    operand_member = np.full(len(st.operands.op), -1, _I)
    for n in range(N):
        for k, o in enumerate(sorted(operands_of_op[n], key=member.__getitem__)):
            operand_member[o] = ops["operands_start"][op_type[n]] + k
    return OpTypes(op_type, ops, op_groups, op_io, op_operands, op_dims, halos, operand_member)


def _member_keys(st, prog, operand_type: np.ndarray) -> list:
    """[O] each operand as an OP_OPERAND record (a tuple)."""
    updates = _fresh_scatter_updates(prog, st)
    early = st.passes.early[st.operands.value]
    return [(int(operand_type[o]), float(st.operands.nbytes[o]), bool(early[o]),
             bool(updates[o])) for o in range(len(st.operands.op))]


def _op_key(st, dev_ops, value_type, n: int, groups: list, io: list, members: list) -> _OpKey:
    """The _OpKey of op `n` (its reduction groups' types, the values it moves, its unshared
    operands' OP_OPERAND records)."""
    r = int(st.ops.result[n])
    nbytes = st.values.nbytes
    return _OpKey(
        int(value_type[r]) if r >= 0 else -1, float(nbytes[r]) if r >= 0 else 0.0,
        tuple(sorted(groups)), float(dev_ops.flops[n]), float(st.ops.trip[n]),
        float(dev_ops.peak[n]), tuple(sorted((int(value_type[v]), float(nbytes[v])) for v in io)),
        tuple(sorted(members)), st.ops.matmul[n] or (0.0, ()), int(dev_ops.kernel[n]),
        float(dev_ops.flop_scale[n]), float(dev_ops.workspace[n]),
        int(value_type[st.ops.workspace_value[n]]),
        *_scatter_key(st, value_type, n), *_batch_key(st, value_type, n),
        float(st.ops.gathered_partials[n]), float(st.ops.copies[n]),
        float(dev_ops.launches[n]), st.ops.halo[n] or (0.0, -1, ()),
        *_gather_key(st, value_type, n))


def _led_types(first: np.ndarray, first_keys: list, sum_leader: np.ndarray) -> tuple:
    """(op_type [N], leader_type [T], key of each type): an op whose partial sums another
    reduces carries that op's type: a second numbering of (first type, leader's first type),
    where a leader (never itself led) keeps a type of its own."""
    types = Interner()
    op_type = np.empty(len(first), _I)
    for n in range(len(first)):
        lead = int(sum_leader[n])
        op_type[n] = types.id((int(first[n]), int(first[lead]) if lead >= 0 else -1))
    leader_type = np.full(len(types), -1, _I)
    for n in np.nonzero(sum_leader >= 0)[0]:
        leader_type[op_type[n]] = op_type[sum_leader[n]]
    return op_type, leader_type, [first_keys[k[0]] for k in types]


def _op_records(keys: list, op_type: np.ndarray, leader_type: np.ndarray) -> tuple:
    """(ops, op_groups, op_io, op_operands, op_dims, halos) of OpTypes: the OP records of the
    op types' keys, and the runs they index."""
    count = np.bincount(op_type, minlength=len(keys)).astype(_F)

    def column(name, dtype=_F):
        return np.array([getattr(k, name) for k in keys], dtype)

    g_start, g_end, op_groups = runs([k.groups for k in keys])
    io_start, io_end, io = runs([k.io for k in keys])
    o_start, o_end, operands = runs([k.operands for k in keys])
    d_start, d_end, dims = runs([k.matmul[1] for k in keys])
    h_start, h_end, halos = runs([k.halo[2] for k in keys])
    ops = records(OP, weight=count * column("trip"), count=count, sum_leader=leader_type,
                  groups_start=g_start, groups_end=g_end, io_start=io_start, io_end=io_end,
                  operands_start=o_start, operands_end=o_end,
                  matmul_k=[k.matmul[0] for k in keys], dims_start=d_start, dims_end=d_end,
                  halo_start=h_start, halo_end=h_end, halo_nbytes=[k.halo[0] for k in keys],
                  halo_batch=[k.halo[1] for k in keys],
                  **{name: column(name) for name in _FLOAT_COLUMNS},
                  **{name: column(name, _I) for name in _INT_COLUMNS})
    return (ops, np.array(op_groups, _I), np.array(io, OP_IO), np.array(operands, OP_OPERAND),
            np.array(dims, OP_DIM), np.array(halos, HALO).reshape(-1))


def op_dependencies(ops: np.ndarray, op_io: np.ndarray) -> dict:
    """TypeTables.op_depends and op_depends_on (see _tables.py): the value types whose
    sharding each op type's cost reads."""
    lists = []
    for op in ops:
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
    start, end, flat = runs(lists)
    return {"op_depends": records(SPAN, start=start, end=end),
            "op_depends_on": np.array(flat, _I)}


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
    nbytes = st.values.nbytes
    return (float(nbytes[i]), int(value_type[i]), float(nbytes[u]), int(value_type[u]),
            int(st.ops.scatter_window[n]))


def _gather_key(st: Static, value_type: np.ndarray, n: int) -> tuple:
    """(operand type + 1, indices type + 1) of a gather; zeros for other ops."""
    x, i = (int(v) for v in st.ops.gather[n])
    return (int(value_type[x]) + 1, int(value_type[i]) + 1) if x >= 0 else (0, 0)


def _batch_key(st: Static, value_type: np.ndarray, n: int) -> tuple:
    """(bytes, type, batching dims, indexed dims, indices type, indices batching dims, indices
    bytes) of an explicitly batched gather or scatter (_op_facts._batched_indexing); zeros for
    other ops."""
    v, i = int(st.ops.batch_value[n]), int(st.ops.batch_indices[n])
    if v < 0 or i < 0:
        return 0.0, 0, 0, 0, 0, 0, 0.0
    return (float(st.values.nbytes[v]), int(value_type[v]), int(st.ops.batch_dims[n]),
            int(st.ops.batch_indexed[n]), int(value_type[i]), int(st.ops.batch_index_dims[n]),
            float(st.values.nbytes[i]))
