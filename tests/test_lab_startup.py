"""What the cell shows while tl.Lab builds: its stages, told to a listener or drawn in the cell
(the browser side is tests/e2e/test_lab_shell.py)."""

import re
import time

import pytest

import toast_lab as tl
from toast_lab.lab import Lab, _startup
from toast_lab.lab._startup import CellProgress
from toast_lab.progress import ProgressEvent


class NullWidget:
    view = op_costs = None

    def on_event(self, callback):
        pass


class Handle:
    """What IPython's display(..., display_id=True) returns: every bundle it was shown."""

    def __init__(self, bundle):
        self.bundles = [bundle]

    def update(self, bundle, raw=False):
        assert raw
        self.bundles.append(bundle)


class Display:
    def __init__(self):
        self.handles = []

    def __call__(self, bundle, raw=False, display_id=False):
        assert raw and display_id
        self.handles.append(Handle(bundle))
        return self.handles[-1]


def test_the_lab_tells_its_stages_in_order():
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    events = []
    Lab(fn, *args, mesh=tl.Mesh({"data": 2}), widget=NullWidget(), progress=events.append)
    top = [(e.key, e.state) for e in events if e.depth == 0]
    assert top == [(k, s) for k in ("trace", "analysis", "cost model", "experts", "first view")
                   for s in ("start", "done")]
    done = {e.key: e for e in events if e.state == "done"}
    assert done["trace"].detail.endswith(" ops") and " classes, " in done["analysis"].detail
    assert done["experts"].detail.endswith(" plans")
    # no listener, no cell: nothing shown, nothing broken
    Lab(fn, *args, mesh=tl.Mesh({"data": 2}), widget=NullWidget(), progress=False)


def test_a_failing_stage_is_told_and_the_error_raised():
    events = []

    def step(x):
        raise ValueError("the step is broken")

    with pytest.raises(Exception, match="the step is broken"):
        Lab(step, 1.0, mesh=tl.Mesh({"data": 2}), widget=NullWidget(), progress=events.append)
    assert [(e.key, e.state) for e in events] == [("trace", "start"), ("trace", "failed")]
    assert "the step is broken" in events[-1].detail


def test_cell_progress_draws_each_stage_as_it_goes_and_ends_as_totals():
    display = Display()
    cell = CellProgress("building the Lab on step", display=display, tick_s=0.05)
    handle = display.handles[0]
    assert "building the Lab on step" in handle.bundles[0]["text/plain"]
    assert 'data-toast-lab-progress="running"' in handle.bundles[0]["text/html"]
    cell(ProgressEvent("trace", "tracing the step", "start"))
    cell(ProgressEvent("trace", "tracing the step", "done", 0.8, detail="120 ops"))
    cell(ProgressEvent("cost model", "building the cost model", "start"))
    cell(ProgressEvent("compile", "compiling the cost model", "start", note="first run only",
                       depth=1))
    plain = handle.bundles[-1]["text/plain"]
    assert "✓ tracing the step  0.8 s · 120 ops" in plain
    assert "    ⋯ compiling the cost model  0.0 s  (first run only)" in plain
    shown = len(handle.bundles)
    time.sleep(0.3)  # a running stage ticks its seconds
    assert len(handle.bundles) > shown
    ticked = re.search(r"compiling the cost model  ([0-9.]+) s", handle.bundles[-1]["text/plain"])
    assert float(ticked.group(1)) >= 0.1
    cell(ProgressEvent("compile", "compiling the cost model", "done", 95.0, depth=1))
    cell(ProgressEvent("cost model", "building the cost model", "done", 96.0))
    cell.close(97.0)
    final = handle.bundles[-1]
    assert final["text/plain"] == ("toast-lab · Lab built in 97 s: trace 0.8 s · cost model 96 s;"
                                   " compiled the cost model in 95 s (cached for the next runs)")
    assert 'data-toast-lab-progress="done"' in final["text/html"]
    shown = len(handle.bundles)
    time.sleep(0.2)
    assert len(handle.bundles) == shown  # no more ticks


def test_cell_progress_ends_saying_the_prices_are_pending():
    """A Lab drawn before the kernel's compile ends says, in its totals line, that its prices
    follow (the widget counts the compile's seconds)."""
    display = Display()
    cell = CellProgress("building the Lab on step", display=display, tick_s=10.0)
    cell(ProgressEvent("trace", "tracing the step", "start"))
    cell(ProgressEvent("trace", "tracing the step", "done", 0.8))
    cell(ProgressEvent("first view", "drawing the first view", "start"))
    cell(ProgressEvent("first view", "drawing the first view", "done", 0.1,
                       detail="prices pending: compiling the cost model"))
    cell.close(1.0)
    assert display.handles[0].bundles[-1]["text/plain"] == (
        "toast-lab · Lab built in 1.0 s: trace 0.8 s · first view 0.1 s; prices pending: "
        "compiling the cost model, the Lab fills them in")


def test_cell_progress_keeps_a_failure_on_screen():
    display = Display()
    cell = CellProgress("building", display=display, tick_s=10)
    cell(ProgressEvent("trace", "tracing the step", "start"))
    cell(ProgressEvent("trace", "tracing the step", "failed", 0.1, detail="ValueError: bad"))
    cell.close(0.2)
    final = display.handles[0].bundles[-1]
    assert "✗ tracing the step  0.1 s · ValueError: bad" in final["text/plain"]
    assert 'data-toast-lab-progress="failed"' in final["text/html"]


def test_a_lab_that_fails_outside_any_stage_is_not_shown_as_built(monkeypatch):
    display = Display()
    monkeypatch.setattr(_startup, "in_kernel", lambda: True)
    monkeypatch.setattr("IPython.display.display", display)

    class BrokenWidget(NullWidget):
        def on_event(self, callback):
            raise RuntimeError("no front end")

    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    with pytest.raises(RuntimeError, match="no front end"):
        Lab(fn, *args, mesh=tl.Mesh({"data": 2}), widget=BrokenWidget())
    final = display.handles[0].bundles[-1]
    assert 'data-toast-lab-progress="failed"' in final["text/html"]
    assert "Lab built" not in final["text/plain"]


def test_in_a_kernel_the_lab_shows_its_progress_in_the_cell(monkeypatch):
    display = Display()
    monkeypatch.setattr(_startup, "in_kernel", lambda: True)
    monkeypatch.setattr("IPython.display.display", display)
    fn, args = tl.zoo.get("gpt", size="tiny", layers=2)
    lab = Lab(fn, *args, mesh=tl.Mesh({"data": 2}), widget=NullWidget())
    [handle] = display.handles
    first = handle.bundles[0]["text/plain"]
    assert first.startswith("toast-lab · building the Lab on gpt_train_step, Mesh(data=2")
    texts = [b["text/plain"] for b in handle.bundles]
    assert any("⋯ tracing the step" in t for t in texts)
    assert any("✓ estimating the expert plans" in t for t in texts)
    assert texts[-1].startswith("toast-lab · Lab built in ")
    assert lab.view is not None
