"""tl.Lab: the session, its view model and the notebook widget, tied together.

    lab = tl.Lab(fn, *args, mesh=tl.Mesh({"data": 4, "model": 2}, device="h100"))
    lab                      # the widget (or its text, without ipywidgets)
    lab.pin("batch", "data"); lab.search(budget_s=30); lab.stop(); lab.export("plan.json")

Every change of the session — from a call here, a click in the widget, or the search thread —
rebuilds the view model and assigns it to the widget's `view` traitlet (and the per-op costs to
`op_costs`). Front-end events go to the session; whatever goes wrong in handling one becomes
the view's `error`, never a dead widget.

In a notebook, while the cost model's kernel still compiles (a first run from empty caches,
cost/_kernel/_ahead.py), the Lab does not wait for it: its first view comes at once, every
price pending (_pending.py), and a thread of its own builds the session once the compile is
done, replays what the person clicked meanwhile and sends the complete view. Whatever needs
the session (`plan`, `estimate`, `pin`, `search`, ...) waits for it, as it waited before.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
import traceback

import numpy as np

from ..analysis import analyze
from ..cost import compile_done, compile_running, compile_seconds, cost_model
from ..plan import Plan, PlanError
from ..program import trace
from ..progress import stage
from ._build import ViewBuilder
from ._scopes import ROOT
from ._session import PinError, Session
from ._chartfeed import ChartFeed
from ._pending import QUEUED, STARTING, Pending, status_line
from ._startup import building, in_kernel
from ._viewmodel import ViewModel

log = logging.getLogger("toast_lab.lab")

DEFAULT_BUDGET_S = 10.0
# How often a running search refreshes the view: a better plan, its counts alone (seconds).
PLAN_EVERY_S = 0.5
COUNTS_EVERY_S = 1.0


def op_costs_buffer(compute_s, comm_s) -> bytes:
    """The `op_costs` traitlet's bytes: little-endian float64 [compute_s, comm_s] per op."""
    a = np.empty((len(compute_s), 2), "<f8")
    a[:, 0], a[:, 1] = compute_s, comm_s
    return a.tobytes()


_FIELDS = {"name": "a class or conflict name", "group": "a scope path such as 'block*/attn'"}


def _field(event: dict, key: str):
    """`event[key]`, or a ValueError saying which field the event lacks and what it holds."""
    if key not in event:
        raise ValueError(f"the {event.get('event')!r} event has no {key!r} ({_FIELDS[key]}); "
                         f"it came as {event!r}. The front end and toast_lab may be of "
                         f"different versions: reinstall with `pip install .`")
    return event[key]


def _default_widget():
    """A LabView, or None where ipywidgets (or the view module) is not installed."""
    try:
        from ._widget import LabView
    except ImportError as err:
        log.info("toast-lab: no notebook widget (%s); showing text", err)
        return None
    return LabView()


