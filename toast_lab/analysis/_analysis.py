"""analyze(program) -> Analysis: sharding-equivalence classes and conflicts (DESIGN.md §3).

Nodes are (value, dim) pairs; a dim that a reshape splits into a compound of factors also has
one node per factor (value, dim, part). Every factor of every op unions the nodes it maps to.
The connected components are the classes; a class on two dims of one value is a conflict.
"""

from __future__ import annotations

import threading
import warnings
from collections import defaultdict
from dataclasses import replace

from ._classes import MINOR_SHARE, NO_CLASS, Conflict, DimClass, unique_name
from ._conflicts import find_conflicts
from ._domains import domains
from ._field_names import field_names
from ._layers import group_layers as _group_layers
from ._names import class_names
from ._nodes import factor_places, whole_nodes
from ._roles import find_roles
from ._words import field_words
from ..program import Program
from ._summary import summary_text
from ._unionfind import UnionFind
from ..rules import OpRule, conservative_rule, has_rule, rule_for


class ToastWarning(UserWarning):
    """A toast-lab warning: something was analysed conservatively."""


class UnknownPrimitiveError(ValueError):
    """Raised by analyze(strict=True) for a primitive without a sharding rule, or one whose
    rule cannot map the op (where analyze would otherwise fall back and warn)."""


_UNKNOWN_PRIMITIVE = (
    "toast-lab has no sharding rule for primitive '{name}' (first at {source}, shapes {ins} -> "
    "{outs}); add one with `toast_lab.rules.register('{name}')`, or report it.")
_RULE_FAILED = (
    "toast-lab's sharding rule for primitive '{name}' cannot map the op at {source} (shapes "
    "{ins} -> {outs}: {reason}); please report it.")


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
        self._former: dict[str, DimClass] = {}
        for c in self.classes:
            for name in c.formerly:
                if name not in self._by_name:
                    self._former.setdefault(name, c)
        origins = defaultdict(list)
        for c in self.classes:
            origins[c.origin].append(c)
        for origin, alike in origins.items():  # an origin names a class where only one has it
            if origin and len(alike) == 1 and origin not in self._by_name:
                self._former.setdefault(origin, alike[0])
        self._derived: dict = {}
        self._derived_lock = threading.RLock()

    def derived(self, key, build):
        """`build()`, once per `key`, kept with this analysis: what later stages derive from it
        (the cost model's tables) lives as long as it does. Thread-safe: the Lab's UI thread and
        its search thread share one; reentrant, so a build may ask for another key."""
        with self._derived_lock:
            if key not in self._derived:
                self._derived[key] = build()
            return self._derived[key]

    def class_named(self, name: str) -> DimClass:
        """The class called `name`, or formerly called so (plan files saved before classes
        were named from the field: `lm_head/kernel[0]` for `embed`; before classes that share
        a dim name were told apart: `head_dim_1`; before flax's annotations named them:
        `up/kernel[0]` for `embed`), or by its origin (`params/lm_head/kernel[0]`)."""
        try:
            return self._by_name[name] if name in self._by_name else self._former[name]
        except (KeyError, TypeError):
            if not isinstance(name, str):
                raise KeyError(f"class names are str, got {type(name).__name__}") from None
            close = [n for n in self._by_name if name.lower() in n.lower()][:5]
            hint = f" Did you mean {close}?" if close else ""
            shown = repr(name) if len(name) <= 60 else repr(name[:57] + "...")
            raise KeyError(f"no class named {shown} in this analysis.{hint} "
                           f"Classes: {sorted(self._by_name)[:20]}") from None

    def class_of(self, value: int, dim: int) -> DimClass | None:
        c = self.value_classes[value][dim]
        return None if c == NO_CLASS else self.classes[c]

    def dim_names(self, value: int) -> tuple[str | None, ...]:
        """The class name of each dim of a value (None for size-1 dims)."""
        return tuple(None if c == NO_CLASS else self.classes[c].name
                     for c in self.value_classes[value])

    @property
    def layer_groups(self):
        """The layer groups a remat decision covers (see _layer_groups.py), in program order."""
        from ._layer_groups import layer_groups

        return layer_groups(self)

    @property
    def micro_batching(self):
        """Whether the batch splits into micro-batches (a MicroBatching: `legal`, the `reason`
        and `source` line where not, the legal `counts`; see _micro_batching.py)."""
        from ._micro_batching import micro_batching

        return micro_batching(self)

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
    classes, root_to_class, path_names, hinted = _make_classes(
        program, uf, base, part_nodes, part_size, merged)
    value_classes = tuple(
        tuple(root_to_class[uf.find(base[v.id] + d)] if n > 1 else NO_CLASS
              for d, n in enumerate(v.shape))
        for v in values)
    op_factor_classes = tuple(tuple(root_to_class[uf.find(n)] if n >= 0 else NO_CLASS
                                    for n in nodes) for nodes in op_nodes)
    # The roles and shape patterns that name classes read an analysis: one with the path
    # names first, whose roles and domains (which depend on ids, not names) the result keeps.
    draft = Analysis(program, classes, (), value_classes, tuple(rules), op_factor_classes,
                     fallback_ops, group_layers)
    roles = find_roles(draft)
    names = field_names(draft, field_words(draft, roles), path_names, hinted)
    classes = _renamed(classes, names)
    conflicts = find_conflicts(program, classes, value_classes, rules, uf, base, group_layers)
    an = Analysis(program, classes, conflicts, value_classes, tuple(rules), op_factor_classes,
                  fallback_ops, group_layers)
    an.derived("roles", lambda: roles)
    an.derived("domains", lambda: domains(draft))
    return an


