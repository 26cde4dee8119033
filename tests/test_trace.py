"""trace(): jaxpr -> Program, with calls inlined and control flow kept as regions."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.program import BODY_INPUT, INPUT, NO_OP, replay
from toast_lab.program import clean_scope


def _prims(prog):
    return [op.primitive for op in prog.ops]


def test_values_ops_and_input_paths():
    def step(params, batch):
        return jnp.tanh(batch["x"] @ params["w"]).sum()

    params = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)}
    batch = {"x": jax.ShapeDtypeStruct((2, 4), jnp.float32)}
    prog = tl.trace(step, params, batch)
    assert prog.input_names == ("params/w", "batch/x")
    assert [prog.values[v].shape for v in prog.inputs] == [(4, 8), (2, 4)]
    assert all(prog.values[v].origin == INPUT for v in prog.inputs)
    assert _prims(prog) == ["dot_general", "tanh", "reduce_sum"]
    dot = prog.ops[0]
    assert dot.operands == (prog.inputs[1], prog.inputs[0])
    assert prog.users(prog.inputs[0]) == (0,)
    assert prog.values[dot.results[0]].producer == 0
    assert "test_trace.py" in dot.source
    assert prog.values[prog.outputs[0]].shape == ()


def test_nested_jit_remat_and_custom_jvp_are_inlined_with_their_scope():
    @jax.jit
    def inner(x):
        with jax.named_scope("inner_scope"):
            return jax.nn.relu(x) * 2.0  # relu is a custom_jvp

    @jax.checkpoint
    def block(x):
        return jnp.sin(inner(x))

    def f(x):
        with jax.named_scope("outer"):
            return jax.grad(lambda x: block(x).sum())(x)

    prog = tl.trace(f, jnp.ones((4, 3)))
    prims = set(_prims(prog))
    assert not prims & set(tl.program.INLINED_PRIMITIVES)
    assert {"cos", "mul"} <= prims  # grad of sin needs cos only: sin itself is dead code
    scopes = {op.name_scope for op in prog.ops}
    assert any(s.startswith("outer/inner/inner_scope") for s in scopes), scopes


def test_linear_solve_is_inlined_as_the_solve_it_runs():
    # jnp.linalg.solve and cho_solve are custom_linear_solve: what runs (and what XLA
    # partitions) is its `solve` jaxpr, forward and in the gradient, so no fallback warning.
    def f(a, b):
        s = a @ a.T + 4.0 * jnp.eye(8)
        x = jnp.linalg.solve(s, b)
        y = jax.scipy.linalg.cho_solve(jax.scipy.linalg.cho_factor(s), b)
        return (x * y).sum()

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        prog = tl.trace(jax.grad(f, argnums=(0, 1)), jnp.ones((8, 8)), jnp.ones((8, 3)))
        tl.analyze(prog)
    prims = set(_prims(prog))
    assert "custom_linear_solve" not in prims
    assert {"lu", "cholesky", "triangular_solve"} <= prims
    # b's columns reach the solves (forward and transposed): the inlined bodies' ops
    solves = [prog.values[op.results[0]].shape for op in prog.ops
              if op.primitive == "triangular_solve"]
    assert solves.count((8, 3)) >= 4, solves


def test_scan_is_a_region_with_its_body_walked_once():
    def f(c, xs):
        def body(c, x):
            with jax.named_scope("layer"):
                c = jnp.tanh(c @ x)
            return c, c.sum()
        return jax.lax.scan(body, c, xs)

    prog = tl.trace(f, jnp.ones((2, 4)), jnp.ones((5, 4, 4)))
    scan = prog.ops[0]
    assert scan.primitive == "scan" and scan.region == NO_OP
    start, stop = scan.body_ops
    body = prog.ops[start:stop]
    assert [op.primitive for op in body] == ["dot_general", "tanh", "reduce_sum"]
    assert all(op.region == scan.id and op.trip_count == 5 for op in body)
    assert [op.name_scope for op in body] == ["layer", "layer", ""]
    # body: inputs [carry, x slice] then outputs [carry out, y]
    shapes = [prog.values[v].shape for v in scan.body]
    assert shapes == [(2, 4), (4, 4), (2, 4), ()]
    assert prog.values[scan.body[0]].origin == BODY_INPUT


@pytest.mark.parametrize("jitted", [False, True])
def test_a_scan_output_that_passes_its_xs_through_is_read_from_the_xs(jitted):
    """A checkpointed layer that returns its weights (as flax.nnx's scan returns the layers'
    state): after JAX's partial evaluation the forward scan copies the weights out as ys.
    The trace reads them from the scan's operand, so the update below reads the argument."""
    def step(w, x):
        def loss(w):
            def layer(c, wi):
                return jnp.tanh(c @ wi), wi
            c, ws = jax.lax.scan(jax.checkpoint(layer), x, w)
            return jnp.mean(c ** 2), ws
        (value, ws), g = jax.value_and_grad(loss, has_aux=True)(w)
        return ws - 0.1 * g, value

    fn = jax.jit(step) if jitted else step
    prog = tl.trace(fn, jnp.ones((4, 3, 3)), jnp.ones((8, 3)))
    forward = next(op for op in prog.ops if op.primitive == "scan" and op.region == NO_OP)
    update = prog.ops[prog.values[prog.outputs[0]].producer]
    assert update.primitive == "sub" and update.operands[0] == prog.inputs[0]
    assert [prog.values[r].shape for r in forward.results] == [(8, 3), (4, 8, 3)]
    # the program, replayed op by op, is still the step
    w, x = jnp.arange(36.0).reshape(4, 3, 3) / 36, jnp.linspace(-1.0, 1.0, 24).reshape(8, 3)
    expected = jax.tree.leaves(step(w, x))
    for got, want in zip(replay(prog, [w, x]), expected):
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_while_and_cond_regions():
    def f(x):
        y = jax.lax.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, x)
        return jax.lax.while_loop(lambda v: v.sum() < 100.0, lambda v: v + 1.0, y)

    prog = tl.trace(f, jnp.ones((3,)))
    cond = next(op for op in prog.ops if op.primitive == "cond")
    loop = next(op for op in prog.ops if op.primitive == "while")
    # cond body: per branch, inputs then outputs
    assert len(cond.body) == 4
    # while body: cond inputs, body inputs, body outputs
    assert len(loop.body) == 3
    assert all(prog.ops[i].region == loop.id for i in range(*loop.body_ops))


