"""Gradient accumulation: a step that splits its batch into micro-batches and runs them one
at a time in a `lax.scan`, adding their gradients (tests/third_party/models.py,
linen_accumulate). The loop reads the weights in every iteration; XLA reshards them once,
before it, keeps its weights and accumulator in place, and combines the gradient all-reduces
of each iteration into one. The cost model must price what XLA compiles."""

from __future__ import annotations

import functools

import pytest

import toast_lab as tl
from toast_lab.analysis import COMPUTE, OPTIMIZER, PARAMETERS, domains
from toast_lab.cost import cost_model
from toast_lab.plan._export import constraint_values
from toast_lab.verification import summarize_collectives

MESH = tl.Mesh({"data": 4, "model": 2}, device="cpu")


@functools.cache
def accumulate():
    pytest.importorskip("flax")
    from tests.third_party.models import linen_accumulate

    fn, args = linen_accumulate()
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _experts(an):
    return dict(tl.strategies.expert(an, MESH))


def _loop(an):
    (loop,) = [op for op in an.program.ops if op.primitive == "scan"]
    return loop


def _split(an):
    """The reshape of the tokens into [micro-batches, examples, seq]."""
    prog = an.program
    tokens = prog.inputs[-1]
    (op,) = [prog.ops[n] for n in prog.users(tokens) if prog.ops[n].primitive == "reshape"]
    return op


def test_weights_every_micro_batch_reads_are_gathered_once_before_the_loop():
    """FSDP shards the weights; the loop reads them, unchanged, in each of its 4 iterations.
    XLA hoists their all-gathers out of the loop, so each is charged once, not once per
    micro-batch, and once per weight however many ops of the body read it."""
    _, _, an = accumulate()
    prog = an.program
    plan = _experts(an)["fsdp"]
    loop = _loop(an)
    assert loop.params["length"] == 4
    weights = set(loop.body[:loop.params["num_consts"]])
    charged = cost_model(an, MESH).op_collectives(plan)
    gathers = [(n, c) for n, cs in charged.items() for c in cs if c.kind == "all-gather"
               and loop.body_ops[0] <= n < loop.body_ops[1]
               and prog.ops[n].operands[c.operand] in weights]
    assert len(gathers) > 10
    assert all(c.count == 1 for _, c in gathers)
    read = [prog.ops[n].operands[c.operand] for n, c in gathers]
    assert len(read) == len(set(read))  # one gather per weight


def test_the_micro_batches_are_activations_and_the_weights_parameters():
    """The tokens' examples get a class of their own once split into micro-batches (the data
    input holds them in a compound dim). Values carrying it are still activations: the
    weights the loop reads are parameters, the accumulated gradients optimizer domain, so
    ZeRO and MaxText plans mean here what they mean on a step without accumulation."""
    _, _, an = accumulate()
    prog = an.program
    d = domains(an)
    by_input = {(path.split("/")[0], d.of(v)) for v, path in zip(prog.inputs, prog.input_names)}
    assert by_input == {("params", PARAMETERS), ("opt_state", OPTIMIZER), ("tokens", COMPUTE)}
    loop = _loop(an)
    nc, nk = loop.params["num_consts"], loop.params["num_carry"]
    assert {d.of(v) for v in loop.body[:nc]} == {PARAMETERS}  # the weights, read each time
    assert {d.of(v) for v in loop.results[:nk] if prog.values[v].ndim} == {OPTIMIZER}
    embedded = [op for op in prog.ops if op.primitive == "gather"
                and loop.body_ops[0] <= op.id < loop.body_ops[1]][0]
    assert d.of(embedded.results[0]) == COMPUTE


def test_a_batch_split_on_its_examples_is_moved_once_by_an_all_to_all():
    """Data parallelism shards the tokens' leading dim and, within each micro-batch, the
    examples. The reshape between them moves the micro-batches' rows to the devices that own
    their examples, once, which plan.jit pins there (unpinned, XLA gathered the micro-batch
    inside the loop, every iteration): the tokens' dim on (data, model) holds the
    micro-batches on data and each one's examples on model, so data moves by an all-to-all
    of the tokens' shard, landing minor to model, and a collective-permute of the shard puts
    the examples in (data, model) order (XLA: 256 B each, tests/test_cost.py)."""
    _, _, an = accumulate()
    prog = an.program
    plan = _experts(an)["dp"]
    split = _split(an)
    tokens = split.operands[0]
    assert plan.value_axes(tokens)[0] == ("data", "model")
    assert plan.value_axes(split.results[0])[:2] == ((), ("data", "model"))
    assert split.results[0] in constraint_values(plan)
    charged = cost_model(an, MESH).op_collectives(plan)[split.id]
    shard = prog.values[tokens].nbytes / MESH.size
    assert [(c.kind, c.axes, c.bytes) for c in charged] == [
        ("all-to-all", ("data",), shard), ("collective-permute", ("data", "model"), shard)]


def test_a_replicated_batch_is_split_locally():
    """Tokens every device holds whole: each takes its examples of each micro-batch itself."""
    _, _, an = accumulate()
    plan = _experts(an)["dp"]
    split = _split(an)
    local = plan.with_axes(an.classes[an.value_classes[split.operands[0]][0]].name, ())
    assert split.id not in cost_model(an, MESH).op_collectives(local)


def test_the_loop_state_is_not_counted_twice():
    """The loop's weights are read where they are and its gradient accumulator is updated in
    place: under data parallelism, the step's temporaries hold the accumulator and one
    micro-batch's gradients (two copies of the weights' size) and the activations, not four."""
    _, _, an = accumulate()
    prog = an.program
    loop = _loop(an)
    weights = sum(prog.values[v].nbytes for v in loop.operands[:loop.params["num_consts"]])
    est = tl.estimate(an, _experts(an)["dp"], MESH)
    assert 2 * weights < est.temp_bytes < 3.5 * weights


@pytest.mark.slow
@pytest.mark.parametrize("name, kinds", [
    ("dp", ("all-to-all",)),  # the split batch
    # the weights, before the loop; the embedding table too, as plan.jit pins its read
    ("fsdp", ("all-gather", "all-to-all")),
    ("megatron", ()),
    ("zero1", ("all-gather", "all-reduce")),  # the moments sharded, the weights whole
])
def test_accumulation_estimates_agree_with_xla(name, kinds):
    fn, args, an = accumulate()
    plan = _experts(an)[name]
    rep = tl.verify(fn, args, plan, MESH)
    assert rep.ok, str(rep)
    est = tl.estimate(an, plan, MESH)
    assert est.peak_memory_bytes == pytest.approx(rep.stats.peak_bytes, rel=0.1)
    measured = summarize_collectives(rep.stats.collectives)
    # XLA:CPU reduce-scatters by an all-reduce and a slice: compare the two kinds together
    same = {"reduce-scatter": "all-reduce"}
    for kind in kinds:
        xla = sum(t.bytes for (k, _), t in measured.items() if same.get(k, k) == kind)
        model = sum(c.bytes for (k, _), c in est.collectives.items() if same.get(k, k) == kind)
        assert model == pytest.approx(xla, rel=0.1, abs=1.0), kind
