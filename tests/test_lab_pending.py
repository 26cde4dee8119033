"""The Lab's first view while the cost model's kernel still compiles (lab/_pending.py): the
graph, classes and decisions at once with every price pending, then the complete view, with
what the person did meanwhile applied. The compile is simulated (a compile "under way" that a
test ends), so no test needs empty caches; the real one is benchmarks/lab_latency.py's cold
start."""

import re
import threading
import time

import pytest

import toast_lab as tl
from toast_lab.cost._kernel import _ahead
from toast_lab.lab import Lab, PinError, ViewModel
from toast_lab.lab import _lab


class RecordingWidget:
    """A LabView stand-in keeping every view sent, and sending events as the page would."""

    def __init__(self):
        self.views, self.callbacks, self.progress, self.op_costs = [], [], "", None

    @property
    def view(self):
        return self.views[-1] if self.views else None

    @view.setter
    def view(self, doc):
        self.views.append(doc)

    def on_event(self, callback):
        self.callbacks.append(callback)

    def click(self, **event):
        for callback in self.callbacks:
            callback(event)


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    return fn, args, tl.Mesh({"data": 4, "model": 2}, device="h100")


@pytest.fixture
def compiling(monkeypatch):
    """A kernel compile under way in a notebook's kernel, until the test sets the event."""
    _ahead.wait()  # the real compile first: its end must not end the one simulated here
    done = threading.Event()
    monkeypatch.setattr(_ahead, "_done", done)
    monkeypatch.setattr(_ahead, "_thread", threading.Thread(target=done.wait))
    monkeypatch.setattr(_ahead, "_began", time.perf_counter() - 12.0)
    monkeypatch.setattr(_lab, "in_kernel", lambda: True)
    yield done
    done.set()


def _priced(lab, timeout=60.0):
    """Waits for the session the way a headless caller does, with a limit."""
    return lab._ready.result(timeout)


def test_the_first_view_comes_before_the_prices_and_says_why(gpt, compiling):
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)
    assert lab.pending and "pricing pending: compiling the cost model" in repr(lab)
    first = widget.views[0]
    vm = lab.view
    assert first["pricing"] == vm.pricing and vm.pricing.startswith("compiling the cost model")
    assert "about 40 s the first time; cached after" in vm.pricing
    # the graph, the classes and conflicts, the decisions and the mesh: drawn
    assert vm.graph.nodes and vm.graph.edges and vm.graph.dot
    assert {c.name for c in vm.classes} == {c.name for c in lab.analysis.classes}
    assert len(vm.conflicts) == len(lab.analysis.conflicts)
    assert vm.mesh["axes"] == {"data": 4, "model": 2}
    assert all(len(c.choices) > 1 for c in vm.classes if not c.minor)
    assert vm.steps  # remat and micro-batches, offered
    # every price pending, none made up
    assert vm.estimate is None and vm.experts == () and vm.memory is None
    for c in vm.classes + vm.conflicts:
        assert all(ch.step_time_s is None and ch.peak_memory_bytes is None for ch in c.choices)
    assert "pricing: compiling the cost model" in vm.to_text()
    assert re.match(r"pricing: compiling the cost model, 1\d s so far \(about 40 s the first "
                    r"time; cached after\)", widget.progress)  # (12 s when it began)
    assert ViewModel.from_dict(first) == vm

    compiling.set()
    _priced(lab)
    assert not lab.pending and lab.view.pricing is None
    done = widget.views[-1]
    assert done["pricing"] is None and done["estimate"]["step_time_s"] == \
        lab.estimate.step_time_s
    assert done["experts"] and done["memory"] is not None and done["start"] is not None
    assert all(ch["step_time_s"] is not None
               for c in done["classes"] for ch in c["choices"] if ch["valid"])
    assert "pricing" not in widget.progress and "ms/step" in repr(lab)


def test_until_priced_the_graph_is_coloured_by_an_expert_plan_and_says_which(gpt, compiling):
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)
    vm = lab.view
    assert vm.start.how == "unpriced" and vm.start.label == "start until priced: fsdp"
    assert vm.start.step_time_s is None and vm.start.peak_memory_bytes is None
    assert "until the expert plans are priced" in vm.start.note
    assert widget.views[0]["start"]["label"] == "start until priced: fsdp"
    fsdp = tl.strategies.expert(lab.analysis, mesh, fit=False)["fsdp"]
    shown = {c.name: c.axes for c in vm.classes if c.axes}
    assert shown and shown == {c.name: fsdp.axes_of(c.id) for c in lab.analysis.classes
                               if fsdp.axes_of(c.id)}
    # coloured: each class the plan shards is in the legend, in its colour, and in the graph
    for c in vm.classes:
        if c.axes:
            assert c.legend and c.color.lower() in vm.graph.dot.lower()
    assert "start until priced: fsdp" in vm.to_text()

    compiling.set()
    _priced(lab)
    start = lab.view.start
    assert start.how == "expert" and start.step_time_s > 0 and start.label.startswith("start: ")


def test_until_priced_the_pins_go_on_the_expert_plan_they_overrule_least(gpt, compiling):
    fn, args, mesh = gpt
    lab = Lab(fn, *args, mesh=mesh, widget=RecordingWidget(), progress=False,
              pins={"batch": "model"})
    vm = lab.view
    # every expert shards the batch otherwise: fsdp, the first, with the pin on top
    assert vm.start.how == "unpriced" and vm.start.name == "fsdp"
    assert "with your pins of batch on top" in vm.start.note
    batch = next(c for c in vm.classes if c.name == "batch")
    assert batch.axes == ("model",) and batch.pinned
    assert len([c for c in vm.classes if c.axes]) > 1
    compiling.set()
    _priced(lab)
    assert lab.plan.axes_of("batch") == ("model",)


