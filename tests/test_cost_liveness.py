"""The memory sweep's liveness against what XLA's pipeline makes of the program: optimization
barriers, removed before XLA:CPU schedules; loop bodies, scheduled breadth first like the step;
exps written by a fusion of their own; splat constants a loop reads; the stacks a scan slices
(cost/_order.py, _value_facts.py, _xla_passes.py, _memory_tables.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

import toast_lab as tl

f32 = "float32"
S = jax.ShapeDtypeStruct
KIB = 1024


def _temps(fn, args, device: str = "cpu") -> float:
    an = tl.analyze(tl.trace(fn, *args))
    return tl.estimate(an, tl.Plan.replicated(an), tl.Mesh({"data": 1}, device=device)).temp_bytes


def test_an_optimization_barrier_holds_no_buffer_of_its_own():
    """XLA removes a barrier before it assigns buffers: its results are its operands, so a
    barrier around two live activations adds nothing to the temporaries."""

    def step(barrier: bool):
        def f(x, w):
            h = jnp.tanh(x @ w)
            a = jnp.tanh(h @ w)
            if barrier:
                a, h = jax.lax.optimization_barrier((a, h))
            return jnp.sum(a @ w + h)
        return f

    args = (S((256, 64), f32), S((64, 64), f32))
    for device in ("cpu", "h100"):
        assert _temps(step(True), args, device) == pytest.approx(_temps(step(False), args, device),
                                                                  abs=64)


@pytest.mark.parametrize("barrier", [True, False])
def test_xla_cpu_runs_what_a_barrier_keeps_apart_as_soon_as_its_operands_are_ready(barrier):
    """A recomputation read through a barrier with a value made late (plan.jit's remat, with
    the cotangents that reach the group's backward pass): XLA:CPU removes the barrier before
    its breadth-first schedule, so the recomputed [256, 256] runs at the start and lives
    across the chain, as without the barrier; in program order (the other devices' sweep) it
    is made at the end."""

    def f(x, w1, w2):
        h = jnp.tanh(x @ w1)
        for _ in range(3):
            h = jnp.tanh(h @ w2)
        x2 = x
        if barrier:
            x2, h = jax.lax.optimization_barrier((x, h))
        return jnp.sum(jnp.tanh(x2 @ w1) * h.sum())

    args = (S((256, 64), f32), S((64, 256), f32), S((256, 256), f32))
    # give or take a scalar
    assert _temps(f, args, "cpu") - _temps(f, args, "h100") == pytest.approx(256 * 256 * 4,
                                                                            abs=64)


def test_xla_cpu_schedules_a_loop_body_breadth_first_too():
    """The breadth-first scheduler runs on every computation, a loop body's too: the
    transposed weight that only an iteration's last, small matmul reads is made at the start
    of the iteration and lives across the big matmuls before it (as at the top level:
    test_cost.test_xla_cpu_runs_each_op_as_soon_as_its_operands_are_ready)."""

    def f(x, ws):
        def body(h, w):
            for _ in range(3):
                h = jnp.tanh(h @ w)
            return h, jnp.sum(h, axis=0) @ w.T
        h, ys = jax.lax.scan(body, x, ws)
        return jnp.sum(h) + jnp.sum(ys)

    args = (S((256, 64), f32), S((4, 64, 64), f32))
    assert _temps(f, args, "cpu") - _temps(f, args, "h100") == pytest.approx(64 * 64 * 4,
                                                                            abs=64)


def test_an_exp_written_by_its_own_fusion_frees_what_it_reads():
    """XLA:CPU writes an exp read by several fusions (a softmax's: its sum, the division, and
    a late reader, as the backward pass reads it) and its readers read it from memory: the
    [256, 256] logits it is made from are dead once it is written, as if they were an
    argument of the step, not kept until its last reader (768 KiB at the peak, not 1 MiB)."""

    def step(logits_made: bool):
        def f(q, k, w):
            d = q @ k.T if logits_made else k
            e = jnp.exp(d - d.max(-1, keepdims=True))
            c = jnp.tanh(jnp.tanh(e / e.sum(-1, keepdims=True) @ w) @ w)
            return jnp.sum(c * e)
        return f

    made = _temps(step(True), (S((256, 64), f32), S((256, 64), f32), S((256, 256), f32)))
    given = _temps(step(False), (S((256, 64), f32), S((256, 256), f32), S((256, 256), f32)))
    # e, and the second matmul's operand and result, give or take a scalar
    assert made == pytest.approx(given, abs=64)
    assert made == pytest.approx(3 * 256 * 256 * 4, abs=64)


def test_a_splat_constant_a_loop_reads_is_no_buffer():
    """A mask's fill (one number broadcast) that a scan reads as a constant is made inside the
    loop body, where the fusions reading it make it: no buffer, whether the body closes over
    it or writes the number itself. XLA:CPU's temporaries are those too (768 KiB)."""

    def step(fill_outside: bool):
        def f(x, ws):
            fill = jnp.full((256, 256), -1e9, f32)

            def body(h, w):
                logits = h @ w
                return jnp.tanh(jnp.where(logits > 0, logits,
                                          fill if fill_outside else -1e9)), None
            return jnp.sum(jax.lax.scan(body, x, ws)[0])
        return f

    args = (S((256, 256), f32), S((4, 256, 256), f32))
    outside = _temps(step(True), args)
    assert outside == pytest.approx(_temps(step(False), args), abs=64)
    assert outside == pytest.approx(768 * KIB, abs=64)


def test_a_scans_stack_lives_until_the_loop_ends_and_each_slice_while_it_is_read():
    """A stack a scan slices (xs) stays in the loop's state until the loop ends (the backward
    scan reads the residual stacks so); each iteration's slice is taken where it is read.
    tanh(ws) [4, 256, 256] (1 MiB), the carry and an iteration's matmul: 1408 KiB, what
    XLA:CPU allocates."""

    def f(x, ws):
        def body(h, w):
            return jnp.tanh(h @ w), None
        return jnp.sum(jax.lax.scan(body, x, jnp.tanh(ws))[0])

    args = (S((64, 256), f32), S((4, 256, 256), f32))
    assert _temps(f, args) == pytest.approx(1408 * KIB, abs=64)


def test_a_loop_takes_over_the_buffer_of_its_state_where_nothing_else_reads_it():
    """XLA's while loop updates its state in place: a carry made for the loop alone (a
    pipeline's residual buffers, zeroed before the loop) is the loop's state buffer, not a
    second buffer beside it. XLA:CPU's temporaries here: 256 KiB, the one [256, 256]."""

    def f(x, s):
        c0 = x * 2.0

        def body(c, si):
            return c * si, None

        c, _ = jax.lax.scan(body, c0, s)
        return jnp.sum(c)

    assert _temps(f, (S((256, 256), f32), S((3,), f32))) == pytest.approx(256 * KIB, abs=KIB)


def test_a_reshaped_stack_a_loop_reads_is_its_operand_in_another_shape():
    """A reshape XLA compiles to a bitcast (a layer stack viewed as [stages, layers per
    stage, ...] for the pipeline's loop) takes no buffer of its own: the temporaries are
    those of the loop over the stack as it is."""

    def step(reshaped: bool):
        def f(x, ws):
            stack = ws.reshape(4, 1, 256, 256) if reshaped else ws

            def body(h, w):
                w = w.reshape(256, 256) if reshaped else w
                return jnp.tanh(h @ w), None

            h, _ = jax.lax.scan(body, x, stack)
            return jnp.sum(h)
        return f

    args = (S((64, 256), f32), S((4, 256, 256), f32))
    assert _temps(step(True), args) == pytest.approx(_temps(step(False), args), abs=4 * KIB)
