"""What the Lab says, in a live notebook on the zoo GPT, driven in Chromium as a person would:
the first view already an answer (the best expert plan, coloured, named in the header), the
legend lighting its classes, a collective explained after a click on its edge and removed by
its choice, a conflict resolved by its worded choice (and drawn quietly while its class is
replicated), the expert plans a pin rules out, prices while a search runs, an op's tensors
over the device grid, and the memory over the step with its peak op a click away.

One notebook (one kernel) for the module; each test starts from the state it needs.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

import pytest

from .conftest import shoot
from .layout import graph_fit
from .notebooks import kernel_execute, kernel_json, open_notebook, watched_page

pytestmark = pytest.mark.e2e

# The zoo's GPT at GPT-2-small width, 2 layers, on 4 x 2 TPU v5e (16 GiB each): replicated it
# does not fit, so the Lab must open on a plan that does.
LAB_CELL = '''\
import toast_lab as tl

fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e"))
lab'''

# The strokes of the graph's edges, lower case: what the page draws.
STROKES = '''() => [...document.querySelectorAll('.tl-widget .tl-svg g.edge path')]
  .map(p => (p.getAttribute('stroke') || '').toLowerCase())'''


# Whether a legend item of a Bokeh chart in the page names the pin that rules its plan out.
RULED_OUT_IN_A_CHART = '''() => [...(window.Bokeh?.documents ?? [])].some(d =>
  [...d.all_models].some(m => String(m.label?.value ?? '').includes('ruled out by batch=data')))'''


@dataclass
class Content:
    page: object
    lab: object               # the .tl-lab locator
    errors: list = field(default_factory=list)

    def kernel(self, code: str) -> str:
        return kernel_execute(self.page, code)

    def value(self, expr: str):
        return kernel_json(self.page, expr)

    def view(self) -> dict:
        return self.value("lab.view.to_dict()")

    def settle(self) -> None:
        """Waits until the page draws the kernel's latest view."""
        want = self.value("lab.estimate.step_time_s")
        self.page.wait_for_function(
            "() => !!document.querySelector('.tl-widget .tl-lab')")
        shown = self.lab.locator('.tl-figure[data-figure="step time"] .tl-figure-value')
        deadline = time.monotonic() + 10
        while _ms(shown.inner_text()) is None or abs(_ms(shown.inner_text()) - want * 1e3) > \
                max(0.06 * want * 1e3, 0.05):
            assert time.monotonic() < deadline, (shown.inner_text(), want)
            time.sleep(0.05)


def _ms(text: str) -> float | None:
    m = re.match(r"([\d.]+)\s*(ms|s|µs)", text.strip())
    if not m:
        return None
    return float(m.group(1)) * {"ms": 1, "s": 1e3, "µs": 1e-3}[m.group(2)]


@pytest.fixture(scope="module")
def content(lab_server, browser_context):
    from playwright.sync_api import expect

    page = watched_page(browser_context, 1500, 1200, console_words=("toast",))
    open_notebook(lab_server, page, "lab_content.ipynb", [LAB_CELL])
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=180_000)
    yield Content(page, lab, page.errors)
    page.close()


def _back_to_the_start(c: Content) -> None:
    """The plan the Lab opened on, nothing pinned, the default groups open, nothing selected."""
    c.kernel("lab.stop(); lab.set_plan(lab.session.history[0].plan); lab.select(None)\n"
             "for g in sorted(set(lab.expanded) - set(lab.builder.default_expanded)):\n"
             "    lab.toggle(g)")
    c.settle()
    c.lab.locator('.tl-tab[data-tab="decisions"]').click()


