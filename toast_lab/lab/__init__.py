"""Stage 10, the Lab (DESIGN.md §10): steer the partitioning of a program in a notebook.

Three layers, each usable alone:

- `Session` (no UI): analysis, mesh, plan, pins, estimate, search state and history, selection,
  one lock shared by the search thread and the UI; `pin`, `unpin`, `search(background=True)`,
  `stop`, `export`, and listeners told of every change.
- `ViewBuilder` -> `ViewModel`: a frozen, JSON-ready description of what to draw (the scope
  tree with repeated layers folded, the quotient graph coloured by class with collective
  badges and conflict marks, DOT for the browser's Graphviz, counterfactual prices of every
  choice — remat per layer group, the micro-batch count and pipeline stages among them —, a
  pipelined plan's schedule (`ScheduleView`: micro-batches over ticks per stage, the bubble,
  the hand-offs), op details, the export snippet, expert rows, the live bytes over the step),
  with a text rendering.
- `diff(a, b)` -> `PlanDiff`: which classes and conflicts two plans decide differently and
  what that does to step time, memory and collectives; drawn as the two plans side by side.
- `Lab`: both plus the notebook widget (`LabView`, TypeScript in labextension/), fed on every
  change; front-end events go back to the session.

Importing this package also registers `plan_display` with the plan stage, so `plan.save(...)`
and `display(plan)` carry the view model the JupyterLab extension draws without a kernel.
"""

from ..plan import register_display
from ._build import ViewBuilder, estimate_view
from ._diff import ClassChange, CollectiveChange, ConflictChange, PlanDiff, StepChange, diff
from ._lab import Lab, op_costs_buffer
from ._plan_display import plan_display
from ._scopes import ROOT, Group, ScopeTree, build_scope_tree
from ._session import Change, PinError, SearchState, Session
from ._start import Start
from ._viewmodel import (ChoiceView, ClassView, CollectiveView, ConflictView, DetailsView,
                         EdgeView, ExpertRow, ExplainedView, GraphView, GroupView, MemoryView,
                         NodeView, RemedyView, ScheduleView, SearchView, Selection, StartView,
                         StepDecisionView, TensorView, ViewModel)

__all__ = ["Lab", "Session", "PinError", "SearchState", "Change", "ViewBuilder", "ViewModel",
           "ClassView", "ConflictView", "ChoiceView", "GroupView", "GraphView", "NodeView",
           "EdgeView", "ExpertRow", "SearchView", "DetailsView", "TensorView", "Selection",
           "ScopeTree", "Group", "build_scope_tree", "ROOT", "estimate_view", "op_costs_buffer",
           "diff", "PlanDiff", "ClassChange", "ConflictChange", "CollectiveChange", "StepChange",
           "Start", "StartView", "CollectiveView", "ExplainedView", "RemedyView", "MemoryView",
           "StepDecisionView", "ScheduleView"]

# Plan files and display(plan) (stage 4) draw plans with this stage's view builder.
register_display(plan_display)
