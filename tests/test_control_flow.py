"""Steps that branch or loop on a condition: optax.MultiSteps and apply_if_finite update the
state inside a `cond`, an inner optimisation loop is a `while`. XLA colocates a conditional's
result with each branch's root (a branch's parameters are its operands) and a while's state
with its body's parameters and root: the estimate holds one copy of the state there, not one
per branch or body value."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
import pytest

import toast_lab as tl
from toast_lab.verification import summarize_collectives

MESH = tl.Mesh({"data": 8}, device="cpu")
D, H, O, B = 128, 256, 64, 32


def _params():
    k1, k2 = jax.random.split(jax.random.key(0))
    return {"w1": jax.random.normal(k1, (D, H)) * 0.1, "w2": jax.random.normal(k2, (H, O)) * 0.1}


def _batch():
    kx, ky = jax.random.split(jax.random.key(1))
    return jax.random.normal(kx, (B, D)), jax.random.normal(ky, (B, O))


def _loss(p, x, y):
    return jnp.mean((jnp.tanh(x @ p["w1"]) @ p["w2"] - y) ** 2)


def _optax_step(tx):
    def step(p, s, x, y):
        g = jax.grad(_loss)(p, x, y)
        u, s = tx.update(g, s, p)
        return optax.apply_updates(p, u), s

    p = _params()
    return step, (p, tx.init(p), *_batch())


def multi_steps():
    return _optax_step(optax.MultiSteps(optax.adam(1e-3), every_k_schedule=2))


def if_finite():
    return _optax_step(optax.apply_if_finite(optax.adam(1e-3), 3))


def inner_while():
    def step(p, x, y):
        def cond(c):
            return (c[0] < 3) & (_loss(c[1], x, y) > 1e-3)

        def body(c):
            i, q = c
            g = jax.grad(_loss)(q, x, y)
            return i + 1, jax.tree.map(lambda a, b: a - 0.1 * b, q, g)

        return jax.lax.while_loop(cond, body, (0, p))[1]

    return step, (_params(), *_batch())


def fori_accumulate():
    """Gradients accumulated over 4 micro-batches in a fori_loop (a scan without xs) that
    indexes the batch itself."""
    def step(p, x, y):
        xs, ys = x.reshape(4, B // 4, D), y.reshape(4, B // 4, O)

        def body(i, acc):
            return jax.tree.map(jnp.add, acc, jax.grad(_loss)(p, xs[i], ys[i]))

        g = jax.lax.fori_loop(0, 4, body, jax.tree.map(jnp.zeros_like, p))
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    return step, (_params(), *_batch())


def test_more_branches_need_no_more_memory():
    """Each branch writes the cond's results in place: a switch of four branches, each
    returning a new copy of the state, needs what one of two does."""

    def step(n):
        def f(i, s):
            branches = [lambda s, k=k: jax.tree.map(lambda a: jnp.tanh(a * (k + 1.0)), s)
                        for k in range(n)]
            return jax.tree.map(jnp.sum, jax.lax.switch(i, branches, s))
        return f

    state = {"a": jax.ShapeDtypeStruct((256, 256), "float32"),
             "b": jax.ShapeDtypeStruct((256, 128), "float32")}
    args = (jax.ShapeDtypeStruct((), "int32"), state)
    nbytes = 4 * (256 * 256 + 256 * 128)
    temps = []
    for n in (2, 4):
        an = tl.analyze(tl.trace(step(n), *args))
        temps.append(tl.estimate(an, tl.Plan.replicated(an), tl.Mesh({"data": 1})).temp_bytes)
    assert temps[1] == pytest.approx(temps[0], abs=64)  # a branch's scalar constants
    assert temps[0] < 1.1 * nbytes  # the switch's results, once


def test_a_while_loop_keeps_one_copy_of_its_state():
    """The loop's parameters are its state, updated in place: under data parallelism its
    temporaries are the state, one gradient and the activations, not a copy per body value."""
    fn, args = inner_while()
    an = tl.analyze(tl.trace(fn, *args))
    state = sum(a.nbytes for a in jax.tree.leaves(args[0]))
    est = tl.estimate(an, tl.Plan.replicated(an).with_axes("x[0]", "data"), MESH)
    assert est.temp_bytes < 2.5 * state


def test_a_loop_accumulates_in_place():
    """The accumulator a loop carries is its state: each iteration's sum is written there, and
    the zeros it starts from are that buffer too (the loop takes over the buffer of a carry
    made for it alone), so the temporaries hold it once, with one micro-batch's gradients,
    not a second copy: XLA:CPU's temporaries are 1.81x the weights here."""
    fn, args = fori_accumulate()
    an = tl.analyze(tl.trace(fn, *args))
    weights = sum(a.nbytes for a in jax.tree.leaves(args[0]))
    est = tl.estimate(an, tl.Plan.replicated(an).with_axes("x[0]", "data"), MESH)
    assert 1.6 * weights < est.temp_bytes < 2.0 * weights


