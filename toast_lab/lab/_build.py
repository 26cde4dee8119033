"""ViewBuilder: a session's state -> ViewModel.

What depends only on the program (the scope tree, the dataflow index, the conflicts' words) is
built once; the quotient graph once per set of open groups; a pin only recolours it, labels its
collectives and re-prices the choices. The prices are kept for the last plan priced: a running
search publishes its best plan a few times a second, and each new best is priced once (tens of
milliseconds on GPT-2-small), so the choices always show the best plan so far's prices. The
collectives of a selected op or edge are explained (_explain.py) once per plan and selection.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import numpy as np

from ._counterfactuals import (axes_label, class_choices, conflict_choices, shared_values,
                               unpriced_choice)
from ._details import op_details, snippet
from ._dot import to_dot
from ._explain import Explainer
from ._graph import ProgramIndex, VisibleGraph
from ._memory import memory_view
from ._palette import class_colors, legend_classes
from ._resolutions import resolution_words
from ._schedule import schedule_view
from ._scopes import ROOT, build_scope_tree
from ._start import ruled_out
from ._step_choices import offered, step_choices, step_view
from ._viewmodel import (ClassView, ConflictView, EdgeView, ExpertRow, ExplainedView, GraphView,
                         GroupView, MemoryView, NodeView, SearchView, StartView, ViewModel,
                         _plain)

GRAPH_CACHE = 8  # quotient graphs kept (sets of open groups a person toggles between)
DEFAULT_NODES = 40  # what the graph opens with: about what one screen shows legibly


class ViewBuilder:
    """Builds the ViewModel of a Session. `fold_layers`: draw repeated layers once (default:
    when the analysis grouped layers)."""

    def __init__(self, analysis, mesh, fold_layers: bool | None = None):
        self.analysis, self.mesh = analysis, mesh
        self.tree = build_scope_tree(analysis.program,
                                     analysis.grouped if fold_layers is None else fold_layers)
        self.index = ProgramIndex(analysis, self.tree)
        self.words = {c.id: resolution_words(analysis, c) for c in analysis.conflicts}
        prog = analysis.program
        self.program = {"name": prog.fn_name, "ops": len(prog.ops),
                        "fingerprint": prog.fingerprint()}
        self.mesh_view = None if mesh is None else {
            "axes": dict(mesh.shape), "device": mesh.device.name,
            "memory_bytes": float(mesh.device.memory_bytes)}
        self._graphs: OrderedDict = OrderedDict()
        self._breakdown: tuple = (None, None, None)  # (model, plan, its op_breakdown)
        self._priced: tuple = (None, None, None)     # (model, plan, its choices)
        self._explained: tuple = (None, None)        # ((plan, selection, open groups), view)
        self._memory: tuple = (None, None, None)     # (model, plan, its MemoryView)
        self._steps: tuple | None = None             # the STEP decisions offered (once)
        self._shared = None  # shared_values, for the choices' notes before a session has them
        self.op_costs: tuple = (np.zeros(len(prog.ops)), np.zeros(len(prog.ops)))

    @property
    def default_expanded(self) -> frozenset[str]:
        """The root, and the way down to the model's repeated layers (its block, drawn once):
        the groups holding the first repeated group in program order (the model's, not its
        optimizer's), then that group, each opened while the graph stays within DEFAULT_NODES
        nodes. Repeated groups at the top always open (the zoo's `block*`)."""
        groups = self.tree.groups
        opened, nodes = {ROOT}, len(groups[ROOT].shown) + len(groups[ROOT].children)
        repeated = sorted((g for g in groups.values()
                           if g.repeat > 1 and groups[g.parent or ROOT].repeat == 1),
                          key=lambda g: g.first_op)
        targets = repeated[:1] + [g for g in repeated[1:] if g.depth == 1]
        for target in targets:
            way = []
            gid = target.id
            while gid not in opened:
                way.append(groups[gid])
                gid = groups[gid].parent
            for g in reversed(way):
                own = len(g.shown) + len(g.children)
                grown = nodes - 1 + own
                if grown > DEFAULT_NODES and (g.depth > 1 or own > DEFAULT_NODES):
                    break
                opened.add(g.id)
                nodes = grown
        return frozenset(opened)

    def graph(self, expanded) -> VisibleGraph:
        key = frozenset(expanded) | {ROOT}
        g = self._graphs.get(key)
        if g is None:
            g = self._graphs[key] = VisibleGraph(self.index, key)
            while len(self._graphs) > GRAPH_CACHE:
                self._graphs.popitem(last=False)
        self._graphs.move_to_end(key)
        return g

    def experts(self, session) -> tuple[ExpertRow, ...]:
        """The session's expert plans as rows, each with the pins that rule it out."""
        pins = session.pins
        rows = []
        for name, (plan, est) in session.expert_plans().items():
            against = ruled_out(plan, pins)
            rows.append(ExpertRow(name, est.step_time_s, est.peak_memory_bytes, est.feasible,
                                  {k: tuple(v) for k, v in plan.class_axes.items()},
                                  tuple(self._pin_words(n, pins[n]) for n in against)))
        return tuple(rows)

    def _pin_words(self, name: str, value) -> str:
        """'batch=data', 'embed@optimizer=data×model', 'seq: keep the query positions'."""
        for c in self.analysis.conflicts:
            if c.name == name:
                return f"{c.class_name}: {self.words[c.id][value].label}"
        return f"{name}={axes_label(value)}"

    def colors(self, plan) -> tuple[tuple[str, ...], frozenset[int]]:
        """(the colour of each class, the classes the legend shows) under `plan`."""
        sharded = {k for k, axes in plan.assignments if axes}
        sharded |= {k for k, _, axes in plan.overrides if axes}
        shown = legend_classes(self.analysis.classes, sharded)
        return class_colors(self.analysis.classes, shown), frozenset(shown)

    # --- the view model -------------------------------------------------------------------------

    def build(self, session, expanded=None, error: str | None = None,
              price: bool = True) -> ViewModel:
        """The ViewModel of `session` now, with `expanded` groups open (default: ROOT and the
        repeated layers). Holds the session's lock while it reads the plan and the cost model.
        price: compute the choices' prices (kept for the last plan priced, see above)."""
        with session.lock:
            plan, est, model = session.plan, session.estimate, session.model
            state, selected = session.search_state, session.selected
            error = error or session.error
            notice = session.notice
            expanded = self.default_expanded if expanded is None else expanded
            graph = self.graph(expanded)
            compute, comm, colls = self._op_breakdown(model, plan)
            self.op_costs = (compute, comm)  # the widget's op_costs buffer
            colors, legend = self.colors(plan)
            class_choice, conflict_choice, step_choice = self._choices(
                model, plan, est, session.shared, price)
            steps = tuple(step_view(self.analysis, plan, name, choices)
                          for name, choices in step_choice.items())
            classes = tuple(self._class_view(plan, c, colors, legend, class_choice[c.id])
                            for c in self.analysis.classes)
            conflicts = tuple(self._conflict_view(plan, c, conflict_choice[c.id])
                              for c in self.analysis.conflicts)
            schedule = schedule_view(self.analysis, plan, est, self.tree)
            nodes, edges = self._decorate(graph, plan, compute, comm, colls, conflicts,
                                          schedule)
            groups = self._group_views(graph, compute, comm)
            details = None
            if selected is not None and selected.kind == "op":
                o = int(selected.id)
                details = op_details(self.analysis, plan, o, compute[o], comm[o],
                                     colls.get(o, ()))
            explained = self._explain(model, plan, selected, graph, colls, classes, conflicts)
            experts = self.experts(session)
            memory = self.memory(model, plan)
            pinned = tuple(sorted(plan.pinned))
            snip = snippet(plan, self.mesh)
            start = session.start
        dot = to_dot(self.program["name"], graph, nodes, edges, colors, conflicts, self.tree,
                     _stage_notes(schedule))
        return ViewModel(
            program=dict(self.program), mesh=dict(self.mesh_view), classes=classes,
            conflicts=conflicts, groups=groups, graph=GraphView(dot, nodes, edges),
            estimate=estimate_view(est), experts=experts, search=_search_view(state),
            snippet=snip, error=error, selected=selected, details=details, pinned=pinned,
            notice=notice, start=_start_view(start),
            explained=explained, memory=memory, steps=steps, schedule=schedule)

    def build_unpriced(self, plan, expanded=None, notice: str | None = None, *,
                       pricing: str | None = None, start=None,
                       error: str | None = None) -> ViewModel:
        """The ViewModel of `plan` with no prices: the graph coloured by the plan and its
        decisions, with no costs, estimate, expert rows or memory chart. With no mesh (built
        with mesh=None) a class offers only its axes; on a mesh whose cost model is not
        ready yet (`pricing` says why, the Lab's first view) every choice is offered, "–".
        start: the _start.Start saying which plan this is, or None."""
        expanded = self.default_expanded if expanded is None else expanded
        graph = self.graph(expanded)
        zeros = np.zeros(len(self.analysis.program.ops))
        colors, legend = self.colors(plan)
        steps = ()
        if self.mesh is None:
            class_choice = {c.id: (unpriced_choice(plan.axes_of(c.id)),)
                            for c in self.analysis.classes}
            conflict_choice = {c.id: tuple(
                unpriced_choice(r, r == plan.resolution_of(c.id), self.words[c.id][r].label)
                for r in c.resolutions) for c in self.analysis.conflicts}
        else:
            if self._shared is None:
                self._shared = shared_values(self.analysis)
            class_choice, conflict_choice, step_choice = self._choices(
                None, plan, None, self._shared, price=False)
            steps = tuple(step_view(self.analysis, plan, name, choices)
                          for name, choices in step_choice.items())
        classes = tuple(self._class_view(plan, c, colors, legend, class_choice[c.id])
                        for c in self.analysis.classes)
        conflicts = tuple(self._conflict_view(plan, c, conflict_choice[c.id])
                          for c in self.analysis.conflicts)
        schedule = schedule_view(self.analysis, plan, None, self.tree)
        nodes, edges = self._decorate(graph, plan, zeros, zeros, {}, conflicts, schedule)
        dot = to_dot(self.program["name"], graph, nodes, edges, colors, conflicts, self.tree,
                     _stage_notes(schedule))
        return ViewModel(
            program=dict(self.program), mesh=None if self.mesh_view is None
            else dict(self.mesh_view), classes=classes, conflicts=conflicts,
            groups=self._group_views(graph, zeros, zeros), graph=GraphView(dot, nodes, edges),
            estimate=None, experts=(), search=SearchView(False, 0, 0.0, 0.0, None, ()),
            snippet=snippet(plan, self.mesh), error=error,
            selected=None, details=None, pinned=tuple(sorted(plan.pinned)), notice=notice,
            steps=steps, schedule=schedule, pricing=pricing,
            start=None if start is None else _start_view(start))

    def op_collectives(self, model, plan) -> dict:
        """{op id: its OpCollectives} under `plan`, as the cost model charges them
        (CostModel.op_collectives; cached for the last plan)."""
        return self._op_breakdown(model, plan)[2]

    def memory(self, model, plan) -> MemoryView:
        """The live bytes of `plan`'s step for the memory chart (CostModel.memory_timeline,
        sampled: _memory.py), kept for the last plan: once per plan shown, not per pin priced
        or search rollout."""
        cached_model, cached_plan, cached = self._memory
        if cached_model is model and cached_plan == plan:
            return cached
        view = memory_view(self.analysis, model.memory_timeline(plan))
        self._memory = (model, plan, view)
        return view

    def _op_breakdown(self, model, plan) -> tuple:
        """CostModel.op_breakdown of `plan`, kept for the last plan: a view and its details
        panel read it, and each reading is a run of the kernel."""
        cached_model, cached_plan, cached = self._breakdown
        if cached_model is model and cached_plan == plan:
            return cached
        out = model.op_breakdown(plan)
        self._breakdown = (model, plan, out)
        return out

    # --- parts ------------------------------------------------------------------------------------

    @property
    def step_decisions(self) -> tuple:
        """The decisions beyond sharding offered on this analysis and mesh (the search's)."""
        if self._steps is None:
            self._steps = offered(self.analysis, self.mesh)
        return self._steps

    def _choices(self, model, plan, est, shared, price) -> tuple[dict, dict, dict]:
        """({class id: its ChoiceViews}, {conflict id: its ChoiceViews}, {step decision name:
        its ChoiceViews}) priced from `plan`, kept for the last plan priced (a search's best
        plan is priced once)."""
        cached_model, cached_plan, cached = self._priced
        if price and cached_model is model and cached_plan == plan:
            return cached
        an = self.analysis
        current = (None, None) if est is None else (est.step_time_s, est.peak_memory_bytes)
        classes = {c.id: class_choices(an, self.mesh, model, plan, current, c, shared, price)
                   for c in an.classes}
        # (the incremental estimator prices the step as written: a rewritten one is priced
        # whole, choice by choice)
        inc = model.incremental(plan) if price and an.conflicts and plan.step.is_default \
            else None
        conflicts = {c.id: conflict_choices(an, model, plan, current, c, inc, price,
                                            self.words[c.id]) for c in an.conflicts}
        steps = {d.name: step_choices(an, self.mesh, model, plan, current, d, price)
                 for d in self.step_decisions}
        if price:
            self._priced = (model, plan, (classes, conflicts, steps))
        return classes, conflicts, steps

    def _class_view(self, plan, c, colors, legend, choices) -> ClassView:
        return ClassView(
            id=c.id, name=c.name, size=c.size, bytes=int(c.bytes), layers=c.layers,
            color=colors[c.id], axes=tuple(plan.axes_of(c.id)), pinned=c.name in plan.pinned,
            choices=choices, minor=bool(c.minor), legend=c.id in legend)

    def _conflict_view(self, plan, c, choices) -> ConflictView:
        return ConflictView(
            id=c.id, name=c.name, class_id=c.class_id, class_name=c.class_name, where=c.where,
            source=c.source, active=bool(plan.axes_of(c.class_id)),
            resolution=plan.resolution_of(c.id), resolutions=tuple(c.resolutions),
            pinned=c.name in plan.pinned, choices=choices,
            labels=tuple(self.words[c.id][r].label for r in c.resolutions))

    def _explain(self, model, plan, selected, graph, colls, classes, conflicts):
        """The ExplainedView of a selected op or drawn edge (None for other selections),
        kept for the last (plan, selection, open groups)."""
        if selected is None or selected.kind not in ("op", "edge"):
            return None
        key = (plan, selected, graph.expanded)
        if self._explained[0] == key:
            return self._explained[1]
        prices = {("class", cv.id, tuple(ch.value)): (ch.step_time_s, ch.peak_memory_bytes)
                  for cv in classes for ch in cv.choices if ch.valid}
        prices.update({("conflict", cf.id, ch.value): (ch.step_time_s, ch.peak_memory_bytes)
                       for cf in conflicts for ch in cf.choices})
        explainer = Explainer(self.analysis, self.mesh, model, plan, colls, prices, self.words,
                              self.tree.rep)
        if selected.kind == "op":
            op = self.analysis.program.ops[int(selected.id)]
            view = ExplainedView("op", selected.id, f"{op.primitive} (op {op.id})",
                                 explainer.op(op.id))
        else:
            spec = next((e for e in graph.edges if e.id == selected.id), None)
            if spec is None:
                view = None  # the edge is not drawn now (a group opened or closed)
            else:
                index = self.index
                pairs = [(int(index.pair_dst[p]), int(index.pair_slot[p])) for p in spec.pairs
                         if index.pair_dst[p] >= 0 and index.pair_slot[p] >= 0]
                subject = (f"{graph.nodes[spec.source].title} → "
                           f"{graph.nodes[spec.target].title}")
                view = ExplainedView("edge", selected.id, subject, explainer.pairs(pairs))
        self._explained = (key, view)
        return view

    def _decorate(self, graph, plan, compute, comm, colls, conflicts, schedule=None):
        """NodeViews and EdgeViews of `graph` under `plan`: costs, colours, collectives; the
        pipelined stack's node (collapsed) says how `schedule`'s stages cut it."""
        index, tree, prog = self.index, self.tree, self.analysis.program
        n = len(graph.nodes)
        node_compute = np.bincount(graph.node_of_op, weights=compute, minlength=n)
        node_comm = np.bincount(graph.node_of_op, weights=comm, minlength=n)
        node_colls: list[Counter] = [Counter() for _ in range(n)]
        pays = np.zeros(len(prog.ops), bool)  # the ops that pay a collective
        for o, cs in colls.items():
            pays[o] = True
            for c in cs:  # a folded layer's node counts every layer's collectives
                node_colls[graph.node_of_op[o]][c.label] += round(c.count)
        sharded_classes = {k for k, axes in plan.assignments if axes}
        nodes = []
        for i, spec in enumerate(graph.nodes):
            if spec.kind == "group":
                g = tree.index[spec.group]
                classes = index.group_classes[g]
                marks = index.group_conflicts[g]
                sharded = tuple(sorted((c for c in classes if c in sharded_classes),
                                       key=lambda c: -self.analysis.classes[c].bytes))
            elif spec.kind == "op":
                op = prog.ops[spec.op]
                classes = index.op_classes[spec.op]
                marks = index.site_conflicts.get(spec.op, ())
                sharded = _sharded_on(plan, self.analysis, op.results[:1])
            else:
                classes, marks, sharded = (), (), ()
            label = spec.title + (f"\n{spec.subtitle}" if spec.subtitle else "")
            if schedule is not None and spec.kind == "group" and spec.group == schedule.scope:
                label += f"\n{schedule.label}"
            coll = tuple(f"{k} ×{v}" if v > 1 else k for k, v in node_colls[i].most_common())
            nodes.append(NodeView(
                id=spec.id, kind=spec.kind, group=spec.group, label=label, op=spec.op,
                classes=tuple(classes), conflicts=tuple(marks),
                compute_s=float(node_compute[i]), comm_s=float(node_comm[i]),
                collectives=coll, sharded=tuple(sharded)))
        edges = []
        for spec in graph.edges:
            badges: Counter = Counter()
            dst = index.pair_dst[spec.pairs]
            pairs = spec.pairs[(dst >= 0) & np.append(pays, False)[np.maximum(dst, -1)]]
            for d, slot in zip(index.pair_dst[pairs].tolist(), index.pair_slot[pairs].tolist()):
                for c in colls[d]:
                    if c.operand == slot:
                        badges[c.label] += round(c.count)
            badge = ", ".join(k for k, _ in badges.most_common(2)) or None
            edges.append(EdgeView(
                id=spec.id, source=graph.nodes[spec.source].id,
                target=graph.nodes[spec.target].id, classes=spec.classes, label=spec.label,
                badge=badge, sharded=_sharded_on(plan, self.analysis, spec.samples)))
        return tuple(nodes), tuple(edges)

    def _group_views(self, graph, compute, comm) -> tuple[GroupView, ...]:
        tree, index = self.tree, self.index
        k = len(tree)
        sub_compute = np.bincount(tree.group_index, weights=compute, minlength=k)
        sub_comm = np.bincount(tree.group_index, weights=comm, minlength=k)
        for i in range(k - 1, 0, -1):  # pre-order: children after parents
            p = tree.index[tree.groups[tree.ids[i]].parent]
            sub_compute[p] += sub_compute[i]
            sub_comm[p] += sub_comm[i]
        out = []
        for i, gid in enumerate(tree.ids):
            g = tree.groups[gid]
            out.append(GroupView(
                id=gid, label=g.label, parent=g.parent, children=g.children, repeat=g.repeat,
                ops=g.ops, compute_s=float(sub_compute[i]), comm_s=float(sub_comm[i]),
                classes=index.group_classes[i], conflicts=index.group_conflicts[i],
                expanded=gid == ROOT or gid in graph.expanded))
        return tuple(out)


def _stage_notes(schedule) -> dict[str, str]:
    """{scope-tree group: its cluster's second line}: the pipelined stack's stages."""
    return {} if schedule is None or schedule.scope is None else {schedule.scope: schedule.label}


def _sharded_on(plan, analysis, values) -> tuple[int, ...]:
    """Classes the plan shards on any dim of `values`, in order of first appearance."""
    out: list[int] = []
    vc = analysis.value_classes
    for v in values:
        for d, axes in enumerate(plan.value_axes(v)):
            if axes and vc[v][d] >= 0 and vc[v][d] not in out:
                out.append(vc[v][d])
    return tuple(out)


def estimate_view(est) -> dict | None:
    """Estimate.to_dict() plus communication by mesh axes ("data", "data×model")."""
    if est is None:
        return None
    doc = est.to_dict()
    by_axis: dict[str, float] = {}
    for (_, axes), c in est.collectives.items():
        key = "×".join(axes)
        by_axis[key] = by_axis.get(key, 0.0) + c.time_s
    doc["communication_by_axis"] = by_axis
    doc["by_scope"] = {k: {"compute_s": a, "comm_s": b} for k, (a, b) in est.by_scope.items()}
    return _plain(doc)


def _start_view(start) -> StartView:
    return StartView(start.name, start.how, start.step_time_s, start.peak_memory_bytes,
                     start.note, start.label)


def _search_view(state) -> SearchView:
    return SearchView(running=state.running, simulations=int(state.simulations),
                      elapsed_s=float(state.elapsed_s), sims_per_s=float(state.sims_per_s),
                      best_step_time_s=state.best_step_time_s,
                      history=tuple(tuple(float(x) for x in row) for row in state.history),
                      message=state.message)
