"""The order in which a compiler runs the program, as its buffer assignment sees it.

The liveness sweep of the cost model walks ops in an order and keeps each buffer from the op
that writes it to the last op that reads it. Program (jaxpr) order is what a memory-minimising
scheduler tends to keep. XLA:CPU schedules differently: with a collective in the module it
always takes its concurrency-optimised schedule (CpuCompiler::CreateHloSchedule picks
BFSMemoryScheduler; cpu_compiler_test.cc, CollectivesForceConcurrencyOptimized), which is
Kahn's topological sort with a FIFO queue (hlo_memory_scheduler.cc): every instruction runs as
soon as the last of its operands is made, level by level. So a weight's all-gather and its
transposed copies run at the very start and live until the backward pass, and the backward
ops that need only forward values (a max-pool gradient's window indices) run in the forward.

`breadth_first_positions` gives each op its place in that order. An XLA fusion is one
instruction: an op whose results are all fused (_fusion.fused_values) runs inside its readers'
fusions, each of which is ready when the last of its outside operands is. A loop is one
instruction, its body ops right after it; XLA schedules each computation on its own, a loop
body breadth first too (the BFSMemoryScheduler is a computation scheduler, run on every
computation of the module): within an iteration, an op runs as soon as its operands are
there. An optimization_barrier orders nothing there: XLA:CPU removes it before it
schedules (_value_facts.barrier_sources), so an op reading a barrier's result is ready when
that result's operand is, and the recomputation a barrier keeps apart from the forward pass
(plan.jit's remat, a user's jax.checkpoint) runs as soon as the values it reads exist, in the
forward pass. `memory_order` is the order a device's sweep walks (that one, or program order),
`ready_positions` where a value can first be resharded, `workspace_temps` the max-pool
gradient's expansion as that schedule runs it.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..program import BODY_INPUT, NO_OP
from ._compiler import compiler_profile
from ._static import static_tables
from ._value_facts import barrier_sources, liveness


def breadth_first_positions(prog, fused: np.ndarray) -> np.ndarray:
    """[N]: the position of each op in XLA:CPU's breadth-first schedule (a permutation of
    0..N-1, a loop's body ops right after it, in the body's own breadth-first order)."""
    ops = prog.ops
    N = len(ops)
    # An op whose results are all fused runs inside the fusions of its readers (cloned into
    # each): the instructions of a computation are its other ops, each with the fused ops it
    # pulls in.
    inside = np.array([not op.body and bool(op.results) and all(fused[r] for r in op.results)
                       for op in ops])
    computations: dict[int, list[int]] = {}  # region op (NO_OP: the step) -> its instructions
    for op in ops:
        if not inside[op.id]:
            computations.setdefault(op.region, []).append(op.id)
    source = barrier_sources(prog)
    position = np.full(N, -1, np.int64)
    placed = 0

    def place(region: int) -> None:
        nonlocal placed
        for n, pulled in _breadth_first(prog, fused, inside, source,
                                        computations.get(region, [])):
            # the fused ops it pulls in that no earlier instruction ran, then the op; then a
            # loop's body ops (each computation is scheduled on its own)
            for m in pulled:
                if position[m] < 0:
                    position[m] = placed
                    placed += 1
            if ops[n].body:
                place(n)

    place(NO_OP)
    if placed != N:
        raise AssertionError(f"breadth_first_positions: placed {placed} of {N} ops (a cycle?)")
    return position


def _breadth_first(prog, fused, inside, source, roots: list[int]):
    """(instruction, the ops it runs, itself included, in program order) for the instructions
    `roots` of one computation, in the order Kahn's algorithm with a FIFO queue takes them
    (BFSMemoryScheduler): each as soon as the last instruction it reads from has run. A value
    made outside the computation (a body's inputs, the step's arguments) is there from its
    start."""
    values, ops = prog.values, prog.ops
    instruction = {n: n for n in roots}  # op of this computation or below -> its instruction
    pulled: dict[int, list] = {}
    for n in roots:
        members, stack, seen = [], [n], {n}
        while stack:
            m = stack.pop()
            members.append(m)
            for u in ops[m].operands:
                p = values[u].producer
                if fused[u] and p != NO_OP and inside[p] and p not in seen:
                    seen.add(p)
                    stack.append(p)
        pulled[n] = sorted(members)
        for m in members:
            instruction.setdefault(m, n)
        for m in range(*ops[n].body_ops):  # a region's body ops belong to the region op
            instruction[m] = n
    deps: dict[int, set] = {}
    users: dict[int, list] = {}
    for n in roots:
        need = set()
        for m in pulled[n]:
            for u in (*ops[m].operands, *ops[m].body):
                p = values[source[u]].producer
                if p != NO_OP and not fused[u] and instruction.get(p, n) != n:
                    need.add(instruction[p])
        deps[n] = need
        for b in need:
            users.setdefault(b, []).append(n)
    waiting = {n: len(deps[n]) for n in roots}
    queue = deque(n for n in roots if waiting[n] == 0)
    while queue:
        n = queue.popleft()
        yield n, pulled[n]
        for b in users.get(n, ()):
            waiting[b] -= 1
            if waiting[b] == 0:
                queue.append(b)


def workspace_temps(temps, pieces, prog, position, value_type) -> None:
    """Fills `temps` with the select-and-scatter expansion's buffers (select_and_scatter_pieces)
    as a breadth-first schedule runs them: the iotas, made from nothing, from the start; the
    reduce-window as soon as its operand (the forward activation) is made, in the forward
    pass; its indices from then until the scatter in the backward pass."""
    for i, (op, kind, value, nbytes) in enumerate(pieces):
        producer = prog.values[prog.ops[op].operands[1]].producer
        ready = position[producer] if producer >= 0 else 0
        start, end = {"iota": (0, ready + 1), "window": (ready, ready + 1),
                      "indices": (ready, position[op] + 1)}[kind]
        temp = temps[i]  # (a record view: its other fields are the caller's)
        temp["start"], temp["end"], temp["nbytes"] = start, end, nbytes
        temp["value_type"], temp["min_nbytes"] = value_type[value], 0.0


def ready_positions(prog, position) -> np.ndarray:
    """[V]: where each value is ready in the order `position`: at its producer, at the start
    for the step's inputs and constants; N (past the end) for a loop body's inputs, whose
    readers take their own position."""
    ready = np.zeros(len(prog.values), np.int64)
    for v in prog.values:
        if v.producer != NO_OP:
            ready[v.id] = position[v.producer]
        elif v.origin == BODY_INPUT:
            ready[v.id] = len(position)
    return ready


def memory_order(an, dev):
    """(position [N] of each op in the order the compiler runs them, live_start [V], live_end
    [V] in that order): the breadth-first schedule where the device's compiler schedules so
    (CompilerProfile.schedules_breadth_first: XLA:CPU), else program order."""
    st = static_tables(an)
    if not compiler_profile(dev).schedules_breadth_first:
        return np.arange(st.num_ops), st.values.live_start, st.values.live_end

    def build():
        position = breadth_first_positions(an.program, st.passes.fused)
        return (position, *liveness(an.program, position))

    return an.derived("cost.breadth_first", build)
