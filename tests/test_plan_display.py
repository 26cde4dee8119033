"""Plans that render without a kernel: plan files v2 (the view model, estimate and expert rows
beside the decisions), v1 files still loading, plans remembering their mesh, display(plan)."""

import json

import pytest

import toast_lab as tl
from toast_lab.cli import main
from toast_lab.lab import Lab, ViewModel
from toast_lab.lab._plan_display import NO_MESH, plan_display
from toast_lab.plan import PLAN_MIME, register_display
from toast_lab.plan._skip import without_member


@pytest.fixture(scope="module")
def gpt(tiny_gpt):
    return tiny_gpt


@pytest.fixture(scope="module")
def experts(gpt):
    an, mesh = gpt
    return tl.strategies.expert(an, mesh)


def _pinned_plan(an):
    (c,) = an.conflicts
    return (tl.Plan.replicated(an).with_axes("batch", "data", pin=True)
            .with_axes("seq", "model").with_resolution(c, "keep_dim3", pin=True))


def test_saved_plan_carries_its_view_estimate_and_experts(gpt, experts, tmp_path):
    an, mesh = gpt
    plan = _pinned_plan(an)
    path = plan.save(tmp_path / "plan.json", mesh=mesh)
    doc = json.loads(path.read_text())
    assert doc["version"] == 3 and list(doc)[-1] == "view"
    # Everything v1 had: decisions in order, pins, fingerprint, mesh, estimate.
    assert list(doc["classes"]) == ["batch", "seq"]
    assert doc["conflicts"] == {an.conflicts[0].name: "keep_dim3"}
    assert doc["pinned"] == sorted(plan.pinned)
    assert doc["program"]["fingerprint"] == an.program.fingerprint()
    assert doc["mesh"] == {"axes": {"data": 4, "model": 2}, "device": "h100-80gb"}
    est = tl.estimate(an, plan, mesh)
    assert doc["estimate"]["step_time_s"] == pytest.approx(est.step_time_s)
    assert doc["estimate"]["peak_memory_bytes"] == pytest.approx(est.peak_memory_bytes)
    # The expert comparison, on the same cost model.
    rows = {r["name"]: r for r in doc["experts"]}
    assert set(rows) == set(experts)
    for name, p in experts.items():
        assert rows[name]["step_time_s"] == pytest.approx(tl.estimate(an, p, mesh).step_time_s)
        assert rows[name]["classes"] == {k: list(v) for k, v in p.class_axes.items()}
    # The view model: the graph coloured by this plan, its decisions and the same estimate.
    vm = ViewModel.from_dict(doc["view"])
    assert {c.name: c.axes for c in vm.classes if c.axes} == plan.class_axes
    assert vm.conflicts[0].resolution == "keep_dim3" and vm.conflicts[0].active
    assert set(vm.pinned) == set(plan.pinned)
    assert vm.estimate["step_time_s"] == pytest.approx(est.step_time_s)
    assert vm.graph.dot and vm.graph.nodes and vm.mesh["axes"] == {"data": 4, "model": 2}
    assert vm.error is None and vm.selected is None and not vm.search.running
    # The decisions read first: the view is last, on one line.
    assert path.read_text().rstrip().splitlines()[-2].startswith('  "view": {')


def test_plan_files_load_v1_and_v2_and_remember_the_mesh(gpt, tmp_path):
    an, mesh = gpt
    plan = _pinned_plan(an)
    v2 = plan.save(tmp_path / "v2.json", mesh=mesh)
    loaded = tl.Plan.load(v2, an)
    assert loaded == plan and loaded.pinned == plan.pinned
    assert loaded.mesh == mesh
    # A v1 file (what toast-lab wrote before the view model) loads to the same plan.
    doc = json.loads(v2.read_text())
    v1 = {k: v for k, v in doc.items() if k not in ("view", "experts")} | {"version": 1}
    (tmp_path / "v1.json").write_text(json.dumps(v1, indent=2))
    old = tl.Plan.load(tmp_path / "v1.json", an)
    assert old == plan and old.pinned == plan.pinned and old.mesh == mesh
    # A file without a mesh section, or for a device that is not a preset (with a warning
    # saying so), has no mesh.
    (tmp_path / "m.json").write_text(json.dumps(v1 | {"mesh": None}))
    assert tl.Plan.load(tmp_path / "m.json", an).mesh is None
    own = {"axes": {"data": 4, "model": 2}, "device": "my-own-chip"}
    (tmp_path / "m.json").write_text(json.dumps(v1 | {"mesh": own}))
    with pytest.warns(tl.ToastWarning, match="'my-own-chip', which is no preset"):
        assert tl.Plan.load(tmp_path / "m.json", an).mesh is None
    # A newer format still fails clearly.
    (tmp_path / "v4.json").write_text(json.dumps(doc | {"version": 4}))
    with pytest.raises(tl.PlanFileError, match="newer toast-lab"):
        tl.Plan.load(tmp_path / "v4.json", an)