def _renamed(classes, names) -> list[DimClass]:
    """The classes under their field names; the path name each had goes first in `formerly`,
    and a class with almost nothing at stake is marked `minor` (see `minor_classes`)."""
    top = max((c.bytes for c in classes), default=0)
    out = []
    for c, name in zip(classes, names):
        formerly = tuple(n for n in dict.fromkeys((c.name, *c.formerly)) if n != name)
        out.append(replace(c, name=name, formerly=formerly,
                           minor=c.bytes < MINOR_SHARE * top))
    return out


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
            entry = (rule, factor_places(rule))
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
    """The op's rule. A primitive without a rule, or a rule that cannot map this op (it raised,
    or its shapes or params are not the ones it knows), gets the conservative rule with one
    warning per primitive naming it and the user's source line; strict=True raises instead."""
    if has_rule(op.primitive):
        body = tuple(values[v].shape for v in op.body)
        try:
            rule = rule_for(op.primitive, ins, outs, op.params, body)
        except Exception as err:  # a rule bug must not crash a user's analysis
            rule = conservative_rule(ins, outs,
                                     reason=f"the rule raised {type(err).__name__}: {err}")
        if not rule.fallback:
            return rule
        problem = _RULE_FAILED.format(name=op.primitive, source=op.source, ins=list(ins),
                                      outs=list(outs), reason=_short(rule.reason))
    else:
        problem = _UNKNOWN_PRIMITIVE.format(name=op.primitive, source=op.source, ins=list(ins),
                                            outs=list(outs))
        rule = conservative_rule(ins, outs)
    if strict:
        raise UnknownPrimitiveError(f"{problem} strict=True: refusing to guess.")
    if op.primitive not in warned:
        warned.add(op.primitive)
        warnings.warn(f"{problem} Treating every dim as needing replication (pass strict=True "
                      f"to raise).", ToastWarning, stacklevel=4)
    return rule


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


# --- classes ----------------------------------------------------------------------------------

def _make_classes(program, uf, base, part_nodes, part_size, merged):
    """Deterministic ids: classes are numbered by their first node (inputs in argument order)."""
    values = program.values
    members: dict[int, list[tuple[int, int]]] = {}
    sizes: dict[int, int] = {}
    for node, v, d in whole_nodes(program, base):
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
    names, eras, hinted = class_names(program, list(members.values()),
                                      [first_part.get(r) for r in members])
    classes, root_to_class, taken = [], {}, set()
    taken_then = [set() for _ in eras]
    for (r, mem), (name, aliases, origin) in zip(members.items(), names):
        cid = len(classes)
        root_to_class[r] = cid
        # the names older toast-labs gave it (`head_dim_1`), made unique as they made them,
        # which plan files may hold
        then = [unique_name(era[cid], t) for era, t in zip(eras, taken_then)]
        name = unique_name(name, taken)
        vals = {v for v, _ in mem}
        classes.append(DimClass(
            id=cid, name=name, size=sizes[r], members=tuple(mem), compound_members=compound[r],
            bytes=sum(values[v].nbytes for v in vals), num_values=len(vals), aliases=aliases,
            layers=merged.get(r, 1), origin=origin,
            formerly=tuple(n for n in dict.fromkeys(then) if n != name)))
    # the path names as the field names start from: the user's and flax's names as made
    # unique, the others not yet (two alike are told apart there, not by a suffix)
    path_names = [c.name if hint else name
                  for c, hint, (name, _, _) in zip(classes, hinted, names)]
    return classes, root_to_class, path_names, hinted


def minor_classes(an: Analysis, share: float = MINOR_SHARE) -> tuple[DimClass, ...]:
    """The classes whose bytes at stake are under `share` of the largest class's (with the
    default share, those marked `DimClass.minor`), largest first: a decision list shows them
    under one "minor" entry."""
    top = max((c.bytes for c in an.classes), default=0)
    return tuple(sorted((c for c in an.classes if c.bytes < share * top),
                        key=lambda c: (-c.bytes, c.id)))
