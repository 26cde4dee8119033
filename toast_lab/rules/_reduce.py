"""Rules for reductions, scans along a dim, sorts and windowed reductions."""

from __future__ import annotations

import numpy as np

from ._core import NEED_REPLICATION, PASS_THROUGH, REDUCTION, RuleBuilder
from ._helpers import expect, guarded, resized_dim
from ._table import register


def reducer_rule(ins, outs, axes, n_inputs=1):
    """Reduced dims are reductions over the first `n_inputs` operands (partial results:
    all-reduce); the kept dims pass through to every result, in order. Later operands (init
    values) are scalars."""
    x = ins[0]
    axes = {a % len(x) for a in axes}
    for s in ins[:n_inputs]:
        expect(s == x)
    kept = [d for d in range(len(x)) if d not in axes]
    for y in outs:
        expect(len(y) == len(kept))
    inputs = range(n_inputs)
    results = range(len(outs))
    b = RuleBuilder(ins, outs)
    o = 0
    for d, n in enumerate(x):
        if d in axes:
            b.factor(n, REDUCTION, operands={i: d for i in inputs})
        else:
            for y in outs:
                expect(y[o] == n)
            b.factor(n, operands={i: d for i in inputs}, results={j: o for j in results})
            o += 1
    return b.build()


# argmax / argmin: reduction, not need-replication. Sharding the reduced axis costs a local
# argmax per shard and an all-gather of each shard's (value, index) pairs, reduced again: the
# result's size times the devices -- what XLA does for the variadic reduce these lower to (the
# cost model charges it: cost/_op_facts._gathered_partials), and how Shardy types a reduced dim
# of any stablehlo.reduce. Need-replication would charge an all-gather of the whole operand
# (the logits, for an argmax over a sharded vocab).
@register("reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or",
          "reduce_xor", "argmax", "argmin")
@guarded
def reduce_named_rule(ins, outs, params):
    return reducer_rule(ins, outs, params["axes"])


@register("psum", "pmax", "pmin")
@guarded
def positional_collective_rule(ins, outs, params):
    """A psum / pmax / pmin over positional axes: what vmap(axis_name=...) leaves of a
    collective over its mapped axis (an ensemble's lax.pmean of statistics or of a gradient
    pytree: one psum of every leaf). Each operand is reduced over those dims like reduce_sum /
    reduce_max, its kept dims passing through to its own result. A named mesh axis (a
    collective inside shard_map or pmap, whose bodies are not analysed) falls back."""
    axes = params["axes"]
    expect(all(isinstance(a, (int, np.integer)) for a in axes))
    expect(params.get("axis_index_groups") is None and len(ins) == len(outs))
    b = RuleBuilder(ins, outs)
    for i, (x, y) in enumerate(zip(ins, outs)):
        reduced = {int(a) % len(x) for a in axes} if x else set()
        expect(len(y) == len(x) - len(reduced))
        o = 0
        for d, n in enumerate(x):
            if d in reduced:
                b.factor(n, REDUCTION, operands={i: d})
            else:
                expect(y[o] == n)
                b.factor(n, operands={i: d}, results={i: o})
                o += 1
    return b.build()


@register("reduce")
@guarded
def reduce_rule(ins, outs, params):
    """Generic (variadic) reduce: n inputs, then n scalar init values; n results."""
    return reducer_rule(ins, outs, params["dimensions"], n_inputs=len(outs))


@register("cumsum", "cumprod", "cummax", "cummin", "cumlogsumexp")
@guarded
def cumulative_rule(ins, outs, params):
    """The scanned axis needs replication (each element depends on all before it) and is kept:
    one factor tying operand and result. Other dims pass through."""
    x = ins[0]
    expect(outs[0] == x)
    axis = params["axis"] % len(x)
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        b.factor(n, NEED_REPLICATION if d == axis else PASS_THROUGH, operands={0: d},
                 results={0: d})
    return b.build()


@register("sort")
@guarded
def sort_rule(ins, outs, params):
    """All operands and results share one shape. The sorted dim needs replication and is kept
    (tied across all); the others pass through."""
    x = ins[0]
    for s in (*ins, *outs):
        expect(s == x)
    axis = params["dimension"] % len(x)
    every_in, every_out = range(len(ins)), range(len(outs))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        b.factor(n, NEED_REPLICATION if d == axis else PASS_THROUGH,
                 operands={i: d for i in every_in}, results={j: d for j in every_out})
    return b.build()


