"""A conflict's resolutions in words: what each one keeps.

A conflict is a class on two dims of one value (attention's scores [batch, heads, q, k], both
from the sequence); its sides are those occurrences, and a resolution keeps one side sharded
and gathers the others where they meet, or gathers both (`replicate`). The analysis names a
side after its dim on the site value (`keep_dim2`); here each side is named by where that dim
comes from at the conflict's site, read off the site op's rule:

- a contraction whose two operands each bring one side (a dot_general): when the dims it
  contracts are a `head_dim` class or its batch dims `heads` (attention's q·k), the left
  operand is the query and the right one the key, as the analysis names them (_words.py),
  so the sides are "the query positions" and "the key positions"; any other contraction
  (x @ x.T, a Gram matrix) has "the rows" and "the columns" of its result;
- a matrix (the site value has two dims): its rows and its columns;
- anything else: the side's dim on the site value ("keep seq at dim 2").

The contraction is the site op, else the first dot_general that makes a conflicted value (the
site of x @ x.T under a gradient may be the broadcast of the sum's cotangent).

The class is named by what it indexes where the field has a word for it (seq: positions,
batch: examples), else by its name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..analysis import REPLICATE

# What a class indexes, by the field's word for it.
NOUNS = {"seq": "positions", "batch": "examples", "vocab": "tokens", "heads": "heads",
         "kv_heads": "heads", "experts": "experts", "positions": "positions"}
_ATTENTION = {"head_dim", "heads", "kv_heads"}
_BASE = re.compile(r"^([a-z_]+?)(?:_\d+)?(?:\(.*\))?$")


@dataclass(frozen=True)
class ResolutionWords:
    """label: what the resolution keeps ("keep the query positions", "gather both");
    meaning: one sentence on what it does."""

    label: str
    meaning: str


def base_word(name: str) -> str:
    """The field's word in a class name: 'head_dim(wk,wq)' -> 'head_dim', 'seq_1' -> 'seq'."""
    m = _BASE.match(name)
    return m.group(1) if m else name


def resolution_words(analysis, conflict) -> dict[str, ResolutionWords]:
    """{resolution: its words} for every resolution of `conflict` (module docstring)."""
    cls = conflict.class_name
    noun = NOUNS.get(base_word(cls))
    dims = analysis.dim_names(conflict.site_value)
    value = f"[{', '.join(d or '1' for d in dims)}]"
    sides = _side_phrases(analysis, conflict, noun, value)
    out = {}
    for side, (kept, of) in zip(conflict.sides, sides):
        others = [k for s, (k, _) in zip(conflict.sides, sides) if s is not side]
        gathered = " and ".join(others) or "the other occurrences"
        verb = "are" if len(others) > 1 or gathered.endswith("s") else "is"
        out[side.resolution] = ResolutionWords(
            f"keep {kept}",
            f"{value} stays sharded on {of}; {gathered} {verb} gathered whole where they meet")
    both = "both" if len(conflict.sides) <= 2 else "all"
    out[REPLICATE] = ResolutionWords(
        f"gather {both}",
        f"{cls} is gathered whole on {value} and the values around it, then sharded again "
        f"after: no side keeps it")
    return out


def _side_phrases(analysis, conflict, noun, value) -> list[tuple[str, str]]:
    """Per side: (what keeping it keeps, e.g. 'the query positions'; where the value stays
    sharded, e.g. 'the query positions' or 'dim 2')."""
    cls = conflict.class_name
    found = _contraction(analysis, conflict)
    if found is not None:
        op, slots = found
        if _is_attention(analysis, op):
            phrase = [f"the {r} {noun}" if noun else f"{cls} of the {r}s"
                      for r in ("query", "key")]
        else:
            phrase = ["the rows", "the columns"]
        return [(phrase[s], phrase[s]) for s in slots]
    if len(analysis.program.values[conflict.site_value].shape) == 2:  # a matrix
        return [(f"the {w}", f"the {w}") for w in ("rows", "columns")]
    return [(f"{cls} at dim {s.site_dim}", f"dim {s.site_dim}") for s in conflict.sides]


def _contraction(analysis, conflict):
    """(op, the operand of each side) for the first dot_general making a conflicted value
    (the site first) whose two operands bring one side each, else None."""
    if len(conflict.sides) != 2:
        return None
    prog = analysis.program
    dims = [dict(side.members) for side in conflict.sides]  # value -> that side's dim
    producers = [conflict.site] if conflict.site >= 0 else []
    producers += [prog.values[v].producer for v in conflict.values]
    for o in dict.fromkeys(p for p in producers if p >= 0):
        op, rule = prog.ops[o], analysis.op_rules[o]
        if op.primitive != "dot_general" or not op.results or not rule.results:
            continue
        v = op.results[0]
        if not all(v in d for d in dims):
            continue
        slots = []
        for d in dims:
            factors = set(rule.results[0][d[v]])
            carry = [i for i, tensor in enumerate(rule.operands)
                     if any(factors & set(f) for f in tensor)]
            slots.append(carry[0] if len(carry) == 1 else -1)
        if sorted(slots) == [0, 1]:
            return op, slots
    return None


def _is_attention(analysis, op) -> bool:
    """Whether `op` contracts a head_dim class or batches over heads (q·k)."""
    (lc, _), (lb, _) = op.params["dimension_numbers"]
    lhs = analysis.dim_names(op.operands[0])
    words = {base_word(lhs[d]) for d in (*lc, *lb) if lhs[d]}
    return bool(words & _ATTENTION)


__all__ = ["ResolutionWords", "resolution_words", "base_word", "NOUNS"]
