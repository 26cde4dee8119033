"""Rules for random-number primitives: key creation and splitting, bits, XLA's RNG."""

from __future__ import annotations

from ._core import NEED_REPLICATION, RuleBuilder
from ._elementwise import elementwise_rule
from ._helpers import expect, guarded, tie_same_shape
from ._table import register


# Elementwise over keys (and counters): random_seed (seeds -> keys), random_fold_in (keys, msgs;
# msgs may be a scalar), random_gamma (key, alpha; the key may be a scalar), and threefry2x32
# (key words and counters -> 2 results, all one shape or scalars; jax.extend.random.threefry_2x32
# emits it). philox2x32/4x32 and threefry4x32 are left out: they live inside random_bits'
# lowering and no public API puts them in a jaxpr.
register("random_seed", "random_fold_in", "random_gamma", "threefry2x32")(elementwise_rule)


@register("random_bits", "random_split")
@guarded
def random_bits_rule(ins, outs, params):
    """keys [*K] -> [*K, *shape]. The key dims pass through; the new dims are free result-only
    factors: with jax_threefry_partitionable (the default since jax 0.5) each device generates
    its own shard and the bits equal the unsharded ones."""
    k, y = ins[0], outs[0]
    expect(y[:len(k)] == k)
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, k, operands=(0,), results=(0,))
    for d in range(len(k), len(y)):
        b.factor(y[d], results={0: d})
    return b.build()


@register("random_wrap")
@guarded
def random_wrap_rule(ins, outs, params):
    """u32[*K, *key_shape] -> key[*K]: the key dims pass through; the trailing key-data dims
    need replication (one key's words are used together)."""
    x, k = ins[0], outs[0]
    expect(x[:len(k)] == k)
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, k, operands=(0,), results=(0,))
    for d in range(len(k), len(x)):
        b.factor(x[d], NEED_REPLICATION, operands={0: d})
    return b.build()


@register("random_unwrap")
@guarded
def random_unwrap_rule(ins, outs, params):
    """key[*K] -> u32[*K, *key_shape], the inverse of random_wrap."""
    k, y = ins[0], outs[0]
    expect(y[:len(k)] == k)
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, k, operands=(0,), results=(0,))
    for d in range(len(k), len(y)):
        b.factor(y[d], NEED_REPLICATION, results={0: d})
    return b.build()


@register("rng_bit_generator")
@guarded
def rng_bit_generator_rule(ins, outs, params):
    """key -> (new key, bits). Needs everything whole: XLA generates the full tensor on every
    device so that the bits do not depend on the sharding (the key's words are one state)."""
    (key,) = ins
    expect(outs[0] == key)
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, key, operands=(0,), results=(0,), kind=NEED_REPLICATION)
    for j in range(1, len(outs)):
        for d, n in enumerate(outs[j]):
            b.factor(n, NEED_REPLICATION, results={j: d})
    return b.build()


@register("rng_uniform")
@guarded
def rng_uniform_rule(ins, outs, params):
    """(scalar low, scalar high) -> values of `shape`. Stateful XLA RNG: generated whole, like
    rng_bit_generator."""
    for s in ins:
        expect(s == ())
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(outs[0]):
        b.factor(n, NEED_REPLICATION, results={0: d})
    return b.build()
