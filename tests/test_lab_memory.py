"""The Lab's memory chart data (MemoryView): live bytes per device over the step, sampled for
the view model, whose peak is the peak the view's estimate shows; in plan files and outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

import toast_lab as tl
from toast_lab.cost import MEMORY_CATEGORIES
from toast_lab.lab import Lab, Session, ViewBuilder, ViewModel
from toast_lab.lab._memory import MAX_SAMPLES, memory_view, sample_positions
from toast_lab.lab._plan_display import plan_display
from toast_lab.lab._viewmodel import saved_view


@pytest.fixture(scope="module")
def gpt(tiny_gpt):
    return tiny_gpt


@pytest.fixture(scope="module")
def builder(gpt):
    return ViewBuilder(*gpt)


def _session(gpt, plan=None):
    an, mesh = gpt
    return Session(an, mesh, plan if plan is not None else tl.Plan.replicated(an))


def _check_peak(vm: ViewModel) -> None:
    """The chart's peak is the estimate's, drawn, at its op, and the stack there sums to it."""
    m = vm.memory
    assert m.peak_bytes == vm.estimate["peak_memory_bytes"]
    k = m.positions.index(m.peak_position)
    assert m.ops[k] == m.peak_op
    stack = [sum(v[i] for v in m.categories.values()) for i in range(len(m.positions))]
    assert stack[k] == max(stack)
    assert abs(stack[k] - m.peak_bytes) <= len(MEMORY_CATEGORIES)  # whole bytes per category


def test_the_charts_peak_is_the_peak_the_view_shows(gpt, builder):
    an, mesh = gpt
    s = _session(gpt)
    _check_peak(builder.build(s))
    s.pin("batch", ("data",))
    _check_peak(builder.build(s))
    s.pin("embed", ("model",))
    _check_peak(builder.build(s))
    for name, plan in tl.strategies.expert(an, mesh).items():
        vm = builder.build(_session(gpt, plan))
        _check_peak(vm)
        assert vm.memory.peak_bytes == tl.estimate(an, plan, mesh).peak_memory_bytes, name


def test_after_a_search_the_chart_peaks_at_the_best_plans_estimate(gpt, builder):
    s = _session(gpt)
    s.search(budget_s=None, simulations=60, seed=0, background=False)
    vm = builder.build(s)
    _check_peak(vm)


@pytest.mark.parametrize("name", ["gpt_scan", "moe", "cnn"])
def test_the_peak_matches_on_other_models(name):
    fn, args = tl.zoo.get(name)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    s = Session(an, mesh)
    s.search(budget_s=None, simulations=30, seed=0, background=False)
    _check_peak(ViewBuilder(an, mesh).build(s))


def test_sharding_the_batch_lowers_the_drawn_temporaries(gpt, builder):
    replicated = builder.build(_session(gpt)).memory
    s = _session(gpt)
    s.pin("batch", ("data",))
    dp = builder.build(s).memory
    temps = MEMORY_CATEGORIES[3]
    assert max(dp.categories[temps]) < max(replicated.categories[temps])
    assert dp.peak_bytes < replicated.peak_bytes


def test_the_peak_op_is_named_as_the_op_panel_names_it(gpt, builder):
    an, _ = gpt
    s = _session(gpt)
    m = builder.build(s).memory
    op = an.program.ops[m.peak_op]
    assert (m.peak_primitive, m.peak_source, m.peak_scope) == (op.primitive, op.source,
                                                               op.name_scope)
    s.select("op", m.peak_op)  # what a click on the chart's peak asks
    details = builder.build(s).details
    assert (details.op, details.primitive, details.source) == (m.peak_op, m.peak_primitive,
                                                               m.peak_source)


# --- sampling --------------------------------------------------------------------------------

def test_a_short_step_is_drawn_whole(gpt):
    an, mesh = gpt
    t = tl.cost_model(an, mesh).memory_timeline(tl.Plan.replicated(an))
    m = memory_view(an, t, max_samples=len(t.ops))
    assert m.positions == tuple(range(len(an.program.ops)))
    assert sorted(m.ops) == list(range(len(an.program.ops)))


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("n", [1, 7, 401, 5000, 20011])
def test_sampling_keeps_the_peak_the_ends_and_each_stretchs_extremes(seed, n):
    rng = np.random.default_rng(seed)
    total = np.cumsum(rng.normal(size=n)) + rng.uniform(0, 1e3)
    total[rng.integers(n)] += 50.0  # a spike one op wide: sampling must not miss it
    at = sample_positions(total, MAX_SAMPLES)
    assert len(at) <= MAX_SAMPLES
    assert (np.diff(at) > 0).all() and at[0] == 0 and at[-1] == n - 1
    assert int(np.argmax(total)) in at.tolist()
    assert total[at].max() == total.max() and total[at].min() == total.min()
    if n > MAX_SAMPLES:  # every stretch's largest and smallest
        stretches = (MAX_SAMPLES - 3) // 2
        bounds = np.linspace(0, n, stretches + 1).astype(int)
        kept = set(at.tolist())
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            assert lo + int(np.argmax(total[lo:hi])) in kept
            assert lo + int(np.argmin(total[lo:hi])) in kept


def test_a_sampled_timeline_keeps_the_exact_peak_and_its_op(gpt):
    an, mesh = gpt
    model = tl.cost_model(an, mesh)
    plan = tl.strategies.expert(an, mesh)["fsdp"]
    t = model.memory_timeline(plan)
    m = memory_view(an, t, max_samples=40)
    assert len(m.positions) <= 40 < len(t.ops)
    assert m.peak_bytes == t.peak_bytes == model.estimate(plan).peak_memory_bytes
    assert m.peak_position in m.positions and m.peak_op == int(t.ops[t.peak_position])
    assert tuple(m.categories) == MEMORY_CATEGORIES
    for name, values in m.categories.items():  # each drawn value is the op's own, not a mean
        assert values == tuple(np.rint(t.categories[name][list(m.positions)]).astype(int))


def test_a_large_step_stays_small_in_the_view():
    fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=12)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e")
    s = Session(an, mesh)
    vm = ViewBuilder(an, mesh).build(s)
    m = vm.memory
    assert m.steps == len(an.program.ops) > 10 * MAX_SAMPLES
    assert len(m.positions) <= MAX_SAMPLES
    _check_peak(vm)
    size = len(json.dumps(vm.to_dict()["memory"]))
    assert size < 40_000, size  # of a saved notebook's 1 MB


# --- the view model and plan files --------------------------------------------------------------

def test_the_memory_view_round_trips_and_renders_as_text(gpt, builder):
    s = _session(gpt)
    s.pin("batch", ("data",))
    vm = builder.build(s)
    doc = json.loads(vm.to_json())
    assert list(doc["memory"]["categories"]) == list(MEMORY_CATEGORIES)
    again = ViewModel.from_dict(doc)
    assert again == vm and again.memory == vm.memory
    assert isinstance(again.memory.categories[MEMORY_CATEGORIES[0]], tuple)
    line = next(x for x in vm.to_text().splitlines() if x.startswith("memory over the step"))
    m = vm.memory
    assert f"at op {m.peak_op} ({m.peak_primitive}" in line
    assert f"run {m.peak_position + 1} of {m.steps}" in line
    # a view model written before the chart existed still reads, without one
    del doc["memory"]
    assert ViewModel.from_dict(doc).memory is None


def test_a_saved_plan_and_its_output_carry_the_chart(gpt, tmp_path):
    an, mesh = gpt
    plan = tl.strategies.expert(an, mesh)["fsdp"]
    shown = plan_display(plan, mesh)
    assert shown.view["memory"]["peak_bytes"] == shown.estimate["peak_memory_bytes"]
    path = plan.save(tmp_path / "plan.json", mesh=mesh)
    doc = json.loads(path.read_text())
    m = ViewModel.from_dict(doc["view"]).memory
    assert m is not None and m.peak_bytes == doc["estimate"]["peak_memory_bytes"]
    assert m.peak_bytes == tl.estimate(an, plan, mesh).peak_memory_bytes
    # the chart is the plan's, not the moment's: a file keeps it
    assert saved_view({"memory": shown.view["memory"]})["memory"] == shown.view["memory"]


def test_without_a_mesh_there_is_no_chart(gpt):
    an, _ = gpt
    shown = plan_display(tl.Plan.replicated(an).with_axes("batch", "data"), None)
    assert shown.view["memory"] is None
    assert "memory over the step" not in ViewModel.from_dict(shown.view).to_text()


def test_a_lab_export_carries_the_chart_it_shows(gpt, tmp_path):
    an, mesh = gpt
    lab = Lab.from_analysis(an, mesh, widget=False)
    out = lab.export(tmp_path / "plan.json")
    doc = json.loads(out.read_text())
    assert doc["view"]["memory"] == lab.view.to_dict()["memory"]
    assert doc["view"]["memory"]["peak_bytes"] == lab.estimate.peak_memory_bytes
