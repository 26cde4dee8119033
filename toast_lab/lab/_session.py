"""The Lab's session: the state a person steers, with no UI (DESIGN.md §10).

    s = Session(analysis, mesh)        # starts on the best expert plan that fits (s.start)
    s.pin("batch", ("data",))          # a class to mesh axes; () pins it replicated
    s.pin("seq@...", "keep_dim2")      # a conflict to a resolution
    s.unpin("batch")
    fut = s.search(budget_s=30)        # MCTS in a background thread over what is not pinned
    s.stop()                           # within 0.2 s, keeping the best plan found
    s.export("plan.json")              # Plan.load gives the same plan; the file has the estimate

How names and values of pins are read: _pins.py; the rules a pin follows: _pinning.py. Which
plan a session starts on: _start.py.

`plan` is always a valid plan and `estimate` is always `tl.estimate` of it. Every change (a pin,
a search's better plan, a refusal) is announced to the listeners, from whichever thread made it.
One re-entrant lock guards the state and every use of the cost model, so the search thread and
the UI never race.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..cost import cost_model
from ..plan import Plan, PlanError, check_analysis, check_mesh, write_plan_file
from ..plan_search import search as run_search
from ..progress import stage
from ..strategies import expert as expert_strategies
from . import _start
from ._counterfactuals import shared_values
from ._pinning import pinned, pins_of, unpinned, with_pins
from ._pins import PinError
from ._viewmodel import Selection, saved_view

log = logging.getLogger("toast_lab.lab")

SELECTION_KINDS = ("op", "group", "class", "conflict", "edge")
# Changes the history keeps: the start and the latest others. Each holds its Plan (about 2 KB
# on GPT-2), so a session pinned thousands of times stays small.
HISTORY_LIMIT = 256


@dataclass(frozen=True)
class SearchState:
    """The current or last search. history: (elapsed s, simulations, best step s, its peak
    bytes) per improvement. message: how it ended."""

    running: bool = False
    simulations: int = 0
    elapsed_s: float = 0.0
    sims_per_s: float = 0.0
    best_step_time_s: float | None = None
    history: tuple[tuple[float, float, float, float], ...] = ()
    message: str | None = None
    budget_s: float | None = None


@dataclass(frozen=True)
class Change:
    """One entry of the session's history: what changed, and the plan's price after it."""

    action: str                 # "start", "pin", "unpin", "search", "set"
    name: str | None
    value: object
    step_time_s: float
    peak_memory_bytes: float
    at_s: float                 # seconds since the session started
    plan: Plan = dataclasses.field(repr=False, compare=False)


class _LockedModel:
    """The cost model as the search thread sees it: each evaluation under the session lock."""

    def __init__(self, model, lock):
        self._model, self._lock = model, lock

    def step_and_peak(self, mask, rank, res):
        with self._lock:
            return self._model.step_and_peak(mask, rank, res)

    def estimate(self, plan):
        with self._lock:
            return self._model.estimate(plan)

    def price(self, plan):
        with self._lock:
            return self._model.price(plan)

    def for_step(self, step):
        # built without the lock (a new model of its own: seconds the UI need not wait);
        # evaluated under it
        return _LockedModel(self._model.for_step(step), self._lock)

    def __getattr__(self, name):
        return getattr(self._model, name)


class Session:
    """Analysis, mesh, plan, pins, estimate, search state and history, selection; see the
    module docstring.

    plan: the plan to start on; None starts on the fastest expert plan that fits (_start.py;
    `start` says which). pins: {name: value} fixed from the start, as `pin` takes them (the
    start is then the fastest expert plan they do not rule out, with them on top). Options:
    donate / overlap (the cost model's), memory_cap (bytes per device; default the device's
    memory), seed (of the first search; each next one adds 1), progress_every_s (how often a
    running search publishes its best plan). Raises PinError for a pin it refuses."""

    def __init__(self, analysis, mesh, plan: Plan | None = None, *, pins=None,
                 donate: bool = True, overlap="scheduled", memory_cap: float | None = None,
                 seed: int = 0, progress_every_s: float = 0.2):
        self.analysis = check_analysis(analysis, "tl.lab.Session")
        self.mesh = check_mesh(mesh, "tl.lab.Session")
        self.lock = threading.RLock()
        self.model = cost_model(analysis, mesh, donate, overlap)
        self.memory_cap = memory_cap
        self.seed = seed
        self.progress_every_s = progress_every_s
        self.shared = shared_values(analysis)
        if plan is not None and plan.analysis is not analysis:
            raise ValueError("the plan is for another analysis; build it from this one "
                             "(Plan.load(path, session.analysis))")
        self._expert_plans: dict | None = None  # {name: (Plan, Estimate)}, built once
        self._plan, self._estimate, self.start = self._first_plan(plan, dict(pins or {}))
        self.error: str | None = None       # the last refusal or failure, readable
        self.notice: str | None = None      # what the last action did besides the obvious
        self.selected: Selection | None = None
        self._search = SearchState()
        self._generation = 0                # which search may publish
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None
        self._future: concurrent.futures.Future | None = None
        self._listeners: list[Callable[[str], None]] = []
        self._started = time.perf_counter()
        self._history: list[Change] = []
        self._record("start", None, None)

    # --- what the UI reads --------------------------------------------------------------------

    @property
    def plan(self) -> Plan:
        with self.lock:
            return self._plan

    @property
    def estimate(self):
        """`tl.estimate` of the current plan (same cost model, same options)."""
        with self.lock:
            return self._estimate

    @property
    def pins(self) -> dict:
        """{class name: axes, conflict name: resolution} of the pinned decisions."""
        with self.lock:
            return pins_of(self._plan)

    @property
    def search_state(self) -> SearchState:
        with self.lock:
            return self._search

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def history(self) -> tuple[Change, ...]:
        """The session's start, then its latest changes, oldest first: HISTORY_LIMIT entries at
        most (older changes are dropped; `Change.plan` of each is the plan after it)."""
        with self.lock:
            return tuple(self._history)

    # --- decisions ------------------------------------------------------------------------------

    def pin(self, name: str, value) -> Plan:
        """Fixes a decision: a class to mesh axes (a name, a tuple; () or None: replicated), a
        conflict to one of its resolutions, "remat@<layer group>" to a remat policy,
        "micro_batches" to a count, "pipeline@<scanned stack>" to stages over a mesh axis
        ("stage:4"; "stage:4x2": circular, 2 runs of layers per stage; "none": no stages).
        The rules: _pinning.py. Raises PinError (and sets `error`) when refused.
        A running search is stopped first (its best plan kept): pins change what it explores."""
        stopped = self._stop_for_change()
        with self.lock:
            try:
                done = pinned(self.analysis, self.mesh, self._plan, name, value, self.shared)
            except PinError as err:
                self.error, self.notice, refused = str(err), None, err
            else:
                self._set_plan(done.plan)
                self.error, refused = None, None
                self.notice = "; ".join(n for n in (stopped, done.note) if n) or None
                self._record("pin", done.key, done.value)
        self._notify("plan" if refused is None else "error")
        if refused is not None:
            raise PinError(str(refused))
        return done.plan

    def unpin(self, name: str) -> Plan:
        """Releases a pinned decision; it keeps its current value until a search changes it."""
        stopped = self._stop_for_change()
        with self.lock:
            try:
                plan, key = unpinned(self.analysis, self._plan, name)
            except PinError as err:
                self.error, self.notice, refused = str(err), None, err
            else:
                self._set_plan(plan)
                self.error, self.notice, refused = None, stopped, None
                self._record("unpin", key, None)
        self._notify("plan" if refused is None else "error")
        if refused is not None:
            raise PinError(str(refused))
        return plan

    def set_plan(self, plan: Plan) -> Plan:
        """Makes `plan` (for this analysis, e.g. an expert strategy) the current plan, its pins
        included. Raises PlanError when it does not fit the mesh."""
        if plan.analysis is not self.analysis:
            raise PlanError("the plan is for another analysis; load it with "
                            "Plan.load(path, session.analysis)")
        plan = plan.with_mesh(self.mesh)
        stopped = self._stop_for_change()
        with self.lock:
            self._set_plan(plan)
            self.error, self.notice = None, stopped
            self._record("set", None, repr(plan))
        self._notify("plan")
        return plan

    def select(self, kind: str | None, id=None) -> Selection | None:
        """Selects an op (id: op id), group (scope path), class or conflict (id or name), or
        a drawn edge (its id, "op.3->op.7"); None clears. Raises ValueError for something that
        does not exist."""
        refused = None
        with self.lock:
            if kind is None:
                self.selected = None
            else:
                try:
                    self.selected = Selection(kind, self._selection_id(kind, id))
                    self.error = None
                except ValueError as err:
                    self.error = str(err)
                    refused = err
        # listeners run outside the lock (they take the view's lock, then this one)
        self._notify("error" if refused else "select")
        if refused is not None:
            raise refused
        return self.selected

    def fail(self, message: str) -> None:
        """Shows `message` as the session's error (the widget's crash reports use this)."""
        with self.lock:
            self.error = message
        self._notify("error")

    # --- search -----------------------------------------------------------------------------------

    def search(self, budget_s: float | None = 10.0, *, background: bool = True,
               simulations: int | None = None, seed: int | None = None):
        """Runs MCTS over the decisions that are not pinned, starting from the best of the
        current plan and the expert strategies (the answer is never worse than any of them
        under the same pins).

        background=True: returns a Future of the SearchResult at once; the best plan so far
        becomes the current plan as it improves (listeners hear "plan"), and `stop()` ends it.
        background=False: runs here and returns the SearchResult.
        """
        with self.lock:
            if self.running:
                self.error = "a search is already running: stop it first"
                refused = True
            else:
                refused = False
                self._generation += 1
                generation = self._generation
                pins, start = pins_of(self._plan), self._plan
                if seed is None:
                    seed = self.seed + generation - 1
                stop = self._stop = threading.Event()
                self._search = SearchState(running=True, budget_s=budget_s)
                self._future = future = concurrent.futures.Future()
                self.error = None
        if refused:
            self._notify("error")
            raise RuntimeError(self.error)
        self._notify("search")

        def run():
            try:
                result = run_search(
                    self.analysis, self.mesh, pins=pins, budget_s=budget_s,
                    simulations=simulations, seed=seed, memory_cap=self.memory_cap, stop=stop,
                    callback=lambda p: self._progress(generation, p),
                    callback_every_s=self.progress_every_s,
                    cost_model=_LockedModel(self.model, self.lock),
                    warm_start={**self._experts(), "current": start})
            except BaseException as err:  # noqa: BLE001 - shown to the person, never lost
                self._search_failed(generation, err)
                future.set_exception(err)
                return
            self._finish(generation, result)
            future.set_result(result)

        if not background:
            run()
            return future.result()
        self._thread = threading.Thread(target=run, name="toast-lab search", daemon=True)
        self._thread.start()
        return future

    def _experts(self) -> dict:
        """{name: Plan} of the expert strategies of this analysis and mesh."""
        return {name: plan for name, (plan, _) in self.expert_plans().items()}

    def expert_plans(self) -> dict:
        """{name: (Plan, Estimate)}: the expert strategies (tl.strategies.expert) of this
        analysis and mesh, with a recipe's remat and micro-batches where one does not fit
        under the session's memory cap, priced on the session's cost model (built once)."""
        with self.lock:
            if self._expert_plans is None:
                with stage("experts", "estimating the expert plans") as run:
                    plans = expert_strategies(self.analysis, self.mesh, self.memory_cap,
                                              self.model)
                    self._expert_plans = {name: (plan, self.model.estimate(plan))
                                          for name, plan in plans.items()}
                    run.detail = f"{len(plans)} plans"
            return self._expert_plans

    # --- the first plan -----------------------------------------------------------------------

    def _first_plan(self, plan: Plan | None, pins: dict):
        """(plan, its estimate, Start): `plan` with `pins`, or the start _start.py chooses."""
        if plan is not None:
            plan = with_pins(self.analysis, self.mesh, plan.with_mesh(self.mesh), pins)
            est = self.model.estimate(plan)
            return plan, est, _start.Start("your plan", "given", est.step_time_s,
                                          est.peak_memory_bytes, "the plan the session was given")
        wanted = pins_of(with_pins(self.analysis, self.mesh, Plan.replicated(self.analysis),
                                   pins))
        return _start.first_plan(self, wanted,
                                 lambda p: with_pins(self.analysis, self.mesh, p, pins))

    def stop(self, timeout: float = 5.0):
        """Ends a running search (within one simulation) and waits for it; the best plan found
        stays the current plan. Returns the SearchResult, or None when none ran."""
        thread, stop, future = self._thread, self._stop, self._future
        if stop is not None:
            stop.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
        if future is not None and future.done() and future.exception() is None:
            return future.result()
        return None

    def wait(self, timeout: float | None = None):
        """Waits for the running search to end; returns its SearchResult (None if none ran)."""
        future = self._future
        return None if future is None else future.result(timeout)

    def _stop_for_change(self) -> str | None:
        if not self.running:
            return None
        self.stop()
        return "the running search was stopped first (its best plan was kept)"

    def _progress(self, generation: int, p) -> None:
        with self.lock:
            if generation != self._generation:
                return
            s = self._search
            history = s.history
            improved = p.plan is not None and p.feasible and p.estimate is not None and (
                s.best_step_time_s is None or p.estimate.step_time_s < s.best_step_time_s)
            if improved:
                history = history + ((p.elapsed_s, float(p.simulations), p.estimate.step_time_s,
                                      p.estimate.peak_memory_bytes),)
                if p.plan != self._plan:
                    self._plan, self._estimate = p.plan, p.estimate
            self._search = dataclasses.replace(
                s, simulations=p.simulations, elapsed_s=p.elapsed_s, sims_per_s=p.sims_per_s,
                best_step_time_s=(p.estimate.step_time_s if improved else s.best_step_time_s),
                history=history)
        self._notify("plan" if improved else "search")

    def _finish(self, generation: int, result) -> None:
        with self.lock:
            if generation != self._generation:
                return
            if result.plan is not None:
                self._set_plan(result.plan, result.estimate)
                self.notice = result.message
            else:
                self.error = result.message
            self._search = SearchState(
                running=False, simulations=result.simulations, elapsed_s=result.elapsed_s,
                sims_per_s=result.simulations / max(result.elapsed_s, 1e-9),
                best_step_time_s=(result.estimate.step_time_s if result.estimate else None),
                history=tuple(tuple(float(x) for x in row) for row in result.history),
                message=result.message, budget_s=self._search.budget_s)
            self._record("search", None, result.simulations)
        self._notify("plan")

    def _search_failed(self, generation: int, err: BaseException) -> None:
        log.error("toast-lab: the search failed", exc_info=err)
        with self.lock:
            if generation == self._generation:
                self._search = dataclasses.replace(self._search, running=False,
                                                   message=f"failed: {err}")
                self.error = f"the search failed: {type(err).__name__}: {err}"
        self._notify("error")

    # --- export -------------------------------------------------------------------------------

    def export(self, path, extra: dict | None = None, *, overwrite: bool = False) -> Path:
        """Writes the current plan as a plan file with its estimate, the expert strategies and
        a view model, for JupyterLab to draw with no kernel; `Plan.load(path, analysis)` gives
        the same plan back. extra: sections added to the file; its "view" (the Lab's view
        model, as drawn) is the file's view, without the moment's error, notice and selection
        (without one, the view a Lab on this plan would show first).

        Like `plan.save`: written atomically; an earlier plan file (or an empty file) at `path`
        is replaced, any other file only with overwrite=True (else FileExistsError)."""
        with self.lock:
            plan, est = self._plan, self._estimate.to_dict()
        extra = dict(extra or {})
        view = extra.pop("view", None)
        doc = plan.to_dict(self.mesh, est, saved_view(view) if view is not None else None)
        doc.update(extra)
        return write_plan_file(doc, path, overwrite)

    # --- listeners ------------------------------------------------------------------------------

    def add_listener(self, fn: Callable[[str], None]) -> None:
        """Calls fn(change) after every change ("plan", "search", "select", "error"), in the
        thread that made it (the search thread for a search's progress), never while holding
        the session's lock."""
        self._listeners.append(fn)

    def remove_listener(self, fn: Callable[[str], None]) -> None:
        self._listeners.remove(fn)

    def _notify(self, change: str) -> None:
        for fn in list(self._listeners):
            try:
                fn(change)
            except Exception:  # a display must never break the session
                log.exception("toast-lab: a session listener failed on %r", change)

    # --- helpers ------------------------------------------------------------------------------

    def _set_plan(self, plan: Plan, estimate=None) -> None:
        self._plan = plan
        self._estimate = estimate if estimate is not None else self.model.estimate(plan)

    def _record(self, action, name, value) -> None:
        est = self._estimate
        self._history.append(Change(action, name, value, est.step_time_s,
                                    est.peak_memory_bytes, time.perf_counter() - self._started,
                                    self._plan))
        if len(self._history) > HISTORY_LIMIT:  # keep the start, drop the oldest change
            del self._history[1]

    def _selection_id(self, kind: str, id) -> str:
        an = self.analysis
        if kind not in SELECTION_KINDS:
            raise ValueError(f"cannot select a {kind!r}; choose one of {SELECTION_KINDS}")
        if kind == "op":
            try:
                op = int(id)
            except (TypeError, ValueError):
                raise ValueError(f"an op is selected by its id (an integer), got {id!r}") from None
            if not 0 <= op < len(an.program.ops):
                raise ValueError(f"no op {op}; the program has {len(an.program.ops)} ops")
            return str(op)
        if kind in ("class", "conflict"):
            items = an.classes if kind == "class" else an.conflicts
            for c in items:
                if str(c.id) == str(id) or c.name == id:
                    return str(c.id)
            raise ValueError(f"no {kind} {id!r}")
        return str(id)  # a group or a drawn edge: the view knows its scope tree and graph

    def __repr__(self) -> str:
        est = self.estimate
        state = "searching" if self.running else "idle"
        return (f"Session({self.analysis.program.fn_name!r} on {self.mesh}: {self.plan!r}; "
                f"{est.step_time_s * 1e3:.3f} ms/step, {est.peak_memory_bytes / 2**30:.2f} GiB"
                f"; {state})")
