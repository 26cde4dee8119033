"""What the kernel keeps of one model: its tables and a workspace, allocated once.

`ModelState` (a numba StructRef, so that one argument crosses from Python into the kernel
instead of dozens of arrays: a NamedTuple of them costs ~10 us to unbox at each call) holds the
type, memory and schedule tables (cost/_tables.py), the MESH and DEVICE records, the ledger's
layout, and a `Workspace`: every array a phase writes, sized for this model, reused by every
evaluation. The entries (_driver.py) take the tables out of it once per evaluation and hand
them to the phases, which bind the arrays they read to locals at their top. Evaluations run
with the GIL held (the kernel does not release it), so the threads of one Lab share a state
safely; what a caller keeps (the totals, an incremental estimator's live ranges) is copied
out or lives in a `Liveness` of its own.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.experimental import structref

from . import _jit  # noqa: F401  (installs the kernel's cache locator first)
from ._charge import NUM_KINDS
from ._ledger import LEDGER, ledger_layout
from ._reads import COPY, KEPT, MAX_SHARDINGS
from ._result import NUM_TOTALS
from .._plan_arrays import PlanArrays

_I, _F, _B = np.int64, np.float64, np.bool_


# Per operand row (_operands.py): the axes it holds, those its op does not want there, those
# the op wants and it lacks, and those added on a dim held whole (a local slice).
ROW_STATE = np.dtype([("held", _I), ("removed", _I), ("added", _I), ("onto_whole", _I)],
                     align=True)
# Per operand type (_operands.py, read by _reshard.py): the reshard the partitioner runs.
OPERAND_STATE = np.dtype([
    ("gather", _I), ("a2a", _I), ("sliced", _I), ("onto", _I), ("reorder", _I),
    ("reorder_pattern", _I), ("compatible", _I), ("compatible_held", _I), ("only_sliced", _I),
    ("reorder_reduced", _B), ("reorder_first", _B), ("remat", _B)], align=True)
# Per op type (_ops.py, read by _schedule.py and _memory.py): the axes of its partial sums
# and of its result, its compute and communication seconds per step, the bytes it holds while
# it runs, the seconds of one execution of its reshards (of early operands, of the others) and
# of the reduction after it, the buffer an all-reduce writes, whether it reduces, and the
# schedule's seconds of one execution and whether it has collectives of its own.
# (own_comm and own_gathered: the op's own, before shared reads and the memory sweep add to
# comm and gathered; flops: of one execution; inline: seconds of one execution of the
# collectives a shard_map body runs inside the op.)
OP_STATE = np.dtype([
    ("psum", _I), ("res", _I), ("compute", _F), ("comm", _F), ("gathered", _F),
    ("pre_early", _F), ("pre_late", _F), ("post", _F), ("reduced", _F), ("run", _F),
    ("own_comm", _F), ("own_gathered", _F), ("flops", _F), ("inline", _F), ("reduces", _B),
    ("busy", _B)],
    align=True)


class Workspace(NamedTuple):
    """The arrays the phases write (shapes: T value types, D dims, G groups, R operand rows,
    O operand types, P op types, M op-type operand members, S shared reads, N ops, C
    computations, K mesh-axis masks)."""

    eff: np.ndarray              # [T, D] mesh axes of each dim (_masks)
    vmask: np.ndarray            # [T] their union
    held: np.ndarray             # [T] the axes each type's buffers are divided over
    retiled: np.ndarray          # [T] bool: indices a batched gather re-tiled (_indexing)
    ranks: np.ndarray            # [D] scratch of type_masks
    dims: np.ndarray             # [D] scratch of type_masks
    consensus: np.ndarray        # [G] the axes a contraction group shares
    row_state: np.ndarray        # [R] ROW_STATE records (_operands)
    operand_state: np.ndarray    # [O] OPERAND_STATE records (_operands)
    op_state: np.ndarray         # [P] OP_STATE records (_ops)
    member_bytes: np.ndarray     # [M] the buffer each member's reshard makes
    read_time: np.ndarray        # [S] seconds of one execution of each shared read
    kept: np.ndarray             # [MAX_SHARDINGS] KEPT records (_reads)
    copies: np.ndarray           # [MAX_SHARDINGS] COPY records
    gdelta: np.ndarray           # [N + 2] live-byte deltas a plan adds (_memory)
    added: np.ndarray            # [N + 2] gdelta before the outputs are taken apart (live_bytes)
    op_held: np.ndarray          # [N] the bytes each op holds while it runs (live_bytes)
    reducing: np.ndarray         # [N] bool (_memory)
    feeds: np.ndarray            # [N] bool
    combined: np.ndarray         # [C]
    finish: np.ndarray           # [N] (_schedule)
    wait: np.ndarray             # [N + 1]
    totals: np.ndarray           # [NUM_TOTALS] (_result)
    coll: np.ndarray             # [NUM_KINDS, K, 3] count, bytes, seconds (_charge)
    no_ops: np.ndarray           # [0] bool: op_costs' `only` for every op type
    # what an incremental evaluation compares with the last one (_dirty.py): a type's new
    # masks, the last plan's masks, ranks and resolutions, and what changed
    eff_new: np.ndarray          # [T, D]
    prev_mask: np.ndarray        # [S] split classes
    prev_rank: np.ndarray        # [S]
    prev_resolution: np.ndarray  # [C] conflicts
    dirty_type: np.ndarray       # [T] bool
    dirty_group: np.ndarray      # [G] bool
    dirty_row: np.ndarray        # [R] bool
    dirty_operand: np.ndarray    # [O] bool
    dirty_op: np.ndarray         # [P] bool
    evaluated: np.ndarray        # [1] bool: a plan was evaluated with this workspace


class Liveness(NamedTuple):
    """The temporaries' live bytes of one plan, kept between incremental evaluations: their
    deltas per position, and the masks each value type's buffers were sized under."""

    delta: np.ndarray  # [N + 2]
    held: np.ndarray   # [T]


