"""What XLA's constant folding and algebraic simplifier leave of the program, read from its
constants: which values are computed from constants alone (folded before partitioning), which
hold one number throughout (a broadcast zero), and which ops compute nothing (x + 0, x * 1).

Built from the program alone, once per analysis; the flop counts (_flops.py), the op facts
(_op_facts.py) and the operand rows (_operand_rows.py) read them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..program import CONST, LITERAL


class Folding(NamedTuple):
    """folded: [V] bool, values computed from constants alone; uniform: {value id: the one
    number all its elements hold}."""

    folded: np.ndarray
    uniform: dict


def constant_folding(prog) -> Folding:
    """The Folding of program `prog`."""
    folded = constant_values(prog)
    return Folding(folded, uniform_constants(prog, folded))


def constant_values(prog) -> np.ndarray:
    """[V] bool: values computed from constants and literals alone (XLA folds them)."""
    const = np.array([v.origin in (CONST, LITERAL) for v in prog.values], bool)
    for op in prog.ops:
        if op.operands and not op.body and all(const[u] for u in op.operands):
            const[list(op.results)] = True
    return const


# Elementwise arithmetic on a constant that keeps it one value throughout (a broadcast zero,
# its square): what uniform_constants evaluates.
_UNIFORM_MAPS = {
    "broadcast_in_dim": lambda a: a, "reshape": lambda a: a, "convert_element_type": lambda a: a,
    "neg": np.negative, "square": np.square, "add": np.add, "add_any": np.add,
    "sub": np.subtract, "mul": np.multiply,
}
# The operand of these ops that XLA's AlgebraicSimplifier drops when it is this constant
# (x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1), leaving the other: the op computes nothing.
_IDENTITIES = {"add": ((0, 0.0), (1, 0.0)), "add_any": ((0, 0.0), (1, 0.0)),
               "sub": ((1, 0.0),), "mul": ((0, 1.0), (1, 1.0)), "div": ((1, 1.0),)}


def uniform_constants(prog, folded) -> dict[int, float]:
    """Value id -> the one number all its elements hold, for the literals and scalar or
    uniform constants and what _UNIFORM_MAPS make of them alone."""
    known = {}
    for v, c in prog.constants.items():
        a = np.asarray(c)
        if a.dtype.kind in "fiub" and a.size and np.all(a == a.flat[0]):
            known[v] = a.flat[0].item()
    for op in prog.ops:
        f = _UNIFORM_MAPS.get(op.primitive)
        if f is not None and len(op.results) == 1 and folded[op.results[0]] \
                and all(u in known for u in op.operands):
            with np.errstate(all="ignore"):
                known[op.results[0]] = np.asarray(f(*(known[u] for u in op.operands))).item()
    return known


def simplified_away(op, folded, uniform) -> bool:
    """Whether XLA leaves nothing of the op to compute: its results come from constants
    alone (constant folding; an elementwise op of a broadcast constant is moved before the
    broadcast, onto one element), or it is an identity of _IDENTITIES (optax's global norm
    adds the square of a zero imaginary part to every leaf's square, and its clipping
    multiplies by a max norm of 1.0: as many flops again as the norm, none in XLA)."""
    if op.body or not op.operands or op.primitive == "random_bits":
        return False
    if all(folded[r] for r in op.results):
        return True
    return any(uniform.get(op.operands[i]) == x for i, x in _IDENTITIES.get(op.primitive, ())
               if i < len(op.operands))
