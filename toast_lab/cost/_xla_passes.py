"""What XLA's passes make of the program, whatever the plan:

- fusion (_fusion.py): the values it never writes, and the attention kernels it fuses;
- AllReduceReassociate: partial sums added together are reduced once, at the last add;
- the scheduler's view of program order: what is known before any compute, when each op's
  operands are ready and its results first needed, where top-level loop bodies start and end;
- loop-invariant code motion: a scan's constants are resharded once, before the loop;
- buffer colocation: a region's body values that are buffers of the region op, not their own;
- sharding propagation into a loop's state: the stack a forward scan keeps for the backward
  one takes its slice's layout.

Built from the program and the ops that leave partial sums (the reduction groups of
_operand_rows.py), once per analysis (_static.py). The device's compiler profile decides which
of them apply (_device_tables.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..program import NO_OP
from ._fusion import MOVEMENT, attention_kernels, fused_values, fusible
from ._value_facts import barrier_sources, bitcast_sources, region_read_operands


@dataclass(frozen=True, eq=False)
class PassAnalyses:
    """Per value ([V]) and per op ([N]) of the program."""

    fused: np.ndarray           # [V] bool: an elementwise intermediate XLA fuses away
    attention_inside: np.ndarray  # [V] bool: a score-shaped value of a fused attention kernel
    kernel: np.ndarray          # [N] int8: _fusion.KERNEL_*, XLA's attention fused
    kernel_own: np.ndarray      # [N] int8: the same where it is not (_fusion.attention_kernels)
    flop_scale: np.ndarray      # [N]: the share of its flops a fused kernel computes
    sum_leader: np.ndarray      # [N] int: the op that reduces this op's partial sums (-1: itself)
    # scheduling (the overlap of collectives with compute)
    early: np.ndarray           # [V] bool: known before any compute (inputs, and casts of them)
    ready: np.ndarray           # [N] int: the latest op making a non-early operand (-1: none)
    deadline: np.ndarray        # [N] int: the first op reading a result (N: none, an output)
    body_first: np.ndarray      # [N] bool: the first op of a top-level loop body
    body_last_trip: np.ndarray  # [N]: the trip count at the last op of a top-level loop body
    # [N]: how often an op runs per trip of its top-level loop (a loop nested in the body runs
    # its ops that many times each trip: a layer scan inside a micro-batch loop); 1 elsewhere
    nested: np.ndarray
    # [V] the outermost loop (a scan op) each value is the same across every iteration of, a
    # loop-invariant input of its body (-1: none), and the value outside that loop it is
    invariant_loop: np.ndarray
    invariant_source: np.ndarray
    # [V] bool: a value that is another value's buffer, not one of its own: a region's body
    # value that is a buffer outside the body (in_place_body_values: a constant or a branch's
    # input is its operand, read in place; a loop's carry in and out are its state buffer,
    # updated in place; a branch's output is the cond's result), an optimization barrier's
    # result, its operand once XLA has removed the barrier (barrier_sources), and a splat
    # constant a loop reads, made inside the loop (sunk_constants)
    outside_buffer: np.ndarray
    # [V] int32: the value whose sharding v's buffer takes in XLA, where that is not v's own
    # while v keeps its classes (and so the layout plan.jit exports): only its bytes per
    # device follow (-1: its own; _held_like)
    held_like: np.ndarray


def pass_analyses(prog, reducers: set, uniform=None) -> PassAnalyses:
    """The PassAnalyses of program `prog`; `reducers`: the ops that leave partial sums XLA
    all-reduces (a sharded contraction's); `uniform`: {value: the one number it holds} of
    the constants (_folding.uniform_constants)."""
    attention_inside, kernel_own, kernel, flop_scale = attention_kernels(prog)
    sum_leader = _sum_leaders(prog, reducers)
    early, ready, deadline, body_first, body_last_trip, nested = _schedule(prog, sum_leader)
    invariant_loop, invariant_source, outside_buffer = _loop_invariants(prog)
    outside_buffer |= barrier_sources(prog) != np.arange(len(prog.values))
    outside_buffer |= bitcast_sources(prog) != np.arange(len(prog.values))
    outside_buffer |= sunk_constants(prog, uniform or {})
    return PassAnalyses(
        fused=fused_values(prog), attention_inside=attention_inside, kernel=kernel,
        kernel_own=kernel_own, flop_scale=flop_scale, sum_leader=sum_leader, early=early,
        ready=ready, deadline=deadline, body_first=body_first, body_last_trip=body_last_trip,
        nested=nested, invariant_loop=invariant_loop, invariant_source=invariant_source,
        outside_buffer=outside_buffer, held_like=_held_like(prog))


# Ops a partial sum passes through unchanged in value (up to layout and precision).
LINEAR = frozenset({"convert_element_type", "reshape", "transpose", "squeeze", "expand_dims",
                     "copy"})


def _sum_leaders(prog, reducers) -> np.ndarray:
    """[N]: for an op leaving partial sums that are only added to other such ops' (q, k and v
    input gradients, add_any of a tied weight's gradients), the last op of that sum: XLA adds
    the partial sums and reduces once there (AllReduceReassociate). -1 elsewhere."""
    values, ops = prog.values, prog.ops
    parent = {}

    def find(i):
        while parent.get(i, i) != i:
            i = parent[i]
        return i

    def sources(v):
        """The reducers whose partial sums reach v through single-reader linear ops and adds."""
        p = values[v].producer
        if p == NO_OP:
            return None
        op = ops[p]
        if p in reducers:
            return [p]
        if op.primitive in LINEAR or op.primitive in ("add", "add_any"):
            found = []
            for u in op.operands:
                if len(prog.users(u)) != 1:
                    return None
                more = sources(u)
                if more is None:
                    return None
                found += more
            return found
        return None

    for op in ops:
        if op.primitive not in ("add", "add_any") or op.body:
            continue
        found = sources(op.results[0])
        if found and len(found) > 1:
            root = find(found[0])
            for q in found[1:]:
                parent[find(q)] = root
    leader = np.full(len(ops), -1, np.int64)
    members: dict[int, list[int]] = {}
    for q in parent:
        members.setdefault(find(q), []).append(q)
    for root, group in members.items():
        group = sorted(set(group) | {root})
        for q in group[:-1]:
            leader[q] = group[-1]
    return leader


def _real_readers(prog, v: int, outputs, through) -> list:
    """The ops that need v's reduced data: a reduction of partial sums commutes with layout
    changes, casts and sums (`through`), so it can wait past them, to the first op that
    needs whole values; None stands for the step's end (v reaches an output)."""
    if v in outputs:
        return [None]
    out = []
    for r in prog.users(v):
        op = prog.ops[r]
        if op.primitive in through and len(op.results) == 1:
            out += _real_readers(prog, op.results[0], outputs, through)
        else:
            out.append(r)
    return out


_COMMUTES = LINEAR | {"reduce_sum"}


def early_values(prog) -> np.ndarray:
    """[V] bool: values known before any compute (inputs, and data movement of them)."""
    values, ops = prog.values, prog.ops
    early = np.zeros(len(values), bool)
    for v in values:
        if v.producer == NO_OP:
            early[v.id] = v.origin != "body"
    for op in ops:  # program order: operands come first
        if op.primitive == "scan":  # a scanned parameter slice is as early as the stack
            for u, b in zip(op.operands, op.body):
                early[b] = early[u] and values[b].origin == "body"
        elif not op.body and op.primitive in MOVEMENT and all(early[u] for u in op.operands):
            early[list(op.results)] = True
    return early


def _schedule(prog, sum_leader) -> tuple:
    """What the overlap of collectives with compute needs to know of program order: (early,
    ready, deadline, body_first, body_last_trip, nested) of PassAnalyses."""
    values, ops = prog.values, prog.ops
    N = len(ops)
    early = early_values(prog)
    ready = np.full(N, -1, np.int64)
    deadline = np.full(N, N, np.int64)
    grouped = set(np.nonzero(sum_leader >= 0)[0]) | set(sum_leader[sum_leader >= 0])
    outputs = set(prog.outputs)
    for op in ops:
        made = [values[u].producer for u in op.operands
                if not early[u] and values[u].producer != NO_OP]
        ready[op.id] = max(made, default=-1)
        # partial sums added before their reduction (sum_leader) wait past the adds too
        through = _COMMUTES | {"add", "add_any"} if op.id in grouped else _COMMUTES
        readers = [r for v in op.results for r in _real_readers(prog, v, outputs, through)]
        if readers and None not in readers:
            deadline[op.id] = min(readers)
    body_first = np.zeros(N, bool)
    body_last_trip = np.zeros(N)
    nested = np.ones(N)
    for op in ops:
        if op.body and op.region == NO_OP and op.body_ops[1] > op.body_ops[0]:
            first, stop = op.body_ops
            body_first[first] = True
            trip = float(ops[first].trip_count)
            body_last_trip[stop - 1] = trip
            nested[first:stop] = [ops[m].trip_count / trip for m in range(first, stop)]
    return early, ready, deadline, body_first, body_last_trip, nested


def _loop_invariants(prog) -> tuple:
    """A scan's constants (the weights a gradient-accumulation loop reads every micro-batch)
    are the same in every iteration: XLA's loop-invariant code motion reshards them once,
    before the loop (jax 0.10.2 gathers an FSDP step's weights there, not per micro-batch),
    and the reshard's buffer lives through the loop. Followed through nested scans to the
    outermost loop they are constant in. With them, the body values that are no buffers of
    their own (in_place_body_values). (invariant_loop, invariant_source, outside_buffer) of
    PassAnalyses."""
    values = prog.values
    loop = np.full(len(values), -1, np.int64)
    source = np.arange(len(values), dtype=np.int64)
    outside = np.zeros(len(values), bool)
    for op in prog.ops:  # program order: an outer loop comes before the loops in its body
        outside[in_place_body_values(op)] = True
        if op.primitive != "scan":
            continue
        consts = op.params["num_consts"]
        for b, u in zip(op.body[:consts], op.operands):
            loop[b] = loop[u] if loop[u] >= 0 else op.id
            source[b] = source[u]
    return loop, source, outside


def sunk_constants(prog, uniform: dict) -> np.ndarray:
    """[V] bool: splat constants (one number broadcast: a mask's fill, the zeros of its
    gradient) that loops read as constants and fusions read, and nothing else: no buffers.
    The module jax 0.10 hands XLA already makes such a constant inside the body of the loop
    that reads it (a Llama step's while operands hold the causal mask's predicate, not the
    -inf fill jnp.where broadcasts next to it), where the fusions reading it make it; outside
    loops, fusions make it too (a scan closing over jnp.full((256, 256), -1e9): XLA:CPU's
    temporaries are those of the same scan writing -1e9 in its body)."""
    ops = prog.ops
    sunk = np.zeros(len(prog.values), bool)

    def made_where_read(u: int, v: int) -> bool:
        if fusible(ops[u]):
            return True
        return ops[u].primitive in ("scan", "while") and any(
            ops[u].operands[i] == v for i in region_read_operands(ops[u]))

    for v in uniform:
        if prog.values[v].ndim == 0 or v in prog.outputs:
            continue
        readers = prog.users(v)
        sunk[v] = bool(readers) and all(made_where_read(u, v) for u in readers)
    return sunk


def in_place_body_values(op) -> list[int]:
    """The body values of a region op that are no buffers of their own. XLA lowers a scan to
    a while, keeps one buffer per state element and colocates it with the cond's and body's
    parameters and the body's root (an accumulator's sum is written there: a fori_loop
    accumulating gradients held a second copy of them otherwise); it colocates a conditional's
    result with each branch's root, and a branch's parameters are its operands (optax's
    MultiSteps and apply_if_finite update the whole optimizer state in a cond: counted as
    buffers, both branches' copies of it put dp's peak at 2.5x XLA's). A scan's constants are
    read in place; its x slices and y slices are buffers of their own."""
    if op.primitive == "scan":
        nc, nk, n_in = op.params["num_consts"], op.params["num_carry"], len(op.operands)
        return [*op.body[:nc + nk], *op.body[n_in:n_in + nk]]
    if op.primitive in ("while", "cond"):
        return list(op.body)
    return []


def _held_like(prog) -> np.ndarray:
    """[V] for a stack a forward scan keeps for the backward one (Program.loop_only_stacks),
    the slice its loop writes each iteration; -1 elsewhere. XLA starts such a stack from
    zeros in the loop's state, writes each slice in, and the backward loop reads it a slice
    at a time: no op outside the loops asks sharding propagation for a layout of the stack,
    so it takes its slice's, the scanned dim whole. An RNN's residuals with the sequence
    sharded are f32[T, ...] in both while loops; a scanned GPT's with `layers` on model and
    the batch on (model, data) are f32[L, B/8, ...], where the plan, `layers` decided first,
    shards the stack on `layers` and leaves its batch whole (jax 0.10.2). A stack also read
    outside loops is written into its own shard (the RNN's hs)."""
    held = np.full(len(prog.values), -1, np.int32)
    for r in prog.loop_only_stacks():
        op = prog.ops[prog.values[r].producer]
        held[r] = op.body[len(op.body) - len(op.results) + op.results.index(r)]
    for r in np.nonzero(held >= 0)[0]:  # a slice that is itself such a stack (nested scans)
        while held[held[r]] >= 0:
            held[r] = held[held[r]]
    return held
