"""tl.search: MCTS around pinned decisions, anytime, with progress (DESIGN.md §7)."""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import numpy as np

from ..cost import CostModel, Estimate, model_for
from . import _mcts
from ._space import Space
from ._tree import Tree

# Rewards: log(reference step / step). A plan over the memory cap loses INFEASIBLE_PENALTY
# (a factor e^10 in step time, more than any two feasible plans differ) plus twice the log of
# its excess, so the search still climbs towards plans that fit.
INFEASIBLE_PENALTY = 10.0


def reward(step_s: float, peak_bytes: float, cap_bytes: float, ref_step_s: float) -> float:
    r = math.log(ref_step_s / step_s)
    if peak_bytes > cap_bytes:
        r -= INFEASIBLE_PENALTY + 2.0 * math.log(peak_bytes / cap_bytes)
    return r


@dataclass(frozen=True)
class SearchProgress:
    """What the callback receives: the best plan so far and how fast the search runs."""

    plan: object
    estimate: Estimate | None
    simulations: int
    elapsed_s: float
    sims_per_s: float
    feasible: bool
    done: bool = False


@dataclass(frozen=True)
class SearchResult:
    """The search's answer. plan is None when no plan fits the memory cap; then `closest` is
    the plan with the smallest peak seen and `message` says by how much it misses."""

    plan: object
    estimate: Estimate | None
    history: tuple               # (elapsed s, simulations, step s, peak bytes) per improvement
    simulations: int
    elapsed_s: float
    memory_cap_bytes: float
    space_size: float
    closest: object = None
    closest_estimate: Estimate | None = None
    tree_nodes: int = 0
    method: str = "mcts"
    stats: dict = field(default_factory=dict)

    @property
    def feasible(self) -> bool:
        return self.plan is not None

    @property
    def message(self) -> str:
        if self.plan is not None:
            return (f"{self.method}: {self.simulations} plans in {self.elapsed_s:.2f} s; best "
                    f"{self.estimate.step_time_s * 1e3:.3f} ms/step, peak "
                    f"{self.estimate.peak_memory_bytes / 2**30:.2f} GiB")
        peak = self.closest_estimate.peak_memory_bytes if self.closest_estimate else float("nan")
        return (f"no plan fits the memory cap of {self.memory_cap_bytes / 2**30:.2f} GiB after "
                f"{self.simulations} plans; the smallest peak reached is {peak / 2**30:.2f} GiB, "
                f"by {self.closest!r}. Use more devices, a larger memory cap, rematerialization "
                f"or a smaller batch.")

    def __repr__(self) -> str:
        return f"SearchResult({self.plan!r}; {self.message})"


class _Tracker:
    """Best feasible plan, smallest peak, history, progress callbacks."""

    def __init__(self, space, model, cap, callback, every_s, method):
        self.space, self.model, self.cap = space, model, cap
        self.callback, self.every_s, self.method = callback, every_s, method
        self.best = None        # (step, peak, choices)
        self.lowest = None      # (peak, step, choices)
        self.history: list = []
        self.start = time.perf_counter()
        self.last_report = self.start
        self.sims = 0
        self.lo, self.hi = math.inf, -math.inf

    def record(self, choices, step, peak) -> None:
        self.sims += 1
        if self.lowest is None or peak < self.lowest[0]:
            self.lowest = (peak, step, choices.copy())
        if peak <= self.cap and (self.best is None or step < self.best[0]):
            self.best = (step, peak, choices.copy())
            self.history.append((time.perf_counter() - self.start, self.sims, step, peak))
        now = time.perf_counter()
        if self.callback is not None and now - self.last_report >= self.every_s:
            self.last_report = now
            self.report(done=False)

    def report(self, done: bool) -> None:
        if self.callback is None:
            return
        elapsed = time.perf_counter() - self.start
        chosen = self.best or (None, None, self.lowest[2] if self.lowest else None)
        plan = self.space.plan(chosen[2]) if chosen[2] is not None else None
        est = self.model.estimate(plan) if plan is not None else None
        self.callback(SearchProgress(plan, est, self.sims, elapsed,
                                     self.sims / max(elapsed, 1e-9), self.best is not None, done))

    def result(self, space_size, tree_nodes=0, stats=None) -> SearchResult:
        self.report(done=True)
        elapsed = time.perf_counter() - self.start
        plan = est = closest = closest_est = None
        if self.best is not None:
            plan = self.space.plan(self.best[2])
            est = self.model.estimate(plan)
        elif self.lowest is not None:
            closest = self.space.plan(self.lowest[2])
            closest_est = self.model.estimate(closest)
        return SearchResult(plan, est, tuple(self.history), self.sims, elapsed, self.cap,
                            space_size, closest, closest_est, tree_nodes, self.method,
                            stats or {})


