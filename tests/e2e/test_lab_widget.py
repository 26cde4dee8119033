"""The Lab widget's front end against a stand-in kernel: a LabView fed with the real Lab's view
model (tests/data/lab_view_gpt.json, made by make_view_fixture.py) and a stand-in for the
session that logs every event and answers with the Lab's own answers (the fixture's answers
file) or with plain edits of the view. It pins down the event protocol and the drawing of a
view model exactly; tests/e2e/test_lab_live.py drives the real Lab.
"""

from __future__ import annotations

import json

import pytest

from .conftest import REPO, shoot
from .notebooks import BOKEH_SOURCE, kernel_execute, open_notebook

pytestmark = pytest.mark.e2e

FIXTURE = REPO / "tests" / "data" / "lab_view_gpt.json"
ANSWERS = REPO / "tests" / "data" / "lab_view_gpt_answers.json"
REFUSAL = "cannot pin seq to data×model: the stand-in kernel refuses it (test refusal)"

# The kernel side of the test.
SETUP = r'''
import copy, html, json
from pathlib import Path
import ipywidgets
from IPython.display import display
from toast_lab.lab._widget import LabView, op_costs_bytes

view = json.loads(Path(%(fixture)r).read_text())
answers = json.loads(Path(%(answers)r).read_text())
ops = view["program"]["ops"]
w = LabView(view=view, op_costs=op_costs_bytes([1e-4 * (i %% 7) for i in range(ops)], [2e-5] * ops))
log = ipywidgets.HTML()
log.add_class("e2e-events")
events = []

def answer(ev):
    events.append(ev)
    log.value = "<pre>" + html.escape("\n".join(json.dumps(e, sort_keys=True) for e in events)) + "</pre>"
    v = copy.deepcopy(w.view)
    if ev["event"] == "pin" and ev["name"] == "seq" and ev["value"] == ["data", "model"]:
        v["error"] = %(refusal)r
    elif ev["event"] == "pin":
        for c in v["classes"]:
            if c["name"] == ev["name"]:
                c["axes"], c["pinned"] = list(ev["value"]), True
                for ch in c["choices"]:
                    ch["current"] = ch["value"] == ev["value"]
                    if ch["current"]:
                        v["estimate"]["step_time_s"] = ch["step_time_s"]
                        v["estimate"]["peak_memory_bytes"] = ch["peak_memory_bytes"]
        # an estimate that overlaps communication with compute says how much stays exposed
        v["estimate"]["exposed_communication_s"] = 0.25 * v["estimate"]["communication_s"]
        v["pinned"] = sorted(set(v["pinned"]) | {ev["name"]})
        v["error"] = None
    elif ev["event"] == "unpin":
        for c in v["classes"]:
            if c["name"] == ev["name"]:
                c["pinned"] = False
        v["pinned"] = [p for p in v["pinned"] if p != ev["name"]]
    elif ev["event"] == "toggle":
        fresh = answers["toggle"].get(ev["group"])
        opened = any(g["id"] == ev["group"] and g["expanded"] for g in v["groups"])
        source = view if opened or fresh is None else fresh  # closing it: the first view
        v["groups"], v["graph"] = source["groups"], source["graph"]
    elif ev["event"] == "select" and ev["kind"] == "op":
        v["selected"], v["details"] = {"kind": "op", "id": ev["id"]}, answers["select"][ev["id"]]
    elif ev["event"] == "export":
        v["notice"] = "wrote " + ev["path"]
    w.view = v

w.on_event(answer)
display(w, log)
'''

CHARTS = r'''
from toast_lab.lab._charts import SearchProgressChart, MemoryChart
hist = view["search"]["history"]
progress = SearchProgressChart(hist[:1], references={e["name"]: e["step_time_s"] for e in view["experts"][:2]})
memory = MemoryChart(view["estimate"]["memory_breakdown"], view["estimate"]["memory_capacity_bytes"])
display(ipywidgets.VBox([progress.widget, memory.widget]))
'''

UPDATE_CHARTS = r'''
progress.update(hist)
memory.update({k: 1.6 * b for k, b in view["estimate"]["memory_breakdown"].items()},
              view["estimate"]["memory_capacity_bytes"])
'''



