"""Scatters whose update batch dims are sharded (`jnp.bincount`, `segment_sum`, counting tokens
with `.at[tokens].add(1)`): the rule's reduction factor, what the cost model charges for it, and
what XLA compiles. A scatter with an all-reduce's combiner (add, mul, min, max) counts locally
and all-reduces the result; a subtracting or overwriting scatter all-gathers its indices and
updates (toast_lab/rules/_indexing.py, scatter_rule)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.verification import verify

MESH = tl.Mesh({"data": 4, "model": 2})
BINS, BATCH, SEQ = 256, 64, 128


def _tokens(shape):
    return np.random.default_rng(0).integers(0, BINS, shape).astype(np.int32)


def _floats(shape, seed=1):
    return np.random.default_rng(seed).normal(size=shape).astype(np.float32)


# name: (function, args). The bins (or the scattered-into operand) are [BINS], 4 bytes each.
CASES = {
    "bincount": (lambda t: jnp.bincount(t, length=BINS), (_tokens(BATCH * SEQ),)),
    "bincount_weights": (lambda t, w: jnp.bincount(t, w, length=BINS),
                         (_tokens(BATCH * SEQ), _floats(BATCH * SEQ))),
    # jnp.bincount takes 1-D input: a batch of token rows is flattened first
    "bincount_flattened": (lambda t: jnp.bincount(t.ravel(), length=BINS),
                           (_tokens((BATCH, SEQ)),)),
    "counts_2d": (lambda t: jnp.zeros(BINS, jnp.int32).at[t].add(1), (_tokens((BATCH, SEQ)),)),
    "segment_sum": (lambda d, s: jax.ops.segment_sum(d, s, num_segments=BINS),
                    (_floats(BATCH * SEQ), _tokens(BATCH * SEQ))),
    "scatter_mul": (lambda x, t, u: x.at[t].multiply(u),
                    (_floats(BINS), _tokens((BATCH, SEQ)), 1 + 0.01 * _floats((BATCH, SEQ), 2))),
    "scatter_min": (lambda x, t, u: x.at[t].min(u),
                    (_floats(BINS), _tokens((BATCH, SEQ)), _floats((BATCH, SEQ), 2))),
    "segment_max": (lambda d, s: jax.ops.segment_max(d, s, num_segments=BINS),
                    (_floats(BATCH * SEQ), _tokens(BATCH * SEQ))),
    "scatter_sub": (lambda x, t, u: x.at[t].subtract(u),
                    (_floats(BINS), _tokens((BATCH, SEQ)), _floats((BATCH, SEQ), 2))),
}
REDUCING = [name for name in CASES if name != "scatter_sub"]


@functools.cache
def analysed(name):
    fn, args = CASES[name]
    return fn, args, tl.analyze(tl.trace(fn, *args))


def batch_sharded(an) -> tl.Plan:
    """The plan that shards the scatter's update batch dim (its indices' leading dim) over
    "data", and the leading dim of the integer input it was flattened from, if any."""
    prog = an.program
    scatter = next(op for op in prog.ops if op.primitive.startswith("scatter"))
    leading = [an.value_classes[scatter.operands[1]][0]]
    leading += [an.value_classes[v][0] for v in prog.inputs if prog.values[v].dtype == np.int32]
    plan = tl.Plan.replicated(an)
    for c in dict.fromkeys(leading):
        try:
            plan = plan.with_axes(an.classes[c].name, "data").validate(MESH)
        except tl.PlanError:  # the same value would use "data" twice
            continue
    return plan


def charged(an, plan) -> dict:
    est = tl.estimate(an, plan, MESH)
    return {key: cost.bytes for key, cost in est.collectives.items() if cost.bytes}


@pytest.mark.parametrize("name", REDUCING)
def test_a_reducing_scatter_on_sharded_updates_is_charged_an_all_reduce_of_its_result(name):
    _, _, an = analysed(name)
    rule = an.op_rules[next(op.id for op in an.program.ops
                            if op.primitive.startswith("scatter"))]
    assert "reduction=" in rule.to_text() and "need_replication" not in rule.to_text(), rule
    plan = batch_sharded(an)
    assert plan.assignments, "nothing sharded"
    # The bins, whole, once: not the indices (BATCH * SEQ * 4 bytes = 32 KiB), gathered.
    assert charged(an, plan) == {("all-reduce", ("data",)): BINS * 4}, plan


def test_a_subtracting_scatter_on_sharded_updates_gathers_them():
    """XLA takes only all-reduce combiners for a sharded-updates scatter: old - update is not
    one, so the indices and updates (32 KiB each) are gathered first."""
    _, args, an = analysed("scatter_sub")
    plan = batch_sharded(an)
    whole = args[1].nbytes + args[2].nbytes
    assert charged(an, plan) == {("all-gather", ("data",)): whole}


@pytest.mark.slow
@pytest.mark.parametrize("constraints", ["compute", "none"])
@pytest.mark.parametrize("name", list(CASES))
def test_xla_compiles_what_the_cost_model_charges(name, constraints):
    """The sharded step matches the unsharded one, and its collectives are the charged ones.
    "compute": the plan as exported, with a sharding constraint at each op's result (those
    follow the rule, so they alone would make XLA agree with it). "none": only the inputs'
    and outputs' shardings, so the scatter is partitioned as XLA's SPMD partitioner chooses
    by itself: all-reduce of the bins for an all-reduce combiner, all-gather of the indices
    and updates for a subtraction. That is the evidence for the rule."""
    fn, args, an = analysed(name)
    plan = batch_sharded(an)
    rep = verify(fn, args, plan, MESH, constraints=constraints)
    assert rep.ok, rep
    measured = {key: total.bytes for key, total in rep.stats.collective_summary().items()}
    assert measured, rep  # the updates are sharded: something must be communicated
    assert measured == charged(an, plan), rep
