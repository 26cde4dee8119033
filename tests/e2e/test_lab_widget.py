"""The Lab widget in a live notebook: the graph, events to the kernel, answers back, charts."""

from __future__ import annotations

import json

import pytest

from .conftest import REPO, shoot, write_json

pytestmark = pytest.mark.e2e

# The kernel side of the test: a LabView fed with the fixture, and a stand-in for the Lab
# session that logs every event and answers pins, toggles and selections by changing the view.
SETUP = r'''
import copy, html, json
from pathlib import Path
import ipywidgets
from IPython.display import display
from toast_lab.lab._widget import LabView, op_costs_bytes
from tests.e2e.viewmodels import gpt_view, _details

view = json.loads(Path(%(fixture)r).read_text())
w = LabView(view=view, op_costs=op_costs_bytes([1e-4 * (i %% 7) for i in range(412)], [2e-5] * 412))
log = ipywidgets.HTML()
log.add_class("e2e-events")
events = []

def answer(ev):
    events.append(ev)
    log.value = "<pre>" + html.escape("\n".join(json.dumps(e, sort_keys=True) for e in events)) + "</pre>"
    v = copy.deepcopy(w.view)
    if ev["event"] == "pin" and ev["name"].startswith("seq@"):
        v["error"] = ("cannot pin seq@block*/attn/logits to keep_k: the softmax's max and sum "
                      "would need an all-reduce over 'seq' inside a pinned region (test refusal)")
    elif ev["event"] == "pin":
        for c in v["classes"]:
            if c["name"] == ev["name"]:
                c["axes"], c["pinned"] = list(ev["value"]), True
                for ch in c["choices"]:
                    ch["current"] = ch["value"] == ev["value"]
                    if ch["current"]:
                        v["estimate"]["step_time_s"] = ch["step_time_s"]
                        v["estimate"]["peak_memory_bytes"] = ch["peak_memory_bytes"]
        v["pinned"] = sorted(set(v["pinned"]) | {ev["name"]})
        v["error"] = None
    elif ev["event"] == "unpin":
        for c in v["classes"]:
            if c["name"] == ev["name"]:
                c["pinned"] = False
        v["pinned"] = [p for p in v["pinned"] if p != ev["name"]]
    elif ev["event"] == "toggle":
        open_ = {g["id"] for g in v["groups"] if g["expanded"]} ^ {ev["group"]}
        fresh = gpt_view(frozenset(open_))
        v["groups"], v["graph"] = fresh["groups"], fresh["graph"]
    elif ev["event"] == "select" and ev["kind"] == "op":
        v["selected"], v["details"] = {"kind": "op", "id": ev["id"]}, _details()
    w.view = v

w.on_event(answer)
display(w, log)
'''

CHARTS = r'''
from toast_lab.lab._charts import SearchProgressChart, MemoryChart, load_bokehjs
hist = view["search"]["history"]
progress = SearchProgressChart(hist[:3], references={e["name"]: e["step_time_s"] for e in view["experts"][:2]})
memory = MemoryChart(view["estimate"]["memory_breakdown"], view["estimate"]["memory_capacity_bytes"])
load_bokehjs()
display(ipywidgets.VBox([progress.widget, memory.widget]))
'''

UPDATE_CHARTS = r'''
progress.update(hist)
memory.update({k: 1.6 * b for k, b in view["estimate"]["memory_breakdown"].items()},
              view["estimate"]["memory_capacity_bytes"])
'''

# Reads a chart's data source back from BokehJS in the page: what the browser really holds.
BOKEH_SOURCE = '''name => {
  for (const doc of (window.Bokeh?.documents ?? [])) {
    const m = doc.get_model_by_name(name);
    if (m) { return Object.fromEntries([...m.data.entries ? m.data.entries() : Object.entries(m.data)].map(([k, v]) => [k, Array.from(v)])); }
  }
  return null;
}'''


def _notebook(cells: list[str]) -> dict:
    return {"nbformat": 4, "nbformat_minor": 5,
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                        "language": "python"}},
            "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
                       "source": src, "outputs": []} for i, src in enumerate(cells)]}


def _kernel_execute(page, code: str) -> None:
    """Runs `code` in the notebook's kernel (the test's Python side) and waits for it."""
    page.evaluate('''async code => {
      const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
      const reply = await kernel.requestExecute({code, store_history: false}).done;
      if (reply.content.status !== "ok") { throw new Error(reply.content.evalue); }
    }''', code)


def _events(page) -> list[dict]:
    text = page.locator(".e2e-events pre").inner_text() if page.locator(".e2e-events pre").count() else ""
    return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture
def lab_notebook(lab_server, page, request):
    from playwright.sync_api import expect

    fixture = REPO / "tests" / "data" / "lab_view_gpt.json"
    name = f"{request.node.name}.ipynb"  # a notebook, so a kernel, of its own for each test
    write_json(lab_server.root / name, _notebook([SETUP % {"fixture": str(fixture)}, CHARTS]))
    page.goto(lab_server.page_url(f"lab/tree/{name}"))
    page.wait_for_function("window.jupyterapp?.shell?.currentWidget?.sessionContext?.session?.kernel")
    page.wait_for_function("window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status === 'idle'", timeout=60_000)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    widget = page.locator(".tl-widget .tl-lab")
    expect(widget.locator(".tl-svg g.node").first).to_be_visible(timeout=90_000)
    return widget


