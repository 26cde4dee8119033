"""The kernel's entries: one plan through the phases, in order.

    masks -> operand classification -> op costs (with reshard pricing and the partitioner's
    patterns) -> shared reads -> overlap schedule -> liveness and memory

Each entry takes a ModelState (_state.py) and the plan (PlanArrays); `step_and_peak` is the
search's hot path, `evaluate` gives everything an Estimate needs, `charges` the ledger.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._jit import jit
from ._ledger import LEDGER
from ._dirty import mark_dirty
from ._masks import group_consensus, type_masks
from ._memory import (add_temps, arguments_and_outputs, early_slices, hoisted_reshards,
                      move_temps, peak_live, reduced_buffers)
from ._ops import op_costs, op_masks, op_totals
from ._operands import classify_operands, classify_rows
from ._reads import shared_reads
from ._result import (T_ALIAS, T_ARG, T_COMM, T_COMPUTE, T_EXPOSED, T_OUT, T_SCHEDULED,
                      T_TEMP)
from ._schedule import schedule

# How communication and compute add up in the step time (CostModel's `overlap`)
OVERLAP_SCHEDULED, OVERLAP_NONE, OVERLAP_PERFECT = 0, 1, 2


@jit
def _clear(ws):
    """Zeroes what the phases add into."""
    ws.totals[:] = 0.0
    ws.coll[:] = 0.0
    ws.retiled[:] = False
    ws.read_time[:] = 0.0
    ws.gdelta[:] = 0.0


@jit
def _collectives(tables, mesh, dev, layout, ws, plan, ledger, incremental):
    """Phases 1-5: every collective and every op's compute, into the workspace; incremental:
    the operands and op types of the last plan this workspace costed are kept where nothing
    they read changed (_dirty.py)."""
    _clear(ws)
    if incremental:
        mark_dirty(plan, tables, ws)
        rows, operands, ops = ws.dirty_row, ws.dirty_operand, ws.dirty_op
    else:
        type_masks(plan, tables, ws.eff, ws.vmask, ws.ranks, ws.dims)
        group_consensus(tables, ws.eff, ws.consensus)
        ws.evaluated[0] = False  # (an incremental evaluation after this one starts afresh)
        rows = operands = ops = ws.no_ops
    classify_rows(plan, tables, mesh, ws, rows)
    classify_operands(plan, tables, mesh, ws, operands)
    if not incremental:
        op_masks(tables, ws)
    op_costs(tables, mesh, dev, ws, ws.coll, ledger, layout, ops)
    op_totals(tables, ws, ws.totals)
    shared_reads(plan, tables, mesh, ws, ws.coll, ledger, layout, ws.totals)


@jit
def _run(tables, memory, sched, mesh, dev, layout, ws, no_ledger, plan, live, fresh):
    """One plan, whole, into the workspace's totals. live: the temporaries' live ranges,
    sized afresh (fresh) or moved from the masks they were sized under, and the last plan's
    costs kept where nothing changed (incremental, with the workspace of one estimator)."""
    _collectives(tables, mesh, dev, layout, ws, plan, no_ledger, not fresh)
    totals = ws.totals
    step = schedule(sched, tables.ops, tables.shared_reads, ws)
    totals[T_SCHEDULED] = step
    totals[T_EXPOSED] = max(0.0, step - totals[T_COMPUTE])
    held, vmask, held_type, fixed_held = ws.held, ws.vmask, tables.held_type, memory.fixed_held
    for t in range(held.shape[0]):
        held[t] = vmask[held_type[t]] | fixed_held[t]
    if fresh:
        live.delta[:] = 0.0
        add_temps(live.delta, held, mesh, memory)
    else:
        move_temps(live.delta, live.held, held, mesh, memory)
    for t in range(held.shape[0]):
        live.held[t] = held[t]
    pstate = ws.op_state
    for p in range(pstate.shape[0]):  # (the sweep adds to what each op holds while it runs)
        pstate[p].gathered = pstate[p].own_gathered
    hoisted_reshards(tables, memory, ws)
    early_slices(mesh, memory, ws)
    reduced_buffers(tables.ops, mesh, memory, ws)
    arguments_and_outputs(mesh, memory, ws, totals)
    totals[T_TEMP] = peak_live(live.delta, ws.gdelta, ws.op_state, memory.op_type,
                               memory.runs)


@njit(cache=True)
def _run_state(state, plan, live, fresh):
    _run(state.tables, state.memory, state.schedule, state.mesh, state.device[0],
         state.layout, state.ws, state.no_ledger, plan, live, fresh)


@njit(cache=True)
def step_and_peak(state, plan, live, fresh, overlap):
    """(step seconds, peak bytes per device) of one plan: the search's hot path. overlap:
    OVERLAP_*."""
    _run_state(state, plan, live, fresh)
    totals = state.ws.totals
    compute, comm = totals[T_COMPUTE], totals[T_COMM]
    if overlap == OVERLAP_SCHEDULED:
        step = totals[T_SCHEDULED]
    elif overlap == OVERLAP_PERFECT:
        step = max(compute, comm)
    else:
        step = compute + comm
    return step, totals[T_ARG] + totals[T_OUT] + totals[T_TEMP] - totals[T_ALIAS]


@njit(cache=True)
def step_and_peak_edited(state, overlap):
    """step_and_peak of the plan an incremental estimator holds in `state` (state.plan, its
    live ranges state.scratch), costing only what its last edit changed."""
    return step_and_peak(state, state.plan, state.scratch, False, overlap)


@njit(cache=True)
def evaluate(state, plan, live, fresh):
    """Everything an Estimate needs of one plan: (totals, collectives [kind, mask, count |
    bytes | seconds], compute and communication seconds per op type), copies the caller
    keeps."""
    _run_state(state, plan, live, fresh)
    ws = state.ws
    return ws.totals.copy(), ws.coll.copy(), ws.op_state.compute.copy(), \
        ws.op_state.comm.copy()


@njit(cache=True)
def charges(state, plan, ledger):
    """(`ledger`, an empty one (empty_ledger), filled: every collective the kernel charges in
    the row of the place that charges it (_ledger.py); compute seconds per op type). Not the
    hot path."""
    _collectives(state.tables, state.mesh, state.device[0], state.layout, state.ws, plan,
                 ledger, False)
    return ledger, state.ws.op_state.compute.copy()


@njit(cache=True)
def value_type_masks(state, plan):
    """(eff[T, D], vmask[T]) of a plan: per value type, the mesh-axis bits of each dim."""
    ws = state.ws
    type_masks(plan, state.tables, ws.eff, ws.vmask, ws.ranks, ws.dims)
    return ws.eff.copy(), ws.vmask.copy()


@njit(cache=True)
def fill_temps(state, live, held):
    """Sizes the temporaries of `live` afresh under the masks `held`."""
    live.delta[:] = 0.0
    add_temps(live.delta, held, state.mesh, state.memory)
    live.held[:] = held


def empty_ledger(layout) -> np.ndarray:
    """A ledger of `layout.rows` rows, no charges."""
    return np.zeros(layout.rows, LEDGER)


@njit(cache=True)
def live_bytes(state, plan, live):
    """What is live at each position of the memory sweep under one plan (not the hot path):
    (temporaries' deltas [N + 2], the deltas of every buffer a plan adds but outputs [N + 2],
    the outputs' deltas [N + 2] (negative for those not written yet), the bytes each op holds
    while it runs [N], totals). The peak is the largest prefix sum of the three deltas plus the
    held bytes, over the positions."""
    _run_state(state, plan, live, True)
    ws, memory = state.ws, state.memory
    added = ws.gdelta.copy()
    totals = ws.totals.copy()
    ws.gdelta[:] = 0.0
    arguments_and_outputs(state.mesh, memory, ws, totals)
    outputs = ws.gdelta.copy()
    op_type = memory.op_type
    held = np.empty(op_type.shape[0])
    for n in range(op_type.shape[0]):
        held[n] = ws.op_state[op_type[n]].gathered
    return live.delta.copy(), added - outputs, outputs, held, totals
