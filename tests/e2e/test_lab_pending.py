"""The Lab's first view in the page while the cost model's kernel still compiles: the graph
(coloured by an expert plan, named) and the decisions drawn, every price "–", a line saying
why and counting the seconds; a pin clicked meanwhile shows at once and holds once the prices
come.

The compile is simulated in the notebook's kernel (a compile "under way" that the test ends),
so the test needs no empty cache; tests/test_lab_pending.py holds the same in Python.
"""

from __future__ import annotations

import pytest

from .conftest import shoot
from .notebooks import GRAPH_COLOURS, kernel_execute, kernel_json, open_notebook, watched_page

pytestmark = pytest.mark.e2e

NOTEBOOK = "pending_lab.ipynb"
LAB_CELL = '''\
import threading, time
import toast_lab as tl
from toast_lab.cost._kernel import _ahead

_ahead.wait()  # the real compile, if any, ends first; then one "under way" until the test ends it
_ahead._done, _ahead._thread = threading.Event(), threading.Thread(target=lambda: None)
_ahead._began = time.perf_counter()
fn, args = tl.zoo.get("gpt", size="gpt2-small", layers=2)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="tpu-v5e"))
lab'''


@pytest.fixture(scope="module")
def pending(lab_server, browser_context):
    from playwright.sync_api import expect

    page = watched_page(browser_context, 1280, 900)
    open_notebook(lab_server, page, NOTEBOOK, [LAB_CELL])
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-svg g.node").first).to_be_visible(timeout=300_000)
    yield page
    kernel_execute(page, "_ahead._done.set()")  # (the kernel's pricing thread ends)
    page.close()


def test_the_pending_view_draws_everything_but_the_prices_and_says_why(pending):
    from playwright.sync_api import expect

    page = pending
    lab = page.locator(".tl-widget .tl-lab")
    expect(lab.locator(".tl-start")).to_contain_text("prices pending: compiling the cost model")
    # coloured already, by an expert plan that the header names
    expect(lab.locator(".tl-start")).to_contain_text("start until priced: fsdp")
    sharded = kernel_json(page, "[c.color.lower() for c in lab.view.classes if c.axes]")
    colours = lab.evaluate(GRAPH_COLOURS)
    assert sharded and set(sharded) & set(colours), (sharded, colours)
    building = page.locator(".tl-widget .tl-building")
    expect(building).to_contain_text("pricing: compiling the cost model")
    expect(building).to_contain_text("s so far (about 40 s the first time; cached after)")
    step = lab.locator('.tl-figure[data-figure="step time"] .tl-figure-value')
    assert step.text_content() == "–"
    rows = lab.locator(".tl-decision")
    assert rows.count() >= 4
    assert "Prices pending" in lab.locator(".tl-decisions .tl-section-note").first.text_content()
    shoot(page, "lab_pending")
    assert not page.errors, page.errors


def test_a_pin_clicked_while_pending_shows_at_once_and_holds_once_priced(pending):
    from playwright.sync_api import expect

    page = pending
    lab = page.locator(".tl-widget .tl-lab")
    row = lab.locator('.tl-decision[data-name="batch"]')
    row.locator('.tl-choice[data-label="data"]').click()
    expect(row.locator(".tl-axes")).to_have_text("data")
    expect(page.locator(".tl-widget .tl-notice")).to_contain_text(
        "once the cost model is compiled: pin batch → data")
    shoot(page, "lab_pending_pinned")
    kernel_execute(page, "_ahead._done.set()")
    step = lab.locator('.tl-figure[data-figure="step time"] .tl-figure-value')
    expect(step).not_to_have_text("–", timeout=120_000)
    expect(lab.locator(".tl-start")).not_to_contain_text("pending")
    expect(row.locator(".tl-axes")).to_have_text("data")
    assert kernel_json(page, "[lab.pending, lab.plan.axes_of('batch'), 'batch' in "
                             "lab.plan.pinned]") == [False, ["data"], True]
    page.wait_for_function("!document.querySelector('.tl-widget .tl-building:not([hidden])')",
                           timeout=60_000)
    shoot(page, "lab_priced_after_pending")
    assert not page.errors, page.errors
