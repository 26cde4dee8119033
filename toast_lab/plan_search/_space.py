"""The decision space: one decision per class and per conflict, ordered by bytes at stake.

A class's choices are replication or a set of mesh axes whose device count divides its size
(axis order within a dim does not change the cost model, so sets are enough: mesh order, major
to minor). A conflict's choices are its resolutions; it matters only once its class is sharded,
so it comes right after that class and is skipped (choice 0) while the class is replicated.
Pins fix a decision's choice at the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from ..cost import PlanArrays, axis_bits, plan_arrays
from ..plan import Plan, PlanError

CLASS, CONFLICT = "class", "conflict"


@dataclass(frozen=True)
class Decision:
    kind: str                    # CLASS or CONFLICT
    index: int                   # class id or conflict id
    name: str
    choices: tuple               # CLASS: tuples of axis names; CONFLICT: resolution names
    masks: tuple[int, ...] = ()  # CLASS: the bit mask of each choice
    pinned: int = -1             # the pinned choice, or -1
    parent: int = -1             # CONFLICT: the position of its class's decision

    def label(self, choice: int) -> str:
        c = self.choices[choice]
        if self.kind == CLASS:
            return "replicated" if not c else "x".join(c)
        return c


class Space:
    """Decisions in search order, with conversions from a choice vector to plans and arrays."""

    def __init__(self, analysis, mesh, pins: Mapping | None = None):
        self.analysis = analysis
        self.mesh = mesh
        names = tuple(mesh.axis_names)
        bit = axis_bits(mesh)
        pins = dict(pins or {})
        self._check_pins(pins)
        conflicts_of: dict[int, list] = {}
        for c in analysis.conflicts:
            conflicts_of.setdefault(c.class_id, []).append(c)
        decisions: list[Decision] = []
        for cls in sorted(analysis.classes, key=lambda c: (-c.bytes, c.id)):
            choices = [()]
            for m in range(1, 1 << len(names)):
                axes = tuple(a for i, a in enumerate(names) if m >> i & 1)
                ways = int(np.prod([mesh.axis_size(a) for a in axes]))
                if cls.size % ways == 0:
                    choices.append(axes)
            masks = tuple(sum(bit[a] for a in axes) for axes in choices)
            pinned = -1
            if cls.name in pins:
                want = _axes(pins[cls.name])
                key = sum(bit.get(a, 0) for a in want)
                unknown = [a for a in want if a not in bit]
                if unknown:
                    raise PlanError(f"pin {cls.name}={want}: the mesh has no axes {unknown}; "
                                    f"its axes are {list(names)}")
                if key not in masks:
                    ways = int(np.prod([mesh.axis_size(a) for a in want]))
                    raise PlanError(f"pin {cls.name}={want}: class {cls.name!r} has size "
                                    f"{cls.size}, not divisible by the {ways} devices of {want}")
                pinned = masks.index(key)
            if len(choices) == 1 and pinned < 0:
                continue  # nothing divides: always replicated
            pos = len(decisions)
            decisions.append(Decision(CLASS, cls.id, cls.name, tuple(choices), masks, pinned))
            for c in conflicts_of.get(cls.id, ()):
                pinned_res = -1
                if c.name in pins:
                    if pins[c.name] not in c.resolutions:
                        raise PlanError(f"pin {c.name}={pins[c.name]!r}: choose one of "
                                        f"{list(c.resolutions)}")
                    if decisions[pos].pinned == 0:
                        raise PlanError(
                            f"contradictory pins: conflict {c.name!r} is pinned to "
                            f"{pins[c.name]!r} but its class {cls.name!r} is pinned replicated, "
                            f"so the conflict never arises; drop one of the two pins")
                    pinned_res = c.resolutions.index(pins[c.name])
                decisions.append(Decision(CONFLICT, c.id, c.name, tuple(c.resolutions), (),
                                          pinned_res, parent=pos))
        self.decisions = tuple(decisions)
        self.num_choices = np.array([len(d.choices) for d in decisions], np.int64)
        self.pinned = np.array([d.pinned for d in decisions], np.int64)

    def _check_pins(self, pins: Mapping) -> None:
        an = self.analysis
        known = {c.name for c in an.classes} | {c.name for c in an.conflicts}
        unknown = [p for p in pins if p not in known]
        if unknown:
            raise PlanError(f"pins name no class or conflict: {unknown}; classes: "
                            f"{[c.name for c in an.classes]}")

    @property
    def size(self) -> float:
        """How many complete plans the space holds (pins fixed; conflicts count only where
        their class can be sharded)."""
        total = 1.0
        for d in self.decisions:
            if d.pinned >= 0:
                continue
            total *= len(d.choices)
        return total

    def skipped(self, choices, position: int) -> bool:
        """A conflict whose class is replicated in `choices` has nothing to decide."""
        d = self.decisions[position]
        return d.kind == CONFLICT and choices[d.parent] == 0

    def arrays(self, choices) -> PlanArrays:
        """(class masks, class ranks, conflict resolutions) for the cost model's kernel."""
        decisions = list(zip(self.decisions, choices))
        return plan_arrays(self.analysis,
                           ((d.index, d.masks[c]) for d, c in decisions if d.kind == CLASS),
                           ((d.index, c) for d, c in decisions if d.kind == CONFLICT))

    def plan(self, choices) -> Plan:
        plan = Plan.replicated(self.analysis, self.mesh)
        pinned = []
        for d, c in zip(self.decisions, choices):
            if d.pinned >= 0:
                pinned.append(d.name)
            if d.kind == CLASS:
                if c:
                    plan = plan.with_axes(d.index, d.choices[c])
            elif choices[d.parent]:
                plan = plan.with_resolution(d.index, d.choices[c])
        return plan.pin(*pinned) if pinned else plan

    def choices_of(self, plan: Plan) -> np.ndarray:
        """The choice vector of a plan (plans outside the space snap to the nearest choice)."""
        out = np.zeros(len(self.decisions), np.int64)
        bit = axis_bits(self.mesh)
        for pos, d in enumerate(self.decisions):
            if d.kind == CLASS:
                m = sum(bit[a] for a in plan.axes_of(d.index))
                out[pos] = d.masks.index(m) if m in d.masks else 0
            else:
                out[pos] = d.choices.index(plan.resolution_of(d.index))
        return out


def _axes(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)
