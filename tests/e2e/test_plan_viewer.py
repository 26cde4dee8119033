"""A saved plan opened in JupyterLab with no kernel: the same graph view, read-only."""

from __future__ import annotations

import json

import pytest

from .conftest import REPO, shoot, write_json
from .viewmodels import gpt_view, plan_file

pytestmark = pytest.mark.e2e


def test_plan_file_opens_in_the_graph_view_without_a_kernel(lab_server, page):
    from playwright.sync_api import expect

    view = gpt_view()
    write_json(lab_server.root / "gpt_plan.json", plan_file(view))
    page.goto(lab_server.page_url("lab/tree/gpt_plan.json"))
    lab = page.locator(".jp-MimeDocument .tl-lab")
    expect(lab).to_be_visible(timeout=60_000)
    expect(lab).to_have_class("tl-lab tl-readonly")
    # The graph: every node of the view laid out, class colours on, the conflict site marked.
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    logits = lab.locator('g.node[id="op_104"]')
    expect(logits).to_have_class("node cls-0 cls-3 cls-1 tl-kind-op tl-conflict-site")
    expect(logits).to_contain_text("keep_q")
    assert lab.locator("g.node polygon").first.get_attribute("fill")
    # Decisions: every class and the active conflict, read-only (no pin, no search, no export).
    rows = lab.locator(".tl-decision[data-class]")
    expect(rows).to_have_count(len(view["classes"]))
    expect(lab.locator('.tl-decision[data-conflict="0"] .tl-axes')).to_have_text("keep_q")
    assert lab.locator(".tl-choice:not([disabled])").count() == 0
    assert lab.locator(".tl-search").count() == 0
    expect(lab.locator(".tl-readonly-note")).to_contain_text("read-only")
    shoot(page, "plan_viewer")
    # A click on a group expands what the file carries: the scope tree.
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()  # the whole graph in view
    lab.locator('g.node[id="grp_block*/mlp"]').click()
    expect(lab.locator('.tl-tab-on')).to_have_text("Scopes")
    expect(lab.locator('.tl-scope[data-group="block*/mlp"]')).to_be_visible()
    softmax = lab.locator('.tl-scope[data-group="block*/attn/softmax"]')
    expect(softmax).to_be_visible()  # attn is open in the saved view
    lab.locator('.tl-scope[data-group="block*/attn"]').click()
    expect(softmax).to_have_count(0)
    lab.locator('.tl-scope[data-group="block*/attn"]').click()
    expect(softmax).to_be_visible()
    assert not page.toast_errors, page.toast_errors


def test_plan_without_a_view_is_shown_as_its_decisions(lab_server, page):
    from playwright.sync_api import expect

    doc = plan_file(gpt_view())
    del doc["view"]
    doc["version"] = 1
    write_json(lab_server.root / "old.toastplan.json", doc)
    page.goto(lab_server.page_url("lab/tree/old.toastplan.json"))
    summary = page.locator(".jp-MimeDocument .tl-plan-summary")
    expect(summary).to_be_visible(timeout=60_000)
    expect(summary).to_contain_text("carries no view model")
    expect(summary.locator("tr")).to_have_count(len(doc["classes"]) + len(doc["conflicts"]))


def test_plan_mime_output_renders_in_a_saved_notebook(lab_server, page):
    from playwright.sync_api import expect

    view = gpt_view()
    bundle = {"application/vnd.toast-lab.plan+json": {"plan": plan_file(view) | {"view": None},
                                                        "view": view},
              "text/plain": "<toast-lab plan for gpt_train_step>"}
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": "code", "id": "c1", "metadata": {}, "execution_count": 1,
                     "source": "lab.plan", "outputs": [
                         {"output_type": "display_data", "data": bundle, "metadata": {}}]}]}
    write_json(lab_server.root / "saved_output.ipynb", nb)
    page.goto(lab_server.page_url("lab/tree/saved_output.ipynb"))
    lab = page.locator(".jp-OutputArea-output .tl-lab")
    expect(lab).to_be_visible(timeout=60_000)
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    shoot(page, "plan_mime_output")


def test_plan_file_pattern_leaves_other_json_alone():
    """`*plan.json` and `*.toastplan.json` are plans; `explain.json` or `data.json` are not."""
    import re

    src = (REPO / "labextension" / "src" / "index.ts").read_text()
    pattern = json.loads(src.split("PLAN_FILE_PATTERN = '")[1].split("';")[0].join('""').replace("\\\\", "\\\\"))
    for name in ("plan.json", "gpt_plan.json", "gpt-plan.json", "gpt.plan.json", "x.toastplan.json"):
        assert re.search(pattern, name), name
    for name in ("explain.json", "data.json", "plan.json.bak", "planets.json"):
        assert not re.search(pattern, name), name
