"""What every search method shares: the answer types, the tracker of the best plan and of
progress, the setup of a space and a cost model, and the budget rule."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..cost import CostModel, Estimate, cost_model
from ..plan import Plan, PlanError, format_bytes
from ..plan import check_analysis, check_mesh
from ..strategies import expert, faster_with_remat
from ._space import STEP, Space


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
                    f"{format_bytes(self.estimate.peak_memory_bytes)}")
        peak = self.closest_estimate.peak_memory_bytes if self.closest_estimate else float("nan")
        step = self.closest.step if self.closest is not None else None
        how = (f", with {', '.join(f'{k}={v}' for k, v in step.names().items())}"
               if step is not None and not step.is_default else "")
        return (f"no plan fits the memory cap of {format_bytes(self.memory_cap_bytes)} (per "
                f"device) after {self.simulations} plans, remat policies and micro-batch "
                f"counts among them where the step allows them; the smallest peak reached is "
                f"{format_bytes(peak)}, by {self.closest!r}{how}. Use more devices, a larger "
                f"memory cap or a smaller batch.")

    def __repr__(self) -> str:
        return f"SearchResult({self.plan!r}; {self.message})"


class Tracker:
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


def model_and_cap(analysis, mesh, memory_cap, model: CostModel | None = None):
    """(the cost model, the memory cap in bytes per device) a search of `analysis` on `mesh`
    runs on: `model` or the analysis's own, `memory_cap` or the device's memory."""
    # tl.search checks these first (before the expert strategies); the baselines come here
    check_analysis(analysis, "tl.exhaustive / tl.random_search")
    check_mesh(mesh, "tl.exhaustive / tl.random_search")
    if memory_cap is not None:
        _check_number("memory_cap", memory_cap, "bytes per device, e.g. 16 * 2**30")
    model = model or cost_model(analysis, mesh)
    cap = float(mesh.device.memory_bytes if memory_cap is None else memory_cap)
    if not cap > 0:
        raise ValueError(f"memory_cap must be a positive number of bytes, got {memory_cap!r}")
    return model, cap


def setup(analysis, mesh, pins, memory_cap, model: CostModel | None = None, overrides=(),
          override_classes: int = 0, references=None):
    """(cost model, Space, cap) of a search. references: the plans whose prices decide which
    step decisions the space holds as written (as_written); default the expert strategies
    under the cap."""
    model, cap = model_and_cap(analysis, mesh, memory_cap, model)
    space = Space(analysis, mesh, pins, overrides, override_classes=override_classes)
    if references is None:
        references = with_faster_remat(
            expert(analysis, mesh, memory_cap=cap, cost_model=model).values(), mesh, cap, model)
    held = as_written(space, model, cap, references)
    if held:
        space = Space(analysis, mesh, {**dict(pins or {}), **held}, overrides,
                      override_classes=override_classes)
    return model, space, cap


def with_faster_remat(plans, mesh, cap: float, model) -> list:
    """`plans`, and where the fastest of them that fits under `cap` is the step as written,
    that plan with the remat of its recipe that makes it faster still, where one does
    (tl.strategies.faster_with_remat: two rewritten steps priced, shared by every search of
    the analysis on the mesh)."""
    plans = list(plans)
    fitting = []
    for i, plan in enumerate(plans):
        step, peak = model.price(plan)
        if peak <= cap:
            fitting.append((step, not plan.step.is_default, i))
    if fitting and not min(fitting)[1]:
        faster = faster_with_remat(plans[min(fitting)[2]], mesh, cap, model)
        if faster is not None:
            plans.append(faster)
    return plans


def as_written(space, model, cap, references) -> dict:
    """{decision: its as-written choice} for the remat, micro-batch and pipeline decisions
    the search leaves as written: all of them where the fastest of `references` (the expert
    strategies, each with its recipe's remat where it needs that to fit, the plans the search
    starts from, and with_faster_remat's) that fits under `cap` is the step as written, and
    no pin asks for another (each step priced is a rewritten step with a cost model of its
    own, about a second to build); none where the fastest that fits recomputes, accumulates
    or pipelines, which the search must then be able to reach, or where none fits, which is
    when published runs reach for them."""
    free = [d for d in space.decisions if d.kind == STEP and d.pinned < 0]
    if not free or any(d.kind == STEP and d.pinned > 0 for d in space.decisions):
        return {}
    fitting = []
    for plan in references:
        step, peak = model.price(plan)
        if peak <= cap:
            fitting.append((step, not plan.step.is_default))
    if not fitting or min(fitting)[1]:  # (ties go to the step as written)
        return {}
    return {d.name: d.choices[0] for d in free}


def check_budget(budget_s, simulations, stop=None, callback=None, callback_every_s=0.1) -> None:
    """TypeError / ValueError naming the argument, for a budget a search cannot run on."""
    if budget_s is not None:
        _check_number("budget_s", budget_s, "seconds, e.g. budget_s=10")
    if simulations is not None:
        if isinstance(simulations, bool) or not isinstance(simulations, (int, np.integer)):
            raise TypeError(f"simulations must be an int (a number of plans to evaluate) or "
                            f"None, got {type(simulations).__name__} {simulations!r}")
        if simulations <= 0:
            raise ValueError(f"simulations must be positive, got {simulations}")
    if stop is not None and not callable(getattr(stop, "is_set", None)):
        raise TypeError(f"stop must be a threading.Event, got {type(stop).__name__}")
    if callback is not None and not callable(callback):
        raise TypeError(f"callback must be callable (it receives a SearchProgress), got "
                        f"{type(callback).__name__}")
    _check_number("callback_every_s", callback_every_s, "seconds between progress reports",
                  allow_zero=True)


def _check_number(name, value, what, allow_zero=False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise TypeError(f"{name} must be a number ({what}), got {type(value).__name__} "
                        f"{value!r}")
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{name} must be a positive, finite number ({what}), got {value!r}")


def warm_start_plans(warm_start, analysis, mesh) -> list:
    """The warm-start plans, each checked to be a Plan of this analysis that fits the mesh."""
    if warm_start is None:
        return []
    if not isinstance(warm_start, Mapping):
        raise TypeError(f"warm_start must map names to Plans (e.g. tl.strategies.expert(an, "
                        f"mesh)), got {type(warm_start).__name__}")
    plans = []
    for name, plan in warm_start.items():
        if not isinstance(plan, Plan):
            raise TypeError(f"warm_start[{name!r}] is a {type(plan).__name__}, not a Plan")
        if plan.analysis is not analysis:
            raise PlanError(f"warm_start[{name!r}] was made for another analysis "
                            f"({plan.analysis!r}); build it from the analysis you search")
        try:
            plan.validate(mesh)
        except PlanError as err:
            raise PlanError(f"warm_start[{name!r}]: {err}") from None
        plans.append(plan)
    return plans


def budget_left(tracker, budget_s, simulations, stop) -> bool:
    if stop is not None and stop.is_set():
        return False
    if simulations is not None and tracker.sims >= simulations:
        return False
    if budget_s is not None and time.perf_counter() - tracker.start >= budget_s:
        return False
    return True
