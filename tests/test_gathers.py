"""All-gathers priced the way XLA's SPMD partitioner emits them
(toast_lab/cost/_shared_reads.py, gather_sources; the shared reads of _kernel.evaluate_types)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.cost import cost_model
from toast_lab.cost._model import CostModel
from toast_lab.plan._export import constraint_values
from toast_lab.verification import read_compiled, summarize_collectives

from tests.cost_patterns import (ALL_TO_ALL, COMPATIBLE_GATHER, COMPATIBLE_SLICE, FULL_REMAT,
                                 GATHER, OPERAND_PASSTHROUGH, PARTIAL_SUMS, REGROUPED_INDICES,
                                 ROW_GATHER, UPDATES_KEEP_SHARDING,
                                 patterns_charged)

MESH = tl.Mesh({"data": 4, "model": 2}, device="cpu")


@functools.cache
def cnn():
    fn, args = tl.zoo.get("cnn")
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _plan(an, name: str) -> tl.Plan:
    p = tl.Plan.replicated(an)
    if name == "fsdp":  # the kernels sharded on their input channels over every device
        return p.with_axes("batch", ("data", "model")).with_axes("channels(blocks/0)",
                                                                  ("data", "model"))
    # MaxText-like: the parameters' channels on "data" only (an override), gathered to the
    # compute domain's sharding, which keeps "model" on the output channels
    return (p.with_axes("batch", ("data",))
            .with_axes("channels(blocks/0)", ("data",), domain="parameters")
            .with_axes("channels(blocks/1)", ("model",)))


def _gathered(an, plan) -> dict[int, float]:
    """{op id: the all-gather bytes the model charges at it}, for the ops that pay any."""
    found = cost_model(an, MESH).op_collectives(plan)
    out = {n: sum(c.bytes for c in cs if c.kind == "all-gather") for n, cs in found.items()}
    return {n: b for n, b in out.items() if b}


def _xla_bytes(fn, args, plan, kind: str | None = None) -> dict:
    """{(kind, axes): bytes} of the collectives XLA compiles for `plan` (of `kind` only)."""
    jm = MESH.jax_mesh()
    stats = read_compiled(plan.jit(fn, jm).lower(*args).compile(), jm)
    return {k: v.bytes for k, v in summarize_collectives(stats.collectives).items()
            if kind in (None, k[0])}


def _model_bytes(an, plan, kind: str | None = None) -> dict:
    """{(kind, axes): bytes} the cost model charges for `plan` (of `kind` only; none of 0)."""
    return {k: c.bytes for k, c in tl.estimate(an, plan, MESH).collectives.items()
            if c.bytes and kind in (None, k[0])}


def _kernel_gathers(an, plan) -> list[tuple[float, float]]:
    """Per convolution kernel: the all-gather bytes charged at its forward convolution and at
    its input gradient's (the convolution that reads it through `rev`)."""
    prog = an.program
    gathered = _gathered(an, plan)
    out = []
    for op in prog.ops:
        if op.primitive != "rev" or prog.values[op.operands[0]].ndim != 4:
            continue
        w, r = op.operands[0], op.results[0]
        forward = [n for n in prog.users(w) if prog.ops[n].primitive == "conv_general_dilated"]
        backward = [n for n in prog.users(r) if prog.ops[n].primitive == "conv_general_dilated"]
        out.append((sum(gathered.get(n, 0.0) for n in forward),
                    sum(gathered.get(n, 0.0) for n in backward)))
    return out


def _parameters(an) -> list[int]:
    prog = an.program
    leaves = prog.in_tree.children()[0].children()[0].num_leaves  # the first argument
    return list(prog.inputs[:leaves])


def test_a_kernel_read_through_rev_is_gathered_once_for_forward_and_backward():
    """A convolution's input gradient reads its kernel through `rev`. XLA gathers the kernel
    once, before the reverse, and the forward and backward convolutions share it: each sharded
    parameter's bytes are charged once, and nothing at the backward convolutions."""
    _, _, an = cnn()
    plan = _plan(an, "fsdp")
    prog = an.program
    kernels = _kernel_gathers(an, plan)
    assert any(forward for forward, _ in kernels) and not any(back for _, back in kernels)
    sharded = [v for v in _parameters(an) if any(plan.value_axes(v))]
    assert any(prog.values[v].ndim == 4 for v in sharded), "no kernel is sharded"
    est = tl.estimate(an, plan, MESH)
    gathered = sum(c.bytes for (kind, _), c in est.collectives.items() if kind == "all-gather")
    assert gathered == sum(prog.values[v].nbytes for v in sharded)


def test_a_reversed_kernel_holds_a_buffer_of_its_own():
    """XLA writes `reverse(all-gather(w))` out: the input gradient's kernel is a buffer apart
    from the gathered kernel, though the gather is shared. The reads through `rev` say so
    (copy_of); under FSDP, XLA:CPU reverses each kernel as soon as it is gathered, so the
    temporaries hold every reversed kernel at once, on top of what they hold with the reads
    taken as reads of the gathered kernel itself (checked against XLA in test_cost.py,
    breadth-first schedule, cnn fsdp)."""
    _, _, an = cnn()
    prog = an.program
    revs = {op.results[0] for op in prog.ops
            if op.primitive == "rev" and prog.values[op.operands[0]].ndim == 4}
    model = CostModel(an, MESH)
    through = [r for r in model.ty.tables.shared_reads if r["copy_of"] >= 0]
    assert through and {int(r["copy_of"]) for r in through} == revs
    assert all(r["nbytes"] == prog.values[int(r["copy_of"])].nbytes for r in through)
    plan = tl.strategies.expert(an, MESH)["fsdp"]  # every kernel sharded over every device
    with_copies = model.estimate(plan).temp_bytes
    model.ty.tables.shared_reads["copy_of"] = -1  # a fresh model, not the shared one
    without = model.estimate(plan).temp_bytes
    assert with_copies - without == sum(prog.values[v].nbytes for v in revs)


