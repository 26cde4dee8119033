"""Expert strategies: picked by class roles, valid on the mesh, and verified against XLA."""

import functools

import jax
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.strategies import find_roles
from toast_lab.verification import verify

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")


@functools.cache
def analysed(name, **config):
    fn, args = tl.zoo.get(name, **config)
    return fn, args, tl.analyze(tl.trace(fn, *args))


def test_roles_of_gpt_come_from_structure_not_names():
    _, _, an = analysed("gpt")
    roles = find_roles(an).describe(an)
    assert roles["batch"] == "batch" and roles["sequence"] == "seq"
    assert roles["width"] == "embed"
    assert set(roles["tensor_parallel"]) == {"mlp", "heads", "vocab"}
    assert roles["fsdp"][0] == "embed"
    # The same roles with the names hidden: trace without the zoo's dim names.
    fn, args = tl.zoo.get("gpt")
    anon = tl.analyze(tl.trace(fn, *args, dim_names=(None, None, None)))
    r = find_roles(anon)
    prog = anon.program
    tokens = prog.inputs[prog.input_names.index("batch/tokens")]
    assert anon.value_classes[tokens] == (r.batch, r.sequence)


def test_megatron_splits_an_mlps_hidden_dim():
    # The README's two-layer MLP: its hidden dim is on two weights (out of w1, into w2), the
    # pair Megatron splits (w1 by columns, w2 by rows), not a residual stream to leave alone.
    import jax.numpy as jnp
    import optax

    opt = optax.adamw(1e-3)

    def step(params, opt_state, x, y):
        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"])
            return optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"], y).mean()
        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    params = {"w1": jnp.zeros((64, 256)), "w2": jnp.zeros((256, 10))}
    an = tl.analyze(tl.trace(step, params, opt.init(params), jnp.ones((32, 64)),
                             jnp.zeros((32,), jnp.int32)))
    roles = find_roles(an).describe(an)
    assert roles["width"] is None and roles["tensor_parallel"][0] == "mlp"
    plan = tl.strategies.expert(an, MESH)["dp+tp"]
    assert plan.axes_of("batch") == ("data",) and plan.axes_of("mlp") == ("model",)
    assert an.class_named("x[0]").name == "batch" and an.class_named("w1[1]").name == "mlp"
    prog = an.program
    w1, w2 = (prog.inputs[prog.input_names.index(n)] for n in ("params/w1", "params/w2"))
    assert plan.value_axes(w1) == ((), ("model",)) and plan.value_axes(w2) == (("model",), ())


def test_fsdp_with_tensor_parallelism_keeps_the_tensor_parallel_classes_on_the_model_axis():
    # FSDP lists a class that is the only one of some parameter (a bias's hidden dim) even
    # where tensor parallelism took it; it shards only the classes left
    _, _, an = analysed("gpt")
    roles = find_roles(an)
    plan = tl.strategies.expert(an, MESH)["fsdp+tp"]
    for c in roles.tensor_parallel:
        assert plan.axes_of(an.classes[c].name) == ("model",)
    assert plan.axes_of("embed") == ("data",)


def _accumulating_step(micro: int = 4):
    """An MLP step that splits its batch into micro-batches and sums their gradients with a
    scan (gradient accumulation), then takes an SGD step."""
    import jax.numpy as jnp

    def loss(w, x, y):
        h = jnp.tanh(x @ w["w1"])
        return jnp.mean((h @ w["w2"] - y) ** 2)

    def step(w, x, y):
        xs = x.reshape(micro, -1, x.shape[1])
        ys = y.reshape(micro, -1, y.shape[1])

        def body(acc, batch):
            g = jax.grad(loss)(w, *batch)
            return jax.tree.map(jnp.add, acc, g), None

        g, _ = jax.lax.scan(body, jax.tree.map(jnp.zeros_like, w), (xs, ys))
        return jax.tree.map(lambda p, d: p - 0.1 * d / micro, w, g)

    w = {"w1": jax.ShapeDtypeStruct((16, 64), jnp.float32),
         "w2": jax.ShapeDtypeStruct((64, 8), jnp.float32)}
    return step, (w, jax.ShapeDtypeStruct((128, 16), jnp.float32),
                  jax.ShapeDtypeStruct((128, 8), jnp.float32))


