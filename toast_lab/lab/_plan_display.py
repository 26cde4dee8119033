"""A plan drawn without a Lab: its view model, estimate and expert rows, for plan files and
`display(plan)`. `toast_lab.lab` registers `plan_display` with the plan stage when imported
(see toast_lab/plan/_display.py: the plan stage cannot import this one).

With a mesh, the view is what a Lab on that plan shows at first (a session on the plan, the
default open groups); without one, the graph coloured by the plan and its decisions, unpriced.
"""

from __future__ import annotations

import threading

from ..plan import PlanDisplay
from ._build import ViewBuilder
from ._session import Session
from ._viewmodel import saved_view

NO_MESH = ("no mesh: the graph and decisions are shown without an estimate; "
           "plan.with_mesh(tl.Mesh({...}, device=...)) prices them")

_CACHE_SIZE = 4  # view builders kept: (analysis, mesh) pairs a notebook displays plans for
_cache: list[tuple[object, object, ViewBuilder]] = []
_lock = threading.Lock()


def builder_for(analysis, mesh) -> ViewBuilder:
    """A ViewBuilder for (analysis, mesh), reused: the scope tree, the dataflow index and the
    expert rows are built once per pair, not once per plan shown."""
    with _lock:
        for i, (a, m, b) in enumerate(_cache):
            if a is analysis and (m is mesh or (m is not None and m == mesh)):
                _cache.append(_cache.pop(i))
                return b
        b = ViewBuilder(analysis, mesh)
        _cache.append((analysis, mesh, b))
        del _cache[:-_CACHE_SIZE]
        return b


def plan_display(plan, mesh) -> PlanDisplay:
    """`plan` drawn on `mesh` (or without one): see the module docstring."""
    builder = builder_for(plan.analysis, mesh)
    if mesh is None:
        view = builder.build_unpriced(plan, notice=NO_MESH).to_dict()
        return PlanDisplay(view=view, estimate=None, experts=[], note=NO_MESH)
    session = Session(plan.analysis, mesh, plan)
    view = saved_view(builder.build(session).to_dict())
    return PlanDisplay(view=view, estimate=view["estimate"], experts=view["experts"])


__all__ = ["plan_display", "builder_for", "NO_MESH"]
