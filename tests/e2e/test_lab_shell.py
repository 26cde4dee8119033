"""The Lab's shell at 1280 x 800, JupyterLab's file browser open, as a newcomer first sees it:
the cell says what it does while the Lab builds, the page loads BokehJS once (no output embeds
it, so the saved notebook stays small), nothing is cut off, the graph fits its pane with edge
labels readable, and the plan viewer opens whole.

One notebook (one kernel) for the module, on the zoo's GPT at GPT-2-small width, 2 layers.
"""

from __future__ import annotations

import json
import re

import pytest

from .conftest import shoot
from .layout import clipped, graph_fit
from .notebooks import (WATCH_OUTPUTS, kernel_execute, kernel_json, open_notebook,
                        save_notebook, watched_page)

pytestmark = pytest.mark.e2e

NOTEBOOK = "shell_lab.ipynb"
LAB_CELL = '''\
import toast_lab as tl

fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e"))
lab'''
TABS = ("decisions", "estimate", "scopes", "details", "export")
MAX_NOTEBOOK_BYTES = 1_000_000
MIN_EDGE_LABEL_PX = 11
MIN_FIT_SCALE = 0.8  # graph.ts: below it a graph opens as wide as its pane, from the top


@pytest.fixture(scope="module")
def shell(lab_server, browser_context):
    from playwright.sync_api import expect

    page = watched_page(browser_context, 1280, 800, console_words=("toast", "bokeh"))
    open_notebook(lab_server, page, NOTEBOOK, [LAB_CELL], run=False)
    page.evaluate(WATCH_OUTPUTS)
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=300_000)
    expect(page.locator(".tl-charts canvas").first).to_be_visible(timeout=60_000)
    page.wait_for_function("!document.querySelector('.tl-widget .tl-building:not([hidden])')",
                           timeout=60_000)
    yield page
    page.close()


def _lab(page):
    return page.locator(".tl-widget .tl-lab")


def _set_plan(page, name: str) -> None:
    """Makes expert plan `name` current and waits for its graph to be drawn."""
    lab = _lab(page)
    count = int(lab.locator(".tl-graph").get_attribute("data-render-count") or 0)
    before = kernel_json(page, "lab.view.graph.dot")
    kernel_execute(page, "from toast_lab.strategies import expert\n"
                         f"lab.set_plan(expert(lab.analysis, lab.mesh)[{name!r}])")
    if kernel_json(page, "lab.view.graph.dot") != before:  # else nothing to draw again
        page.wait_for_function(
            "n => Number(document.querySelector('.tl-widget .tl-graph').dataset.renderCount) > n",
            arg=count)


def test_the_cell_shows_progress_before_the_widget(shell):
    seen = shell.evaluate("window.tlSeen")
    assert seen["progressMs"] < seen["widgetMs"], seen
    texts = seen["texts"]
    # the stages as they start, each line replaced by its time once done
    assert any("⋯ tracing the step" in t for t in texts), texts
    assert any("✓ tracing the step" in t and "ops" in t for t in texts), texts
    assert any("⋯ estimating the expert plans" in t or "✓ estimating the expert plans" in t
               for t in texts), texts
    assert any("✓ pricing the choices and drawing the first view" in t for t in texts), texts
    # built: one line of totals, there before the widget
    assert seen["progressAtWidget"].startswith("toast-lab · Lab built in "), seen
    final = shell.locator("[data-toast-lab-progress]")
    assert re.fullmatch(r"toast-lab · Lab built in [0-9.]+ s: trace .* first view [0-9.]+ s",
                        final.inner_text().strip()), final.inner_text()
    # the widget's own line while it finished: the first layout, then the charts
    assert any("laying out the graph" in b or "preparing the charts" in b
               for b in seen["building"]), seen["building"]
    assert not shell.errors, shell.errors


def test_bokehjs_comes_from_the_extension_and_the_saved_notebook_is_small(shell, lab_server):
    import bokeh

    loaded = shell.evaluate("() => ({version: window.Bokeh?.version,"
                            " scripts: document.querySelectorAll('script[data-toast-lab]').length})")
    assert loaded == {"version": bokeh.__version__, "scripts": 1}
    size = save_notebook(shell, lab_server, NOTEBOOK)
    saved = (lab_server.root / NOTEBOOK).read_text()
    nb = json.loads(saved)
    mimes = {m for out in nb["cells"][0]["outputs"] for m in out.get("data", {})}
    assert "application/vnd.jupyter.widget-view+json" in mimes
    assert not {"application/vnd.bokehjs_load.v0+json", "application/javascript"} & mimes
    assert "Bokeh.set_log_level" not in saved
    print(f"saved notebook with the Lab: {size / 1e3:.1f} kB")
    assert size < MAX_NOTEBOOK_BYTES, f"{size} bytes"