@pytest.mark.slow
@pytest.mark.parametrize("build, rel", [
    (multi_steps, 0.1), (if_finite, 0.1), (inner_while, 0.1),
    # XLA adds each micro-batch's gradient to the accumulator as soon as it is made; the
    # model, in program order, after the last (1.13x XLA's peak)
    (fori_accumulate, 0.2),
])
def test_conditional_steps_peak_as_xla_compiles_them(build, rel):
    fn, args = build()
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.strategies.expert(an, MESH)["dp"]
    rep = tl.verify(fn, args, plan, MESH)
    assert rep.ok, str(rep)
    est = tl.estimate(an, plan, MESH)
    assert est.peak_memory_bytes == pytest.approx(rep.stats.peak_bytes, rel=rel)


def rnn_step(layers: int = 1, unroll: int = 1):
    """An RNN's training step: `layers` scans over the time axis (`unroll` iterations per
    trip), the first of x @ w, each next of the hidden states before it, and its gradient."""
    B, T, C, H = 8, 8, 8, 16
    keys = jax.random.split(jax.random.key(0), 3 + layers)
    w = 0.3 * jax.random.normal(keys[0], (C, H))
    whs = tuple(0.3 * jax.random.normal(k, (H, H)) for k in keys[3:])
    x = jax.random.normal(keys[1], (B, T, C))
    y = jax.random.normal(keys[2], (B, T, H))

    def step(w, whs, x, y):
        def loss(w, whs):
            hs = (x @ w).transpose(1, 0, 2)  # [T, B, H]
            for wh in whs:
                cell = lambda h, ut, wh=wh: (jnp.tanh(ut + h @ wh),) * 2  # noqa: E731
                hs = jax.lax.scan(cell, jnp.zeros((B, H)), hs, unroll=unroll)[1]
            return jnp.mean((hs.transpose(1, 0, 2) - y) ** 2)
        l, (g, gh) = jax.value_and_grad(loss, argnums=(0, 1))(w, whs)
        return w - 0.1 * g, tuple(a - 0.1 * b for a, b in zip(whs, gh)), l
    return step, (w, whs, x, y)


@pytest.mark.slow
@pytest.mark.parametrize("layers", [1, 2])
def test_a_scan_over_a_sharded_sequence_gathers_its_stacks_as_xla_does(layers):
    """A loop cannot run over a sharded axis: XLA all-gathers each computed stack (x @ w
    forward, the cotangent of hs backward) whole before its loop; the stack handed on (hs) is
    written slice by slice into its own shard, and the stacks the forward loop keeps for the
    backward one are whole in both loops (counted sharded, the estimate's peak was 0.6 of
    XLA's). So are those one loop hands to others alone (two layers: the first's hs, read by
    the second forward and the first backward; the second's input cotangent)."""
    fn, args = rnn_step(layers)
    an = tl.analyze(tl.trace(fn, *args))
    seq = an.value_classes[an.program.inputs[-2]][1]
    plan = tl.Plan.replicated(an).with_axes(an.classes[seq].name, ("data",))
    rep = tl.verify(fn, args, plan, MESH)
    assert rep.ok, str(rep)
    est = tl.estimate(an, plan, MESH)
    measured = {k: v.bytes for k, v in summarize_collectives(rep.stats.collectives).items()}
    assert measured[("all-gather", ("data",))] > 0
    assert {k: c.bytes for k, c in est.collectives.items()} == pytest.approx(measured)
    assert est.peak_memory_bytes == pytest.approx(rep.stats.peak_bytes, rel=0.2)


def fori_rnn_step(unroll=1):
    """The RNN's last state by a fori_loop that indexes x @ w itself (a scan without xs)."""
    fn, (w, (wh,), x, y) = rnn_step()
    T = x.shape[1]

    def step(w, wh, x, y):
        def loss(w, wh):
            u = x @ w
            h = jax.lax.fori_loop(0, T, lambda t, h: jnp.tanh(u[:, t] + h @ wh),
                                  jnp.zeros((x.shape[0], wh.shape[0])), unroll=unroll)
            return jnp.mean((h - y[:, -1]) ** 2)
        l, (g, gh) = jax.value_and_grad(loss, argnums=(0, 1))(w, wh)
        return w - 0.1 * g, wh - 0.1 * gh, l
    return step, (w, wh, x, y)


@pytest.mark.parametrize("length, unroll, copies", [
    (8, 1, (1, 0)), (8, 2, (2, 0)), (8, 3, (3, 2)), (8, 8, (0, 8)), (8, 9, (0, 8)),
    (8, 0, (0, 8))])
def test_scan_copies_follow_jaxs_lowering(length, unroll, copies):
    """jax lowers scan(unroll=k) to a while of length // k trips, each k copies of the body,
    and length % k copies after it; one trip's worth is no loop at all."""
    from toast_lab.cost._unroll import scan_copies

    class Scan:
        primitive, params = "scan", {"length": length, "unroll": unroll}
    assert scan_copies(Scan()) == copies


