"""The real Lab's decisions beyond sharding in a live notebook, on a laptop's screen (1280 x
800): the Decisions tab lists remat per layer group and the micro-batch count first, each
choice priced; a click on remat "full" pins it and the estimate's peak drops to the price the
choice showed; releasing it unpins it."""

from __future__ import annotations

import pytest

from .conftest import shoot
from .notebooks import kernel_execute, kernel_json, open_step_decisions

pytestmark = pytest.mark.e2e

# The scanned zoo GPT on data 2 x model 4 simulated CPU devices, started on FSDP+TP with every
# residual kept (whatever the Lab would start on), so "full" is a choice to click.
LAB_CELL = '''\
import toast_lab as tl

fn, args = tl.zoo.get("gpt_scan", layers=2, batch=16, seq=64)
lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 2, "model": 4}, device="cpu"))
lab.set_plan(tl.strategies.expert(lab.analysis, lab.mesh)["fsdp+tp"]
             .with_remat("block", "everything").with_micro_batches(1))
lab'''


def _peak(lab) -> str:
    return lab.locator('.tl-figure[data-figure="peak memory"] .tl-figure-value').inner_text()


def test_remat_full_is_priced_then_pinned_and_the_peak_drops(page, lab_server):
    from playwright.sync_api import expect

    lab, steps = open_step_decisions(lab_server, page, "lab_steps.ipynb", LAB_CELL)
    # (and stages over data, the one axis whose size divides the 2 layers)
    expect(steps.locator("h4")).to_have_text("Remat, micro-batches & stages (3)")
    remat = steps.locator('.tl-decision[data-step="remat@block"]')
    expect(remat.locator(".tl-decision-name")).to_have_text("remat: block (scanned ×2)")
    expect(remat.locator(".tl-axes")).to_have_text("everything")
    micro = steps.locator('.tl-decision[data-step="micro_batches"]')
    expect(micro.locator(".tl-choice")).to_have_count(4)
    # each policy says what it keeps
    expect(remat.locator('.tl-choice-note[data-label="full"]')).to_contain_text(
        "only each layer's input")
    full = remat.locator('.tl-choice[data-value="full"]')
    priced = full.locator(".tl-choice-cost").inner_text()
    expect(full.locator(".tl-delta").last).to_have_class("tl-delta tl-better")  # Δ peak
    shown = kernel_json(page, "[[ch.value, ch.peak_memory_bytes] for ch in "
                              "lab.view.steps[0].choices]")
    before = kernel_json(page, "lab.estimate.peak_memory_bytes")
    peak_before = _peak(lab)
    remat.scroll_into_view_if_needed()
    shoot(page, "lab_steps_before")
    full.click()
    expect(remat.locator(".tl-axes")).to_have_text("full")
    expect(remat.locator(".tl-lock")).to_contain_text("pinned")
    expect(lab.locator('.tl-figure[data-figure="pinned"] .tl-figure-value')).to_have_text("1")
    assert kernel_execute(page, "print(lab.plan.step.policy_of('block'), "
                                "'remat@block' in lab.plan.pinned)").split() == \
        ["full", "True"]
    after = kernel_json(page, "lab.estimate.peak_memory_bytes")
    assert after < before and after == dict(shown)["full"]
    assert _peak(lab) != peak_before
    assert _peak(lab).split(" / ")[0] in priced, (_peak(lab), priced)
    shoot(page, "lab_steps_full")
    # released: the plan keeps "full" (same estimate), the lock goes
    remat.locator(".tl-release").click()
    expect(remat.locator(".tl-lock")).to_have_count(0)
    expect(remat.locator(".tl-axes")).to_have_text("full")
    assert kernel_json(page, "sorted(lab.plan.pinned)") == []
    assert not page.toast_errors, page.toast_errors
