"""tl.search: MCTS around pinned decisions, anytime, with progress (DESIGN.md §7)."""

from __future__ import annotations

import math
import threading
import time
from typing import Callable, Mapping

import numpy as np

from ..cost import CostModel
from ..plan import check_analysis, check_mesh
from ..strategies import expert
from . import _mcts
from ._space import OVERRIDE_CLASSES, plan_order
from ._tracker import (SearchResult, Tracker, budget_left, check_budget, model_and_cap, setup,
                       warm_start_plans, with_faster_remat)
from ._tree import Tree

# Rewards: log(reference step / step). A plan over the memory cap loses INFEASIBLE_PENALTY
# (a factor e^10 in step time, more than any two feasible plans differ) plus twice the log of
# its excess, so the search still climbs towards plans that fit.
INFEASIBLE_PENALTY = 10.0


def reward(step_s: float, peak_bytes: float, cap_bytes: float, ref_step_s: float) -> float:
    if not math.isfinite(step_s):  # a plan the rewritten step cannot run (_space.price)
        return -3.0 * INFEASIBLE_PENALTY
    # a step of no work (a function returning its input) takes no time under any plan
    r = math.log(ref_step_s / step_s) if step_s > 0 and ref_step_s > 0 else 0.0
    if peak_bytes > cap_bytes:
        r -= INFEASIBLE_PENALTY + 2.0 * math.log(peak_bytes / cap_bytes)
    return r


class StepModels:
    """The cost models of the rewritten steps (remat, micro-batches) the search prices, each
    built the first time a plan needs it (a trace, an analysis and a cost model: about a
    second on GPT-2) while the time budget affords it: once a build would likely end past
    `deadline` (perf_counter seconds; None: no time budget), plans needing one not built yet
    go unpriced, (inf, inf), and the search spends what is left on the models it has.
    A build runs on a thread of its own, so that `stop` ends the search at once even then
    (the build finishes in the background, and the model stays with the analysis)."""

    def __init__(self, model, deadline: float | None, stop: threading.Event | None = None):
        self.model, self.deadline, self.stop = model, deadline, stop
        self.built: dict = {}
        self.longest_s = 0.0  # the longest build so far: what the next one may take

    def price(self, space, choices) -> tuple[float, float]:
        step = space.step_of(choices)
        if step.is_default:
            return self.model.step_and_peak(*space.arrays(choices))
        if step.refusal:
            return math.inf, math.inf
        priced = self.built.get(step)
        if priced is None:
            now = time.perf_counter()
            if self.deadline is not None and now + self.longest_s > self.deadline:
                return math.inf, math.inf
            priced = self._build(step)
            if priced is None:
                return math.inf, math.inf
            self.built[step] = priced
            self.longest_s = max(self.longest_s, time.perf_counter() - now)
        return priced.step_and_peak(*space.decision_lists(choices))

    def _build(self, step):
        """model.for_step(step), or None when `stop` is set, or the deadline passes, before
        it is built."""
        if self.stop is None:
            return self.model.for_step(step)
        done, out = threading.Event(), []

        def build():
            try:
                out.append(self.model.for_step(step))
            except BaseException as err:  # raised again on the search's thread
                out.append(err)
            finally:
                done.set()

        threading.Thread(target=build, name="toast-lab step model", daemon=True).start()
        while not done.wait(0.02):
            late = self.deadline is not None and time.perf_counter() > self.deadline
            if self.stop.is_set() or late:
                return None
        if isinstance(out[0], BaseException):
            raise out[0]
        return out[0]