@pytest.mark.parametrize("view", [
    "[" * 200_000 + "]" * 200_000,                        # deeper than json.loads can recurse
    '{"graph": {"dot": "' + "x" * 5_000_000 + '"}}',      # megabytes
    '"not a view"',                                       # the wrong type
    '{"format": "toast-lab-view", "version": 99}',        # a view from the future
    '{"nested": {"view": "}{ ] [ \\" {"}}',              # brackets and quotes in strings
])
def test_the_view_section_can_never_break_a_load(gpt, tmp_path, view):
    an, mesh = gpt
    plan = _pinned_plan(an)
    doc = json.loads(plan.save(tmp_path / "ok.json", mesh=mesh).read_text())
    head = json.dumps({k: v for k, v in doc.items() if k != "view"})
    path = tmp_path / "odd.json"
    path.write_text(head[:-1] + ', "view": ' + view + "}")
    assert tl.Plan.load(path, an) == plan


def test_skipping_the_view_leaves_everything_else_and_bad_json_as_it_was():
    assert json.loads(without_member('{"a": [1, {"view": 2}], "view": {"x": "}"}, "b": "view"}',
                                     "view")) == {"a": [1, {"view": 2}], "view": None, "b": "view"}
    assert json.loads(without_member('{"view": 1, "view": [2]}', "view")) == {"view": None}
    for text in ('{"view": [1}', '[{"view": 1}]', '{"view": 1} trailing', '{"a": "unterminated}'):
        assert without_member(text, "view") == text  # json.loads reports the real error
    # Line numbers of errors after the view are kept.
    text = '{"view": [\n1,\n2\n],\n"a": nope}'
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads(without_member(text, "view"))
    assert err.value.lineno == 5


def test_display_plan_is_a_self_contained_mime_bundle(gpt, experts):
    an, mesh = gpt
    plan = experts["fsdp"]
    assert plan.mesh == mesh
    bundle = plan._repr_mimebundle_()
    assert set(bundle) == {PLAN_MIME, "text/plain"}
    data = json.loads(json.dumps(bundle[PLAN_MIME], allow_nan=False))  # plain JSON, no NaN
    assert data["plan"]["format"] == "toast-lab-plan" and "view" not in data["plan"]
    assert data["plan"]["classes"] == {k: list(v) for k, v in plan.class_axes.items()}
    vm = ViewModel.from_dict(data["view"])
    assert {c.name: c.axes for c in vm.classes if c.axes} == plan.class_axes
    assert vm.estimate["step_time_s"] == pytest.approx(tl.estimate(an, plan, mesh).step_time_s)
    assert {r.name for r in vm.experts} == set(experts)
    text = bundle["text/plain"]
    assert text.startswith(f"toast-lab plan for {an.program.fn_name} on data=4 × model=2")
    assert "embed → data×model" in text and "ms per step" in text and "extension" in text


def test_a_plan_without_a_mesh_shows_the_graph_and_decisions_and_says_why(gpt):
    an, _ = gpt
    plan = tl.Plan.replicated(an).with_axes("batch", "data")
    assert plan.mesh is None
    data = plan._repr_mimebundle_()[PLAN_MIME]
    vm = ViewModel.from_dict(data["view"])
    assert vm.mesh is None and vm.estimate is None and vm.experts == ()
    assert vm.notice == NO_MESH and data["note"] == NO_MESH
    batch = next(c for c in vm.classes if c.name == "batch")
    assert batch.axes == ("data",) and [ch.label for ch in batch.choices] == ["data"]
    assert all(ch.step_time_s is None for c in vm.classes for ch in c.choices)
    assert all(n.comm_s == 0 and not n.collectives for n in vm.graph.nodes)
    assert "'data': ..." in vm.snippet
    assert "no mesh" in plan._repr_mimebundle_()["text/plain"]
    # Saved without a mesh: decisions and the unpriced view, no estimate.
    doc = plan.to_dict()
    assert doc["mesh"] is None and "estimate" not in doc and doc["view"]["mesh"] is None


