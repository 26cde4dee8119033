"""The Lab before its prices: what it shows and keeps while the cost model's kernel compiles.

From empty caches numba compiles the kernel in about 40 s of CPU (cost/_kernel/_ahead.py
begins it at `import toast_lab`); tracing and analysing a model take seconds. So in a notebook
the Lab draws its first view without waiting for the compile: the graph, the classes and
conflicts, the decisions and the mesh, every price "–", and the status saying why
(`Pending.status`). The graph is coloured by an expert plan chosen without prices
(_start.unpriced: fsdp, with the pins on top), and the header says it is shown until priced.
What the person does meanwhile is kept in order (`events`) and replayed on the session once it
exists: a pin shows at once as pinned, and is priced then, or is refused at once by the rules
the session pins by (_pinning.py, which need no prices); a Search starts then.
"""

from __future__ import annotations

from ..plan import Plan, PlanError
from ..strategies import expert
from ._counterfactuals import axes_label
from ._pinning import pinned, pins_of, unpinned, with_pins
from ._pins import PinError
from ._start import unpriced, unpriced_start

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
        start = Plan.replicated(analysis) if plan is None else plan.with_mesh(mesh)
        self.plan = with_pins(analysis, mesh, start, pins)
        self.start = None
        if plan is None:
            self._start_on_expert(pins)
        self.status = f"{COMPILING} ({COMPILE_NOTE})"
        self.events: list[dict] = []
        self.refused: str | None = None  # why the last pin or unpin was refused

    def _start_on_expert(self, pins: dict) -> None:
        """Draws the expert plan _start.unpriced chooses, with `pins` on top, where there is
        one and the pins hold on it; else the replicated plan with the pins stays."""
        found = unpriced(expert(self.analysis, self.mesh, fit=False), pins_of(self.plan))
        if found is None:
            return
        name, plan, overruled = found
        try:
            plan = with_pins(self.analysis, self.mesh, plan.with_mesh(self.mesh), pins)
        except (PinError, PlanError):
            return  # a pin that holds only on the replicated plan: that plan it is
        self.plan, self.start = plan, unpriced_start(name, overruled)

    def queue(self, event: dict) -> None:
        """Keeps `event` for the session; a pin or unpin shows on the plan drawn now, or is
        refused at once (`refused` says why) by the session's own rules (_pinning.py)."""
        name = event.get("event")
        if name in ("search", "stop"):  # the last Search click or Stop decides
            self.events = [e for e in self.events if e.get("event") != "search"]
            if name == "stop":
                return
        self.refused = None
        try:
            if name == "pin":
                self.plan = pinned(self.analysis, self.mesh, self.plan, event.get("name"),
                                   event.get("value")).plan
            elif name == "unpin":
                self.plan = unpinned(self.analysis, self.plan, event.get("name"))[0]
        except PinError as err:  # the session's own rules: it would refuse it too
            self.refused = str(err)
            return
        except (PlanError, ValueError, TypeError):
            pass  # a malformed event: the session says what is wrong when it is replayed
        self.events.append(event)

    @property
    def notice(self) -> str | None:
        """What waits for the prices, in words, or None."""
        words = [_words(e) for e in self.events]
        words = [w for w in words if w]
        if not words:
            return None
        return f"once the cost model is compiled: {'; '.join(words)}"


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
