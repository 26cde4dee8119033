"""analyze(program) -> Analysis: sharding-equivalence classes and conflicts (DESIGN.md §3).

Nodes are (value, dim) pairs; a dim that a reshape splits into a compound of factors also has
one node per factor (value, dim, part). Every factor of every op unions the nodes it maps to.
The connected components are the classes; a class on two dims of one value is a conflict.
"""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from typing import Iterable

import networkx as nx

from ._classes import Conflict, ConflictSide, DimClass
from ._program import INPUT, NO_OP, Program
from ._summary import summary_text
from ._unionfind import UnionFind
from .rules import OpRule, conservative_rule, has_rule, rule_for

NO_CLASS = -1  # sentinel in value_classes: a dim of size 1, never sharded

_DIGITS = re.compile(r"\d+")


class ToastWarning(UserWarning):
    """A toast-lab warning: something was analysed conservatively."""


class UnknownPrimitiveError(ValueError):
    """Raised by analyze(strict=True) for a primitive without a sharding rule."""


_UNKNOWN_PRIMITIVE = (
    "toast-lab has no sharding rule for primitive '{name}' (first at {source}, shapes {ins} -> "
    "{outs}). {action} Add a rule with `toast_lab.rules.register('{name}')`, or report it.")


class Analysis:
    """Classes and conflicts of one program, plus what the cost model needs per op.

    classes[i].id == i; conflicts[j].id == j. value_classes[v][d]: class of dim d of value v
    (NO_CLASS for size-1 dims). op_rules[o]: the OpRule of op o; op_factor_classes[o][f]: the
    class of its factor f.
    """

    def __init__(self, program, classes, conflicts, value_classes, op_rules, op_factor_classes,
                 fallback_ops, grouped):
        self.program: Program = program
        self.classes: tuple[DimClass, ...] = tuple(classes)
        self.conflicts: tuple[Conflict, ...] = tuple(conflicts)
        self.value_classes: tuple[tuple[int, ...], ...] = value_classes
        self.op_rules: tuple[OpRule, ...] = op_rules
        self.op_factor_classes: tuple[tuple[int, ...], ...] = op_factor_classes
        self.fallback_ops: tuple[int, ...] = tuple(fallback_ops)
        self.grouped = grouped
        self._by_name = {c.name: c for c in self.classes}

    def class_named(self, name: str) -> DimClass:
        try:
            return self._by_name[name]
        except KeyError:
            close = [n for n in self._by_name if name.lower() in n.lower()][:5]
            hint = f" Did you mean {close}?" if close else ""
            raise KeyError(f"no class named {name!r} in this analysis.{hint} "
                           f"Classes: {sorted(self._by_name)[:20]}") from None

    def class_of(self, value: int, dim: int) -> DimClass | None:
        c = self.value_classes[value][dim]
        return None if c == NO_CLASS else self.classes[c]

    def dim_names(self, value: int) -> tuple[str | None, ...]:
        """The class name of each dim of a value (None for size-1 dims)."""
        return tuple(None if c == NO_CLASS else self.classes[c].name
                     for c in self.value_classes[value])

    def summary(self, max_classes: int = 40) -> str:
        return summary_text(self, max_classes)

    def __repr__(self) -> str:
        return (f"Analysis({self.program.fn_name!r}: {len(self.classes)} classes, "
                f"{len(self.conflicts)} conflicts, {len(self.program.ops)} ops)")


def analyze(program: Program, group_layers: bool = True, strict: bool = False) -> Analysis:
    """Finds the sharding-equivalence classes and conflicts of `program`.

    group_layers: merge the classes (and conflicts) of repeated layers — same shapes, same
    parameter paths and name scopes up to the layer index — so one decision covers every layer.
    strict: raise UnknownPrimitiveError for a primitive without a rule instead of warning.
    """
    values = program.values
    base = [0] * (len(values) + 1)
    for v in values:
        base[v.id + 1] = base[v.id] + v.ndim
    uf = UnionFind(base[-1])
    part_nodes: dict[tuple[int, int, int], int] = {}
    part_size: dict[int, int] = {}

    rules, op_nodes, fallback_ops = _apply_rules(program, uf, base, part_nodes, part_size, strict)

    merged = _group_layers(program, uf, base) if group_layers else {}
    classes, root_to_class = _make_classes(program, uf, base, part_nodes, part_size, merged)
    value_classes = tuple(
        tuple(root_to_class[uf.find(base[v.id] + d)] if n > 1 else NO_CLASS
              for d, n in enumerate(v.shape))
        for v in values)
    op_factor_classes = tuple(tuple(root_to_class[uf.find(n)] if n >= 0 else NO_CLASS
                                    for n in nodes) for nodes in op_nodes)
    conflicts = _find_conflicts(program, classes, value_classes, rules, op_nodes, uf, base,
                                group_layers)
    return Analysis(program, classes, conflicts, value_classes, tuple(rules), op_factor_classes,
                    fallback_ops, group_layers)