def test_the_first_view_is_the_best_expert_plan_coloured_and_named(content):
    from playwright.sync_api import expect

    c, page, lab = content, content.page, content.lab
    start = c.value("{'label': lab.session.start.label, 'name': lab.session.start.name,"
                    " 'how': lab.session.start.how}")
    assert start["how"] == "expert"  # on this model an expert plan fits
    expect(lab.locator(".tl-start")).to_have_text(start["label"])
    assert start["label"].startswith(f"start: {start['name']}, ")
    view = c.view()
    fastest = min((e for e in view["experts"] if e["feasible"]), key=lambda e: e["step_time_s"])
    assert fastest["name"] == start["name"]
    # the graph is drawn in the classes' colours, not grey
    page.wait_for_function(f"() => ({STROKES})().length > 0")
    strokes = set(page.evaluate(STROKES))
    shown = {c_["color"].lower(): c_["name"] for c_ in view["classes"] if c_["legend"]}
    coloured = strokes & set(shown)
    assert len(coloured) >= 2, (strokes, shown)
    # the legend: the shown classes, each in its own colour, then the rest under one entry
    items = lab.locator('.tl-legend-item[data-legend="class"]')
    expect(items).to_have_count(len(shown))
    chips = items.locator(".tl-swatch").evaluate_all("els => els.map(e => e.style.background)")
    assert len(set(chips)) == len(chips)
    hidden = [x for x in view["classes"] if not x["legend"] and not x["minor"]]
    minor = [x for x in view["classes"] if not x["legend"] and x["minor"]]
    if hidden:
        expect(lab.locator('.tl-legend-item[data-legend="others"]')).to_contain_text(
            f"{len(hidden)} more")
    if minor:
        expect(lab.locator('.tl-legend-item[data-legend="minor"]')).to_contain_text(
            f"minor ({len(minor)})")
    page.mouse.move(5, 5)
    shoot(page, "content_first_view", lab)
    assert not c.errors, c.errors


def test_hovering_a_legend_entry_lights_its_class_across_the_graph(content):
    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    batch = c.value("lab.analysis.class_named('batch').id")
    lab.locator(f'.tl-legend-item[data-class="{batch}"]').hover()
    page.wait_for_function("() => !!document.querySelector('.tl-widget .tl-svg.tl-dimming')")
    hot = lab.locator(".tl-svg .tl-hot")
    assert hot.count() > 0
    assert all(f"cls-{batch}" in (cls or "") for cls in hot.evaluate_all(
        "els => els.map(e => e.getAttribute('class'))"))
    shoot(page, "content_legend_hover", lab)
    page.mouse.move(5, 5)
    page.wait_for_function("() => !document.querySelector('.tl-widget .tl-svg.tl-dimming')")


def test_a_collective_is_explained_after_a_click_and_removed_by_its_choice(content):
    from playwright.sync_api import expect

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    lab.locator('.tl-icon-button[title="Fit the graph"]').click()
    edges = [e for e in c.view()["graph"]["edges"] if e["badge"]]
    assert edges, "the start plan pays collectives on some edge"
    edge = edges[0]
    label = lab.locator(f'.tl-svg g.edge[data-edge="{edge["id"]}"] text').first
    expect(label).to_be_visible()
    label.click()
    panel = lab.locator('.tl-explained[data-explained="edge"]')
    expect(panel).to_be_visible(timeout=15_000)
    expect(lab.locator(f'.tl-svg g.edge[data-edge="{edge["id"]}"]')).to_have_class(
        re.compile("tl-selected"))
    explained = c.value("lab.view.to_dict()['explained']")
    assert explained["id"] == edge["id"] and explained["collectives"]
    first = explained["collectives"][0]
    card = panel.locator(".tl-collective").first
    expect(card).to_contain_text(first["label"])
    expect(card).to_contain_text("asked by")
    for name in first["classes"]:
        expect(card.locator(".tl-kv").first).to_contain_text(name)
    expect(card).to_contain_text(f"{first['primitive']} (op {first['op']})")
    expect(card.locator(".tl-source-line")).to_contain_text("_gpt.py:")
    expect(card).to_contain_text(first["why"][:40])
    page.mouse.move(5, 5)
    shoot(page, "content_collective_explained", lab)
    remedy = first["remedy"]
    assert remedy is not None
    button = card.locator(".tl-remedy-choice")
    expect(button).to_contain_text(remedy["label"])
    button.click()
    expected = remedy["value"] if isinstance(remedy["value"], str) else tuple(remedy["value"])
    deadline = time.monotonic() + 10
    while remedy["name"] not in c.value("sorted(lab.plan.pinned)"):
        assert time.monotonic() < deadline, "the remedy was not pinned"
        time.sleep(0.1)
    got = c.value(f"lab.session.pins[{remedy['name']!r}]")
    assert (got if isinstance(got, str) else tuple(got)) == expected
    # the price the choice showed is the estimate the pin gave
    assert c.value("lab.estimate.step_time_s") == pytest.approx(remedy["step_time_s"], rel=1e-9)
    assert c.value(f"[(x.kind, x.axes, x.operand) for x in "
                   f"lab.session.model.op_collectives(lab.plan).get({first['op']}, ())]") \
        .count([first["kind"], first["axes"], first["operand"]]) == 0
    assert not c.errors, c.errors


