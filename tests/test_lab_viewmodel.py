"""The Lab's view model: scope tree, quotient graph, colours, counterfactuals, JSON, glue."""

import collections
import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

import toast_lab as tl
from toast_lab.lab import Lab, Session, ViewBuilder, ViewModel, build_scope_tree
from toast_lab.lab._palette import LEGEND_TOP, MUTED, NEUTRAL

LAYERS = 3


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", size="tiny", layers=LAYERS)
    an = tl.analyze(tl.trace(fn, *args))
    return an, tl.Mesh({"data": 4, "model": 2}, device="h100")


@pytest.fixture(scope="module")
def builder(gpt):
    return ViewBuilder(*gpt)


@pytest.fixture
def session(gpt):
    """A session on the replicated plan: each test pins from nothing."""
    an, mesh = gpt
    return Session(an, mesh, tl.Plan.replicated(an))


# --- scope tree -----------------------------------------------------------------------------------

def test_every_op_is_in_exactly_one_group(gpt, builder):
    an, _ = gpt
    tree = builder.tree
    direct = collections.Counter(o for g in tree.groups.values() for o in g.direct)
    assert sorted(direct) == list(range(len(an.program.ops)))
    assert set(direct.values()) == {1}
    for o in range(len(an.program.ops)):
        assert o in tree.group_of(o).direct
    root = tree.groups[""]
    assert root.ops == len(an.program.ops)
    for g in tree.groups.values():  # a group's ops are its own plus its children's
        assert g.ops == len(g.direct) + sum(tree.groups[c].ops for c in g.children)


def test_repeated_layers_collapse_into_one_group(builder):
    tree = builder.tree
    assert "block*" in tree.groups and tree.groups["block*"].repeat == LAYERS
    assert not any(re.search(r"block\d", g) for g in tree.groups)
    assert tree.groups["block*/attn"].repeat == LAYERS
    # two different norms in one block are not layers of each other
    assert "block*/ln1" in tree.groups and "block*/ln2" in tree.groups
    # drawn once: the shown ops of a folded group are those of one layer
    attn = tree.groups["block*/attn"]
    assert len(attn.shown) * LAYERS == len(attn.direct)
    # the optimizer's thousands of elementwise ops are split by the parameter they update
    assert tree.groups["optimizer/blocks*"].repeat == LAYERS
    assert "optimizer/blocks*/attn/wq" in tree.groups


def test_a_busy_scope_shows_the_calls_and_lines_that_made_its_ops(builder):
    # a LayerNorm's forward and backward is one chain of 49 ops in the scope `ln1`: drawn
    # as the lines of `layer_norm` that made them, not op by op
    tree = builder.tree
    ln1 = tree.groups["block*/ln1"]
    assert not ln1.direct and ln1.ops > 40
    lines = [tree.groups[c].label for c in ln1.children]
    assert any(x.startswith("mean = jnp.mean(x32") for x in lines), lines
    assert all(re.search(r"\(line \d+\)$", x) or x == "trailing" for x in lines), lines
    assert all(tree.groups[c].repeat == LAYERS for c in ln1.children)
    # a scope that is not busy stays drawn op by op (attention's matmuls are what one pins)
    assert len(tree.groups["block*/attn"].direct) > 0
    # llama's attention computes its RoPE inline: its two calls are two groups
    fn, args = tl.zoo.get("llama", layers=2)
    llama = build_scope_tree(tl.trace(fn, *args))
    kids = [llama.groups[c].label for c in llama.groups["layer/attn"].children]
    assert sum(bool(re.fullmatch(r"rope \(line \d+\)", k)) for k in kids) == 2, kids
    assert any(k.startswith("o = jax.nn.dot_product_attentio") for k in kids), kids
    assert len(llama.groups["layer/attn"].direct) <= 24


def test_without_layer_grouping_every_layer_is_drawn(gpt):
    an, _ = gpt
    tree = build_scope_tree(an.program, fold_layers=False)
    assert {"block0", "block1", "block2"} <= set(tree.groups)
    assert all(g.repeat == 1 for g in tree.groups.values())


def test_representatives_share_primitive_and_shapes(gpt, builder):
    an, _ = gpt
    prog, tree = an.program, builder.tree
    for o, r in enumerate(tree.rep):
        a, b = prog.ops[o], prog.ops[int(r)]
        assert a.primitive == b.primitive
        assert [prog.values[v].shape for v in a.results] == [
            prog.values[v].shape for v in b.results]


# --- the view model -----------------------------------------------------------------------------

def test_view_model_round_trips_through_json(builder, session):
    session.pin("batch", ("data",))
    session.select("op", 10)
    vm = builder.build(session)
    text = vm.to_json()
    json.loads(text)  # plain JSON, no NaN
    again = ViewModel.from_json(text)
    assert again == vm
    assert again.to_dict() == vm.to_dict()
    doc = vm.to_dict()
    assert doc["format"] == "toast-lab-view" and doc["version"] == 1
    for key in ("program", "mesh", "classes", "conflicts", "groups", "graph", "estimate",
                "experts", "search", "snippet", "error", "selected", "details", "pinned"):
        assert key in doc


