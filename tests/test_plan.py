"""Plan: decisions, per-value shardings, validation errors, export, plan files."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

import toast_lab as tl


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", layers=2)
    return fn, args, tl.analyze(tl.trace(fn, *args))


@pytest.fixture(scope="module")
def mesh():
    return tl.Mesh({"data": 4, "model": 2}, device="h100")


def _input(an, path):
    prog = an.program
    return prog.inputs[prog.input_names.index(path)]


def test_plans_are_immutable_and_ordered(gpt):
    _, _, an = gpt
    base = tl.Plan.replicated(an)
    plan = base.with_axes("batch", "data").with_axes("mlp", ("model",), pin=True)
    assert base.class_axes == {}
    assert plan.class_axes == {"batch": ("data",), "mlp": ("model",)}
    assert plan.axes_of("batch") == ("data",) and plan.axes_of("embed") == ()
    assert plan.pinned == {"mlp"}
    assert plan.with_axes("batch", None).class_axes == {"mlp": ("model",)}
    assert plan == tl.Plan.from_decisions(an, {"batch": "data", "mlp": "model"})
    assert "batch=('data',)" in repr(plan)


def test_value_specs_follow_classes_and_first_decision_wins(gpt):
    _, _, an = gpt
    prog = an.program
    fsdp = tl.Plan.replicated(an).with_axes("batch", "data").with_axes("embed", "data")
    wte = _input(an, "params/wte")
    tokens = _input(an, "batch/tokens")
    assert fsdp.partition_spec(wte) == P(None, "data")          # parameters: sharded on embed
    assert fsdp.partition_spec(tokens) == P("data")
    # Activations [b, s, d] hold both classes: batch was decided first and keeps `data`.
    resid = next(v for v in prog.values if an.dim_names(v.id) == ("batch", "seq", "embed"))
    assert fsdp.partition_spec(resid.id) == P("data")
    swapped = tl.Plan.replicated(an).with_axes("embed", "data").with_axes("batch", "data")
    assert swapped.partition_spec(resid.id) == P(None, None, "data")


def test_conflict_resolutions_choose_which_side_keeps_the_class(gpt):
    _, _, an = gpt
    (c,) = an.conflicts
    plan = tl.Plan.replicated(an).with_axes("seq", "model")
    assert plan.resolution_of(c) == "keep_dim2"  # default: the first side (query positions)
    assert plan.partition_spec(c.site_value) == P(None, None, "model")
    keep_k = plan.with_resolution(c.name, "keep_dim3")
    assert keep_k.partition_spec(c.site_value) == P(None, None, None, "model")
    rep = plan.with_resolution(c.id, tl.REPLICATE)
    assert rep.partition_spec(c.site_value) == P()
    assert rep.conflict_resolutions == {c.name: tl.REPLICATE}
    with pytest.raises(tl.PlanError, match="keep_dim9"):
        plan.with_resolution(c, "keep_dim9")
    # A conflict whose class is replicated asks nothing.
    assert tl.Plan.replicated(an).conflict_resolutions == {}


def test_validation_errors_name_the_problem(gpt, mesh):
    _, _, an = gpt
    plan = tl.Plan.replicated(an)
    with pytest.raises(tl.PlanError, match="not divisible") as err:
        plan.with_axes("heads", ("data", "model")).validate(mesh)  # heads=4 over 8 devices
    assert "'heads' has size 4" in str(err.value) and "params/blocks/0/attn" in str(err.value)
    with pytest.raises(tl.PlanError, match="does not have"):
        plan.with_axes("batch", "pipeline").validate(mesh)
    with pytest.raises(tl.PlanError, match="axis twice"):
        plan.with_axes("batch", ("data", "data"))
    with pytest.raises(tl.PlanError, match="no class named 'bach'"):
        plan.with_axes("bach", "data")
    with pytest.raises(tl.PlanError, match="no conflict named"):
        plan.with_resolution("nope", "replicate")
    plan.with_axes("batch", ("data", "model")).validate(mesh)


def test_shardings_match_the_argument_and_result_structure(gpt, mesh):
    fn, args, an = gpt
    plan = tl.Plan.replicated(an).with_axes("batch", "data").with_axes("mlp", "model")
    in_sh, out_sh = plan.shardings(mesh.jax_mesh())
    assert jax.tree.structure(in_sh) == jax.tree.structure(args)
    out_shape = jax.eval_shape(fn, *args)
    assert jax.tree.structure(out_sh) == jax.tree.structure(out_shape)
    assert all(isinstance(s, NamedSharding) for s in jax.tree.leaves(in_sh))
    assert in_sh[2]["tokens"].spec == P("data")
    assert in_sh[0]["blocks"][0]["mlp"]["w_in"].spec == P(None, "model")
    in_specs, _ = plan.partition_specs()
    assert in_specs[0]["blocks"][1]["mlp"]["w_out"] == P("model")
    rules = dict(plan.logical_axis_rules())
    assert rules["batch"] == "data" and rules["mlp"] == "model" and rules["embed"] is None


def test_plan_jit_matches_the_unsharded_function():
    fn, args = tl.zoo.get("mlp")
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2})
    plan = (tl.Plan.replicated(an).with_axes("batch", "data").with_axes("hidden0", "model")
            .with_axes("hidden1", "model"))
    sample = tl.zoo.sample("mlp")
    step = plan.jit(fn, mesh.jax_mesh())
    want = jax.jit(fn)(*sample)
    got = step(*sample)  # donates (consumes) sample's params and optimizer state
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-4, atol=2e-5)
    w0 = got[0]["dense0"]["w"]
    assert w0.sharding.spec == P(None, "model")
    # the training state is donated (each of its leaves aliases an output), the batch is not
    text = step.lower(*args).as_text()
    assert text.count("tf.aliasing_output") == len(jax.tree.leaves(args[:2]))
    assert not any(x.is_deleted() for x in jax.tree.leaves(sample[2]))
    kept = plan.jit(fn, mesh.jax_mesh(), donate=False).lower(*args).as_text()
    assert "tf.aliasing_output" not in kept


def test_plan_jit_refuses_another_function():
    fn, args = tl.zoo.get("mlp")
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.Plan.replicated(an)

    def other(params, opt_state, batch):
        return params, opt_state, jnp.zeros(())

    with pytest.raises(ValueError, match="not the function this plan was made for"):
        plan.jit(other, tl.Mesh({"data": 8}).jax_mesh())


def test_plan_jit_runs_the_function_it_is_given_with_its_own_constants():
    # a plan is keyed by the program's structure: a function that differs only in a constant
    # (another learning rate, a partial's argument) takes the plan and runs as itself
    def make_step(lr):
        def step(p, x):
            g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"])))(p)
            return jax.tree.map(lambda a, b: a - lr * b, p, g)
        return step

    p, x = {"w": jnp.ones((4, 8)) * 0.1}, jnp.ones((8, 4))
    an = tl.analyze(tl.trace(make_step(0.1), p, x))
    plan = tl.Plan.replicated(an).with_axes("x[0]", "data")
    faster = make_step(1.0)
    got = plan.jit(faster, tl.Mesh({"data": 8}).jax_mesh(), donate=False)(p, x)
    np.testing.assert_allclose(got["w"], faster(p, x)["w"], rtol=1e-5)
    assert not np.allclose(got["w"], make_step(0.1)(p, x)["w"])

    def swapped(p, x):  # the same ops and shapes, wired otherwise: not this plan's function
        g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"])))(p)
        return jax.tree.map(lambda a, b: b - 0.1 * a, p, g)

    with pytest.raises(ValueError, match="not the function this plan was made for"):
        plan.jit(swapped, tl.Mesh({"data": 8}).jax_mesh())


def test_plan_jit_refuses_other_shapes_than_it_was_planned_for():
    # the plan replays the traced shapes (a mean divides by the traced batch): a batch of 16
    # where 8 was traced would compute the wrong mean, so it is refused by name
    def loss(p, x):
        return jnp.mean(x @ p["w"])

    p = {"w": jnp.ones((4, 8))}
    an = tl.analyze(tl.trace(loss, p, jnp.ones((8, 4))))
    step = tl.Plan.replicated(an).with_axes("x[0]", "data").jit(loss, tl.Mesh({"data": 8})
                                                                .jax_mesh())
    assert float(step(p, jnp.ones((8, 4)))) == pytest.approx(4.0)
    with pytest.raises(ValueError, match=r"plan.jit: argument x is float32\[16, 4\] but 'loss' "
                                         r"was traced with float32\[8, 4\]"):
        step(p, jnp.ones((16, 4)))


def test_plan_jit_takes_a_mesh_from_jax_make_mesh():
    # jax.make_mesh declares Explicit axes, where with_sharding_constraint is refused: the
    # plan, which says where every value lives, runs on the same devices with Auto axes
    def loss(p, x):
        return jnp.mean(jnp.tanh(x @ p["w"]))

    p, x = {"w": jnp.ones((4, 8))}, jnp.ones((8, 4))
    plan = tl.Plan.replicated(tl.analyze(tl.trace(loss, p, x))).with_axes("x[0]", "data")
    jm = jax.make_mesh((4, 2), ("data", "model"))
    assert jax.sharding.AxisType.Explicit in jm.axis_types
    assert float(plan.jit(loss, jm)(p, x)) == pytest.approx(float(loss(p, x)))
    assert plan.shardings(jm)[0][1].spec == P("data")


def test_plan_files_round_trip(gpt, mesh, tmp_path):
    _, _, an = gpt
    (c,) = an.conflicts
    plan = (tl.Plan.replicated(an).with_axes("batch", "data", pin=True)
            .with_axes("seq", "model").with_resolution(c, "keep_dim3"))
    path = plan.save(tmp_path / "plan.json", mesh=mesh)
    doc = json.loads(path.read_text())
    assert doc["format"] == "toast-lab-plan" and doc["version"] == 3
    assert doc["mesh"] == {"axes": {"data": 4, "model": 2}, "device": "h100-80gb"}
    assert list(doc["classes"]) == ["batch", "seq"]
    loaded = tl.Plan.load(path, an)
    assert loaded == plan and loaded.pinned == {"batch"}
    assert loaded.resolution_of(c) == "keep_dim3"
    # A re-traced program is the same program: the plan applies to it.
    fn, args = tl.zoo.get("gpt", layers=2)
    again = tl.analyze(tl.trace(fn, *args))
    assert tl.Plan.load(path, again).class_axes == plan.class_axes


@pytest.mark.parametrize("content, message", [
    ("{not json", "not valid JSON"),
    ('{"format": "something-else"}', "not a toast-lab plan file"),
    ('{"format": "toast-lab-plan", "version": 99, "program": {}}', "newer toast-lab"),
    ('[1, 2]', "not a toast-lab plan file"),
])
def test_corrupted_plan_files_give_clear_errors(gpt, tmp_path, content, message):
    _, _, an = gpt
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(tl.PlanFileError, match=message):
        tl.Plan.load(path, an)


def test_hand_edited_plan_files_are_checked(gpt, tmp_path):
    _, _, an = gpt
    doc = tl.Plan.replicated(an).with_axes("batch", "data").to_dict()
    for edit, message in [
        (lambda d: d["classes"].update(batch="data"), "lists of mesh axis names"),
        (lambda d: d["classes"].update(bogus=["data"]), "no class named 'bogus'"),
        (lambda d: d["conflicts"].update({"x@y": "keep_dim2"}), "no conflict named"),
        (lambda d: d["program"].update(fingerprint="0" * 16), "made for another program"),
        (lambda d: d.update(pinned="batch"), "list of decision names"),
    ]:
        bad = json.loads(json.dumps(doc))
        edit(bad)
        path = tmp_path / "edited.json"
        path.write_text(json.dumps(bad))
        with pytest.raises(tl.PlanFileError, match=message):
            tl.Plan.load(path, an)


def test_plan_for_another_program_fails_clearly(gpt, tmp_path):
    _, _, an = gpt
    path = tl.Plan.replicated(an).with_axes("batch", "data").save(tmp_path / "p.json")
    fn, args = tl.zoo.get("mlp")
    other = tl.analyze(tl.trace(fn, *args))
    with pytest.raises(tl.PlanFileError, match="another program"):
        tl.Plan.load(path, other)
    assert tl.Plan.load(path, other, check_fingerprint=False).class_axes == {"batch": ("data",)}
