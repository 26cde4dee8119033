"""What the kernel keeps of one model: its tables and a workspace, allocated once.

`ModelState` (a numba StructRef, so that one argument crosses from Python into the kernel
instead of dozens of arrays) holds the type, memory and schedule tables (cost/_tables.py), the
MESH and DEVICE records, the ledger's layout, and a `Workspace`: every array a phase writes,
sized for this model, reused by every evaluation. Evaluations run with the GIL held (the kernel
does not release it), so the threads of one Lab share a state safely; what a caller keeps
(the totals, an incremental estimator's live ranges) is copied out or lives in a `Liveness`
of its own.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, types
from numba.experimental import structref

from ._charge import NUM_KINDS
from ._ledger import LEDGER, ledger_layout
from ._reads import COPY, KEPT, MAX_SHARDINGS
from ._result import NUM_TOTALS

_I, _F, _B = np.int64, np.float64, np.bool_


class Workspace(NamedTuple):
    """The arrays the phases write (shapes: T value types, D dims, G groups, R operand rows,
    O operand types, P op types, M op-type operand members, S shared reads, N ops, C
    computations, Y outputs, K mesh-axis masks)."""

    eff: np.ndarray              # [T, D] mesh axes of each dim (_masks)
    vmask: np.ndarray            # [T] their union
    ranks: np.ndarray            # [D] scratch of type_masks
    dims: np.ndarray             # [D] scratch of type_masks
    consensus: np.ndarray        # [G] the axes a contraction group shares
    held_rows: np.ndarray        # [R] (_operands)
    removed: np.ndarray          # [R]
    added: np.ndarray            # [R]
    onto_whole: np.ndarray       # [R]
    gather: np.ndarray           # [O] (_operands)
    a2a: np.ndarray              # [O]
    sliced: np.ndarray           # [O]
    onto: np.ndarray             # [O]
    reorder: np.ndarray          # [O]
    reorder_reduced: np.ndarray  # [O] bool
    reorder_first: np.ndarray    # [O] bool
    reorder_pattern: np.ndarray  # [O]
    remat: np.ndarray            # [O] bool
    compatible: np.ndarray       # [O]
    compatible_held: np.ndarray  # [O]
    only_sliced: np.ndarray      # [O]
    op_psum: np.ndarray          # [P] (_ops)
    op_res: np.ndarray           # [P]
    op_compute: np.ndarray       # [P] seconds per step
    op_comm: np.ndarray          # [P] seconds per step
    gathered: np.ndarray         # [P] bytes held while the op runs
    pre_early: np.ndarray        # [P] seconds of one execution
    pre_late: np.ndarray         # [P]
    post: np.ndarray             # [P]
    reduced: np.ndarray          # [P] bytes an all-reduce writes
    reduces: np.ndarray          # [P] bool
    retiled: np.ndarray          # [T] bool: indices a batched gather re-tiled (_indexing)
    member_bytes: np.ndarray     # [M] the buffer each member's reshard makes
    read_time: np.ndarray        # [S] seconds of one execution of each shared read
    kept: np.ndarray             # [MAX_SHARDINGS] KEPT records (_reads)
    copies: np.ndarray           # [MAX_SHARDINGS] COPY records
    gdelta: np.ndarray           # [N + 2] live-byte deltas a plan adds (_memory)
    reducing: np.ndarray         # [N] bool (_memory)
    feeds: np.ndarray            # [N] bool
    combined: np.ndarray         # [C]
    aliased: np.ndarray          # [Y] bool
    run: np.ndarray              # [P] (_schedule)
    busy: np.ndarray             # [P] bool
    finish: np.ndarray           # [N]
    wait: np.ndarray             # [N + 1]
    totals: np.ndarray           # [NUM_TOTALS] (_result)
    coll: np.ndarray             # [NUM_KINDS, K, 3] count, bytes, seconds (_charge)


class Liveness(NamedTuple):
    """The temporaries' live bytes of one plan, kept between incremental evaluations: their
    deltas per position, and the masks each value type's buffers were sized under."""

    delta: np.ndarray  # [N + 2]
    held: np.ndarray   # [T]


def workspace(tables, memory, masks: int) -> Workspace:
    """A Workspace for a model's tables (`masks`: the MESH table's length)."""
    T, D = tables.value_classes.shape
    G, R, O = len(tables.groups), len(tables.rows), len(tables.operands)
    P, M, S = len(tables.ops), len(tables.op_operands), len(tables.shared_reads)
    N = tables.num_ops
    z = np.zeros
    return Workspace(
        eff=z((T, D), _I), vmask=z(T, _I), ranks=z(D, _I), dims=z(D, _I), consensus=z(G, _I),
        held_rows=z(R, _I), removed=z(R, _I), added=z(R, _I), onto_whole=z(R, _I),
        gather=z(O, _I), a2a=z(O, _I), sliced=z(O, _I), onto=z(O, _I), reorder=z(O, _I),
        reorder_reduced=z(O, _B), reorder_first=z(O, _B), reorder_pattern=z(O, _I),
        remat=z(O, _B), compatible=z(O, _I), compatible_held=z(O, _I), only_sliced=z(O, _I),
        op_psum=z(P, _I), op_res=z(P, _I), op_compute=z(P, _F), op_comm=z(P, _F),
        gathered=z(P, _F), pre_early=z(P, _F), pre_late=z(P, _F), post=z(P, _F),
        reduced=z(P, _F), reduces=z(P, _B), retiled=z(T, _B), member_bytes=z(M, _F),
        read_time=z(S, _F), kept=z(MAX_SHARDINGS, KEPT), copies=z(MAX_SHARDINGS, COPY),
        gdelta=z(N + 2, _F), reducing=z(N, _B), feeds=z(N, _B),
        combined=z(max(memory.num_computations, 1), _I), aliased=z(len(memory.outputs), _B),
        run=z(P, _F), busy=z(P, _B), finish=z(N, _F), wait=z(N + 1, _F),
        totals=z(NUM_TOTALS, _F), coll=z((NUM_KINDS, masks, 3), _F))


def liveness(tables) -> Liveness:
    """An empty Liveness for a model's tables."""
    return Liveness(np.zeros(tables.num_ops + 2), np.zeros(len(tables.value_classes), _I))


@structref.register
class ModelStateType(types.StructRef):
    def preprocess_fields(self, fields):
        return tuple((name, types.unliteral(t)) for name, t in fields)


class ModelState(structref.StructRefProxy):
    """One model's tables and workspace, as the kernel takes them (see the module docstring)."""


_FIELDS = ("tables", "memory", "schedule", "mesh", "device", "layout", "ws", "no_ledger",
           "scratch")
structref.define_proxy(ModelState, ModelStateType, list(_FIELDS))


@njit(cache=True)
def _new_state(tables, memory, schedule, mesh, device, layout, ws, no_ledger, scratch):
    return ModelState(tables, memory, schedule, mesh, device, layout, ws, no_ledger, scratch)


def model_state(tables, memory, schedule, mesh_table, device_table) -> ModelState:
    """The ModelState of a model's tables (TypeTables, MemoryTables, ScheduleTables), its MESH
    table and its DEVICE record."""
    return _new_state(tables, memory, schedule, mesh_table, device_table,
                      ledger_layout(tables), workspace(tables, memory, len(mesh_table)),
                      np.zeros(0, LEDGER), liveness(tables))