def test_a_pinned_rev_is_gathered_apart_under_overrides():
    """With per-domain overrides plan.jit pins the values on domain boundaries: `rev(w)`, read
    by the compute domain's convolution, keeps the parameter's sharding, and XLA gathers it
    after the reverse, apart from the forward's gather of w."""
    _, _, an = cnn()
    plan = _plan(an, "override")
    kernels = _kernel_gathers(an, plan)
    assert any(forward for forward, _ in kernels)
    assert all(back == forward for forward, back in kernels)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fsdp", "override"])
def test_kernel_gathers_agree_with_xla(name):
    fn, args, an = cnn()
    plan = _plan(an, name)
    assert _model_bytes(an, plan, "all-gather") == \
        pytest.approx(_xla_bytes(fn, args, plan, "all-gather"))


# A segment_sum of messages [E, D] into N segments, its sums [N, D] constrained by the plan (a
# reduction's result): the GNN's aggregation. Classes: "x[0]" edges, "w[1]" features (of the
# messages and of the sums), "broadcast_in_dim[0]" segments.
FEATURES, HIDDEN = 16, 32



def _embedding_gradient(name: str, plan_name: str):
    """(step, args, analysis, plan) of a training step whose embedding table's gradient is a
    combining scatter contested on its pass-through dim: the table's embed dim sharded (FSDP)
    over axes that also shard the token gradients' batch (or sequence) dims."""
    if name == "gpt":
        fn, _ = tl.zoo.get("gpt")
        args = tl.zoo.sample("gpt")
    else:
        from tests.third_party.models import BUILDERS

        pytest.importorskip(BUILDERS[name][1])
        fn, args = BUILDERS[name][0]()
    an = tl.analyze(tl.trace(fn, *args))
    return fn, args, an, tl.strategies.expert(an, MESH)[plan_name]


def _total(charged: dict, *kinds: str) -> float:
    return sum(b for (kind, _), b in charged.items() if kind in kinds)


@pytest.mark.slow
@pytest.mark.parametrize("name, plan_name", [
    ("gpt", "fsdp"),  # a vocabulary larger than the token gradients
    ("linen", "fsdp"),  # a vocabulary of 64 rows: smaller than the token gradients
    ("keras", "fsdp+tp+sp"),  # the token gradients' batch moves, their sequence stays summed
])
def test_an_fsdp_embedding_gradient_is_partitioned_the_way_xla_picks(name, plan_name):
    """XLA orders a scatter's partitioning methods by a dry run of each, memory first
    (EvaluatePartitionCost): moving the token gradients to the table's sharding (an
    all-to-all) costs two shards of them, which beats scattering into a whole table even when
    the table is smaller than the token gradients. The model picks the same method: its
    all-to-all bytes are XLA's, and no reduce-scatter of the table is charged instead (XLA:CPU
    writes a reduce-scatter as an all-reduce)."""
    fn, args, an, plan = _embedding_gradient(name, plan_name)
    measured, charged = _xla_bytes(fn, args, plan), _model_bytes(an, plan)
    assert _total(measured, "all-to-all") > 0, measured
    assert _total(charged, "all-to-all") == _total(measured, "all-to-all")
    assert _total(charged, "all-reduce", "reduce-scatter") == \
        pytest.approx(_total(measured, "all-reduce"), rel=0.1)
    # the token gradients' all-to-all and the indices' all-gather: operand passthrough
    assert patterns_charged(plan, MESH, "scatter-add", "all-to-all") == {OPERAND_PASSTHROUGH}
    assert OPERAND_PASSTHROUGH in patterns_charged(plan, MESH, "scatter-add", "all-gather")

def _by_kind(collectives: dict) -> dict:
    """{kind: bytes} of {(kind, axes): bytes}; a reduce-scatter counted as the all-reduce
    XLA:CPU writes for it."""
    out: dict = {}
    for (kind, _), b in collectives.items():
        kind = "all-reduce" if kind == "reduce-scatter" else kind
        out[kind] = out.get(kind, 0.0) + b
    return {k: b for k, b in out.items() if b}


@functools.cache
def table_gradient(vocab: int):
    """A table plus its gradient: the tokens' gradients (8 x 32 x 64, f32) scattered into the
    rows of a zero table, as the gradient of an embedding lookup is."""
    def step(table, tokens, updates):
        return table + jnp.zeros_like(table).at[tokens].add(updates)

    rng = np.random.default_rng(0)
    args = (np.zeros((vocab, 64), np.float32), rng.integers(0, vocab, (8, 32)).astype(np.int32),
            rng.normal(size=(8, 32, 64)).astype(np.float32))
    return step, args, tl.analyze(tl.trace(step, *args))


# (mesh data x model, vocabulary, the tokens' and the table's embed axis, the vocabulary's)
REGROUP_CASES = {
    # FSDP x TP: the tokens' 1/4 shard permuted and all-gathered to 1/2, each group's table
    # whole but for data and all-reduced over model (index passthrough)
    "fsdp_tp": ((4, 2), 256, "data", "model"),
    # a larger vocabulary: the group's rows split over model instead, its indices gathered
    "fsdp_tp_large_vocabulary": ((4, 2), 1024, "data", "model"),
    # the vocabulary replicated: index passthrough is the group's only method
    "fsdp_only": ((4, 2), 1024, "data", None),
    # more replicated ways than groups: the indices keep their tiling, permuted, then gathered
    "tokens_on_model": ((4, 2), 256, "model", "data"),
    "wide_model_axis": ((2, 4), 256, "data", "model"),
    # partitioning by the vocabulary first is cheaper: the indices are gathered whole over
    # data, nothing is permuted
    "vocabulary_first": ((2, 4), 2048, "data", "model"),
}


