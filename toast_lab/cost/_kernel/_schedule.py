"""Phase 6, the overlap schedule: the step's length with collectives overlapping compute.

Reads per op type its compute seconds and the seconds of its reshards and reductions (phase 4)
and of its shared reads (phase 5), and walks the program in order (ScheduleTables).
"""

from __future__ import annotations
from ._jit import jit



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
    - A loop body is walked twice: the first iteration, then one in the steady state (whose
      prefetches overlap the iteration before), which stands for the remaining ones.
    Returns the step's seconds.
    """
    pstate, read_time = ws.op_state, ws.read_time
    for p in range(pstate.shape[0]):
        ps = pstate[p]
        w = ops[p].weight
        ps.run = ps.compute / w if w > 0.0 else 0.0  # seconds of one execution
        ps.busy = ps.pre_early > 0.0 or ps.pre_late > 0.0 or ps.post > 0.0
    order, op_type, event, body_first = (sched.reads_in_order, sched.op_type, sched.event,
                                         sched.body_first)
    ready, deadline, body_last_trip = sched.ready, sched.deadline, sched.body_last_trip
    N = op_type.shape[0]
    finish = ws.finish
    wait = ws.wait
    wait[:] = 0.0
    clock = 0.0     # when the next op may start
    stream = 0.0    # when the communication stream is free
    k = 0           # the next shared read, in program order
    loop_start = 0  # the loop body being walked: its first op and shared read
    loop_k = 0
    second = False  # walking its steady-state iteration
    loop_clock = 0.0
    loop_stream = 0.0
    n = 0
    while n < N:
        p = op_type[n]
        if wait[n] > clock:
            clock = wait[n]
        if not (pstate[p].busy or event[n]):
            clock += pstate[p].run
            finish[n] = clock
            n += 1
            continue
        if body_first[n] and not second:
            loop_start = n
            loop_k = k
        early = pstate[p].pre_early
        late = pstate[p].pre_late
        while k < order.shape[0] and reads[order[k]].position == n:
            if reads[order[k]].early:
                early += read_time[order[k]]
            else:
                late += read_time[order[k]]
            k += 1
        start = clock
        if early > 0.0:
            stream += early
            start = max(start, stream)
        if late > 0.0:
            r = ready[n]
            stream = max(stream, finish[r] if r >= 0 else 0.0) + late
            start = max(start, stream)
        clock = start + pstate[p].run
        finish[n] = clock
        if pstate[p].post > 0.0:
            stream = max(stream, clock) + pstate[p].post
            d = deadline[n]
            if stream > wait[d]:
                wait[d] = stream
        trip = body_last_trip[n]
        if trip > 1.0:
            if not second:  # walk the body again, in the steady state
                second = True
                loop_clock = clock
                loop_stream = stream
                n = loop_start
                k = loop_k
                continue
            second = False
            clock = loop_clock + (clock - loop_clock) * (trip - 1.0)
            stream = max(stream, loop_stream + (stream - loop_stream) * (trip - 1.0))
        n += 1
    return max(clock, wait[N], stream)
