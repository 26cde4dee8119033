"""What each value of the program is, whatever the plan: its split classes dim by dim, its
bytes, whether it is an argument or an output of the step, and when it is live in program
order.

Built from the analysis (its classes split by domain: _plan_arrays.py) once per analysis
(_static.py). Mesh axes enter only at evaluation, as bit masks over the split classes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..program import BODY_INPUT, INPUT, NO_OP
from ._fusion import fused_values
from ._plan_arrays import split_classes


@dataclass(frozen=True, eq=False)
class ValueFacts:
    """Per value ([V], the program's value ids) of the program; bytes are whole tensors."""

    width: int                  # D: the largest rank (at least 1)
    # [V, D] int32: the split class (class in the value's domain, _plan_arrays.py) of dim d
    # of value v (-1: size 1, or padding past its rank)
    slot_class: np.ndarray
    nbytes: np.ndarray          # [V] float64
    conflict_class: np.ndarray  # [C] int64: the split class of each conflict
    is_input: np.ndarray        # [V] bool: an argument of the step
    is_output: np.ndarray       # [V] bool: an output of the step
    inputs: np.ndarray          # [I] int32: the step's arguments, in order
    outputs: np.ndarray         # [O'] int32: its outputs, in order
    # [V] int32: [start, end) positions in program order, 0..N-1 the ops, N the end (liveness)
    live_start: np.ndarray
    live_end: np.ndarray


def value_facts(an) -> ValueFacts:
    """The ValueFacts of analysis `an`."""
    prog = an.program
    values = prog.values
    width = max((v.ndim for v in values), default=0) or 1
    slot_class = np.full((len(values), width), -1, np.int32)
    split = split_classes(an)  # a class per domain: see _plan_arrays.py
    for v, classes in enumerate(split.value_classes):
        if classes:
            slot_class[v, :len(classes)] = classes
    is_output = np.zeros(len(values), bool)
    is_output[list(prog.outputs)] = True
    live_start, live_end = liveness(prog)
    return ValueFacts(
        width=width, slot_class=slot_class,
        nbytes=np.array([v.nbytes for v in values], np.float64),
        conflict_class=split.conflict_class,
        is_input=np.array([v.origin == INPUT for v in values], bool), is_output=is_output,
        inputs=np.array(prog.inputs, np.int32), outputs=np.array(prog.outputs, np.int32),
        live_start=live_start, live_end=live_end)


def liveness(prog, position=None):
    """[start, end) positions of each value: positions 0..N-1 are ops, N is the end.

    position: [N] each op's place in the order the compiler runs them (a permutation keeping a
    region's body ops right after it, see _order.py); None: program order.
    Inputs and constants are live from 0; a value lives until its last reader; outputs until
    the end. A region op's results are allocated when the loop starts (its position), and a
    value read inside a region it was not made in lives until the region ends (every
    iteration reads it); one made in the region (an iteration's temporary) lives until its
    last reader there; a scan's x slice (x_slices) from its first reader to its last. An
    optimization_barrier's result is its operand's buffer (barrier_sources): the operand
    lives as long as the result.
    """
    values, ops = prog.values, prog.ops
    N = len(ops)
    at = np.arange(N) if position is None else np.asarray(position)
    start = np.array([at[v.producer] if v.producer != NO_OP else 0 for v in values],
                     np.int32)
    end = start + 1
    # a region's body ops follow it in any order: it ends after the last of them
    region_end = {op.id: at[op.id] + op.body_ops[1] - op.id for op in ops if op.body}
    made_in = [ops[v.producer].region if v.producer != NO_OP else NO_OP for v in values]
    slices = {u: op.id for op in ops for u in x_slices(op)}
    for op in ops:
        if op.body:  # a body's inputs are made by its region op, in the region
            for v in op.body:
                if values[v].origin == BODY_INPUT:
                    made_in[v] = op.id
    for op in ops:
        for u in op.operands:
            pos = at[op.id] + 1
            r = op.region
            while r != NO_OP and r != made_in[u]:  # read in a loop: needed until it is done
                pos = max(pos, region_end[r])
                r = ops[r].region
            end[u] = max(end[u], pos)
        for u in op.body:
            if u not in slices:
                end[u] = max(end[u], region_end[op.id])
        for i in region_read_operands(op):  # read in place by every iteration or branch
            u = op.operands[i]
            end[u] = max(end[u], region_end[op.id])
    for u, loop in slices.items():  # taken from its stack where first read
        readers = [_within(ops, r, loop) for r in prog.users(u)]
        start[u] = min((at[r] for r in readers), default=at[loop] + 1)
        end[u] = max(end[u], start[u] + 1)
    for u in handed_to_loops(prog):  # its buffer is the loop's state from the loop's start
        end[u] = at[prog.users(u)[0]]
    for v in prog.outputs:
        end[v] = N + 1
    bitcast = bitcast_sources(prog) != np.arange(len(values))
    for op in reversed(ops):  # a barrier of a barrier's result: the outer one first
        if op.primitive == BARRIER:
            for r, u in zip(op.results, op.operands):
                end[u] = max(end[u], end[r])
        elif op.results and bitcast[op.results[0]]:
            end[op.operands[0]] = max(end[op.operands[0]], end[op.results[0]])
    return start, end


# XLA removes every optimization_barrier before it assigns buffers (OptimizationBarrierExpander:
# the XLA:CPU pipeline runs it before layout assignment, right after CSE, which is all the
# barrier is there to stop; the GPU pipeline after scheduling): its results are its operands.
BARRIER = "optimization_barrier"


def barrier_sources(prog) -> np.ndarray:
    """[V] int: the value whose buffer each value is once XLA has removed the program's
    optimization_barriers: a barrier's result is its operand (through barriers of barriers),
    every other value itself."""
    source = np.arange(len(prog.values))
    for op in prog.ops:  # program order: an operand's own source is known first
        if op.primitive == BARRIER:
            for r, u in zip(op.results, op.operands):
                source[r] = source[u]
    return source


def x_slices(op) -> list[int]:
    """A scan's body inputs that are slices of its xs: XLA's loop body takes each from its
    stack (a dynamic-slice, in the loop's state all along) where it is read, not when the
    iteration starts."""
    if op.primitive != "scan":
        return []
    nc, nk = op.params["num_consts"], op.params["num_carry"]
    return list(op.body[nc + nk:len(op.operands)])


# Shape changes XLA compiles to a bitcast of a buffer in its default (row-major) layout.
BITCASTS = frozenset({"reshape", "squeeze", "expand_dims"})


def bitcast_sources(prog) -> np.ndarray:
    """[V] int: the value whose buffer each value is once XLA has made the program's shape
    changes bitcasts: a reshape's result (squeeze's, expand_dims') that is written, of an
    operand that is written too, is that operand's buffer seen in another shape (a layer
    stack reshaped into pipeline stages, read by the loop, takes no copy); every other value
    itself. Where a fusion makes the operand, the fusion writes the reshaped result instead
    (fused_values), and an output of the step is a buffer of its own."""
    source = np.arange(len(prog.values))
    fused = fused_values(prog)
    outputs = set(prog.outputs)
    for op in prog.ops:  # program order: an operand's own source is known first
        if op.primitive in BITCASTS and op.results:
            r, u = op.results[0], op.operands[0]
            if not fused[r] and not fused[u] and r not in outputs:
                source[r] = source[u]
    return source


def handed_to_loops(prog) -> list[int]:
    """The values whose buffer a loop takes over as its state: a scan's carry (or a while's
    operand past its constants) made by an op of the loop's own computation and read by
    nothing else, once. XLA's while loop updates its state in place, in the init operand's
    buffer where nothing reads that operand after the loop starts; where something does (or
    it is an argument, a constant or an output of the step, or fills two state slots) it
    copies the operand into a state buffer of its own."""
    values, ops = prog.values, prog.ops
    outputs = set(prog.outputs)
    handed = []
    for op in ops:
        if op.primitive == "scan":
            nc = op.params["num_consts"]
            state = op.operands[nc:nc + op.params["num_carry"]]
        elif op.primitive == "while":
            state = op.operands[op.params["cond_nconsts"] + op.params["body_nconsts"]:]
        else:
            continue
        for u in state:
            producer = values[u].producer
            if (producer != NO_OP and ops[producer].region == op.region
                    and u not in outputs and tuple(prog.users(u)) == (op.id,)
                    and list(op.operands).count(u) == 1):
                handed.append(u)
    return handed


def _within(ops, o: int, region: int) -> int:
    """The op of `region`'s body that is or holds op `o`."""
    while ops[o].region != region:
        o = ops[o].region
    return o


def region_read_operands(op) -> list[int]:
    """The operands of a region op that its body reads in place, every iteration or branch:
    they live until the region ends (a scan's constants and its xs, whose slices the
    iterations take one by one from the stack in the loop's state; a while's constants, a
    cond's operands)."""
    if op.primitive == "scan":
        nc, nk = op.params["num_consts"], op.params["num_carry"]
        return [*range(nc), *range(nc + nk, len(op.operands))]
    if op.primitive == "while":
        return list(range(op.params["cond_nconsts"] + op.params["body_nconsts"]))
    if op.primitive == "cond":
        return list(range(1, len(op.operands)))
    return []
