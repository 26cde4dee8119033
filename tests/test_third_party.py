"""Bring your own step: training steps written with flax.linen, flax.nnx, equinox, haiku and
Keras 3 go through the whole pipeline — analyse (no fallback), expert strategies that do what
their names say, search, plan.jit, and verified numerics for every plan."""

import functools
import importlib
import re

import pytest

import toast_lab as tl
from tests.third_party import traced
from tests.third_party.models import BUILDERS
from toast_lab.strategies import find_roles

MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")


@functools.cache
def built(name):
    return traced(BUILDERS, name)


def _leaf(an, path_part):
    prog = an.program
    return next(v for v, n in zip(prog.inputs, prog.input_names) if path_part in n)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_estimate_experts_and_search(name):
    _, _, an = built(name)
    assert not an.fallback_ops
    experts = tl.strategies.expert(an, MESH)
    assert {"dp", "fsdp", "megatron"} <= set(experts), experts.skipped
    for plan in experts.values():
        assert tl.estimate(an, plan, MESH).flops > 0
    assert tl.search(an, MESH, simulations=100, budget_s=None, warm_start=experts).feasible


@pytest.mark.parametrize("name, data_leaf", [
    ("linen", "tokens"), ("nnx", "x"), ("equinox", "x"), ("haiku", "images"),
    ("keras", "data/0"),
])
def test_data_parallel_shards_the_leading_dim_of_the_data(name, data_leaf):
    _, _, an = built(name)
    roles = find_roles(an)
    v = _leaf(an, data_leaf)
    assert an.value_classes[v][0] == roles.batch
    plan = tl.strategies.expert(an, MESH)["dp"]
    assert plan.value_axes(v)[0] and not any(plan.value_axes(v)[1:])


@pytest.mark.parametrize("name", list(BUILDERS))
def test_class_names_are_readable_unique_and_whole_in_the_summary(name):
    _, _, an = built(name)
    names = [c.name for c in an.classes]
    assert len(set(names)) == len(names)
    for n in names:
        assert not re.fullmatch(r"[\d/]+\[\d+\]", n), f"{n}: a path of list indices says nothing"
        assert "~" not in n and "/value[" not in n
    summary = an.summary(max_classes=len(names))
    for n in names:
        assert f" {n} " in summary, f"{n!r} is cut in the summary"


def test_keras_parameters_are_named_by_the_layer_that_reads_them():
    """Their path names, which the classes' field names replace, still name them."""
    _, _, an = built("keras")
    former = {n for c in an.classes for n in c.formerly}
    assert any(n.startswith("query/kernel[") for n in former), former
    assert any(n.startswith("embedding/table[") for n in former), former
    assert an.class_named("query/kernel[1]").name == "heads"
    assert an.class_named("embedding/table[0]").name == "vocab"


def test_haiku_paths_are_shortened_to_unique_suffixes():
    _, _, an = built("haiku")
    names = {c.name for c in an.classes}
    former = {n for c in an.classes for n in c.formerly}
    assert "block_group_3/block_0/batchnorm_0/offset[3]" in former
    assert (an.class_named("block_group_3/block_0/batchnorm_0/offset[3]").name
            == "channels(block_group_3/block_0/batchnorm_0)")
    assert not any(n.startswith("res_net18/~") for n in names | former)


def test_megatron_on_a_convnet_shards_conv_channels():
    """Output channels of a conv and the matching input channels of the next one."""
    _, _, an = built("haiku")
    plan = tl.strategies.expert(an, MESH)["megatron"]
    prog = an.program
    conv0 = _leaf(an, "block_group_3/~/block_0/~/conv_0/w")
    conv1 = _leaf(an, "block_group_3/~/block_0/~/conv_1/w")
    assert plan.value_axes(conv0)[3], "conv_0's output channels"
    assert plan.value_axes(conv1)[2], "conv_1's input channels"
    assert an.value_classes[conv0][3] == an.value_classes[conv1][2]
    sharded_kernels = [n for v, n in zip(prog.inputs, prog.input_names)
                       if n.startswith("params/") and prog.values[v].ndim == 4
                       and any(plan.value_axes(v))]
    assert len(sharded_kernels) >= 8


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_expert_plan_and_the_search_verify(name):
    fn, args, an = built(name)
    plans = dict(tl.strategies.expert(an, MESH))
    plans["search"] = tl.search(an, MESH, simulations=100, budget_s=None).plan
    for label, plan in plans.items():
        rep = tl.verify(fn, args, plan, MESH)
        assert rep.ok, (name, label, str(rep))


def test_builders_cover_each_library_named_in_the_test_extra():
    extra = importlib.import_module("tomllib").loads(
        open("pyproject.toml", "rb").read().decode())["project"]["optional-dependencies"]["test"]
    for lib in ("flax", "equinox", "dm-haiku", "keras"):
        assert any(req.startswith(lib) for req in extra), lib
