"""The Lab before its prices: what it shows and keeps while the cost model's kernel compiles.

From empty caches numba compiles the kernel in about 40 s of CPU (cost/_kernel/_ahead.py
begins it at `import toast_lab`); tracing and analysing a model take seconds. So in a notebook
the Lab draws its first view without waiting for the compile: the graph, the classes and
conflicts, the decisions and the mesh, every price "–", and the status saying why
(`Pending.status`). The graph is coloured by an expert plan chosen without prices
(_start.unpriced: fsdp, with the pins on top), and the header says it is shown until priced.
What the person does meanwhile is kept in order (`events`) and replayed on the session once it
exists: a pin shows at once as pinned, and is priced (or refused, with the reason) then; a
Search starts then.
"""

from __future__ import annotations

import dataclasses

from ..analysis import DimClass
from ..plan import MICRO_BATCHES, PIPELINE_PREFIX, REMAT_PREFIX, Plan, PlanError
from ..strategies import expert
from ._counterfactuals import axes_label, refusal
from ._pins import PinError, decision, named, override, pin_axes
from ._session import _pins_of
from ._start import unpriced, unpriced_start
from ._step_choices import with_step

# What the view says while the kernel compiles; the widget's progress line adds the seconds.
COMPILING = "compiling the cost model"
COMPILE_NOTE = "about 40 s the first time; cached after"
# ... and once it is compiled, while the session prices the expert plans and the first plan.
STARTING = "estimating the expert plans and the first plan"
# The events that wait for the prices; a toggle (a group opened or closed) does not.
QUEUED = ("pin", "unpin", "select", "search", "stop", "export")


def status_line(elapsed_s: float | None) -> str:
    """The widget's progress line while the kernel compiles: "pricing: compiling the cost
    model, 12 s so far (about 40 s the first time; cached after)"."""
    so_far = "" if elapsed_s is None else f", {elapsed_s:.0f} s so far"
    return f"pricing: {COMPILING}{so_far} ({COMPILE_NOTE})"


class Pending:
    """The plan drawn before the prices (`plan`: the given plan, else the expert plan
    _start.unpriced chooses, with the pins; `start` says which, None for a given plan), the
    person's events since (`events`, oldest first) and what the view says about them
    (`notice`). Raises PinError for a starting pin the session would refuse too."""

    def __init__(self, analysis, mesh, plan: Plan | None = None, pins=None):
        if plan is not None and plan.analysis is not analysis:
            raise ValueError("the plan is for another analysis; build it from this one "
                             "(Plan.load(path, session.analysis))")
        self.analysis, self.mesh = analysis, mesh
        pins = dict(pins or {})
        self.plan = Plan.replicated(analysis) if plan is None else plan.with_mesh(mesh)
        for name, value in pins.items():
            self.plan = _pinned(self.plan, name, value, mesh)
        self.start = None
        if plan is None:
            self._start_on_expert(pins)
        self.status = f"{COMPILING} ({COMPILE_NOTE})"
        self.events: list[dict] = []

    def _start_on_expert(self, pins: dict) -> None:
        """Draws the expert plan _start.unpriced chooses, with `pins` on top, where there is
        one and the pins hold on it; else the replicated plan with the pins stays."""
        found = unpriced(expert(self.analysis, self.mesh, fit=False), _pins_of(self.plan))
        if found is None:
            return
        name, plan, overruled = found
        try:
            plan = plan.with_mesh(self.mesh)
            for pin, value in pins.items():
                plan = _pinned(plan, pin, value, self.mesh)
        except (PinError, PlanError):
            return  # a pin that holds only on the replicated plan: that plan it is
        self.plan, self.start = plan, unpriced_start(name, overruled)

    def queue(self, event: dict) -> None:
        """Keeps `event` for the session; a pin or unpin shows on the plan drawn now."""
        name = event.get("event")
        if name in ("search", "stop"):  # the last Search click or Stop decides
            self.events = [e for e in self.events if e.get("event") != "search"]
            if name == "stop":
                return
        self.events.append(event)
        try:
            if name == "pin":
                self.plan = _pinned(self.plan, event.get("name"), event.get("value"),
                                    self.mesh)
            elif name == "unpin":
                key = _key(self.analysis, event.get("name"))
                self.plan = dataclasses.replace(self.plan, pinned=self.plan.pinned - {key})
        except (PinError, PlanError, ValueError, TypeError):
            pass  # refused when replayed, with the session's reason

    @property
    def notice(self) -> str | None:
        """What waits for the prices, in words, or None."""
        words = [_words(e) for e in self.events]
        words = [w for w in words if w]
        if not words:
            return None
        return f"once the cost model is compiled: {'; '.join(words)}"


def _pinned(plan: Plan, name, value, mesh) -> Plan:
    """`plan` with `name` pinned to `value` as the session pins it, without pricing: the
    checks that need no cost model (names, axes, divisibility, resolutions)."""
    an = plan.analysis
    if isinstance(name, str) and named(an, name) is None and (
            name == MICRO_BATCHES or name.startswith((REMAT_PREFIX, PIPELINE_PREFIX))):
        try:
            plan = with_step(plan, name, value, mesh)
        except PlanError as err:
            raise PinError(f"cannot pin {name} to {value!r}: {err}") from None
        return dataclasses.replace(plan, pinned=plan.pinned | {name})
    found = override(an, name)
    cls = found[0] if found else decision(an, name)
    domain = found[1] if found else None
    if isinstance(cls, DimClass):
        axes = pin_axes(cls, value, mesh)
        why = refusal(an, mesh, cls, axes, plan, domain)
        if why:
            raise PinError(f"cannot pin {cls.name} to {axes_label(axes)}: {why}")
        return plan.with_axes(cls.id, axes, pin=True, domain=domain)
    if found:
        raise PinError(f"{cls.name!r} is a conflict: only a class takes axes per domain")
    if not isinstance(value, str) or value not in cls.resolutions:
        raise PinError(f"conflict {cls.name!r} has no resolution {value!r}; choose one of "
                       f"{list(cls.resolutions)}")
    return plan.with_resolution(cls.id, value, pin=True)


def _key(analysis, name) -> str:
    """The name a pin of `name` is kept under in `Plan.pinned`."""
    found = None if named(analysis, name) is not None else override(analysis, name)
    if found:
        return f"{found[0].name}@{found[1]}"
    c = named(analysis, name)
    return c.name if c is not None else str(name)


def _words(event: dict) -> str | None:
    name = event.get("event")
    if name == "pin":
        value = event.get("value")
        shown = axes_label(value) if isinstance(value, (list, tuple)) or value is None \
            else value
        return f"pin {event.get('name')} → {shown}"
    if name == "unpin":
        return f"unpin {event.get('name')}"
    if name == "search":
        budget = event.get("budget_s")
        return f"search{f' ({float(budget):g} s)' if budget else ''}"
    if name == "export":
        return f"export {event.get('path') or 'plan.json'}"
    return None  # a selection shows its details once priced; nothing to say before


__all__ = ["Pending", "status_line", "COMPILING", "COMPILE_NOTE", "STARTING", "QUEUED"]
