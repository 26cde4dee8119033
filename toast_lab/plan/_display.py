"""What a plan looks like beyond its decisions: the view model the JupyterLab extension draws,
the estimate and the expert strategies beside it. Plan files (format 2) and `display(plan)`
carry them, so a plan renders without a kernel.

Building them needs the cost model (stage 6), the expert strategies (stage 7) and the Lab's
view builder (stage 10), all later than this stage. So the Lab registers its builder here when
it is imported (`register_display`), and this stage only calls what was registered: no upward
import. Where none is (a trimmed install, or the builder failed), a plan file carries the
decisions alone, as format 1 did, and says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

from . import _planfile

log = logging.getLogger("toast_lab.plan")


@dataclass(frozen=True)
class PlanDisplay:
    """What a plan looks like on a mesh, as JSON-ready dicts.

    view: the view model (toast_lab/lab/_viewmodel.py) or None. estimate: the estimate as the
    view shows it (Estimate.to_dict() plus communication by mesh axes) or None without a mesh.
    experts: the expert strategies on the same cost model, rows of {name, step_time_s,
    peak_memory_bytes, feasible, classes}. note: what is missing and why, or None.
    """

    view: dict | None = None
    estimate: dict | None = None
    experts: list = field(default_factory=list)
    note: str | None = None


PLAN_MIME = "application/vnd.toast-lab.plan+json"

Builder = Callable[..., PlanDisplay]
_builder: list[Builder] = []  # the one registered builder, if any


def register_display(builder: Builder | None) -> None:
    """Installs `builder(plan, mesh) -> PlanDisplay` (mesh may be None); None removes it."""
    _builder.clear()
    if builder is not None:
        _builder.append(builder)


def display_of(plan, mesh) -> PlanDisplay:
    """`plan` drawn on `mesh` (None: the graph and decisions without prices) by the registered
    builder. Never raises: a failure becomes the note, and the plan is still written/shown."""
    if not _builder:
        return PlanDisplay(note="no view builder is installed (toast_lab.lab could not be "
                                "imported), so there is no graph to draw")
    try:
        return _builder[0](plan, mesh)
    except Exception as err:  # noqa: BLE001 - a drawing bug must not lose the plan
        log.warning("toast-lab: the plan's view could not be built", exc_info=True)
        return PlanDisplay(note=f"the view could not be built ({type(err).__name__}: {err})")


def mime_bundle(plan) -> dict:
    """`display(plan)`'s output: {PLAN_MIME: {"plan": the plan file's document without its
    view, "view": the view model, "note": what is missing}, "text/plain": what it is}. The
    output alone is enough to draw it again (a saved notebook, no kernel, no toast-lab)."""
    shown = display_of(plan, plan.mesh)
    doc = _planfile.plan_to_dict(plan, plan.mesh, shown.estimate, shown.experts)
    data = {"plan": doc, "view": shown.view}
    if shown.note:
        data["note"] = shown.note
    return {PLAN_MIME: data, "text/plain": plan_text(doc, shown.note)}


def plan_text(doc: dict, note: str | None = None) -> str:
    """A plan document as a few lines: program, mesh, decisions, estimate, best expert."""
    prog, mesh, est = doc["program"], doc.get("mesh"), doc.get("estimate")
    on = (" on " + " × ".join(f"{a}={n}" for a, n in mesh["axes"].items())
          + f" ({mesh['device']})") if mesh else " (no mesh)"
    classes = ", ".join(f"{c} → {'×'.join(a)}" for c, a in doc["classes"].items() if a)
    lines = [f"toast-lab plan for {prog['name']}{on}",
             f"  classes:   {classes or 'all replicated'}"]
    if doc["conflicts"]:
        lines.append("  conflicts: " + ", ".join(f"{c}: {r}" for c, r in doc["conflicts"].items()))
    if est:
        fits = "fits" if est.get("feasible") else "DOES NOT FIT"
        lines.append(f"  estimate:  {est['step_time_s'] * 1e3:.3f} ms per step, peak "
                     f"{est['peak_memory_bytes'] / 2**30:.2f} GiB of "
                     f"{est['memory_capacity_bytes'] / 2**30:.2f} GiB per device ({fits})")
    rows = sorted((r for r in doc.get("experts", []) if r["feasible"]),
                  key=lambda r: r["step_time_s"])
    if rows:
        lines.append("  experts:   " + ", ".join(
            f"{r['name']} {r['step_time_s'] * 1e3:.3f} ms" for r in rows[:4]))
    if note:
        lines.append(f"  ({note})")
    lines.append("  The graph and decisions render in JupyterLab with toast-lab's extension "
                 "(pip install toast-lab).")
    return "\n".join(lines)


__all__ = ["PlanDisplay", "register_display", "display_of", "mime_bundle", "plan_text",
           "PLAN_MIME"]
