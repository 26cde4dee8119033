"""CostModel.op_collectives: the estimate's collectives, read back to the ops that pay them."""

from collections import defaultdict

import numpy as np
import pytest

import toast_lab as tl
from toast_lab.cost import COLLECTIVE_KINDS, CostModel, OpCollective

MESHES = ({"data": 4, "model": 2}, {"data": 2, "fsdp": 2, "model": 2})


@pytest.fixture(scope="module", params=["gpt", "gpt_scan"])
def analysis(request):
    fn, args = tl.zoo.get(request.param)
    return tl.analyze(tl.trace(fn, *args))


def _plans(an, mesh, seed):
    rng = np.random.default_rng(seed)
    plans = dict(tl.strategies.expert(an, mesh))
    for i in range(12):
        plans[f"random {i}"] = tl.random_plan(an, mesh, rng, override_prob=0.3 if i % 2 else 0)
    return plans


def _check_totals(model, plan):
    """The ops' collectives add up to the estimate's, kind by kind and axes by axes."""
    est = model.estimate(plan)
    per_op = model.op_collectives(plan)
    totals = defaultdict(lambda: np.zeros(3))
    for cs in per_op.values():
        for c in cs:
            totals[(c.kind, c.axes)] += (c.count, c.bytes, c.time_s)
    assert set(totals) == set(est.collectives)
    for key, c in est.collectives.items():
        np.testing.assert_allclose(totals[key], (c.count, c.bytes, c.time_s), rtol=1e-9,
                                   err_msg=str(key))
    return per_op


@pytest.mark.parametrize("shape", MESHES, ids=lambda s: "x".join(map(str, s.values())))
def test_op_collectives_add_up_to_the_estimate(analysis, shape):
    mesh = tl.Mesh(shape, device="h100")
    model = CostModel(analysis, mesh)
    charged_any = False
    for name, plan in _plans(analysis, mesh, seed=len(shape)).items():
        per_op = _check_totals(model, plan)
        charged_any |= bool(per_op)
        prog = analysis.program
        for o, cs in per_op.items():
            op = prog.ops[o]
            assert cs
            if op.body:  # region ops' bodies pay; a scan itself only reshards its stacks:
                # those it reads (operands) and those it hands on (operand None)
                first_stack = op.params["num_consts"] + op.params["num_carry"]
                assert op.primitive == "scan" and all(
                    c.operand is None or c.operand >= first_stack for c in cs), (o, cs)
            for c in cs:
                assert isinstance(c, OpCollective) and c.kind in COLLECTIVE_KINDS
                assert c.count > 0 and c.bytes >= 0 and c.time_s >= 0
                assert c.label == f"{c.kind} {'×'.join(c.axes)}"
                assert list(c.axes) == [a for a in mesh.axis_names if a in c.axes]
                if c.kind in ("all-gather", "all-to-all"):
                    # the operand it moves (or the slices of the stacks it hands on) has the
                    # axes it gathers or moves
                    moved = [prog.ops[o].operands[c.operand]] if c.operand is not None else [
                        b for n, _, b in prog.handed_on_stacks() if n == o]
                    held = {a for v in moved for axes in plan.value_axes(v) for a in axes}
                    assert set(c.axes) <= held, (name, o, c)
                elif c.kind == "collective-permute" and op.primitive == "conv_general_dilated":
                    # a halo exchange of the convolution's input, over its result's axes
                    assert c.operand == 0 and set(c.axes) <= {
                        a for axes in plan.value_axes(op.results[0]) for a in axes}, (name, o, c)
                elif c.kind == "collective-permute" and c.operand is not None:
                    # an operand's shard moved between devices: a dim handed from axes it
                    # holds to others, or its tiles re-laid over the axes it holds (a
                    # scatter's regrouped indices, a re-tiled batched gather's)
                    held = {a for axes in plan.value_axes(prog.ops[o].operands[c.operand])
                            for a in axes}
                    assert held & set(c.axes), (name, o, c)
                else:
                    assert c.operand is None
    assert charged_any


def test_fsdp_gathers_each_weight_before_its_matmul(analysis):
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    plan = tl.strategies.expert(analysis, mesh)["fsdp"]
    per_op = CostModel(analysis, mesh).op_collectives(plan)
    prog = analysis.program
    gathers = [(o, c) for o, cs in per_op.items() for c in cs if c.kind == "all-gather"]
    assert gathers
    matmuls = [o for o, c in gathers if prog.ops[o].primitive == "dot_general"]
    assert matmuls  # the weights, gathered where a matmul reads them
    partial = [c for cs in per_op.values() for c in cs if c.operand is None]
    assert {c.kind for c in partial} <= {"all-reduce", "reduce-scatter"} and partial


def test_replicated_plan_pays_no_collective(analysis):
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    assert CostModel(analysis, mesh).op_collectives(tl.Plan.replicated(analysis)) == {}


def test_op_costs_communication_is_each_ops_own_collectives(analysis):
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    model = CostModel(analysis, mesh)
    for name, plan in _plans(analysis, mesh, seed=7).items():
        _, comm = model.op_costs(plan)
        per_op = model.op_collectives(plan)
        own = np.zeros(len(comm))
        for o, cs in per_op.items():
            own[o] = sum(c.time_s for c in cs)
        np.testing.assert_allclose(comm, own, rtol=1e-12, err_msg=name)
        assert comm.sum() == pytest.approx(model.estimate(plan).communication_s, rel=1e-9)
