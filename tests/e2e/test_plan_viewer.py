"""Saved plans opened in JupyterLab with no kernel: the same graph view, read-only.

Plan files written by `plan.save`, `lab.export` and `toast-lab partition --out` open by
double-click, their memory chart's peak showing its op; a format-1 file opens as its tables;
a notebook's plan and diff outputs survive saving, closing and reopening where no kernel can
start.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest

from toast_lab.plan._planfile import VERSION as PLAN_VERSION

from .conftest import REPO, shoot, write_json
from .layout import MEMORY_CHART, bytes_text, clipped
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
    # A view saved before the memory chart existed says so, rather than drawing nothing.
    lab.locator('.tl-tab[data-tab="memory"]').click()
    expect(lab.locator(".tl-memory-unavailable")).to_contain_text(
        "written before the Lab drew one")
    assert not page.toast_errors, page.toast_errors


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


# --- plan files written by toast-lab itself ------------------------------------------------------

GPT = {"size": "gpt2-small", "layers": 4}
MESH = {"data": 4, "model": 2}


@pytest.fixture(scope="module")
def written_plans(lab_server):
    """{source: path} of plan files written the three ways a user writes them, and a file of
    the previous format (tests/data, written by the format-1 writer)."""
    import toast_lab as tl
    from toast_lab.cli import main
    from toast_lab.lab import Lab

    root = lab_server.root
    fn, args = tl.zoo.get("gpt", **GPT)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh(MESH, device="h100")
    found = tl.search(an, mesh, pins={"batch": ("data",)}, simulations=300, seed=0)
    found.plan.save(root / "search_plan.json")  # the plan remembers the mesh it was found for
    lab = Lab.from_analysis(an, mesh, widget=False)
    lab.pin("batch", "data")
    lab.pin("mlp", "model")
    lab.export(root / "lab_plan.json")
    assert main(["partition", "gpt", "-c", "size=gpt2-small", "-c", "layers=4", "--mesh",
                 "data=4,model=2", "--device", "h100", "--budget", "2", "--pin", "batch=data", "--out",
                 str(root / "partition_plan.json")]) == 0
    shutil.copy(REPO / "tests" / "data" / "plan_v1_gpt_tiny.json", root / "old_plan.json")
    return {"save": root / "search_plan.json", "export": root / "lab_plan.json",
            "partition": root / "partition_plan.json", "v1": root / "old_plan.json"}


def api(server, path: str):
    with urllib.request.urlopen(f"{server.url}api/{path}?token={server.token}", timeout=10) as r:
        return json.loads(r.read())


def kernels_and_sessions(server) -> tuple[set, set]:
    """Ids of the server's kernels and the paths of its sessions (other tests' kernels may run
    on the shared server: a test compares before and after)."""
    return ({k["id"] for k in api(server, "kernels")},
            {s.get("path") for s in api(server, "sessions")})


def open_by_double_click(page, server, name: str):
    """The file browser at the root, then a double-click on `name`, as a person opens it."""
    page.goto(server.page_url("lab"))
    item = page.locator(".jp-DirListing-itemText").get_by_text(name, exact=True)
    item.dblclick(timeout=60_000)


def seconds(s: float) -> str:
    """format.ts's seconds(): three significant digits in ns, µs, ms or s."""
    a = abs(s)
    value, unit = ((s * 1e9, "ns") if a < 1e-6 else (s * 1e6, "µs") if a < 1e-3 else
                   (s * 1e3, "ms") if a < 1 else (s, "s"))
    return f"{format(value, '#.3g').rstrip('.')} {unit}"