def test_a_batch_split_into_micro_batches_is_split_within_each_micro_batch():
    """Gradient accumulation: data parallelism splits the examples of each micro-batch (the
    dim after the scanned one), and the inputs' batch dim goes over the same devices."""
    step, args = _accumulating_step()
    an = tl.analyze(tl.trace(step, *args))
    prog = an.program
    roles = find_roles(an)
    x, y = prog.inputs[-2:]
    split = next(o for o in prog.ops if o.primitive == "reshape" and o.operands[0] == x)
    micro, examples = an.value_classes[split.results[0]][:2]
    assert roles.batch == examples
    assert set(roles.micro_batched) == {an.value_classes[x][0], an.value_classes[y][0]}
    plan = tl.strategies.expert(an, MESH)["dp"]
    assert plan.value_axes(split.results[0])[:2] == ((), ("data", "model"))
    assert plan.value_axes(x)[0] == plan.value_axes(y)[0] == ("data", "model")
    # the weight gradients are summed over the devices: data parallelism is happening
    est = tl.estimate(an, plan, MESH)
    assert est.collectives[("all-reduce", ("data", "model"))].bytes > 0
    rng = np.random.default_rng(0)
    sample = jax.tree.map(lambda a: rng.normal(size=a.shape).astype(a.dtype), args)
    assert verify(step, sample, plan, MESH).ok


def test_strategies_that_do_not_apply_are_skipped_with_a_reason():
    _, _, an = analysed("mlp")
    one_d = tl.strategies.expert(an, tl.Mesh({"data": 8}))
    assert "sp" in one_d.skipped and "sequence" in one_d.skipped["sp"]
    assert "dp+tp" in one_d.skipped and "two or more axes" in one_d.skipped["dp+tp"]
    assert {"dp", "fsdp", "megatron"} <= set(one_d)
    three_d = tl.strategies.expert(analysed("gpt")[2], tl.Mesh({"data": 2, "fsdp": 2, "model": 2}))
    assert "dp+fsdp+tp" in three_d


def test_every_strategy_is_a_valid_plan_on_every_zoo_model():
    for name in tl.zoo.names():
        _, _, an = analysed(name)
        for shape in ({"data": 8}, {"data": 4, "model": 2}, {"data": 2, "fsdp": 2, "model": 2}):
            mesh = tl.Mesh(shape)
            for plan in tl.strategies.expert(an, mesh).values():
                plan.validate(mesh)
                assert plan.class_axes


def test_megatron_shards_one_dim_of_each_weight():
    _, _, an = analysed("gpt")
    plan = tl.strategies.expert(an, MESH)["dp+tp"]
    prog = an.program
    for v, path in zip(prog.inputs, prog.input_names):
        if path.startswith("params/") and prog.values[v].ndim == 2:
            sharded = [a for a in plan.value_axes(v) if a]
            assert len(sharded) <= 1, path


@functools.cache
def report(strategy):
    fn, _, an = analysed("gpt")
    plan = tl.strategies.expert(an, MESH)[strategy]
    return verify(fn, tl.zoo.sample("gpt"), plan, MESH, estimate=tl.estimate(an, plan, MESH))


def _axes_of(rep, kind):
    return {axes for (k, axes), t in rep.stats.collective_summary().items() if k == kind}


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["dp", "fsdp", "megatron", "sp", "dp+tp", "fsdp+tp",
                                      "dp+sp"])
def test_each_expert_strategy_on_gpt_verifies(strategy):
    rep = report(strategy)
    assert rep.ok, rep
    kinds = {k for k, _ in rep.stats.collective_summary()}
    if strategy == "dp":  # the gradient all-reduce over every data axis, nothing else
        assert kinds == {"all-reduce"}
        assert ("data", "model") in _axes_of(rep, "all-reduce")
    if strategy == "dp+tp":  # Megatron's activation all-reduces over the model axis
        assert ("model",) in _axes_of(rep, "all-reduce")
        assert ("data",) in _axes_of(rep, "all-reduce")  # and data-parallel gradients
    if strategy in ("fsdp", "fsdp+tp"):  # parameters all-gathered where they are used
        assert any("data" in axes for axes in _axes_of(rep, "all-gather"))
