"""The scope tree: ops grouped by name scope, repeated layers folded into one group (×N).

Every op belongs to exactly one group, the one named by its scope path. Three steps:

1. the path of an op is its name scope (`block3/attn`; backward ops carry their forward scope);
   an op the user did not scope gets the chain of their calls that made it instead, with the
   layers of a Python loop told apart by the parameters they read (see _calls);
2. a scope with many ops of its own (an optimizer update: thousands of elementwise ops) is
   split by what each op updates: the ops are joined along the tensors they
   pass each other (scalars such as a step count do not join), and each connected chain is
   named by the common suffix of the argument paths it reads (`opt_state/0/mu/blocks/3/attn/wq`
   and `params/blocks/3/attn/wq` give `blocks3/attn/wq`); one still that busy (a norm's
   forward and backward, all one chain) is split by the calls and lines that made its ops;
3. with layer grouping, sibling components that differ only by a layer index (`block0`,
   `block1`, ...) fold into one (`block*`) when their ops match (same primitives and shapes at
   the same relative scopes) and they are layers: each one reads what the previous one made
   (so `ln1` / `ln2`, two different norms in one block, stay apart), or the index comes from an
   argument path (`params/blocks/3/...`, a list of layers).

A folded group is drawn once; each op of the other layers is represented by the op at the same
place in the first layer (its "representative"), so the drawn graph does not grow with depth.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from ..program import INPUT, NO_OP, Program
from ..rules import NARY, UNARY
from ._calls import PATH_INDEX as _PATH_INDEX
from ._calls import call_paths, calls_of, calls_within, collapse_chains

ROOT = ""
SPLIT_AT = 48          # a scope with more ops of its own than this is split by what they update
_ELEMENTWISE = frozenset(UNARY + NARY)
_INDEXED = re.compile(r"^(.*?)(\d+)$")
_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class Group:
    """One node of the scope tree.

    id: the normalized scope path ("" for the root, "block*/attn"). repeat: how many concrete
    scopes it stands for (12 for the layers of a 12-layer model), or how often a scan runs
    its ops (the layers of a scanned stack, drawn once). ops: ops in its subtree, all
    layers counted. direct: its own ops (all layers); shown: the representatives among them,
    the ops drawn when the group is open. first_op: the smallest op id in its subtree.
    """

    id: str
    label: str
    parent: str | None
    children: tuple[str, ...]
    depth: int
    repeat: int
    ops: int
    direct: tuple[int, ...]
    shown: tuple[int, ...]
    first_op: int


class ScopeTree:
    """Groups in pre-order (root first, children by first op), and per op: its group and its
    representative op. `group_index[o]` indexes `ids`."""

    def __init__(self, groups: dict[str, Group], group_index: np.ndarray, rep: np.ndarray,
                 layer: np.ndarray):
        self.groups = groups
        # layer[o]: which copy of its outermost folded group op o is in (-1: none), so that
        # tensors passed from one layer to the next are not drawn as edges inside the group
        self.layer = layer
        self.ids: tuple[str, ...] = tuple(groups)
        self.index = {g: i for i, g in enumerate(self.ids)}
        self.group_index = group_index
        self.rep = rep
        # ancestors[i]: indices of group i's ancestors, root first, i itself last
        anc: list[tuple[int, ...]] = []
        for gid in self.ids:
            g = groups[gid]
            anc.append((anc[self.index[g.parent]] if g.parent is not None else ()) +
                       (self.index[gid],))
        self.ancestors = tuple(anc)

    def group_of(self, op: int) -> Group:
        return self.groups[self.ids[self.group_index[op]]]

    def __len__(self) -> int:
        return len(self.ids)

    def __repr__(self) -> str:
        folded = [f"{g.id}×{g.repeat}" for g in self.groups.values()
                  if g.repeat > 1 and self.groups[g.parent or ROOT].repeat == 1]
        return f"ScopeTree({len(self.ids)} groups; folded: {', '.join(folded) or 'none'})"


def build_scope_tree(program: Program, fold_layers: bool = True,
                     split_at: int = SPLIT_AT) -> ScopeTree:
    paths = [tuple(c for c in op.name_scope.split("/") if c) for op in program.ops]
    unscoped = [op.id for op in program.ops if not op.user_scope]
    # the library helpers' scopes stay inside the call (a line whose only work is one einsum
    # is that line)
    calls = calls_of(program)
    inside = collapse_chains({o: chain + paths[o]
                              for o, chain in call_paths(program, unscoped, calls).items()})
    for o, path in inside.items():
        paths[o] = path
    paths = _split_flat_scopes(program, paths, split_at)
    paths = _split_busy_scopes(program, paths, split_at, calls)
    norm = _fold_layers(program, paths) if fold_layers else [
        tuple(c.replace(_PATH_INDEX, "") for c in p) for p in paths]
    concrete = [tuple(c.replace(_PATH_INDEX, "") for c in p) for p in paths]
    return _assemble(program, norm, concrete)


# --- step 2: split big flat scopes by what their ops update -------------------------------------

def _split_flat_scopes(program, paths, split_at):
    by_path: dict[tuple, list[int]] = defaultdict(list)
    for o, p in enumerate(paths):
        by_path[p].append(o)
    out = list(paths)
    values = program.values
    for path, ops in by_path.items():
        if len(ops) <= split_at:
            continue
        members = set(ops)
        parent = {o: o for o in ops}

        def find(o):
            while parent[o] != o:
                parent[o] = parent[parent[o]]
                o = parent[o]
            return o

        for o in ops:
            for v in program.ops[o].operands:
                p = values[v].producer
                if p in members and values[v].ndim > 0:
                    parent[find(o)] = find(p)
        chains: dict[int, list[int]] = defaultdict(list)
        for o in ops:
            chains[find(o)].append(o)
        named = {}
        for root, chain in chains.items():
            inputs = {values[v].name for o in chain for v in program.ops[o].operands
                      if values[v].origin == INPUT and values[v].name}
            if not inputs:  # Adam's bias correction reads moments updated in another call
                inputs = _updated(program, chain) or _read_alongside(program, chain)
            suffix = _common_suffix([n.split("/") for n in inputs])
            # a layer the path already names (`loss_fn/layers3/rms`) is not named again
            named_here = tuple(c for c in _path_components(suffix) if c not in path)
            if named_here:
                named[root] = named_here
        if len(set(named.values())) < 2:
            continue  # nothing to tell apart
        name_of = {o: named[root] for root, chain in chains.items() if root in named
                   for o in chain}
        _name_scalars(program, ops, name_of)
        for o, name in name_of.items():
            out[o] = path + name
    return out


def _name_scalars(program, ops, name_of):
    """A scalar op takes the name of the one update its neighbours in the scope belong to:
    `tree.map` repeats a scalar's arithmetic per parameter (MultiSteps' `1 - 1/k`, a block's
    RMS), and a scalar links no chain to another, so none of them was named."""
    values, members = program.values, set(ops)
    scalars = [o for o in ops if o not in name_of
               and not any(values[r].ndim for r in program.ops[o].results)]
    for sweep in (reversed(scalars), scalars):  # from readers back, then from producers on
        for o in sweep:
            op = program.ops[o]
            near = {u for r in op.results for u in program.users(r)}
            near |= {values[v].producer for v in op.operands}
            names = {name_of.get(u) for u in near if u in members}
            names.discard(None)
            if len(names) == 1 and o not in name_of:
                name_of[o] = names.pop()


def _updated(program, chain, hops: int = 6) -> set[str]:
    """The arguments a chain updates when it reads none itself: those met first going back
    through elementwise ops from its operands (`mu / (1 - b1**t)` reads the new moment, made
    from `opt_state/0/mu/...`), and out of the loops and branches that hold it (optax's
    MultiSteps accumulates inside a cond). A gradient, made by a matmul or a convolution,
    stops the walk: what it reads does not name what is updated."""
    ops, values = program.ops, program.values
    return _arguments_behind(program, {v for o in chain for v in ops[o].operands
                                       if values[v].ndim > 0}, hops)


def _arguments_behind(program, frontier: set[int], hops: int) -> set[str]:
    values, ops = program.values, program.ops
    seen = set(frontier)
    for _ in range(hops):
        frontier = {program.outer_operand(v) for v in frontier}
        found = {values[v].name for v in frontier if values[v].origin == INPUT}
        if found:
            return found
        back = set()
        for v in frontier:
            p = values[v].producer
            if p != NO_OP and ops[p].primitive in _ELEMENTWISE:
                back |= {u for u in ops[p].operands
                         if values[u].shape == values[v].shape and u not in seen}
        seen |= back
        frontier = back
    return set()


def _read_alongside(program, chain, hops: int = 4) -> set[str]:
    """The arguments updated from what a chain reads, where it reads a gradient (made by a
    matmul): `clip_by_global_norm` squares each gradient that Adam's moments then read
    (`b1 * mu + (1 - b1) * g**1`, past the clip's `select_n`). Found going forward through
    the elementwise ops that read the same tensors, to one that adds in an argument."""
    values, ops = program.values, program.ops
    members = set(chain)
    frontier = {v for o in chain for v in ops[o].operands
                if values[v].ndim > 0 and values[v].producer not in members}
    seen = set(frontier)
    for _ in range(hops):
        found, ahead = set(), set()
        for v in frontier:
            for u in program.users(v):
                op = ops[u]
                if u in members or op.primitive not in _ELEMENTWISE:
                    continue
                others = {w for w in op.operands
                          if w not in seen and values[w].shape == values[v].shape}
                found |= _arguments_behind(program, others, hops=2)
                ahead |= {r for r in op.results
                          if values[r].shape == values[v].shape and r not in seen}
        if found:
            return found
        seen |= ahead
        frontier = ahead
    return set()


def _split_busy_scopes(program, paths, split_at, calls):
    """A scope of the user's still too busy to draw op by op (a norm's forward and backward,
    not an update of many tensors) shows the calls its ops came from, and its busy lines."""
    by_path: dict[tuple, list[int]] = defaultdict(list)
    for o, p in enumerate(paths):
        if program.ops[o].user_scope:
            by_path[p].append(o)
    out = list(paths)
    for path, ops in by_path.items():
        if len(ops) <= split_at:
            continue
        below = calls_within(calls, ops)
        if len(set(below.values())) < 2:
            continue  # one call, one line: nothing to tell apart
        for o in ops:
            out[o] = path + below[o]
    return out


def _common_suffix(paths: list[list[str]]) -> list[str]:
    """The longest common tail of argument paths, never the argument's own name."""
    if not paths:
        return []
    limit = min(len(p) for p in paths) - 1
    k = 0
    while k < limit and len({p[-1 - k] for p in paths}) == 1:
        k += 1
    return paths[0][len(paths[0]) - k:] if k else []