def _shape(x):
    """The field names of a JSON document, recursively (a list of objects by its first)."""
    if isinstance(x, dict):
        return {k: _shape(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_shape(x[0])] if x and isinstance(x[0], dict) else []
    return None


def test_the_browser_fixture_is_a_current_view_model(builder, session):
    """tests/data/lab_view_gpt.json (tests/e2e/make_view_fixture.py) has the fields the builder
    emits now; regenerate it when this fails."""
    fixture = json.loads((Path(__file__).parent / "data" / "lab_view_gpt.json").read_text())
    assert ViewModel.from_dict(fixture).to_dict() == fixture
    fresh = builder.build(session).to_dict()
    for part in ("classes", "conflicts", "groups"):
        assert _shape(fixture[part][:1]) == _shape(fresh[part][:1]), part
    for part in ("nodes", "edges"):
        assert _shape(fixture["graph"][part][:1]) == _shape(fresh["graph"][part][:1]), part
    assert set(fixture) == set(fresh)
    assert set(fixture["estimate"]) == set(fresh["estimate"])
    assert set(fixture["search"]) == set(fresh["search"])


def test_colours_and_ids_are_deterministic(gpt):
    an, mesh = gpt
    docs = [ViewBuilder(an, mesh).build(Session(an, mesh)).to_dict() for _ in range(2)]
    assert docs[0] == docs[1]
    shown = [c for c in docs[0]["classes"] if c["legend"]]
    colours = [c["color"] for c in shown]
    assert len(set(colours)) == len(colours) and set(colours) <= set(MUTED)
    biggest = max(an.classes, key=lambda c: c.bytes)
    assert docs[0]["classes"][biggest.id]["color"] == MUTED[0]


def test_the_legend_shows_the_sharded_and_the_largest_classes_in_distinct_colours(gpt, builder,
                                                                                   session):
    an, _ = gpt
    top = sorted(an.classes, key=lambda c: (-c.bytes, c.id))[:LEGEND_TOP]
    vm = builder.build(session)  # replicated: the largest classes only, the rest grey
    assert {c.id for c in vm.classes if c.legend} == {c.id for c in top}
    assert all(c.color == NEUTRAL for c in vm.classes if not c.legend)
    before = {c.id: c.color for c in vm.classes if c.legend}
    # shard two classes outside the top: each takes a colour no shown class has
    small = [c for c in sorted(an.classes, key=lambda c: c.bytes) if c not in top][:2]
    for c in small:
        session.pin(c.name, "model")
    vm = builder.build(session)
    shown = [c for c in vm.classes if c.legend]
    assert {c.id for c in shown} == {c.id for c in top} | {c.id for c in small}
    assert len({c.color for c in shown}) == len(shown) and NEUTRAL not in {c.color for c in shown}
    assert all(vm.classes[k].color == colour for k, colour in before.items())  # not repainted
    for c in small:  # and the graph draws them in their colour
        assert vm.classes[c.id].color in vm.graph.dot


def test_minor_classes_are_marked_and_stay_out_of_the_legend_unless_sharded():
    fn, args = tl.zoo.get("cnn")
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    minor = tl.analysis.minor_classes(an)
    assert minor
    b = ViewBuilder(an, mesh)
    s = Session(an, mesh, tl.Plan.replicated(an))
    vm = b.build(s)
    assert {c.id for c in vm.classes if c.minor} == {c.id for c in minor}
    assert not any(c.legend for c in vm.classes if c.minor)
    sizes = {c.id: c.size for c in an.classes}
    pinned = next(c for c in minor if sizes[c.id] % 2 == 0)
    s.pin(pinned.name, "model")
    assert b.build(s).classes[pinned.id].legend


def test_pin_recolours_the_graph_and_changes_the_estimate(gpt, builder, session):
    an, mesh = gpt
    before = builder.build(session)
    assert not any(e.sharded for e in before.graph.edges)  # replicated: all neutral
    assert NEUTRAL in before.graph.dot
    batch = an.class_named("batch")
    session.pin("batch", ("data",))
    after = builder.build(session)
    assert after.estimate["step_time_s"] == pytest.approx(
        tl.estimate(an, session.plan, mesh).step_time_s)
    assert after.estimate["step_time_s"] != before.estimate["step_time_s"]
    coloured = [e for e in after.graph.edges if batch.id in e.sharded]
    assert coloured and all(batch.id in e.classes for e in coloured)
    assert after.classes[batch.id].axes == ("data",) and after.classes[batch.id].pinned
    colour = after.classes[batch.id].color
    assert colour in after.graph.dot and colour not in before.graph.dot
    assert after.pinned == ("batch",)


def test_counterfactuals_equal_the_full_estimate_of_the_changed_plan(gpt, builder, session):
    an, mesh = gpt
    session.pin("batch", ("data",))
    seq = an.classes[an.conflicts[0].class_id].name
    session.pin(seq, ("model",))
    vm = builder.build(session)
    plan = session.plan
    priced = 0
    for cv in vm.classes:
        for ch in cv.choices:
            if not ch.valid:
                assert ch.step_time_s is None and ch.reason
                continue
            want = tl.estimate(an, plan.with_axes(cv.id, ch.value), mesh)
            assert ch.step_time_s == pytest.approx(want.step_time_s, rel=1e-9), (cv.name, ch)
            assert ch.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-9)
            priced += 1
    for cf in vm.conflicts:
        assert cf.active
        for ch in cf.choices:
            want = tl.estimate(an, plan.with_resolution(cf.id, ch.value), mesh)
            assert ch.step_time_s == pytest.approx(want.step_time_s, rel=1e-9)
            assert ch.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-9)
            priced += 1
    assert priced > 20
    # the current choice is marked and priced at the current estimate
    batch = vm.classes[an.class_named("batch").id]
    current = [ch for ch in batch.choices if ch.current]
    assert [ch.value for ch in current] == [("data",)]
    assert current[0].step_time_s == pytest.approx(vm.estimate["step_time_s"])


