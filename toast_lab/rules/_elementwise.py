"""Elementwise rules.

An elementwise op is one pass-through factor per result dim, mapped to that dim of every operand
of the result's shape; scalar operands (a literal `2.0`, `select_n`'s scalar predicate, `clamp`'s
scalar bounds) map nothing. The primitive lists below were read off jax 0.10.2 (the primitives
batched by `batching.vectorized_batcher` / `broadcast_batcher`) and are kept explicit, so a new
JAX release adds primitives to the fallback warning, never silently to the table.
"""

from __future__ import annotations

import functools

from ._core import NEED_REPLICATION, RuleBuilder
from ._helpers import expect, guarded, tie_same_shape
from ._table import register

UNARY = (
    "abs", "acos", "acosh", "asin", "asinh", "atan", "atanh", "bessel_i0e", "bessel_i1e", "cbrt",
    "ceil", "clz", "conj", "cos", "cosh", "digamma", "erf", "erf_inv", "erfc", "exp", "exp2",
    "expm1", "floor", "imag", "integer_pow", "is_finite", "lgamma", "log", "log1p", "logistic",
    "neg", "not", "population_count", "real", "round", "rsqrt", "sign", "sin", "sinh", "sqrt",
    "square", "tan", "tanh",
    # JAX >= 0.11: tanh's derivative, 1 - x^2 of its result
    "one_minus_square",
    # not math, but elementwise all the same
    "convert_element_type", "reduce_precision",
)

NARY = (
    "add", "add_any", "and", "atan2", "complex", "div", "eq", "ge", "gt", "igamma",
    "igamma_grad_a", "igammac", "le", "lt", "max", "min", "mul", "mulhi", "ne", "nextafter", "or",
    "polygamma", "pow", "regularized_incomplete_beta", "rem", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "sub", "xor", "zeta",
    # total-order comparisons that sort's comparators and searchsorted emit
    "eq_to", "le_to", "lt_to",
    # operands that may be scalars: select_n's predicate, clamp's bounds
    "select_n", "clamp",
)


@register(*UNARY, *NARY)
def elementwise_rule(ins, outs, params):
    """One pass-through factor per result dim, on that dim of every operand that has it.

    Operands are scalars or have the result's rank; since jax 0.10 an n-ary op also broadcasts
    size-1 dims (`add(f32[8,1], f32[1,3]) -> f32[8,3]`), and such a dim is left unmapped: tying
    it to N would merge unrelated classes.

    The rule depends on the shapes alone, and most ops of a training step are elementwise ops on
    a handful of shapes, so rules are cached by shape (OpRule is immutable).
    """
    try:
        return _elementwise_by_shape(ins, outs, None)
    except TypeError:  # shapes given as lists: unhashable, build uncached
        return _elementwise_by_shape.__wrapped__(ins, outs, None)


@functools.lru_cache(maxsize=4096)
@guarded
def _elementwise_by_shape(ins, outs, params):
    shape = outs[0]
    rank = len(shape)
    for s in outs:
        expect(s == shape)
    b = RuleBuilder(ins, outs)
    if all(s == shape or not s for s in ins):  # the common case, kept fast
        tie_same_shape(b, shape, operands=[i for i, s in enumerate(ins) if s],
                       results=range(len(outs)))
        return b.build()
    for s in ins:
        expect(not s or (len(s) == rank and all(m == n or m == 1 for m, n in zip(s, shape))))
    results = range(len(outs))
    for d, n in enumerate(shape):
        b.factor(n, operands={i: d for i, s in enumerate(ins) if s and s[d] == n},
                 results={j: d for j in results})
    return b.build()


@register("bitcast_convert_type")
@guarded
def bitcast_convert_type_rule(ins, outs, params):
    """Same width: elementwise. Narrower result: a new minor dim (e.g. f32[8] -> u16[8, 2]);
    wider result: the operand's minor dim is consumed. That extra dim holds the bytes of one
    element, so it needs replication (as in Shardy)."""
    (x,), (y,) = ins, outs
    common = x if len(x) <= len(y) else y
    expect(x[:len(common)] == y[:len(common)] and abs(len(x) - len(y)) <= 1)
    b = RuleBuilder(ins, outs)
    tie_same_shape(b, common, operands=(0,), results=(0,))
    if len(y) > len(x):
        b.factor(y[-1], NEED_REPLICATION, results={0: len(y) - 1})
    elif len(x) > len(y):
        b.factor(x[-1], NEED_REPLICATION, operands={0: len(x) - 1})
    return b.build()