def _setup(analysis, mesh, pins, memory_cap, cost_model):
    model = cost_model or model_for(analysis, mesh)
    space = Space(analysis, mesh, pins)
    cap = float(mesh.device.memory_bytes if memory_cap is None else memory_cap)
    if not cap > 0:
        raise ValueError(f"memory_cap must be a positive number of bytes, got {memory_cap!r}")
    return model, space, cap


def _budget_left(tracker, budget_s, simulations, stop) -> bool:
    if stop is not None and stop.is_set():
        return False
    if simulations is not None and tracker.sims >= simulations:
        return False
    if budget_s is not None and time.perf_counter() - tracker.start >= budget_s:
        return False
    return True


def search(analysis, mesh, pins: Mapping | None = None, budget_s: float | None = 10.0,
           simulations: int | None = None, seed: int = 0, callback: Callable | None = None,
           memory_cap: float | None = None, stop: threading.Event | None = None,
           callback_every_s: float = 0.1, cost_model: CostModel | None = None,
           warm_start: Mapping | None = None) -> SearchResult:
    """Monte Carlo Tree Search for the fastest plan that fits in memory.

    pins: {class name: mesh axes, conflict name: resolution} fixed at the root.
    budget_s / simulations: stop after either (None: no limit on that one); with a simulation
    budget the same seed gives the same result; a time budget stops at a wall-clock point.
    memory_cap: bytes per device (default: the device's memory). stop: a threading.Event that
    ends the search within one simulation. callback(SearchProgress) every `callback_every_s`
    and once at the end. warm_start: {name: Plan} whose choices seed the incumbent (e.g. the
    expert strategies); by default the search starts from the pinned, otherwise replicated plan.
    """
    if budget_s is None and simulations is None and stop is None:
        raise ValueError("search needs a budget: budget_s, simulations or a stop event")
    model, space, cap = _setup(analysis, mesh, pins, memory_cap, cost_model)
    rng = np.random.default_rng(seed)
    n = len(space.decisions)
    incumbent = np.where(space.pinned >= 0, space.pinned, 0).astype(np.int64)
    # The first evaluation compiles the kernel (seconds on a fresh install): before the clock.
    ref_step, ref_peak = model.step_and_peak(*space.arrays(incumbent))
    tracker = _Tracker(space, model, cap, callback, callback_every_s, "mcts")
    tracker.record(incumbent, ref_step, ref_peak)  # never an empty answer
    best_reward = reward(ref_step, ref_peak, cap, ref_step)
    for plan in (warm_start or {}).values():
        ch = space.choices_of(plan)
        ch = np.where(space.pinned >= 0, space.pinned, ch)
        step, peak = model.step_and_peak(*space.arrays(ch))
        tracker.record(ch, step, peak)
        r = reward(step, peak, cap, ref_step)
        if r > best_reward:
            best_reward, incumbent = r, ch.copy()
    if n == 0:
        return tracker.result(space.size)
    tree = Tree(capacity=1024, max_choices=int(space.num_choices.max()))
    stats = {"min": math.inf, "max": -math.inf}
    policy = _mcts.incumbent_policy(space, incumbent)
    choices = np.zeros(n, np.int64)
    def evaluate(ch) -> float:
        step, peak = model.step_and_peak(*space.arrays(ch))
        tracker.record(ch, step, peak)
        r = reward(step, peak, cap, ref_step)
        stats["min"], stats["max"] = min(stats["min"], r), max(stats["max"], r)
        return r

    while _budget_left(tracker, budget_s, simulations, stop):
        path, depth = _mcts.select_and_expand(tree, space, choices, rng, stats)
        _mcts.rollout(space, choices, depth, policy, rng)
        r = evaluate(choices)
        _mcts.backup(tree, path, r)
        if r > best_reward:  # the rollout policy follows the best plan found, polished
            polished, r2 = _mcts.polish(
                space, choices, evaluate, r,
                lambda: _budget_left(tracker, budget_s, simulations, stop))
            best_reward = r2
            incumbent[:] = polished
    return tracker.result(space.size, tree.size,
                          {"reward_min": stats["min"], "reward_max": stats["max"]})