def test_refused_choices_say_why(gpt, builder, session):
    an, _ = gpt
    heads = builder.build(session).classes[an.class_named("heads").id]
    by_label = {ch.label: ch for ch in heads.choices}
    assert not by_label["data×model"].valid
    assert "not divisible" in by_label["data×model"].reason
    assert by_label["replicated"].valid and by_label["model"].valid


def test_an_unsharded_conflict_is_drawn_quietly_not_as_a_warning(gpt, session):
    an, mesh = gpt
    conflict = an.conflicts[0]
    vm = ViewBuilder(an, mesh).build(session)  # seq replicated: the conflict costs nothing
    marked = [n for n in vm.graph.nodes if conflict.id in n.conflicts]
    assert marked, "the conflict site is drawn"
    assert not vm.conflicts[conflict.id].active
    assert "octagon" not in vm.graph.dot and "⚠" not in vm.graph.dot
    assert "not sharded" not in vm.graph.dot and "tl-conflict-idle" in vm.graph.dot
    assert "inactive" in vm.to_text()


def test_a_sharded_conflict_is_a_warning_naming_what_its_resolution_keeps(gpt, session):
    an, mesh = gpt
    conflict = an.conflicts[0]
    b = ViewBuilder(an, mesh)
    session.pin(conflict.class_name, ("model",))
    vm = b.build(session)
    assert vm.conflicts[conflict.id].active
    assert "octagon" in vm.graph.dot
    assert f"⚠ {conflict.class_name}: keep the query positions" in vm.graph.dot
    session.pin(conflict.name, "replicate")
    vm = b.build(session)
    assert vm.conflicts[conflict.id].resolution == "replicate"
    assert vm.conflicts[conflict.id].label == "gather both"
    assert f"⚠ {conflict.class_name}: gather both" in vm.graph.dot


def test_resolutions_are_worded_by_what_they_keep(gpt, builder, session):
    an, _ = gpt
    conflict = an.conflicts[0]  # seq at attention's scores [batch, heads, q, k]
    session.pin(conflict.class_name, ("model",))
    cv = builder.build(session).conflicts[conflict.id]
    assert cv.resolutions == ("keep_dim2", "keep_dim3", "replicate")
    assert cv.labels == ("keep the query positions", "keep the key positions", "gather both")
    assert [ch.label for ch in cv.choices] == list(cv.labels)
    assert [ch.value for ch in cv.choices] == list(cv.resolutions)  # what a click pins
    keep_q = cv.choices[0]
    assert "[batch, heads, seq, seq] stays sharded on the query positions" in keep_q.note
    assert "the key positions are gathered" in keep_q.note


@pytest.mark.parametrize("build", ["gpt2", "llama"])
def test_hugging_face_attention_conflicts_are_worded_alike(build):
    # the words come from the site's operands and the classes' names, not from the zoo's:
    # transformers' einsums ("...qhd,...khd->...hqk") and Llama's grouped heads read the same
    from tests.third_party import hf

    import warnings

    import jax

    with jax.numpy_rank_promotion("allow"), warnings.catch_warnings():  # transformers' code
        warnings.simplefilter("ignore", FutureWarning)  # transformers' Flax deprecation
        step, args = getattr(hf, build)()
        an = tl.analyze(tl.trace(step, *args))
    b = ViewBuilder(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))
    attention = [c for c in b.build(Session(an, b.mesh)).conflicts
                 if c.class_name == "seq" and "dot_general" in c.name]
    assert attention, [c.name for c in an.conflicts]
    for cv in attention:
        assert cv.labels == ("keep the query positions", "keep the key positions",
                             "gather both"), (cv.name, cv.labels)


def test_a_gram_matrix_conflict_keeps_its_rows_or_its_columns():
    import jax
    import jax.numpy as jnp

    def step(w, x):
        def loss(w):
            h = x @ w
            return (h @ h.T).sum()
        return w - 0.1 * jax.grad(loss)(w)

    an = tl.analyze(tl.trace(step, jnp.ones((16, 16)), jnp.ones((32, 16))))
    (conflict,) = an.conflicts
    b = ViewBuilder(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))
    s = Session(an, b.mesh, tl.Plan.replicated(an).with_axes(conflict.class_name, "data"))
    cv = b.build(s).conflicts[0]
    assert cv.labels == ("keep the rows", "keep the columns", "gather both")


def test_expanding_a_group_draws_its_ops_and_keeps_the_rest(builder, session):
    closed = builder.build(session)
    assert "group.block*/attn" in {n.id for n in closed.graph.nodes}
    opened = builder.build(session, builder.default_expanded | {"block*/attn"})
    ids = {n.id for n in opened.graph.nodes}
    assert "group.block*/attn" not in ids
    attn = builder.tree.groups["block*/attn"]
    assert {f"op.{o}" for o in attn.shown} <= ids
    assert opened.group("block*/attn").expanded and not closed.group("block*/attn").expanded
    assert "cluster:block*/attn" in opened.graph.dot
    # every edge joins drawn nodes, and the DOT names every node once
    for e in opened.graph.edges:
        assert e.source in ids and e.target in ids
    for n in opened.graph.nodes:
        assert opened.graph.dot.count(f'id="{n.id}"') == 1


