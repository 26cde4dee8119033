"""The real Lab's pipeline stages in a live notebook, on a laptop's screen (1280 x 800): the
Decisions tab offers stages of the scanned GPT over each mesh axis, priced; a click on
"stage:2" pins them, the estimate becomes the price the choice showed, and the schedule chart
appears under the stages (four micro-batches through two stages, the bubble hatched, the
hand-off per tick in words); the graph says how the stages cut the stack."""

from __future__ import annotations

import pytest

from .conftest import shoot
from .layout import BOKEH_PLOT_VIEW
from .notebooks import kernel_execute, kernel_json, open_step_decisions

pytestmark = pytest.mark.e2e

# The scanned zoo GPT (4 layers) on stage 2 x data 2 x model 2 simulated CPU devices, started
# on data + tensor parallelism with 4 micro-batches and no stages.
LAB_CELL = '''\
import toast_lab as tl

fn, args = tl.zoo.get("gpt_scan", layers=4, batch=16, seq=64)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"stage": 2, "data": 2, "model": 2}, device="cpu"))
lab.set_plan(tl.strategies.expert(lab.analysis, lab.mesh)["dp+tp"].with_micro_batches(4)
             .without_pipeline())
lab'''

# The schedule chart as BokehJS drew it (null until drawn): its cells by kind and its labels.
SCHEDULE_CHART = '''() => {
  const plot = (''' + BOKEH_PLOT_VIEW + ''')('toast-lab-pipeline-schedule');
  if (!plot) { return null; }
  const rects = plot.model.renderers.filter(r => r.glyph?.type === 'Rect');
  const size = r => {
    const d = r.data_source.data;
    return (d instanceof Map ? d.get('x') : d.x).length;
  };
  const box = plot.canvas_view.el.getBoundingClientRect();
  return {
    cells: rects.map(size), hatched: rects.map(r => r.glyph.hatch_pattern?.value ?? null),
    labels: plot.model.center.filter(a => a.type === 'Label').map(a => a.text),
    width: box.width, height: box.height,
  };
}'''


def _figure(lab, name: str) -> str:
    return lab.locator(f'.tl-figure[data-figure="{name}"] .tl-figure-value').inner_text()


def test_stages_are_priced_pinned_and_their_schedule_drawn(page, lab_server):
    from playwright.sync_api import expect

    lab, steps = open_step_decisions(lab_server, page, "lab_pipeline.ipynb", LAB_CELL)
    expect(steps.locator("h4")).to_have_text("Remat, micro-batches & stages (3)")
    stages = steps.locator('.tl-decision[data-step="pipeline@block"]')
    expect(stages.locator(".tl-decision-name")).to_have_text(
        "pipeline stages: block (scanned ×4)")
    expect(stages.locator(".tl-axes")).to_have_text("none")
    # none, then GPipe and circular (2 runs per stage) over stage, data and model
    expect(stages.locator(".tl-choice")).to_have_count(7)
    expect(stages.locator('.tl-choice-note[data-label="stage:2x2"]')).to_contain_text(
        "circular: 2 runs of 1 layer per stage")
    expect(stages.locator('.tl-choice-note[data-label="stage:2"]')).to_contain_text(
        "bubble 1/5 = 20% of each loop")
    expect(lab.locator(".tl-schedule")).to_have_count(0)
    choice = stages.locator('.tl-choice[data-value="stage:2"]')
    expect(choice.locator(".tl-choice-cost")).not_to_contain_text("–", timeout=180_000)
    priced = choice.locator(".tl-choice-cost").inner_text()
    shown = dict(kernel_json(page, "[(ch.value, [ch.step_time_s, ch.peak_memory_bytes]) "
                                   "for ch in lab.view.steps[2].choices]"))
    step_before = _figure(lab, "step time")
    stages.scroll_into_view_if_needed()
    shoot(page, "lab_pipeline_before")

    choice.click()
    expect(stages.locator(".tl-axes")).to_have_text("stage:2", timeout=180_000)
    expect(stages.locator(".tl-lock")).to_contain_text("pinned")
    assert kernel_execute(page, "print(lab.plan.step.pipeline, 'pipeline@block' in "
                                "lab.plan.pinned)").split() == ["stage:2", "True"]
    after = kernel_json(page, "[lab.estimate.step_time_s, lab.estimate.peak_memory_bytes]")
    assert after == shown["stage:2"]
    assert _figure(lab, "step time") != step_before
    assert _figure(lab, "step time") in priced, (_figure(lab, "step time"), priced)
    # the schedule: its words, then its chart (drawn by BokehJS) under the stages
    schedule = stages.locator("xpath=following-sibling::div[1]")
    expect(schedule).to_have_class("tl-schedule")
    expect(schedule.locator(".tl-schedule-head")).to_have_text(
        "Schedule (GPipe): 4 micro-batches through 2 stages over stage")
    expect(schedule.locator(".tl-schedule-bubble")).to_contain_text(
        "bubble 1/5 = 20% of each stage's ticks")
    handoffs = kernel_json(page, "lab.view.schedule.handoffs")
    assert handoffs == 10
    expect(schedule.locator(".tl-schedule-handoff")).to_contain_text(
        "(collective-permute over stage, 10 per step)")
    page.wait_for_function(f"() => ({SCHEDULE_CHART})() !== null", timeout=30_000)
    chart = page.evaluate(f"({SCHEDULE_CHART})()")
    # idle cells (hatched): S - 1 per stage per loop; runs: M per stage per loop
    assert sorted(chart["cells"]) == [2 * 2 * 1, 2 * 2 * 4], chart
    assert "/" in chart["hatched"], chart
    assert chart["labels"] == ["forward loop", "backward loop"]
    assert chart["width"] > 250 and chart["height"] > 100, chart
    # the graph says how the stages cut the stack
    expect(lab.locator(".tl-svg")).to_contain_text("stages: 2 over stage, 2 layers each")
    lab.locator(".tl-svg").scroll_into_view_if_needed()
    shoot(page, "lab_pipeline_graph")
    schedule.scroll_into_view_if_needed()
    page.mouse.move(5, 5)
    shoot(page, "lab_pipeline_schedule")
    # released: the plan keeps its stages (same estimate), the lock goes
    stages.locator(".tl-release").click()
    expect(stages.locator(".tl-lock")).to_have_count(0)
    expect(stages.locator(".tl-axes")).to_have_text("stage:2")
    assert kernel_json(page, "sorted(lab.plan.pinned)") == []
    assert not page.toast_errors, page.toast_errors
