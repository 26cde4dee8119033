"""Layer grouping: merge the classes of repeated layers so one decision covers them all.

Two classes are the same class in another layer when their signatures match up to layer
indices: the argument paths (or, for classes that touch no argument, the op scopes) they
cover, with digits replaced by '*' — never the dim index.
"""

from __future__ import annotations

import re
from collections import defaultdict

from ._nodes import whole_nodes
from ..program import INPUT, NO_OP

DIGITS = re.compile(r"\d+")


def _location(program, v) -> tuple[str, str]:
    """(kind, where) of a value: its input path, or its op's scope, primitive and result slot."""
    val = program.values[v]
    if val.origin == INPUT:
        return "in", val.name
    if val.producer != NO_OP:
        op = program.ops[val.producer]
        slot = op.results.index(v) if v in op.results else f"body{op.body.index(v)}"
        return "op", f"{op.name_scope}/{op.primitive}:{slot}"
    return val.origin, str(val.shape)


def _class_signature(program, members, size):
    """Equal signatures up to layer indices <=> the same class in another layer.

    Classes that touch inputs compare by their input paths (robust: the first and last layer
    differ slightly in their ops, never in their parameters); others by their ops' scopes.
    Only the path or scope is normalized (digits -> '*'), never the dim index.
    """
    located = [(_location(program, v), d) for v, d in members]
    inputs = [(where, d) for (kind, where), d in located if kind == "in"]
    chosen = inputs or [(where, d) for (_, where), d in located]
    normalized = frozenset((DIGITS.sub("*", where), d) for where, d in chosen)
    layered = any(DIGITS.search(where) for where, _ in chosen)
    return (size, normalized), layered


def group_layers(program, uf, base) -> dict[int, int]:
    """Merges the classes of repeated layers. Returns root -> how many layer classes merged."""
    members: dict[int, list[tuple[int, int]]] = defaultdict(list)
    sizes: dict[int, int] = {}
    for node, v, d in whole_nodes(program, base):
        r = uf.find(node)
        members[r].append((v, d))
        sizes[r] = program.values[v].shape[d]
    groups: dict = defaultdict(list)
    for r, mem in members.items():
        sig, layered = _class_signature(program, mem, sizes[r])
        if layered:
            groups[sig].append(r)
    merged = {}
    for roots in groups.values():
        # Same-looking classes that share a value are not layer copies (an MLP's hidden widths:
        # dense1/w holds both): merging them would invent a conflict. Merge disjoint ones only.
        kept: list[tuple[int, set[int]]] = []
        for r in roots:
            vals = {v for v, _ in members[r]}
            for i, (k, kvals) in enumerate(kept):
                if kvals.isdisjoint(vals):
                    uf.union(k, r)
                    kept[i] = (k, kvals | vals)
                    merged[k] = merged.get(k, 1) + 1
                    break
            else:
                kept.append((r, vals))
    return {uf.find(k): n for k, n in merged.items()}


