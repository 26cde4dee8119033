"""The real Lab in a live notebook: `tl.Lab(fn, *args, mesh=...)` on the zoo GPT, driven in
Chromium as a person would: the graph, a group opened, a pin, a search run and stopped while
another cell runs, a crash in a callback, the export button, the charts.

One notebook (one kernel) for the module: building the Lab takes the kernel a few seconds, and
the tests follow a session's course. Each test starts from the state it needs.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

import pytest

from .conftest import shoot
from .notebooks import (BOKEH_SOURCE, kernel_execute, kernel_json, open_notebook, run_new_cell,
                        send_to_widget)

pytestmark = pytest.mark.e2e

# The zoo's GPT at GPT-2-small width with 2 layers (the kernel's work grows with the layers,
# not the width) on 4 x 2 TPU v5e: 16 GiB each, so the replicated start does not fit and the
# memory chart starts red.
LAB_CELL = '''\
import toast_lab as tl

fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e"))
lab'''

# One attribute of a named Bokeh model (e.g. the capacity line's colour) as BokehJS holds it.
BOKEH_MODEL = '''([name, attr]) => {
  for (const doc of (window.Bokeh?.documents ?? [])) {
    const m = doc.get_model_by_name(name);
    if (m) { return m[attr]; }
  }
  return null;
}'''


# From the Stop button's click event to the header's data-running="false", in page time.
STOP_TIMER = '''() => {
  delete window.tlStopSeenMs;
  const stop = document.querySelector('.tl-widget .tl-stop');
  stop.addEventListener('click', () => {
    const clicked = performance.now();
    const done = () => document.querySelector('.tl-widget .tl-progress')?.dataset.running === 'false';
    const obs = new MutationObserver(() => {
      if (done()) { obs.disconnect(); window.tlStopSeenMs = performance.now() - clicked; }
    });
    obs.observe(document.querySelector('.tl-widget'), {subtree: true, attributes: true, childList: true});
  }, {once: true, capture: true});
}'''


@dataclass
class Live:
    page: object
    lab: object               # the .tl-lab locator
    server: object
    model_id: str             # the LabView's widget model
    errors: list = field(default_factory=list)

    def kernel(self, code: str) -> str:
        return kernel_execute(self.page, code)

    def value(self, expr: str):
        return kernel_json(self.page, expr)

    def bokeh(self, name: str):
        return self.page.evaluate(f"({BOKEH_SOURCE})({name!r})")

    def bokeh_attr(self, name: str, attr: str):
        return self.page.evaluate(f"({BOKEH_MODEL})", [name, attr])

    def wait_bokeh_attr(self, name: str, attr: str, value, timeout_s: float = 5) -> None:
        deadline = time.monotonic() + timeout_s
        while (got := self.bokeh_attr(name, attr)) != value:
            assert time.monotonic() < deadline, f"{name}.{attr} is {got!r}, not {value!r}"
            time.sleep(0.05)

    def step_text(self) -> str:
        return self.lab.locator('.tl-figure[data-figure="step time"] .tl-figure-value').inner_text()


@pytest.fixture(scope="module")
def live(lab_server, browser_context):
    from playwright.sync_api import expect

    page = browser_context.new_page()
    page.set_viewport_size({"width": 1500, "height": 1300})  # the Lab and its charts in view
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text)
            if m.type == "error" and "toast" in m.text.lower() else None)
    open_notebook(lab_server, page, "live_lab.ipynb", [LAB_CELL])
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=180_000)
    expect(page.locator(".tl-charts canvas").first).to_be_visible(timeout=60_000)
    model_id = kernel_json(page, "lab.widget.model_id")
    yield Live(page, lab, lab_server, model_id, errors)
    page.close()


def live_output(page):
    """The Lab's cell's outputs: the widget and, under it, the charts."""
    return page.locator(".jp-Cell").first.locator(".jp-OutputArea")


def _replicated(live: Live) -> None:
    """Back to the replicated plan with nothing pinned, the default groups open, no search."""
    live.kernel("lab.stop(); lab.set_plan(tl.Plan.replicated(lab.analysis))\n"
                "for g in sorted(set(lab.expanded) - set(lab.builder.default_expanded)):\n"
                "    lab.toggle(g)")


def test_the_graph_renders_with_class_colours_and_a_conflict_mark(live):
    from playwright.sync_api import expect

    page, lab = live.page, live.lab
    _replicated(live)
    view = live.value("lab.view.to_dict()")
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    # Replicated, GPT-2-small's activations do not fit in 16 GiB: the header and the memory
    # chart say so in red, the bar against the capacity line.
    assert not view["estimate"]["feasible"]
    expect(lab.locator('.tl-figure[data-figure="peak memory"]')).to_have_class(re.compile("tl-bad"))
    live.wait_bokeh_attr("capacity", "line_color", "#C62828")
    live.wait_bokeh_attr("capacity", "location", 16.0)
    page.mouse.move(5, 5)
    shoot(page, "live_lab_replicated")
    # Pin batch to data and seq to model with clicks: the graph takes their colours.
    for name, label in (("batch", "data"), ("seq", "model")):
        row = lab.locator(f'.tl-decision[data-name="{name}"]')
        row.locator(f'.tl-choice[data-label="{label}"]').click()
        expect(row.locator(".tl-axes")).to_have_text(label)
    view = live.value("lab.view.to_dict()")
    assert view["estimate"]["feasible"]  # batch over data: it fits now, and the chart says so
    live.wait_bokeh_attr("capacity", "line_color", "#222222")
    colour = {c["id"]: c["color"].lower() for c in view["classes"]}
    batch = next(c["id"] for c in view["classes"] if c["name"] == "batch")
    page.wait_for_function(
        "c => [...document.querySelectorAll('.tl-widget .tl-svg g.edge path')]"
        ".some(p => (p.getAttribute('stroke') || '').toLowerCase() === c)", arg=colour[batch])
    strokes = lab.locator(".tl-svg g.edge").evaluate_all(
        "gs => gs.map(g => [g.dataset.edge, [...g.querySelectorAll('path')].map(p => p.getAttribute('stroke'))])")
    sharded = {e["id"]: e["sharded"] for e in view["graph"]["edges"]}
    coloured = [(eid, s) for eid, s in strokes if sharded.get(eid)]
    assert len(coloured) >= 5, strokes
    for eid, paths in coloured:  # a sharded edge is drawn in its classes' colours
        assert {p.lower() for p in paths if p} & {colour[c] for c in sharded[eid]}, (eid, paths)
    # The conflict of seq at the attention logits: a marked node naming its resolution.
    conflict = view["conflicts"][0]
    assert conflict["active"]
    marked = lab.locator(".tl-svg g.node.tl-conflict-site")
    expect(marked.first).to_be_visible()
    words = conflict["labels"][conflict["resolutions"].index(conflict["resolution"])]
    expect(marked.first).to_contain_text(f"⚠ seq: {words}")  # what the resolution keeps
    expect(marked.first.locator("polygon").first).to_have_attribute("stroke", re.compile("#b3261e", re.I))
    page.mouse.move(5, 5)
    shoot(page, "live_lab", live_output(page))
    assert not live.errors, live.errors


def test_a_group_expands_and_collapses(live):
    from playwright.sync_api import expect

    lab = live.lab
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()  # the whole graph in view
    attn = lab.locator('g.node[id="group.block*/attn"]')
    expect(attn).to_be_visible()
    before = lab.locator(".tl-svg g.node").count()
    attn.click()
    cluster = lab.locator('g.cluster[id="cluster:block*/attn"]')
    expect(cluster).to_be_visible()
    expect(lab.locator('.tl-svg g.node[id^="op."]').first).to_be_visible()
    assert lab.locator(".tl-svg g.node").count() > before
    assert "block*/attn" in live.value("sorted(lab.expanded)")
    live.page.mouse.move(5, 5)
    shoot(live.page, "live_lab_expanded", lab)
    cluster.locator("> text").first.click()  # a click on the open group's frame closes it
    expect(attn).to_be_visible()
    expect(cluster).to_have_count(0)


def test_pinning_a_class_changes_the_shown_estimate(live):
    from playwright.sync_api import expect

    page, lab = live.page, live.lab
    _replicated(live)
    expect(lab.locator(".tl-decision.tl-pinned")).to_have_count(0)
    before = live.step_text()
    memory_before = live.bokeh("toast-lab-memory")
    row = lab.locator('.tl-decision[data-name="mlp"]')
    choice = row.locator('.tl-choice[data-label="model"]')
    priced = choice.locator(".tl-choice-cost").inner_text()
    choice.click()
    expect(row.locator(".tl-axes")).to_have_text("model")
    expect(row.locator(".tl-lock")).to_contain_text("pinned")
    est = live.value("lab.estimate.to_dict()")
    shown = live.step_text()
    assert shown != before, (before, shown)
    assert shown.split()[0] in priced  # the price the choice showed is what the pin gave
    # The memory chart follows the pin too (mlp's weights split over model).
    deadline = time.monotonic() + 5
    while live.bokeh("toast-lab-memory") == memory_before and time.monotonic() < deadline:
        time.sleep(0.05)
    memory = live.bokeh("toast-lab-memory")
    assert memory != memory_before
    total = sum(v[0] for k, v in memory.items() if k != "y")
    assert total * 2**30 == pytest.approx(est["peak_memory_bytes"], rel=1e-6)
    shoot(page, "live_lab_pinned", lab)
    # The Estimate tab: time per mesh axis, memory against capacity, the experts as rows.
    lab.locator('.tl-tab[data-tab="estimate"]').click()
    panel = lab.locator(".tl-estimate")
    for axis in live.value("list(lab.view.estimate['communication_by_axis'])"):
        expect(panel.locator('.tl-bar[data-bar="time"] + .tl-bar-legend')).to_contain_text(f"comm {axis}")
    expect(panel.locator('.tl-bar[data-bar="memory"] .tl-capacity')).to_have_count(1)
    experts = live.value("[e.name for e in lab.view.experts]")
    assert experts
    for name in experts:
        expect(panel.locator(f'tr[data-expert="{name}"]')).to_have_count(1)
    expect(panel.locator("tr.tl-current-row")).to_contain_text("current")
    shoot(page, "live_lab_estimate", lab)
    lab.locator('.tl-tab[data-tab="decisions"]').click()


def test_a_search_runs_shows_progress_lets_another_cell_run_and_stops(live):
    from playwright.sync_api import expect

    page, lab = live.page, live.lab
    _replicated(live)
    replicated_step = live.step_text()
    lab.locator(".tl-budget").fill("120")
    lab.locator(".tl-search").click()
    progress = lab.locator(".tl-progress")
    expect(progress).to_have_attribute("data-running", "true")
    expect(lab.locator(".tl-stop")).to_be_enabled()
    # Progress: simulations counted in the header, the best plan drawn, the chart growing.
    page.wait_for_function(
        f"() => (({BOKEH_SOURCE})('toast-lab-progress')?.best_ms?.length ?? 0) >= 2", timeout=30_000)
    expect(progress).to_contain_text(re.compile(r"searching · [\d,]+ sims"))
    # The best plan so far is drawn while the search runs: the graph takes its colours.
    page.wait_for_function("() => [...document.querySelectorAll('.tl-widget .tl-svg g.edge path')]"
                           ".some(p => !['#9aa0a6', 'black', '', 'none'].includes((p.getAttribute('stroke') || '').toLowerCase()))")
    assert progress.get_attribute("data-running") == "true"
    assert live.step_text() != replicated_step  # ... and its estimate is the one shown
    # The kernel answers another cell while the search runs.
    run_new_cell(page, "print('kernel answers while searching:', lab.session.running)")
    out = page.locator(".jp-Cell").last.locator(".jp-OutputArea-output")
    expect(out).to_contain_text("kernel answers while searching: True", timeout=20_000)
    page.mouse.move(5, 5)
    shoot(page, "live_lab_searching", live_output(page))
    # Stop: the search ends, the best plan stays. Timed in the page, from the click event to
    # the header saying the search ended (a round trip to the kernel, which stops the search
    # thread and sends the final view).
    page.evaluate(STOP_TIMER)
    lab.locator(".tl-stop").click()
    expect(progress).to_have_attribute("data-running", "false", timeout=5_000)
    page.wait_for_function("window.tlStopSeenMs !== undefined")
    seen_ms = page.evaluate("window.tlStopSeenMs")
    state = live.value("{'running': lab.session.running, 'sims': lab.session.search_state.simulations,"
                       " 'best': lab.session.search_state.best_step_time_s,"
                       " 'step': lab.estimate.step_time_s}")
    assert not state["running"] and state["sims"] > 0
    assert state["step"] == pytest.approx(state["best"])
    expect(progress).to_contain_text("searched")
    print(f"Stop click -> the page shows the search ended: {seen_ms:.0f} ms")
    assert seen_ms < 1000
    shoot(page, "live_lab_searched", live_output(page))


def test_a_crash_in_a_callback_is_shown_and_the_widget_still_works(live):
    from playwright.sync_api import expect

    page, lab = live.page, live.lab
    _replicated(live)
    banner = lab.locator(".tl-error")
    # A pin event without its name (a front end of another version, say).
    send_to_widget(page, live.model_id, {"event": "pin", "value": ["data"]})
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("pin")
    expect(banner).to_contain_text("name")
    shoot(page, "live_lab_crash", lab)
    # Export to a folder that does not exist: the kernel's OSError, said readably.
    lab.locator('.tl-tab[data-tab="export"]').click()
    lab.locator(".tl-path").fill("no/such/folder/plan.json")
    lab.locator(".tl-export button.tl-primary").click()
    expect(banner).to_contain_text("no/such/folder")
    # Still usable: a pin goes through and clears the message.
    lab.locator('.tl-tab[data-tab="decisions"]').click()
    row = lab.locator('.tl-decision[data-name="batch"]')
    row.locator('.tl-choice[data-label="data"]').click()
    expect(row.locator(".tl-axes")).to_have_text("data")
    expect(banner).to_be_hidden()


def test_export_writes_a_plan_file_that_loads_as_the_same_plan(live):
    from playwright.sync_api import expect

    page, lab = live.page, live.lab
    live.kernel("lab.pin('batch', 'data'); lab.pin('mlp', 'model')")
    lab.locator('.tl-tab[data-tab="export"]').click()
    lab.locator(".tl-path").fill("live_export.plan.json")
    lab.locator(".tl-export button.tl-primary").click()
    expect(lab.locator(".tl-notice")).to_contain_text("wrote live_export.plan.json")
    assert live.value("tl.Plan.load('live_export.plan.json', lab.analysis) == lab.plan") is True
    doc = json.loads((live.server.root / "live_export.plan.json").read_text())
    assert doc["view"]["format"] == "toast-lab-view"
    assert doc["classes"]  # the plan itself, as Plan.save writes it
    shoot(page, "live_lab_exported", lab)
