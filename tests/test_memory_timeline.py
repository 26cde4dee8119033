"""CostModel.memory_timeline: the live bytes per device at each op, by category, whose largest
sum is the estimate's peak (the Lab's memory-over-the-step chart)."""

from __future__ import annotations

import numpy as np
import pytest

import toast_lab as tl
from toast_lab.cost import MEMORY_CATEGORIES


@pytest.fixture(scope="module")
def gpt():
    fn, args = tl.zoo.get("gpt")
    return tl.analyze(tl.trace(fn, *args))


@pytest.mark.parametrize("device", ["h100", "cpu"])
def test_the_timeline_peaks_at_the_estimates_peak(gpt, device):
    mesh = tl.Mesh({"data": 4, "model": 2}, device=device)
    model = tl.cost_model(gpt, mesh)
    for name, plan in tl.strategies.expert(gpt, mesh).items():
        est = model.estimate(plan)
        t = model.memory_timeline(plan)
        assert tuple(t.categories) == MEMORY_CATEGORIES
        total = t.total
        assert t.peak_bytes == est.peak_memory_bytes == total.max(), name
        assert t.peak_position == int(np.argmax(total))
        assert t.ops[t.peak_position] == t.peak_op
        # every op once, in the order the compiler runs them
        assert sorted(t.ops.tolist()) == list(range(len(gpt.program.ops)))
        for category, values in t.categories.items():
            assert values.shape == total.shape and (values >= 0).all(), (name, category)
        # the arguments are live throughout, as the estimate counts them
        at = t.at(t.peak_position)
        assert at[MEMORY_CATEGORIES[0]] + at[MEMORY_CATEGORIES[1]] == est.argument_bytes


def test_sharding_the_batch_shrinks_the_temporaries_at_the_peak(gpt):
    mesh = tl.Mesh({"data": 4, "model": 2}, device="h100")
    model = tl.cost_model(gpt, mesh)
    replicated = model.memory_timeline(tl.Plan.replicated(gpt))
    dp = model.memory_timeline(tl.Plan.replicated(gpt).with_axes("batch", ("data",)))
    temps = MEMORY_CATEGORIES[3]
    assert dp.categories[temps].max() < replicated.categories[temps].max()