def test_nothing_is_clipped_and_the_graph_fits_at_1280x800(shell):
    lab = _lab(shell)
    _set_plan(shell, "fsdp")  # collectives on edges
    shell.mouse.move(5, 5)
    fit = graph_fit(lab)
    assert lab.locator(".tl-graph").get_attribute("data-framing") == "whole"
    assert fit["outside"] == [] and fit["covered"] == [], fit
    assert fit["scale"] >= MIN_FIT_SCALE and fit["nodeTextPx"] >= 11 * MIN_FIT_SCALE, fit
    assert fit["labels"], "fsdp pays collectives on some edges"
    small = [x for x in fit["labels"] if x["px"] < MIN_EDGE_LABEL_PX - 0.01]
    assert not small, small
    lab.locator(".tl-graph").scroll_into_view_if_needed()
    shoot(shell, "shell_graph_fsdp")
    for tab in TABS:
        lab.locator(f'.tl-tab[data-tab="{tab}"]').click()
        assert clipped(lab) == [], tab
    lab.locator(".tl-tab-body").scroll_into_view_if_needed()
    shoot(shell, "shell_export")
    lab.locator('.tl-tab[data-tab="decisions"]').click()
    assert clipped(lab) == []
    lab.locator(".tl-tab-body").scroll_into_view_if_needed()
    shoot(shell, "shell_decisions")
    lab.locator(".tl-header").scroll_into_view_if_needed()
    shoot(shell, "shell_header")


def test_opening_a_group_fits_the_graph_again(shell):
    lab = _lab(shell)
    graph = lab.locator(".tl-graph")
    count = int(graph.get_attribute("data-render-count"))
    lab.locator('g.node[id="group.optimizer"]').click()
    shell.wait_for_function(
        "n => Number(document.querySelector('.tl-widget .tl-graph').dataset.renderCount) > n",
        arg=count)
    fit = graph_fit(lab)
    framing = graph.get_attribute("data-framing")
    if framing == "whole":  # the whole graph readable: all of it in view
        assert fit["outside"] == [] and fit["covered"] == [], fit
    else:  # too large to read whole: the opened group's top in view, readably
        assert framing == "group" and fit["scale"] >= MIN_FIT_SCALE, (framing, fit)
        pane = lab.locator(".tl-graph-viewport").bounding_box()
        group = lab.locator('g.cluster[id="cluster:optimizer"]').bounding_box()
        assert pane["x"] <= group["x"] and group["x"] + group["width"] <= pane["x"] + pane["width"]
        assert pane["y"] <= group["y"] < pane["y"] + pane["height"]
    assert all(x["px"] >= MIN_EDGE_LABEL_PX - 0.01 for x in fit["labels"]), fit["labels"]
    shell.mouse.move(5, 5)
    graph.scroll_into_view_if_needed()
    shoot(shell, "shell_group_opened")
    lab.locator('g.cluster[id="cluster:optimizer"] > text').first.click()  # closes it
    shell.wait_for_function(
        "n => Number(document.querySelector('.tl-widget .tl-graph').dataset.renderCount) > n",
        arg=count + 1)
    fit = graph_fit(lab)
    assert fit["outside"] == [] and fit["covered"] == [], fit


def test_the_plan_viewer_opens_whole(shell, lab_server, browser_context):
    from playwright.sync_api import expect

    _set_plan(shell, "fsdp")
    kernel_execute(shell, "lab.export('shell_plan.json')")
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        page.goto(lab_server.page_url("lab/tree/shell_plan.json"))
        lab = page.locator(".jp-MimeDocument .tl-lab")
        expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=60_000)
        page.mouse.move(5, 5)
        fit = graph_fit(lab)
        assert fit["outside"] == [] and fit["covered"] == [], fit
        assert fit["labels"] and min(x["px"] for x in fit["labels"]) >= MIN_EDGE_LABEL_PX - 0.01
        shoot(page, "shell_plan_viewer")
        for tab in TABS:
            lab.locator(f'.tl-tab[data-tab="{tab}"]').click()
            assert clipped(page.locator(".jp-MimeDocument")) == [], tab
    finally:
        page.close()
