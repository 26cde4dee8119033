"""The all-to-alls XLA emits around gathers and scatters of sharded tensors, and what the cost
model charges for them (toast_lab/cost/_kernel.py: _batched_indexing).

- take_along_axis of vocabulary-sharded logits by labels that shard the sequence (a
  sequence-parallel language model's loss), and its gradient: XLA re-tiles the logits' batch
  dims like the labels' before the masked gather, and the gradient's after the scatter, each
  an all-to-all of a logits shard; the labels, a scatter's updates and a gather's picks
  follow by collective-permutes.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.verification import verify

from tests.cost_patterns import BATCHED_RETILE, patterns_charged

MESH = tl.Mesh({"data": 4, "model": 2})
BATCH, SEQ, VOCAB = 8, 32, 256


def _take_loss(logits, labels):
    """Labels [batch, seq] pick one logit per token; [batch, seq, k] pick k (a router's top-k
    gates), an index dim that pairs with no logits dim."""
    picks = labels[..., None] if labels.ndim == 2 else labels
    return jnp.take_along_axis(logits, picks, axis=-1).sum()


def _take_step(logits, labels):
    """A descent step on the picked logits: a gather, and its transpose, a scatter-add, whose
    result is sharded like the logits (the step ties their classes)."""
    loss, grad = jax.value_and_grad(_take_loss)(logits, labels)
    return loss, logits - 0.1 * grad


@functools.cache
def _take(picks=None):
    rng = np.random.default_rng(0)
    shape = (BATCH, SEQ) if picks is None else (BATCH, SEQ, picks)
    args = (rng.normal(size=(BATCH, SEQ, VOCAB)).astype(np.float32),
            rng.integers(0, VOCAB, shape).astype(np.int32))
    return tl.analyze(tl.trace(_take_step, *args)), args


def _class_of(an, value, dim) -> str:
    return an.classes[an.value_classes[value][dim]].name


def _take_plan(an, seq_axes) -> tl.Plan:
    """Batch on "data", vocabulary on "model" (decided first: the logits keep it there), the
    sequence on `seq_axes`: the labels hold it, the logits cannot."""
    logits, labels = an.program.inputs
    plan = tl.Plan.replicated(an)
    plan = plan.with_axes(_class_of(an, logits, 2), ("model",))
    plan = plan.with_axes(_class_of(an, logits, 0), ("data",))
    plan = plan.with_axes(_class_of(an, labels, 1), seq_axes)
    assert plan.value_axes(logits) == (("data",), (), ("model",))
    return plan.validate(MESH)


def _bytes_by_kind(collectives) -> dict:
    out: dict[str, float] = {}
    for (kind, _), total in collectives.items():
        out[kind] = out.get(kind, 0.0) + total.bytes
    return out


def test_a_sequence_sharded_take_along_axis_moves_a_logits_shard_each_way():
    an, _ = _take()
    shard = BATCH * SEQ * VOCAB * 4 / 8
    est = tl.estimate(an, _take_plan(an, ("model",)), MESH)
    a2a = {axes: c.bytes for (kind, axes), c in est.collectives.items() if kind == "all-to-all"}
    assert a2a == {("data",): 2 * shard}  # the gather's operand, the gradient's result
    per_op = tl.cost_model(an, MESH).op_collectives(_take_plan(an, ("model",)))
    prog = an.program
    movers = sorted(prog.ops[o].primitive for o, cs in per_op.items()
                    for c in cs if c.kind == "all-to-all")
    assert movers == ["gather", "scatter-add"]


@pytest.mark.parametrize("picks, seq_axes", [(None, ()), (2, ("model",))])
def test_other_labels_move_nothing(picks, seq_axes):
    """Labels that leave the sequence whole; or two picks per token, whose scatter-add is the
    logits' gradient itself (another domain than the labels): plan.jit pins the labels
    gathered there, and XLA gathers them for the forward gather too (see the XLA test
    below)."""
    an, _ = _take(picks)
    est = tl.estimate(an, _take_plan(an, seq_axes), MESH)
    assert not any(kind == "all-to-all" for kind, _ in est.collectives)


@pytest.mark.slow
@pytest.mark.parametrize("picks", [None, 2])
def test_xla_moves_what_the_take_along_axis_rule_charges(picks):
    an, args = _take(picks)
    plan = _take_plan(an, ("model",))
    rep = verify(_take_step, args, plan, MESH)
    assert rep.ok, rep
    measured = _bytes_by_kind(rep.stats.collective_summary())
    est = _bytes_by_kind(tl.estimate(an, plan, MESH).collectives)
    # XLA's all-to-alls run over half of "data" (groups of 2, a part of the axis): compare
    # bytes, not axes. With two picks per token the labels' sequence is gathered where
    # plan.jit pins them (a read across domains), and nothing is re-tiled.
    expected = 2 * BATCH * SEQ * VOCAB * 4 / 8 if picks is None else 0.0
    assert measured.get("all-to-all", 0.0) == est.get("all-to-all", 0.0) == expected, rep
    # and the labels follow, permuted to their new tiles, once for the gather and its
    # gradient; the gather's picks are permuted back to the labels' tiling (a label-sized
    # shard each); the gradient's updates are a constant, made in place
    permuted = 2 * BATCH * SEQ * 4 / 8 if picks is None else 0.0
    assert measured.get("collective-permute", 0.0) == est.get("collective-permute", 0.0) \
        == permuted, rep
    for indexing in ("gather", "scatter-add"):
        assert (BATCHED_RETILE in patterns_charged(plan, MESH, indexing)) == (picks is None)



def _route_step(router, x):
    """A descent step on a router's weights through its top-2 gates: the gradient of top_k is
    a scatter-add of the gates' gradient, [b, s, 2] picks into [b, s, experts]."""
    def loss(router):
        probs = jax.nn.softmax(jnp.einsum("bsd,dE->bsE", x, router), axis=-1)
        gates, _ = jax.lax.top_k(probs, 2)
        return jnp.sum(gates * gates)

    return router - 0.1 * jax.grad(loss)(router)


