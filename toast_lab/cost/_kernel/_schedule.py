"""Phase 6, the overlap schedule: the step's length with collectives overlapping compute.

Reads per op type its compute seconds and the seconds of its reshards and reductions (phase 4)
and of its shared reads (phase 5), and walks the program in order (ScheduleTables).
"""

from __future__ import annotations

from numba import njit


@njit(cache=True)
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
    pre_early, pre_late, post, read_time = ws.pre_early, ws.pre_late, ws.post, ws.read_time
    run = ws.run  # seconds of one execution
    busy = ws.busy  # the type has collectives of its own
    for p in range(run.shape[0]):
        w = ops[p].weight
        run[p] = ws.op_compute[p] / w if w > 0.0 else 0.0
        busy[p] = pre_early[p] > 0.0 or pre_late[p] > 0.0 or post[p] > 0.0
    order = sched.reads_in_order
    N = sched.op_type.shape[0]
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
        p = sched.op_type[n]
        if wait[n] > clock:
            clock = wait[n]
        if not (busy[p] or sched.event[n]):
            clock += run[p]
            finish[n] = clock
            n += 1
            continue
        if sched.body_first[n] and not second:
            loop_start = n
            loop_k = k
        early = pre_early[p]
        late = pre_late[p]
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
            r = sched.ready[n]
            stream = max(stream, finish[r] if r >= 0 else 0.0) + late
            start = max(start, stream)
        clock = start + run[p]
        finish[n] = clock
        if post[p] > 0.0:
            stream = max(stream, clock) + post[p]
            d = sched.deadline[n]
            if stream > wait[d]:
                wait[d] = stream
        trip = sched.body_last_trip[n]
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
