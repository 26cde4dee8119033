"""Rules for ops whose insides toast-lab does not partition: `shard_map` bodies (manual SPMD,
written by the user for one shard), host callbacks that only observe (`jax.debug.print`,
`jax.debug.callback`) and the uninitialised buffers JAX and equinox allocate.

`shard_map` fixes its own shardings: its body sees one shard of each operand as its in_specs
say and returns results laid out as its out_specs say. From outside, what the body computes
between the two is unknown, so no dim is tied through it and every dim needs replication:
a plan that shards an operand pays an all-gather before the shard_map (which then slices its
shard locally), the same charge as the conservative rule. Unlike an unknown primitive this is
not a guess about a missing rule: it is what a hand-partitioned region means to a planner.

One body is known from outside: a body that only `ppermute`s each operand to its result, with
the same in_specs and out_specs (a ring shift, the hand-off between pipeline stages). It moves
each shard whole to another device, so every dim passes through as it is sharded.
"""

from __future__ import annotations

from ._core import NEED_REPLICATION, PASS_THROUGH, RuleBuilder
from ._table import register


@register("shard_map")
def shard_map_rule(ins, outs, params):
    """Every operand and result dim its own need-replication factor (see the module
    docstring); `params` (mesh, in_specs, out_specs) change nothing from outside, except for
    a body that only permutes shards, whose dims pass through."""
    b = RuleBuilder(ins, outs)
    if ins == outs and permutes_shards(params):
        for i, shape in enumerate(ins):
            for d, n in enumerate(shape):
                b.factor(n, operands={i: d}, results={i: d})
        return b.build()
    for i, shape in enumerate(ins):
        for d, n in enumerate(shape):
            b.factor(n, NEED_REPLICATION, operands={i: d})
    for j, shape in enumerate(outs):
        for d, n in enumerate(shape):
            b.factor(n, NEED_REPLICATION, results={j: d})
    return b.build()


def permutes_shards(params) -> bool:
    """A shard_map's body (its `params`) ppermutes operand i to result i, for every i, and
    nothing else, with the same in_specs and out_specs."""
    body = params.get("jaxpr")
    jaxpr = getattr(body, "jaxpr", body)
    if jaxpr is None or params.get("in_specs") != params.get("out_specs"):
        return False
    eqns = list(getattr(jaxpr, "eqns", ()))
    if not eqns or any(e.primitive.name != "ppermute" for e in eqns):
        return False
    moved = {id(o): id(i) for e in eqns for i, o in zip(e.invars, e.outvars)}
    return [moved.get(id(o)) for o in jaxpr.outvars] == [id(i) for i in jaxpr.invars]


@register("empty", "empty2")
def empty_rule(ins, outs, params):
    """An uninitialised buffer (`lax.empty`; `empty2`, the scalar that JAX's AD and scan
    broadcast to make zero-like buffers): no operand, and each device may allocate its own
    shard, so every result dim is a free result-only factor (like iota)."""
    b = RuleBuilder(ins, outs)
    for j, shape in enumerate(outs):
        for d, n in enumerate(shape):
            b.factor(n, results={j: d})
    return b.build()


@register("debug_callback", "debug_print")
def debug_callback_rule(ins, outs, params):
    """`jax.debug.callback` / `jax.debug.print`: no results, so nothing is tied through them.
    With `partitioned=False` (the default) JAX lowers the callback with a maximal sharding on
    device 0, and XLA gathers each sharded operand there first (measured under JAX 0.10:
    a debug.print of a [32, 64] batch sharded 8 ways all-gathers its 8 KiB): every operand dim
    needs replication. With `partitioned=True` each device prints its own shard and nothing
    moves: every operand dim is a free factor of its own. Either way a known op, so no
    warning (a debug.print is in most steps people bring while they debug them)."""
    kind = PASS_THROUGH if params.get("partitioned", False) else NEED_REPLICATION
    b = RuleBuilder(ins, outs)
    for i, shape in enumerate(ins):
        for d, n in enumerate(shape):
            b.factor(n, kind, operands={i: d})
    return b.build()


@register("platform_index")
def platform_index_rule(ins, outs, params):
    """`lax.platform_dependent`'s branch index (jnp.linalg and jax.scipy.linalg pick LAPACK or
    a portable kernel with it): no operand and a scalar result, so there is nothing to shard
    and nothing to warn about."""
    return RuleBuilder(ins, outs).build()
