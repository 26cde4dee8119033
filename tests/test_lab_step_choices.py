"""The Lab's decisions beyond sharding: remat per layer group, the micro-batch count and
pipeline stages (tests/test_lab_pipeline.py has the stages' own tests), shown
with their prices (exactly the cost model's for the plan with that one choice changed) and
pinned from the widget's events."""

import math

import pytest

import toast_lab as tl
from toast_lab.lab import Lab, Session, ViewBuilder, ViewModel

MESH = tl.Mesh({"data": 2, "model": 4}, device="cpu")


@pytest.fixture(scope="module")
def gpt_scan():
    fn, args = tl.zoo.get("gpt_scan", layers=2, batch=16, seq=64)
    an = tl.analyze(tl.trace(fn, *args))
    return an, tl.strategies.expert(an, MESH)["fsdp+tp"]


@pytest.fixture(scope="module")
def builder(gpt_scan):
    return ViewBuilder(gpt_scan[0], MESH)


def _changed(plan, name, value):
    if name == "micro_batches":
        return plan.with_micro_batches(value)
    if name.startswith("pipeline@"):
        axis, stages = value.split(":")
        return plan.with_pipeline(name.split("@", 1)[1], axis, int(stages))
    return plan.with_remat(name.split("@", 1)[1], value)


def test_remat_and_micro_batches_are_offered_priced_as_the_cost_model_prices_them(
        gpt_scan, builder):
    an, plan = gpt_scan
    session = Session(an, MESH, plan)
    vm = builder.build(session)
    assert [d.name for d in vm.steps] == ["remat@block", "micro_batches", "pipeline@block"]
    remat, micro, stages = vm.steps
    assert remat.label == "remat: block (scanned ×2)" and micro.label == "micro-batches"
    assert (remat.value, micro.value, remat.pinned, micro.pinned) == ("everything", 1, False,
                                                                      False)
    # stages over an axis whose size divides the 2 layers (data; not model's 4)
    assert [ch.value for ch in stages.choices] == ["none", "data:2"]
    assert [ch.value for ch in remat.choices] == ["everything", "dots_with_no_batch_dims",
                                                  "full"]
    assert [ch.value for ch in micro.choices] == [1, 2, 4, 8]
    model = tl.cost_model(an, MESH)
    est = session.estimate
    for d in vm.steps:
        for ch in d.choices:
            assert ch.valid and ch.reason is None and ch.note
            if ch.current:
                assert (ch.step_time_s, ch.peak_memory_bytes) == (est.step_time_s,
                                                                  est.peak_memory_bytes)
                continue
            changed = _changed(plan, d.name, ch.value)
            assert (ch.step_time_s, ch.peak_memory_bytes) == model.price(changed)
            full = tl.estimate(an, changed, MESH)
            assert ch.peak_memory_bytes == pytest.approx(full.peak_memory_bytes, rel=1e-9)
    by = {ch.value: ch for ch in remat.choices}
    # recomputing more keeps less (what it costs in time depends on the step: recomputed
    # values are never written to memory and read back, which on this memory-bound step
    # saves about what the recomputation costs)
    assert (by["full"].peak_memory_bytes < by["dots_with_no_batch_dims"].peak_memory_bytes
            < by["everything"].peak_memory_bytes)
    assert "MaxText's \"minimal\"" in by["dots_with_no_batch_dims"].note
    assert "only each layer's input" in by["full"].note
    assert "every residual" in by["everything"].note
    assert "8 micro-batches of 2 examples" in micro.choices[-1].note
    # the view round-trips through JSON, counts staying integers
    again = ViewModel.from_json(vm.to_json())
    assert again.steps == vm.steps and again.steps[1].choices[1].value == 2
    assert "remat@block (remat: block (scanned ×2)): everything" in vm.to_text()


def test_a_micro_batch_count_that_does_not_divide_over_the_batch_devices_is_refused(
        gpt_scan, builder):
    an, plan = gpt_scan
    batch = an.class_named("batch").id
    wide = plan.with_axes(batch, ("data", "model"))  # 16 examples over 8 devices
    model = tl.cost_model(an, MESH)
    assert model.price(wide.with_micro_batches(4)) == (math.inf, math.inf)
    for price in (True, False):
        vm = builder.build(Session(an, MESH, wide), price=price)
        micro = next(d for d in vm.steps if d.name == "micro_batches")
        by = {ch.value: ch for ch in micro.choices}
        assert by[1].valid and by[2].valid
        for k in (4, 8):
            assert not by[k].valid and by[k].step_time_s is None
            assert by[k].reason == (f"each micro-batch's {16 // k} examples do not divide "
                                    f"over the 8 devices of batch's axes data×model")
        if price:
            assert (by[2].step_time_s, by[2].peak_memory_bytes) == \
                model.price(wide.with_micro_batches(2))
        else:
            assert by[2].step_time_s is None


def test_pin_and_unpin_events_take_step_decisions(gpt_scan):
    an, plan = gpt_scan
    lab = Lab.from_analysis(an, MESH, plan, widget=False, progress=False)
    before = lab.estimate.peak_memory_bytes
    full = next(ch for ch in lab.view.steps[0].choices if ch.value == "full")
    lab._on_event({"event": "pin", "name": "remat@block", "value": "full"})
    assert lab.view.error is None
    assert lab.plan.step.policy_of("block") == "full" and "remat@block" in lab.plan.pinned
    remat = lab.view.steps[0]
    assert remat.value == "full" and remat.pinned and "remat@block" in lab.view.pinned
    # the price shown before the pin is the estimate after it
    assert lab.estimate.peak_memory_bytes == full.peak_memory_bytes < before
    lab._on_event({"event": "pin", "name": "micro_batches", "value": 2})
    assert lab.plan.step.micro_batches == 2 and lab.view.steps[1].pinned
    assert lab.estimate == tl.cost_model(an, MESH).estimate(lab.plan)
    lab._on_event({"event": "pin", "name": "remat@block", "value": "most"})
    assert "remat policy 'most'" in lab.view.error
    lab._on_event({"event": "unpin", "name": "remat@block"})
    assert lab.view.error is None and not lab.view.steps[0].pinned
    assert lab.plan.step.policy_of("block") == "full"  # kept until a search changes it


def test_a_large_program_shows_its_step_choices_unpriced(gpt_scan, monkeypatch):
    """Beyond PRICED_OPS ops a rewrite per choice would stall every view: only the plan's own
    value is priced (it is the estimate)."""
    from toast_lab.lab import _step_choices

    an, plan = gpt_scan
    monkeypatch.setattr(_step_choices, "PRICED_OPS", len(an.program.ops) - 1)
    session = Session(an, MESH, plan)
    vm = ViewBuilder(an, MESH).build(session)
    for d in vm.steps:
        for ch in d.choices:
            assert ch.valid
            priced = (ch.step_time_s, ch.peak_memory_bytes)
            if ch.current:
                assert priced == (session.estimate.step_time_s,
                                  session.estimate.peak_memory_bytes)
            else:
                assert priced == (None, None)
