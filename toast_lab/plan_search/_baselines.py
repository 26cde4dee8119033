"""Reference points on the same cost model: exhaustive enumeration and random search."""

from __future__ import annotations

import threading
from typing import Callable, Iterator, Mapping

import numpy as np

from ._tracker import Tracker, budget_left, check_budget, setup

EXHAUSTIVE_LIMIT = 100_000


def enumerate_choices(space) -> Iterator[np.ndarray]:
    """Every complete assignment once: pins fixed, a conflict only where its class is sharded."""
    n = len(space.decisions)
    choices = np.zeros(n, np.int64)

    def walk(pos):
        if pos == n:
            yield choices
            return
        d = space.decisions[pos]
        if d.pinned >= 0:
            options = (d.pinned,)
        elif space.skipped(choices, pos):
            options = (0,)
        else:
            options = range(len(d.choices))
        for c in options:
            choices[pos] = c
            yield from walk(pos + 1)

    yield from walk(0)


def exhaustive(analysis, mesh, pins: Mapping | None = None, memory_cap: float | None = None,
               limit: int = EXHAUSTIVE_LIMIT, callback: Callable | None = None,
               stop: threading.Event | None = None):
    """Evaluates every plan in the space (refuses spaces over `limit` plans)."""
    check_budget(None, None, stop, callback)
    model, space, cap = setup(analysis, mesh, pins, memory_cap, None)
    if space.size > limit:
        raise ValueError(f"the space holds {space.size:.3g} plans, over the exhaustive limit of "
                         f"{limit}: use search() or pin more decisions")
    tracker = Tracker(space, model, cap, callback, 0.1, "exhaustive")
    for choices in enumerate_choices(space):
        if stop is not None and stop.is_set():
            break
        step, peak = space.price(model, choices)
        tracker.record(choices, step, peak)
    return tracker.result(space.size)


def random_search(analysis, mesh, pins: Mapping | None = None, budget_s: float | None = 10.0,
                  simulations: int | None = None, seed: int = 0,
                  memory_cap: float | None = None, callback: Callable | None = None,
                  stop: threading.Event | None = None):
    """Uniformly random plans from the space, with the same budget rules as search()."""
    check_budget(budget_s, simulations, stop, callback)
    if budget_s is None and simulations is None and stop is None:
        raise ValueError("random_search needs a budget: budget_s, simulations or a stop event")
    model, space, cap = setup(analysis, mesh, pins, memory_cap, None)
    rng = np.random.default_rng(seed)
    n = len(space.decisions)
    choices = np.zeros(n, np.int64)
    space.price(model, np.where(space.pinned >= 0, space.pinned, 0))  # compile
    tracker = Tracker(space, model, cap, callback, 0.1, "random")
    while budget_left(tracker, budget_s, simulations, stop):
        for pos, d in enumerate(space.decisions):
            if d.pinned >= 0:
                choices[pos] = d.pinned
            elif space.skipped(choices, pos):
                choices[pos] = 0
            else:
                choices[pos] = rng.integers(len(d.choices))
        step, peak = space.price(model, choices)
        tracker.record(choices, step, peak)
    return tracker.result(space.size)
