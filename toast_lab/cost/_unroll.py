"""How many copies of a scan body XLA compiles: `lax.scan(..., unroll=k)` and
`fori_loop(..., unroll=k)`.

The program keeps a scan as one region whose body is analysed once (DESIGN.md §1), and counts
its ops `length` times for time whatever `unroll` is: the same arithmetic runs. What `unroll`
changes is the code XLA compiles. jax lowers the scan (loops._scan_impl, jax 0.10.2) to a
while loop of `length // k` trips whose body holds k copies of the scan body, followed by
`length % k` copies in straight-line code for the remainder; where one trip would do
(k >= length, `unroll=True`, or `unroll=0`) there is no loop at all, only `length` copies.
So:
- cost_analysis() counts a while body once (Estimate.flops_loop_bodies_once mirrors it): an
  op of an unrolled body counts once per copy, the remainder's copies too (OpFacts.copies);
- one execution of the loop's body holds k iterations' buffers, and a fully unrolled scan's
  copies run in the computation around it (OpFacts.computation, .iteration_copies). Each
  copy's partial sums wait for the all-reduce XLA:CPU combines at the end of that computation
  (a weight gradient's partials of every layer in an unrolled body live together: an RNN's
  backward scan with unroll=2 holds four [C, H] partials of its weight, not two; jax 0.10.2).

Nested scans multiply: a body unrolled twice inside a body unrolled three times is six copies.
"""

from __future__ import annotations

import numpy as np

from ..program import NO_OP


def scan_copies(op) -> tuple[int, int]:
    """(copies in the while body, copies in straight-line code) of a scan op's body, as jax
    lowers `unroll`; (0, length) where it leaves no loop. Other region ops: (1, 0)."""
    if op.primitive != "scan":
        return 1, 0
    length = int(op.params["length"])
    unroll = int(op.params.get("unroll", 1))  # jax stores unroll=True as the length
    if unroll == 0 or unroll >= length:
        return 0, length
    return unroll, length % unroll


def unrolled_copies(prog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N] each, per op (program order): the copies XLA compiles (its flops count that many
    times in cost_analysis()); the copies one execution of the computation it runs in holds;
    the region op whose body that computation is (NO_OP: the step's own), past fully unrolled
    scans."""
    ops = prog.ops
    N = len(ops)
    copies = np.ones(N)
    iteration = np.ones(N)
    computation = np.full(N, NO_OP, np.int64)
    # per region op, what its body ops inherit (regions come before their bodies)
    for op in ops:
        r = op.region
        if r == NO_OP:
            continue
        loop, straight = scan_copies(ops[r])
        copies[op.id] = copies[r] * (loop + straight)
        if loop:  # a computation of its own, the while body: `loop` copies of the body
            iteration[op.id] = loop
            computation[op.id] = r
        else:  # inlined into the region's own computation
            iteration[op.id] = iteration[r] * straight
            computation[op.id] = computation[r]
    return copies, iteration, computation
