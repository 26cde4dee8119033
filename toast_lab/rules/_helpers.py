"""Helpers every rule module shares: fail-and-fall-back, and factor patterns that recur.

A rule raises `Unmappable` (through `expect`) for shapes or params it cannot map; `guarded`
turns that into the conservative rule, marked as a fallback with the reason, so that the
analysis warns about it (naming the primitive and the user's source line) exactly as it does
for a primitive without a rule, and `analyze(strict=True)` raises.
"""

from __future__ import annotations

import functools

from ._core import NEED_REPLICATION, RuleBuilder, conservative_rule


class Unmappable(Exception):
    """Raised inside a rule for shapes or params it cannot map; `guarded` turns it into the
    conservative rule."""


def expect(condition: bool, why: str = "") -> None:
    if not condition:
        raise Unmappable(why)


def guarded(rule):
    """Wraps a rule so that an op it cannot map gets `conservative_rule`, never an exception.

    A jaxpr from a JAX release we have not seen may carry params or shapes a rule does not
    expect; DESIGN.md §2 says such an op is never a crash. Any exception (not only Unmappable) is
    caught on purpose: a rule's bug then shows as a fallback in the golden tests, not as a
    traceback in a user's notebook. The fallback is never silent: it carries `reason`, and the
    analysis warns once per primitive (or raises under strict=True) and lists it in the summary.
    """

    @functools.wraps(rule)
    def safe(ins, outs, params):
        try:
            return rule(ins, outs, params)
        except Unmappable as err:
            why = str(err) or "its shapes or params are not the ones the rule maps"
            return conservative_rule(ins, outs, reason=why)
        except Exception as err:  # noqa: BLE001 -- see docstring
            return conservative_rule(ins, outs,
                                     reason=f"the rule raised {type(err).__name__}: {err}")

    return safe


def tie_same_shape(b: RuleBuilder, shape, operands=(), results=(), kind=None, skip=()):
    """One factor per dim of `shape` (except dims in `skip`), on that dim of every listed tensor.

    The listed tensors must all have `shape`; `kind` defaults to pass-through.
    """
    for d, n in enumerate(shape):
        if d in skip:
            continue
        if kind is None:
            b.factor(n, operands={t: d for t in operands}, results={t: d for t in results})
        else:
            b.factor(n, kind, operands={t: d for t in operands}, results={t: d for t in results})


def resized_dim(b: RuleBuilder, in_size: int, out_size: int, operands=(), results=(), in_dim=0,
                out_dim=0):
    """A dim the op needs whole on both sides (sort, cumsum, a sliced or padded dim).

    Same size on both sides: one need-replication factor tying them (the dim is kept).
    Different sizes: one need-replication factor per side, untied.
    """
    if in_size == out_size:
        b.factor(in_size, NEED_REPLICATION, operands={t: in_dim for t in operands},
                 results={t: out_dim for t in results})
    else:
        b.factor(in_size, NEED_REPLICATION, operands={t: in_dim for t in operands})
        b.factor(out_size, NEED_REPLICATION, results={t: out_dim for t in results})