@pytest.mark.parametrize("case", list(REGROUP_CASES))
def test_a_table_gradient_after_operand_passthrough_is_partitioned_as_xla_regroups_it(case):
    """After moving the token gradients to the table's embed sharding (operand passthrough),
    XLA partitions each group of devices that share an embed shard again: the tokens regrouped
    over the replicated axes (a collective-permute of their shard, an all-gather where it
    borrows their own ways), then the table's rows split over the vocabulary's axes or its
    copy all-reduced, whichever its dry run finds smaller (_kernel._regrouped_indices). Every
    kind's bytes are XLA's."""
    (data, model), vocab, embed, rows = REGROUP_CASES[case]
    mesh = tl.Mesh({"data": data, "model": model}, device="cpu")
    fn, args, an = table_gradient(vocab)
    plan = (tl.Plan.replicated(an).with_axes("tokens[0]", (embed,))
            .with_axes("table[1]", (embed,)))
    if rows:
        plan = plan.with_axes("table[0]", (rows,))
    jm = mesh.jax_mesh()
    stats = read_compiled(plan.jit(fn, jm).lower(*args).compile(), jm)
    measured = _by_kind({k: v.bytes for k, v in summarize_collectives(stats.collectives).items()})
    charged = _by_kind({k: c.bytes for k, c in tl.estimate(an, plan, mesh).collectives.items()})
    assert charged == pytest.approx(measured), (charged, measured)
    permuted = "collective-permute" in measured
    assert permuted == (case != "vocabulary_first")
    # the token gradients moved to the table's embed sharding (operand passthrough), then the
    # indices regrouped, but where the vocabulary's axes partition the group first
    assert patterns_charged(plan, mesh, "scatter-add") == (
        {OPERAND_PASSTHROUGH, REGROUPED_INDICES} if permuted else {OPERAND_PASSTHROUGH})


@functools.cache
def row_gather():
    """Rows of a table picked by indices (a GNN's messages from their nodes' features)."""
    def step(x, idx):
        return jnp.tanh(x[idx])

    rng = np.random.default_rng(0)
    args = (rng.normal(size=(64, 32)).astype(np.float32),
            rng.integers(0, 64, 256).astype(np.int32))
    return step, args, tl.analyze(tl.trace(step, *args))


# (mesh data x model, the table rows' axis, the picked rows' features' axes): the rows decided
# first, so the table keeps them and its features stay whole
ROW_GATHER_CASES = {
    "features_on_the_rows_axis": ((4, 2), "data", ("data",)),     # 1/2 reduced, 1/4 moved
    "fewer_row_ways": ((4, 2), "model", ("model",)),             # 1/2 and 1/2
    "wide_model_axis": ((2, 4), "data", ("data",)),               # 1/2 and 1/2
    "features_on_both_axes": ((4, 2), "data", ("data", "model")),  # 1/2 and 1/8
    "features_on_the_other_axis": ((4, 2), "data", ("model",)),   # the tile reduced, no move
    "rows_on_model": ((4, 2), "model", ("data",)),
    # the picked rows sharded like the indices over data: the all-reduced slice holds the
    # tile, nothing moves
    "indices_on_data": ((4, 2), "model", ("model",), ("data",)),
}


@pytest.mark.parametrize("case", list(ROW_GATHER_CASES))
def test_a_row_gather_reduces_a_slice_and_moves_the_tile_as_xla_does(case):
    """A gather of rows sliced over some axes leaves partial results over them; XLA all-reduces
    a slice of them and, where the result's features hold those axes too, collective-permutes
    each device's tile from the device whose slice has it, never a reduce-scatter
    (_kernel.evaluate_types). Every kind's bytes are XLA's."""
    (data, model), rows, features, *picked = ROW_GATHER_CASES[case]
    mesh = tl.Mesh({"data": data, "model": model}, device="cpu")
    fn, args, an = row_gather()
    plan = tl.Plan.replicated(an).with_axes("x[0]", (rows,)).with_axes("x[1]", features)
    if picked:
        plan = plan.with_axes("idx[0]", picked[0])
    plan = plan.validate(mesh)
    jm = mesh.jax_mesh()
    stats = read_compiled(plan.jit(fn, jm).lower(*args).compile(), jm)
    measured = _by_kind({k: v.bytes for k, v in summarize_collectives(stats.collectives).items()})
    charged = _by_kind({k: c.bytes for k, c in tl.estimate(an, plan, mesh).collectives.items()})
    assert charged == pytest.approx(measured), (charged, measured)
    assert ("collective-permute" in measured) == (rows in features and case != "indices_on_data")
    # the slice-and-move where the result's features hold the rows' axis; elsewhere the
    # gather's partial sums are all-reduced whole
    assert patterns_charged(plan, mesh, "gather") == (
        {ROW_GATHER} if rows in features else {PARTIAL_SUMS})


@functools.cache
def segment_sum(edges: int, segments: int):
    def fn(x, w, ids):
        return jnp.tanh(jax.ops.segment_sum(x @ w, ids, num_segments=segments))

    rng = np.random.default_rng(0)
    args = (rng.normal(size=(edges, FEATURES)).astype(np.float32),
            rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
            rng.integers(0, segments, edges).astype(np.int32))
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _segment_plan(an, segments, features) -> tl.Plan:
    # the segments decided first: they keep an axis both want on the sums
    return (tl.Plan.replicated(an).with_axes("broadcast_in_dim[0]", segments)
            .with_axes("w[1]", features))


SEGMENT_CASES = {
    # more messages than sums: the scatter runs on the messages' sharding and its sums move
    # from features to segments, an all-to-all of their shard
    "all_to_all": ((256, 64), ("data",), ("data",)),
    # ... and where the features also lose "model" (the plan drops it), XLA replicates the
    # sums and slices them: an all-gather of the whole sums
    "rematerialized": ((256, 64), ("data",), ("data", "model")),
    # fewer messages than sums: the sums' sharding wins, the messages are gathered
    "gathered": ((64, 256), ("data", "model"), ("data", "model")),
}


