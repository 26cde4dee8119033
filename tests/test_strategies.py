"""Expert strategies: picked by class roles, valid on the mesh, and verified against XLA."""

import functools

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
