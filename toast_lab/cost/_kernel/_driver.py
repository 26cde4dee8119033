"""The kernel's entries: one plan through the phases, in order.

    masks -> operand classification -> op costs (with reshard pricing and the partitioner's
    patterns) -> shared reads -> overlap schedule -> liveness and memory

Every entry runs one compiled function, `_entry`, with a mode. numba compiles a function's
callees into it and has LLVM optimise and emit the whole again for each compiled caller: an
entry per purpose, each calling the pipeline, compiled the kernel once per entry (a cold start
of minutes). One compiled entry compiles it once. Its inputs are those the state holds (the
plan, the live ranges, the ledger: `Host`, _state.py), which the Python entries below fill
first and read back after, under the state's lock (threads of one Lab share a state).

`step_and_peak` is the search's hot path, `edit_evaluator` the incremental estimator's,
`evaluate` gives everything an Estimate needs, `charges` the ledger.
"""

from __future__ import annotations

import functools

import numpy as np
from numba import njit, typeof, types

from ._jit import inline, jit
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

# What one call of _entry does: the whole plan (RUN), the live bytes at each position after it
# (LIVE_BYTES), phases 1-5 into the ledger (CHARGES), the masks alone (TYPE_MASKS), or the
# temporaries sized afresh (FILL_TEMPS)
RUN, LIVE_BYTES, CHARGES, TYPE_MASKS, FILL_TEMPS = range(5)


@inline
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
def _sweep(tables, memory, sched, mesh, ws, live, fresh):
    """Phases 6 and 7 after _collectives: the schedule, and the peak of the live bytes. live:
    the temporaries' live ranges, sized afresh (fresh) or moved from the masks they were sized
    under."""
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


@inline
def _outputs_apart(state):
    """After a RUN: ws.added the live-byte deltas the plan adds (outputs included), ws.gdelta
    the outputs' alone, ws.op_held the bytes each op holds while it runs."""
    ws, memory = state.ws, state.memory
    for n in range(ws.gdelta.shape[0]):  # (a loop: an array copy compiles numba's error text)
        ws.added[n] = ws.gdelta[n]
    ws.gdelta[:] = 0.0
    arguments_and_outputs(state.mesh, memory, ws, ws.totals)
    op_type = memory.op_type
    for n in range(op_type.shape[0]):
        ws.op_held[n] = ws.op_state[op_type[n]].gathered


@njit(cache=True)
def _entry(state, mode, fresh, overlap):
    """The plan and live ranges `state` holds through the kernel, as `mode` says (RUN, ...);
    fresh: the live ranges sized afresh, not moved (and every operand and op type costed
    again, not only those the last edit changed). Returns (step seconds, peak bytes per
    device) after a RUN or LIVE_BYTES (overlap: OVERLAP_*), else zeros."""
    ws, tables, memory, mesh, plan, live = (state.ws, state.tables, state.memory, state.mesh,
                                            state.plan, state.scratch)
    if mode == TYPE_MASKS:
        type_masks(plan, tables, ws.eff, ws.vmask, ws.ranks, ws.dims)
        return 0.0, 0.0
    if mode == FILL_TEMPS:
        live.delta[:] = 0.0
        add_temps(live.delta, live.held, mesh, memory)
        return 0.0, 0.0
    charging = mode == CHARGES
    _collectives(tables, mesh, state.device[0], state.layout, ws, plan,
                 state.ledger if charging else state.no_ledger, not (fresh or charging))
    if charging:
        return 0.0, 0.0
    _sweep(tables, memory, state.schedule, mesh, ws, live, fresh)
    totals = ws.totals
    compute, comm = totals[T_COMPUTE], totals[T_COMM]
    if overlap == OVERLAP_SCHEDULED:
        step = totals[T_SCHEDULED]
    elif overlap == OVERLAP_PERFECT:
        step = max(compute, comm)
    else:
        step = compute + comm
    peak = totals[T_ARG] + totals[T_OUT] + totals[T_TEMP] - totals[T_ALIAS]
    if mode == LIVE_BYTES:
        _outputs_apart(state)
    return step, peak


def entry_types(state) -> tuple:
    """The numba types _entry is compiled for: the ones every Python entry below calls it
    with (a state, an int mode, a bool, an int overlap)."""
    return typeof(state), types.int64, types.boolean, types.int64