def test_a_conflict_is_quiet_while_replicated_and_resolved_by_its_worded_choice(content):
    from playwright.sync_api import expect

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    conflict = c.value("lab.view.to_dict()['conflicts'][0]")
    assert not conflict["active"]  # seq is replicated at the start: no warning drawn
    expect(lab.locator(".tl-svg g.node.tl-conflict-site")).to_have_count(0)
    expect(lab.locator(".tl-svg g.node.tl-conflict-idle").first).to_be_attached()
    assert "⚠" not in lab.locator(".tl-svg").text_content()
    c.kernel(f"lab.pin({conflict['class_name']!r}, 'model')")
    c.settle()
    row = lab.locator(f'.tl-decision.tl-conflict[data-conflict="{conflict["id"]}"]')
    expect(row.locator(".tl-axes")).to_have_text("keep the query positions")
    choice = row.locator('.tl-choice[data-label="keep the key positions"]')
    expect(choice).to_be_visible()
    priced = choice.locator(".tl-choice-cost").inner_text()
    choice.click()
    expect(row.locator(".tl-axes")).to_have_text("keep the key positions")
    assert c.value(f"lab.plan.resolution_of({conflict['name']!r})") == "keep_dim3"
    site = lab.locator(".tl-svg g.node.tl-conflict-site").first
    expect(site).to_contain_text(f"⚠ {conflict['class_name']}: keep the key positions")
    shown = lab.locator('.tl-figure[data-figure="step time"] .tl-figure-value').inner_text()
    assert shown.split()[0] in priced  # the price the choice showed is what the pin gave
    page.mouse.move(5, 5)
    # the new layout (its conflict mark larger) is framed again, nothing under the zoom buttons
    assert lab.locator(".tl-graph").get_attribute("data-framing") == "whole"
    fit = graph_fit(lab)
    assert fit["outside"] == [] and fit["covered"] == [], fit
    shoot(page, "content_conflict_resolved", lab)


def test_a_new_layout_is_framed_again_unless_the_reader_zoomed(content):
    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    graph = lab.locator(".tl-graph")

    def pin(axes: list[str]) -> None:
        count = int(graph.get_attribute("data-render-count"))
        c.kernel(f"lab.pin('seq', {axes!r})")  # its conflict's mark changes the layout
        c.settle()
        page.wait_for_function(
            "n => Number(document.querySelector('.tl-widget .tl-graph').dataset.renderCount) > n",
            arg=count)

    pin(["model"])  # a conflict mark, larger: the new layout is framed as the first was
    assert graph.get_attribute("data-framing") == "whole"
    fit = graph_fit(lab)
    assert fit["outside"] == [] and fit["covered"] == [], fit
    lab.locator('.tl-zoom-controls button[title="Zoom in"]').click()
    zoomed = graph.get_attribute("data-zoom")
    pin([])
    assert graph.get_attribute("data-zoom") == zoomed  # the reader's zoom kept


def test_the_expert_plans_a_pin_rules_out_say_so(content):
    from playwright.sync_api import expect

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    row = lab.locator('.tl-decision[data-name="batch"]')
    row.locator('.tl-choice[data-label="data"]').click()
    expect(row.locator(".tl-axes")).to_have_text("data")
    lab.locator('.tl-tab[data-tab="estimate"]').click()
    ruled = {e["name"]: e["ruled_out_by"] for e in c.view()["experts"]}
    assert ruled["fsdp"] == ["batch=data"] and not ruled["dp+tp"]
    fsdp = lab.locator('.tl-estimate tr[data-expert="fsdp"]')
    expect(fsdp).to_have_class(re.compile("tl-ruled-out"))
    expect(fsdp).to_contain_text("ruled out by batch=data")
    expect(lab.locator('.tl-estimate tr[data-expert="dp+tp"]')).not_to_have_class(
        re.compile("tl-ruled-out"))
    page.mouse.move(5, 5)
    shoot(page, "content_ruled_out", lab)
    # the progress chart's reference lines say so too
    charts = page.locator(".tl-charts")
    charts.scroll_into_view_if_needed()
    page.wait_for_function(RULED_OUT_IN_A_CHART)
    shoot(page, "content_ruled_out_chart", charts)
    lab.locator('.tl-tab[data-tab="decisions"]').click()