def test_group_costs_add_up_to_the_estimate(builder, session):
    session.pin("batch", ("data",))
    vm = builder.build(session)
    root = vm.group("")
    assert root.compute_s == pytest.approx(vm.estimate["compute_s"], rel=1e-6)
    assert root.comm_s == pytest.approx(vm.estimate["communication_s"], rel=1e-6)
    drawn = sum(n.compute_s for n in vm.graph.nodes)
    assert drawn == pytest.approx(vm.estimate["compute_s"], rel=1e-6)


def test_collective_labels_are_the_cost_models_kinds_and_axes(gpt, builder):
    an, mesh = gpt
    fsdp = tl.strategies.expert(an, mesh)["fsdp"]
    s = Session(an, mesh, fsdp)
    vm = builder.build(s)
    charged = {f"{kind} {'×'.join(axes)}" for kind, axes in s.estimate.collectives}
    seen = {re.sub(r" ×\d+$", "", c) for n in vm.graph.nodes for c in n.collectives}
    assert seen and seen <= charged
    badges = {b for e in vm.graph.edges if e.badge for b in e.badge.split(", ")}
    assert any(b.startswith("all-gather") for b in badges)
    assert badges <= charged
    # the ops' own reading: the all-gather of an FSDP weight before its matmul
    per_op = tl.cost_model(an, mesh).op_collectives(fsdp)
    labels = {c.label for cs in per_op.values() for c in cs}
    assert labels <= charged and seen <= labels
    assert any(c.kind == "all-gather" and an.program.ops[o].primitive == "dot_general"
               for o, cs in per_op.items() for c in cs)


def test_details_of_a_selected_op(gpt, builder, session):
    an, _ = gpt
    session.pin("batch", ("data",))
    op = next(o for o in an.program.ops if o.primitive == "dot_general")
    session.select("op", op.id)
    d = builder.build(session).details
    assert d.op == op.id and d.primitive == "dot_general" and d.source == op.source
    assert d.scope == op.name_scope
    assert [t.value for t in d.operands] == list(op.operands)
    for t in d.operands + d.results:
        assert t.classes == an.dim_names(t.value)
        assert t.spec.startswith("P(")
    assert any("'data'" in t.spec for t in d.operands + d.results)


def test_snippet_and_experts(builder, session):
    session.pin("batch", ("data",))
    vm = builder.build(session)
    assert "jax.jit(fn, in_shardings=in_shardings, out_shardings=out_shardings)" in vm.snippet
    assert "('batch', 'data')" in vm.snippet and "LOGICAL_AXIS_RULES" in vm.snippet
    names = [r.name for r in vm.experts]
    assert "dp" in names and "fsdp" in names
    dp = next(r for r in vm.experts if r.name == "dp")
    assert dp.classes == {"batch": ("data", "model")}


def test_text_rendering(builder, session):
    session.pin("batch", ("data",))
    vm = builder.build(session)
    text = vm.to_text()
    assert str(vm) == text
    assert "estimate: step" in text and "*data" in text and "pinned: batch" in text
    assert "group.block*/attn" in text and "×3" in text
    assert repr(vm).startswith("ViewModel('gpt_train_step'")


def test_prices_are_kept_during_a_search_for_the_best_plan_so_far(gpt, builder):
    an, mesh = gpt
    s = Session(an, mesh, tl.Plan.replicated(an), progress_every_s=0.01)
    future = s.search(budget_s=60)
    try:
        deadline = time.monotonic() + 30
        while s.search_state.best_step_time_s is None and time.monotonic() < deadline:
            time.sleep(0.01)
        with s.lock:  # the search waits: the view and the plan it shows are one moment's
            vm, plan = builder.build(s), s.plan
    finally:
        s.stop()
    assert vm.search.running and future.done()
    priced = [(cv, ch) for cv in vm.classes for ch in cv.choices if ch.valid]
    assert priced and all(ch.step_time_s is not None for _, ch in priced)
    for cv, ch in priced[:6]:  # the prices are the best plan so far's counterfactuals
        want = tl.estimate(an, plan.with_axes(cv.id, ch.value), mesh)
        assert ch.step_time_s == pytest.approx(want.step_time_s, rel=1e-9)


def test_expert_rows_that_a_pin_rules_out_say_which_pin(gpt, builder, session):
    session.pin("batch", "data")
    rows = {r.name: r for r in builder.build(session).experts}
    # fsdp shards batch over data×model: batch pinned to data rules it out
    assert rows["fsdp"].classes["batch"] == ("data", "model")
    assert rows["fsdp"].ruled_out_by == ("batch=data",)
    assert rows["dp+tp"].ruled_out_by == ()
    assert "fsdp" in builder.build(session).to_text()
    assert "— ruled out by batch=data" in builder.build(session).to_text()


def _fsdp_session(gpt):
    an, mesh = gpt
    return Session(an, mesh, tl.strategies.expert(an, mesh)["fsdp"])