def test_unrolled_bodies_count_each_copy_once():
    """cost_analysis() counts a while body once: an unrolled body's ops once per copy, the
    remainder's copies after the loop too; the work done (flops) does not change."""
    ests = {}
    for unroll in (1, 2, 3, 8):  # 8: the length, as jax stores unroll=True
        fn, args = rnn_step(unroll=unroll)
        an = tl.analyze(tl.trace(fn, *args))
        ests[unroll] = tl.estimate(an, tl.Plan.replicated(an), MESH)
    once = {k: e.flops_loop_bodies_once for k, e in ests.items()}
    body = once[2] - once[1]  # one more copy of the forward and backward bodies
    assert body > 0
    assert once[3] == pytest.approx(once[1] + 4 * body)  # 8 = 2 x 3 + 2: five copies
    assert once[8] == pytest.approx(once[1] + 7 * body)  # eight copies, no loop
    assert len({e.flops for e in ests.values()}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("build, unroll, flops_rel", [
    (rnn_step, 1, 0.05), (rnn_step, 2, 0.05), (rnn_step, 4, 0.05), (fori_rnn_step, 2, 0.05),
    # the remainder's two copies run after the loop, in straight-line code that XLA:CPU's
    # fusion clones more into (0.93 of XLA's flops)
    (rnn_step, 3, 0.1),
])
def test_unrolled_scans_as_xla_compiles_them(build, unroll, flops_rel):
    """XLA's while body holds `unroll` copies of the scan body: cost_analysis() counts each,
    and each copy's weight-gradient partial sums wait for the body's combined all-reduce
    (four [H, H] buffers with unroll=2, not two). The peak is looser: the sweep frees the
    stacks a loop slices at the scan op, where XLA keeps them in the while's state through
    the loop (0.80 to 0.88 of XLA's peak here, unrolled or not)."""
    fn, args = build(unroll=unroll)
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.strategies.expert(an, MESH)["dp"]
    rep = tl.verify(fn, args, plan, MESH)
    assert rep.ok, str(rep)
    est = tl.estimate(an, plan, MESH)
    assert est.flops_loop_bodies_once == pytest.approx(rep.stats.flops, rel=flops_rel)
    assert est.peak_memory_bytes == pytest.approx(rep.stats.peak_bytes, rel=0.25)


def test_the_stacks_a_forward_scan_keeps_are_held_like_their_slices_in_bytes_only():
    """The RNN's residuals (written by the forward scan, read as stacks by the backward one
    alone) take the sharding of the slice their loop writes in XLA, the sequence whole,
    whatever the plan says: the estimate sizes their buffers so, while the layout it costs
    them in stays the plan's (what plan.jit exports), and editing the plan a decision at a
    time gives what costing it whole does."""
    fn, args = rnn_step()
    an = tl.analyze(tl.trace(fn, *args))
    prog = an.program
    fwd, bwd = (op for op in prog.ops if op.primitive == "scan")
    ys = fwd.results[fwd.params["num_carry"]:]
    kept = prog.loop_only_stacks()
    assert set(kept) == set(ys) & set(bwd.operands) and len(kept) == len(ys) - 1
    seq = an.value_classes[prog.inputs[-2]][1]
    plan = tl.Plan.replicated(an).with_axes(an.classes[seq].name, ("data",))
    model = tl.cost_model(an, MESH)
    eff, vmask = model.value_type_masks(*model.plan_arrays(plan))
    held = vmask[model.ty.tables.held_type]
    for v in kept:
        t = model.ty.value_type[v]
        assert plan.value_axes(v)[0] == ("data",) and eff[t][0] == vmask[t] == 1
        assert held[t] == 0
    inc = model.incremental()
    for axes in [("data",), (), ("data",)]:
        got = inc.set_axes(seq, axes)
        assert got == pytest.approx(model.step_and_peak(inc.mask, inc.rank, inc.res), rel=1e-12)


@pytest.mark.slow
def test_a_scanned_gpts_residuals_take_their_slices_sharding():
    """gpt_scan with `layers` on model, decided before the batch on (model, data): the plan
    shards the residual stacks on `layers` alone (their batch cannot take model again), XLA
    holds them [L, B/8, ...], as the forward loop writes its slices (the estimate's peak was
    1.6 of XLA's)."""
    fn, args = tl.zoo.get("gpt_scan")
    sample = tl.zoo.sample("gpt_scan")
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="cpu")
    plan = (tl.Plan.replicated(an).with_axes("layers", ("model",))
            .with_axes("batch", ("model", "data")))
    residual = an.program.loop_only_stacks()[0]
    assert plan.value_axes(residual)[:2] == (("model",), ())
    rep = tl.verify(fn, sample, plan, mesh)
    assert rep.ok, str(rep)
    est = tl.estimate(an, plan, mesh)
    assert est.peak_memory_bytes == pytest.approx(rep.stats.peak_bytes, rel=0.2)