def _run(state, plan, live, mode, fresh, overlap=OVERLAP_SCHEDULED):
    """_entry on `plan` and `live` (copied into the state's, and `live` back out when it is
    not the state's own); the caller holds the state's lock."""
    host = state.host
    if plan is not host.plan:
        mine = host.plan
        _copy_in(mine.mask, plan.mask, "the plan's", "mask")
        _copy_in(mine.rank, plan.rank, "the plan's", "rank")
        _copy_in(mine.resolution, plan.resolution, "the plan's", "resolution")
    if live is None or live is host.live:
        return _entry(state, mode, fresh, overlap)
    if not fresh:
        _copy_in(host.live.delta, live.delta, "the live ranges'", "delta")
        _copy_in(host.live.held, live.held, "the live ranges'", "held")
    out = _entry(state, mode, fresh, overlap)
    np.copyto(live.delta, host.live.delta)
    np.copyto(live.held, host.live.held)
    return out


def _copy_in(mine, given, what, name):
    """given (an array of the caller's) into the state's own `mine`, of the same shape: numpy
    would broadcast a shorter one silently, and the kernel read another plan than the one
    given."""
    if given.shape != mine.shape:
        raise ValueError(f"{what} {name} has shape {given.shape}; this cost model's kernel "
                         f"reads {mine.shape} (arrays of another analysis's plan?)")
    mine[...] = given  # (numpy's copyto takes twice as long to say the same)


def step_and_peak(state, plan, live, fresh, overlap):
    """(step seconds, peak bytes per device) of one plan (PlanArrays): the search's hot path.
    live: a Liveness, written; fresh: sized afresh (else moved from what `live` holds);
    overlap: OVERLAP_*."""
    with state.host.lock:
        return _run(state, plan, live, RUN, fresh, overlap)


def edit_evaluator(state, overlap):
    """A function of no arguments giving step_and_peak of the plan an incremental estimator
    holds in `state` (state.plan, its live ranges state.scratch), costing only what its last
    edit changed. It calls _entry's compiled code straight: numba's dispatch would type the
    four arguments again at each call, about 1 us of an edit's 30."""
    signature = entry_types(state)
    if signature not in _entry.overloads:
        _entry.compile(signature)
    return functools.partial(_entry.overloads[signature].entry_point, state, RUN, False,
                             overlap)


def evaluate(state, plan, live, fresh):
    """Everything an Estimate needs of one plan: (totals, collectives [kind, mask, count |
    bytes | seconds], compute and communication seconds per op type), copies the caller
    keeps."""
    ws = state.host.ws
    with state.host.lock:
        _run(state, plan, live, RUN, fresh)
        return ws.totals.copy(), ws.coll.copy(), ws.op_state["compute"].copy(), \
            ws.op_state["comm"].copy()


def charges(state, plan, ledger):
    """(`ledger`, an empty one (empty_ledger), filled: every collective the kernel charges in
    the row of the place that charges it (_ledger.py); compute seconds per op type). Not the
    hot path."""
    host = state.host
    n = min(len(ledger), len(host.ledger))  # (charges past the caller's rows are not kept)
    with host.lock:
        host.ledger[:] = 0
        host.ledger[:n] = ledger[:n]
        _run(state, plan, None, CHARGES, True)
        ledger[:n] = host.ledger[:n]
        return ledger, host.ws.op_state["compute"].copy()


def value_type_masks(state, plan):
    """(eff[T, D], vmask[T]) of a plan: per value type, the mesh-axis bits of each dim."""
    ws = state.host.ws
    with state.host.lock:
        _run(state, plan, None, TYPE_MASKS, True)
        return ws.eff.copy(), ws.vmask.copy()


def fill_temps(state, live, held):
    """Sizes the temporaries of `live` afresh under the masks `held`."""
    host = state.host
    with host.lock:
        np.copyto(host.live.held, held)
        _run(state, host.plan, live, FILL_TEMPS, True)
        np.copyto(live.held, held)


def empty_ledger(layout) -> np.ndarray:
    """A ledger of `layout.rows` rows, no charges."""
    return np.zeros(layout.rows, LEDGER)


def live_bytes(state, plan, live):
    """What is live at each position of the memory sweep under one plan (not the hot path):
    (temporaries' deltas [N + 2], the deltas of every buffer a plan adds but outputs [N + 2],
    the outputs' deltas [N + 2] (negative for those not written yet), the bytes each op holds
    while it runs [N], totals). The peak is the largest prefix sum of the three deltas plus the
    held bytes, over the positions."""
    ws = state.host.ws
    with state.host.lock:
        _run(state, plan, live, LIVE_BYTES, True)
        outputs = ws.gdelta.copy()
        return live.delta.copy(), ws.added - outputs, outputs, ws.op_held.copy(), \
            ws.totals.copy()
