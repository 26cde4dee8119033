"""Phase 6, the overlap schedule: the step's length with collectives overlapping compute.

Reads per op type its compute seconds and the seconds of its reshards and reductions (phase 4)
and of its shared reads (phase 5), and walks the program in order (ScheduleTables).
"""

from __future__ import annotations

from ._jit import inline, jit



@jit
def schedule(sched, ops, reads, ws):
    """The step's length with collectives overlapping compute the way XLA's latency-hiding
    scheduler runs them: asynchronously, one at a time on a communication stream, each
    started as soon as its data and the stream allow.

    - A reshard of a value known before any compute (a parameter: FSDP's all-gathers) is
      prefetched: it starts as soon as the stream is free (XLA's latency-hiding scheduler
      moves such collectives as early as its memory limit allows; that limit is not modelled).
    - A reshard of a computed value starts once the op making it has finished.
    - An op waits for its operands' reshards; a reduction of partial sums (a gradient's
      reduce-scatter or all-reduce) starts after its op and is waited for only by the first
      op reading the result (the optimizer, for a gradient), so later compute hides it.
    - An op of a loop nested in a loop body runs `nested` times per walk of the body: its
      compute and its collectives count that many times (one after the other).
    - A loop body is walked twice: the first iteration, then one in the steady state (whose
      prefetches overlap the iteration before), which stands for the remaining ones. So is a
      run of repeated blocks (_repeats.py: one block per layer), whose first walk reads what
      came before the run (ready_first) and whose last copy's results the ops after it read.
    Returns the step's seconds.
    """
    _op_runs(sched, ops, ws)
    op_type, event, read_slot, read_at = sched.op_type, sched.event, sched.read_slot, \
        sched.read_at
    body_first, body_last_trip, is_run = sched.body_first, sched.body_last_trip, \
        sched.body_is_run
    pstate, read_time, finish, wait = ws.op_state, ws.read_time, ws.finish, ws.wait
    ready, ready_first, deadline = sched.ready, sched.ready_first, sched.deadline
    N = op_type.shape[0]
    finish[:] = 0.0  # (a run walked as a loop reads its last copy's finish before writing it)
    wait[:] = 0.0
    clock = 0.0     # when the next op may start
    stream = 0.0    # when the communication stream is free
    k = 0           # the next shared read, in program order
    loop_start = 0  # the loop body being walked: its first op and shared read
    loop_k = 0
    walks = 0       # its walks done
    loop_clock = 0.0
    loop_stream = 0.0
    n = 0
    while n < N:
        if wait[n] > clock:
            clock = wait[n]
        p = op_type[n]
        scale = sched.nested[n]
        if not (pstate[p].busy or event[n]):  # nothing to do but run the op
            clock += pstate[p].run * scale
            finish[n] = clock
            n += 1
            continue
        if body_first[n] and walks == 0:
            loop_start = n
            loop_k = k
            loop_clock = clock
            loop_stream = stream
        early = pstate[p].pre_early
        late = pstate[p].pre_late
        while k < read_at.shape[0] and read_at[k] == n:
            if reads[read_slot[k]].early:
                early += read_time[read_slot[k]]
            else:
                late += read_time[read_slot[k]]
            k += 1
        r = ready_first[n] if walks == 0 else ready[n]
        clock, stream = _step(n, pstate[p], scale, clock, stream, early * scale, late * scale,
                              r, deadline[n], finish, wait)
        trip = body_last_trip[n]
        if trip > 1.0:
            walks += 1
            if walks < 2:  # walk the body again, in the steady state
                loop_clock = clock
                loop_stream = stream
                n = loop_start
                k = loop_k
                continue
            last = clock
            clock = loop_clock + (clock - loop_clock) * (trip - 1.0)
            stream = max(stream, loop_stream + (stream - loop_stream) * (trip - 1.0))
            if is_run[n]:  # the ops after the run read its last copy's results
                for m in range(loop_start, n + 1):
                    finish[m] += clock - last
            walks = 0
        n += 1
    return max(clock, wait[N], stream)


@jit
def _op_runs(sched, ops, ws):
    """Per op type its seconds of one execution (with the collectives a shard_map body runs
    inside it) and whether it has collectives of its own to overlap."""
    pstate = ws.op_state
    for p in range(pstate.shape[0]):
        ps = pstate[p]
        w = ops[p].weight
        ps.run = (ps.compute / w if w > 0.0 else 0.0) + ps.inline
        ps.busy = ps.pre_early > 0.0 or ps.pre_late > 0.0 or ps.post > 0.0


@inline
def _step(n, ps, scale, clock, stream, early, late, r, d, finish, wait):
    """One op (its OP_STATE `ps`, run `scale` times) with reshards of its own or of shared reads before it
    (early: prefetchable; late: of values computed, the last made at position r), and the
    reduction of its partial sums after it, first waited for at position d: (clock, stream)
    after it."""
    start = clock
    if early > 0.0:
        stream += early
        start = max(start, stream)
    if late > 0.0:
        stream = max(stream, finish[r] if r >= 0 else 0.0) + late
        start = max(start, stream)
    clock = start + ps.run * scale
    finish[n] = clock
    if ps.post > 0.0:
        stream = max(stream, clock) + ps.post * scale
        if stream > wait[d]:
            wait[d] = stream
    return clock, stream
