"""IncrementalEstimator: each edit recosts only what it changes (cost/_kernel/_dirty.py), and
gives, bit for bit, what a whole evaluation of the same plan gives."""

from __future__ import annotations

import numpy as np
import pytest

import toast_lab as tl
from toast_lab.plan_search import Space


@pytest.mark.parametrize("name, device", [("gpt", "h100"), ("gpt", "cpu"), ("moe", "cpu"),
                                          ("gpt_scan", "tpu-v5p"), ("cnn", "h100")])
def test_every_edit_equals_a_whole_evaluation(name, device):
    fn, args = tl.zoo.get(name)
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device=device)
    model = tl.cost_model(an, mesh)
    space = Space(an, mesh, override_classes=4)
    rng = np.random.default_rng(0)
    starts = [tl.Plan.replicated(an), *list(tl.strategies.expert(an, mesh).values())[:2]]
    edits = 0
    for start in starts:
        inc = model.incremental(start)
        assert inc.result == model.step_and_peak(inc.mask, inc.rank, inc.res)
        for _ in range(60):
            d = space.decisions[int(rng.integers(len(space.decisions)))]
            choice = d.choices[int(rng.integers(len(d.choices)))]
            if d.kind == "class":
                got = inc.set_axes(d.index, choice)
            elif d.kind == "conflict":
                got = inc.set_resolution(d.index, d.choices.index(choice))
            elif isinstance(choice, tuple):
                got = inc.set_axes(d.index, choice, domain=d.domain)
            else:
                continue
            assert got == model.step_and_peak(inc.mask, inc.rank, inc.res), d.name
            edits += 1
    assert edits > 100


def test_a_whole_evaluation_between_edits_changes_nothing():
    fn, args = tl.zoo.get("gpt")
    an = tl.analyze(tl.trace(fn, *args))
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    model = tl.cost_model(an, mesh)
    inc = model.incremental()
    batch = an.class_named("batch").id
    first = inc.set_axes(batch, ("data",))
    model.estimate(tl.strategies.expert(an, mesh)["fsdp"])  # the model's own workspace
    assert inc.set_axes(batch, ("data",)) == first
