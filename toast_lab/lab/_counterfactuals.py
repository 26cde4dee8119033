"""The price of every choice before it is made: each class's axes and each conflict's
resolutions, priced from the current plan with the incremental estimator.

A class's options are replication and every set of mesh axes (mesh order, major to minor). One
whose devices do not divide the class is refused with the reason. One that asks for an axis
another class already holds on tensors they share is allowed — the class decided first keeps the
axis there (Plan's rule) — and its `note` says so. Prices are exactly `tl.estimate` of the plan
with that one choice changed (tests hold this).
"""

from __future__ import annotations

from collections import Counter
from itertools import combinations

import numpy as np

from ..plan import PIPELINE_PREFIX, stack_pipeline
from ._viewmodel import ChoiceView


def class_options(mesh) -> list[tuple[str, ...]]:
    """Replicated, then every non-empty set of mesh axes in mesh order."""
    names = tuple(mesh.axis_names)
    out = [()]
    for m in range(1, 1 << len(names)):
        out.append(tuple(a for i, a in enumerate(names) if m >> i & 1))
    return out


def axes_label(axes) -> str:
    return "×".join(axes) if axes else "replicated"


def shared_values(analysis) -> Counter:
    """{(class a, class b): how many tensors have dims in both} (a < b)."""
    out: Counter = Counter()
    for dims in analysis.value_classes:
        cs = sorted({c for c in dims if c >= 0})
        for a, b in combinations(cs, 2):
            out[(a, b)] += 1
    return out


def refusal(analysis, mesh, cls, axes, plan=None, domain: str | None = None) -> str | None:
    """Why `cls` (a DimClass) cannot be sharded over `axes` (in `domain`: its override there),
    or None; under `plan`, also where its pipeline holds a mesh axis (stage_refusal)."""
    names = set(mesh.axis_names)
    unknown = [a for a in axes if a not in names]
    if unknown:
        return (f"the mesh has no axis {unknown[0]!r}; its axes are "
                f"{list(mesh.axis_names)}")
    if len(set(axes)) != len(axes):
        return f"{axes_label(axes)} uses a mesh axis twice on one dim"
    ways = int(np.prod([mesh.axis_size(a) for a in axes])) if axes else 1
    if cls.size % ways:
        return (f"{cls.name} has size {cls.size}, not divisible by the {ways} devices of "
                f"{axes_label(axes)}")
    return None if plan is None else stage_refusal(plan, cls, axes, domain)


def stage_refusal(plan, cls, axes, domain: str | None = None) -> str | None:
    """Why `plan`'s pipeline stages forbid `cls` on `axes`, or None: the stage axis holds the
    stack's layer class and nothing else (Plan.validate)."""
    p = plan.step.pipeline
    if p is None:
        return None
    an = plan.analysis
    layer = an.derived(("lab.stage_layer_class", p),
                       lambda: stack_pipeline(an, p).layer_class)
    name = f"{PIPELINE_PREFIX}{p.group}"
    if cls.id == layer and domain is None and tuple(axes) != (p.axis,):
        return (f"the stages of {name} hold {cls.name}, the stack's layer dim, on {p.axis} "
                f"alone; pin {name} to none first")
    if p.axis in axes and (cls.id != layer or domain is not None):
        return (f"mesh axis {p.axis} holds the stages of {name} and nothing else; pin {name} "
                f"to none first")
    return None


