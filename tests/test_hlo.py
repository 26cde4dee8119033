"""Reading collectives, memory and flops from what XLA compiled (DESIGN.md §9).

Unit tests read hand-written HLO in tests/data/hlo/, one file per syntax; integration tests
compile real sharded programs on the 8 simulated CPU devices that conftest.py sets up.
"""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from toast_lab import Mesh
from toast_lab.verification import (
    Collective,
    CollectiveTotal,
    CompiledStats,
    parse_collectives,
    read_compiled,
    summarize_collectives,
)

DATA = pathlib.Path(__file__).parent / "data" / "hlo"
GRID_4x2 = np.arange(8).reshape(4, 2)
AXES_4x2 = ("data", "model")


def parse(filename, grid=GRID_4x2, axes=AXES_4x2):
    collectives = parse_collectives((DATA / filename).read_text(), grid, axes)
    return {c.name: c for c in collectives}


# --- the three replica-group syntaxes --------------------------------------------------------


def test_explicit_replica_groups():
    found = parse("explicit_groups.txt")
    model = found["over-model"]
    assert model.kind == "all-reduce"
    assert model.computation == "main"
    assert model.groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert model.group_size == 2
    assert model.axes == ("model",)
    assert model.operand_bytes == model.result_bytes == 8 * 16 * 4
    assert model.dtypes == ("f32",) and model.dtype == "f32"
    assert model.channel_id == 1
    assert model.op_name == "jit(f)/psum"
    assert model.multiplier == 1
    assert found["over-data"].axes == ("data",)
    assert found["over-both"].axes == ("data", "model")
    assert found["everyone"].groups == (tuple(range(8)),)  # replica_groups={} is everyone
    assert found["everyone"].axes == ("data", "model")
    assert found["half-of-data"].axes == ()  # two of the four devices along "data"
    assert found["half-of-data"].group_size == 2
    assert found["alone"].axes == () and found["alone"].group_size == 1


def test_iota_replica_groups():
    found = parse("iota_groups.txt")
    # [2,4]<=[4,2]T(1,0): iota(8).reshape(4,2).T -> {0,2,4,6}, {1,3,5,7}
    assert found["transposed"].groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert found["transposed"].axes == ("data",)
    # [4,2]<=[8]: iota(8).reshape(4,2) -> {0,1}, {2,3}, ...
    assert found["plain"].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found["plain"].axes == ("model",)
    assert found["all"].axes == ("data", "model")
    gathered = found["gathered"]
    assert gathered.kind == "all-gather" and gathered.axes == ("data",)
    assert gathered.dimensions == (0,)
    assert gathered.operand_bytes == 8 * 16 * 2 and gathered.result_bytes == 32 * 16 * 2
    assert gathered.dtypes == ("bf16",)


def test_mesh_axes_replica_groups():
    found = parse("mesh_groups.txt")
    assert found["minor"].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found["minor"].axes == ("model",)
    assert found["minor"].dimensions == (1,)
    # XLA's own mesh may carry size-1 axes that the user's mesh does not have.
    assert found["major"].groups == ((0, 2, 4, 6), (1, 3, 5, 7))
    assert found["major"].axes == ("data",)
    # device_ids=([4,2]T(1,0)) reorders devices: mesh axis_1 is then the user's "model".
    assert found["reordered"].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found["reordered"].axes == ("model",)
    # An explicit device list: 'x' pairs ids 0 and 1 of the list order (0,2,4,6,1,3,5,7).
    assert found["listed-ids"].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found["listed-ids"].axes == ("model",)
    assert found["both"].groups == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert found["unquoted"].axes == ("data",)
    assert found["none"].group_size == 1 and found["none"].axes == ()


