"""Ordinary steps a new user brings — forward passes, losses, scalar steps, PRNG keys,
shard_map, optax chains, time-major scans, per-example vmaps, bf16, kwargs and trees with
None — analysed, planned by every expert strategy and the search, exported and verified."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import toast_lab as tl
from toast_lab.strategies import find_roles

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")
_rng = np.random.default_rng(0)
PARAMS = {"w1": jnp.asarray(_rng.normal(size=(32, 64)) * 0.1, jnp.float32),
          "b1": jnp.zeros((64,), jnp.float32),
          "w2": jnp.asarray(_rng.normal(size=(64, 8)) * 0.1, jnp.float32)}
X = jnp.asarray(_rng.normal(size=(16, 32)), jnp.float32)
Y = jnp.asarray(_rng.integers(0, 8, (16,)), jnp.int32)


def forward(p, x):
    return jnp.tanh(x @ p["w1"] + p["b1"][None]) @ p["w2"]


def loss(p, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(forward(p, x), y).mean()


def scalar_step(p, x, y):
    value, _ = jax.value_and_grad(loss)(p, x, y)
    return value


def metrics(p, x, y):
    return {"loss": loss(p, x, y), "accuracy": (forward(p, x).argmax(-1) == y).mean()}


def key_step(p, x, key):
    key, sub = jax.random.split(key)
    keep = jax.random.bernoulli(sub, 0.9, (x.shape[0], 64))
    grads = jax.grad(lambda p: jnp.where(keep, jnp.tanh(x @ p["w1"]), 0.0).var())(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), key


def shard_map_step(p, x):
    double = jax.shard_map(lambda a: a * 2.0, mesh=MESH.jax_mesh(), in_specs=P("data"),
                           out_specs=P("data"))
    return jax.grad(lambda p: loss(p, double(x), Y))(p)


_TX = optax.chain(optax.clip_by_global_norm(1.0),
                  optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100)))


def chain_step(p, opt_state, x, y):
    value, grads = jax.value_and_grad(loss)(p, x, y)
    updates, opt_state = _TX.update(grads, opt_state, p)
    return optax.apply_updates(p, updates), opt_state, value


RNN = {"wx": jnp.asarray(_rng.normal(size=(32, 64)) * 0.1, jnp.float32),
       "wh": jnp.asarray(_rng.normal(size=(64, 64)) * 0.1, jnp.float32)}
XS = jnp.asarray(_rng.normal(size=(10, 16, 32)), jnp.float32)  # time-major [T, B, F]


def rnn_step(p, xs):
    def rnn_loss(p):
        def cell(h, x):
            h = jnp.tanh(x @ p["wx"] + h @ p["wh"])
            return h, h.sum()

        h, ys = jax.lax.scan(cell, jnp.zeros((xs.shape[1], 64)), xs)
        return (h ** 2).mean() + ys.mean()

    grads = jax.grad(rnn_loss)(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)


def per_example_step(p, x, y):
    def example_loss(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(forward(p, x[None])[0], y)

    grads = jax.vmap(jax.grad(example_loss), in_axes=(None, 0, 0))(p, x, y)
    return jax.tree.map(lambda a, g: a - 0.1 * g.mean(0), p, grads)


def bf16_step(p, x, y):
    def mixed(p):
        p16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), p)
        return loss(jax.tree.map(lambda a: a.astype(jnp.float32), p16), x.astype(jnp.bfloat16)
                    .astype(jnp.float32), y)

    value, grads = jax.value_and_grad(mixed)(p)
    return jax.tree.map(lambda a, g: a - 0.1 * g, p, grads), value


def tree_step(params, batch, *, scale):
    w, (b, _) = params["layers"][0], params["layers"][1]

    def tree_loss(w):
        return jnp.mean((batch["x"] @ w + b[None]) ** 2) * scale

    grads = jax.grad(tree_loss)(w)
    return {"layers": [w - 0.1 * grads, (b, None)], "extra": params["extra"]}, tree_loss(w)


CASES = {
    "forward": (forward, (PARAMS, X), {}),
    "loss": (loss, (PARAMS, X, Y), {}),
    "scalar_step": (scalar_step, (PARAMS, X, Y), {}),
    "scalar_outputs": (metrics, (PARAMS, X, Y), {}),
    "prng_keys": (key_step, (PARAMS, X, jax.random.key(0)), {}),
    "abstract_key": (key_step, (PARAMS, X, jax.ShapeDtypeStruct((), jax.random.key(0).dtype)),
                     {}),
    "shard_map": (shard_map_step, (PARAMS, X), {}),
    "optax_chain": (chain_step, (PARAMS, _TX.init(PARAMS), X, Y), {}),
    "time_major_scan": (rnn_step, (RNN, XS), {}),
    "per_example_vmap": (per_example_step, (PARAMS, X, Y), {}),
    "bf16": (bf16_step, (PARAMS, X, Y), {}),
    "int_inputs_trees_kwargs": (tree_step, ({"layers": [PARAMS["w1"], (PARAMS["b1"], None)],
                                             "extra": None}, {"x": X}),
                                {"scale": jnp.float32(2.0)}),
}


def analysed(name):
    fn, args, kwargs = CASES[name]
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)
        return tl.analyze(tl.trace(fn, *args, **kwargs))


@pytest.mark.parametrize("name", list(CASES))
def test_analyse_estimate_experts_search_and_jit(name):
    fn, args, kwargs = CASES[name]
    an = analysed(name)
    experts = tl.strategies.expert(an, MESH)
    assert "dp" in experts and "megatron" in experts, experts.skipped
    for plan in experts.values():
        assert tl.estimate(an, plan, MESH).flops > 0
    res = tl.search(an, MESH, simulations=50, budget_s=None, warm_start=experts)
    assert res.feasible
    # plan.jit donates the training state (as training loops do): give it copies, since the
    # module's arrays are shared by every test.
    fresh = jax.tree.map(lambda x: jnp.array(x, copy=True) if isinstance(x, jax.Array) else x,
                         tl.verification.concrete_args(args))
    out = experts["dp"].jit(fn, MESH.jax_mesh())(*fresh, **kwargs)
    assert jax.tree.structure(out) == an.program.out_tree
    # what it consumed is the training state, and only that
    donated = tl.plan.donated_arguments(an.program)
    for i, arg in enumerate(fresh):
        for leaf in jax.tree.leaves(arg):
            if isinstance(leaf, jax.Array):
                assert leaf.is_deleted() == (i in donated), (name, i, donated)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_every_expert_plan_verifies(name):
    fn, args, kwargs = CASES[name]
    an = analysed(name)
    plans = dict(tl.strategies.expert(an, MESH))
    plans["search"] = tl.search(an, MESH, simulations=50, budget_s=None).plan
    for label, plan in plans.items():
        rep = tl.verify(fn, args, plan, MESH, kwargs=kwargs)
        assert rep.ok, (name, label, str(rep))


def test_one_plan_per_case_verifies_fast():
    for name in ("prng_keys", "abstract_key", "shard_map", "int_inputs_trees_kwargs"):
        fn, args, kwargs = CASES[name]
        an = analysed(name)
        rep = tl.verify(fn, args, tl.strategies.expert(an, MESH)["dp"], MESH, kwargs=kwargs)
        assert rep.ok, (name, str(rep))


def test_functions_that_return_no_parameters_take_the_first_argument_as_parameters():
    an = analysed("loss")
    roles = find_roles(an)
    prog = an.program
    assert roles.state_inputs == frozenset(prog.inputs[:3])  # b1, w1, w2 of PARAMS
    x = prog.inputs[3]
    assert an.value_classes[x][0] == roles.batch


def test_time_major_scan_batches_over_the_examples_not_the_steps():
    an = analysed("time_major_scan")
    xs = an.program.inputs[-1]
    assert an.value_classes[xs][1] == find_roles(an).batch


def test_a_step_of_no_ops_is_estimated_searched_and_drawn():
    # lambda x: x traces to no equations: every table of the cost model and the view is empty
    from toast_lab.lab import Session, ViewBuilder

    an = tl.analyze(tl.trace(lambda x: x, jnp.ones((8, 4))))
    assert not an.program.ops
    est = tl.estimate(an, tl.Plan.replicated(an), MESH)
    assert est.flops == 0 and est.step_time_s == 0
    res = tl.search(an, MESH, simulations=10, budget_s=None)
    assert res.plan is not None and res.estimate.step_time_s == 0
    b = ViewBuilder(an, MESH)
    vm = b.build(Session(an, MESH))
    assert {n.kind for n in vm.graph.nodes} == {"input", "output"}
    assert len(vm.graph.edges) == 1