@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_a_segment_sum_moves_the_smaller_of_its_messages_and_sums(case):
    (edges, segments), seg_axes, feature_axes = SEGMENT_CASES[case]
    _, args, an = segment_sum(edges, segments)
    plan = _segment_plan(an, seg_axes, feature_axes)
    sums = segments * HIDDEN * 4
    messages = edges * HIDDEN * 4
    expected = {"all_to_all": {("all-to-all", ("data",)): sums / 4},
                "rematerialized": {("all-gather", ("data", "model")): sums},
                "gathered": {("all-gather", ("data", "model")): messages}}[case]
    assert _model_bytes(an, plan) == expected


@pytest.mark.slow
@pytest.mark.parametrize("case", list(SEGMENT_CASES))
def test_segment_sum_collectives_agree_with_xla(case):
    (edges, segments), seg_axes, feature_axes = SEGMENT_CASES[case]
    fn, args, an = segment_sum(edges, segments)
    plan = _segment_plan(an, seg_axes, feature_axes)
    assert _xla_bytes(fn, args, plan) == pytest.approx(_model_bytes(an, plan))
    # more messages than sums: the scatter keeps the messages' sharding and moves its sums;
    # fewer: the messages are gathered to the sums' sharding
    assert patterns_charged(plan, MESH, "scatter-add") == (
        {GATHER} if case == "gathered" else {UPDATES_KEEP_SHARDING})


@functools.cache
def zoo(name):
    fn, args = tl.zoo.get(name)
    return fn, args, tl.analyze(tl.trace(fn, *args))


def test_a_scan_gathers_its_parameter_stacks_sharded_on_the_scanned_dim_once_per_loop():
    """A scan reads its stacks a slice per iteration: a parameter stack sharded on `layers` is
    all-gathered whole before the loop, by the forward and by the backward scan; stacks the
    forward scan computes (its residuals) are laid out by XLA itself and cost nothing here."""
    _, _, an = zoo("gpt_scan")
    prog = an.program
    plan = tl.Plan.replicated(an).with_axes("layers", ("model",))
    scans = [op for op in prog.ops if op.primitive == "scan"]
    assert len(scans) == 2  # forward and backward
    gathered = _gathered(an, plan)
    parameters = set(_parameters(an))
    for op in scans:
        stacks = op.operands[op.params["num_consts"] + op.params["num_carry"]:]
        expected = sum(prog.values[u].nbytes for u in stacks
                       if u in parameters and plan.value_axes(u)[0] == ("model",))
        assert expected > 0 and gathered[op.id] == expected


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt_scan", "llama"])
def test_scan_stack_gathers_agree_with_xla(name):
    fn, args, an = zoo(name)
    plan = tl.Plan.replicated(an).with_axes("batch", ("data",)).with_axes("layers", ("model",))
    assert _model_bytes(an, plan, "all-gather") == \
        pytest.approx(_xla_bytes(fn, args, plan, "all-gather"))


def _tied_table_plan(an) -> tl.Plan:
    # the tied embedding table's vocab over every device, the activations' embed on "data":
    # the logits gather the table whole, and the input gradient wants it on embed instead
    return (tl.Plan.replicated(an).with_axes("batch", ("model",))
            .with_axes("vocab", ("model", "data")).with_axes("embed", ("data",)))


def test_a_table_gathered_whole_is_sliced_not_moved_for_a_later_read():
    """The input gradient of the tied unembedding wants the table with vocab whole and embed
    on "data": an all-gather over "model" and an all-to-all over "data" from the table's own
    sharding. XLA takes the replicated copy the logits already gathered and slices it: the
    model charges neither, and the table's whole gather once."""
    _, _, an = zoo("gpt_scan")
    plan = _tied_table_plan(an)
    est = tl.estimate(an, plan, MESH)
    assert not any(kind == "all-to-all" for kind, _ in est.collectives)
    whole = est.collectives[("all-gather", ("data", "model"))]
    assert whole.count == 1


@pytest.mark.slow
def test_tied_table_reads_agree_with_xla():
    fn, args, an = zoo("gpt_scan")
    plan = _tied_table_plan(an)
    measured = _xla_bytes(fn, args, plan)
    assert not any(kind == "all-to-all" for kind, _ in measured)
    whole = ("all-gather", ("data", "model"))
    assert _model_bytes(an, plan)[whole] == measured[whole]


def _tied_matmuls(table, h):
    """A table [256, 64] read by two matmuls: logits h @ table^T, then logits @ table (the
    shape of a tied unembedding's input gradient)."""
    logits = jnp.tanh(jnp.einsum("bd,vd->bv", h, table))
    return jnp.tanh(logits @ table)


def test_a_table_gathered_whole_for_one_matmul_is_sliced_for_the_next():
    """The table's vocab on (model, data), h's batch on model and embed on data: the logits'
    matmul wants the table whole (an all-gather over both axes, 64 KiB); the next wants its
    vocab whole and its embed on data, from the table's own sharding a gather over model and
    an all-to-all over data. XLA's partitioner runs neither: that reshard falls back to
    Replicate() ("involuntary full rematerialization"), which finds the replicated copy in its
    reshard cache and slices it (REPLICATED_COPY). The model charges the copy once, at the
    first matmul, and nothing at the second: the pattern saves a charge, so no ledger row
    names it."""
    args = (jax.ShapeDtypeStruct((256, 64), jnp.float32),
            jax.ShapeDtypeStruct((16, 64), jnp.float32))
    an = tl.analyze(tl.trace(_tied_matmuls, *args))
    plan = (tl.Plan.replicated(an).with_axes("h[0]", ("model",))
            .with_axes("table[0]", ("model", "data")).with_axes("table[1]", ("data",)))
    measured = _xla_bytes(_tied_matmuls, args, plan)
    assert measured == {("all-gather", ("data",)): 16 * 64 * 4 / 2,  # h's embed
                        ("all-gather", ("data", "model")): 256 * 64 * 4}  # the table, once
    assert _model_bytes(an, plan) == measured
    prog = an.program
    logits, gradient = (n for n, op in enumerate(prog.ops) if op.primitive == "dot_general")
    charged = cost_model(an, MESH).op_collectives(plan)
    assert {c.operand for c in charged[logits]} == {0, 1}
    assert patterns_charged(plan, MESH, "dot_general") == {GATHER}
    assert gradient not in charged  # sliced from the logits' copy