def test_mesh_sub_axes():
    # 'a':(1)2 is the major factor 2 of a=8; 'a':(2)4 the minor 4; 'a':(2)2 the middle 2.
    found = parse("mesh_groups.txt")
    assert found["sub-major"].groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert found["sub-minor"].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert found["sub-middle"].groups == ((0, 2), (1, 3), (4, 6), (5, 7))
    # On a (2, 4) user mesh the major sub-axis is "x" and the minor one "y".
    on_2x4 = parse("mesh_groups.txt", np.arange(8).reshape(2, 4), ("x", "y"))
    assert on_2x4["sub-major"].axes == ("x",)
    assert on_2x4["sub-minor"].axes == ("y",)
    assert on_2x4["sub-middle"].axes == ()  # half of "y"
    on_2x2x2 = parse("mesh_groups.txt", np.arange(8).reshape(2, 2, 2), ("a", "b", "c"))
    assert on_2x2x2["sub-middle"].axes == ("b",)
    assert on_2x2x2["sub-minor"].axes == ("b", "c")


def test_unreadable_replica_groups_say_so():
    text = (DATA / "explicit_groups.txt").read_text().replace(
        "replica_groups={{0,1},{2,3},{4,5},{6,7}}", "replica_groups=<something new>"
    )
    with pytest.raises(ValueError, match="(?s)Cannot read the replica_groups.*something new"):
        parse_collectives(text, GRID_4x2, AXES_4x2)
    bad_axis = "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_9'}"
    text = (DATA / "mesh_groups.txt").read_text()
    text = text.replace("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_1'}", bad_axis)
    with pytest.raises(ValueError, match="mesh axis 'axis_9'"):
        parse_collectives(text, GRID_4x2, AXES_4x2)


def test_grid_and_axis_names_must_agree():
    text = (DATA / "explicit_groups.txt").read_text()
    with pytest.raises(ValueError, match="2 dimensions.*3 axis names"):
        parse_collectives(text, GRID_4x2, ("a", "b", "c"))
    with pytest.raises(ValueError, match="repeats device ids"):
        parse_collectives(text, np.zeros((4, 2), int), AXES_4x2)


# --- ops, shapes, loops -------------------------------------------------------------------------


def test_async_pairs_count_once_at_the_start():
    collectives = parse_collectives((DATA / "async_pairs.txt").read_text(), GRID_4x2, AXES_4x2)
    assert [c.name for c in collectives] == [
        "all-gather-start",
        "all-reduce-start",
        "collective-permute-start",
    ]
    gather, reduce, permute = collectives
    assert gather.kind == "all-gather" and gather.axes == ("data",)
    assert gather.operand_bytes == 4 * 16 * 2 and gather.result_bytes == 16 * 16 * 2
    assert gather.bytes == 16 * 16 * 2  # all-gather is priced by its result
    assert reduce.kind == "all-reduce" and reduce.axes == ("model",)
    assert reduce.operand_bytes == reduce.result_bytes == 4096
    assert permute.kind == "collective-permute"
    assert permute.groups == () and permute.group_size == 0
    assert permute.pairs[:2] == ((0, 1), (1, 0))
    assert permute.axes == ("model",)
    assert permute.operand_bytes == permute.result_bytes == 4 * 16 * 2


def test_async_start_without_its_done():
    text = "\n".join(
        line
        for line in (DATA / "async_pairs.txt").read_text().splitlines()
        if "-done" not in line
    )
    found = {c.name: c for c in parse_collectives(text, GRID_4x2, AXES_4x2)}
    assert found["all-gather-start"].result_bytes == 16 * 16 * 2
    assert found["collective-permute-start"].result_bytes == 4 * 16 * 2