def test_a_collective_is_explained_with_the_choice_that_removes_it(gpt, builder):
    an, mesh = gpt
    s = _fsdp_session(gpt)
    colls = tl.cost_model(an, mesh).op_collectives(s.plan)
    # the all-gather of an FSDP weight before its matmul
    op, c = next((o, c) for o, cs in colls.items() for c in cs if c.kind == "all-gather"
                 and c.operand is not None and an.program.ops[o].primitive == "dot_general")
    s.select("op", op)
    x = builder.build(s).explained
    assert x.kind == "op" and x.subject == f"dot_general (op {op})"
    cv = next(v for v in x.collectives
              if (v.kind, v.axes, v.operand) == (c.kind, c.axes, c.operand))
    o = an.program.ops[op]
    assert cv.op == op and cv.primitive == "dot_general" and cv.source == o.source
    assert cv.classes and all(isinstance(n, str) for n in cv.classes)
    weight = o.operands[c.operand]
    sharded = {an.classes[k].name for k, axes in zip(an.value_classes[weight],
                                                        s.plan.value_axes(weight))
               if axes and k >= 0}
    assert set(cv.classes) <= sharded  # the classes the plan shards on the moved weight
    assert cv.bytes > 0 and cv.time_s > 0 and cv.count >= 1
    assert cv.why and cv.label == c.label
    # the remedy: its price is the estimate of the plan with it, and it removes the charge
    r = cv.remedy
    assert r is not None
    changed = (s.plan.with_resolution(r.name, r.value) if isinstance(r.value, str)
               else s.plan.with_axes(r.name, r.value))
    want = tl.estimate(an, changed, mesh)
    assert r.step_time_s == pytest.approx(want.step_time_s, rel=1e-9)
    assert r.peak_memory_bytes == pytest.approx(want.peak_memory_bytes, rel=1e-9)
    after = tl.cost_model(an, mesh).op_collectives(changed)
    assert not any((x.kind, x.axes, x.operand) == (c.kind, c.axes, c.operand)
                   for x in after.get(op, ()))
    text = builder.build(s).to_text()
    assert f"collectives of dot_general (op {op})" in text and "removed by:" in text


def test_a_collective_badge_on_an_edge_is_explained(gpt, builder):
    s = _fsdp_session(gpt)
    vm = builder.build(s)
    edge = next(e for e in vm.graph.edges if e.badge)
    s.select("edge", edge.id)
    x = builder.build(s).explained
    assert x.kind == "edge" and x.id == edge.id and " → " in x.subject
    assert x.collectives
    assert {c.label for c in x.collectives} >= set(edge.badge.split(", "))
    for c in x.collectives:
        assert c.operand is not None and c.source and c.classes


def test_tensors_carry_their_mesh_axes_per_dim(gpt, builder, session):
    an, _ = gpt
    session.pin("batch", "data")
    op = next(o for o in an.program.ops if o.primitive == "dot_general")
    session.select("op", op.id)
    d = builder.build(session).details
    for t in d.operands + d.results:
        assert t.dim_axes == tuple(tuple(a) for a in session.plan.value_axes(t.value))
    assert any(("data",) in t.dim_axes for t in d.operands + d.results)


@pytest.mark.slow
def test_24_layer_gpt2_small_collapsed_graph_stays_small():
    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=24)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    b = ViewBuilder(an, mesh)
    vm = b.build(Session(an, mesh))
    assert len(vm.graph.nodes) <= 30, [n.id for n in vm.graph.nodes]
    assert len(vm.groups) < 80
    assert b.tree.groups["block*"].repeat == 24


# --- the Lab's glue, with a stand-in for the widget ----------------------------------------------

class RecordingWidget:
    """Records what the Lab assigns to a LabView's traitlets; delivers events like on_event."""

    def __init__(self):
        self.views, self.costs, self.callbacks = [], [], []

    def on_event(self, callback):
        self.callbacks.append(callback)

    def send(self, **event):
        for cb in self.callbacks:
            cb(event)

    @property
    def view(self):
        return self.views[-1]

    @view.setter
    def view(self, value):
        self.views.append(value)

    @property
    def op_costs(self):
        return self.costs[-1]

    @op_costs.setter
    def op_costs(self, value):
        self.costs.append(value)


@pytest.fixture
def lab(gpt):
    an, mesh = gpt
    return Lab.from_analysis(an, mesh, widget=RecordingWidget())


def test_lab_feeds_the_widget_on_every_change(gpt, lab):
    an, mesh = gpt
    w = lab.widget
    assert len(w.views) == 1 and w.view["format"] == "toast-lab-view"
    costs = np.frombuffer(w.op_costs, "<f8").reshape(-1, 2)
    assert costs.shape == (len(an.program.ops), 2)
    w.send(event="pin", name="batch", value=["data"])
    assert w.view["classes"][an.class_named("batch").id]["axes"] == ["data"]
    assert w.view["estimate"]["step_time_s"] == pytest.approx(lab.estimate.step_time_s)
    assert lab.plan.axes_of("batch") == ("data",)
    compute, comm = tl.cost_model(an, mesh).op_costs(lab.plan)
    costs = np.frombuffer(w.op_costs, "<f8").reshape(-1, 2)
    np.testing.assert_allclose(costs[:, 0], compute)
    np.testing.assert_allclose(costs[:, 1], comm)
    w.send(event="toggle", group="block*/attn")
    assert any(n["id"].startswith("op.") for n in w.view["graph"]["nodes"])
    w.send(event="select", kind="op", id="3")
    assert w.view["details"]["op"] == 3
    w.send(event="unpin", name="batch")
    assert w.view["pinned"] == []