def test_widget_draws_the_graph_and_answers_events(lab_notebook, page):
    from playwright.sync_api import expect

    lab = lab_notebook
    view = json.loads((REPO / "tests" / "data" / "lab_view_gpt.json").read_text())
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    # Class colours from the view model, the conflict marked with its resolution, ×N, badges.
    strokes = lab.locator(".tl-svg g.edge").evaluate_all(
        "gs => gs.map(g => [[...g.classList].filter(c => c.startsWith('cls-')), g.querySelector('path').getAttribute('stroke')])")
    colour = {f"cls-{c['id']}": c["color"].lower() for c in view["classes"]}
    coloured = [(cls, stroke) for cls, stroke in strokes if cls]
    assert len(coloured) > 10
    assert all(stroke.lower() in {colour[c] for c in cls} for cls, stroke in coloured), coloured
    logits = lab.locator('g.node[id="op_104"]')
    expect(logits).to_have_class("node cls-0 cls-3 cls-1 tl-kind-op tl-conflict-site")
    expect(logits).to_contain_text("keep_q")
    expect(lab.locator(".tl-svg")).to_contain_text("block ×4")
    expect(lab.locator('g.edge[data-edge="op_102->op_104"]')).to_contain_text("all-gather seq")
    # Hovering a class in the legend highlights its nodes and dims the rest.
    lab.locator('.tl-legend-item[data-class="3"]').hover()
    expect(lab.locator(".tl-svg")).to_have_class("tl-svg tl-dimming")
    assert lab.locator(".tl-svg g.node.tl-hot").count() == lab.locator(".tl-svg g.node.cls-3").count() > 0
    lab.locator(".tl-program").hover()
    shoot(page, "lab_widget", lab)

    # toggle: a click on a group node asks the kernel to expand it; the answer redraws.
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()  # the whole graph in view
    lab.locator('g.node[id="grp_block*/mlp"]').click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "toggle", "group": "block*/mlp"')
    expect(lab.locator('g.node[id="op_121"]')).to_be_visible()
    # ... and a click on the expanded group's frame (a DOT cluster "cluster:<group>") collapses it.
    lab.locator('g.cluster[id="cluster:block*/mlp"] > text').click()
    expect(lab.locator('g.node[id="grp_block*/mlp"]')).to_be_visible()
    assert [e for e in _events(page) if e["event"] == "toggle"] == [
        {"event": "toggle", "group": "block*/mlp"}] * 2
    # pin: a counterfactual choice is pinned by the kernel, and the page shows the new state.
    embed = lab.locator('.tl-decision[data-name="embed"]')
    embed.locator('.tl-choice[data-label="model"]').click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "pin", "name": "embed", "value": ["model"]')
    expect(embed.locator(".tl-axes")).to_have_text("model")
    expect(embed.locator(".tl-lock")).to_contain_text("pinned")
    expect(lab.locator(".tl-figure").first).to_contain_text("38.8 ms")
    # Refused choices say why and cannot be clicked.
    refused = embed.locator('.tl-refused[data-label="data"]')
    expect(refused).to_contain_text("already shards batch")
    # unpin from the lock's release control.
    embed.locator(".tl-release").click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "unpin", "name": "embed"')
    expect(embed.locator(".tl-lock")).to_have_count(0)
    # A refusal shows in the banner, and the widget stays usable.
    lab.locator('.tl-decision[data-conflict="0"] .tl-choice[data-label="keep_k"]').click()
    banner = lab.locator(".tl-error")
    expect(banner).to_be_visible()
    expect(banner).to_contain_text("cannot pin seq@block*/attn/logits")
    shoot(page, "lab_widget_error", lab)
    banner.locator("button").click()
    expect(banner).to_be_hidden()
    # select: an op's details come back from the kernel.
    lab.locator('g.node[id="op_104"]').click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "select", "id": "104", "kind": "op"')
    details = lab.locator(".tl-details")
    expect(details).to_contain_text("dot_general")
    expect(details).to_contain_text("P('data', 'model', 'seq', None)")
    shoot(page, "lab_widget_details", lab)
    # search / stop / export go to the kernel as they are.
    lab.locator(".tl-budget").fill("12")
    lab.locator(".tl-search").click()
    expect(page.locator(".e2e-events")).to_contain_text('"budget_s": 12, "event": "search"')
    lab.locator('.tl-tab[data-tab="export"]').click()
    lab.locator(".tl-path").fill("gpt.plan.json")
    lab.locator(".tl-export button.tl-primary").click()
    expect(page.locator(".e2e-events")).to_contain_text('"event": "export", "path": "gpt.plan.json"')
    expect(lab.locator(".tl-snippet")).to_contain_text("jax.jit(train_step")
    kinds = [e["event"] for e in _events(page)]
    assert kinds == ["toggle", "toggle", "pin", "unpin", "pin", "select", "search", "export"], kinds
    assert not page.toast_errors, page.toast_errors


def test_charts_render_and_update(lab_notebook, page):
    from playwright.sync_api import expect

    charts = page.locator(".jp-OutputArea-output .bk-Column, .jp-OutputArea-output .bk-Row")
    expect(page.locator(".jp-OutputArea-output canvas").first).to_be_visible(timeout=60_000)
    page.wait_for_function(f"({BOKEH_SOURCE})('toast-lab-progress')?.best_ms?.length === 3")
    assert charts.count() >= 1
    first = page.evaluate(f"({BOKEH_SOURCE})('toast-lab-memory')")
    assert first and first["parameters"] == [0.5]
    shoot(page, "charts_before", page.locator(".jp-OutputArea-output:has(canvas)").last)
    _kernel_execute(page, UPDATE_CHARTS)
    # The update reaches BokehJS as a document patch (no re-render of the widget).
    page.wait_for_function(f"({BOKEH_SOURCE})('toast-lab-progress')?.best_ms?.length === 20")
    memory = page.evaluate(f"({BOKEH_SOURCE})('toast-lab-memory')")
    assert abs(memory["parameters"][0] - 0.8) < 1e-9
    shoot(page, "charts_after", page.locator(".jp-OutputArea-output:has(canvas)").last)