def test_collective_permute_forms():
    # a shard_map's ring shift in a scan (async, in a loop of 3), an in-place permute (it
    # sends its first operand; the output buffer and offsets are not sent) and a combined
    # one (it sends every operand)
    found = parse("permute_forms.txt")
    assert sorted(found) == ["combined", "in-place", "shift-start"]
    shift = found["shift-start"]
    assert shift.kind == "collective-permute" and shift.axes == ("data",)
    assert (shift.bytes, shift.multiplier, shift.total_bytes) == (128, 3, 384)
    assert found["in-place"].bytes == 8 * 4 * 4 and found["in-place"].axes == ("model",)
    assert found["combined"].bytes == 8 * 4 * 4 + 2 * 4 * 2
    assert found["combined"].dtypes == ("f32", "bf16")
    totals = summarize_collectives(found.values())
    assert totals[("collective-permute", ("data",))] == CollectiveTotal(3, 384)
    assert totals[("collective-permute", ("model",))] == CollectiveTotal(2, 128 + 144)


def test_async_wrapper_computations():
    # A generic async-start runs the collective inside its computation: count that one, at the
    # loop's multiplier, once (async-update / async-done name the computation again). A sugared
    # all-to-all-start stands for the op it wraps: count the start, not the wrapped op too.
    collectives = parse_collectives((DATA / "async_wrapped.txt").read_text(), GRID_4x2, AXES_4x2)
    assert [(c.name, c.kind, c.multiplier) for c in collectives] == [
        ("wrapped-reduce-scatter", "reduce-scatter", 4),
        ("all-to-all-start", "all-to-all", 4),
    ]
    scatter, exchange = collectives
    assert scatter.computation == "async_reduce_scatter" and scatter.axes == ("data",)
    assert scatter.operand_bytes == 8 * 16 * 4 and scatter.result_bytes == 2 * 16 * 4
    assert exchange.axes == ("model",) and exchange.result_bytes == 8 * 16 * 4


def test_combined_reductions_and_other_kinds():
    found = parse("combined_reductions.txt")
    grads = found["grads"]
    assert grads.kind == "all-reduce" and grads.axes == ("data",)
    assert grads.operand_bytes == grads.result_bytes == (8 * 16 + 16) * 4
    scattered = found["scattered"]
    assert scattered.kind == "reduce-scatter" and scattered.axes == ("data",)
    assert scattered.operand_bytes == 16 * 8 * 4 and scattered.result_bytes == 4 * 8 * 4
    assert scattered.bytes == scattered.operand_bytes
    assert scattered.dimensions == (0,)
    exchanged = found["exchanged"]
    assert exchanged.kind == "all-to-all" and exchanged.axes == ("model",)
    assert exchanged.operand_bytes == exchanged.result_bytes == 2 * 2 * 4 * 4
    assert found["array-a2a"].dimensions == (1,)


def test_shapes_layouts_and_dtypes():
    found = parse("shapes_and_dtypes.txt", np.arange(2), ("data",))
    assert found["ar-bf16"].operand_bytes == 4 * 8 * 2
    assert found["ag-f8"].operand_bytes == 16 and found["ag-f8"].result_bytes == 32
    assert found["ag-f8"].dtypes == ("f8e4m3fn",)
    assert found["ag-pred"].result_bytes == 20
    assert found["ag-s4"].operand_bytes == 3 and found["ag-s4"].result_bytes == 6
    assert found["ar-c64"].operand_bytes == 3 * 8
    assert found["ar-dynamic"].operand_bytes == 8 * 4  # dynamic dims count at their bound
    assert found["ar-memory-space"].operand_bytes == 128 * 128 * 4
    assert found["mixed"].operand_bytes == 2 + 2 * 8 + 4 * 8 * 2
    assert found["mixed"].dtypes == ("u8", "f64", "bf16")
    assert all(c.axes == ("data",) for c in found.values())


def test_unknown_element_type_is_named():
    text = (DATA / "shapes_and_dtypes.txt").read_text().replace("f8e4m3fn", "f7e9m9")
    with pytest.raises(ValueError, match="Unknown HLO element type 'f7e9m9'"):
        parse_collectives(text, np.arange(2), ("data",))


