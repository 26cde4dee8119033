"""DOT of the drawn graph, written with the `graphviz` package (no `dot` binary needed: the
browser lays it out with Graphviz compiled to WebAssembly).

Conventions: node and edge ids are the view model's, also set as `id` so they become the SVG
ids; `class="cls-<id> ..."` lists the classes of the tensors for highlighting; colours are the
classes the plan shards (replicated: neutral grey); conflict sites whose class is sharded are
red double-bordered octagons labelled with what their resolution keeps, those whose class is
replicated (they cost nothing) have a quiet grey second border; a collective paid on an edge is
its `xlabel` (placed after layout, so a new badge does not move the graph). Open groups are
clusters. Edges that run against program order (gradients) do not constrain the ranks, so the
graph reads top to bottom as the forward pass.
"""

from __future__ import annotations

import graphviz

from ._palette import COLLECTIVE, CONFLICT, GROUP_FILL, IDLE, NEUTRAL, tint
from ._scopes import ROOT

# Sizes in points: the page fits the graph to its pane, down to 0.8 px per point (graph.ts,
# MIN_FIT_SCALE), so 11 pt node labels read as 9 px or more; an edge's collective label is
# 12 pt, 11 px from a scale of 0.92 on (the page enlarges it below that).
GRAPH_ATTRS = {"rankdir": "TB", "nodesep": "0.25", "ranksep": "0.3", "fontname": "Helvetica",
               "fontsize": "11", "bgcolor": "transparent", "pad": "0.2", "newrank": "true"}
NODE_ATTRS = {"shape": "box", "style": "rounded,filled", "fillcolor": "white",
              "color": "#5B6570", "fontname": "Helvetica", "fontsize": "11", "height": "0.3",
              "margin": "0.1,0.04"}
EDGE_ATTRS = {"color": NEUTRAL, "arrowsize": "0.6", "fontname": "Helvetica", "fontsize": "12"}


def to_dot(name: str, graph, nodes, edges, colors, conflicts, tree,
           notes: dict | None = None) -> str:
    """DOT source of `graph` (a VisibleGraph) drawn as `nodes` / `edges` (NodeView, EdgeView
    in the same order as the graph's), with class `colors` and ConflictViews `conflicts`;
    `notes` ({open group: text}) are second lines of their clusters' labels (a pipelined
    stack's stages)."""
    dot = graphviz.Digraph(_safe(name), graph_attr=GRAPH_ATTRS, node_attr=NODE_ATTRS,
                           edge_attr=EDGE_ATTRS)
    bodies = {ROOT: dot}
    subgraphs = []
    for gid, parent in graph.clusters:
        g = tree.groups[gid]
        times = f" ×{g.repeat}" if g.repeat > 1 else ""
        note = (notes or {}).get(gid)
        # "\l": each line left-justified, like the cluster's label (labeljust only places it)
        label = f"{g.label}{times}\\l{note}\\l" if note else f"{g.label}{times}"
        sub = graphviz.Digraph(f"cluster_{len(subgraphs)}", graph_attr={
            "label": label, "id": f"cluster:{gid}", "class": "tl-cluster",
            "style": "rounded,dashed", "color": "#5B6570", "fontcolor": "#3C4043",
            "labeljust": "l"})
        bodies[gid] = sub
        subgraphs.append((sub, parent))
    for spec, view in zip(graph.nodes, nodes):
        bodies[spec.cluster].node(_name(view.id), **_node_attrs(view, colors, conflicts))
    for sub, parent in reversed(subgraphs):  # innermost first, into their parents
        bodies[parent].subgraph(sub)
    for spec, view in zip(graph.edges, edges):
        dot.edge(_name(graph.nodes[spec.source].id), _name(graph.nodes[spec.target].id),
                 **_edge_attrs(view, spec.backward, colors))
    return dot.source


def _classes(ids) -> dict:
    return {"class": " ".join(f"cls-{c}" for c in ids)} if ids else {}


def _node_attrs(view, colors, conflicts) -> dict:
    lines = [view.label]
    attrs = {"id": view.id, **_classes(view.classes)}
    main = colors[view.sharded[0]] if view.sharded else None
    if view.kind == "group":
        attrs.update(style="rounded,filled,bold" if main else "rounded,filled",
                     fillcolor=tint(main) if main else GROUP_FILL, color=main or "#5B6570")
    elif view.kind == "op":
        attrs.update(fillcolor=tint(main, 0.88) if main else "white", color=main or "#5B6570",
                     penwidth="1.6" if main else "1")
    else:
        attrs.update(shape="invhouse" if view.kind == "input" else "house", style="filled",
                     fillcolor="#F4F4F4", color=main or "#5B6570")
    marks = [conflicts[c] for c in view.conflicts]
    active = [c for c in marks if c.active]
    if active:  # its class is sharded: the resolution costs something, and says what it keeps
        attrs.update(shape="octagon", peripheries="2", color=CONFLICT, penwidth="1.4",
                     style="filled", fillcolor="#FFF4F3")
        for c in active:
            lines.append(f"⚠ {c.class_name}: {c.label}")
    elif marks:  # replicated: nothing to resolve, nothing to pay; a quiet second border
        attrs.update(peripheries="2", color=IDLE)
        attrs["class"] = " ".join(filter(None, (attrs.get("class"), "tl-conflict-idle")))
    attrs["label"] = "\n".join(lines)
    return attrs


def _edge_attrs(view, backward: bool, colors) -> dict:
    attrs = {"id": view.id, **_classes(view.classes)}
    if view.sharded:
        attrs.update(color=":".join(colors[c] for c in view.sharded), penwidth="1.8")
    if view.badge:
        attrs.update(xlabel=view.badge, fontcolor=COLLECTIVE, style="dashed")
    if backward:
        attrs["constraint"] = "false"
    return attrs


def _name(node_id: str) -> str:
    """A node's DOT name: its id, but for ':', which `graphviz` reads as node:port in an edge
    (a scope or a source line may hold one). The `id` attribute keeps the id itself."""
    return node_id.replace(":", "\u2236")


def _safe(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name) or "program"
