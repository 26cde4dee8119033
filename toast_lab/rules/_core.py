"""Factor-based sharding rules, in the manner of Shardy's `OpShardingRule`.

A rule describes one op as a set of *factors*. Each factor has a size and a kind, and maps to
at most one dimension of each operand and result. A dimension is usually one factor; a reshape
can make it a *compound* of several (major first), and a dimension of size 1 has none.

Kinds say what sharding the factor costs (DESIGN.md §2):

- pass-through: elementwise dims, batch dims of `dot_general`. Free.
- reduction: contracting and reduced dims. Leaves partial sums: all-reduce or reduce-scatter.
- need-replication: the op needs the dim whole (sorted dim of `sort`, indexed dim of `gather`).
  Costs an all-gather before the op.

Rules print like Shardy's::

    ([i, k], [k, j])->([i, j]) {i=8, j=16, k=32} reduction={k}
"""

from __future__ import annotations

import enum
import string
from dataclasses import dataclass, field
from typing import Sequence

Shape = tuple[int, ...]
# Per tensor, per dimension: the factor indices of that dimension, major to minor.
# An empty tuple is a dimension that no factor covers (size 1, or nothing to say about it).
DimFactors = tuple[tuple[int, ...], ...]


class FactorKind(enum.Enum):
    PASS_THROUGH = "pass-through"
    REDUCTION = "reduction"
    NEED_REPLICATION = "need-replication"

    def __repr__(self) -> str:
        return f"FactorKind.{self.name}"


PASS_THROUGH = FactorKind.PASS_THROUGH
REDUCTION = FactorKind.REDUCTION
NEED_REPLICATION = FactorKind.NEED_REPLICATION


def factor_letter(index: int) -> str:
    """i, j, k, ..., z, a, ..., h, then z_1, z_2, ... like Shardy's printer."""
    letters = string.ascii_lowercase[8:] + string.ascii_lowercase[:8]
    if index < len(letters):
        return letters[index]
    return f"z_{index - len(letters) + 1}"


@dataclass(frozen=True)
class OpRule:
    """The factors of one op.

    operands / results / boundary: per tensor, per dim, the factor indices of that dim.
    `boundary` is only used by region ops (scan, while, cond): it lists the body's inputs and
    outputs so that loop-carried dimensions are tied to the outer operands and results.
    sizes[f]: the size of factor f (product over its dims' shares). kinds[f]: its FactorKind.
    """

    operands: tuple[DimFactors, ...]
    results: tuple[DimFactors, ...]
    sizes: tuple[int, ...]
    kinds: tuple[FactorKind, ...]
    boundary: tuple[DimFactors, ...] = ()
    fallback: bool = False  # True for the conservative rule given to unknown primitives
    # Why a registered rule fell back (its shapes or params were unexpected): the analysis
    # puts it in the warning. Not part of the rule's identity.
    reason: str = field(default="", compare=False)

    @property
    def num_factors(self) -> int:
        return len(self.sizes)

    def factors_of_kind(self, kind: FactorKind) -> tuple[int, ...]:
        return tuple(f for f, k in enumerate(self.kinds) if k is kind)

    def to_text(self) -> str:
        def tensor(dims: DimFactors) -> str:
            return "[" + ", ".join("".join(factor_letter(f) for f in d) or "1" for d in dims) + "]"

        def group(tensors: tuple[DimFactors, ...]) -> str:
            return "(" + ", ".join(tensor(t) for t in tensors) + ")"

        text = f"{group(self.operands)}->{group(self.results)}"
        if self.boundary:
            text += f" body{group(self.boundary)}"
        if self.sizes:
            text += " {" + ", ".join(f"{factor_letter(f)}={s}" for f, s in enumerate(self.sizes)) + "}"
        for kind, label in ((REDUCTION, "reduction"), (NEED_REPLICATION, "need_replication")):
            fs = self.factors_of_kind(kind)
            if fs:
                text += f" {label}={{" + ", ".join(factor_letter(f) for f in fs) + "}"
        return text

    __str__ = to_text

    def __repr__(self) -> str:
        return f"OpRule({self.to_text()!r})"


class RuleBuilder:
    """Builds an OpRule from operand and result shapes.

    >>> b = RuleBuilder([(8, 32), (32, 16)], [(8, 16)])
    >>> b.factor(8, operands={0: 0}, results={0: 0})
    >>> b.factor(32, REDUCTION, operands={0: 1, 1: 0})
    >>> b.factor(16, operands={1: 1}, results={0: 1})
    >>> str(b.build())
    '([i, j], [j, k])->([i, k]) {i=8, j=32, k=16} reduction={j}'

    Dimensions of size 1 are never mapped: a factor of size 1 is dropped, because it can never be
    sharded and tying size-1 dims would merge unrelated classes (broadcasting).
    """

    __slots__ = ("_in", "_out", "_body", "_sizes", "_kinds")

    def __init__(self, in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                 body_shapes: Sequence[Shape] = ()):
        self._in = [[[] for _ in s] for s in in_shapes]
        self._out = [[[] for _ in s] for s in out_shapes]
        self._body = [[[] for _ in s] for s in body_shapes]
        self._sizes: list[int] = []
        self._kinds: list[FactorKind] = []

    def factor(self, size: int, kind: FactorKind = PASS_THROUGH, *,
               operands: dict[int, int] | None = None, results: dict[int, int] | None = None,
               body: dict[int, int] | None = None) -> int | None:
        """Adds a factor of `size` and maps it onto {tensor index: dim} of each side.

        Appends to a dim's factor list, so calling in major-to-minor order builds compound dims.
        Returns the factor index, or None when size <= 1 (nothing to shard).
        """
        if size <= 1:
            return None
        f = len(self._sizes)
        self._sizes.append(int(size))
        self._kinds.append(kind)
        for side, where in ((self._in, operands), (self._out, results), (self._body, body)):
            if where:
                for t, d in where.items():
                    side[t][d].append(f)
        return f

    def build(self, fallback: bool = False) -> OpRule:
        def freeze(side):
            return tuple(tuple(tuple(d) for d in t) for t in side)

        return OpRule(freeze(self._in), freeze(self._out), tuple(self._sizes),
                      tuple(self._kinds), freeze(self._body), fallback)


def conservative_rule(in_shapes: Sequence[Shape], out_shapes: Sequence[Shape],
                      reason: str = "") -> OpRule:
    """The rule for a primitive we know nothing about: every dim needs replication.

    Every dim gets its own need-replication factor, so sharding anything there costs an
    all-gather and no class is tied through the op (we cannot know which dims correspond).
    """
    b = RuleBuilder(in_shapes, out_shapes)
    for i, shape in enumerate(in_shapes):
        for d, n in enumerate(shape):
            b.factor(n, NEED_REPLICATION, operands={i: d})
    for j, shape in enumerate(out_shapes):
        for d, n in enumerate(shape):
            b.factor(n, NEED_REPLICATION, results={j: d})
    rule = b.build(fallback=True)
    return rule if not reason else OpRule(rule.operands, rule.results, rule.sizes, rule.kinds,
                                          rule.boundary, True, reason)