def test_plans_made_for_a_mesh_remember_it(gpt):
    an, mesh = gpt
    res = tl.search(an, mesh, simulations=30, seed=0)
    assert res.plan.mesh == mesh
    assert all(p.mesh == mesh for p in tl.strategies.expert(an, mesh).values())
    lab = Lab.from_analysis(an, mesh, widget=False)
    lab.pin("batch", "data")
    assert lab.plan.mesh == mesh
    # with_mesh checks the plan fits and keeps the plan's identity.
    plan = tl.Plan.replicated(an).with_axes("batch", "data")
    assert plan.with_mesh(mesh) == plan and plan.with_mesh(mesh).mesh is mesh
    with pytest.raises(tl.PlanError, match="not divisible"):
        plan.with_mesh(tl.Mesh({"data": 3}))
    # Derived plans keep it.
    assert plan.with_mesh(mesh).with_axes("mlp", "model").mesh is mesh


def test_lab_export_writes_the_view_it_shows_without_the_moment(gpt, tmp_path):
    an, mesh = gpt
    lab = Lab.from_analysis(an, mesh, widget=False)
    lab.pin("batch", "data")
    lab.toggle(next(g.id for g in lab.view.groups if g.parent == "" and not g.expanded))
    lab.session.fail("a refusal the person saw")
    path = lab.export(tmp_path / "lab_plan.json")
    doc = json.loads(path.read_text())
    assert tl.Plan.load(path, an) == lab.plan
    assert doc["version"] == 3 and doc["view"]["graph"]["dot"] == lab.view.graph.dot
    assert doc["view"]["error"] is None and doc["view"]["notice"] is None
    assert {r["name"] for r in doc["experts"]} == {r.name for r in lab.view.experts}


def test_partition_out_writes_a_plan_file_with_its_view(tmp_path, capsys):
    out = tmp_path / "partition_plan.json"
    assert main(["partition", "gpt", "-c", "size=tiny", "-c", "layers=2", "--mesh",
                 "data=4,model=2", "--device", "h100", "--budget", "0.5", "--out",
                 str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["version"] == 3 and doc["view"]["format"] == "toast-lab-view"
    assert doc["view"]["estimate"]["step_time_s"] == pytest.approx(doc["estimate"]["step_time_s"])
    # (the file also records the classes decided replicated: a tiny GPT on H100s, where each
    # kernel costs at least the device's floor, keeps most of them whole)
    sharded = {name: axes for name, axes in doc["classes"].items() if axes}
    assert {c["name"]: c["axes"] for c in doc["view"]["classes"] if c["axes"]} == sharded
    assert doc["experts"]


def test_without_a_view_builder_files_and_outputs_carry_the_decisions(gpt, tmp_path):
    an, mesh = gpt
    plan = _pinned_plan(an).with_mesh(mesh)
    register_display(None)
    try:
        doc = json.loads(plan.save(tmp_path / "bare.json").read_text())
        bundle = plan._repr_mimebundle_()
    finally:
        register_display(plan_display)
    assert doc["version"] == 3 and "view" not in doc and "estimate" not in doc
    assert tl.Plan.load(tmp_path / "bare.json", an) == plan
    assert bundle[PLAN_MIME]["view"] is None and "no view builder" in bundle[PLAN_MIME]["note"]
    assert "toast-lab plan for" in bundle["text/plain"]


def test_a_file_written_by_the_previous_format_loads_and_displays():
    """tests/data/plan_v1_gpt_tiny.json was written by toast-lab's format-1 writer (d71b48c)."""
    from pathlib import Path

    path = Path(__file__).parent / "data" / "plan_v1_gpt_tiny.json"
    assert json.loads(path.read_text())["version"] == 1
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    an = tl.analyze(tl.trace(fn, *args))
    plan = tl.Plan.load(path, an)
    assert plan.class_axes == {"batch": ("data",), "seq": ("model",)}
    assert plan.pinned == {"batch"} and plan.mesh == tl.Mesh({"data": 4, "model": 2}, "h100")
    # It displays like any plan made for its mesh; saved again, it is format 2 with a view.
    vm = ViewModel.from_dict(plan._repr_mimebundle_()[PLAN_MIME]["view"])
    assert vm.estimate["step_time_s"] == pytest.approx(tl.estimate(an, plan, plan.mesh).step_time_s)