def test_plan_jit_pins_the_reshapes_it_gathers_at():
    """Llama's GQA reshape splits 4 query heads, sharded over "data" (4 devices), into 2 kv
    heads x 2: the plan gathers there. plan.jit pins the reshape's result, so that XLA does
    not carry the heads' sharding through it on sub-axes; a reshape that keeps its axes is
    left to XLA."""
    _, _, an = zoo("llama")
    plan = tl.strategies.expert(an, MESH)["megatron"]
    prog = an.program
    pinned = constraint_values(plan)
    gathering = [op for op in prog.ops if op.primitive == "reshape"
                 and any(plan.value_axes(op.operands[0]))
                 and not any(plan.value_axes(op.results[0]))]
    assert gathering and all(op.results[0] in pinned for op in gathering)
    kept = [op for op in prog.ops if op.primitive == "reshape" and not op.body
            and plan.value_axes(op.operands[0]) == plan.value_axes(op.results[0])
            and not any(plan.value_axes(op.operands[0]))]
    assert not any(op.results[0] in pinned for op in kept)
    assert constraint_values(plan, "none") == frozenset()


@pytest.mark.slow
def test_gqa_reshape_gathers_agree_with_xla():
    fn, args, an = zoo("llama")
    plan = tl.strategies.expert(an, MESH)["megatron"]
    assert _model_bytes(an, plan, "all-gather") == \
        pytest.approx(_xla_bytes(fn, args, plan, "all-gather"))


