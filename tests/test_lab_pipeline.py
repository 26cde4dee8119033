"""Pipeline stages in the Lab: the session pins and unpins "pipeline@<stack>" (refusals as
PinErrors that name the reason), the Decisions tab offers the stages priced as the cost model
prices them, the view carries the GPipe schedule (the bubble and the hand-offs per tick), the
graph says how the stages cut the stack, and the search works around such pins."""

from __future__ import annotations

import pytest

import toast_lab as tl
from toast_lab.lab import Lab, PinError, Session, ViewBuilder, ViewModel
from toast_lab.lab._schedule import IDLE, pipeline_ticks
from toast_lab.plan import Pipeline

MESH = tl.Mesh({"stage": 2, "data": 2, "model": 2}, device="cpu")


@pytest.fixture(scope="module")
def gpt_scan():
    fn, args = tl.zoo.get("gpt_scan", layers=2, batch=16, seq=64)
    an = tl.analyze(tl.trace(fn, *args))
    return an, tl.strategies.expert(an, MESH)["dp+tp"].with_micro_batches(4)


@pytest.fixture(scope="module")
def builder(gpt_scan):
    return ViewBuilder(gpt_scan[0], MESH)


@pytest.fixture
def session(gpt_scan):
    return Session(gpt_scan[0], MESH, gpt_scan[1])


@pytest.mark.parametrize("stages,micro_batches", [(2, 4), (4, 4), (4, 1), (3, 8)])
def test_the_gpipe_schedule_idles_the_bubble(stages, micro_batches):
    forward, backward = pipeline_ticks(stages, micro_batches)
    ticks = micro_batches + stages - 1
    for loop in (forward, backward):
        assert len(loop) == stages and all(len(row) == ticks for row in loop)
        for row in loop:  # each stage runs every micro-batch once, idling S - 1 ticks
            assert sorted(m for m in row if m != IDLE) == list(range(micro_batches))
            assert row.count(IDLE) == stages - 1
        for t in range(ticks):  # a micro-batch is on one stage at a time
            running = [row[t] for row in loop if row[t] != IDLE]
            assert len(running) == len(set(running))
    # the forward loop: stage s starts micro-batch 0 at tick s; the backward loop: the last
    # stage starts, with the last micro-batch
    assert [row.index(0) for row in forward] == list(range(stages))
    assert backward[-1][0] == micro_batches - 1
    assert all(backward[s][0] == IDLE for s in range(stages - 1))


def test_the_circular_schedule_sends_each_micro_batch_round_the_stages():
    """2 stages, 2 runs each, 2 micro-batches: stage s runs item w = r M + m at tick w + s
    (micro-batch m in its run r), so micro-batch 0 leaves the last stage at tick 1 and is back
    on stage 0 for its second run at tick 2; the bubble is (S - 1) / (V M + S - 1)."""
    forward, backward = pipeline_ticks(2, 2, 2)
    assert forward == ((0, 1, 2, 3, IDLE), (IDLE, 0, 1, 2, 3))
    assert backward == ((IDLE, 3, 2, 1, 0), (3, 2, 1, 0, IDLE))
    forward, _ = pipeline_ticks(4, 8, 2)
    assert len(forward[0]) == 2 * 8 + 4 - 1 and all(r.count(IDLE) == 3 for r in forward)


def test_two_stages_of_four_micro_batches(gpt_scan, builder, session):
    session.pin("pipeline@block", "stage:2")
    vm = builder.build(session, price=False)
    sc = vm.schedule
    assert (sc.name, sc.group, sc.scope, sc.axis, sc.stages, sc.layers, sc.micro_batches,
            sc.ticks) == ("pipeline@block", "block", "block", "stage", 2, 2, 4, 5)
    assert sc.forward == ((0, 1, 2, 3, -1), (-1, 0, 1, 2, 3))
    assert sc.backward == ((-1, 3, 2, 1, 0), (3, 2, 1, 0, -1))
    assert sc.bubble == pytest.approx(1 / 5)
    # the hand-offs are the estimate's collective-permutes over the stage axis, one per tick
    permutes = session.estimate.collectives[("collective-permute", ("stage",))]
    assert sc.handoffs == permutes.count == 2 * sc.ticks
    assert sc.handoff_bytes == pytest.approx(permutes.bytes / permutes.count)
    assert sc.handoff_s == pytest.approx(permutes.time_s / permutes.count)
    assert sc.handoff_bytes > 0
    text = vm.to_text()
    assert "schedule (pipeline@block, gpipe): 4 micro-batches through 2 stages over stage" in text
    assert "stage 0 (layer 0): F0 F1 F2 F3 ·  | ·  B3 B2 B1 B0" in text
    assert "stage 1 (layer 1): ·  F0 F1 F2 F3 | B3 B2 B1 B0 ·" in text
    assert "bubble 1/5 = 20% of each stage's ticks" in text
    assert "(collective-permute over stage; 10 per step)" in text
    assert ViewModel.from_json(vm.to_json()).schedule == sc
    # a plan without stages has no schedule
    session.pin("pipeline@block", "none")
    assert builder.build(session, price=False).schedule is None


