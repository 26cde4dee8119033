"""Phase 7, liveness and memory: the peak bytes per device over the order the compiler runs
the ops (MemoryTables.position), and the argument, output and aliased bytes.

Live bytes are kept as deltas per position: `delta` the temporaries (values written to memory,
sized under the masks their buffers are divided by, kept across incremental evaluations),
`ws.gdelta` everything a plan adds (gathered buffers of shared reads, reshards hoisted to where
a value is made, early slices, partial sums waiting for an all-reduce, outputs not yet
written); `ws.gathered` per op type the buffers an op holds while it runs.
"""

from __future__ import annotations

import numpy as np


from ._jit import inline, jit
from ._result import T_ALIAS, T_ARG, T_OUT, T_STATE


@jit
def add_temps(delta, vmask, mesh, memory):
    """Adds the live range of every temporary, at its size under `vmask`, to `delta`."""
    temps = memory.temps
    for i in range(temps.shape[0]):
        temp = temps[i]
        s = _written(temp, mesh[vmask[temp.value_type]].ways)
        delta[temp.start] += s * temp.start_weight
        delta[temp.end] -= s * temp.end_weight


@inline
def _written(temp, ways):
    """The per-device bytes a temporary takes when its value is sharded `ways` ways (none
    below its min_nbytes)."""
    s = temp.nbytes / ways
    return s if s >= temp.min_nbytes else 0.0


@jit
def move_temps(delta, old_vmask, new_vmask, mesh, memory):
    """Re-sizes the live ranges of the temporaries whose value type changed sharding."""
    temps, by_type, of_type = memory.temps, memory.temps_by_type, memory.temps_of_type
    for t in range(old_vmask.shape[0]):
        if old_vmask[t] == new_vmask[t]:
            continue
        new_ways, old_ways = mesh[new_vmask[t]].ways, mesh[old_vmask[t]].ways
        for j in range(by_type[t].start, by_type[t].end):
            temp = temps[of_type[j]]
            s = _written(temp, new_ways) - _written(temp, old_ways)
            delta[temp.start] += s * temp.start_weight
            delta[temp.end] -= s * temp.end_weight


@jit
def hoisted_reshards(tables, memory, ws):
    """A compiler that runs each op as soon as its operands are ready (XLA:CPU's breadth-first
    schedule) reshards an operand as soon as the value is made, not when its reader runs:
    the new buffer lives from then until the reader (memory.operand_reads, one per op and
    operand; none where reshards run at their op, charged there in `gathered`)."""
    operand_reads = memory.operand_reads
    if operand_reads.shape[0] == 0:
        return
    gdelta, pstate, member_bytes = ws.gdelta, ws.op_state, ws.member_bytes
    ops = tables.ops
    for p in range(ops.shape[0]):
        for i in range(ops[p].operands_start, ops[p].operands_end):
            pstate[p].gathered -= member_bytes[i]
    for j in range(operand_reads.shape[0]):
        read = operand_reads[j]
        b = member_bytes[read.member]
        if b > 0.0:
            gdelta[read.ready] += b
            gdelta[read.position + 1] -= b


@jit
def early_slices(mesh, memory, ws):
    """A temporary that a dot (or another op XLA:CPU fuses nothing into) reads as a local
    slice is sliced by a dynamic-slice fusion of its own, which a breadth-first schedule runs
    as soon as the temporary is made: the slice's buffer lives from there to the reader, and
    the whole temporary only until its last reader that reads it whole. ZeRO-1's weight
    gradients, sharded like the optimizer state, slice the forward activations they read
    (relu(x)[:, shard] for w_out's gradient, h[senders][:, shard] for w_send's): XLA keeps
    those f32[256, 8] and f32[256, 4] slices from the forward pass to the backward, and frees
    the f32[256, 64] and f32[256, 32] activations after the forward matmuls (the zoo GNN,
    jax 0.10.2; tests/test_cost.py). Elsewhere (a slice an elementwise reader fuses in) the
    temporary is read whole by its reader."""
    gdelta, ostate, vmask = ws.gdelta, ws.operand_state, ws.vmask
    reads, temp_slices, temps = memory.slice_reads, memory.temp_slices, memory.temps
    for i in range(temp_slices.shape[0]):
        span = temp_slices[i]
        if span.end == span.start:
            continue
        temp = temps[i]
        ways = mesh[vmask[temp.value_type]].ways
        s = _written(temp, ways)
        if s == 0.0:
            continue
        whole = temp.nbytes / ways
        last = span.whole_end
        sliced = False
        for j in range(span.start, span.end):
            if ostate[reads[j].operand_type].only_sliced == 0:
                last = max(last, reads[j].position + 1)
            else:
                sliced = True
        if not sliced:
            continue
        for j in range(span.start, span.end):
            m = ostate[reads[j].operand_type].only_sliced
            if m == 0:
                continue
            first = True  # one slice per sharding, read by all that want it (CSE)
            end = reads[j].position + 1
            for k in range(span.start, span.end):
                if ostate[reads[k].operand_type].only_sliced == m:
                    if k < j:
                        first = False
                    end = max(end, reads[k].position + 1)
            if first:
                b = whole / mesh[m].ways
                gdelta[temp.start] += b
                gdelta[end] -= b
        if last < temp.end:
            gdelta[last] -= s
            gdelta[temp.end] += s


