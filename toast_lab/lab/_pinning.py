"""The rules a pin follows, on a plan alone: which decision a name means, whether the value
is allowed there, and the plan with it pinned. No cost model is needed, so the Session
(_session.py) and the Lab's view before its prices (_pending.py) pin by the same rules.

How a pin's name and value are read: _pins.py. A refused pin raises PinError with the reason.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..analysis import Conflict, DimClass
from ..plan import (MICRO_BATCHES, PIPELINE_PREFIX, REMAT_PREFIX, Plan, PlanError,
                    parse_pipeline, stack_pipeline)
from . import _pins
from ._counterfactuals import axes_label, first_decision_note, refusal
from ._pins import PinError
from ._step_choices import step_value


@dataclass(frozen=True)
class Pinned:
    """A pin applied: the plan, the name it is kept under in `Plan.pinned` (key), the value
    the history records, and what to tell the person besides (note, or None)."""

    plan: Plan
    key: str
    value: object
    note: str | None = None


def is_step(analysis, name) -> bool:
    """`name` names a decision beyond sharding ("remat@<group>", "micro_batches",
    "pipeline@<group>"), not a class or conflict called so."""
    if not isinstance(name, str) or _pins.named(analysis, name) is not None:
        return False
    return name == MICRO_BATCHES or name.startswith((REMAT_PREFIX, PIPELINE_PREFIX))


def pinned(analysis, mesh, plan: Plan, name, value, shared=None) -> Pinned:
    """`plan` with decision `name` pinned to `value`: a class to mesh axes, "<class>@<domain>"
    to axes in one domain, a conflict to a resolution, or a step decision (see Session.pin).
    shared: _counterfactuals.shared_values, for the note on a class decided first (None: no
    note). PinError where refused."""
    if is_step(analysis, name):
        return Pinned(_step(analysis, mesh, plan, name, value), name, value)
    found = _pins.override(analysis, name)
    if found:
        cls, domain = found
        plan = _override(analysis, mesh, plan, cls, domain, value)
        return Pinned(plan, f"{cls.name}@{domain}", plan.axes_of(cls.id, domain))
    decision = _pins.decision(analysis, name)
    if isinstance(decision, DimClass):
        plan, note = _class(analysis, mesh, plan, decision, value, shared)
        return Pinned(plan, decision.name, plan.axes_of(decision.id), note)
    plan, note = _conflict(analysis, plan, decision, value)
    return Pinned(plan, decision.name, plan.resolution_of(decision.id), note)


def with_pins(analysis, mesh, plan: Plan, pins: dict) -> Plan:
    """`plan` with each of `pins` ({name: value}) pinned, in order (PinError if refused)."""
    for name, value in pins.items():
        plan = pinned(analysis, mesh, plan, name, value).plan
    return plan


def pin_key(analysis, name) -> str:
    """The name a pin of `name` is kept under in `Plan.pinned` (PinError: no such decision)."""
    if is_step(analysis, name):
        return name
    found = _pins.override(analysis, name)
    if found:
        return f"{found[0].name}@{found[1]}"
    return _pins.decision(analysis, name).name


def unpinned(analysis, plan: Plan, name) -> tuple[Plan, str]:
    """(`plan` with the pin of `name` released, its key); the decision keeps its value.
    PinError where it is not pinned."""
    key = pin_key(analysis, name)
    if key not in plan.pinned:
        raise PinError(f"{key!r} is not pinned; pinned: {sorted(plan.pinned) or 'nothing'}")
    return dataclasses.replace(plan, pinned=plan.pinned - {key}), key


def pins_of(plan: Plan) -> dict:
    """{name: axes or resolution} of the pinned decisions, as `tl.search(pins=)` takes them:
    the classes in the plan's decision order (the search ranks pinned classes in the order
    given, and the plan's order is the one the person built), then the rest by name."""
    an = plan.analysis
    ranked = [an.classes[k].name for k, _ in plan.assignments]
    ranked = [n for n in ranked if n in plan.pinned]
    out = {}
    for name in ranked + sorted(plan.pinned - set(ranked)):
        if is_step(an, name):
            out[name] = step_value(plan, name)
            continue
        try:
            out[name] = plan.axes_of(name)
        except PlanError:
            out[name] = plan.resolution_of(name)
    return out


def _override(analysis, mesh, plan, cls, domain: str, value) -> Plan:
    if not isinstance(cls, DimClass):
        raise PinError(f"{cls.name!r} is a conflict: only a class takes axes per domain")
    axes = _pins.pin_axes(cls, value, mesh)
    why = refusal(analysis, mesh, cls, axes, plan, domain)
    if why:
        raise PinError(f"cannot pin {cls.name}@{domain} to {axes_label(axes)}: {why}")
    return plan.with_axes(cls.id, axes, pin=True, domain=domain)