@pytest.mark.parametrize("source", ["save", "export", "partition"])
def test_written_plan_file_opens_by_double_click_without_a_kernel(
        lab_server, page, written_plans, source):
    from playwright.sync_api import expect

    path = written_plans[source]
    doc = json.loads(path.read_text())
    view = doc["view"]
    assert doc["version"] == PLAN_VERSION and view["format"] == "toast-lab-view"
    before = kernels_and_sessions(lab_server)
    open_by_double_click(page, lab_server, path.name)
    lab = page.locator(".jp-MimeDocument .tl-lab")
    expect(lab).to_be_visible(timeout=60_000)
    expect(lab).to_have_class("tl-lab tl-readonly")
    # The graph: every node laid out and coloured by the plan.
    expect(lab.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]))
    batch = next(c for c in view["classes"] if c["name"] == "batch")
    assert batch["axes"] == ["data"]
    drawn = [n for n in view["graph"]["nodes"] if n.get("sharded") and not n["conflicts"]]
    assert drawn, "some node computes on sharded tensors"
    for n in drawn[:3]:  # drawn in the colour of the class the plan shards there
        colour = view["classes"][n["sharded"][0]]["color"].lower()
        assert colour in lab.locator(f'.tl-svg g.node[id="{n["id"]}"]').inner_html().lower()
    # Decisions: every class with the plan's axes; read-only.
    expect(lab.locator(".tl-decision[data-class]")).to_have_count(len(view["classes"]))
    for name, axes in doc["classes"].items():  # a class on no axis reads "replicated"
        expect(lab.locator(f'.tl-decision[data-name="{name}"] .tl-axes')).to_have_text(
            "×".join(axes) or "replicated")
    assert lab.locator(".tl-choice:not([disabled])").count() == 0
    # The estimate in the header, and the experts beside it.
    expect(lab.locator(".tl-figure-value").first).to_have_text(seconds(doc["estimate"]["step_time_s"]))
    shoot(page, f"plan_file_{source}")
    lab.locator('.tl-tab[data-tab="estimate"]').click()
    expect(lab.locator(".tl-experts tr[data-expert]")).to_have_count(len(doc["experts"]))
    expect(lab.locator(".tl-estimate")).to_contain_text("Memory per device")
    shoot(page, f"plan_file_{source}_estimate")
    # The memory over the step, as the Lab drew it; its peak shows its op without a kernel.
    memory = view["memory"]
    assert memory["peak_bytes"] == doc["estimate"]["peak_memory_bytes"]
    lab.locator('.tl-tab[data-tab="memory"]').click()
    expect(lab.locator(".tl-memory")).to_have_attribute("data-peak-op", str(memory["peak_op"]))
    page.wait_for_function(f"() => !!({MEMORY_CHART})()", timeout=30_000)
    lab.locator(".tl-memory").scroll_into_view_if_needed()
    chart = page.evaluate(MEMORY_CHART)
    assert any(t.startswith(f"peak {bytes_text(memory['peak_bytes'])}") for t in chart["labels"])
    page.mouse.move(5, 5)
    assert not clipped(lab.locator(".tl-right")), clipped(lab.locator(".tl-right"))
    shoot(page, f"plan_file_{source}_memory")
    page.mouse.click(chart["x"], chart["y"])
    card = lab.locator(f'.tl-details[data-op="{memory["peak_op"]}"]')
    expect(card).to_be_visible()
    expect(card.locator(".tl-details-title")).to_contain_text(memory["peak_primitive"])
    expect(card).to_contain_text("the peak of the step")
    expect(card).to_contain_text(memory["peak_source"][:30])
    shoot(page, f"plan_file_{source}_memory_peak_op")
    # Nothing asked for a kernel.
    assert kernels_and_sessions(lab_server) == before and path.name not in before[1]
    assert not page.toast_errors, page.toast_errors


def test_a_plan_file_of_the_previous_format_opens_as_its_tables(lab_server, page, written_plans):
    from playwright.sync_api import expect

    doc = json.loads(written_plans["v1"].read_text())
    assert doc["version"] == 1 and "view" not in doc
    before = kernels_and_sessions(lab_server)
    open_by_double_click(page, lab_server, "old_plan.json")
    summary = page.locator(".jp-MimeDocument .tl-plan-summary")
    expect(summary).to_be_visible(timeout=60_000)
    expect(summary).to_have_attribute("data-plan-version", "1")
    expect(summary).to_contain_text("format 1")
    expect(summary.locator(".tl-summary-classes tbody tr")).to_have_count(len(doc["classes"]))
    expect(summary.locator(".tl-summary-conflicts tbody tr")).to_have_count(len(doc["conflicts"]))
    expect(summary.locator(".tl-summary-collectives tbody tr")).to_have_count(
        len(doc["estimate"]["collectives"]))
    expect(summary.locator(".tl-figure-value").first).to_have_text(
        seconds(doc["estimate"]["step_time_s"]))
    shoot(page, "plan_file_v1")
    assert kernels_and_sessions(lab_server) == before
    assert not page.toast_errors, page.toast_errors


# --- a notebook's plan and diff outputs, reopened where no kernel can start -------------------

NOTEBOOK_CELLS = [
    "import toast_lab as tl\n"
    "fn, args = tl.zoo.get('gpt', size='tiny', layers=2)\n"
    "an = tl.analyze(tl.trace(fn, *args))\n"
    "experts = tl.strategies.expert(an, tl.Mesh({'data': 4, 'model': 2}, device='h100'))\n"
    "experts['fsdp']",
    "tl.diff(experts['dp'], experts['fsdp'], names=('dp', 'fsdp'))",
    "tl.Plan.replicated(an).with_axes('batch', 'data')  # made for no mesh",
]


def _run(page, command: str, args: dict | None = None):
    return page.evaluate("([c, a]) => window.jupyterapp.commands.execute(c, a)", [command, args or {}])


