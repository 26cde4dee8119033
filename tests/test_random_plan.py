"""random_plan: valid for its mesh, the same for the same seed, and varied across seeds."""

import functools
import math

import jax
import numpy as np
import pytest

import toast_lab as tl
from toast_lab import random_plan

MESHES = (tl.Mesh({"data": 8}), tl.Mesh({"data": 4, "model": 2}),
          tl.Mesh({"data": 2, "fsdp": 2, "model": 2}))


@functools.cache
def analysis(name):
    fn, args = tl.zoo.get(name)
    return tl.analyze(tl.trace(fn, *args))


@pytest.mark.parametrize("name", ["gpt", "cnn"])
@pytest.mark.parametrize("mesh", MESHES, ids=lambda m: "x".join(map(str, m.shape.values())))
def test_jax_accepts_every_value_sharding(name, mesh):
    """What the plan says of each value, JAX can lay out: every value's PartitionSpec names
    mesh axes once and divides the value's shape (conflict drops and first-decision-wins
    included), and every conflict gets one of its resolutions."""
    an = analysis(name)
    jax_mesh = mesh.jax_mesh()
    for seed in range(30):
        plan = random_plan(an, mesh, np.random.default_rng(seed))
        for v in an.program.values:
            sharding = jax.sharding.NamedSharding(jax_mesh, plan.partition_spec(v.id))
            shard = sharding.shard_shape(v.shape)  # raises where a dim does not divide
            assert math.prod(shard) * math.prod(
                mesh.axis_size(a) for axes in plan.value_axes(v.id) for a in axes
            ) == math.prod(v.shape)
        for c in an.conflicts:
            assert plan.resolution_of(c) in c.resolutions


def test_same_seed_same_plan():
    an, mesh = analysis("gpt"), MESHES[2]
    a = random_plan(an, mesh, np.random.default_rng(7))
    b = random_plan(an, mesh, np.random.default_rng(7))
    assert a == b and a.assignments == b.assignments and a.resolutions == b.resolutions
    assert repr(a) == repr(b)


def test_plans_vary():
    an, mesh = analysis("gpt"), MESHES[1]
    rng = np.random.default_rng(0)
    plans = [random_plan(an, mesh, rng) for _ in range(40)]
    assert len({repr(p) for p in plans}) >= 30
    # Every mesh axis, axis orders and multi-axis shardings show up; and so do the conflict's
    # resolutions and different decision orders.
    used = {axes for p in plans for _, axes in p.assignments}
    assert {("data",), ("model",)} <= used
    assert ("data", "model") in used and ("model", "data") in used
    resolutions = {r for p in plans for _, r in p.resolutions}
    assert resolutions == set(an.conflicts[0].resolutions)
    firsts = {p.assignments[0][0] for p in plans if p.assignments}
    assert len(firsts) >= 4


def test_shard_probability():
    an, mesh = analysis("cnn"), MESHES[1]
    assert random_plan(an, mesh, np.random.default_rng(0), shard_prob=0.0) == \
        tl.Plan.replicated(an)
    full = random_plan(an, mesh, np.random.default_rng(0), shard_prob=1.0)
    shardable = {c.id for c in an.classes if c.size % 2 == 0}  # some axis divides it
    assert {k for k, _ in full.assignments} == shardable
    with pytest.raises(ValueError, match="shard_prob"):
        random_plan(an, mesh, np.random.default_rng(0), shard_prob=1.5)