class Lab:
    """The Lab on one program and mesh: see the module docstring.

    Options: plan (the starting Plan; default the fastest expert plan that fits, see
    Session), pins ({name: value} pinned from the start), group_layers / strict (for
    `analyze`), donate / overlap / memory_cap / seed (the session's), dim_names (for
    `trace`), expanded (group ids drawn open; default the root and the repeated layers),
    widget (a LabView-like object with `view`, `op_costs` and `on_event`; None builds a
    LabView when ipywidgets is installed, False shows no widget), progress (who is told of
    the construction's stages, tracing to the first view: a toast_lab.progress listener,
    False for nobody; None shows them in the running cell in a Jupyter kernel).
    """

    def __init__(self, fn, *args, mesh, plan=None, group_layers: bool = True,
                 strict: bool = False, dim_names=None, progress=None, **options):
        name = getattr(fn, "__name__", type(fn).__name__)
        with building(progress, f"building the Lab on {name}, {mesh}"):
            with stage("trace", "tracing the step") as run:
                program = trace(fn, *args, dim_names=dim_names)
                run.detail = f"{len(program.ops):,} ops"
            with stage("analysis", "analysing the dataflow") as run:
                analysis = analyze(program, group_layers=group_layers, strict=strict)
                run.detail = (f"{len(analysis.classes)} classes, "
                              f"{len(analysis.conflicts)} conflicts")
            self._setup(analysis, mesh, plan, **options)

    @classmethod
    def from_analysis(cls, analysis, mesh, plan=None, progress=None, **options) -> "Lab":
        """A Lab on an existing Analysis (no tracing); progress as for Lab(...)."""
        lab = cls.__new__(cls)
        with building(progress, f"building the Lab on {analysis.program.fn_name}, {mesh}"):
            lab._setup(analysis, mesh, plan, **options)
        return lab

    def _setup(self, analysis, mesh, plan=None, *, pins=None, donate: bool = True,
               overlap="scheduled", memory_cap: float | None = None, seed: int = 0,
               expanded=None, widget=None, progress_every_s: float = 0.2):
        options = dict(donate=donate, overlap=overlap, memory_cap=memory_cap, seed=seed,
                       progress_every_s=progress_every_s)  # the Session's
        self.builder = ViewBuilder(analysis, mesh)
        self._expanded = set(self.builder.default_expanded if expanded is None
                             else set(expanded) | {ROOT})
        self._error: str | None = None        # a crash of the view layer itself
        self._refreshed_at = 0.0
        self._refresh_lock = threading.RLock()
        self._events_lock = threading.RLock()  # one event at a time, queued ones first
        self._view: ViewModel | None = None
        self._lines = {"pricing": "", "charts": ""}  # the widget's progress line, by source
        self._feed = ChartFeed(self)
        self.widget = _default_widget() if widget is None else (widget or None)
        self._session: Session | None = None
        self._ready: concurrent.futures.Future = concurrent.futures.Future()  # the session
        self._pending: Pending | None = None
        if self.widget is not None and in_kernel() and compile_running():
            # a notebook, the kernel still compiling: the first view now, its prices later
            self._pending = Pending(analysis, mesh, plan, pins)
            self._building_line(status_line(compile_seconds()), "pricing")
        else:
            session = self._new_session(analysis, mesh, plan, pins, options)
            self._use(session)
            self._ready.set_result(session)
        if self.widget is not None:
            self.widget.on_event(self._on_event)
        with stage("first view", "drawing the first view" if self._pending is not None
                   else "pricing the choices and drawing the first view") as run:
            self.refresh()
            if self._pending is not None:
                run.detail = f"prices pending: {self._pending.status}"
        if self._pending is not None:
            threading.Thread(target=self._price_later, args=(plan, pins, options),
                             name="toast-lab pricing", daemon=True).start()
        if self.widget is not None and in_kernel():
            self._feed.prepare()

    def _new_session(self, analysis, mesh, plan, pins, options) -> Session:
        """The session: the cost model, the expert plans, the first plan."""
        with stage("cost model", "building the cost model and estimating the first plan"):
            # the first estimate compiles the cost model's kernel on a first run
            cost_model(analysis, mesh, options["donate"], options["overlap"]).estimate(
                Plan.replicated(analysis))
        # its stages: the expert plans, and a short search where none of them fits
        session = Session(analysis, mesh, plan, pins=pins, **options)
        session.expert_plans()
        return session

    def _use(self, session: Session) -> None:
        """Makes `session` the Lab's: from here on the view has prices."""
        with self._refresh_lock:
            self._session = session
        session.add_listener(self._on_change)

    def _price_later(self, plan, pins, options) -> None:
        """The pending Lab's setup, on a thread of its own: waits for the kernel's compile
        (the progress line counting its seconds), builds the session, replays the events
        queued meanwhile, and sends the complete view."""
        while not compile_done(timeout=1.0):
            self._building_line(status_line(compile_seconds()), "pricing")
        self._building_line(f"pricing: {STARTING}", "pricing")
        try:
            # (built outside the events' lock: a click meanwhile is queued, not kept waiting)
            session = self._new_session(self.builder.analysis, self.builder.mesh, plan, pins,
                                        options)
            with self._events_lock:
                self._use(session)
                queued, self._pending = self._pending.events, None
                for event in queued:
                    self._handle(event)
            self.refresh()
            self._ready.set_result(session)
        except BaseException as err:  # noqa: BLE001 - shown, and raised where it is waited for
            log.exception("toast-lab: the Lab could not price its plans")
            self._pending.status = f"the cost model could not be built ({type(err).__name__})"
            self._error = f"the Lab could not price its plans: {type(err).__name__}: {err}"
            self.refresh()
            self._ready.set_exception(err)
        finally:
            self._building_line("", "pricing")

    # --- the session, as a notebook uses it -------------------------------------------------------

    @property
    def session(self) -> Session:
        """The Session; while the kernel still compiles (see the module docstring), waits
        for it (and raises what kept it from being built)."""
        return self._ready.result()

    @property
    def pending(self) -> bool:
        """Whether the prices are still pending (the kernel compiling; see the module
        docstring)."""
        return self._pending is not None

    @property
    def analysis(self):
        return self.builder.analysis

    @property
    def mesh(self):
        return self.builder.mesh

    @property
    def plan(self):
        """The current Plan (pins included)."""
        return self.session.plan

    @property
    def estimate(self):
        """`tl.estimate` of the current plan."""
        return self.session.estimate

    @property
    def view(self) -> ViewModel:
        """The view model now drawn."""
        return self._view

    @property
    def expanded(self) -> frozenset[str]:
        return frozenset(self._expanded)

    def pin(self, name: str, value):
        """Pins a class to mesh axes (() replicated), a conflict to a resolution, or a
        decision beyond sharding ("remat@block" to "full", "micro_batches" to 4,
        "pipeline@block" to "stage:2" or "none"); raises PinError with the reason when
        refused (the widget shows it too)."""
        return self.session.pin(name, value)

    def unpin(self, name: str):
        return self.session.unpin(name)

    def set_plan(self, plan):
        """Makes `plan` current, e.g. an expert strategy: `lab.set_plan(experts["fsdp"])`."""
        return self.session.set_plan(plan)

    def search(self, budget_s: float | None = DEFAULT_BUDGET_S, background: bool = True,
               **options):
        """MCTS over what is not pinned; a Future of the SearchResult (or the result itself
        with background=False). The graph and estimates follow the best plan as it improves."""
        return self.session.search(budget_s, background=background, **options)

    def stop(self):
        """Stops the search within 0.2 s, keeping the best plan found; returns its result."""
        return self.session.stop()

    def wait(self, timeout: float | None = None):
        return self.session.wait(timeout)

    def export(self, path="plan.json", *, overwrite: bool = False):
        """Writes the plan file (with the estimate and this view model, for the JupyterLab
        viewer); `tl.Plan.load(path, lab.analysis)` gives `lab.plan` back. Atomic; replaces an
        earlier plan file, but any other file only with overwrite=True (see Session.export)."""
        self.session  # (waits for the prices: the file holds them)
        return self._export(path, overwrite)

    def _export(self, path, overwrite: bool = False):
        view = self._view.to_dict() if self._view is not None else None
        out = self._session.export(path, extra={"view": view} if view else None,
                                   overwrite=overwrite)
        self._session.notice = f"wrote {out}"
        self.refresh()
        return out

    def select(self, kind: str | None, id=None):
        """Selects an op, group, class, conflict or drawn edge (see Session.select); an op or
        an edge shows its collectives explained (`view.explained`)."""
        self.session  # (waits for the prices: an op's details show them)
        return self._select(kind, id)

    def _select(self, kind: str | None, id=None):
        if kind == "group" and str(id) not in self.builder.tree.groups:
            self._session.fail(f"no group {id!r}")
            raise ValueError(f"no group {id!r}; groups: {list(self.builder.tree.groups)[:20]}")
        if kind == "edge":
            edges = [e.id for e in self.builder.graph(self._expanded).edges]
            if str(id) not in edges:
                self._session.fail(f"no edge {id!r} is drawn")
                raise ValueError(f"no edge {id!r} is drawn; edges: {edges[:10]}")
        return self._session.select(kind, id)

    def toggle(self, group: str) -> bool:
        """Opens a collapsed group or closes an open one; returns whether it is open now."""
        if group not in self.builder.tree.groups:
            raise ValueError(f"no group {group!r}; groups: {list(self.builder.tree.groups)[:20]}")
        if group == ROOT:
            return True
        if group in self._expanded:
            self._expanded.discard(group)
        else:
            self._expanded.add(group)
            parent = self.builder.tree.groups[group].parent
            while parent:  # opening a group opens the groups around it
                self._expanded.add(parent)
                parent = self.builder.tree.groups[parent].parent
        self.refresh()
        return group in self._expanded

    # --- view ---------------------------------------------------------------------------------

    def refresh(self) -> ViewModel | None:
        """Rebuilds the view model and sends it to the widget. A failure shows as the view's
        error (the last good view stays drawn)."""
        with self._refresh_lock:
            try:
                if self._session is None:
                    pending = self._pending
                    vm = self.builder.build_unpriced(
                        pending.plan, self._expanded, pending.notice, pricing=pending.status,
                        start=pending.start, error=self._error or pending.refused)
                else:
                    vm = self.builder.build(self._session, self._expanded, error=self._error)
                costs = op_costs_buffer(*self.builder.op_costs)
            except Exception as err:  # noqa: BLE001 - the widget must outlive a bug
                log.exception("toast-lab: the view could not be rebuilt")
                self._error = f"the view could not be updated: {type(err).__name__}: {err}"
                self._push_error()
                return self._view
            self._view = vm
            self._refreshed_at = time.perf_counter()
            self._send(vm.to_dict(), costs)
            if self._feed.charts is not None:
                self._feed.update_later(vm)
            return vm

    def _send(self, doc: dict, costs: bytes | None) -> None:
        w = self.widget
        if w is None:
            return
        hold = getattr(w, "hold_sync", None)
        if hold is not None:
            with hold():
                if costs is not None:
                    w.op_costs = costs
                w.view = doc
        else:
            if costs is not None:
                w.op_costs = costs
            w.view = doc

    def _show_error(self, message: str) -> None:
        """Shows `message` as the view's error (the last good view stays drawn)."""
        with self._refresh_lock:
            self._error = message
            self._push_error()

    def _push_error(self) -> None:
        if self._view is None:
            return
        doc = self._view.to_dict()
        doc["error"] = self._error
        try:
            self._send(doc, None)
        except Exception:  # noqa: BLE001
            log.exception("toast-lab: could not show an error in the widget")

    def _on_change(self, change: str) -> None:
        # A running search reports several times a second. Each view costs the kernel a
        # rebuild (on the search's own thread) and the page a redraw and a new layout (on the
        # same cores): while it runs, a better plan goes out at most every PLAN_EVERY_S and
        # the counts alone every COUNTS_EVERY_S. Its end always goes out.
        if change in ("search", "plan") and self._session.search_state.running:
            wait = COUNTS_EVERY_S if change == "search" else PLAN_EVERY_S
            if time.perf_counter() - self._refreshed_at < wait:
                return
        self.refresh()

    def _on_event(self, event: dict) -> None:
        """One front-end message; the events are listed in _viewmodel.py's docstring. While
        the prices are pending, all but a toggle wait for them (_pending.py)."""
        with self._events_lock:
            name = event.get("event") if isinstance(event, dict) else None
            if self._session is None and name in QUEUED:
                self._pending.queue(event)
                self.refresh()
                return
            self._handle(event)

    def _handle(self, event: dict) -> None:
        name = event.get("event") if isinstance(event, dict) else None
        self._error = None
        session = self._session
        try:
            if name == "pin":
                session.pin(_field(event, "name"), event.get("value"))
            elif name == "unpin":
                session.unpin(_field(event, "name"))
            elif name == "toggle":
                self.toggle(_field(event, "group"))
            elif name == "select":
                self._select(event.get("kind"), event.get("id"))
            elif name == "search":
                budget = event.get("budget_s")
                session.search(float(budget) if budget else DEFAULT_BUDGET_S)
            elif name == "stop":
                session.stop()
            elif name == "export":
                self._export(event.get("path") or "plan.json")
            else:
                raise ValueError(f"unknown event {name!r}; events: pin, unpin, toggle, select, "
                                 f"search, stop, export")
        except PinError:
            pass  # the session shows the reason
        except (ValueError, KeyError, PlanError, RuntimeError, OSError) as err:
            self._report(f"{name}: {err}")
        except Exception as err:  # noqa: BLE001 - a bug: say so readably, keep going
            log.error("toast-lab: handling %r failed\n%s", event, traceback.format_exc())
            self._report(f"{name} failed: {type(err).__name__}: {err}")

    def _report(self, message: str) -> None:
        if self._session is None:
            self._show_error(message)
        else:
            self._session.fail(message)

    # --- display ------------------------------------------------------------------------------

    def to_text(self) -> str:
        return self._view.to_text() if self._view is not None else repr(self)

    @property
    def charts(self):
        """The live Bokeh charts (search progress against the expert strategies, memory per
        device against capacity), made on first use and then fed on every change; None where
        Bokeh or jupyter_bokeh is missing."""
        return self._feed.make()

    def _settle_charts(self, timeout: float = 10.0) -> bool:
        """Waits until the charts show the latest view (tests, benchmarks)."""
        return self._feed.settle(timeout)

    def _show_charts(self) -> None:
        """Displays the charts, up to date (ChartFeed.show)."""
        self._feed.show()

    def _building_line(self, text: str, source: str = "charts") -> None:
        """What the Lab is still doing once displayed, on the widget's progress line ("":
        nothing), for one `source` of work ("pricing", "charts"): the line says them all."""
        self._lines[source] = text
        if self.widget is not None and hasattr(self.widget, "progress"):
            self.widget.progress = " · ".join(t for t in self._lines.values() if t)

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        w = self.widget
        bundle = None
        if w is not None and hasattr(w, "_repr_mimebundle_"):
            bundle = w._repr_mimebundle_(include=include, exclude=exclude, **kwargs)
            if bundle:
                self._feed.show_after_the_cell()
        if not bundle:
            return {"text/plain": self.to_text()}
        if isinstance(bundle, tuple):  # (data, metadata)
            bundle[0]["text/plain"] = repr(self)
            return bundle
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        if self._session is None:  # (a display must not wait for the prices)
            status = "pricing failed" if self._ready.done() else f"pricing pending: " \
                f"{self._pending.status}"
            return f"Lab({self.analysis.program.fn_name!r} on {self.mesh}: {status})"
        est = self.estimate
        state = "searching" if self._session.running else "idle"
        return (f"Lab({self.analysis.program.fn_name!r} on {self.mesh}: {self.plan!r}; "
                f"{est.step_time_s * 1e3:.3f} ms/step, {est.peak_memory_bytes / 2**30:.2f} GiB"
                f" per device; {state})")