@jit
def reduced_buffers(ops, mesh, memory, ws):
    """An all-reduce writes its result to a new buffer, its input (the partial sums) still
    live. XLA:CPU combines the all-reduces of each computation (the step's, a loop body's)
    into one after the last of them (AllReduceCombiner), but it can only combine all-reduces
    that do not depend on each other: one whose result another reducing op reads, directly
    or through other ops (an activation gradient: a message-passing scatter's sum, Megatron's
    input gradient; a gradient whose global norm is reduced after it) runs at its op. Those
    combined keep their partial sums live until the combined one, which writes all their
    results at once (whatever reads them waits for it; a result sharded where the partial
    sums are not is sliced from it there); the others, and all of them elsewhere (GPU, TPU),
    hold both buffers at the op. The buffers live in the order the compiler runs the ops
    (memory.position). An unrolled loop body holds the partial sums of each of its copies
    (memory.iteration_copies), all of them until its combined all-reduce."""
    gdelta, pstate, vmask = ws.gdelta, ws.op_state, ws.vmask
    if not memory.combine_all_reduces:
        for p in range(pstate.shape[0]):
            pstate[p].gathered += pstate[p].reduced
        return
    comp, position, instances, by_type = (memory.computation, memory.position,
                                          memory.instances, memory.instances_by_type)
    result_end, copies, sliced_read = (memory.result_end, memory.iteration_copies,
                                       memory.sliced_read)
    C = memory.num_computations
    _feeds_a_reduction(memory, ws)
    feeds = ws.feeds
    combined = ws.combined[:C]  # where the combined all-reduce runs: after the last
    combined[:] = -1
    for p in range(pstate.shape[0]):
        if pstate[p].reduced > 0.0:
            span = by_type[p]
            for i in range(span.start, span.end):
                n = instances[i]
                if not feeds[n]:
                    combined[comp[n]] = max(combined[comp[n]], position[n])
    for p in range(pstate.shape[0]):
        if pstate[p].reduced > 0.0:
            span = by_type[p]
            for i in range(span.start, span.end):
                n = instances[i]
                c = comp[n]
                at = position[n]
                size = pstate[p].reduced
                if not feeds[n]:
                    # the partial sums, whole, until the combined all-reduce (the op's
                    # result, a temporary, is only their shard where it is sharded: an FSDP
                    # step accumulating gradients combines 34 whole gradients per
                    # micro-batch, jax 0.10.2), its new buffer there
                    end = result_end[n]
                    stop = combined[c] + 1
                    if end > at + 1 and ops[p].result_type >= 0:
                        rest = size - ops[p].result_nbytes / mesh[
                            vmask[ops[p].result_type]].ways
                        if rest > 0.0:
                            gdelta[at + 1] += rest
                            gdelta[max(at + 1, min(end, stop))] -= rest
                    if end < stop:
                        gdelta[end] += size
                        gdelta[stop] -= size
                    # an unrolled body's earlier copies of the op: their partial sums wait
                    # too, and the combined all-reduce writes every copy's result
                    earlier = size * (copies[n] - 1.0)
                    gdelta[at] += earlier
                    gdelta[stop] -= earlier
                    gdelta[combined[c]] += size + earlier
                    gdelta[combined[c] + 1] -= size + earlier
                else:
                    gdelta[at] += size
                    gdelta[at + 1] -= size
                    # XLA:CPU's reduce-scatter: the all-reduced whole stays live until the
                    # last fusion that slices its shard from it (memory.sliced_read; -1 where
                    # a reader cannot, and the shard is sliced at once)
                    end = min(result_end[n], sliced_read[n] + 1)
                    if end > at + 1 and ops[p].result_type >= 0:
                        rest = size - ops[p].result_nbytes / mesh[
                            vmask[ops[p].result_type]].ways
                        if rest > 0.0:
                            gdelta[at + 1] += rest
                            gdelta[end] -= rest


