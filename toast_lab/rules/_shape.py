"""Rules for ops that move, split, merge or resize dims without arithmetic.

reshape, broadcast_in_dim, squeeze, transpose, rev, iota, concatenate, pad, split, tile, stack,
unstack. (`expand_dims` is no primitive in jax 0.10.2: it traces to broadcast_in_dim.)
"""

from __future__ import annotations

from ._core import NEED_REPLICATION, RuleBuilder
from ._helpers import expect, guarded, resized_dim, tie_same_shape
from ._table import register


def _reshape_groups(x, y):
    """Pairs of (x dims, y dims) whose size products match, in order; size-1 dims left out.

    [8, 64] -> [8, 4, 16] gives ([0], [0]) and ([1], [1, 2]).
    """
    xs = [(d, n) for d, n in enumerate(x) if n != 1]
    ys = [(d, n) for d, n in enumerate(y) if n != 1]
    groups = []
    gx, gy, px, py = [], [], 1, 1
    i = j = 0
    while i < len(xs) or j < len(ys):
        if j == len(ys) or (i < len(xs) and px <= py):
            gx.append(xs[i])
            px *= xs[i][1]
            i += 1
        else:
            gy.append(ys[j])
            py *= ys[j][1]
            j += 1
        if px == py:
            groups.append((gx, gy))
            gx, gy, px, py = [], [], 1, 1
    expect(not gx and not gy)  # element counts differ: not a reshape we understand
    return groups


def _cumulative(dims):
    out, p = [], 1
    for _, n in dims:
        p *= n
        out.append(p)
    return out


@register("reshape")
@guarded
def reshape_rule(ins, outs, params):
    """Split and merge dims into compound factors, major first.

    Within a group of dims whose products match, the common refinement of both sides' prefix
    products gives the factors: [8, 64] -> [8, 4, 16] is ([i, jk])->([i, j, k]) and
    [2, 6] -> [4, 3] is ([i, jk])->([ij, k]). A group with no common refinement ([6, 4] -> [4, 6]:
    6 is not a multiple of 4) gets one need-replication factor per dim, untied: its data moves
    between devices whatever the sharding.

    `dimensions` (a transpose before the reshape: jax's reshape of a transposed view, as in a
    grouped convolution's kernel gradient) is read by grouping the transposed operand's dims
    and tying each factor to the operand dim it came from.
    """
    x, y = ins[0], outs[0]
    order = params.get("dimensions")
    order = list(range(len(x))) if order is None else [int(d) for d in order]
    expect(sorted(order) == list(range(len(x))))
    expect(all(n > 0 for n in x) and all(n > 0 for n in y))
    b = RuleBuilder(ins, outs)
    for gx, gy in _reshape_groups([x[d] for d in order], y):
        gx = [(order[k], n) for k, n in gx]  # transposed position -> the operand's own dim
        cx, cy = _cumulative(gx), _cumulative(gy)
        bounds = sorted(set(cx) | set(cy))
        prev, sizes = 1, []
        for s in bounds:
            if s % prev:
                sizes = None
                break
            sizes.append(s // prev)
            prev = s
        if sizes is None:
            for d, n in gx:
                b.factor(n, NEED_REPLICATION, operands={0: d})
            for d, n in gy:
                b.factor(n, NEED_REPLICATION, results={0: d})
            continue
        a = c = 0
        for s, size in zip(bounds, sizes):
            while cx[a] < s:
                a += 1
            while cy[c] < s:
                c += 1
            b.factor(size, operands={0: gx[a][0]}, results={0: gy[c][0]})
    return b.build()


@register("broadcast_in_dim")
@guarded
def broadcast_in_dim_rule(ins, outs, params):
    """Kept dims tie operand to result; new dims, and size-1 dims broadcast to N, are result-only
    (tying a size-1 dim to N would merge unrelated classes)."""
    x, y = ins[0], outs[0]  # further operands are dynamic shapes, if any
    where = dict(zip(params["broadcast_dimensions"], range(len(x))))
    expect(len(where) == len(x))
    b = RuleBuilder(ins, outs)
    for j, n in enumerate(y):
        i = where.get(j)
        if i is not None and x[i] == n:
            b.factor(n, operands={0: i}, results={0: j})
        else:
            expect(i is None or x[i] == 1)
            b.factor(n, results={0: j})
    return b.build()


@register("squeeze")
@guarded
def squeeze_rule(ins, outs, params):
    x, y = ins[0], outs[0]
    dropped = {d % len(x) for d in params["dimensions"]}
    kept = [d for d in range(len(x)) if d not in dropped]
    expect(len(kept) == len(y) and all(x[d] == 1 for d in dropped))
    b = RuleBuilder(ins, outs)
    for j, d in enumerate(kept):
        expect(x[d] == y[j])
        b.factor(y[j], operands={0: d}, results={0: j})
    return b.build()


@register("transpose")
@guarded
def transpose_rule(ins, outs, params):
    x, y = ins[0], outs[0]
    perm = params["permutation"]
    expect(len(perm) == len(x) == len(y))
    where = {d: j for j, d in enumerate(perm)}
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):  # in operand order: ([i, j, k])->([k, i, j])
        j = where[d]
        expect(y[j] == n)
        b.factor(n, operands={0: d}, results={0: j})
    return b.build()


