"""Class names from the logical axis names flax keeps on parameters: flax.nnx's
`nnx.with_partitioning` (Variable metadata) and flax.linen's `nn.Partitioned` /
`nn.LogicallyPartitioned` boxes. A plan written with those names exports and verifies; plan
files saved when the classes were named by path still load."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import toast_lab as tl
from toast_lab.program import _trace

nnx = pytest.importorskip("flax.nnx")
nn = pytest.importorskip("flax.linen")

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")
WIDTH, HIDDEN, BATCH = 16, 32, 8


class _Residual(nnx.Module):
    """x + down(relu(up(x))): the residual ties up's input features to down's output."""

    def __init__(self, rngs):
        init = nnx.initializers.lecun_normal()
        part = nnx.with_partitioning
        self.up = nnx.Linear(WIDTH, HIDDEN, kernel_init=part(init, ("embed", "mlp")),
                             bias_init=part(nnx.initializers.zeros_init(), ("mlp",)),
                             rngs=rngs)
        self.down = nnx.Linear(HIDDEN, WIDTH, kernel_init=part(init, ("mlp", "embed")),
                               rngs=rngs)

    def __call__(self, x):
        return x + self.down(nnx.relu(self.up(x)))


def _nnx_case():
    """(step, (state, x)): an nnx model and its AdamW state, split into graphdef and state."""
    with nnx.use_eager_sharding(False):  # flax 0.12 would place the names on a mesh at init
        model = _Residual(nnx.Rngs(0))
        optimizer = nnx.Optimizer(model, optax.adamw(1e-2), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def step(state, x):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean(m(x) ** 2))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    x = jnp.asarray(np.random.default_rng(0).normal(size=(BATCH, WIDTH)), jnp.float32)
    return step, (state, x)


class _LinenMLP(nn.Module):
    @nn.compact
    def __call__(self, x):
        init = nn.initializers.lecun_normal()
        h = nn.Dense(HIDDEN, kernel_init=nn.with_partitioning(init, ("embed", "mlp")))(x)
        return x + nn.Dense(WIDTH, kernel_init=nn.with_logical_partitioning(
            init, ("mlp", "embed")))(nn.relu(h))


def _linen_case():
    """(step, (params, x)): an SGD step on linen params still in their Partitioned boxes."""
    model = _LinenMLP()
    x = jnp.asarray(np.random.default_rng(1).normal(size=(BATCH, WIDTH)), jnp.float32)
    params = model.init(jax.random.key(0), x)["params"]

    def step(params, x):
        loss, grads = jax.value_and_grad(
            lambda p: jnp.mean(model.apply({"params": p}, x) ** 2))(params)
        return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads), loss

    return step, (params, x)


def _analysed(case, **trace_options):
    fn, args = case
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)
        return tl.analyze(tl.trace(fn, *args, **trace_options))


def _without_annotations(monkeypatch, case):
    """The analysis toast-lab made before it read flax's annotations: the same program, its
    classes named by path."""
    with monkeypatch.context() as m:
        m.setattr(_trace, "annotated_names", lambda tree: [None] * len(jax.tree.leaves(tree)))
        return _analysed(case)


def _class_of(an, path: str, dim: int):
    v = next(v for v in an.program.inputs if an.program.values[v].name.startswith(path))
    return an.class_of(v, dim)


@pytest.mark.parametrize("make", [_nnx_case, _linen_case], ids=["nnx", "linen"])
def test_annotated_parameters_name_their_classes(make, monkeypatch):
    case = make()
    an = _analysed(case)
    names = [c.name for c in an.classes]
    assert "embed" in names and "mlp" in names, names
    embed, mlp = an.class_named("embed"), an.class_named("mlp")
    # the names sit on the dims the annotations gave them, parameters and AdamW moments alike
    kernels = [v for v in an.program.inputs if "kernel" in an.program.values[v].name]
    assert len(kernels) == (6 if make is _nnx_case else 2)
    for v in kernels:
        up = "/up/" in an.program.values[v].name or "Dense_0" in an.program.values[v].name
        assert an.dim_names(v) == (("embed", "mlp") if up else ("mlp", "embed"))
    # the residual makes the data's features the same class
    x = an.program.inputs[-1]
    assert an.class_of(x, 1) is embed
    # before, the same classes were named by path; those names are kept for old plan files
    # (without the annotations, they are named from the field, and their path is a former name)
    old = _without_annotations(monkeypatch, case)
    assert [c.id for c in old.classes] == [c.id for c in an.classes]
    assert embed.formerly == old.classes[embed.id].formerly[:1]
    assert mlp.formerly == old.classes[mlp.id].formerly[:1]
    assert old.classes[mlp.id].name == "mlp"
    assert "[" in mlp.formerly[0], mlp.formerly  # a path and a dim: 'down/kernel[0]'


def test_the_users_dim_names_win_over_annotations():
    step, (state, x) = _nnx_case()
    up_kernel = "[0]['up']['kernel'].value"  # one leaf's dims named by the user
    names = jax.tree_util.tree_map_with_path(
        lambda path, _: ("d_model", "ffw") if jax.tree_util.keystr(path) == up_kernel else None,
        state)
    an = _analysed((step, (state, x)), dim_names=(names, ("batch", "features")))
    kernel = next(v for v in an.program.inputs
                  if an.program.values[v].name == "state/0/up/kernel/value")
    assert an.dim_names(kernel) == ("d_model", "ffw")
    # x's features and up's kernel rows are one class, which the user named twice: the first
    # of their names (in argument order) is its name, their other one comes before flax's
    assert an.dim_names(an.program.inputs[-1]) == ("batch", "d_model")
    assert an.class_named("d_model").aliases == ("features", "embed")
    assert an.class_named("ffw").aliases == ("mlp",)
    assert "embed" not in [c.name for c in an.classes]


def test_a_module_or_variables_given_whole_are_read_too():
    with nnx.use_eager_sharding(False):
        model = _Residual(nnx.Rngs(0))
    x = jnp.ones((BATCH, WIDTH), jnp.float32)
    an = _analysed((lambda model, x: jnp.mean(model(x) ** 2), (model, x)))
    assert [c.name for c in an.classes][:2] == ["embed", "mlp"]
    variables = {"w": model.up.kernel, "b": model.up.bias}
    an = _analysed((lambda v, x: jnp.sum(x @ v["w"][...] + v["b"][None]), (variables, x)))
    assert an.dim_names(an.program.inputs[1]) == ("embed", "mlp")  # w, after b


@pytest.mark.parametrize("tensor_parallel", ["mlp", "embed"])
@pytest.mark.parametrize("make", [_nnx_case, _linen_case], ids=["nnx", "linen"])
def test_a_plan_by_annotation_names_exports_and_verifies(make, tensor_parallel):
    fn, args = case = make()
    an = _analysed(case)
    batch = an.class_of(an.program.inputs[-1], 0)
    plan = (tl.Plan.replicated(an).with_axes(batch.name, ("data",))
            .with_axes(tensor_parallel, ("model",), pin=True))
    in_shardings, _ = plan.shardings(MESH.jax_mesh())
    for sharding, v in zip(jax.tree.leaves(in_shardings), an.program.inputs):
        names = an.dim_names(v)
        want = tuple("model" if n == tensor_parallel else "data" if n == batch.name else None
                     for n in names)
        assert tuple(sharding.spec) + (None,) * (len(names) - len(sharding.spec)) == want
    rep = tl.verify(fn, args, plan, MESH)
    assert rep.ok, str(rep)
    # the estimate holds each argument's bytes per device as XLA compiled them
    assert tl.estimate(an, plan, MESH).argument_bytes == rep.stats.argument_bytes


@pytest.mark.parametrize("make", [_nnx_case, _linen_case], ids=["nnx", "linen"])
def test_a_plan_saved_with_path_names_loads_onto_annotation_names(make, monkeypatch, tmp_path):
    case = make()
    old = _without_annotations(monkeypatch, case)
    embed_id = _class_of(_analysed(case), "x", 1).id
    # (without the annotations the class is named from the field; its path is a former name)
    path_name = old.classes[embed_id].formerly[0]
    old_plan = tl.Plan.replicated(old).with_axes(path_name, ("model",), pin=True)
    doc = old_plan.to_dict(MESH)
    doc["classes"] = {path_name if k == old.classes[embed_id].name else k: v
                      for k, v in doc["classes"].items()}
    doc["pinned"] = [path_name if k == old.classes[embed_id].name else k for k in doc["pinned"]]
    path = tmp_path / "old.json"
    path.write_text(json.dumps(doc))
    saved = path.read_text()
    assert '"embed"' not in saved and path_name in saved
    an = _analysed(case)
    plan = tl.Plan.load(path, an)
    assert plan.axes_of("embed") == ("model",)
    assert "embed" in plan.pinned
    # and saved again, it holds the new names
    assert '"embed"' in plan.save(tmp_path / "new.json", MESH).read_text()


def test_a_conflict_saved_under_its_classes_path_name_loads(monkeypatch, tmp_path):
    class Gram(nnx.Module):
        def __init__(self, rngs):
            self.w = nnx.Param(jax.random.normal(rngs.params(), (WIDTH, HIDDEN)),
                               out_sharding=("embed", "mlp"), eager_sharding=False)

        def __call__(self, x):
            gram = self.w[...].T @ self.w[...]  # [mlp, mlp]: the class meets itself
            return jnp.sum((x @ self.w[...] @ gram) ** 2)

    graphdef, state = nnx.split(Gram(nnx.Rngs(0)))

    def loss(state, x):
        return nnx.merge(graphdef, state)(x)

    case = (loss, (state, jnp.ones((BATCH, WIDTH), jnp.float32)))
    old = _without_annotations(monkeypatch, case)
    an = _analysed(case)
    assert an.conflicts and an.conflicts[0].class_name == "mlp"
    conflict, old_conflict = an.conflicts[0], old.conflicts[0]
    assert old_conflict.name != conflict.name
    resolution = conflict.resolutions[0]
    old_plan = (tl.Plan.replicated(old).with_axes(old_conflict.class_name, ("model",))
                .with_resolution(old_conflict.name, resolution))
    path = old_plan.save(tmp_path / "old.json", MESH)
    plan = tl.Plan.load(path, an)
    assert plan.axes_of("mlp") == ("model",)
    assert plan.conflict_resolutions == {conflict.name: resolution}


def test_the_forms_an_annotation_takes():
    from jax.sharding import PartitionSpec as P

    from toast_lab.program._annotations import annotated_names

    def param(shape, names):
        return nnx.Param(jnp.ones(shape), out_sharding=names, eager_sharding=False)

    tree = {"a_linen": nn.LogicallyPartitioned(jnp.ones((2, 3)), names=("x", None)),
            "b_plain": jnp.ones(3),
            "c_spec": param((4, 2), P(("data", "fsdp"), None)),  # a dim over two axes
            "d_unconstrained": param((2,), P(P.UNCONSTRAINED)),
            "e_wrong_rank": param((4,), ("a", "b")),
            "f_none": None,
            "g_box_of_none": param((2, 2), (None, None))}
    assert annotated_names(tree) == [("x", None), None, ("data+fsdp", None), None, None, None]