def _events(page) -> list[dict]:
    text = page.locator(".e2e-events pre").inner_text() if page.locator(".e2e-events pre").count() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def lab_notebook(lab_server, page, request):
    from playwright.sync_api import expect

    setup = SETUP % {"fixture": str(FIXTURE), "answers": str(ANSWERS), "refusal": REFUSAL}
    # a notebook, so a kernel, of its own for each test
    open_notebook(lab_server, page, f"{request.node.name}.ipynb", [setup, CHARTS])
    widget = page.locator(".tl-widget .tl-lab")
    expect(widget.locator(".tl-svg g.node").first).to_be_visible(timeout=90_000)
    return widget


def test_widget_draws_the_graph_and_answers_events(lab_notebook, page):
    from playwright.sync_api import expect

    lab = lab_notebook
    view = json.loads(FIXTURE.read_text())
    answers = json.loads(ANSWERS.read_text())
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    # Class colours from the view model: each sharded edge in its classes' colours.
    strokes = lab.locator(".tl-svg g.edge").evaluate_all(
        "gs => gs.map(g => [g.dataset.edge, [...g.querySelectorAll('path')].map(p => p.getAttribute('stroke'))])")
    colour = {c["id"]: c["color"].lower() for c in view["classes"]}
    sharded = {e["id"]: e["sharded"] for e in view["graph"]["edges"]}
    coloured = [(eid, paths) for eid, paths in strokes if sharded.get(eid)]
    assert len(coloured) > 10
    for eid, paths in coloured:
        assert {p.lower() for p in paths if p} & {colour[c] for c in sharded[eid]}, (eid, paths)
    # The conflict marked with its resolution, the repeated layers' ×N, collective badges.
    conflict = view["conflicts"][0]
    site = next(n for n in view["graph"]["nodes"] if n["conflicts"])
    node = lab.locator(f'g.node[id="{site["id"]}"]')
    expect(node).to_have_class(f"node {' '.join(f'cls-{c}' for c in site['classes'])} "
                               f"tl-kind-{site['kind']} tl-conflict-site")
    words = conflict["labels"][conflict["resolutions"].index(conflict["resolution"])]
    expect(node).to_contain_text(f"⚠ {conflict['class_name']}: {words}")  # what it keeps
    expect(lab.locator(".tl-svg")).to_contain_text("block* ×2")
    badged = next(e for e in view["graph"]["edges"] if e["badge"])
    expect(lab.locator(f'g.edge[data-edge="{badged["id"]}"]')).to_contain_text(badged["badge"])
    # Hovering a class in the legend highlights its nodes and dims the rest.
    batch = next(c for c in view["classes"] if c["name"] == "batch")
    lab.locator(f'.tl-legend-item[data-class="{batch["id"]}"]').hover()
    expect(lab.locator(".tl-svg")).to_have_class("tl-svg tl-dimming")
    hot = lab.locator(".tl-svg g.node.tl-hot").count()
    assert hot == lab.locator(f".tl-svg g.node.cls-{batch['id']}").count() > 0
    lab.locator(".tl-program").hover()
    shoot(page, "lab_widget", lab)

    # toggle: a click on a group node asks the kernel to open it; the answer redraws.
    (group, opened), = answers["toggle"].items()
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()  # the whole graph in view
    lab.locator(f'g.node[id="group.{group}"]').click()
    expect(page.locator(".e2e-events")).to_contain_text(f'"event": "toggle", "group": "{group}"')
    (op_id, details), = answers["select"].items()
    op_node = lab.locator(f'g.node[id="op.{op_id}"]')
    expect(op_node).to_be_visible()
    expect(lab.locator(f'g.cluster[id="cluster:{group}"]')).to_be_visible()
    # select: an op's details come back from the kernel.
    op_node.click()
    expect(page.locator(".e2e-events")).to_contain_text(f'"event": "select", "id": "{op_id}", "kind": "op"')
    panel = lab.locator(".tl-details")
    expect(panel).to_contain_text(details["primitive"])
    expect(panel).to_contain_text(details["results"][0]["spec"])
    shoot(page, "lab_widget_details", lab)
    # ... and a click on the open group's frame (a DOT cluster "cluster:<group>") closes it.
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()
    lab.locator(f'g.cluster[id="cluster:{group}"] > text').first.click()
    expect(lab.locator(f'g.node[id="group.{group}"]')).to_be_visible()
    assert [e for e in _events(page) if e["event"] == "toggle"] == [
        {"event": "toggle", "group": group}] * 2

    # pin: a counterfactual choice is pinned by the kernel, and the page shows the new state.
    lab.locator('.tl-tab[data-tab="decisions"]').click()
    mlp = lab.locator('.tl-decision[data-name="mlp"]')
    choice = mlp.locator('.tl-choice[data-label="model"]')
    priced = choice.locator(".tl-choice-cost").inner_text()
    choice.click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "pin", "name": "mlp", "value": ["model"]')
    expect(mlp.locator(".tl-axes")).to_have_text("model")
    expect(mlp.locator(".tl-lock")).to_contain_text("pinned")
    step = lab.locator('.tl-figure[data-figure="step time"] .tl-figure-value').inner_text()
    assert step.split()[0] in priced, (step, priced)
    split = lab.locator('.tl-figure[data-figure="step time"] .tl-figure-split')
    for axis, seconds in view["estimate"]["communication_by_axis"].items():
        if seconds > 0:
            expect(split).to_contain_text(axis)
    expect(split).to_contain_text("exposed")
    # Notes say what else a choice does (first decision wins on shared tensors).
    noted = next((c, ch) for c in view["classes"] for ch in c["choices"] if ch.get("note"))
    note = lab.locator(f'.tl-decision[data-name="{noted[0]["name"]}"] '
                       f'.tl-choice-note[data-label="{noted[1]["label"]}"]')
    expect(note).to_have_attribute("title", noted[1]["note"])
    # unpin from the lock's release control.
    mlp.locator(".tl-release").click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "unpin", "name": "mlp"')
    expect(mlp.locator(".tl-lock")).to_have_count(0)
    # A refusal shows in the banner, and the widget stays usable.
    lab.locator('.tl-decision[data-name="seq"] .tl-choice[data-label="data×model"]').click()
    banner = lab.locator(".tl-error")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text(REFUSAL)
    shoot(page, "lab_widget_error", lab)
    banner.locator("button").click()
    expect(banner).to_be_hidden()
    # The last search's message, in the header.
    expect(lab.locator(".tl-search-message")).to_have_text(view["search"]["message"])
    # search / stop / export go to the kernel as they are.
    lab.locator(".tl-budget").fill("12")
    lab.locator(".tl-search").click()
    expect(page.locator(".e2e-events")).to_contain_text('"budget_s": 12, "event": "search"')
    lab.locator('.tl-tab[data-tab="export"]').click()
    lab.locator(".tl-path").fill("gpt.plan.json")
    lab.locator(".tl-export button.tl-primary").click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "export", "path": "gpt.plan.json"')
    expect(lab.locator(".tl-notice")).to_contain_text("wrote gpt.plan.json")
    expect(lab.locator(".tl-snippet")).to_contain_text("jax.jit(")
    kinds = [e["event"] for e in _events(page)]
    assert kinds == ["toggle", "select", "toggle", "pin", "unpin", "pin", "search", "export"], kinds
    assert not page.toast_errors, page.toast_errors


