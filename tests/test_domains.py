"""Domains of a training step (compute, parameters, optimizer state) and per-domain overrides:
found from the dataflow on the zoo and on flax/equinox steps; a plan's overrides in its value
specs, the kernel's masks, the incremental estimator, export and plan files."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.analysis import COMPUTE, OPTIMIZER, PARAMETERS, domains
from toast_lab.cost import CostModel
from toast_lab.verification import read_compiled, summarize_collectives

from . import ext_models


@functools.cache
def analysed(name, **config):
    fn, args = tl.zoo.get(name, **config)
    return fn, args, tl.analyze(tl.trace(fn, *args))


@functools.cache
def external(which):
    fn, args = getattr(ext_models, f"{which}_train_step")()
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _inputs_by_domain(an):
    d = domains(an)
    out = {COMPUTE: set(), PARAMETERS: set(), OPTIMIZER: set()}
    for v, path in zip(an.program.inputs, an.program.input_names):
        out[d.of(v)].add(path.split("/")[0])
    return out


@pytest.mark.parametrize("name", ["mlp", "gpt", "gpt_scan", "moe", "cnn", "gnn"])
def test_zoo_arguments_fall_into_parameters_optimizer_state_and_data(name):
    _, _, an = analysed(name)
    assert _inputs_by_domain(an) == {PARAMETERS: {"params"}, OPTIMIZER: {"opt_state"},
                                     COMPUTE: {"batch"}}


@pytest.mark.parametrize("which", ["nnx", "equinox"])
def test_flax_and_equinox_steps_get_the_same_domains(which):
    _, _, an = external(which)
    assert _inputs_by_domain(an) == {PARAMETERS: {"params"}, OPTIMIZER: {"opt_state"},
                                     COMPUTE: {"batch"}}


def _check_step_structure(an):
    """Updated parameters are parameters, updated moments optimizer state; every value with
    the batch is compute; every contraction whose result has only parameter classes and whose
    operands carry the batch (a weight gradient) is in the optimizer domain."""
    d = domains(an)
    prog = an.program
    for out, inp in d.updated.items():
        assert d.of(out) == d.of(inp), prog.values[out]
    batchy = d.activation_classes
    assert batchy
    state_classes = {c for v in d.parameters for c in an.value_classes[v] if c >= 0}
    gradients = 0
    for op in prog.ops:
        for r in op.results:
            if any(c in batchy for c in an.value_classes[r]):
                assert d.of(r) == COMPUTE, (op, op.source)
        if op.primitive != "dot_general":
            continue
        r = op.results[0]
        feeds_on_batch = any(c in batchy for u in op.operands for c in an.value_classes[u])
        classes = {c for c in an.value_classes[r] if c >= 0}
        if feeds_on_batch and classes and classes <= state_classes and d.of(r) == OPTIMIZER:
            gradients += 1
    return gradients


@pytest.mark.parametrize("name", ["mlp", "gpt", "gpt_scan", "moe", "cnn", "gnn"])
def test_weight_gradients_are_optimizer_domain_and_activations_compute(name):
    _, _, an = analysed(name)
    assert _check_step_structure(an) > 0


@pytest.mark.parametrize("which", ["nnx", "equinox"])
def test_weight_gradients_of_flax_and_equinox_steps(which):
    _, _, an = external(which)
    assert _check_step_structure(an) > 0


def test_domains_do_not_depend_on_names():
    fn, args = tl.zoo.get("gpt")
    named = tl.analyze(tl.trace(fn, *args))
    anon = tl.analyze(tl.trace(fn, *args, dim_names=(None, None, None)))
    assert np.array_equal(domains(named).of_value, domains(anon).of_value)


def test_a_weight_cast_for_the_forward_is_a_parameter_and_the_loss_is_compute():
    def loss(params, x):
        w = params["w"].astype(jnp.bfloat16)  # mixed precision: the cast weight is a weight
        return jnp.mean(jnp.square(x.astype(jnp.bfloat16) @ w))

    def step(params, x):
        value, grads = jax.value_and_grad(loss)(params, x)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), value

    params = {"w": jax.ShapeDtypeStruct((16, 32), jnp.float32)}
    an = tl.analyze(tl.trace(step, params, jax.ShapeDtypeStruct((8, 16), jnp.float32)))
    d = domains(an)
    prog = an.program
    casts = [op for op in prog.ops if op.primitive == "convert_element_type"
             and op.operands[0] == prog.inputs[0]]
    assert casts and all(d.of(op.results[0]) == PARAMETERS for op in casts)
    assert d.of(prog.outputs[0]) == PARAMETERS  # the updated weight
    assert d.of(prog.outputs[1]) == COMPUTE  # the loss
    assert not d.optimizer_state  # plain SGD: no optimizer state


def test_scan_bodies_share_their_operands_domains():
    _, _, an = analysed("gpt_scan")
    d = domains(an)
    prog = an.program
    for op in prog.ops:
        if op.primitive != "scan":
            continue
        for a, b in tl.analysis._domains.region_links(op):
            if a in op.operands and prog.values[b].origin == "body":
                assert d.of(a) == d.of(b)
            if b in op.results:
                assert d.of(a) == d.of(b)
    stacked = [v for v, p in zip(prog.inputs, prog.input_names) if p.startswith("params/blocks")]
    assert stacked and all(d.of(v) == PARAMETERS for v in stacked)


def test_an_update_inside_a_cond_keeps_its_states_domains():
    """optax.apply_if_finite and MultiSteps apply the update inside a cond: its results are
    the new parameters and optimizer state, not compute (the branch index, from the loss,
    decides them but is none of them), so ZeRO-1 keeps Adam's moments sharded there and
    gathers the new parameters where the update meets them, as without the cond (the moments
    came back replicated, and the estimate charged none of XLA's all-gathers)."""
    import optax

    opt = optax.adam(1e-3)

    def step(params, opt_state, x):
        value, grads = jax.value_and_grad(
            lambda p: jnp.mean(jnp.tanh(x @ p["w1"]) @ p["w2"]))(params)

        def update(state):
            p, s = state
            u, s = opt.update(grads, s, p)
            return optax.apply_updates(p, u), s

        params, opt_state = jax.lax.cond(jnp.isfinite(value), update, lambda a: a,
                                         (params, opt_state))
        return params, opt_state, value

    params = {"w1": jnp.ones((16, 32)) * 0.1, "w2": jnp.ones((32, 8)) * 0.1}
    args = (params, opt.init(params), jnp.ones((16, 16)))
    an = tl.analyze(tl.trace(step, *args))
    d = domains(an)
    prog = an.program
    cond = next(op for op in prog.ops if op.primitive == "cond")
    kinds = [d.of(r) for r in cond.results if prog.values[r].ndim]
    assert kinds == [PARAMETERS] * 2 + [OPTIMIZER] * 4, kinds
    mesh = tl.Mesh({"data": 4, "model": 2}, device="cpu")
    plan = tl.strategies.expert(an, mesh)["zero1"]
    est = tl.estimate(an, plan, mesh)
    jm = mesh.jax_mesh()
    stats = read_compiled(plan.jit(step, jm).lower(*args).compile(), jm)
    assert est.output_bytes == stats.output_bytes
    gathered = summarize_collectives(stats.collectives)
    xla = sum(v.bytes for (kind, _), v in gathered.items() if kind == "all-gather")
    ours = sum(c.bytes for (kind, _), c in est.collectives.items() if kind == "all-gather")
    assert xla > 0 and ours == pytest.approx(xla, rel=0.25)


def test_a_program_without_a_batch_has_only_the_trivial_split():
    def step(w, x):  # one example: every dim of the data is a dim of the weight
        return w - 0.1 * jax.grad(lambda w: jnp.sum((w @ x) ** 2))(w), jnp.sum(w)

    an = tl.analyze(tl.trace(step, jax.ShapeDtypeStruct((4, 4), jnp.float32),
                             jax.ShapeDtypeStruct((4,), jnp.float32)))
    d = domains(an)
    assert not d.activation_classes and not d.optimizer_state
    assert {d.of(v) for v in range(len(an.program.values))} <= {COMPUTE, PARAMETERS}


# --- plans with overrides ----------------------------------------------------------------

MESH = tl.Mesh({"data": 2, "fsdp": 2, "tensor": 2}, device="h100")


def maxtext(an):
    return (tl.Plan.replicated(an).with_axes("batch", ("data", "fsdp"))
            .with_axes("embed", "tensor").with_axes("heads", "tensor")
            .with_axes("mlp", "tensor").with_axes("vocab", "tensor")
            .with_axes("embed", "fsdp", domain=PARAMETERS)
            .with_axes("embed", "fsdp", domain=OPTIMIZER))


def zero1(an, axes=("data", "fsdp", "tensor")):
    plan = tl.Plan.replicated(an).with_axes("batch", axes)
    for cls in ("embed", "mlp", "vocab"):
        plan = plan.with_axes(cls, axes, domain=OPTIMIZER)
    return plan


def _spec(an, plan, path):
    prog = an.program
    return plan.value_axes(prog.inputs[prog.input_names.index(path)])


def test_value_axes_take_the_class_axes_of_the_values_domain():
    _, _, an = analysed("gpt")
    plan = maxtext(an)
    assert _spec(an, plan, "params/blocks/0/mlp/w_in") == (("fsdp",), ("tensor",))
    assert _spec(an, plan, "opt_state/0/mu/blocks/0/mlp/w_in") == (("fsdp",), ("tensor",))
    prog, d = an.program, domains(an)
    x = next(op.results[0] for op in prog.ops if op.primitive == "add"
             and op.name_scope.startswith("block0/attn") and prog.values[op.results[0]].ndim == 3
             and d.of(op.results[0]) == COMPUTE)
    assert plan.value_axes(x) == (("data", "fsdp"), (), ("tensor",))
    z = zero1(an)
    assert _spec(an, z, "params/blocks/0/mlp/w_in") == ((), ())
    assert _spec(an, z, "opt_state/0/nu/blocks/0/mlp/w_in") == (("data", "fsdp", "tensor"), ())
    assert z.axes_of("embed") == () and z.axes_of("embed", OPTIMIZER) == ("data", "fsdp", "tensor")
    assert "embed@optimizer" in repr(z)


def test_overrides_keep_their_class_in_the_decision_order():
    _, _, an = analysed("gpt")
    plan = tl.Plan.replicated(an).with_axes("embed", "data", domain=OPTIMIZER)
    assert [an.classes[k].name for k, _ in plan.assignments] == ["embed"]
    plan = plan.with_axes("batch", "data").with_axes("embed", ())
    assert [an.classes[k].name for k, _ in plan.assignments] == ["embed", "batch"]
    back = plan.without_override("embed", OPTIMIZER)
    assert [an.classes[k].name for k, _ in back.assignments] == ["batch"]
    assert back == tl.Plan.replicated(an).with_axes("batch", "data")
    assert plan != back and hash(plan) != hash(back)
    with pytest.raises(tl.PlanError, match="no domain"):
        plan.with_axes("embed", "data", domain="weights")
    with pytest.raises(tl.PlanError, match="override embed@optimizer"):
        plan.with_axes("embed", "nope", domain=OPTIMIZER).validate(MESH)


def test_an_override_costs_its_reshard_where_domains_meet():
    """ZeRO-1: the gradients are reduce-scattered into the sharded optimizer state and the
    update is all-gathered back into the replicated parameters — the time of data
    parallelism's all-reduce (which is a reduce-scatter and an all-gather), a fraction of its
    optimizer-state memory."""
    _, _, an = analysed("gpt")
    mesh = tl.Mesh({"data": 8}, device="h100")
    dp = tl.estimate(an, tl.Plan.replicated(an).with_axes("batch", "data"), mesh)
    z = tl.estimate(an, zero1(an, ("data",)), mesh)
    kinds = {k for k, _ in z.collectives}
    assert {"reduce-scatter", "all-gather"} <= kinds
    assert z.communication_s == pytest.approx(dp.communication_s, rel=0.05)
    assert z.argument_bytes < 0.5 * dp.argument_bytes


def test_incremental_overrides_match_the_full_estimate():
    _, _, an = analysed("gpt")
    model = CostModel(an, MESH)
    start = maxtext(an)
    inc = model.incremental(start)
    assert inc.result == pytest.approx(model.step_and_peak(*model.plan_arrays(start)))
    rng = np.random.default_rng(0)
    plan = start
    options = [(), ("data",), ("fsdp",), ("tensor",), ("data", "fsdp")]
    for _ in range(60):
        cls = an.classes[int(rng.integers(len(an.classes)))]
        axes = options[int(rng.integers(len(options)))]
        if cls.size % int(np.prod([MESH.axis_size(a) for a in axes] or [1])):
            continue
        domain = [None, PARAMETERS, OPTIMIZER, COMPUTE][int(rng.integers(4))]
        if domain is None and not axes and cls.id in dict(plan.assignments) \
                and cls.id not in {k for k, _, _ in plan.overrides}:
            continue  # un-sharding forgets a rank the estimator keeps (as for classes)
        plan = plan.with_axes(cls.id, axes, domain=domain)
        step, peak = inc.set_axes(cls.id, axes, domain=domain)
        full = model.step_and_peak(*model.plan_arrays(plan))
        assert (step, peak) == pytest.approx(full, rel=1e-12), (plan, domain)


def test_plans_without_overrides_cost_what_they_did():
    """No override: every split class of a class has its mask and rank, so the kernel sees
    the plan it saw before domains (the split only adds value types)."""
    _, _, an = analysed("gpt")
    model = tl.cost_model(an, MESH)
    for name, plan in tl.strategies.expert(an, MESH).items():
        if plan.overrides:
            continue
        mask, rank, res = model.plan_arrays(plan)
        split = tl.cost._plan_arrays.split_classes(an)
        base_mask = np.zeros(len(an.classes), np.int64)
        for k, axes in plan.assignments:
            base_mask[k] = sum(1 << MESH.axis_names.index(a) for a in axes)
        assert np.array_equal(mask, base_mask[split.base]), name


def test_plan_files_keep_overrides_and_old_files_still_load(tmp_path):
    _, _, an = analysed("gpt")
    plan = maxtext(an).pin("embed@parameters")
    path = plan.save(tmp_path / "maxtext.json", mesh=MESH)
    doc = json.loads(path.read_text())
    assert doc["version"] == 3
    assert doc["overrides"] == {"embed": {"parameters": ["fsdp"], "optimizer": ["fsdp"]}}
    back = tl.Plan.load(path, an)
    assert back == plan and back.pinned == plan.pinned
    assert back.value_axes(an.program.inputs[0]) == plan.value_axes(an.program.inputs[0])
    plain = tl.Plan.replicated(an).with_axes("batch", "data")
    doc = json.loads(plain.save(tmp_path / "dp.json").read_text())
    assert doc["version"] == 3 and "overrides" not in doc  # the section only when needed
    assert tl.Plan.load(tmp_path / "dp.json", an) == plain
    bad = json.loads(path.read_text())
    bad["overrides"] = {"embed": {"weights": ["fsdp"]}}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(tl.PlanFileError, match="domain 'weights'"):
        tl.Plan.load(tmp_path / "bad.json", an)
    bad["overrides"] = {"embed": ["fsdp"]}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(tl.PlanFileError, match="overrides"):
        tl.Plan.load(tmp_path / "bad.json", an)


def test_export_shards_each_argument_by_its_domain_and_constrains_the_boundaries():
    _, _, an = analysed("gpt")
    plan = zero1(an)
    params, opt_state, _ = plan.partition_specs()[0]
    assert all(spec == jax.sharding.PartitionSpec() for spec in jax.tree.leaves(
        params, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    mu = opt_state[0].mu["blocks"][0]["mlp"]["w_in"]
    assert mu == jax.sharding.PartitionSpec(("data", "fsdp", "tensor"))
    from toast_lab.analysis import domain_boundaries
    from toast_lab.plan._export import constraint_values
    boundaries = domain_boundaries(an)
    d = domains(an)
    assert {d.of(v) for v in boundaries} == {COMPUTE, PARAMETERS, OPTIMIZER}
    results = {v for v in boundaries if an.program.values[v].origin == "result"}
    assert results <= constraint_values(plan, "conflicts")
    assert not domain_boundaries(an) & constraint_values(
        tl.Plan.replicated(an).with_axes("batch", "data"), "conflicts")
    rules = dict(maxtext(an).logical_axis_rules(PARAMETERS))
    assert rules["embed"] == "fsdp" and dict(maxtext(an).logical_axis_rules())["embed"] == "tensor"


def test_lab_prices_choices_from_a_plan_with_overrides_exactly():
    from toast_lab.lab import Session, ViewBuilder

    _, _, an = analysed("gpt")
    mesh = tl.Mesh({"data": 2, "fsdp": 2, "tensor": 2}, device="h100")
    plan = maxtext(an).pin("embed@parameters")
    session = Session(an, mesh, plan=plan)
    vm = ViewBuilder(an, mesh).build(session)
    priced = 0
    for cv in vm.classes:
        for ch in cv.choices:
            if ch.valid and not ch.current:
                want = tl.estimate(an, plan.with_axes(cv.id, ch.value), mesh)
                assert ch.step_time_s == pytest.approx(want.step_time_s, rel=1e-9), cv.name
                assert ch.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-9)
                priced += 1
    assert priced > 20
    assert plan.axes_of("embed@parameters") == ("fsdp",)


@pytest.mark.slow
@pytest.mark.parametrize("shape", [{"data": 4, "model": 2}, {"data": 2, "fsdp": 2, "model": 2}])
@pytest.mark.parametrize("name", tl.zoo.names())
def test_random_plans_with_overrides_match_the_unsharded_step(name, shape):
    """tests/test_property.py for plans whose classes take other axes in some domains: export
    reshards where the domains meet, and the step is still the unsharded step."""
    from toast_lab.verification import verify

    fn, _, an = analysed(name)
    mesh = tl.Mesh(shape)
    seed = (tl.zoo.names().index(name), len(shape), 7)
    plan = tl.random_plan(an, mesh, np.random.default_rng(seed), override_prob=0.6)
    assert plan.overrides, plan
    rep = verify(fn, tl.zoo.sample(name), plan, mesh)
    assert rep.ok, (plan, rep.worst_error, rep.worst_leaf)