def test_the_lab_opens_on_the_best_expert_plan_coloured_and_says_which(gpt):
    an, mesh = gpt
    lab = Lab.from_analysis(an, mesh, widget=RecordingWidget())
    view = lab.widget.view
    start = lab.session.start
    assert start.how == "expert" and lab.plan == tl.strategies.expert(an, mesh)[start.name]
    assert view["start"]["label"] == start.label and view["start"]["name"] == start.name
    sharded = [e for e in view["graph"]["edges"] if e["sharded"]]
    assert sharded  # the first view is coloured
    colours = {c["id"]: c["color"] for c in view["classes"]}
    assert any(colours[k] in view["graph"]["dot"] for e in sharded for k in e["sharded"])
    assert lab.to_text().count(start.label) == 1
    pinned = Lab.from_analysis(an, mesh, widget=False, pins={"batch": "data"})
    assert pinned.plan.axes_of("batch") == ("data",) and "batch" in pinned.plan.pinned


def test_refusals_and_crashes_show_in_the_widget_and_leave_it_usable(lab, monkeypatch):
    w = lab.widget
    w.send(event="pin", name="heads", value=["data", "model"])
    assert "not divisible" in w.view["error"]
    w.send(event="toggle", group="no/such/group")
    assert "no such" in w.view["error"] or "no group" in w.view["error"]
    w.send(event="launch")
    assert "unknown event 'launch'" in w.view["error"]

    def broken(*args, **kwargs):
        raise ZeroDivisionError("a bug in pricing")

    monkeypatch.setattr(lab.session, "unpin", broken)
    w.send(event="unpin", name="batch")
    assert "unpin failed: ZeroDivisionError: a bug in pricing" in w.view["error"]
    monkeypatch.undo()
    w.send(event="pin", name="batch", value=["data"])  # still works
    assert w.view["error"] is None and w.view["classes"][lab.analysis.class_named(
        "batch").id]["axes"] == ["data"]


def test_a_view_bug_keeps_the_last_view_and_says_so(lab, monkeypatch):
    w = lab.widget
    n = len(w.views)
    monkeypatch.setattr(lab.builder, "build", lambda *a, **k: 1 / 0)
    lab.pin("batch", ("data",))
    assert len(w.views) > n and "could not be updated" in w.view["error"]
    assert lab.plan.axes_of("batch") == ("data",)


def test_lab_search_and_export_from_events(gpt, lab, tmp_path):
    an, _ = gpt
    w = lab.widget
    w.send(event="search", budget_s=30)
    assert lab.session.running or w.view["search"]["simulations"] > 0
    w.send(event="stop")
    # Stop ends the search within a simulation; one that builds the cost model of a rewritten
    # step (a remat or micro-batch decision) takes seconds on loaded cores, so the 30 s
    # search ending within 20 s is what shows it stopped
    lab.session.wait(timeout=20)
    lab.refresh()
    assert not lab.session.running and not w.view["search"]["running"]
    assert w.view["search"]["simulations"] > 0
    path = tmp_path / "plan.json"
    w.send(event="export", path=str(path))
    assert tl.Plan.load(path, an) == lab.plan
    doc = json.loads(path.read_text())
    assert doc["view"]["format"] == "toast-lab-view" and "estimate" in doc
    assert f"wrote {path}" in w.view["notice"]


def test_lab_without_a_widget_shows_text(gpt):
    an, mesh = gpt
    lab = Lab.from_analysis(an, mesh, widget=False)
    bundle = lab._repr_mimebundle_()
    assert list(bundle) == ["text/plain"] and "estimate: step" in bundle["text/plain"]
    assert repr(lab).startswith("Lab('gpt_train_step'")


def test_tl_lab_traces_and_analyses(gpt):
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 2}, device="h100"), widget=False)
    assert lab.analysis.program.fn_name == "gpt_train_step"
    assert lab.estimate == tl.estimate(lab.analysis, lab.plan, lab.mesh)


@pytest.mark.parametrize("name", tl.zoo.names())
def test_every_zoo_model_draws_collapsed_and_fully_open(name):
    fn, args = tl.zoo.get(name)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    s = Session(an, mesh)
    s.search(budget_s=None, simulations=50, background=False)
    b = ViewBuilder(an, mesh)
    closed = b.build(s)
    assert len(closed.graph.nodes) <= 30
    opened = b.build(s, set(b.tree.groups))
    drawn_ops = {n.op for n in opened.graph.nodes if n.kind == "op"}
    assert set(int(r) for r in b.tree.rep) == drawn_ops  # fully open: every representative
    assert ViewModel.from_json(opened.to_json()) == opened


def test_scanned_layers_are_one_group_with_the_scan_length():
    fn, args = tl.zoo.get("gpt_scan", layers=3)
    tree = build_scope_tree(tl.trace(fn, *args))
    assert tree.groups["block"].repeat == 3 and tree.groups["block/attn"].repeat == 3
    assert tree.groups["embed"].repeat == 1


def test_a_step_drawing_random_bits_draws_its_key_values():
    # jax.random.bernoulli wraps a legacy uint32 key into a typed key<fry> value: an extended
    # dtype with no numpy kind, which the graph's type labels once crashed on
    import jax
    import jax.numpy as jnp

    def step(w, x, key):
        def loss(w):
            h = x @ w
            return jnp.where(jax.random.bernoulli(key, 0.9, h.shape), h, 0.0).sum()
        return w - 0.1 * jax.grad(loss)(w)

    args = (jnp.ones((16, 16)), jnp.ones((8, 16)), jax.random.PRNGKey(0))
    an = tl.analyze(tl.trace(step, *args))
    b = ViewBuilder(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))
    opened = b.build(Session(an, b.mesh), set(b.tree.groups))
    labels = [n.label for n in opened.graph.nodes] + [e.label for e in opened.graph.edges]
    assert any("key<fry>[" in str(x) for x in labels)


