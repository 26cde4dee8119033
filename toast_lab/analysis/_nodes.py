"""Nodes of the class graph: one per (value, dim) of size > 1, and where factors land."""

from __future__ import annotations

from typing import Iterable

from ..rules import OpRule


def whole_nodes(program, base) -> Iterable[tuple[int, int, int]]:
    """(node, value, dim) for every dim of size > 1, in node order (inputs first)."""
    for v in program.values:
        b = base[v.id]
        for d, n in enumerate(v.shape):
            if n > 1:
                yield b + d, v.id, d


def factor_places(rule: OpRule):
    """Per factor: where it lives, as (side, tensor, dim, part); part -1 for a whole dim."""
    places: list[list[tuple[int, int, int, int]]] = [[] for _ in rule.sizes]
    for side, tensors in enumerate((rule.operands, rule.results, rule.boundary)):
        for t, dims in enumerate(tensors):
            for d, factors in enumerate(dims):
                compound = len(factors) > 1
                for k, f in enumerate(factors):
                    places[f].append((side, t, d, k if compound else -1))
    return tuple(tuple(p) for p in places)