@jit
def _feeds_a_reduction(memory, ws):
    """Fills ws.feeds: [N] (program order) whether an op's result reaches an op that reduces
    partial sums (a scalar's too), directly or through other ops: an all-reduce that does cannot be
    combined with that one. A metric reduced after the update (an accuracy) reads no
    gradient, and leaves the gradients' all-reduces combined."""
    N = memory.computation.shape[0]
    by_type, instances = memory.instances_by_type, memory.instances
    reader_start, readers = memory.reader_start, memory.readers
    reducing = ws.reducing
    reducing[:] = False
    pstate = ws.op_state
    for p in range(pstate.shape[0]):
        if pstate[p].reduces:
            span = by_type[p]
            for i in range(span.start, span.end):
                reducing[instances[i]] = True
    feeds = ws.feeds
    feeds[:] = False
    for n in range(N - 1, -1, -1):  # readers come later in program order
        for j in range(reader_start[n], reader_start[n + 1]):
            r = readers[j]
            if reducing[r] or feeds[r]:
                feeds[n] = True
                break


@jit
def peak_live(delta, gdelta, pstate, op_type, runs):
    """The largest live temporary bytes at any op, gathered buffers included (gdelta also
    takes away the output buffers not yet written: see arguments_and_outputs). A run of
    repeated blocks (RUN records, _repeats.py) is swept once: each copy adds the same bytes
    where the first does, so the live bytes at an op of copy i are those at the first copy's
    plus i times one copy's net change, largest in the first copy or the last."""
    live = 0.0
    peak = 0.0
    n = 0
    r = 0
    N = op_type.shape[0]
    while n < N:
        if r < runs.shape[0] and n == runs[r].start:
            base = live
            best = -np.inf
            for m in range(n, n + runs[r].length):
                live += delta[m] + gdelta[m]
                best = max(best, live + pstate[op_type[m]].gathered)
            net = live - base
            peak = max(peak, best + max(0.0, net * (runs[r].copies - 1)))
            live = base + net * runs[r].copies
            n += runs[r].length
            r += 1
            continue
        live += delta[n] + gdelta[n]
        here = live + pstate[op_type[n]].gathered
        if here > peak:
            peak = here
        n += 1
    return peak


@jit
def arguments_and_outputs(mesh, memory, ws, totals):
    """Argument, output, state and aliased bytes into totals. An output's buffer, unless a
    donated argument holds it (its alias, where both are sharded alike, dim for dim), is free
    from the start until the op that writes it: XLA's buffer assignment places temporaries
    there, so gdelta takes it off the live bytes."""
    eff, vmask, gdelta = ws.eff, ws.vmask, ws.gdelta
    inputs, outputs = memory.inputs, memory.outputs
    arg = 0.0
    state = 0.0
    for i in range(inputs.shape[0]):
        b = inputs[i].nbytes / mesh[vmask[inputs[i].value_type]].ways * inputs[i].count
        arg += b
        if inputs[i].is_state:
            state += b
    out = 0.0
    alias = 0.0
    for i in range(outputs.shape[0]):
        o = outputs[i]
        b = o.nbytes / mesh[vmask[o.value_type]].ways
        out += b * o.count
        aliased = o.alias_type >= 0
        if aliased:
            for d in range(eff.shape[1]):
                if eff[o.alias_type, d] != eff[o.value_type, d]:
                    aliased = False
        if aliased:
            alias += o.nbytes / mesh[vmask[o.alias_type]].ways * o.count
        elif o.position > 0:
            gdelta[0] -= b * o.zero_weight
            gdelta[o.position] += b * o.position_weight
    totals[T_ARG] = arg
    # XLA returns several outputs as a tuple: a table of 8-byte buffer pointers
    n = memory.num_outputs
    totals[T_OUT] = out + (8.0 * n if n > 1 else 0.0)
    totals[T_STATE] = state
    totals[T_ALIAS] = alias
