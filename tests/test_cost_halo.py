"""Halo exchanges: a convolution whose result shards a windowed dim takes the rows its windows
need from its neighbours' shards by collective-permute (cost/_kernel._halo_exchange), checked
against what XLA compiles on 8 simulated CPU devices (mesh data=4 x model=2)."""

import jax
import jax.numpy as jnp
import pytest

import toast_lab as tl
from toast_lab.cost import CostModel
from toast_lab.verification import read_compiled, summarize_collectives

from tests.cost_patterns import HALO_EXCHANGE, patterns_charged

MESH = tl.Mesh({"data": 4, "model": 2}, device="cpu")
BATCH = 6  # no kernel's first dim: _rows_sharded finds activations by it


def _step(k, stride, padding, groups=1, grad=True):
    """A convolution over NHWC with a k x k window, and (grad) its input and kernel gradients
    of a sum of squares: the forward, the input gradient (a convolution with the input dilated
    where the stride is not 1) and the kernel gradient."""

    def conv(x, w):
        return jax.lax.conv_general_dilated(
            x, w, (stride, stride), padding, dimension_numbers=("NHWC", "HWIO", "NHWC"),
            feature_group_count=groups)

    def step(x, w):
        return jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))(x, w)

    return step if grad else conv


def _rows_sharded(an, axes_of_dim):
    """The plan that shards, on every activation ([BATCH, H, W, C] values), dim d's class over
    axes_of_dim[d]: the input's, the result's and their gradients' rows and columns."""
    plan = tl.Plan.replicated(an)
    done = set()
    for v, value in enumerate(an.program.values):
        if value.ndim != 4 or value.shape[0] != BATCH:
            continue
        for d, axes in axes_of_dim.items():
            c = an.value_classes[v][d]
            if c >= 0 and c not in done:
                done.add(c)
                plan = plan.with_axes(an.classes[c].name, axes)
    return plan


def _permutes(fn, args, plan):
    """(XLA's, the estimate's) collective-permutes: {axes: (count, bytes per device)}."""
    jm = MESH.jax_mesh()
    stats = read_compiled(plan.jit(fn, jm).lower(*args).compile(), jm)
    measured = {axes: (t.count, t.bytes) for (kind, axes), t in
                summarize_collectives(stats.collectives).items() if kind == "collective-permute"}
    est = tl.estimate(plan.analysis, plan, MESH)
    estimated = {axes: (c.count, c.bytes) for (kind, axes), c in est.collectives.items()
                 if kind == "collective-permute"}
    return measured, estimated


def _total(permutes):
    return tuple(sum(x) for x in zip(*permutes.values()))


@pytest.mark.parametrize("size, k, stride, padding, axes", [
    (16, 3, 1, "SAME", ("data",)),
    (16, 3, 2, "SAME", ("model",)),
    (16, 2, 2, "VALID", ("data",)),    # windows that tile the rows: nothing to exchange
    (34, 3, 1, "VALID", ("model",)),   # 34 rows in, 32 out: shards of 17 and 16
    (32, 7, 2, "SAME", ("data", "model")),
    (8, 5, 1, "SAME", ("data", "model")),  # a 2-row halo over 1-row shards: two hops a side
])
@pytest.mark.parametrize("grad", [False, True], ids=["forward", "step"])
def test_a_convolution_sharded_on_its_rows_exchanges_halos_as_xla_does(
        size, k, stride, padding, axes, grad):
    """Height sharded on the input, the result and (step) their gradients: XLA gathers the
    input whole (plan.jit's constraint: the window needs it), slices it like the result and
    exchanges halos with each neighbour: the permutes' count and bytes agree exactly."""
    fn = _step(k, stride, padding, grad=grad)
    args = (jax.ShapeDtypeStruct((BATCH, size, 6, 4), jnp.float32),
            jax.ShapeDtypeStruct((k, k, 4, 8), jnp.float32))
    an = tl.analyze(tl.trace(fn, *args))
    plan = _rows_sharded(an, {1: axes})
    measured, estimated = _permutes(fn, args, plan)
    if size // 8 < k // 2:
        # Halos beyond the next shard come in two hops; the second one's pairs (shard j to
        # j + 2 over data x model) keep their model index, and the verification names its axes
        # ("data",). The model charges every hop over the result's axes: compare the totals.
        assert _total(estimated) == _total(measured)
    else:
        assert estimated == measured
    assert bool(measured) == (k != stride)
    assert patterns_charged(plan, MESH, "conv_general_dilated", "collective-permute") == (
        {HALO_EXCHANGE} if k != stride else set())


def test_a_3x3_convolution_sends_one_row_each_way():
    """The rule by hand: 3x3, SAME, stride 1, rows over data=4: each device sends one row of
    its [6, 4, 6, 4] input shard to each neighbour, two permutes of 6 x 1 x 6 x 4 floats;
    stride 2 (SAME pads only the bottom row) needs one row from the right only."""
    for stride, permutes in ((1, 2), (2, 1)):
        fn = _step(3, stride, "SAME", grad=False)
        args = (jax.ShapeDtypeStruct((BATCH, 16, 6, 4), jnp.float32),
                jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32))
        an = tl.analyze(tl.trace(fn, *args))
        measured, estimated = _permutes(fn, args, _rows_sharded(an, {1: ("data",)}))
        assert measured == estimated == {("data",): (permutes, permutes * BATCH * 6 * 4 * 4)}


