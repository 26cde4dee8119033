"""The order of a dim's mesh axes: where XLA's tiles land, and when a reshard leaves them out
of the plan's order.

A class's mask holds its axes as bits and, above ORDER_SHIFT, the order the plan lists them in
(_plan_arrays.py). XLA tiles a dim in the order its axes are listed and a reshard only ever
subdivides a dim's tiles, so the order a reshard produces can differ from the plan's; the
checks here say when (the operand classification then charges the AXIS_ORDER or
GATHER_MAJOR_AXIS pattern).
"""

from __future__ import annotations


from ._jit import inline, jit
from .._plan_arrays import ORDER_SHIFT


@inline
def order_of(mask, value_classes, t, d):
    """The order of the axes of dim d of value type t (ORDER_SHIFT: 0 for mesh order), under
    the plan's class masks `mask`."""
    c = value_classes[t, d]
    return 0 if c < 0 else mask[c] >> ORDER_SHIFT


@inline
def place(order, b):
    """Where axis bit `b` (its index) comes among a dim's axes listed in `order` (order_of):
    smaller is more major."""
    if order == 0:
        return b
    for p in range(ORDER_SHIFT // 4):
        if (order >> (4 * p)) & 15 == b + 1:
            return p
    return 64 + b


@jit
def compound_split(held, order, size, mesh):
    """The axes of `held` (listed in `order`) on the major part, of `size` elements, of a
    compound dim: its axes tile the dim major first, so where the leading ones' ways make up
    `size` exactly they tile the major part and the rest the minor one; otherwise all are the
    major part's (an axis that straddles the two is not split)."""
    prefix = 0
    last = -1
    while True:
        nxt, at = 0, 1 << 30
        b = 0
        while (1 << b) < mesh.shape[0]:
            if held & (1 << b) != 0:
                p = place(order, b)
                if last < p < at:
                    nxt, at = 1 << b, p
            b += 1
        if nxt == 0:
            return held
        prefix |= nxt
        last = at
        ways = mesh[prefix].ways
        if ways == size:
            return prefix
        if ways > size:
            return held


@jit
def out_of_order(kept, sliced, moved, held_order, want_order, moved_order, mesh):
    """Whether a dim that keeps the axes `kept` (listed in `held_order`), slices `sliced`
    locally and receives `moved` by all-to-all (or from the op's partial sums) ends up with
    its axes in another order than the plan's (`want_order`).

    XLA's reshard only ever subdivides a dim's tiles: a new axis lands minor to the axes the
    dim already has, the locally sliced ones before those an all-to-all brings (it slices
    first). Where the plan wants a new axis major to one the dim keeps (tokens on (data,
    model) whose micro-batches held data and examples model: data comes back minor), the
    devices hold the right tiles in the wrong order, and a collective-permute of the shard
    puts them in place (pairs (0,0),(1,2),(2,4),...: the transpose of data=4 x model=2;
    jax 0.10.2). Axes one all-to-all moves from one dim keep the order they had there
    (`moved_order`; -1 where they come from several dims: not compared): a width on (data,
    model) moved to channels the plan lists (model, data) arrives (data, model) and is
    permuted (nnx-cnn random0's pooling gradient, jax 0.10.2)."""
    b = 0
    while (1 << b) < mesh.shape[0]:
        x = 1 << b
        if (kept | sliced | moved) & x != 0:
            gx = 0 if kept & x != 0 else (1 if sliced & x != 0 else 2)
            c = 0
            while (1 << c) < mesh.shape[0]:
                y = 1 << c
                if c != b and (kept | sliced | moved) & y != 0 \
                        and place(want_order, b) < place(want_order, c):
                    gy = 0 if kept & y != 0 else (1 if sliced & y != 0 else 2)
                    # x is wanted before y: it must not arrive after it
                    if gx > gy or (gx == gy == 0
                                   and place(held_order, b) > place(held_order, c)):
                        return True
                    if (gx == gy == 2 and moved_order >= 0 and moved & x != 0
                            and moved & y != 0
                            and place(moved_order, b) > place(moved_order, c)):
                        return True
                c += 1
        b += 1
    return False


@jit
def gathered_out_of_order(kept, gone, held_order, mesh):
    """Whether a dim that all-gathers the axes `gone` and keeps `kept` (both listed in
    `held_order`) gathers an axis listed major to one it keeps.

    XLA's all-gather concatenates the tiles of a group in the group's device order, which
    only makes whole tiles of the kept axes where the gathered axes are the dim's minor ones
    (P(None, ("data", "model")) to P(None, "data"): each data tile's two model halves).
    Gathering a major axis (("model", "data") to "data"; ("data", "model") to "model") would
    interleave another tile's pieces: XLA first collective-permutes each device's shard so
    that the dim lists its axes kept first (pairs (0,0),(2,1),(4,2),...: the transpose of
    data=4 x model=2), then gathers (jax 0.10.2, tests/test_cost.py)."""
    b = 0
    while (1 << b) < mesh.shape[0]:
        if gone & (1 << b) != 0:
            c = 0
            while (1 << c) < mesh.shape[0]:
                if kept & (1 << c) != 0 and place(held_order, b) < place(held_order, c):
                    return True
                c += 1
        b += 1
    return False
