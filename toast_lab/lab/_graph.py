"""The drawn graph: the quotient of the program's dataflow by the visible groups.

`ProgramIndex` holds what never changes for a program (who reads what, the classes of each op
and value, the conflict sites, the argument and result nodes). `VisibleGraph` is the quotient
for one set of expanded groups: a node per collapsed group, per drawn op of an open group, per
argument and per result; an edge per pair of nodes that pass tensors, carrying all of them. It
is a networkx DiGraph, rebuilt only when a group is toggled: a pin only recolours it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import jax
import networkx as nx
import numpy as np

from ..program import INPUT, RESULT
from ._scopes import ROOT, ScopeTree


def type_label(value) -> str:
    """'f32[32,1024,768]'; a typed PRNG key array reads 'key<fry>[2]'."""
    # extended dtypes (jax.random.key's key<fry>) have a name but no numpy kind
    kind = {"f": "f", "i": "s", "u": "u", "b": "pred", "c": "c"}.get(
        getattr(value.dtype, "kind", ""), "")
    name = f"{kind}{value.dtype.itemsize * 8}" if kind and kind != "pred" else (
        kind or value.dtype.name)
    return f"{name}[{','.join(map(str, value.shape))}]"


class ProgramIndex:
    """Per program: the dataflow as flat arrays, classes and conflict sites by op and group."""

    def __init__(self, analysis, tree: ScopeTree):
        self.analysis, self.tree = analysis, tree
        prog = analysis.program
        values = prog.values
        # arguments: a node per top-level argument (its leaves' first path component)
        self.arg_names: list[str] = []
        self.arg_of_input: dict[int, int] = {}
        for v in prog.inputs:
            name = values[v].name.split("/")[0] if values[v].name else "args"
            if name not in self.arg_names:
                self.arg_names.append(name)
            self.arg_of_input[v] = self.arg_names.index(name)
        self.arg_bytes = np.zeros(len(self.arg_names))
        self.arg_leaves = np.zeros(len(self.arg_names), np.int64)
        for v, a in self.arg_of_input.items():
            self.arg_bytes[a] += values[v].nbytes
            self.arg_leaves[a] += 1
        self.out_names, self.out_of_leaf = _result_names(prog, self.arg_names, tree)
        # flow pairs: (source op or -1-argument, target op or -1-result, value, operand index)
        src, dst, val, slot = [], [], [], []
        for op in prog.ops:
            for i, v in enumerate(op.operands):
                s = self._source(values[v])
                if s is not None:
                    src.append(s), dst.append(op.id), val.append(v), slot.append(i)
            for v in op.body:
                if values[v].origin == RESULT:
                    src.append(values[v].producer), dst.append(op.id), val.append(v)
                    slot.append(-1)
        for k, v in enumerate(prog.outputs):
            s = self._source(values[v])
            if s is not None:
                src.append(s), dst.append(-1 - self.out_of_leaf[k]), val.append(v)
                slot.append(-1)
        self.pair_src = np.array(src, np.int64)
        self.pair_dst = np.array(dst, np.int64)
        self.pair_value = np.array(val, np.int64)
        self.pair_slot = np.array(slot, np.int64)
        self.value_bytes = np.array([v.nbytes for v in values], np.float64)
        # classes: per op (its factors), per group (its subtree)
        self.op_classes = tuple(tuple(sorted({c for c in fc if c >= 0}))
                                for fc in analysis.op_factor_classes)
        n_groups = len(tree)
        group_classes: list[set[int]] = [set() for _ in range(n_groups)]
        for o, cs in enumerate(self.op_classes):
            for g in tree.ancestors[tree.group_index[o]]:
                group_classes[g].update(cs)
        self.group_classes = tuple(tuple(sorted(s)) for s in group_classes)
        # conflict sites: ops that make a conflicted value from operands that are not
        self.site_conflicts: dict[int, tuple[int, ...]] = {}
        sites: dict[int, set[int]] = defaultdict(set)
        for c in analysis.conflicts:
            conflicted = set(c.values)
            for v in c.values:
                p = values[v].producer
                if p >= 0 and not conflicted.intersection(prog.ops[p].operands):
                    sites[p].add(c.id)
        self.site_conflicts = {o: tuple(sorted(cs)) for o, cs in sites.items()}
        group_conflicts: list[set[int]] = [set() for _ in range(n_groups)]
        for o, cs in self.site_conflicts.items():
            for g in tree.ancestors[tree.group_index[o]]:
                group_conflicts[g].update(cs)
        self.group_conflicts = tuple(tuple(sorted(s)) for s in group_conflicts)

    @staticmethod
    def _source(value):
        if value.origin == INPUT:
            return None if value.producer >= 0 else -2 - value.id  # decoded by VisibleGraph
        if value.origin == RESULT and value.producer >= 0:
            return value.producer
        return None  # constants, literals, body inputs: no edge


def _result_names(prog, arg_names, tree):
    """A name per top-level element of the result (`params′` where it has the structure of an
    argument: the updated state), and the element of each result leaf."""
    out_tree = prog.out_tree
    n = out_tree.num_leaves
    try:
        kids = out_tree.children() if not jax.tree_util.treedef_is_leaf(out_tree) else []
    except Exception:  # an exotic pytree node: one result node
        kids = []
    if not kids:
        return ["result"], [0] * n
    args = prog.in_tree.children()[0].children() if prog.in_tree.children() else []
    shapes = lambda vals: [prog.values[v].shape for v in vals]  # noqa: E731
    arg_shapes, start = [], 0
    for a in args:
        arg_shapes.append(shapes(prog.inputs[start:start + a.num_leaves]))
        start += a.num_leaves
    names, of_leaf = [], []
    for k, kid in enumerate(kids):
        # the same structure and shapes: a scalar loss is not the updated token batch
        mine = shapes(prog.outputs[len(of_leaf):len(of_leaf) + kid.num_leaves])
        same = [i for i, a in enumerate(args)
                if a == kid and kid.num_leaves > 0 and arg_shapes[i] == mine]
        if same and same[0] < len(arg_names):
            names.append(f"{arg_names[same[0]]}′")
        else:  # a single array is named after the scope that made it (the loss)
            names.append(_made_in(prog, tree, len(of_leaf)) if kid.num_leaves == 1 else "")
            names[-1] = names[-1] or f"result[{k}]"
        of_leaf += [k] * kid.num_leaves
    return names, of_leaf + [len(names) - 1] * (n - len(of_leaf))


def _made_in(prog, tree, leaf: int) -> str:
    v = prog.values[prog.outputs[leaf]]
    if v.producer < 0:
        return ""
    scope = tree.group_of(v.producer).id.split("/")[0].rstrip("*")
    return scope if scope not in {n.split("/")[0] for n in prog.input_names} else ""


@dataclass(frozen=True)
class NodeSpec:
    id: str
    kind: str
    group: str | None
    op: int | None
    title: str          # first line of the label
    subtitle: str       # second line
    cluster: str        # the open group it is drawn in (ROOT: top level)
    order: int          # first op, for a stable top-to-bottom order


@dataclass(frozen=True)
class EdgeSpec:
    id: str
    source: int
    target: int
    pairs: np.ndarray       # indices into ProgramIndex.pair_*
    classes: tuple[int, ...]
    label: str
    samples: tuple[int, ...]  # a few values with different classes, largest first (colours)
    backward: bool            # goes up the program order (gradients): no rank constraint


class VisibleGraph:
    """The quotient graph for one set of expanded groups (see the module docstring)."""

    def __init__(self, index: ProgramIndex, expanded: frozenset[str]):
        self.index = index
        tree = index.tree
        prog = index.analysis.program
        self.expanded = frozenset(g for g in expanded if _visible_open(tree, g, expanded))
        self.nodes: list[NodeSpec] = []
        self.clusters: list[tuple[str, str]] = []  # (open group, the cluster it sits in)
        node_of_group = np.full(len(tree), -1, np.int64)  # collapsed groups' node
        op_node: dict[int, int] = {}

        def visit(gid: str, cluster: str):
            g = tree.groups[gid]
            items = [(tree.groups[c].first_op, "g", c) for c in g.children]
            items += [(o, "o", o) for o in g.shown]
            for _, kind, item in sorted(items, key=lambda t: t[0]):
                if kind == "o":
                    op = prog.ops[item]
                    res = prog.values[op.results[0]] if op.results else None
                    op_node[item] = len(self.nodes)
                    self.nodes.append(NodeSpec(f"op.{item}", "op", gid, item, op.primitive,
                                               type_label(res) if res is not None else "",
                                               cluster, item))
                    continue
                child = tree.groups[item]
                if item in self.expanded:
                    self.clusters.append((item, cluster))
                    visit(item, item)
                    continue
                node_of_group[tree.index[item]] = len(self.nodes)
                times = f" ×{child.repeat}" if child.repeat > 1 else ""
                self.nodes.append(NodeSpec(f"group.{item}", "group", item, None,
                                           child.label + times, f"{child.ops:,} ops", cluster,
                                           child.first_op))

        arg_node = np.zeros(len(index.arg_names), np.int64)
        for a, name in enumerate(index.arg_names):
            arg_node[a] = len(self.nodes)
            mib = index.arg_bytes[a] / 2**20
            self.nodes.append(NodeSpec(f"in.{name}", "input", None, None, name,
                                       f"{index.arg_leaves[a]} arrays, {mib:,.1f} MiB", ROOT, -1))
        visit(ROOT, ROOT)
        out_node = np.zeros(len(index.out_names), np.int64)
        for k, name in enumerate(index.out_names):
            out_node[k] = len(self.nodes)
            self.nodes.append(NodeSpec(f"out.{k}", "output", None, None, name, "", ROOT,
                                       len(prog.ops) + k))
        # every op -> its node: the collapsed ancestor's, else its representative's
        shown = np.full(len(tree), -1, np.int64)
        for i in range(len(tree)):
            for a in tree.ancestors[i]:
                if node_of_group[a] >= 0:
                    shown[i] = node_of_group[a]
                    break
        node = shown[tree.group_index]
        for o in np.nonzero(node < 0)[0]:
            node[o] = op_node[int(tree.rep[o])]
        self.node_of_op = node
        # edges: flow pairs between different nodes, grouped by (source, target)
        # (each table padded with a -1 at its end, so that a program of no ops or no outputs
        # indexes an empty one nowhere)
        node_at, out_at = np.append(node, -1), np.append(out_node, -1)
        layer_at = np.append(tree.layer, -1)
        src = np.where(index.pair_src >= 0, node_at[np.maximum(index.pair_src, -1)], -1)
        is_arg = index.pair_src < -1
        if is_arg.any():
            args = np.array([index.arg_of_input[-2 - int(s)] for s in index.pair_src[is_arg]],
                            np.int64)
            src[is_arg] = arg_node[args]
        dst = np.where(index.pair_dst >= 0, node_at[np.maximum(index.pair_dst, -1)],
                       out_at[np.maximum(-1 - index.pair_dst, -1)])
        # one layer's tensors reaching the next layer are the ×N, not an edge inside the group
        both = (index.pair_src >= 0) & (index.pair_dst >= 0)
        ls = np.where(both, layer_at[np.maximum(index.pair_src, -1)], -1)
        ld = np.where(both, layer_at[np.maximum(index.pair_dst, -1)], -1)
        roots = np.append(tree.folded_root, -1)  # index -1: no folded group
        same_group = both & (ls >= 0) & (ld >= 0) & (roots[ls] == roots[ld])
        keep = np.nonzero((src != dst) & ~(same_group & (ls != ld)))[0]
        key = src[keep] * len(self.nodes) + dst[keep]
        order = np.argsort(key, kind="stable")
        keys, starts = np.unique(key[order], return_index=True)
        bounds = list(starts[1:]) + [len(order)]
        self.edges: list[EdgeSpec] = []
        vc = index.analysis.value_classes
        values = prog.values
        for k, a, b in zip(keys, starts, bounds):
            pairs = keep[order[a:b]]
            s, d = int(k // len(self.nodes)), int(k % len(self.nodes))
            vals = np.unique(index.pair_value[pairs])
            vals = vals[np.argsort(-index.value_bytes[vals], kind="stable")]
            classes = sorted({c for v in vals for c in vc[v] if c >= 0})
            samples, seen = [], set()
            for v in vals:
                sig = tuple(vc[v])
                if sig not in seen and len(samples) < 3:
                    seen.add(sig)
                    samples.append(int(v))
            more = f" (+{len(vals) - 1})" if len(vals) > 1 else ""
            ns, nd = self.nodes[s], self.nodes[d]
            self.edges.append(EdgeSpec(f"{ns.id}->{nd.id}", s, d, pairs, tuple(classes),
                                       type_label(values[int(vals[0])]) + more, tuple(samples),
                                       nd.order < ns.order))
        self.graph = nx.DiGraph()
        for i, n in enumerate(self.nodes):
            self.graph.add_node(i, id=n.id)
        for e in self.edges:
            self.graph.add_edge(e.source, e.target, id=e.id)

    def __repr__(self) -> str:
        return (f"VisibleGraph({len(self.nodes)} nodes, {len(self.edges)} edges, open: "
                f"{sorted(self.expanded)})")


def _visible_open(tree: ScopeTree, gid: str, expanded) -> bool:
    """An expanded group is drawn open only when every ancestor is open too."""
    if gid == ROOT or gid not in tree.groups:
        return gid == ROOT
    parent = tree.groups[gid].parent
    return (parent == ROOT or parent in expanded) and (
        parent == ROOT or _visible_open(tree, parent, expanded))