def test_what_is_clicked_while_pending_is_shown_at_once_and_applied_once_priced(gpt, compiling):
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)
    group = next(g for g in lab.view.groups if g.children and not g.expanded)
    widget.click(event="toggle", group=group.id)  # no price needed: at once
    assert lab.view.group(group.id).expanded
    widget.click(event="pin", name="batch", value=["data"])
    widget.click(event="pin", name="heads", value=["model"])
    widget.click(event="unpin", name="heads")
    widget.click(event="search", budget_s=60)
    widget.click(event="stop")                   # the Stop takes the queued Search back
    widget.click(event="search", budget_s=0.5)
    vm = lab.view
    batch = next(c for c in vm.classes if c.name == "batch")
    assert batch.axes == ("data",) and batch.pinned and vm.pinned == ("batch",)
    assert vm.estimate is None and vm.pricing
    assert vm.notice == ("once the cost model is compiled: pin batch → data; pin heads → "
                         "model; unpin heads; search (0.5 s)")

    compiling.set()
    session = _priced(lab)
    assert lab.plan.axes_of("batch") == ("data",) and "batch" in lab.plan.pinned
    assert lab.plan.axes_of("heads") == ("model",) and "heads" not in lab.plan.pinned
    result = lab.wait(30)                        # the Search clicked, run after the compile
    assert result is not None and session.search_state.budget_s == 0.5
    assert lab.view.group(group.id).expanded and lab.view.estimate is not None
    assert lab.estimate == tl.estimate(lab.analysis, lab.plan, mesh)


def test_a_pin_refused_while_pending_is_refused_at_once_by_the_sessions_rules(gpt, compiling):
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)
    widget.click(event="pin", name="heads", value=["data", "model"])  # 8 devices, 4 heads
    assert lab.view.pinned == () and "not divisible" in lab.view.error
    assert lab.view.notice is None  # nothing waits for the prices
    widget.click(event="pin", name="batch", value=["data"])
    assert lab.view.error is None and lab.view.pinned == ("batch",)
    # a contradiction the session refuses is refused the same way before the prices
    conflict = next(c for c in lab.analysis.conflicts)
    cls = lab.analysis.classes[conflict.class_id].name
    widget.click(event="pin", name=cls, value=[])
    widget.click(event="pin", name=conflict.name, value=conflict.resolutions[0])
    assert "contradictory pins" in lab.view.error
    compiling.set()
    _priced(lab)
    assert "heads" not in lab.plan.pinned and conflict.name not in lab.plan.pinned
    assert lab.plan.axes_of("batch") == ("data",) and lab.view.error is None


def test_headless_calls_wait_for_the_prices(gpt, compiling):
    fn, args, mesh = gpt
    lab = Lab(fn, *args, mesh=mesh, widget=RecordingWidget(), progress=False)
    threading.Timer(0.5, compiling.set).start()
    t0 = time.perf_counter()
    plan = lab.pin("batch", "data")              # waits, then pins as always
    assert time.perf_counter() - t0 >= 0.4
    assert plan.axes_of("batch") == ("data",) and lab.estimate.step_time_s > 0
    assert lab.view.pricing is None and lab.view.estimate is not None


def test_a_starting_pin_the_session_would_refuse_is_refused_at_once(gpt, compiling):
    fn, args, mesh = gpt
    with pytest.raises(PinError, match="not divisible"):
        Lab(fn, *args, mesh=mesh, widget=RecordingWidget(), progress=False,
            pins={"heads": ("data", "model")})
    lab = Lab(fn, *args, mesh=mesh, widget=RecordingWidget(), progress=False,
              pins={"batch": "data"})
    assert lab.view.pinned == ("batch",)
    compiling.set()
    _priced(lab)
    assert lab.plan.axes_of("batch") == ("data",) and "batch" in lab.plan.pinned


def test_a_session_that_cannot_be_built_is_an_error_in_the_view_and_where_awaited(
        gpt, compiling, monkeypatch):
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)

    def broken(*args, **kwargs):
        raise RuntimeError("no cost model today")

    monkeypatch.setattr(_lab, "Session", broken)
    compiling.set()
    with pytest.raises(RuntimeError, match="no cost model today"):
        _priced(lab)
    assert "could not price its plans" in lab.view.error and lab.pending
    assert "pricing failed" in repr(lab) and "pricing" not in widget.progress


def test_without_a_compile_under_way_the_first_view_is_complete(gpt, monkeypatch):
    monkeypatch.setattr(_lab, "in_kernel", lambda: True)
    monkeypatch.setattr(_ahead, "_thread", None)  # (compiled in this process: none runs)
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)
    assert not lab.pending and widget.views
    assert all(v["pricing"] is None and v["estimate"] is not None for v in widget.views)


def test_outside_a_notebook_the_lab_waits_for_the_compile_as_before(gpt, compiling,
                                                                      monkeypatch):
    monkeypatch.setattr(_lab, "in_kernel", lambda: False)
    threading.Timer(0.3, compiling.set).start()
    fn, args, mesh = gpt
    widget = RecordingWidget()
    lab = Lab(fn, *args, mesh=mesh, widget=widget, progress=False)
    assert not lab.pending and all(v["estimate"] is not None for v in widget.views)
