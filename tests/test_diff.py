"""tl.diff: which decisions two plans make differently, and what that costs."""

import json

import pytest

import toast_lab as tl
from toast_lab.lab import ViewModel
from toast_lab.lab._diff import DIFF_MIME


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", size="tiny", layers=3)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    return an, mesh, tl.strategies.expert(an, mesh)


def test_dp_to_fsdp_shards_the_parameters_and_adds_all_gathers(gpt):
    an, mesh, experts = gpt
    dp, fsdp = experts["dp"], experts["fsdp"]
    d = tl.diff(dp, fsdp, names=("dp", "fsdp"))
    # The classes that differ are exactly those FSDP shards and DP replicates.
    expected = {c.name: (dp.axes_of(c.id), fsdp.axes_of(c.id)) for c in an.classes
                if dp.axes_of(c.id) != fsdp.axes_of(c.id)}
    assert {c.name: (c.before, c.after) for c in d.classes} == expected
    assert expected and all(before == () for before, _ in expected.values())
    assert "batch" not in expected  # both shard the batch the same way
    assert d.conflicts == () and not d.same
    # Costs are the cost model's, on the plans' mesh.
    ea, eb = tl.estimate(an, dp, mesh), tl.estimate(an, fsdp, mesh)
    assert d.step_time_s == (ea.step_time_s, eb.step_time_s)
    assert d.delta_step_time_s == pytest.approx(eb.step_time_s - ea.step_time_s)
    assert d.delta_peak_memory_bytes == pytest.approx(eb.peak_memory_bytes - ea.peak_memory_bytes)
    assert d.delta_peak_memory_bytes < 0  # sharded parameters and optimizer state
    # FSDP gathers its parameters before use: all-gathers DP does not have.
    gathers = [c for c in d.collectives if c.kind == "all-gather"]
    assert gathers and all(c.count[0] == 0 and c.delta_count > 0 and c.delta_bytes > 0
                           for c in gathers)
    for c in d.collectives:  # every change is the estimates' own numbers
        a = ea.collectives.get((c.kind, c.axes))
        b = eb.collectives.get((c.kind, c.axes))
        assert c.count == ((a.count if a else 0.0), (b.count if b else 0.0))
        assert c.bytes == ((a.bytes if a else 0.0), (b.bytes if b else 0.0))
    text = str(d)
    assert "dp → fsdp" in text and "all-gather" in text and "step time" in text
    for name in expected:
        assert name in text


def test_a_conflict_becomes_active_when_its_class_is_sharded(gpt):
    an, mesh, experts = gpt
    d = tl.diff(experts["dp+tp"], experts["dp+sp"])
    (c,) = an.conflicts
    (change,) = d.conflicts
    assert change.name == c.name and change.before is None
    assert change.after == experts["dp+sp"].resolution_of(c)
    assert any(ch.name == c.class_name and ch.after for ch in d.classes)


def test_the_same_plan_has_no_differences(gpt):
    an, mesh, experts = gpt
    d = tl.diff(experts["fsdp"], experts["fsdp"])
    assert d.same and d.classes == () and d.collectives == ()
    assert d.delta_step_time_s == 0 and d.delta_peak_memory_bytes == 0
    assert "the same decisions" in str(d)


def test_decision_order_is_a_difference(gpt):
    an, mesh, _ = gpt
    r = tl.Plan.replicated(an)
    a = r.with_axes("batch", "data").with_axes("embed", "data")
    b = r.with_axes("embed", "data").with_axes("batch", "data")
    d = tl.diff(a, b, mesh=mesh)
    assert d.classes == () and d.order == (("batch", "embed"), ("embed", "batch"))
    assert not d.same and "decision order" in str(d)


def test_plans_of_two_traces_of_one_program_compare_by_name(gpt):
    an, mesh, experts = gpt
    fn, args = tl.zoo.get("gpt", size="tiny", layers=3)
    again = tl.analyze(tl.trace(fn, *args))
    other = tl.Plan.from_decisions(again, experts["fsdp"].class_axes)
    d = tl.diff(experts["dp"], other, mesh=mesh)
    assert d.classes == tl.diff(experts["dp"], experts["fsdp"]).classes


def test_plans_of_different_programs_are_refused(gpt):
    an, mesh, experts = gpt
    fn, args = tl.zoo.get("mlp")
    mlp = tl.Plan.replicated(tl.analyze(tl.trace(fn, *args)))
    with pytest.raises(ValueError, match="different programs"):
        tl.diff(experts["dp"], mlp)


def test_without_a_mesh_the_diff_has_the_decisions_only(gpt):
    an, _, _ = gpt
    r = tl.Plan.replicated(an)
    d = tl.diff(r, r.with_axes("batch", "data"))
    assert [(c.name, c.before, c.after) for c in d.classes] == [("batch", (), ("data",))]
    assert d.step_time_s is None and d.collectives == () and "no mesh" in d.note
    assert "no mesh" in str(d)


def test_diff_output_carries_both_plans_views(gpt):
    an, mesh, experts = gpt
    d = tl.diff(experts["dp"], experts["fsdp"], names=("dp", "fsdp"))
    doc = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert doc["names"] == ["dp", "fsdp"] and len(doc["classes"]) == len(d.classes)
    assert doc["meshes"][0] == {"axes": {"data": 4, "model": 2}, "device": "h100-80gb"}
    bundle = d._repr_mimebundle_()
    data = json.loads(json.dumps(bundle[DIFF_MIME], allow_nan=False))
    assert data["diff"] == doc
    for side, plan in (("a", experts["dp"]), ("b", experts["fsdp"])):
        vm = ViewModel.from_dict(data[side]["view"])
        assert {c.name: c.axes for c in vm.classes if c.axes} == plan.class_axes
        assert data[side]["plan"]["classes"] == {k: list(v) for k, v in plan.class_axes.items()}
    assert bundle["text/plain"] == str(d)


def test_pipeline_stages_are_a_step_decision_that_differs():
    fn, args = tl.zoo.get("gpt_scan", layers=2, batch=16, seq=64)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"stage": 2, "data": 2, "model": 2}, device="cpu")
    flat = tl.strategies.expert(an, mesh)["dp+tp"].with_micro_batches(4)
    staged = flat.with_pipeline("block", "stage", 2)
    d = tl.diff(flat, staged, mesh, names=("flat", "staged"))
    assert [(c.name, c.before, c.after) for c in d.steps] == [
        ("pipeline@block", "none", "stage:2")]
    assert any(c.name == "layers" and c.after == ("stage",) for c in d.classes)
    hand = [c for c in d.collectives if (c.kind, c.axes) == ("collective-permute", ("stage",))]
    assert len(hand) == 1 and hand[0].count == (0.0, 10.0)  # a hand-off per tick, both loops
    text = str(d)
    assert "pipeline@block: none → stage:2" in text and "collective-permute" in text
    assert "remat, micro-batches and stages rewrite it" in d.note
    assert d.to_dict()["steps"] == [{"name": "pipeline@block", "before": "none",
                                     "after": "stage:2"}]
    assert [(c.name, c.before, c.after) for c in tl.diff(staged, flat, mesh).steps] == [
        ("pipeline@block", "stage:2", "none")]