@pytest.mark.slow
def test_a_top2_router_gradient_is_re_tiled_like_a_single_pick():
    # Tokens on (data, model) by batch and sequence, the experts on model: the top-2 picks
    # hold the sequence on model, the gradient the experts. XLA partitions the scatter-add by
    # its explicit batch dims as for one pick per token (its preferred method, whatever the
    # picks): the picks and the gates' gradient are permuted to their new tiles and gathered
    # over model, and the result moves by an all-to-all of its [2, 32, 4] shard. The model had
    # skipped k > 1 and charged no permute and no all-to-all there.
    rng = np.random.default_rng(0)
    args = (rng.normal(size=(64, 8)).astype(np.float32),
            rng.normal(size=(BATCH, SEQ, 64)).astype(np.float32))
    an = tl.analyze(tl.trace(_route_step, *args))
    router, x = an.program.inputs
    plan = (tl.Plan.replicated(an).with_axes(_class_of(an, x, 0), ("data",))
            .with_axes(_class_of(an, router, 1), ("model",))
            .with_axes(_class_of(an, x, 1), ("model",))).validate(MESH)
    rep = verify(_route_step, args, plan, MESH)
    assert rep.ok, rep
    measured = {}
    for c in rep.stats.collectives:
        if c.op_name.endswith("scatter-add"):
            measured[c.kind] = measured.get(c.kind, 0.0) + c.total_bytes
    prog = an.program
    charged = {}
    for n, cs in tl.cost_model(an, MESH).op_collectives(plan).items():
        if prog.ops[n].primitive == "scatter-add":
            for c in cs:
                charged[c.kind] = charged.get(c.kind, 0.0) + c.bytes
    assert measured["collective-permute"] == 2 * BATCH * SEQ * 2 * 4 / 8
    assert measured["all-to-all"] == BATCH * SEQ * 8 * 4 / 8
    assert charged == measured, (charged, measured)