def test_while_loop_multipliers_nest():
    found = parse("while_loops.txt")
    assert found["top-reduce"].multiplier == 1
    assert found["outer-gather"].multiplier == 5
    assert found["outer-gather"].computation == "outer_body"
    assert found["inner-reduce"].multiplier == 15  # 3 inside 5
    assert found["dynamic-reduce"].multiplier == 1  # no known trip count
    assert found["inner-reduce"].total_bytes == 15 * 32


def test_older_printer_with_inline_operand_shapes():
    collectives = parse_collectives(
        (DATA / "older_printer.txt").read_text(), np.arange(4), ("data",)
    )
    (reduce,) = collectives
    assert reduce.computation == "body"
    assert reduce.multiplier == 7  # escaped backend_config string
    assert reduce.operand_bytes == 64 and reduce.axes == ("data",)


def test_group_modes_follow_channel_id_and_use_global_device_ids():
    # replica_count=2, num_partitions=4: global id = replica * 4 + partition.
    grid = np.arange(8).reshape(2, 4)
    found = parse("group_modes.txt", grid, ("replica", "model"))
    assert found["cross-replica"].groups == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert found["cross-replica"].axes == ("replica",)
    assert found["cross-partition"].groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert found["cross-partition"].axes == ()  # half of "model"
    assert found["cross-replica-and-partition"].groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert found["cross-replica-and-partition"].axes == ("model",)
    assert found["flattened"].axes == ("replica",)
    assert found["permute-partitions"].pairs == ((0, 1), (1, 0), (4, 5), (5, 4))
    assert found["permute-partitions"].axes == ("model",)
    assert found["all-partitions"].groups == (tuple(range(8)),)


def test_snippet_without_module_header_takes_global_ids():
    text = (DATA / "group_modes.txt").read_text().replace(
        "HloModule group_modes, replica_count=2, num_partitions=4", ""
    )
    found = {c.name: c for c in parse_collectives(text, GRID_4x2, AXES_4x2)}
    assert found["cross-replica"].groups == ((0, 1),)
    assert found["all-partitions"].groups == (tuple(range(8)),)


def test_summary_sums_executions_and_bytes():
    collectives = parse_collectives((DATA / "while_loops.txt").read_text(), GRID_4x2, AXES_4x2)
    summary = summarize_collectives(collectives)
    assert summary == {
        ("all-gather", ("data",)): CollectiveTotal(count=5, bytes=5 * 32 * 4),
        ("all-reduce", ("data", "model")): CollectiveTotal(count=1, bytes=32),
        ("all-reduce", ("model",)): CollectiveTotal(count=16, bytes=16 * 32),
    }
    assert list(summary) == sorted(summary)


def test_collective_is_frozen_and_readable():
    (reduce,) = parse_collectives(
        (DATA / "older_printer.txt").read_text(), np.arange(4), ("data",)
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        reduce.multiplier = 2
    assert repr(reduce) == (
        "Collective(all-reduce 'all-reduce' over ('data',), 64 B x7, group_size=4, in 'body')"
    )
    assert isinstance(reduce, Collective)


# --- real programs on 8 simulated CPU devices ---------------------------------------------------


def make_mesh(shape, names):
    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape))


def compile_(fn, *args, in_shardings, out_shardings=None):
    kwargs = {"in_shardings": in_shardings}
    if out_shardings is not None:
        kwargs["out_shardings"] = out_shardings
    return jax.jit(fn, **kwargs).lower(*args).compile()


def loss(w, x):
    return jnp.sum(jnp.tanh(x @ w))