# --- a plain-JAX step: no name scopes, layers in a Python loop, optax ------------------------

@pytest.fixture(scope="module")
def plain():
    from tests import plain_jax_step as m

    an = tl.analyze(tl.trace(m.step, *m.example_args()))
    return an, ViewBuilder(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))


def test_an_unscoped_step_is_grouped_by_the_functions_that_made_its_ops(plain):
    an, b = plain
    groups = b.tree.groups
    # the user's functions, and optax's by the transformation that made each closure
    assert {"loss_fn", "chain", "apply_updates"} <= set(groups[""].children)
    assert {"chain/scale_by_adam", "chain/add_decayed_weights"} <= set(groups)
    # a class spanning the layers is named from the field (the MLP's hidden width), not after
    # layer 0 (`0/w1[1]`); its path name stays a former name that plan files may use
    names = {c.name for c in an.classes}
    assert "mlp" in names and not any(n.startswith("0/") for n in names)
    assert an.class_named("layers/w1[1]").name == "mlp"
    assert not any(c.name[0].isdigit() for c in an.classes)
    # the layers of the Python loop, told apart by the parameters they read, and folded
    layers = groups["loss_fn/layers*"]
    assert layers.repeat == 2 and layers.ops > 200
    # one function called from two lines of a block is two groups, named by the line
    norms = sorted(g for g in layers.children if g.startswith("loss_fn/layers*/rms"))
    assert len(norms) == 2 and all(re.search(r"rms \(line \d+\)$", g) for g in norms)
    # the final norm and the loss are not in the last layer
    assert "loss_fn/rms" in groups
    assert groups["loss_fn/softmax_cross_entropy_with_integer_labels"].parent == "loss_fn"
    # every op of each layer reads only its own layer's parameters
    names = {i: an.program.values[i].name for i in an.program.inputs}
    tree = b.tree
    for o, op in enumerate(an.program.ops):
        read = {names[v].split("/")[2] for v in op.operands
                if names.get(v, "").startswith("params/layers/")}
        if read and tree.group_of(o).id.startswith("loss_fn/layers*"):
            assert len(read) == 1


def test_an_unscoped_step_opens_on_a_readable_graph(plain):
    an, b = plain
    # open on the way down to the layer: its calls and busy lines, each a node
    assert b.default_expanded == {"", "loss_fn", "loss_fn/layers*"}
    view = b.build(Session(an, b.mesh))
    labels = [n.label.split("\n")[0].removesuffix(" ×2") for n in view.graph.nodes]
    assert len(view.graph.nodes) <= 40
    assert {"chain", "apply_updates", "rms"} <= set(labels)
    assert {"rms (line 30)", "rms (line 35)"} <= set(labels)
    attention = next(x for x in labels if x.startswith("o = jnp.einsum('bhqt,bthk->b"))
    assert attention.endswith("… (line 33)")
    assert labels[-1] == "loss_fn"  # the scalar result: named after what made it, not `tokens′`
    # a line of the attention opens on its ops (its einsum a group of its own)
    line = next(g for g in b.tree.groups if g.endswith("(line 33)"))
    opened = b.build(Session(an, b.mesh), b.default_expanded | {line})
    assert len(view.graph.nodes) < len(opened.graph.nodes) < 70


def test_library_helpers_are_not_the_users_scopes_and_point_at_the_users_call():
    import jax
    import jax.numpy as jnp

    def f(x, w):
        with jax.named_scope("attn"):
            s = jnp.einsum("bd,dk->bk", x, w)
            return jnp.tril(jax.nn.softmax(s)).sum()

    prog = tl.trace(jax.grad(f), jnp.ones((4, 4)), jnp.ones((4, 4)))
    assert {op.user_scope for op in prog.ops} == {"attn"}
    assert any("->" in op.name_scope or "tril" in op.name_scope for op in prog.ops)
    tril = [op for op in prog.ops if op.name_scope.endswith("tril")]
    assert tril and all("test_lab_viewmodel.py" in op.source for op in tril)


def test_a_scanned_rematerialised_plain_step_keeps_its_layer_under_its_caller():
    # JAX keeps a bounded number of frames: ops in a scan body lose the outer ones, and
    # jax.checkpoint names its recomputation `rematted_computation`
    import jax
    import jax.numpy as jnp

    def block(x, w):
        h = jnp.tanh(x @ w[0])
        return x + h @ w[1]

    def loss_fn(ws, x):
        body = jax.checkpoint(lambda c, w: (block(c, w), None))
        y, _ = jax.lax.scan(body, x, ws)
        return (y ** 2).mean()

    def step(ws, x):
        return ws - 0.1 * jax.grad(loss_fn)(ws, x)

    tree = build_scope_tree(tl.trace(step, jnp.ones((3, 2, 16, 16)), jnp.ones((8, 16))))
    assert tree.groups["loss_fn/block"].repeat == 3
    assert not any("rematted" in g or g.startswith("block") for g in tree.groups), tree.groups