def workspace(tables, memory, masks: int) -> Workspace:
    """A Workspace for a model's tables (`masks`: the MESH table's length)."""
    T, D = tables.value_classes.shape
    N = len(memory.op_type)  # positions of the sweeps (compressed where runs are)
    z = np.zeros
    return Workspace(
        eff=z((T, D), _I), vmask=z(T, _I), held=z(T, _I), retiled=z(T, _B), ranks=z(D, _I),
        dims=z(D, _I), consensus=z(len(tables.groups), _I),
        row_state=z(len(tables.rows), ROW_STATE),
        operand_state=z(len(tables.operands), OPERAND_STATE),
        op_state=z(len(tables.ops), OP_STATE), member_bytes=z(len(tables.op_operands), _F),
        read_time=z(len(tables.shared_reads), _F), kept=z(MAX_SHARDINGS, KEPT),
        copies=z(MAX_SHARDINGS, COPY), gdelta=z(N + 2, _F), added=z(N + 2, _F),
        op_held=z(N, _F), reducing=z(N, _B),
        feeds=z(N, _B), combined=z(max(memory.num_computations, 1), _I),
        finish=z(N, _F), wait=z(N + 1, _F),
        totals=z(NUM_TOTALS, _F), coll=z((NUM_KINDS, masks, 3), _F), no_ops=z(0, _B),
        eff_new=z((T, D), _I), prev_mask=z(len(tables.split_base), _I),
        prev_rank=z(len(tables.split_base), _I),
        prev_resolution=z(len(tables.conflict_class), _I), dirty_type=z(T, _B),
        dirty_group=z(len(tables.groups), _B), dirty_row=z(len(tables.rows), _B),
        dirty_operand=z(len(tables.operands), _B), dirty_op=z(len(tables.ops), _B),
        evaluated=z(1, _B))


def liveness(tables, memory) -> Liveness:
    """An empty Liveness for a model's tables."""
    return Liveness(np.zeros(len(memory.op_type) + 2), np.zeros(len(tables.value_classes), _I))


@structref.register
class ModelStateType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class ModelState(structref.StructRefProxy):
    """One model's tables and workspace, as the kernel takes them (see the module docstring);
    `host`: the Host of the state model_state made (a state numba hands back has none)."""


@dataclass(frozen=True)
class Host:
    """What Python keeps of a ModelState: the arrays it shares with the kernel (the plan and
    live ranges the kernel's entry reads, _driver.py; the workspace; the ledger it charges in
    CHARGES mode) and a lock that makes filling them, the entry and reading them back one step
    for the threads that share the state."""

    plan: PlanArrays
    live: Liveness
    ws: Workspace
    ledger: np.ndarray  # [layout.rows] LEDGER records
    lock: threading.Lock


_FIELDS = ("tables", "memory", "schedule", "mesh", "device", "layout", "ws", "no_ledger",
           "ledger", "scratch", "plan")
structref.define_proxy(ModelState, ModelStateType, list(_FIELDS))


@njit(cache=True)
def _new_state(tables, memory, schedule, mesh, device, layout, ws, no_ledger, ledger, scratch,
               plan):
    return ModelState(tables, memory, schedule, mesh, device, layout, ws, no_ledger, ledger,
                      scratch, plan)


def model_state(tables, memory, schedule, mesh_table, device_table, plan=None,
                live=None) -> ModelState:
    """The ModelState of a model's tables (TypeTables, MemoryTables, ScheduleTables), its MESH
    table and its DEVICE record; `plan` and `live`: the PlanArrays and Liveness an incremental
    estimator edits in place (shared, not copied). Its `host` is what Python keeps of it."""
    if plan is None:
        plan = PlanArrays(np.zeros(len(tables.split_base), _I),
                          np.zeros(len(tables.split_base), _I),
                          np.zeros(len(tables.conflict_class), _I))
    for name, a in zip(PlanArrays._fields, plan):
        # (another array type would be another compiled kernel, minutes of compiling)
        if a.dtype != _I or not a.flags.c_contiguous or not a.flags.writeable:
            raise TypeError(f"the plan's {name} must be a writeable C-contiguous int64 array "
                            f"(as_plan_arrays), not {a.dtype} {a.flags}")
    live = liveness(tables, memory) if live is None else live
    layout = ledger_layout(tables)
    ws = workspace(tables, memory, len(mesh_table))
    ledger = np.zeros(layout.rows, LEDGER)
    state = _new_state(tables, memory, schedule, mesh_table, device_table, layout, ws,
                       np.zeros(0, LEDGER), ledger, live, plan)
    state.host = Host(plan, live, ws, ledger, threading.Lock())
    return state
