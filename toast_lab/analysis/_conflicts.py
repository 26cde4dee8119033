"""Conflicts: a class landing on two dims of one value, split into sides to resolve."""

from __future__ import annotations

from collections import defaultdict

import networkx as nx

from ._classes import NO_CLASS, Conflict, ConflictSide, unique_name
from ._layers import DIGITS
from ._nodes import factor_places
from ..program import NO_OP
from ._unionfind import UnionFind


def find_conflicts(program, classes, value_classes, rules, uf, base, group_layers):
    """A conflict: a class on two dims of one value. Sides are where each occurrence came from.

    Within a class, the conflicted (value, dim) nodes are split into *sides* by the factors that
    connect them directly (elementwise chains keep query positions with query positions);
    two sides that meet on one value must be resolved against each other, so the sides of one
    conflict are the two colours of the graph "meet on a value".
    """
    conflicted: dict[int, list[int]] = {}  # value -> dims that share a class with another dim
    for v, cls in enumerate(value_classes):
        seen: dict[int, int] = {}
        for d, c in enumerate(cls):
            if c == NO_CLASS:
                continue
            if c in seen:
                conflicted.setdefault(v, [seen[c]])
                conflicted[v].append(d)
            else:
                seen[c] = d
    if not conflicted:
        return ()
    nodes = {base[v] + d for v, dims in conflicted.items() for d in dims}
    side_uf = UnionFind(base[-1])
    # Reconnect conflicted nodes through the factors that touch them directly.
    for op, rule in zip(program.ops, rules):
        places = factor_places(rule)
        tensors = (op.operands, op.results, op.body)
        for where in places:
            hit = [base[tensors[s][t]] + d for s, t, d, part in where
                   if part < 0 and base[tensors[s][t]] + d in nodes]
            if len(hit) > 1:
                side_uf.union_all(hit)
    meet = nx.Graph()
    replicate_only: set[int] = set()
    for v, dims in conflicted.items():
        by_class: dict[int, list[int]] = defaultdict(list)
        for d in dims:
            by_class[value_classes[v][d]].append(d)
        for c, ds in by_class.items():
            roots = [side_uf.find(base[v] + d) for d in ds]
            for r in roots:
                meet.add_node(r, cls=c)
            for a in range(len(roots)):
                for b in range(a + 1, len(roots)):
                    if roots[a] == roots[b] or len(ds) > 2:
                        replicate_only.add(roots[a])
                    else:
                        meet.add_edge(roots[a], roots[b])
    side_members: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for v, dims in conflicted.items():
        for d in dims:
            side_members[side_uf.find(base[v] + d)].append((v, d))
    raw = []
    for component in nx.connected_components(meet):
        sub = meet.subgraph(component)
        cls = next(iter(sub.nodes(data="cls")))[1]
        vals = sorted({v for r in component for v, _ in side_members[r]})
        # The site: where the two occurrences meet — an op whose operands carry the class
        # without conflict (the logits matmul, not the causal mask) — then the largest value.
        val_set = set(vals)
        site_value = min(vals, key=lambda v: (
            not _meets_here(program, value_classes, val_set, v, cls),
            _is_region_result(program, v), -program.values[v].nbytes,
            program.values[v].producer, v))
        colouring = None
        if nx.is_bipartite(sub) and not (component & replicate_only):
            colouring = nx.bipartite.color(sub)
        raw.append((cls, site_value, vals, component, colouring))
    raw.sort(key=lambda item: (item[0], item[1]))
    conflicts = [_make_conflict(program, classes, value_classes, side_members, base, side_uf,
                                *item) for item in raw]
    if group_layers:
        conflicts = _group_conflicts(program, conflicts)
    taken: set[str] = set()
    return tuple(c.with_id(i, unique_name(f"{c.class_name}@{c.where}", taken))
                 for i, c in enumerate(conflicts))


def _meets_here(program, value_classes, conflicted, v, cls) -> bool:
    """True when the op making v brings the class in from operands that are not conflicted."""
    producer = program.values[v].producer
    if producer == NO_OP:
        return False
    operands = program.ops[producer].operands
    carries = [u for u in operands if cls in value_classes[u]]
    return bool(carries) and not any(u in conflicted for u in carries)


def _is_region_result(program, v) -> bool:
    """Scan outputs (stacked residuals) repeat a conflict from the body: not a useful site."""
    producer = program.values[v].producer
    return producer != NO_OP and bool(program.ops[producer].body)


def _make_conflict(program, classes, value_classes, side_members, base, side_uf, cls,
                   site_value, vals, component, colouring):
    val = program.values[site_value]
    site = val.producer
    if site == NO_OP:
        where, source, primitive = f"argument {val.name or site_value}", "", "argument"
    else:
        op = program.ops[site]
        where, source, primitive = (f"{op.name_scope}/{op.primitive}" if op.name_scope
                                    else op.primitive), op.source, op.primitive
    site_dims = [d for d, c in enumerate(value_classes[site_value]) if c == cls]
    sides = ()
    if colouring is not None:
        colour_members: dict[int, list] = defaultdict(list)
        for r in component:
            colour_members[colouring[r]].extend(side_members[r])
        # Order the sides by the dim they hold on the site value, and name them after it.
        by_dim = []
        for colour, mem in colour_members.items():
            d = next(d for d in site_dims if side_uf.find(base[site_value] + d) in
                     {r for r in component if colouring[r] == colour})
            by_dim.append((d, tuple(sorted(mem))))
        by_dim.sort()
        sides = tuple(ConflictSide(label=f"dim{d}", site_dim=d, members=mem) for d, mem in by_dim)
    return Conflict(id=0, class_id=cls, class_name=classes[cls].name, site=site,
                    site_value=site_value, where=where, source=source, primitive=primitive,
                    values=tuple(vals), sides=sides, layers=1)


def _group_conflicts(program, conflicts):
    groups: dict = {}
    order = []
    for c in conflicts:
        val = program.values[c.site_value]
        key = (c.class_id, DIGITS.sub("*", c.where), val.shape,
               tuple(s.label for s in c.sides))
        if key in groups:
            groups[key] = groups[key].merged(c)
        else:
            groups[key] = c
            order.append(key)
    return [groups[k] for k in order]