def search(analysis, mesh, pins: Mapping | None = None, budget_s: float | None = 10.0,
           simulations: int | None = None, seed: int = 0, callback: Callable | None = None,
           memory_cap: float | None = None, stop: threading.Event | None = None,
           callback_every_s: float = 0.1, cost_model: CostModel | None = None,
           warm_start: Mapping | None = None) -> SearchResult:
    """Monte Carlo Tree Search for the fastest plan that fits in memory.

    pins: {class name: mesh axes, conflict name: resolution, "<class>@<domain>": mesh axes}
    fixed at the root.
    budget_s / simulations: stop after either (None: no limit on that one); with a simulation
    budget the same seed gives the same result; a time budget stops at a wall-clock point.
    memory_cap: bytes per device (default: the device's memory). stop: a threading.Event that
    ends the search within one simulation. callback(SearchProgress) every `callback_every_s`
    and once at the end. warm_start: {name: Plan} whose choices seed the incumbent; by default
    the expert strategies under the same cap (tl.strategies.expert: with its recipe's remat
    and micro-batches where a strategy does not fit as written), so the answer is never worse
    than the best of them under the same pins; {} starts from the pinned, otherwise
    replicated plan.
    The best of them also sets the space's rank order (see _space.py), so it is in the space
    exactly, with the overrides of every one of them.
    """
    check_analysis(analysis, "tl.search")
    check_mesh(mesh, "tl.search")
    check_budget(budget_s, simulations, stop, callback, callback_every_s)
    if budget_s is None and simulations is None and stop is None:
        raise ValueError("search needs a budget: budget_s, simulations or a stop event")
    model, cap = model_and_cap(analysis, mesh, memory_cap, cost_model)
    experts = expert(analysis, mesh, memory_cap=cap, cost_model=model)
    warm = warm_start_plans(experts if warm_start is None else warm_start, analysis, mesh)
    # (a faster remat of the fastest plan that fits as written is a start too)
    references = with_faster_remat([*experts.values(), *warm], mesh, cap, model)
    warm += references[len(experts) + len(warm):]
    model, space, cap = setup(analysis, mesh, pins, cap, model,
                              overrides=[(k, d) for p in warm for k, d, _ in p.overrides],
                              override_classes=OVERRIDE_CLASSES, references=references)
    rng = np.random.default_rng(seed)
    n = len(space.decisions)
    reference = np.where(space.pinned >= 0, space.pinned, 0).astype(np.int64)
    # (the budget's clock starts below, after the kernel's compile; a step model built for
    # a pinned remat or micro-batch count before it is the start's price, like the compile)
    steps = StepModels(model, None, stop)
    # The first evaluation compiles the kernel (seconds on a fresh install): before the clock.
    ref_step, ref_peak = steps.price(space, reference)
    incumbent, start = reference, (ref_step, ref_peak)
    best_reward = reward(ref_step, ref_peak, cap, ref_step)
    for plan in warm:  # each in its own rank order; the best one's becomes the space's
        ordered = space.reordered(plan_order(plan))
        ch = np.where(space.pinned >= 0, space.pinned, ordered.choices_of(plan))
        step, peak = steps.price(ordered, ch)
        r = reward(step, peak, cap, ref_step)
        if r > best_reward:
            best_reward, incumbent, start, space = r, ch, (step, peak), ordered
    tracker = Tracker(space, model, cap, callback, callback_every_s, "mcts")
    if budget_s is not None:
        steps.deadline = tracker.start + budget_s
    tracker.record(reference, *steps.price(space, reference))
    if incumbent is not reference:  # never an empty answer, never worse than the best start
        tracker.record(incumbent, *start)
    if n == 0:
        return tracker.result(space.size)
    tree = Tree(capacity=1024, max_choices=int(space.num_choices.max()))
    stats = {"min": math.inf, "max": -math.inf}
    choices = np.zeros(n, np.int64)

    def evaluate(ch) -> float:
        step, peak = steps.price(space, ch)
        tracker.record(ch, step, peak)
        r = reward(step, peak, cap, ref_step)
        stats["min"], stats["max"] = min(stats["min"], r), max(stats["max"], r)
        return r

    def more() -> bool:
        return budget_left(tracker, budget_s, simulations, stop)

    if incumbent is not reference and more():  # the corner of the best start
        _mcts.polish(space, incumbent, evaluate, best_reward, more)
    # The tree search itself starts from scratch: its rollouts follow its own best plan, so a
    # good start (kept by the tracker) does not pin the exploration to its neighbourhood.
    own, own_reward = reference.copy(), reward(ref_step, ref_peak, cap, ref_step)
    policy = _mcts.incumbent_policy(space, own)
    while more():
        path, depth = _mcts.select_and_expand(tree, space, choices, rng, stats)
        _mcts.rollout(space, choices, depth, policy, rng)
        r = evaluate(choices)
        _mcts.backup(tree, path, r)
        if r > own_reward:  # the rollout policy follows the best plan found, polished
            polished, own_reward = _mcts.polish(space, choices, evaluate, r, more)
            own[:] = polished
    return tracker.result(space.size, tree.size,
                          {"reward_min": stats["min"], "reward_max": stats["max"]})