def _path_components(suffix: list[str]) -> tuple[str, ...]:
    """['blocks', '3', 'attn', 'wq'] -> ('blocks\\x003', 'attn', 'wq'): a list index joins the
    component before it, marked as an index from an argument path."""
    out: list[str] = []
    for part in suffix:
        if part.isdigit():
            if out:  # a leading index (`0/count` of a tuple of states) says nothing
                out.append(out.pop() + _PATH_INDEX + part)
        else:
            out.append(part)
    return tuple(out)


# --- step 3: fold repeated layers -------------------------------------------------------------

def _fold_layers(program, paths):
    n = len(paths)
    norm: list[list[str]] = [[] for _ in range(n)]
    depth = max((len(p) for p in paths), default=0)
    for k in range(depth):
        buckets: dict[tuple, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
        for o in range(n):
            if len(paths[o]) <= k:
                continue
            m = _INDEXED.match(paths[o][k])
            if m:
                buckets[(tuple(norm[o]), m.group(1))][paths[o][k]].append(o)
        renamed: dict[tuple, str] = {}
        for (prefix, stem), instances in buckets.items():
            if len(instances) < 2:
                continue
            for comp in _layers(program, paths, k, instances):
                renamed[(prefix, comp)] = stem.replace(_PATH_INDEX, "") + "*"
        for o in range(n):
            if len(paths[o]) > k:
                c = paths[o][k]
                norm[o].append(renamed.get((tuple(norm[o]), c), c.replace(_PATH_INDEX, "")))
    return [tuple(p) for p in norm]


def _layers(program, paths, k, instances: dict[str, list[int]]) -> list[str]:
    """The components among `instances` (component -> its ops) that are copies of one layer."""
    by_signature: dict[frozenset, list[str]] = defaultdict(list)
    for comp, ops in instances.items():
        sig = Counter((tuple(_DIGITS.sub("*", c) for c in paths[o][k + 1:]),
                       program.ops[o].primitive,
                       tuple(program.values[r].shape for r in program.ops[o].results))
                      for o in ops)
        by_signature[frozenset(sig.items())].append(comp)
    alike = max(by_signature.values(), key=len)
    if all(_PATH_INDEX in c for c in instances) and len(instances) > len(alike):
        # Layers by construction (a list in the arguments), whose first and last differ at the
        # ends (the embedding's add, a last residual): fold those that nearly match.
        alike = _nearly_alike(program, instances)
    if len(alike) < 2:
        return []
    alike.sort(key=lambda c: int(_INDEXED.match(c).group(2)))
    if all(_PATH_INDEX in c for c in alike):
        return alike  # indices of a list in the arguments: layers by construction
    # Each layer reads what the one before made, within one parent (block3/ln2 reading
    # block4/ln1's gradient does not make ln1 and ln2 layers).
    by_parent: dict[tuple, dict[str, set[int]]] = defaultdict(lambda: defaultdict(set))
    for c in alike:
        for o in instances[c]:
            by_parent[paths[o][:k]][c].add(o)
    for comps in by_parent.values():
        op_sets = [comps[c] for c in alike if c in comps]
        for prev, nxt in zip(op_sets, op_sets[1:]):
            if not any(program.values[v].producer in prev
                       for o in nxt for v in program.ops[o].operands):
                return []
    return alike


def _nearly_alike(program, instances, tolerance: float = 0.1) -> list[str]:
    """The components whose ops differ from the most common op count's by at most
    `tolerance` of them (primitive and result shapes, as a multiset)."""
    sigs = {comp: Counter((program.ops[o].primitive,
                           tuple(program.values[r].shape for r in program.ops[o].results))
                          for o in ops) for comp, ops in instances.items()}
    sizes = Counter(len(instances[c]) for c in instances)
    typical = next(c for c in instances if len(instances[c]) == sizes.most_common(1)[0][0])
    return [c for c, sig in sigs.items()
            if sum(((sig - sigs[typical]) + (sigs[typical] - sig)).values())
            <= tolerance * len(instances[typical])]


# --- the tree ---------------------------------------------------------------------------------

def _assemble(program, norm, concrete) -> ScopeTree:
    n = len(norm)
    direct: dict[str, list[int]] = defaultdict(list)
    instances: dict[str, set[tuple]] = defaultdict(set)
    subtree_ops: Counter = Counter()
    trips: dict[str, Counter] = defaultdict(Counter)
    first: dict[str, int] = {}
    for o in range(n):
        path = norm[o]
        for d in range(len(path) + 1):
            gid = "/".join(path[:d])
            instances[gid].add(concrete[o][:d])
            subtree_ops[gid] += 1
            trips[gid][program.ops[o].trip_count] += 1
            first.setdefault(gid, o)
        direct["/".join(path)].append(o)
    if ROOT not in first:  # a program with no ops
        first[ROOT] = 0
        instances[ROOT].add(())
    children: dict[str, list[str]] = defaultdict(list)
    for gid in first:
        if gid != ROOT:
            children[gid.rpartition("/")[0] if "/" in gid else ROOT].append(gid)
    rep = np.arange(n, dtype=np.int64)
    shown: dict[str, tuple[int, ...]] = {}
    for gid, ops in direct.items():
        shown[gid] = _representatives(program, ops, concrete, gid.count("/") + 1 if gid else 0,
                                      rep)
    groups: dict[str, Group] = {}

    def visit(gid: str, parent: str | None, depth: int):
        kids = tuple(sorted(children.get(gid, ()), key=lambda c: first[c]))
        label = gid.rpartition("/")[2] if gid else program.fn_name
        repeat = len(instances[gid])
        if repeat == 1 and gid:  # layers under a scan: one body that runs `length` times
            # judged by the group's own ops where it has some: a function holding the loop
            # (`loss_fn`, its embedding and head outside) does not repeat
            own = Counter(program.ops[o].trip_count for o in direct.get(gid, ()))
            trip, count = (own or trips[gid]).most_common(1)[0]
            repeat = trip if trip > 1 and 2 * count >= (sum(own.values()) or
                                                        subtree_ops[gid]) else 1
        groups[gid] = Group(gid, label, parent, kids, depth, repeat,
                            subtree_ops[gid], tuple(direct.get(gid, ())), shown.get(gid, ()),
                            first[gid])
        for c in kids:
            visit(c, gid, depth + 1)

    visit(ROOT, None, 0)
    index = {g: i for i, g in enumerate(groups)}
    group_index = np.array([index["/".join(p)] for p in norm], np.int64)
    layer = np.full(n, -1, np.int64)
    layer_codes: dict[tuple, int] = {}
    folded_root: list[int] = []
    for o in range(n):
        for d in range(1, len(norm[o]) + 1):
            gid = "/".join(norm[o][:d])
            if groups[gid].repeat > 1:
                key = (gid, concrete[o][:d])
                if key not in layer_codes:
                    layer_codes[key] = len(layer_codes)
                    folded_root.append(index[gid])
                layer[o] = layer_codes[key]
                break
    tree = ScopeTree(groups, group_index, rep, layer)
    tree.folded_root = np.array(folded_root, np.int64)  # layer code -> its folded group
    return tree


def _representatives(program, ops, concrete, depth, rep) -> tuple[int, ...]:
    """The ops drawn for a group: those of its first instance; every op of a later instance is
    mapped (in `rep`) to the op of the first with the same primitive and shapes, in order."""
    by_instance: dict[tuple, list[int]] = defaultdict(list)
    for o in ops:
        by_instance[concrete[o][:depth]].append(o)
    if len(by_instance) == 1:
        return tuple(ops)
    first_instance = min(by_instance.values(), key=lambda os: os[0])

    def keys(os):
        seen: Counter = Counter()
        out = []
        for o in os:
            op = program.ops[o]
            k = (op.primitive, tuple(program.values[r].shape for r in op.results))
            out.append((k, seen[k]))
            seen[k] += 1
        return out

    anchor = dict(zip(keys(first_instance), first_instance))
    shown = set(first_instance)
    for os in by_instance.values():
        if os is first_instance:
            continue
        for o, key in zip(os, keys(os)):
            if key in anchor:
                rep[o] = anchor[key]
            else:  # no counterpart in the first layer: drawn on its own
                shown.add(o)
    return tuple(sorted(shown))
