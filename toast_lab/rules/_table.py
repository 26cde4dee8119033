"""The rule table: one entry per primitive name.

Keyed by the primitive's *name* (what a jaxpr prints), not the primitive object: several
primitives (`jit`, `scan`, the random ones) live in private JAX modules that move between
releases, while their names are stable and are what a user sees in a warning.
"""

from __future__ import annotations

from typing import Callable, Mapping, Sequence

from ..program import REGION_PRIMITIVES
from ._core import OpRule, Shape

# rule(in_shapes, out_shapes, params) -> OpRule. Region primitives (scan, while, cond) also get
# `body`: the shapes of their bodies' inputs and outputs, in the order the tracer lays them out
# (program/_trace.py).
Rule = Callable[..., OpRule]

RULES: dict[str, Rule] = {}


def register(*names: str) -> Callable[[Rule], Rule]:
    """Decorator: `@register("add", "sub")` puts the rule in the table under each name."""

    def deco(rule: Rule) -> Rule:
        for name in names:
            if name in RULES:
                raise ValueError(f"a rule for {name!r} is registered twice")
            RULES[name] = rule
        return rule

    return deco


def has_rule(name: str) -> bool:
    return name in RULES


def rule_for(name: str, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
             params: Mapping, body: Sequence[Shape] = ()) -> OpRule:
    """The OpRule of one op. Raises KeyError for an unknown primitive (callers fall back)."""
    rule = RULES[name]
    if name in REGION_PRIMITIVES:
        return rule(tuple(in_shapes), tuple(out_shapes), params, tuple(body))
    return rule(tuple(in_shapes), tuple(out_shapes), params)