def test_dim_names_are_validated_and_flattened():
    def f(p, x):
        return x @ p["w"]

    p = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32)}
    x = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    prog = tl.trace(f, p, x, dim_names=({"w": ("embed", "mlp")}, ("batch", None)))
    assert prog.dim_names == (("embed", "mlp"), ("batch", None))
    with pytest.raises(ValueError, match="one name per dim"):
        tl.trace(f, p, x, dim_names=({"w": ("embed",)}, None))
    with pytest.raises(ValueError, match="one entry"):
        tl.trace(f, p, x, dim_names=(None,))


def test_dim_names_follow_the_argument_where_it_has_none():
    """An equinox partition keeps None where the static half was; names made by mapping over
    that pytree have None there too, which is structure, not an unnamed leaf."""
    def f(p, x):
        return x @ p["w"] + p["b"][None, :]

    p = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32), "act": None,
         "b": jax.ShapeDtypeStruct((8,), jnp.float32)}
    x = jax.ShapeDtypeStruct((2, 4), jnp.float32)
    names = {"w": ("embed", "mlp"), "act": None, "b": ("mlp",)}
    prog = tl.trace(f, p, x, dim_names=(names, ("batch", "embed")))
    assert prog.dim_names == (("mlp",), ("embed", "mlp"), ("batch", "embed"))  # keys sorted
    with pytest.raises(ValueError, match="one name per dim"):
        tl.trace(f, p, x, dim_names=({**names, "b": ("mlp", None)}, None))


def test_clean_scope_strips_transformations():
    assert clean_scope("transpose(jvp(block0))/attn") == "block0/attn"
    assert clean_scope("jvp()") == ""
    assert clean_scope("vmap(jvp(a/b))/c") == "a/b/c"
    # jax.checkpoint's recomputation belongs to the forward scope it recomputes
    assert clean_scope("transpose(jvp(block))/rematted_computation/attn") == "block/attn"


def test_fingerprint_depends_on_structure_only():
    def f(x):
        return jnp.sin(x) * 2

    a = tl.trace(f, jax.ShapeDtypeStruct((4,), jnp.float32))
    b = tl.trace(f, np.zeros((4,), np.float32))
    c = tl.trace(f, jax.ShapeDtypeStruct((8,), jnp.float32))
    assert a.fingerprint() == b.fingerprint() != c.fingerprint()


def test_scan_counts_are_read_from_jax_0_11s_flat_tree():
    """JAX 0.11 dropped scan's num_consts / num_carry for `ft_in`, a flat tree of (consts,
    carry, xs); the trace gives region ops the counts under their old names either way (the
    whole suite also ran on jax 0.11.2: benchmarks/device_rates.py's notes)."""
    from types import SimpleNamespace

    from toast_lab.program._trace import region_params

    class FlatTree:  # the part of jax._src.flattree.FlatTree that region_params reads
        def __init__(self, *groups):
            self.groups = groups

        def unpack(self):
            return tuple((None,) * g for g in self.groups)

    scan = SimpleNamespace(name="scan")
    new = SimpleNamespace(primitive=scan, params={"ft_in": FlatTree(2, 1, 3), "length": 4})
    assert region_params(new) == {"ft_in": new.params["ft_in"], "length": 4,
                                  "num_consts": 2, "num_carry": 1}
    old = SimpleNamespace(primitive=scan, params={"num_consts": 0, "num_carry": 2})
    assert region_params(old) is old.params
    # and a scan traced on this JAX keeps its counts
    prog = tl.trace(lambda c, xs: jax.lax.scan(lambda c, x: (c + x, c), c, xs),
                    jnp.zeros(3), jnp.zeros((5, 3)))
    (op,) = [op for op in prog.ops if op.primitive == "scan"]
    assert (op.params["num_consts"], op.params["num_carry"]) == (0, 1)