def test_an_update_that_reads_no_argument_is_named_by_what_it_updates():
    # Adam's bias correction (`mu / (1 - b1**t)`) reads the moments made in another call, so
    # none of its ops reads `opt_state/0/mu/w3`: it is named going back through the update
    import jax
    import jax.numpy as jnp
    import optax

    opt = optax.adam(1e-3)

    def step(p, s, x):
        def loss(p):
            h = x
            for k in sorted(p):
                h = jnp.tanh(h @ p[k])
            return (h ** 2).mean()
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return optax.apply_updates(p, u), s

    p = {f"w{i}": jnp.full((16, 16), 0.1) for i in range(10)}
    tree = build_scope_tree(tl.trace(step, p, opt.init(p), jnp.ones((8, 16))))
    adam = tree.groups["chain/scale_by_adam"]
    assert len(adam.direct) < 10, adam  # was 64 ops, every parameter's drawn side by side
    assert {f"chain/scale_by_adam/w{i}" for i in range(10)} <= set(adam.children)
    # the walk stops at the gradient: the update of w3 reads no other parameter's name
    assert all(tree.groups[f"chain/scale_by_adam/w{i}"].ops == 6 for i in range(10))


def test_an_optimizer_librarys_per_parameter_work_is_split_by_parameter():
    # clip_by_global_norm squares each gradient (made by a matmul: nothing behind it names a
    # parameter), and MultiSteps accumulates inside a cond whose body reads no argument; each
    # drew 60-165 ops side by side. Named by the moment that reads the same gradient, and by
    # the cond's operand; a per-parameter scalar (`1 - 1/k`) goes with its update.
    import jax
    import jax.numpy as jnp
    import optax

    opt = optax.MultiSteps(optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3)), 2)

    def step(p, s, x):
        def loss(p):
            h = x
            for k in sorted(p):
                h = jnp.tanh(h @ p[k])
            return (h ** 2).mean()
        u, s = opt.update(jax.grad(loss)(p), s, p)
        return optax.apply_updates(p, u), s

    p = {f"w{i:02}": jnp.full((16, 16), 0.1) for i in range(16)}
    tree = build_scope_tree(tl.trace(step, p, opt.init(p), jnp.ones((8, 16))))
    busy = {g.id: len(g.shown) for g in tree.groups.values()
            if len(g.shown) > 48 and g.id.startswith("MultiSteps")}
    assert not busy, busy
    def per_parameter(scope):  # the parameters named below a scope (`acc_grads/w03`: the
        return {g.rsplit("/", 1)[1] for g in tree.groups  # gradients MultiSteps accumulated)
                if g.startswith(scope + "/") and tree.groups[g].ops}

    every = {f"w{i:02}" for i in range(16)}
    assert every <= per_parameter("MultiSteps.update/chain/clip_by_global_norm/tree_norm/_square")
    assert every <= per_parameter("MultiSteps.update/MultiSteps")  # `(1 - 1/k) * acc + g / k`


def test_a_colon_in_a_scope_or_a_source_line_keeps_the_dot_well_formed():
    # graphviz's edge() reads "a:b" as node a, port b: `xt[:, :H]` in a line's name broke
    # the layout of a GRU cell
    import jax
    import jax.numpy as jnp

    def step(w, x):
        def loss(w):
            with jax.named_scope("attn:q"):
                h = jnp.tanh(x @ w)
            return (h[:, :4] ** 2).sum()
        return w - 0.1 * jax.grad(loss)(w)

    an = tl.analyze(tl.trace(step, jnp.ones((16, 16)), jnp.ones((8, 16))))
    b = ViewBuilder(an, tl.Mesh({"data": 4, "model": 2}, device="h100"))
    view = b.build(Session(an, b.mesh), set(b.tree.groups) - {"attn:q"})
    assert any(n.id == "group.attn:q" for n in view.graph.nodes)
    edges = [ln for ln in view.graph.dot.splitlines() if " -> " in ln]
    assert edges and all(re.match(r'^\s*"[^"]*" -> "[^"]*" \[', ln) for ln in edges), edges
    assert 'id="group.attn:q"' in view.graph.dot


def test_a_plan_file_keeps_the_plans_view_not_the_moments(gpt, lab, tmp_path):
    # the start, a selection and its explanation are the session's, not the plan's
    lab.select("edge", lab.view.graph.edges[0].id)
    assert lab.view.explained is not None and lab.view.start is not None
    doc = json.loads(lab.export(tmp_path / "plan.json").read_text())
    view = doc["view"]
    assert view["start"] is None and view["explained"] is None and view["selected"] is None
    assert ViewModel.from_dict(view).graph == lab.view.graph


def test_an_explanation_names_the_compiler_patterns_that_decided_its_charges(gpt):
    # every OpCollective carries the XLA partitioner patterns (cost/_kernel/_patterns.py) whose
    # charges it adds up; an explanation shows those of the collectives it explains
    from toast_lab.cost._kernel import PATTERN_NAMES

    s = _fsdp_session(gpt)
    builder = ViewBuilder(*gpt)
    _, _, colls = builder._op_breakdown(s.model, s.plan)
    op = next(o for o, cs in colls.items() if cs)
    s.select("op", op)
    view = builder.build(s)
    x = view.explained
    assert x.collectives
    for c in x.collectives:
        assert c.patterns and set(c.patterns) <= set(PATTERN_NAMES)
    # FSDP gathers its parameters whole before they are used
    assert any("all-gather" in c.patterns for c in x.collectives)
    assert f"patterns: {', '.join(x.collectives[0].patterns)}" in view.to_text()