def _class(analysis, mesh, plan, cls: DimClass, value, shared):
    axes = _pins.pin_axes(cls, value, mesh)
    why = refusal(analysis, mesh, cls, axes, plan)
    if why:
        raise PinError(f"cannot pin {cls.name} to {axes_label(axes)}: {why}")
    if not axes:
        for c in analysis.conflicts:
            if c.class_id == cls.id and c.name in plan.pinned:
                raise PinError(
                    f"contradictory pins: conflict {c.name!r} is pinned to "
                    f"{plan.resolution_of(c)!r}, which only matters while {cls.name} is "
                    f"sharded; unpin the conflict first, or pin {cls.name} to mesh axes")
    note = None if shared is None else first_decision_note(analysis, plan, cls, axes, shared)
    return plan.with_axes(cls.id, axes, pin=True), note


def _conflict(analysis, plan, conflict: Conflict, value):
    if not isinstance(value, str) or value not in conflict.resolutions:
        raise PinError(f"conflict {conflict.name!r} has no resolution {value!r}; choose "
                       f"one of {list(conflict.resolutions)}")
    cls = analysis.classes[conflict.class_id]
    axes = plan.axes_of(cls.id)
    if not axes and cls.name in plan.pinned:
        raise PinError(f"contradictory pins: {cls.name} is pinned replicated, so conflict "
                       f"{conflict.name!r} never arises; pin {cls.name} to mesh axes first")
    note = None if axes else (f"{cls.name} is replicated now: this resolution applies once "
                              f"it is sharded")
    return plan.with_resolution(conflict.id, value, pin=True), note


def _step(analysis, mesh, plan, name: str, value) -> Plan:
    """`plan` with step decision `name` pinned to `value`."""
    try:
        if name == MICRO_BATCHES:
            plan = plan.with_micro_batches(value, pin=True)
        elif name.startswith(PIPELINE_PREFIX):
            plan = _pipeline(analysis, mesh, plan, name[len(PIPELINE_PREFIX):], value)
        else:
            plan = plan.with_remat(name[len(REMAT_PREFIX):], value, pin=True)
        plan.validate(mesh)
    except PlanError as err:
        raise PinError(f"cannot pin {name} to {value!r}: {err}") from None
    return plan


def _pipeline(analysis, mesh, plan, group: str, value) -> Plan:
    """`plan` with "pipeline@<group>" pinned to `value` (a Pipeline, "<axis>:<stages>",
    "<axis>:<stages>x<runs>" for a circular schedule, "<axis>" or "none"). The stage axis
    holds the stages alone: a class pinned to it is a contradiction, named; classes the
    person left to the search lose it."""
    name = f"{PIPELINE_PREFIX}{group}"
    try:
        pipeline = parse_pipeline(group, value, mesh)
    except ValueError as err:
        raise PinError(f"cannot pin {name} to {value!r}: {err}") from None
    if pipeline is None:
        plan = plan.without_pipeline()
        return dataclasses.replace(plan, pinned=plan.pinned | {name})
    try:
        layer = analysis.classes[stack_pipeline(analysis, pipeline).layer_class]
    except ValueError as err:
        raise PinError(f"cannot pin {name} to {value!r}: {err}") from None
    size = mesh.axis_size(pipeline.axis)
    if size != pipeline.stages:  # (before the layers' class is put on it)
        raise PinError(f"cannot pin {name} to {value!r}: {pipeline.stages} stages over mesh "
                       f"axis {pipeline.axis!r} need an axis of that size; it has {size} "
                       f"devices")
    held = _stage_pins(plan, pipeline.axis, layer)
    if held:
        raise PinError(f"contradictory pins: {name}={pipeline} puts the stages alone on mesh "
                       f"axis {pipeline.axis!r} (with class {layer.name!r}, the layers), "
                       f"and {', '.join(held)} {'is' if len(held) == 1 else 'are'} pinned "
                       f"otherwise; unpin {'it' if len(held) == 1 else 'them'} first")
    return plan.with_pipeline(group, pipeline.axis, pipeline.stages, pipeline.schedule,
                              pin=True, chunks=pipeline.chunks)


def _stage_pins(plan: Plan, axis: str, layer: DimClass) -> list[str]:
    """The pins of `plan` that stages over `axis` would break ("batch=data×stage"): a class
    or override pinned to axes with `axis` in them, or the layers' class `layer` pinned to
    anything but `axis` alone."""
    an = plan.analysis
    out = []
    for c in an.classes:
        if c.name not in plan.pinned:
            continue
        axes = tuple(plan.axes_of(c.id))
        if (axes != (axis,)) if c.id == layer.id else (axis in axes):
            out.append(f"{c.name}={'×'.join(axes) or 'replicated'}")
    for k, domain, axes in plan.overrides:
        name = f"{an.classes[k].name}@{domain}"
        if name in plan.pinned and axis in axes:
            out.append(f"{name}={'×'.join(axes)}")
    return out


__all__ = ["Pinned", "pinned", "with_pins", "pin_key", "unpinned", "is_step", "pins_of"]