# --- rules -> unions --------------------------------------------------------------------------

def _apply_rules(program, uf, base, part_nodes, part_size, strict):
    """Unions every factor's nodes. Returns per op: its rule and one node per factor."""
    values = program.values
    cache: dict = {}
    warned: set[str] = set()
    rules: list[OpRule] = []
    op_nodes: list[tuple[int, ...]] = []
    fallback_ops: list[int] = []
    for op in program.ops:
        tensors = (op.operands, op.results, op.body)
        ins = tuple(values[v].shape for v in op.operands)
        outs = tuple(values[v].shape for v in op.results)
        key = _cache_key(op, ins, outs)
        entry = cache.get(key) if key is not None else None
        if entry is None:
            rule = _rule(op, ins, outs, values, warned, strict)
            entry = (rule, _factor_places(rule))
            if key is not None:
                cache[key] = entry
        rule, places = entry
        if rule.fallback:
            fallback_ops.append(op.id)
        nodes = []
        for f, where in enumerate(places):
            first = -1
            for side, t, d, part in where:
                v = tensors[side][t]
                if part < 0:
                    node = base[v] + d
                else:
                    node = part_nodes.get((v, d, part))
                    if node is None:
                        node = part_nodes[(v, d, part)] = uf.add()
                        part_size[node] = rule.sizes[f]
                if first < 0:
                    first = node
                else:
                    uf.union(first, node)
            nodes.append(first)
        rules.append(rule)
        op_nodes.append(tuple(nodes))
    return rules, op_nodes, fallback_ops


def _cache_key(op, ins, outs):
    if op.body:
        return None
    try:
        return (op.primitive, ins, outs, tuple(sorted(op.params.items())))
    except TypeError:  # unhashable params (sub-jaxprs): no caching for this op
        return None


def _rule(op, ins, outs, values, warned, strict) -> OpRule:
    if has_rule(op.primitive):
        body = tuple(values[v].shape for v in op.body)
        try:
            return rule_for(op.primitive, ins, outs, op.params, body)
        except Exception as err:  # a rule bug must not crash a user's analysis
            if strict:
                raise
            warnings.warn(f"toast-lab: the rule for '{op.primitive}' failed at {op.source} "
                          f"({type(err).__name__}: {err}); treating it conservatively",
                          ToastWarning, stacklevel=4)
            return conservative_rule(ins, outs)
    if strict:
        raise UnknownPrimitiveError(_UNKNOWN_PRIMITIVE.format(
            name=op.primitive, source=op.source, ins=list(ins), outs=list(outs),
            action="strict=True: refusing to guess."))
    if op.primitive not in warned:
        warned.add(op.primitive)
        warnings.warn(_UNKNOWN_PRIMITIVE.format(
            name=op.primitive, source=op.source, ins=list(ins), outs=list(outs),
            action="Treating every dim as needing replication (pass strict=True to raise)."),
            ToastWarning, stacklevel=4)
    return conservative_rule(ins, outs)


def _factor_places(rule: OpRule):
    """Per factor: where it lives, as (side, tensor, dim, part); part -1 for a whole dim."""
    places: list[list[tuple[int, int, int, int]]] = [[] for _ in rule.sizes]
    for side, tensors in enumerate((rule.operands, rule.results, rule.boundary)):
        for t, dims in enumerate(tensors):
            for d, factors in enumerate(dims):
                compound = len(factors) > 1
                for k, f in enumerate(factors):
                    places[f].append((side, t, d, k if compound else -1))
    return tuple(tuple(p) for p in places)


# --- classes ----------------------------------------------------------------------------------