def test_the_graph_says_how_the_stages_cut_the_stack(gpt_scan, builder, session):
    session.pin("pipeline@block", "stage:2")
    words = "stages: 2 over stage, 1 layer each"
    opened = builder.build(session, price=False)  # block open: its cluster says so
    assert f'id="cluster:block" label="block ×2\\l{words}\\l"' in opened.graph.dot
    closed = builder.build(session, expanded=builder.default_expanded - {"block"},
                           price=False)
    node = closed.node("group.block")
    assert node.label.splitlines()[-1] == words
    assert words not in builder.build(Session(gpt_scan[0], MESH, gpt_scan[1]),
                                      price=False).graph.dot


def test_pin_and_unpin_stages(gpt_scan, builder, session):
    an, plan = gpt_scan
    session.pin("pipeline@block", "stage:2")
    assert session.plan.step.pipeline == Pipeline("block", "stage", 2)
    assert "pipeline@block" in session.plan.pinned
    assert session.pins["pipeline@block"] == "stage:2"
    assert session.plan.axes_of("layers") == ("stage",)
    assert session.estimate == tl.cost_model(an, MESH).estimate(session.plan)
    assert session.history[-1].name == "pipeline@block"
    stages = next(d for d in builder.build(session, price=False).steps
                  if d.name == "pipeline@block")
    assert (stages.label, stages.value, stages.pinned) == (
        "pipeline stages: block (scanned ×2)", "stage:2", True)
    session.unpin("pipeline@block")  # kept until a search changes it
    assert "pipeline@block" not in session.plan.pinned and session.plan.step.pipeline
    session.pin("pipeline@block", "none")
    assert session.plan.step.pipeline is None and session.pins["pipeline@block"] == "none"
    # an axis alone means all its devices as stages
    session.pin("pipeline@block", "data")
    assert session.plan.step.pipeline == Pipeline("block", "data", 2)
    # pinned from the start
    again = Session(an, MESH, plan, pins={"pipeline@block": "stage:2"})
    assert again.plan.step.pipeline == Pipeline("block", "stage", 2)


@pytest.mark.parametrize("value,reason", [
    ("stage:4", "4 stages do not divide its 2 layers evenly"),
    ("pipe:2", "the mesh has no axis 'pipe'; its axes are ['stage', 'data', 'model']"),
    ("stage:two", 'stages are written "<mesh axis>:<stages>" (e.g. "stage:4"), '
                  '"<mesh axis>:<stages>x<runs>" for a circular schedule (e.g. "stage:4x2") '
                  'or "none"'),
    ("stage:2xtwo", 'stages are written "<mesh axis>:<stages>"'),
    (3, 'stages are written "<mesh axis>:<stages>"'),
])
def test_stages_the_mesh_cannot_take_are_refused(session, value, reason):
    before = session.plan
    with pytest.raises(PinError, match="cannot pin pipeline@block to") as err:
        session.pin("pipeline@block", value)
    assert reason in str(err.value) and session.error == str(err.value)
    assert session.plan == before


def test_an_axis_whose_size_does_not_divide_the_layers_is_refused_and_not_offered():
    fn, args = tl.zoo.get("gpt_scan", layers=2, batch=16, seq=64)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 2, "model": 4}, device="cpu")
    session = Session(an, mesh, tl.strategies.expert(an, mesh)["dp+tp"])
    with pytest.raises(PinError, match="4 stages do not divide its 2 layers evenly"):
        session.pin("pipeline@block", "model:4")
    with pytest.raises(PinError, match="2 stages over mesh axis 'model' need an axis of that "
                                       "size"):
        session.pin("pipeline@block", "model:2")
    with pytest.raises(PinError, match="stages cut a scanned layer stack"):
        session.pin("pipeline@embed", "data:2")
    vm = ViewBuilder(an, mesh).build(session, price=False)
    stages = next(d for d in vm.steps if d.name == "pipeline@block")
    assert [ch.value for ch in stages.choices] == ["none", "data:2"]


def test_the_stage_axis_holds_the_stages_alone(gpt_scan, builder, session):
    session.pin("batch", ("data", "stage"))
    with pytest.raises(PinError, match=r"contradictory pins: pipeline@block=stage:2 .* "
                                       r"batch=data×stage is pinned otherwise; unpin it first"):
        session.pin("pipeline@block", "stage:2")
    session.pin("batch", "data")
    session.pin("pipeline@block", "stage:2")
    with pytest.raises(PinError, match="mesh axis stage holds the stages of pipeline@block "
                                       "and nothing else; pin pipeline@block to none first"):
        session.pin("mlp", ("stage",))
    with pytest.raises(PinError, match="the stages of pipeline@block hold layers, the stack's "
                                       "layer dim, on stage alone"):
        session.pin("layers", ())
    with pytest.raises(PinError, match="mesh axis stage holds the stages"):
        session.pin("embed@optimizer", ("stage",))
    # the Decisions tab refuses the same choices, with the same reason
    vm = builder.build(session, price=False)
    mlp = next(c for c in vm.classes if c.name == "mlp")
    refused = {ch.label: ch.reason for ch in mlp.choices if not ch.valid}
    assert set(refused) == {"stage", "stage×data", "stage×model", "stage×data×model"}
    assert refused["stage"].startswith("mesh axis stage holds the stages")