def _top_k_like(ins, outs, axis):
    """top_k-style: values and indices have the operand's shape except `axis`, which shrinks to
    k. The axis needs replication, one factor for the operand and one for both results (tied
    when k is the whole dim)."""
    x = ins[0]
    axis %= len(x)
    y = outs[0]
    for s in outs:
        expect(s == y)
    expect(len(y) == len(x) and all(x[d] == y[d] for d in range(len(x)) if d != axis))
    results = range(len(outs))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if d == axis:
            resized_dim(b, n, y[d], operands=(0,), results=results, in_dim=d, out_dim=d)
        else:
            b.factor(n, operands={0: d}, results={j: d for j in results})
    return b.build()


@register("top_k")
@guarded
def top_k_rule(ins, outs, params):
    # jax 0.10 gives top_k an `axis`; earlier releases always reduce the last dim
    return _top_k_like(ins, outs, params.get("axis", -1))


@register("approx_top_k")
@guarded
def approx_top_k_rule(ins, outs, params):
    return _top_k_like(ins, outs, params["reduction_dimension"])


def _window_is_trivial(params, d):
    """True when dim d is untouched by the window: size 1, stride 1, no padding or dilation."""
    base = params.get("base_dilation") or ()
    return (params["window_dimensions"][d] == 1 and params["window_strides"][d] == 1
            and tuple(params["padding"][d]) == (0, 0) and (not base or base[d] == 1))


def windowed_rule(ins, outs, params, full, windowed):
    """`full`: indices of the operands (and `windowed` of the results, or vice versa) in the
    operand's shape; the others are in the windowed shape. A dim the window touches needs
    replication on each side (tied when sizes match); an untouched dim passes through."""
    full_ins, full_outs = full
    win_ins, win_outs = windowed
    shape_full = ins[full_ins[0]] if full_ins else outs[full_outs[0]]
    shape_win = ins[win_ins[0]] if win_ins else outs[win_outs[0]]
    for i in full_ins:
        expect(ins[i] == shape_full)
    for j in full_outs:
        expect(outs[j] == shape_full)
    for i in win_ins:
        expect(ins[i] == shape_win)
    for j in win_outs:
        expect(outs[j] == shape_win)
    expect(len(shape_full) == len(shape_win) == len(params["window_dimensions"]))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(shape_full):
        if _window_is_trivial(params, d):
            expect(shape_win[d] == n)
            b.factor(n, operands={i: d for i in (*full_ins, *win_ins)},
                     results={j: d for j in (*full_outs, *win_outs)})
        elif n == shape_win[d]:
            b.factor(n, NEED_REPLICATION, operands={i: d for i in (*full_ins, *win_ins)},
                     results={j: d for j in (*full_outs, *win_outs)})
        else:
            b.factor(n, NEED_REPLICATION, operands={i: d for i in full_ins},
                     results={j: d for j in full_outs})
            b.factor(shape_win[d], NEED_REPLICATION, operands={i: d for i in win_ins},
                     results={j: d for j in win_outs})
    return b.build()


@register("reduce_window_sum", "reduce_window_max", "reduce_window_min")
@guarded
def reduce_window_named_rule(ins, outs, params):
    return windowed_rule(ins, outs, params, full=((0,), ()), windowed=((), (0,)))


@register("reduce_window")
@guarded
def reduce_window_rule(ins, outs, params):
    """Generic reduce_window: n operands, then n scalar init values; n results."""
    n = len(outs)
    return windowed_rule(ins, outs, params, full=(tuple(range(n)), ()),
                         windowed=((), tuple(range(n))))


@register("select_and_scatter_add")
@guarded
def select_and_scatter_add_rule(ins, outs, params):
    """(source, operand) -> result: source has the windowed shape, operand and result the full
    one (max-pool's gradient)."""
    return windowed_rule(ins, outs, params, full=((1,), (0,)), windowed=((0,), ()))


@register("select_and_gather_add")
@guarded
def select_and_gather_add_rule(ins, outs, params):
    """(tangents, operand) -> result: both operands full-shaped, the result windowed (max-pool's
    forward-mode derivative)."""
    return windowed_rule(ins, outs, params, full=((0, 1), ()), windowed=((), (0,)))