@pytest.mark.parametrize("k, stride", [(3, 1), (3, 2), (5, 1)])
@pytest.mark.parametrize("spec", [{1: ("data",), 2: ("model",)}, {0: ("model",), 1: ("data",)},
                                  {1: ("data",), 3: ("model",)}],
                         ids=["rows-cols", "batch-rows", "rows-features"])
def test_halos_of_two_sharded_dims_and_of_a_sharded_batch_or_contraction(k, stride, spec):
    """Rows on data with columns, the batch or the features on model: the column halo spans
    the rows with their halos (XLA exchanges one dim after the other), the batch and the
    contracted features divide the rows sent."""
    fn = _step(k, stride, "SAME")
    args = (jax.ShapeDtypeStruct((4, 16, 16, 8), jnp.float32),
            jax.ShapeDtypeStruct((k, k, 8, 8), jnp.float32))
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.Plan.replicated(an)
    done = set()
    for v, value in enumerate(an.program.values):
        if value.ndim == 4 and value.shape[0] == 4:
            for d, axes in spec.items():
                c = an.value_classes[v][d]
                if c >= 0 and c not in done:
                    done.add(c)
                    plan = plan.with_axes(an.classes[c].name, axes)
    measured, estimated = _permutes(fn, args, plan)
    assert measured and estimated == measured


def test_rows_on_the_axis_of_the_contraction_stay_whole():
    """Features contracted over model, result rows on model too (a random plan's collision;
    VALID rows keep the input's rows a class apart) and columns on data: XLA's dot handler
    partitions the contraction over model first, so the rows stay whole within each group
    and only the columns exchange halos, of [4, 18, 1, 4] (haiku-resnet random0)."""
    def fn(x, w):
        return jax.lax.conv_general_dilated(x, w, (1, 1), ((0, 0), (1, 1)),
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    args = (jax.ShapeDtypeStruct((4, 18, 16, 8), jnp.float32),
            jax.ShapeDtypeStruct((3, 3, 8, 8), jnp.float32))
    an = tl.analyze(tl.trace(fn, *args))
    plan = (tl.Plan.replicated(an).with_axes("x[3]", ("model",)).with_axes("x[2]", ("data",))
            .with_axes("conv_general_dilated[1]", ("model",)))
    measured, estimated = _permutes(fn, args, plan)
    assert measured == estimated == {("data",): (2, 2 * 4 * 18 * 1 * 4 * 4)}


@pytest.mark.parametrize("k, stride, padding", [(4, 4, "VALID"), (4, 1, "SAME")])
@pytest.mark.parametrize("axis", ["model", "data"])
def test_a_kernel_gradient_sharded_on_the_kernels_rows(k, stride, padding, axis):
    """An SGD step with the kernel's rows sharded: the kernel gradient is a convolution of
    the input with the output gradient as its window (16 rows of input, 4 windows). Over
    model=2 XLA exchanges halos of 6 of each shard's 8 rows; over data=4 the halos (9 rows)
    reach past the next shard and cover every shard, and XLA computes the gradient from the
    whole input instead: no permutes."""
    def conv(x, w):
        return jax.lax.conv_general_dilated(x, w, (stride, stride), padding,
                                            dimension_numbers=("NHWC", "HWIO", "NHWC"))

    def fn(x, w):
        gx, gw = jax.grad(lambda x, w: jnp.sum(conv(x, w) ** 2), argnums=(0, 1))(x, w)
        return gx, w - 0.1 * gw

    args = (jax.ShapeDtypeStruct((4, 16, 16, 8), jnp.float32),
            jax.ShapeDtypeStruct((k, k, 8, 8), jnp.float32))
    an = tl.analyze(tl.trace(fn, *args))
    measured, estimated = _permutes(fn, args, tl.Plan.replicated(an).with_axes("w[0]", (axis,)))
    assert estimated == measured
    assert bool(measured) == (axis == "model")


def test_a_grouped_convolution_exchanges_no_halos():
    """Two groups: XLA's convolution handler gives up on halos once features are split by
    group, and the model charges none (it gathers instead)."""
    fn = _step(3, 1, "SAME", groups=2)
    args = (jax.ShapeDtypeStruct((BATCH, 16, 6, 4), jnp.float32),
            jax.ShapeDtypeStruct((3, 3, 2, 8), jnp.float32))
    an = tl.analyze(tl.trace(fn, *args))
    measured, estimated = _permutes(fn, args, _rows_sharded(an, {1: ("data",)}))
    assert measured == estimated == {}


def test_halo_permutes_are_the_convolutions_own():
    """CostModel.op_collectives puts each halo exchange at its convolution, on its input
    (operand 0), over the axes of the result's rows; they add up to the estimate's."""
    fn = _step(3, 1, "SAME")
    args = (jax.ShapeDtypeStruct((BATCH, 16, 6, 4), jnp.float32),
            jax.ShapeDtypeStruct((3, 3, 4, 8), jnp.float32))
    an = tl.analyze(tl.trace(fn, *args))
    plan = _rows_sharded(an, {1: ("data",)})
    per_op = CostModel(an, MESH).op_collectives(plan)
    permutes = [(o, c) for o, cs in per_op.items() for c in cs
                if c.kind == "collective-permute"]
    assert permutes
    for o, c in permutes:
        assert an.program.ops[o].primitive == "conv_general_dilated"
        assert c.operand == 0 and c.axes == ("data",)
    est = tl.estimate(an, plan, MESH).collectives[("collective-permute", ("data",))]
    assert sum(c.count for _, c in permutes) == est.count
    assert sum(c.bytes for _, c in permutes) == pytest.approx(est.bytes)