@functools.cache
def group_norm_conv():
    """A 1-D convolution, a group norm over (time, channels in a group) and a second
    convolution, differentiated: the group norm reads the [B, T, C] activations as
    [B, T, G, C / G], a reshape that splits the channels' class."""
    groups = 4

    def group_norm(h, g, b):
        n, t, c = h.shape
        hg = h.reshape(n, t, groups, c // groups)
        m = hg.mean(axis=(1, 3), keepdims=True)
        v = hg.var(axis=(1, 3), keepdims=True)
        return ((hg - m) * jax.lax.rsqrt(v + 1e-5)).reshape(n, t, c) * g[None, None] \
            + b[None, None]

    def conv(h, w):
        return jax.lax.conv_general_dilated(h, w, (1,), "SAME",
                                            dimension_numbers=("NWC", "WIO", "NWC"))

    def loss(p, x):
        h = jax.nn.silu(group_norm(conv(x, p["c1"]), p["g"], p["b"]))
        return jnp.mean(conv(h, p["c2"]) ** 2)

    step = jax.grad(loss)
    rng = np.random.default_rng(0)
    params = {"c1": (0.3 * rng.normal(size=(3, 4, 16))).astype(np.float32),
              "g": np.ones(16, np.float32), "b": np.zeros(16, np.float32),
              "c2": (0.3 * rng.normal(size=(3, 16, 8))).astype(np.float32)}
    args = (params, rng.normal(size=(8, 32, 4)).astype(np.float32))
    return step, args, tl.analyze(tl.trace(step, *args))


@pytest.mark.parametrize("axes", [("data", "model"), ("model",)])
def test_plan_jit_pins_the_operand_of_a_reshape_it_slices_at(axes):
    """The group norm's scale and shift shard the channels, the plan leaves its groups whole:
    the normalised [B, T, G, C / G] is computed whole and sliced by the reshape back to
    [B, T, C]. plan.jit pins that operand; unpinned, XLA carried the channels' sharding back
    through the reshape on sub-axes of G and C / G, ran the group norm sharded (0.73 of the
    plan's flops) and gathered its input gradient again for the convolution's backward that
    needs it whole (a 1-D conv autoencoder under Megatron: all-gather bytes 2.0x the
    estimate's). Its result is pinned too, where the plan slices it: unpinned, XLA's
    propagation chose its own sharding for it (haiku-transformer random0's queries: on their
    heads over "model", against the plan, and the attention matmuls moved k to match)."""
    step, args, an = group_norm_conv()
    prog = an.program
    scale = next(v for v in prog.inputs if prog.values[v].name == "p/g")
    plan = tl.Plan.replicated(an).with_axes(an.classes[an.value_classes[scale][0]].name, axes)
    slicing = [op for op in prog.ops if op.primitive == "reshape"
               and any(plan.value_axes(op.results[0]))
               and not any(plan.value_axes(op.operands[0]))]
    pinned = constraint_values(plan)
    assert slicing and all({op.operands[0], op.results[0]} <= pinned for op in slicing)
    jm = MESH.jax_mesh()
    stats = read_compiled(plan.jit(step, jm).lower(*args).compile(), jm)
    xla = {k: v.bytes for k, v in summarize_collectives(stats.collectives).items()}
    assert _model_bytes(an, plan) == pytest.approx(xla, rel=0.05)
    assert tl.estimate(an, plan, MESH).flops == pytest.approx(stats.flops, rel=0.10)


def rotary_halves(x, w):
    """Rotary's rotate-half: the head dim's two halves swapped, one negated."""
    y = jnp.concatenate([-x[..., 8:], x[..., :8]], axis=-1)
    return jnp.tanh(y * w)


def test_plan_jit_pins_the_operands_of_a_concatenate_it_slices_at():
    """The result's head dim (tied to w's) shards over "model"; the halves, computed from x's
    tokens on "data", hold no "model": the plan concatenates them whole there and slices.
    plan.jit pins the halves; unpinned, XLA carried the result's head-dim sharding back into
    the slices and cut them as windows of x, collective-permutes the plan never pays (llama
    random1's rotary: 8 permutes, 60 KiB a step, jax 0.10.2)."""
    rng = np.random.default_rng(0)
    args = tuple(rng.normal(size=(8, 4, 16)).astype(np.float32) for _ in range(2))
    an = tl.analyze(tl.trace(rotary_halves, *args))
    plan = tl.Plan.replicated(an).with_axes("x[0]", ("data",)).with_axes("w[2]", ("model",))
    plan = plan.validate(MESH)
    prog = an.program
    concat = next(op for op in prog.ops if op.primitive == "concatenate")
    assert set(concat.operands) <= constraint_values(plan)
    measured = _xla_bytes(rotary_halves, args, plan)
    assert not any(kind == "collective-permute" for kind, _ in measured), measured
    assert not any(kind == "collective-permute" for kind, _ in _model_bytes(an, plan))


@functools.cache
def conv_kernel_gradient():
    """The kernel gradient of a 3x3 SAME convolution (a conv of the input with the output's
    gradient, the output's height and width its window)."""

    def loss(w, x):
        y = jax.lax.conv_general_dilated(x, w, (1, 1), "SAME",
                                         dimension_numbers=("NHWC", "HWIO", "NHWC"))
        return jnp.sum(jnp.sin(y))

    step = jax.grad(loss)
    rng = np.random.default_rng(0)
    args = ((0.3 * rng.normal(size=(3, 3, 16, 32))).astype(np.float32),
            rng.normal(size=(8, 16, 16, 16)).astype(np.float32))
    return step, args, tl.analyze(tl.trace(step, *args))


def test_a_conv_with_its_width_sharded_gathers_the_output_gradient_for_its_kernel_gradient():
    # plan.jit reads the input's window dims whole; XLA then gathers the output gradient's
    # width too (the kernel gradient's window) instead of summing partial windows: all-gathers
    # over `model`, no all-reduce
    step, args, an = conv_kernel_gradient()
    prog = an.program
    width = an.classes[an.value_classes[prog.inputs[1]][2]].name
    plan = tl.Plan.replicated(an).with_axes(width, ("model",))
    xla = _xla_bytes(step, args, plan)
    model = _model_bytes(an, plan)
    assert not any(k[0] in ("all-reduce", "reduce-scatter") for k in xla), xla
    assert not any(k[0] in ("all-reduce", "reduce-scatter") for k in model), model
    assert model[("all-gather", ("model",))] == pytest.approx(
        xla[("all-gather", ("model",))], rel=0.05)


def test_a_reshard_slices_the_axes_it_adds_before_it_moves_the_others():
    # The kernel gradient's output channels on (model, data), its output gradient's width on
    # model: the gradient is resliced to channels on (model, data) by a local slice over
    # `data` (it is replicated there) and an all-to-all over `model` of that slice, a quarter
    # of what moving the whole shard would (the model charged 131,072 B, XLA moves 32,768 B)
    step, args, an = conv_kernel_gradient()
    prog = an.program
    width = an.classes[an.value_classes[prog.inputs[1]][2]].name
    out_channels = an.classes[an.value_classes[prog.inputs[0]][3]].name
    plan = (tl.Plan.replicated(an).with_axes(width, ("model",))
            .with_axes(out_channels, ("model", "data")))
    xla = _xla_bytes(step, args, plan)
    model = _model_bytes(an, plan)
    for key in [("all-to-all", ("model",)), ("all-gather", ("model",)),
                ("all-gather", ("data", "model"))]:
        assert model.get(key, 0) == pytest.approx(xla.get(key, 0), rel=0.05), (key, model, xla)
    convolutions = "conv_general_dilated"
    assert patterns_charged(plan, MESH, convolutions, "all-gather") == {GATHER}
    assert patterns_charged(plan, MESH, convolutions, "all-to-all") == {ALL_TO_ALL}


@functools.cache
def _third_party_random(lib: str, k: int):
    """(step, sample, analysis, plan): the k-th random plan of a third-party step, drawn as
    benchmarks/fidelity.py draws it (random_plan, seed 0)."""
    from tests.third_party.models import BUILDERS

    step, sample = BUILDERS[lib][0]()
    an = tl.analyze(tl.trace(step, *sample))
    rng = np.random.default_rng(0)
    plans = [tl.random_plan(an, MESH, rng) for _ in range(k + 1)]
    return step, sample, an, plans[k]


@pytest.mark.slow
def test_a_reshard_that_moves_one_axis_out_of_a_dim_another_leaves_gathers_it_whole():
    # equinox-attention's merged heads [b, s, heads, head_dim] on head_dim over (model,
    # data), read by a reshape that wants "model" on heads and head_dim whole: XLA's
    # partitioner cannot take "data" away and move "model" in one step ("involuntary full
    # rematerialization"): it all-gathers over (data, model) and slices, no all-to-all. The
    # model charged an all-gather over data and an all-to-all over model: 2x XLA's all-to-all.
    # (The plan fidelity.py drew as equinox-attention's first random plan.)
    from tests.third_party.models import BUILDERS

    step, sample = BUILDERS["equinox-attention"][0]()
    an = tl.analyze(tl.trace(step, *sample))
    plan = tl.Plan.from_decisions(an, [
        ("embed", ("model", "data")), ("vocab(emb)", ("data", "model")),
        ("heads(key_proj)", ("model",)), ("mlp", ("data",)), ("heads(output_proj)", ("model",)),
        ("head_dim(v)", ("model", "data"))])
    xla = _xla_bytes(step, sample, plan)
    model = _model_bytes(an, plan)
    key = ("all-to-all", ("model",))
    assert model.get(key, 0) == pytest.approx(xla.get(key, 0), rel=0.05), (model, xla)
    assert FULL_REMAT in patterns_charged(plan, MESH, "reshape", "all-gather")


@pytest.mark.slow
def test_a_reshard_that_gathers_and_moves_moves_the_gathered_buffer():
    # haiku-transformer's merged heads on (heads: "model", head_dim: "data"), read by a
    # reshape that wants "model" on heads x head_dim: XLA all-gathers "data" first and then
    # moves "model" in the gathered buffer (4 shards' worth), as it does for P("data",
    # "model") -> P(None, None, "model"); the model moved one shard.
    step, sample, an, plan = _third_party_random("haiku-transformer", 1)
    prog = an.program
    charged = cost_model(an, MESH).op_collectives(plan)
    moved = [(n, c.bytes) for n, cs in charged.items() for c in cs
             if c.kind == "all-to-all" and prog.ops[n].primitive == "reshape"
             and any(g.kind == "all-gather" and g.operand == c.operand for g in cs)]
    assert moved, charged
    jm = MESH.jax_mesh()
    stats = read_compiled(plan.jit(step, jm).lower(*sample).compile(), jm)
    xla_moved = {c.total_bytes for c in stats.collectives if c.kind == "all-to-all"}
    for n, b in moved:
        gathered = next(c.bytes for c in charged[n] if c.kind == "all-gather")
        assert b == pytest.approx(gathered), (n, charged[n])
        assert b in xla_moved, (b, xla_moved)
    assert patterns_charged(plan, MESH, "reshape", "all-to-all") == {ALL_TO_ALL}


def test_an_op_that_needs_its_window_whole_reads_its_other_dims_as_the_model_charges():
    # A max pool's gradient (select_and_scatter_add) reads the pooled gradient, sharded on its
    # width, whole on that window dim; its result is sharded on the batch. plan.jit asks for
    # the read the cost model charges (the width's axes moved to the batch: an all-to-all),
    # not the operand's own sharding less the window (which XLA all-gathers whole, then slices)

    def loss(scale, x):
        y = x * scale[None, None, None, :]
        return jnp.sum(jnp.sin(jax.lax.reduce_window(y, -jnp.inf, jax.lax.max, (1, 2, 2, 1),
                                                     (1, 2, 2, 1), "VALID")))

    step = jax.grad(loss, argnums=(0, 1))
    rng = np.random.default_rng(0)
    args = ((1 + 0.1 * rng.normal(size=(4,))).astype(np.float32),
            rng.normal(size=(8, 16, 16, 4)).astype(np.float32))
    an = tl.analyze(tl.trace(step, *args))
    prog = an.program
    pool = next(o for o in prog.ops if o.primitive == "reduce_window_max")
    pooled_width = an.classes[an.value_classes[pool.results[0]][2]].name
    batch = an.classes[an.value_classes[prog.inputs[1]][0]].name
    # the pooled width decided first: where a value has both, the batch gives way
    plan = (tl.Plan.replicated(an).with_axes(pooled_width, ("data", "model"))
            .with_axes(batch, ("data", "model")))
    xla = _xla_bytes(step, args, plan)
    model = _model_bytes(an, plan)
    assert ("all-to-all", ("data", "model")) in xla, xla
    for key in [("all-to-all", ("data", "model")), ("all-gather", ("data", "model"))]:
        assert model.get(key, 0) == pytest.approx(xla.get(key, 0), rel=0.05), (key, model, xla)


def _kv_stacked_plan(an) -> tl.Plan:
    # `layers` and `kv_heads` on one axis: a stack of kv projections (or of their gradients)
    # holds `model` on the layers, each layer's slice on its kv heads
    return (tl.Plan.replicated(an).with_axes("batch", ("data",))
            .with_axes("layers", ("model",)).with_axes("kv_heads", ("model",)))


def test_a_stack_a_scan_hands_on_is_resharded_once_after_the_loop():
    """The backward scan writes the parameters' gradients slice by slice, sharded like the
    slices; the optimizer reads them sharded like the parameters, on `layers`. plan.jit pins
    those stacks. Each one whose slices hold `model` on their kv heads costs an all-to-all of
    its shard, once, at the scan; the others only take their layers locally. The stacks
    another loop reads (the forward's residuals) are neither pinned nor charged."""
    _, _, an = zoo("llama")
    prog = an.program
    plan = _kv_stacked_plan(an)
    handed_on = prog.handed_on_stacks()
    backward = max(op.id for op in prog.ops if op.primitive == "scan")
    assert handed_on and {op for op, _, _ in handed_on} == {backward}
    resharded = [(r, b) for _, r, b in handed_on
                 if plan.value_axes(r) != ((),) + plan.value_axes(b)]
    assert {r for r, _ in resharded} <= constraint_values(plan)
    moved = [r for r, b in resharded if ("model",) in plan.value_axes(b)]
    assert moved and len(moved) < len(resharded)
    charged = sum(c.bytes for c in cost_model(an, MESH).op_collectives(plan)[backward]
                  if c.kind == "all-to-all" and c.operand is None)
    # `model` moves from the kv heads to the layers: each such stack's shard, once
    assert charged == sum(prog.values[r].nbytes / MESH.axis_size("model") for r in moved)
    residuals = {r for op in prog.ops if op.primitive == "scan" for r in op.results} \
        - {r for _, r, _ in handed_on}
    assert residuals and not residuals & constraint_values(plan)


@pytest.mark.slow
def test_stacks_handed_on_are_moved_as_xla_moves_them():
    fn, args, an = zoo("llama")
    plan = _kv_stacked_plan(an)
    assert _model_bytes(an, plan, "all-to-all") == \
        pytest.approx(_xla_bytes(fn, args, plan, "all-to-all"))


def test_a_value_read_through_stop_gradient_is_gathered_once():
    """A KV cache written with stop_gradient(k) and attention reading k itself: JAX lowers
    stop_gradient to nothing, so both readers need one buffer, and XLA gathers the sequence-
    sharded k once (the model charged two all-gathers before the tracer dropped it)."""

    def f(w, cache, x):
        k = x @ w                                                  # [4, 16, 8], seq sharded
        cache = jax.lax.dynamic_update_slice(cache, jax.lax.stop_gradient(k), (0, 3, 0))
        both = jnp.concatenate([cache[:, :8], k], 1)               # reads k whole on seq
        return both.sum(), cache

    args = (jnp.ones((8, 8)), jnp.ones((4, 32, 8)), jnp.ones((4, 16, 8)))
    an = tl.analyze(tl.trace(f, *args))
    assert "stop_gradient" not in an.program.primitives()
    seq = an.value_classes[an.program.inputs[2]][1]
    plan = tl.Plan.replicated(an).with_axes(an.classes[seq].name, ("data", "model"))
    model = _model_bytes(an, plan, "all-gather")
    assert model == pytest.approx(_xla_bytes(f, args, plan, "all-gather"))
    assert model[("all-gather", ("data", "model"))] == 4 * 16 * 8 * 4


@functools.cache
def lora():
    """A LoRA step on a frozen base: optax.multi_transform gives the base kernel
    optax.set_to_zero (its update a broadcast 0.0) and the low-rank pair Adam."""
    import optax

    def loss_fn(p, x, y):
        f, t = p["frozen"], p["lora"]
        h = jnp.tanh(x @ f["w1"] + (x @ t["a"]) @ t["b"])
        return jnp.mean((h @ f["w2"] - y) ** 2)

    def labels(p):
        return {k: jax.tree.map(lambda _: k, v) for k, v in p.items()}

    opt = optax.multi_transform({"lora": optax.adam(1e-3), "frozen": optax.set_to_zero()},
                                labels)

    def step(p, opt_state, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        upd, opt_state = opt.update(g, opt_state, p)
        return optax.apply_updates(p, upd), opt_state, loss

    rng = np.random.default_rng(0)
    n = lambda *s: jnp.asarray(rng.normal(size=s) * 0.2, jnp.float32)  # noqa: E731
    p = {"frozen": {"w1": n(16, 32), "w2": n(32, 16)},
         "lora": {"a": n(16, 4), "b": jnp.zeros((4, 32))}}
    args = (p, opt.init(p), n(16, 16), n(16, 16))
    return step, args, tl.analyze(tl.trace(step, *args))


def test_a_frozen_parameters_zero_update_is_not_gathered():
    """ZeRO-1 shards the updates; the frozen kernels' are set_to_zero's broadcast 0.0, whose
    all-gather XLA makes for free (the gathered form is the same broadcast; jax 0.10.2): only
    the trained pair's updates are gathered before they are applied."""
    step, args, an = lora()
    prog = an.program
    plan = tl.strategies.expert(an, MESH)["zero1"]
    gathered = _gathered(an, plan)
    frozen, trained = _parameters(an)[:2], _parameters(an)[2:]
    applied = {op.operands[0]: op.id for op in prog.ops
               if op.primitive == "add" and op.operands[0] in frozen + trained}
    assert set(applied) == set(frozen + trained)
    assert not any(applied[w] in gathered for w in frozen)
    assert all(applied[w] in gathered for w in trained)


@pytest.mark.slow
def test_lora_zero1_gathers_agree_with_xla():
    step, args, an = lora()
    plan = tl.strategies.expert(an, MESH)["zero1"]
    measured = _xla_bytes(step, args, plan, "all-gather")
    assert measured and _model_bytes(an, plan, "all-gather") == measured


def _expert_step(w, x):
    """A descent step on expert weights `w [E, m, d]` read by a batched matmul."""
    def loss(w):
        return jnp.sum(jnp.tanh(jnp.einsum("bEm,Emd->bEd", x, w)))

    return w - 0.1 * jax.grad(loss)(w)


@functools.cache
def expert_step():
    rng = np.random.default_rng(0)
    args = (rng.normal(size=(8, 128, 64)).astype(np.float32),
            rng.normal(size=(16, 8, 128)).astype(np.float32))
    return _expert_step, args, tl.analyze(tl.trace(_expert_step, *args))


@pytest.mark.parametrize("stored, compute", [
    ((("model",), (), ("data",)), ((), (), ("model",))),  # MaxText's MoE experts
    ((("data",), (), ("model",)), (("model",), (), ())),
    ((("data",), ("model",), ()), (("model",), (), ())),
])
def test_an_axis_moving_to_a_dim_with_fewer_tiles_is_permuted_then_gathered(stored, compute):
    # Expert weights stored with one axis on a dim and computed with it on another, every dim
    # keeping a number of tiles that divides what it had (the expert dim on model, the hidden
    # dim on data, computed with the hidden dim on model): XLA's partitioner permutes the
    # 32 KiB shard onto the devices of a compatible sharding and all-gathers it dim by dim
    # (64 KiB, then 128 KiB, over halves of data); the gradient goes back by a local slice
    # and a permute of the 32 KiB shard. The model charged an all-gather over data and an
    # all-to-all of 128 KiB each way (XLA moves none).
    step, args, an = expert_step()
    w = an.program.inputs[0]
    plan = tl.Plan.replicated(an)
    for d, axes in enumerate(compute):
        plan = plan.with_axes(an.classes[an.value_classes[w][d]].name, axes)
    for d, axes in enumerate(stored):
        plan = plan.with_axes(an.classes[an.value_classes[w][d]].name, axes,
                              domain="parameters")
    assert plan.value_axes(w) == stored

    def by_kind(found):
        out = {}
        for (kind, _), nbytes in found.items():
            out[kind] = out.get(kind, 0) + nbytes
        return out

    xla = by_kind(_xla_bytes(step, args, plan))
    assert xla["collective-permute"] == 2 * 32768 and "all-to-all" not in xla
    assert by_kind(_model_bytes(an, plan)) == xla
    # the weight permuted and gathered for the matmul, its update sliced and permuted back
    assert patterns_charged(plan, MESH, "dot_general") == {COMPATIBLE_GATHER}
    assert patterns_charged(plan, MESH, "sub") == {COMPATIBLE_SLICE}