def test_charts_render_and_update(lab_notebook, page):
    from playwright.sync_api import expect

    view = json.loads(FIXTURE.read_text())
    history = len(view["search"]["history"])
    assert history >= 2  # the update adds rows
    charts = page.locator(".jp-OutputArea-output .bk-Column, .jp-OutputArea-output .bk-Row")
    expect(page.locator(".jp-OutputArea-output canvas").first).to_be_visible(timeout=60_000)
    page.wait_for_function(f"({BOKEH_SOURCE})('toast-lab-progress')?.best_ms?.length === 1")
    assert charts.count() >= 1
    first = page.evaluate(f"({BOKEH_SOURCE})('toast-lab-memory')")
    category = "parameters and optimizer state"
    expected = view["estimate"]["memory_breakdown"][category] / 2**30
    assert first and first[category][0] == pytest.approx(expected)
    shoot(page, "charts_before", page.locator(".jp-OutputArea-output:has(canvas)").last)
    kernel_execute(page, UPDATE_CHARTS)
    # The update reaches BokehJS as a document patch (no re-render of the widget).
    page.wait_for_function(f"({BOKEH_SOURCE})('toast-lab-progress')?.best_ms?.length === {history}")
    memory = page.evaluate(f"({BOKEH_SOURCE})('toast-lab-memory')")
    assert memory[category][0] == pytest.approx(1.6 * expected)
    shoot(page, "charts_after", page.locator(".jp-OutputArea-output:has(canvas)").last)