def test_prices_stay_on_the_choices_while_a_search_runs(content):
    from playwright.sync_api import expect

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    lab.locator(".tl-budget").fill("60")
    lab.locator(".tl-search").click()
    expect(lab.locator(".tl-progress")).to_have_attribute("data-running", "true")
    page.wait_for_function("() => /searching · [\\d,]+ sims/.test("
                           "document.querySelector('.tl-widget .tl-progress').textContent)")
    expect(lab.locator(".tl-decisions .tl-section-note").first).to_contain_text(
        "best plan so far")
    costs = lab.locator(".tl-decision .tl-choice .tl-choice-cost").all_inner_texts()
    assert costs and not any(t.strip().startswith("–") for t in costs), costs
    page.mouse.move(5, 5)
    shoot(page, "content_search_prices", lab)
    lab.locator(".tl-stop").click()
    expect(lab.locator(".tl-progress")).to_have_attribute("data-running", "false")


def test_an_ops_tensors_are_drawn_over_the_device_grid(content):
    from playwright.sync_api import expect

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    op = c.value("next(o.id for o in lab.analysis.program.ops if o.primitive == 'dot_general')")
    c.kernel(f"lab.select('op', {op})")
    grids = lab.locator(".tl-grids .tl-grid")
    expect(grids.first).to_be_visible()
    details = c.value("lab.view.to_dict()['details']")
    tensors = details["operands"] + details["results"]
    expect(grids).to_have_count(len(tensors))
    devices = 4 * 2
    for k, t in enumerate(tensors):
        cells = grids.nth(k).locator("td")
        expect(cells).to_have_count(devices)
        labels = cells.all_inner_texts()
        sharded = [axes for axes in t["dim_axes"] if axes]
        blocks = 1
        for axes in sharded:
            for a in axes:
                blocks *= {"data": 4, "model": 2}[a]
        assert len(set(labels)) == blocks, (t["spec"], labels)
    page.mouse.move(5, 5)
    shoot(page, "content_device_grid", lab)


def test_nothing_the_content_adds_is_cut_off_at_1280_by_800(content):
    from playwright.sync_api import expect

    from .layout import clipped

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        assert not clipped(lab.locator(".tl-header")), clipped(lab.locator(".tl-header"))
        assert not clipped(lab.locator(".tl-legend"))
        edge = next(e["id"] for e in c.view()["graph"]["edges"] if e["badge"])
        c.kernel(f"lab.select('edge', {edge!r})")
        expect(lab.locator(".tl-explained .tl-collective").first).to_be_visible()
        assert not clipped(lab), clipped(lab)
        lab.locator(".tl-explained").scroll_into_view_if_needed()
        shoot(page, "content_explained_1280")
        op = c.value("next(o.id for o in lab.analysis.program.ops "
                     "if o.primitive == 'dot_general')")
        c.kernel(f"lab.select('op', {op})")
        expect(lab.locator(".tl-grids .tl-grid").first).to_be_visible()
        assert not clipped(lab), clipped(lab)
        lab.locator(".tl-grids").scroll_into_view_if_needed()
        shoot(page, "content_device_grid_1280")
    finally:
        page.set_viewport_size({"width": 1500, "height": 1200})


