"""Rules for the primitives of `equinox.internal` that diffrax, optimistix and lineax put in
every step (their loops, error checks and solvers are built on them).

- `nonbatchable`: an identity that refuses to be vmapped.
- `unvmap_any`, `unvmap_all`, `unvmap_max`: `jnp.any` / `all` / `max` over the whole operand,
  to a scalar. Every operand dim is a reduction: a sharded operand reduces locally, then a
  scalar all-reduce (or, and, max), as for `reduce_or` / `reduce_max` to a scalar.
- `select_if_vmap(pred, x, y)`: `lax.select` with a scalar predicate; elementwise over x, y.
- `maybe_set(pred, xs, x, *index)`: `xs.at[index].set(x)` when pred: the indexed leading dims
  of xs need replication, the rest are tied to x's dims (as for dynamic_update_slice).
- `vprim`: how equinox vmaps its own primitives (`params['prim']` under `jax.vmap`): the
  batch dims (`__batch_axes` of the operands, dim 0 of every result) pass through, and the
  unbatched op is the wrapped primitive's rule with those dims removed.
"""

from __future__ import annotations

from ._core import NEED_REPLICATION, REDUCTION, RuleBuilder
from ._elementwise import elementwise_rule
from ._helpers import expect, guarded, tie_same_shape
from ._table import RULES, register


@register("nonbatchable")
@guarded
def nonbatchable_rule(ins, outs, params):
    """Operand i is result i, dim for dim."""
    expect(len(ins) == len(outs))
    b = RuleBuilder(ins, outs)
    for i, (x, y) in enumerate(zip(ins, outs)):
        expect(x == y)
        tie_same_shape(b, x, operands=(i,), results=(i,))
    return b.build()


@register("unvmap_any", "unvmap_all", "unvmap_max")
@guarded
def unvmap_reduce_rule(ins, outs, params):
    """Every operand dim a reduction; the result is a scalar."""
    expect(len(ins) == 1 and len(outs) == 1 and outs[0] == ())
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(ins[0]):
        b.factor(n, REDUCTION, operands={0: d})
    return b.build()


@register("select_if_vmap")
@guarded
def select_if_vmap_rule(ins, outs, params):
    """(scalar pred, x, y) -> x's shape: the elementwise rule (a scalar maps nothing)."""
    expect(len(ins) == 3 and ins[1] == ins[2] == outs[0])
    return elementwise_rule(tuple(ins), tuple(outs), params)


@register("maybe_set")
@guarded
def maybe_set_rule(ins, outs, params):
    """(pred, xs, x, *index) -> xs': index dims need replication, trailing dims tied to x."""
    pred, xs, x, index = ins[0], ins[1], ins[2], ins[3:]
    (ys,) = outs
    expect(pred == () and ys == xs and all(i == () for i in index))
    n_idx = len(xs) - len(x)
    expect(0 <= n_idx and xs[n_idx:] == x)
    b = RuleBuilder(ins, outs)
    for d in range(n_idx):
        b.factor(xs[d], NEED_REPLICATION, operands={1: d}, results={0: d})
    for d, n in enumerate(x):
        b.factor(n, operands={1: n_idx + d, 2: d}, results={0: n_idx + d})
    return b.build()


@register("vprim")
@guarded
def vprim_rule(ins, outs, params):
    """A vmapped equinox primitive: batch factor, then the inner rule on unbatched shapes."""
    size = int(params["__axis_size"])
    axes = tuple(params["__batch_axes"])
    expect(len(axes) == len(ins))
    inner_ins = tuple(s if a is None else s[:a] + s[a + 1:] for s, a in zip(ins, axes))
    for s, a in zip(ins, axes):
        expect(a is None or s[a] == size)
    for y in outs:
        expect(len(y) >= 1 and y[0] == size)
    inner_outs = tuple(y[1:] for y in outs)
    name = getattr(params["prim"], "name", "")
    inner = None
    if name in RULES and name != "vprim":
        inner = RULES[name](inner_ins, inner_outs, dict(params.get("params", ())))
        if inner.fallback:
            inner = None
    b = RuleBuilder(ins, outs)
    b.factor(size, operands={i: a for i, a in enumerate(axes) if a is not None},
             results={j: 0 for j in range(len(outs))})
    # where each unbatched dim sits in the batched tensors
    in_pos = [[d if a is None or d < a else d + 1 for d in range(len(s))]
              for s, a in zip(inner_ins, axes)]
    out_pos = [[d + 1 for d in range(len(s))] for s in inner_outs]
    if inner is None:  # the wrapped primitive's dims: each needs replication on its own
        for i, s in enumerate(inner_ins):
            for d, n in enumerate(s):
                b.factor(n, NEED_REPLICATION, operands={i: in_pos[i][d]})
        for j, s in enumerate(inner_outs):
            for d, n in enumerate(s):
                b.factor(n, NEED_REPLICATION, results={j: out_pos[j][d]})
        return b.build()
    for f, (size_f, kind) in enumerate(zip(inner.sizes, inner.kinds)):
        ops = {i: in_pos[i][d] for i, t in enumerate(inner.operands) for d, fs in enumerate(t)
               if f in fs}
        res = {j: out_pos[j][d] for j, t in enumerate(inner.results) for d, fs in enumerate(t)
               if f in fs}
        # a compound dim (several factors on one dim) cannot be re-expressed dim by dim here
        expect(all(len(inner.operands[i][in_pos[i].index(p)]) == 1 for i, p in ops.items()))
        expect(all(len(inner.results[j][p - 1]) == 1 for j, p in res.items()))
        b.factor(size_f, kind, operands=ops, results=res)
    return b.build()