def first_decision_note(analysis, plan, cls, axes, shared: Counter) -> str | None:
    """What first-decision-wins does to `cls` on `axes` under `plan`, or None: per mesh axis,
    which classes decided earlier keep it on the tensors they share with `cls`, and which
    decided later lose it to `cls` (one clause each, so a choice's note stays one line)."""
    if not axes:
        return None
    order = [k for k, _ in plan.assignments]
    mine = order.index(cls.id) if cls.id in order else len(order)
    keep: dict[str, list[str]] = {}    # axis -> classes decided first that keep it
    lose: dict[str, list[str]] = {}    # axis -> classes decided later that lose it
    for pos, (k, other) in enumerate(plan.assignments):
        if k == cls.id or not other:
            continue
        common = [a for a in axes if a in other]
        if not common or not shared[(min(k, cls.id), max(k, cls.id))]:
            continue
        axis = "×".join(common)
        (keep if pos < mine else lose).setdefault(axis, []).append(analysis.classes[k].name)
    notes = []
    for axis, names in keep.items():
        verb = "keeps" if len(names) == 1 else "keep"
        notes.append(f"{_names(names)} (decided first) {verb} {axis} on the tensors shared "
                     f"with {cls.name}; {cls.name} is not sharded over {axis} there")
    for axis, names in lose.items():
        notes.append(f"{cls.name} is decided first: it takes {axis} from {_names(names)} on "
                     f"the tensors they share")
    return "; ".join(notes) or None


def unpriced_choice(value, current: bool = True, label: str | None = None) -> ChoiceView:
    """A class's axes or a conflict's resolution (`label`: in words) shown without a price
    (no mesh to price it on); a class without a mesh offers only its current axes."""
    if label is None:
        label = value if isinstance(value, str) else axes_label(value)
    return ChoiceView(label=label, value=value if isinstance(value, str) else tuple(value),
                      current=current, valid=True, reason=None, step_time_s=None,
                      peak_memory_bytes=None)


def _names(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def class_choices(analysis, mesh, model, plan, current, cls, shared: Counter, price: bool
                  ) -> tuple[ChoiceView, ...]:
    """The options of class `cls` with their prices from `plan` (current: its (step, peak))."""
    now = plan.axes_of(cls.id)
    options = class_options(mesh)
    priced: dict[tuple, tuple[float, float]] = {now: current}
    reasons = {axes: refusal(analysis, mesh, cls, axes, plan) for axes in options}
    valid = {axes: reasons[axes] is None for axes in options}
    if price:
        decided_replicated = any(k == cls.id and not v for k, v in plan.assignments)
        todo = [a for a in options if valid[a] and a != now]
        todo.sort(key=lambda a: not a)  # replicated last: un-sharding forgets the rank
        # its place in the decision order is kept, or the step is rewritten (remat,
        # micro-batches): price each plan whole
        if decided_replicated or not plan.step.is_default:
            for axes in todo:
                priced[axes] = model.price(plan.with_axes(cls.id, axes))
        elif todo:
            inc = model.incremental(plan)
            for axes in todo:
                priced[axes] = inc.set_axes(cls.id, axes)
    out = []
    for axes in options:
        step, peak = priced.get(axes, (None, None))
        out.append(ChoiceView(
            label=axes_label(axes), value=tuple(axes), current=axes == now, valid=valid[axes],
            reason=reasons[axes], step_time_s=step,
            peak_memory_bytes=peak,
            note=first_decision_note(analysis, plan, cls, axes, shared) if valid[axes] else None))
    return tuple(out)


def conflict_choices(analysis, model, plan, current, conflict, inc, price: bool,
                     words: dict) -> tuple[ChoiceView, ...]:
    """The resolutions of `conflict` with their prices (`inc`: an IncrementalEstimator of
    `plan`, shared by the conflicts and left as it was found), labelled by `words`
    ({resolution: ResolutionWords}) with what each does as its note."""
    now = plan.resolution_of(conflict.id)
    active = bool(plan.axes_of(conflict.class_id))
    idle = None if active else (f"{conflict.class_name} is replicated: nothing to resolve "
                                f"until it is sharded")
    out = []
    for j, res in enumerate(conflict.resolutions):
        step = peak = None
        if res == now or not active:
            step, peak = current
        elif price and inc is not None:
            step, peak = inc.set_resolution(conflict.id, j)
        elif price:
            step, peak = model.price(plan.with_resolution(conflict.id, res))
        out.append(ChoiceView(label=words[res].label, value=res, current=res == now,
                              valid=True, reason=None,
                              step_time_s=step if price or res == now else None,
                              peak_memory_bytes=peak if price or res == now else None,
                              note=idle or words[res].meaning))
    if price and inc is not None and active:
        inc.set_resolution(conflict.id, list(conflict.resolutions).index(now))
    return tuple(out)