def test_stage_choices_are_priced_as_the_cost_model_prices_them(gpt_scan, builder, session):
    an, plan = gpt_scan
    vm = builder.build(session)
    stages = next(d for d in vm.steps if d.name == "pipeline@block")
    assert [ch.value for ch in stages.choices] == ["none", "stage:2", "data:2", "model:2"]
    model = tl.cost_model(an, MESH)
    for ch in stages.choices:
        assert ch.valid and ch.note
        if ch.current:
            assert ch.value == "none"
            continue
        axis = ch.value.split(":")[0]
        assert (ch.step_time_s, ch.peak_memory_bytes) == model.price(
            plan.with_pipeline("block", axis, 2))
    by = {ch.value: ch for ch in stages.choices}
    assert by["stage:2"].note.startswith("2 stages over mesh axis stage, 1 layer each;")
    assert "bubble 1/5 = 20% of each loop" in by["stage:2"].note
    # pinned through the widget's event, the estimate is the price shown
    lab = Lab.from_analysis(an, MESH, plan, widget=False, progress=False)
    lab._on_event({"event": "pin", "name": "pipeline@block", "value": "stage:2"})
    assert lab.view.error is None and lab.view.schedule is not None
    assert (lab.estimate.step_time_s, lab.estimate.peak_memory_bytes) == (
        by["stage:2"].step_time_s, by["stage:2"].peak_memory_bytes)
    lab._on_event({"event": "pin", "name": "pipeline@block", "value": "stage:3"})
    assert "3 stages do not divide its 2 layers" in lab.view.error
    lab._on_event({"event": "unpin", "name": "pipeline@block"})
    assert lab.view.error is None and "pipeline@block" not in lab.view.pinned


def test_the_search_keeps_pinned_stages(gpt_scan, session):
    session.pin("pipeline@block", "stage:2")
    result = session.search(background=False, budget_s=None, simulations=40, seed=0)
    assert result.plan.step.pipeline == Pipeline("block", "stage", 2)
    assert session.plan.step.pipeline == Pipeline("block", "stage", 2)
    assert "pipeline@block" in session.plan.pinned
    session.pin("pipeline@block", "none")
    result = session.search(background=False, budget_s=None, simulations=40, seed=0)
    assert result.plan.step.pipeline is None


def test_the_plan_viewer_draws_the_schedule_unpriced(gpt_scan):
    an, plan = gpt_scan
    vm = ViewBuilder(an, None).build_unpriced(plan.with_pipeline("block", "stage", 2))
    assert vm.schedule.forward == ((0, 1, 2, 3, -1), (-1, 0, 1, 2, 3))
    assert vm.schedule.handoff_bytes is None and vm.schedule.handoffs is None
    assert "hand-off" not in vm.to_text()


def test_a_circular_schedule_is_pinned_drawn_and_refused_below_its_micro_batches():
    fn, args = tl.zoo.get("gpt_scan", layers=4, batch=16, seq=64)
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.strategies.expert(an, MESH)["dp+tp"].without_pipeline()
    session = Session(an, MESH, plan.with_micro_batches(1))
    with pytest.raises(PinError, match="a circular schedule sends each micro-batch round the 2 "
                                       "stages again, so it needs at least 2 micro-batches"):
        session.pin("pipeline@block", "stage:2x2")
    session.pin("micro_batches", 2)
    session.pin("pipeline@block", "stage:2x2")
    assert session.plan.step.pipeline == Pipeline("block", "stage", 2, "circular", 2)
    assert session.pins["pipeline@block"] == "stage:2x2"
    builder = ViewBuilder(an, MESH)
    vm = builder.build(session, price=False)
    sc = vm.schedule
    assert (sc.schedule, sc.chunks, sc.ticks) == ("circular", 2, 5)
    assert sc.bubble == pytest.approx(1 / 5)
    assert sc.label == "stages: 2 over stage, 2 runs of 1 layer each"
    text = vm.to_text()
    assert "schedule (pipeline@block, circular, 2 runs per stage)" in text
    assert "stage 0 (layers 0, 2): F0.0 F1.0 F0.1 F1.1 ·    | ·    B1.1 B0.1 B1.0 B0.0" in text
    assert "stage 1 (layers 1, 3): ·    F0.0 F1.0 F0.1 F1.1 | B1.1 B0.1 B1.0 B0.0 ·" in text
    stages = next(d for d in vm.steps if d.name == "pipeline@block")
    circular = next(ch for ch in stages.choices if ch.value == "stage:2x2")
    assert circular.current and "circular: 2 runs of 1 layer per stage" in circular.note