@pytest.mark.parametrize(
    "shape, names, batch_axes",
    [
        ((8,), ("data",), ("data",)),
        ((4, 2), ("data", "model"), ("data",)),
        ((2, 2, 2), ("a", "b", "c"), ("a", "b")),
    ],
)
def test_data_parallel_gradient_all_reduces_over_the_batch_axes(shape, names, batch_axes):
    mesh = make_mesh(shape, names)
    w, x = jnp.ones((16, 8)), jnp.ones((32, 16))
    compiled = compile_(
        jax.grad(loss),
        w,
        x,
        in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P(batch_axes))),
        out_shardings=NamedSharding(mesh, P()),
    )
    stats = read_compiled(compiled, mesh)
    reductions = [c for c in stats.collectives if c.kind == "all-reduce"]
    assert reductions, compiled.as_text()
    assert {c.axes for c in reductions} == {batch_axes}
    assert sum(c.operand_bytes for c in reductions) == 16 * 8 * 4  # the weight gradient
    assert summarize_collectives(stats.collectives)[("all-reduce", batch_axes)].count == 1


def test_sharded_to_replicated_constraint_all_gathers():
    mesh = make_mesh((4, 2), ("data", "model"))
    replicated = NamedSharding(mesh, P())

    def f(x):
        return jax.lax.with_sharding_constraint(x * 2, replicated)

    compiled = compile_(f, jnp.ones((8, 8)), in_shardings=NamedSharding(mesh, P("data", "model")))
    gathers = [c for c in read_compiled(compiled, mesh).collectives if c.kind == "all-gather"]
    assert gathers, compiled.as_text()
    spanned = set()
    for c in gathers:
        spanned |= set(c.axes)
    assert spanned == {"data", "model"}
    assert max(c.result_bytes for c in gathers) == 8 * 8 * 4


def test_psum_scatter_is_a_reduce_scatter():
    mesh = make_mesh((4, 2), ("data", "model"))

    def f(x):
        return jax.lax.psum_scatter(x, "data", scatter_dimension=0, tiled=True)

    fn = jax.shard_map(f, mesh=mesh, in_specs=P(None, "model"), out_specs=P("data", "model"))
    compiled = jax.jit(fn).lower(jnp.ones((16, 8))).compile()
    (scatter,) = [c for c in read_compiled(compiled, mesh).collectives]
    assert scatter.kind == "reduce-scatter"
    assert scatter.axes == ("data",)
    assert scatter.operand_bytes == 16 * 4 * 4 and scatter.result_bytes == 4 * 4 * 4


def test_shard_map_collectives_on_every_axis_set():
    mesh = make_mesh((2, 2, 2), ("a", "b", "c"))
    for axes in [("a",), ("c",), ("a", "b"), ("b", "c"), ("a", "c"), ("a", "b", "c")]:

        def f(x, axes=axes):
            return jax.lax.psum(x, axes)

        fn = jax.shard_map(f, mesh=mesh, in_specs=P(("a", "b", "c")), out_specs=P(("a", "b", "c")))
        compiled = jax.jit(fn).lower(jnp.ones((16, 8))).compile()
        (reduce,) = read_compiled(compiled, mesh).collectives
        assert reduce.axes == axes, reduce.groups


def test_scan_multiplies_collectives_inside_its_body():
    mesh = make_mesh((4, 2), ("data", "model"))
    length = 5

    def f(ws, x):
        def body(carry, w):
            return jnp.tanh(carry @ w), None

        y, _ = jax.lax.scan(body, x, ws)
        return y.sum()

    compiled = compile_(
        jax.grad(f),
        jnp.ones((length, 16, 16)),
        jnp.ones((32, 16)),
        in_shardings=(
            NamedSharding(mesh, P(None, None, "model")),
            NamedSharding(mesh, P("data")),
        ),
    )
    collectives = read_compiled(compiled, mesh).collectives
    in_loop = [c for c in collectives if c.multiplier != 1]
    assert in_loop, compiled.as_text()
    assert {c.multiplier for c in in_loop} == {length}
    assert all(c.axes for c in in_loop)
    assert any(c.kind == "all-reduce" and c.axes == ("data",) for c in in_loop)