def test_the_memory_chart_shows_the_step_and_its_peak_opens_the_op(content):
    from playwright.sync_api import expect

    from .layout import MEMORY_CHART, bytes_text, clipped

    c, page, lab = content, content.page, content.lab
    _back_to_the_start(c)
    memory = c.value("lab.view.to_dict()['memory']")
    peak_bytes = c.value("lab.estimate.peak_memory_bytes")
    capacity = c.value("lab.mesh.device.memory_bytes")
    assert memory["peak_bytes"] == peak_bytes  # the chart's peak is the estimate's
    page.set_viewport_size({"width": 1280, "height": 800})
    try:
        lab.locator('.tl-tab[data-tab="memory"]').click()
        panel = lab.locator(".tl-memory")
        expect(panel).to_have_attribute("data-peak-op", str(memory["peak_op"]))
        expect(panel.locator(".tl-big-figure")).to_contain_text(f"peak {bytes_text(peak_bytes)}")
        expect(panel.locator(".tl-memory-peak")).to_contain_text(
            f"{memory['peak_primitive']} (op {memory['peak_op']})")
        for category in memory["categories"]:
            expect(panel.locator(f'.tl-memory-legend [data-category="{category}"]')).to_be_visible()
        page.wait_for_function(f"() => !!({MEMORY_CHART})()", timeout=30_000)
        chart = page.evaluate(MEMORY_CHART)
        assert chart["areas"] == len(memory["categories"])
        assert chart["y_label"] == "GiB per device" and "order they run" in chart["x_label"]
        assert any(t.startswith(f"peak {bytes_text(peak_bytes)}\n{memory['peak_primitive']} "
                                f"(op {memory['peak_op']})") for t in chart["labels"]), chart
        assert any(t.startswith(f"capacity {bytes_text(capacity)}") for t in chart["labels"]), chart
        assert ["width", capacity / 2**30] in chart["spans"], chart  # the capacity line
        panel.scroll_into_view_if_needed()
        page.mouse.move(5, 5)
        assert not clipped(lab.locator(".tl-right")), clipped(lab.locator(".tl-right"))
        shoot(page, "content_memory_chart_1280")
        # the legend reads the bytes at the peak, or at the op under the pointer
        readout = panel.locator(".tl-memory-readout")
        expect(readout).to_have_text(f"{bytes_text(peak_bytes)} live at the peak:")
        chart = page.evaluate(MEMORY_CHART)  # where the marker is now, the panel in view
        page.mouse.move(chart["x"] - 120, chart["y"] + 40)
        page.mouse.move(chart["x"] - 100, chart["y"] + 30, steps=4)  # BokehJS reads moves
        expect(readout).not_to_contain_text("the peak")
        expect(readout).to_contain_text(" live at run ")
        shoot(page, "content_memory_hover_1280")
        page.mouse.move(chart["x"], chart["y"] + 12, steps=4)
        expect(readout).to_have_text(f"{bytes_text(peak_bytes)} live at run "
                                     f"{memory['peak_position'] + 1}, op {memory['peak_op']} "
                                     f"(the peak):")
        page.mouse.move(5, 5, steps=4)
        expect(readout).to_have_text(f"{bytes_text(peak_bytes)} live at the peak:")
        # a click on the peak's marker selects its op, as a click on the op in the graph does
        page.mouse.click(chart["x"], chart["y"])
        details = lab.locator(f'.tl-details[data-op="{memory["peak_op"]}"]')
        expect(details).to_be_visible(timeout=15_000)
        expect(lab.locator(".tl-tab-on")).to_have_text("Op")
        expect(details.locator(".tl-details-title")).to_contain_text(memory["peak_primitive"])
        expect(details.locator(".tl-memory-peak-note")).to_contain_text(
            f"memory peak: {bytes_text(peak_bytes)}")
        assert c.value("[lab.session.selected.kind, lab.session.selected.id]") == [
            "op", str(memory["peak_op"])]
        shoot(page, "content_memory_peak_op_1280")
        # back on the Memory tab, the chart is the one drawn before, still whole
        lab.locator('.tl-tab[data-tab="memory"]').click()
        lab.locator(".tl-memory").scroll_into_view_if_needed()
        again = page.evaluate(MEMORY_CHART)
        assert again["id"] == chart["id"] and again["width"] == chart["width"] > 600, again
        page.mouse.move(5, 5)
        shoot(page, "content_memory_chart_again_1280")
        # a pin that changes the plan redraws the chart for it
        c.kernel("lab.pin('batch', [])")
        c.settle()
        pinned = c.value("lab.view.to_dict()['memory']")
        assert pinned["peak_bytes"] != memory["peak_bytes"]
        assert pinned["peak_bytes"] == c.value("lab.estimate.peak_memory_bytes")
        page.wait_for_function(f"() => ({MEMORY_CHART})()?.labels.some(t => t.startsWith("
                               f"'peak {bytes_text(pinned['peak_bytes'])}'))")
        expect(lab.locator(".tl-memory .tl-big-figure")).to_contain_text(
            f"peak {bytes_text(pinned['peak_bytes'])}")
        assert page.evaluate("() => window.Bokeh.documents.filter(d => d.roots().some("
                             "r => r.name === 'toast-lab-memory-timeline')).length") == 1
        lab.locator(".tl-memory").scroll_into_view_if_needed()
        page.mouse.move(5, 5)
        shoot(page, "content_memory_chart_pinned_1280")
    finally:
        page.set_viewport_size({"width": 1500, "height": 1200})
    assert not c.errors, c.errors