def test_notebook_plan_and_diff_outputs_survive_save_close_and_reopen_without_a_kernel(
        lab_server, kernelless_lab_server, page):
    from playwright.sync_api import expect

    nb = {"nbformat": 4, "nbformat_minor": 5,
          "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                      "language": "python"}},
          "cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "execution_count": None,
                     "source": src, "outputs": []} for i, src in enumerate(NOTEBOOK_CELLS)]}
    path = write_json(lab_server.root / "plans.ipynb", nb)
    # 1. Run it in a kernel, as a person does, and save it.
    page.goto(lab_server.page_url("lab/tree/plans.ipynb"))
    expect(page.locator(".jp-Notebook")).to_be_visible(timeout=60_000)
    page.wait_for_function("() => window.jupyterapp.shell.currentWidget?.sessionContext?.session?.kernel", timeout=60_000)
    _run(page, "notebook:run-all-cells")
    outputs = page.locator(".jp-OutputArea-output")
    expect(outputs.locator(".tl-diff")).to_be_visible(timeout=240_000)
    expect(page.locator(".tl-plan-renderer > .tl-lab")).to_have_count(2, timeout=60_000)
    # (the renderer's node is the output's node: .jp-OutputArea-output.tl-plan-renderer)
    expect(page.locator(".tl-plan-renderer > .tl-lab .tl-svg g.node").first).to_be_attached(
        timeout=60_000)
    _run(page, "docmanager:save")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        saved = json.loads(path.read_text())
        if all(c["outputs"] for c in saved["cells"]):
            break
        time.sleep(0.3)
    plan_out, diff_out, bare_out = (c["outputs"][0]["data"] for c in saved["cells"])
    assert set(plan_out) == {"application/vnd.toast-lab.plan+json", "text/plain"}
    assert set(diff_out) == {"application/vnd.toast-lab.plan-diff+json", "text/plain"}
    assert "toast-lab plan for gpt_train_step" in "".join(plan_out["text/plain"])
    # 2. Close it and shut its kernel down.
    _run(page, "application:close-all")
    for k in api(lab_server, "sessions"):
        if k.get("path") != "plans.ipynb":
            continue
        k = k["kernel"]
        req = urllib.request.Request(f"{lab_server.url}api/kernels/{k['id']}?token={lab_server.token}",
                                     method="DELETE")
        urllib.request.urlopen(req, timeout=10).close()
    # 3. Reopen it on a server with no kernel at all: the outputs alone draw the plan and diff.
    server = kernelless_lab_server
    assert api(server, "kernelspecs")["kernelspecs"] == {}
    page.goto(server.page_url("lab/tree/plans.ipynb"))
    expect(page.locator(".jp-Notebook")).to_be_visible(timeout=60_000)
    dialog = page.locator(".jp-Dialog")
    try:  # JupyterLab asks which kernel to use: there is none
        dialog.get_by_role("button", name="No Kernel").click(timeout=10_000)
    except Exception:  # noqa: BLE001 - some versions open with "No Kernel" at once
        pass
    view = plan_out["application/vnd.toast-lab.plan+json"]["view"]
    plan = page.locator(".jp-OutputArea-output.tl-plan-renderer > .tl-lab").first
    expect(plan.locator(".tl-svg g.node")).to_have_count(len(view["graph"]["nodes"]), timeout=60_000)
    expect(plan.locator(".tl-decision[data-class]")).to_have_count(len(view["classes"]))
    shoot(page, "notebook_plan_output_reopened", plan)
    diff = page.locator(".jp-OutputArea-output .tl-diff")
    data = diff_out["application/vnd.toast-lab.plan-diff+json"]
    expect(diff.locator(".tl-diff-decisions tbody tr")).to_have_count(
        len(data["diff"]["classes"]) + len(data["diff"]["conflicts"]))
    expect(diff.locator(".tl-diff-collectives tbody tr")).to_have_count(len(data["diff"]["collectives"]))
    expect(diff.locator(".tl-diff-collectives")).to_contain_text("all-gather")
    for side in ("a", "b"):
        expect(diff.locator(f'.tl-diff-pane[data-side="{side}"] .tl-svg g.node')).to_have_count(
            len(data[side]["view"]["graph"]["nodes"]))
    # FSDP's all-gathers of the parameters: outlined where they happen, in both graphs.
    expect(diff.locator('.tl-diff-pane[data-side="a"] .tl-svg g.tl-diff-changed').first).to_be_attached()
    expect(diff.locator('.tl-diff-pane[data-side="b"] .tl-svg g.edge.tl-diff-changed').first).to_contain_text("all-gather")
    changed = int(diff.get_attribute("data-changed"))
    assert 0 < changed < len(data["a"]["view"]["graph"]["nodes"]) + len(data["a"]["view"]["graph"]["edges"])
    page.set_viewport_size({"width": 1500, "height": 1800})  # the whole output in one picture
    diff.scroll_into_view_if_needed()
    shoot(page, "notebook_diff_output_reopened", diff)
    # A plan made for no mesh: its graph and decisions, and a note saying why no estimate.
    bare = page.locator(".jp-OutputArea-output.tl-plan-renderer").nth(1)
    bare.scroll_into_view_if_needed()
    expect(bare.locator(".tl-plan-note")).to_contain_text("no mesh")
    expect(bare.locator(".tl-svg g.node")).to_have_count(
        len(bare_out["application/vnd.toast-lab.plan+json"]["view"]["graph"]["nodes"]))
    expect(bare.locator('.tl-decision[data-name="batch"] .tl-axes')).to_have_text("data")
    page.set_viewport_size({"width": 1500, "height": 950})
    bare.scroll_into_view_if_needed()
    shoot(page, "notebook_plan_without_mesh_reopened", bare)
    assert api(server, "kernels") == [] and api(server, "sessions") == []
    assert not page.toast_errors, page.toast_errors