def test_device_order_of_the_mesh_is_respected():
    devices = np.array(jax.devices())[::-1].reshape(4, 2)
    mesh = jax.sharding.Mesh(devices, ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    compiled = compile_(
        jax.grad(loss),
        jnp.ones((16, 8)),
        jnp.ones((32, 16)),
        in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))),
        out_shardings=NamedSharding(mesh, P()),
    )
    reductions = [c for c in read_compiled(compiled, mesh).collectives if c.kind == "all-reduce"]
    assert {c.axes for c in reductions} == {("data",)}


def test_read_compiled_memory_and_flops():
    mesh = make_mesh((4, 2), ("data", "model"))
    w, x = jnp.ones((16, 8)), jnp.ones((32, 16))
    compiled = compile_(
        lambda w, x: x @ w,
        w,
        x,
        in_shardings=(NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))),
    )
    stats = read_compiled(compiled, mesh)
    assert isinstance(stats, CompiledStats)
    # memory_analysis() is per device: the replicated w plus a quarter of x in, a quarter out.
    assert stats.argument_bytes == 16 * 8 * 4 + 8 * 16 * 4
    assert stats.output_bytes == 8 * 8 * 4
    assert stats.peak_bytes == (
        stats.argument_bytes + stats.output_bytes + stats.temp_bytes - stats.alias_bytes
    )
    assert stats.flops == 2 * 8 * 16 * 8  # the per-device matmul
    assert stats.bytes_accessed > 0
    assert stats.collectives == ()
    assert "peak_bytes=" in repr(stats)


def test_read_compiled_counts_donated_aliases():
    mesh = make_mesh((8,), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    compiled = (
        jax.jit(lambda x: x + 1, in_shardings=sharding, out_shardings=sharding, donate_argnums=0)
        .lower(jnp.ones((64, 4)))
        .compile()
    )
    stats = read_compiled(compiled, mesh)
    assert stats.alias_bytes == 8 * 4 * 4
    assert stats.peak_bytes == stats.argument_bytes + stats.output_bytes + stats.temp_bytes - (
        8 * 4 * 4
    )


def test_read_compiled_with_a_toast_lab_mesh():
    mesh = Mesh({"data": 4, "model": 2})
    jmesh = mesh.jax_mesh()
    compiled = compile_(
        jax.grad(loss),
        jnp.ones((16, 8)),
        jnp.ones((32, 16)),
        in_shardings=(NamedSharding(jmesh, P()), NamedSharding(jmesh, P("data"))),
        out_shardings=NamedSharding(jmesh, P()),
    )
    assert {c.axes for c in read_compiled(compiled, mesh).collectives} == {("data",)}


class _FakeCompiled:
    """Stands in for older jax, whose cost_analysis() was a list of per-module dicts."""

    def __init__(self, memory, cost, text):
        self._memory, self._cost, self._text = memory, cost, text

    def memory_analysis(self):
        return self._memory

    def cost_analysis(self):
        return self._cost

    def as_text(self):
        return self._text

    def runtime_executable(self):
        raise NotImplementedError


def test_read_compiled_handles_list_cost_analysis_and_missing_memory():
    memory = type(
        "Memory",
        (),
        dict(
            argument_size_in_bytes=10,
            output_size_in_bytes=20,
            temp_size_in_bytes=30,
            alias_size_in_bytes=5,
            generated_code_size_in_bytes=0,
        ),
    )()
    text = (DATA / "explicit_groups.txt").read_text()
    cost = [{"flops": 100.0, "bytes accessed": 8.0}, {"flops": 1.0}]
    stats = read_compiled(_FakeCompiled(memory, cost, text), Mesh({"data": 4, "model": 2}))
    assert stats.flops == 101.0 and stats.bytes_accessed == 8.0
    assert stats.peak_bytes == 55
    assert stats.collective_summary()[("all-reduce", ("model",))] == CollectiveTotal(1, 512)
    with pytest.raises(ValueError, match="does not report memory"):
        read_compiled(_FakeCompiled(None, {}, text), Mesh({"data": 4, "model": 2}))