def _whole_nodes(program, base) -> Iterable[tuple[int, int, int]]:
    """(node, value, dim) for every dim of size > 1, in node order (inputs first)."""
    for v in program.values:
        b = base[v.id]
        for d, n in enumerate(v.shape):
            if n > 1:
                yield b + d, v.id, d


def _make_classes(program, uf, base, part_nodes, part_size, merged):
    """Deterministic ids: classes are numbered by their first node (inputs in argument order)."""
    values = program.values
    members: dict[int, list[tuple[int, int]]] = {}
    sizes: dict[int, int] = {}
    for node, v, d in _whole_nodes(program, base):
        r = uf.find(node)
        if r not in members:
            members[r] = []
            sizes[r] = values[v].shape[d]
        members[r].append((v, d))
    compound: dict[int, int] = defaultdict(int)
    first_part: dict[int, tuple[int, int, int]] = {}
    for key, node in sorted(part_nodes.items(), key=lambda kv: kv[1]):
        r = uf.find(node)
        if r not in members:
            members[r] = []
            sizes[r] = part_size[node]
            first_part[r] = key
        compound[r] += 1
    input_index = {v: i for i, v in enumerate(program.inputs)}
    classes, root_to_class, taken = [], {}, set()
    for r, mem in members.items():
        cid = len(classes)
        root_to_class[r] = cid
        name, aliases, origin = _name_class(program, mem, input_index, first_part.get(r))
        name = _unique(name, taken)
        vals = {v for v, _ in mem}
        classes.append(DimClass(
            id=cid, name=name, size=sizes[r], members=tuple(mem), compound_members=compound[r],
            bytes=sum(values[v].nbytes for v in vals), num_values=len(vals), aliases=aliases,
            layers=merged.get(r, 1), origin=origin))
    return classes, root_to_class


def _name_class(program, members, input_index, first_part):
    """A readable name: the first logical dim name given for an input in the class, else the
    first input's path and dim, else the op where the class first appears."""
    hints = []
    first_input = None
    for v, d in members:
        i = input_index.get(v)
        if i is None:
            continue
        names = program.dim_names[i]
        if names is not None and names[d] is not None and names[d] not in hints:
            hints.append(names[d])
        if first_input is None:
            first_input = (v, d)
    if first_input is not None:
        v, d = first_input
        origin = f"{program.values[v].name}[{d}]"
    elif members:
        v, d = members[0]
        origin = _op_label(program, v, d)
    else:  # only compound parts: named after the reshape that made them
        v, d, k = first_part
        origin = _op_label(program, v, d) + f".{k}"
    if hints:
        return hints[0], tuple(hints[1:]), origin
    if first_input is not None:
        v, d = first_input
        path = program.values[v].name.split("/")
        short = "/".join(path[1:]) if len(path) > 1 else path[0]
        return f"{short}[{d}]", (), origin
    return origin, (), origin


def _op_label(program, v, d) -> str:
    val = program.values[v]
    if val.producer == NO_OP:
        return f"%{v}[{d}]"
    op = program.ops[val.producer]
    scope = f"{op.name_scope}/" if op.name_scope else ""
    return f"{scope}{op.primitive}[{d}]"


def _unique(name: str, taken: set[str]) -> str:
    out, k = name, 1
    while out in taken:
        out = f"{name}_{k}"
        k += 1
    taken.add(out)
    return out


# --- layer grouping ---------------------------------------------------------------------------

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
    normalized = frozenset((_DIGITS.sub("*", where), d) for where, d in chosen)
    layered = any(_DIGITS.search(where) for where, _ in chosen)
    return (size, normalized), layered


def _group_layers(program, uf, base) -> dict[int, int]:
    """Merges the classes of repeated layers. Returns root -> how many layer classes merged."""
    members: dict[int, list[tuple[int, int]]] = defaultdict(list)
    sizes: dict[int, int] = {}
    for node, v, d in _whole_nodes(program, base):
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


# --- conflicts --------------------------------------------------------------------------------

def _find_conflicts(program, classes, value_classes, rules, op_nodes, uf, base, group_layers):
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
        places = _factor_places(rule)
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
    return tuple(c.with_id(i, _unique(f"{c.class_name}@{c.where}", taken))
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
        key = (c.class_id, _DIGITS.sub("*", c.where), val.shape,
               tuple(s.label for s in c.sides))
        if key in groups:
            groups[key] = groups[key].merged(c)
        else:
            groups[key] = c
            order.append(key)
    return [groups[k] for k in order]