@register("rev")
@guarded
def rev_rule(ins, outs, params):
    """A reversed dim is kept (tied) but needs replication: its halves swap devices."""
    x = ins[0]
    expect(outs[0] == x)
    reversed_dims = {d % len(x) for d in params["dimensions"]}
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if d in reversed_dims:
            b.factor(n, NEED_REPLICATION, operands={0: d}, results={0: d})
        else:
            b.factor(n, operands={0: d}, results={0: d})
    return b.build()


@register("iota")
@guarded
def iota_rule(ins, outs, params):
    """No operand: every result dim (the iota dimension too) is a free result-only factor, since
    each device can generate its own slice of the counter."""
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(outs[0]):
        b.factor(n, results={0: d})
    return b.build()


@register("concatenate")
@guarded
def concatenate_rule(ins, outs, params):
    """Other dims tie across every operand and the result; the concatenated dim needs
    replication, one factor per operand and one for the result (their sizes differ)."""
    y = outs[0]
    axis = params["dimension"] % len(y)
    for x in ins:
        expect(len(x) == len(y) and all(x[d] == y[d] for d in range(len(y)) if d != axis))
    b = RuleBuilder(ins, outs)
    everyone = range(len(ins))
    tie_same_shape(b, y, operands=everyone, results=(0,), skip=(axis,))
    for i, x in enumerate(ins):
        b.factor(x[axis], NEED_REPLICATION, operands={i: axis})
    b.factor(y[axis], NEED_REPLICATION, results={0: axis})
    return b.build()


@register("pad")
@guarded
def pad_rule(ins, outs, params):
    """Unpadded dims pass through. A padded dim (low, high or interior, even one that keeps its
    size by shifting) needs replication on each side, untied: the data move between shards."""
    x, y = ins[0], outs[0]  # ins[1] is the scalar padding value
    config = params["padding_config"]
    expect(len(config) == len(x) == len(y))
    b = RuleBuilder(ins, outs)
    for d, (lo, hi, interior) in enumerate(config):
        if lo == 0 and hi == 0 and interior == 0:
            b.factor(x[d], operands={0: d}, results={0: d})
        else:
            resized_dim(b, x[d], y[d], operands=(0,), results=(0,), in_dim=d, out_dim=d)
    return b.build()


@register("split")
@guarded
def split_rule(ins, outs, params):
    """The split axis needs replication (one factor for the operand, one per result); every
    other dim ties the operand to all results."""
    x = ins[0]
    axis = params["axis"] % len(x)
    for y in outs:
        expect(len(y) == len(x) and all(y[d] == x[d] for d in range(len(x)) if d != axis))
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, x, operands=(0,), results=range(len(outs)), skip=(axis,))
    b.factor(x[axis], NEED_REPLICATION, operands={0: axis})
    for j, y in enumerate(outs):
        b.factor(y[axis], NEED_REPLICATION, results={j: axis})
    return b.build()


@register("tile")
@guarded
def tile_rule(ins, outs, params):
    """Untiled dims (rep 1) pass through; a tiled dim needs replication on each side."""
    x, y = ins[0], outs[0]
    reps = params["reps"]
    expect(len(reps) == len(x) == len(y))
    b = RuleBuilder(ins, outs)
    for d, r in enumerate(reps):
        if r == 1:
            b.factor(x[d], operands={0: d}, results={0: d})
        else:
            resized_dim(b, x[d], y[d], operands=(0,), results=(0,), in_dim=d, out_dim=d)
    return b.build()


@register("stack")
@guarded
def stack_rule(ins, outs, params):
    """Each operand's dims tie to the result's; the new axis (one slot per operand) is a
    result-only need-replication factor, like a concatenated dim."""
    y = outs[0]
    axis = params["axis"] % len(y)
    x = ins[0]
    expect(all(s == x for s in ins) and y[:axis] + y[axis + 1:] == x)
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        b.factor(n, operands={i: d for i in range(len(ins))},
                 results={0: d if d < axis else d + 1})
    b.factor(y[axis], NEED_REPLICATION, results={0: axis})
    return b.build()


@register("unstack")
@guarded
def unstack_rule(ins, outs, params):
    """The inverse of stack: the unstacked axis is an operand-only need-replication factor."""
    x = ins[0]
    axis = params["axis"] % len(x)
    y = x[:axis] + x[axis + 1:]
    expect(all(s == y for s in outs))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(y):
        b.factor(n, operands={0: d if d < axis else d + 1},
                 results={j: d for j in range(len(outs))})
    b.factor(x[axis], NEED_REPLICATION, operands={0: axis})
    return b.build()
