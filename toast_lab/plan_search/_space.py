"""The decision space: one decision per class and per conflict, ordered by bytes at stake, and
per-domain overrides where they matter.

A class's choices are replication or a set of mesh axes whose device count divides its size
(axis order within a dim does not change the cost model, so sets are enough: mesh order, major
to minor). A conflict's choices are its resolutions; it matters only once its class is sharded,
so it comes right after that class and is skipped (choice 0) while the class is replicated.

An override decision (kind OVERRIDE) sets a class's axes in one domain of the step (parameters
or optimizer state, see analysis/_domains.py): choice 0 keeps the class's own axes there, the
others are replication or a set of mesh axes. Offering one per class and domain would double
the tree's depth and multiply the space by (1 + 2^axes) per decision, for little: a space
offers them for the `override_classes` classes with the most bytes in each of those domains
(the search asks for OVERRIDE_CLASSES: the weights' width dim, where FSDP, ZeRO and MaxText
differ; the exhaustive and random baselines, none), plus any named in `overrides` (the search
names those of the plans it starts from) or pinned. They come right after their class.

Decisions beyond sharding (kind STEP) come first in the tree, as they change the most: a remat
policy per repeated layer group (`Analysis.layer_groups` of kind "layers" or "scanned"; a
scanned stack the user checkpoints keeps its own policy), the micro-batch count (the legal
ones up to MAX_MICRO_BATCHES, or MICRO_BATCHES_PER_STAGE per stage where stages are offered)
and, per scanned stack, pipeline stages (`pipeline@<group>`: none, or one mesh axis whose
size divides its layers, with a GPipe schedule or a circular one of two runs per stage; the
axis then holds the stages and nothing else, so a plan with
stages has the stack's layer class on that axis and every other class without it, in its
plan and its price). A plan with any of them is priced by the cost model of the step they
rewrite (`CostModel.for_step`; `price`). The search and the baselines leave them as written
(pinned) where the fastest expert plan that fits is one as written and no pin asks for them
(_tracker.as_written).

Two orders: the *tree order* of the decisions (by bytes at stake, what MCTS decides first) and
the *rank order* of the classes (which class keeps a mesh axis two classes of one value want,
Plan's first-decision-wins). The rank order is the tree order unless `order` says otherwise:
the search takes it from the best plan it starts from, so that plan is in the space exactly
(Megatron-SP needs the tensor-parallel classes ranked before the sequence, whatever their
bytes). Pins fix a decision's choice at the root, and pinned classes rank before all others,
in the order they are given: a pinned class keeps its axes on every tensor of the class (pin
the batch before the weights' embed for FSDP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

import numpy as np

from ..analysis import DOMAINS, OPTIMIZER, PARAMETERS, SCANNED, SCOPE, domains
from ..cost import PlanArrays, live_axis_bits, plan_arrays
from ..plan import (CIRCULAR, MICRO_BATCHES, MICRO_BATCHES_PER_STAGE, PIPELINE_PREFIX,
                    REMAT_POLICIES, REMAT_PREFIX, Pipeline, PipelineRefused, Plan, PlanError,
                    StepDecisions, stack_pipeline)
from ..plan import override_name

CLASS, CONFLICT, OVERRIDE, STEP = "class", "conflict", "override", "step"
# The most micro-batches the search offers: past 8 the loop's per-iteration weight gathers and
# launch latency outweigh the activations they save on every step we have measured.
MAX_MICRO_BATCHES = 8
# Override decisions the search offers per domain without being asked for: the classes with
# the most bytes there.
OVERRIDE_CLASSES = 1
INHERIT = None  # an override decision's choice 0: the class's own axes


@dataclass(frozen=True)
class Decision:
    kind: str                    # CLASS, CONFLICT, OVERRIDE or STEP
    index: int                   # class id (CLASS, OVERRIDE) or conflict id; STEP: 0
    name: str                    # OVERRIDE: "<class>@<domain>"
    choices: tuple               # CLASS: tuples of axis names; CONFLICT: resolution names;
                                 # OVERRIDE: INHERIT, then tuples of axis names;
                                 # STEP: remat policies, or micro-batch counts
    masks: tuple[int, ...] = ()  # CLASS, OVERRIDE: the bit mask of each choice (-1: INHERIT)
    pinned: int = -1             # the pinned choice, or -1
    parent: int = -1             # CONFLICT, OVERRIDE: the position of its class's decision
    domain: str = ""             # OVERRIDE: the domain it sets

    def label(self, choice: int) -> str:
        c = self.choices[choice]
        if self.kind == OVERRIDE and c is INHERIT:
            return "as its class"
        if self.kind in (CLASS, OVERRIDE):
            return "replicated" if not c else "x".join(c)
        return "none" if c is None else str(c)


class Space:
    """Decisions in search order, with conversions from a choice vector to plans and arrays.

    pins: {class, conflict or "<class>@<domain>" override name: axes or resolution}.
    overrides: (class id or name, domain) pairs to offer override decisions for, beyond the
    `override_classes` largest per domain. order: class ids in rank order (see the module
    docstring); classes not listed follow in tree order.
    """

    def __init__(self, analysis, mesh, pins: Mapping | None = None,
                 overrides: Iterable = (), order: Sequence[int] | None = None,
                 override_classes: int = 0):
        self.analysis = analysis
        self.mesh = mesh
        names = tuple(mesh.axis_names)
        # an axis of one device splits nothing: no choice offers it, and a pin or a plan
        # naming it reads as without it (its bit is 0)
        bit = live_axis_bits(mesh)
        live = [a for a in names if bit[a]]
        pins = _current_names(analysis, dict(pins or {}))
        self._check_pins(pins)
        _check_micro_batch_pins(analysis, mesh, pins)
        axes_choices = []
        for k in range(1, 1 << len(live)):
            axes = tuple(a for i, a in enumerate(live) if k >> i & 1)
            axes_choices.append((axes, int(np.prod([mesh.axis_size(a) for a in axes])),
                                 sum(bit[a] for a in axes)))

        def divisible(cls):
            return [(axes, m) for axes, ways, m in axes_choices if cls.size % ways == 0]

        def pinned_axes(name, cls, options):
            want = _axes(pins[name])
            unknown = [a for a in want if a not in bit]
            if unknown:
                raise PlanError(f"pin {name}={want}: the mesh has no axes {unknown}; its axes "
                                f"are {list(names)}")
            key = sum(bit[a] for a in want)
            if key not in options:
                ways = int(np.prod([mesh.axis_size(a) for a in want]))
                raise PlanError(f"pin {name}={want}: class {cls.name!r} has size {cls.size}, "
                                f"not divisible by the {ways} devices of {want}")
            return options.index(key)

        offered = self._offered(analysis, pins, overrides, override_classes)
        conflicts_of: dict[int, list] = {}
        for c in analysis.conflicts:
            conflicts_of.setdefault(c.class_id, []).append(c)
        decisions: list[Decision] = list(_step_decisions(analysis, pins, mesh))
        for cls in sorted(analysis.classes, key=lambda c: (-c.bytes, c.id)):
            options = divisible(cls)
            choices = [()] + [axes for axes, _ in options]
            masks = tuple([0] + [m for _, m in options])
            pinned = pinned_axes(cls.name, cls, masks) if cls.name in pins else -1
            domains_here = [d for d in DOMAINS if (cls.id, d) in offered]
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
            for d in domains_here:
                name = f"{cls.name}@{d}"
                o_masks = (-1,) + masks
                o_pinned = pinned_axes(name, cls, o_masks) if name in pins else -1
                decisions.append(Decision(OVERRIDE, cls.id, name, (INHERIT, *choices),
                                          o_masks, o_pinned, parent=pos, domain=d))
        self.decisions = tuple(decisions)
        self.num_choices = np.array([len(d.choices) for d in decisions], np.int64)
        self.pinned = np.array([d.pinned for d in decisions], np.int64)
        # pinned classes rank first, in the pins' order: a pin holds its axes on every tensor
        # of its class, not only where no class decided earlier wants them
        by_name = {c.name: c.id for c in analysis.classes}
        self._pinned_first = tuple(by_name[n] for n in pins if n in by_name)
        self._set_order(order)

    @staticmethod
    def _offered(an, pins, overrides, largest) -> set[tuple[int, str]]:
        """(class id, domain) pairs that get an override decision (see the module docstring)."""
        out = set()
        if largest:
            split = _domain_bytes(an)
            for d in (PARAMETERS, OPTIMIZER):
                ranked = sorted(((b, k) for (k, dom), b in split.items() if dom == d and b > 0),
                                key=lambda bk: (-bk[0], bk[1]))
                out.update((k, d) for _, k in ranked[:largest])
        for cls, d in overrides:
            k = cls if isinstance(cls, int) else an.class_named(cls).id
            out.add((k, d))
        for name in pins:
            override = override_name(name)
            if override and any(c.name == override[0] for c in an.classes):
                out.add((an.class_named(override[0]).id, override[1]))
        return out

    def _set_order(self, order) -> None:
        """Rank positions of the class decisions: the pinned classes first, then `order`, then
        the rest in tree order."""
        classes = [p for p, d in enumerate(self.decisions) if d.kind == CLASS]
        where = {d.index: p for p, d in ((p, self.decisions[p]) for p in classes)}
        ranked = [*self._pinned_first, *(order or ())]
        first = [where[k] for k in dict.fromkeys(ranked) if k in where]
        classes = first + [p for p in classes if p not in set(first)]
        self._rank_positions = tuple(classes)
        self._overrides = tuple(p for p, d in enumerate(self.decisions) if d.kind == OVERRIDE)
        self._conflicts = tuple(p for p, d in enumerate(self.decisions) if d.kind == CONFLICT)
        self._steps = tuple(p for p, d in enumerate(self.decisions) if d.kind == STEP)
        self._stages = {}  # scanned group: its layer class
        for d in self.decisions:
            if d.kind == STEP and d.name.startswith(PIPELINE_PREFIX):
                staged = next(c for c in d.choices if c is not None)
                self._stages[staged.group] = stack_pipeline(self.analysis, staged).layer_class

    def reordered(self, order: Sequence[int] | None) -> "Space":
        """The same decisions with another rank order (class ids, see the module docstring)."""
        out = object.__new__(Space)
        out.__dict__.update(self.__dict__)
        out._set_order(order)
        return out

    @property
    def order(self) -> tuple[int, ...]:
        """Class ids in rank order."""
        return tuple(self.decisions[p].index for p in self._rank_positions)

    def _check_pins(self, pins: Mapping) -> None:  # (names as _current_names gives them)
        an = self.analysis
        known = {c.name for c in an.classes} | {c.name for c in an.conflicts}
        known |= {f"{c.name}@{d}" for c in an.classes for d in (PARAMETERS, OPTIMIZER)}
        known |= {d.name for d in _step_decisions(an, {}, self.mesh)}
        unknown = [p for p in pins if p not in known]
        if unknown:
            raise PlanError(f"pins name no class, conflict or override (<class>@parameters, "
                            f"<class>@optimizer): {unknown}; classes: "
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
        """(split-class masks, ranks, conflict resolutions) for the cost model's kernel (of
        the step as written: see `price` for the decisions beyond sharding)."""
        return plan_arrays(self.analysis, *self.decision_lists(choices))

    def decision_lists(self, choices):
        """plan_arrays' arguments: (class, mask) in rank order, (conflict, resolution index),
        (class, domain, mask) overrides."""
        decisions = self.decisions
        classes = [(decisions[p].index, decisions[p].masks[choices[p]])
                   for p in self._rank_positions]
        conflicts = [(decisions[p].index, choices[p]) for p in self._conflicts]
        overrides = [(decisions[p].index, decisions[p].domain, decisions[p].masks[choices[p]])
                     for p in self._overrides if choices[p]]
        pipeline = self.step_of(choices).pipeline if self._stages else None
        if pipeline is not None:  # the stage axis holds the stack's layers, nothing else
            bit = live_axis_bits(self.mesh)[pipeline.axis]
            layer = self._stages[pipeline.group]
            classes = [(layer, bit)] + [(k, m & ~bit) for k, m in classes if k != layer]
            overrides = [(k, d, m & ~bit) for k, d, m in overrides]
        return classes, conflicts, overrides

    def step_of(self, choices) -> StepDecisions:
        """The decisions beyond sharding that `choices` take."""
        step = StepDecisions()
        for p in self._steps:
            d = self.decisions[p]
            value = d.choices[choices[p]]
            if d.name == MICRO_BATCHES:
                step = step.with_micro_batches(value)
            elif d.name.startswith(PIPELINE_PREFIX):
                step = replace(step, pipeline=value)
            else:
                step = step.with_remat(d.name[len(REMAT_PREFIX):], value)
        return step

    def price(self, model, choices) -> tuple[float, float]:
        """(step time s, peak bytes) of `choices` under `model` (a CostModel of the space's
        analysis and mesh); (inf, inf) for a plan the rewritten step cannot run."""
        step = self.step_of(choices)
        if step.is_default:
            return model.step_and_peak(*self.arrays(choices))
        if step.refusal:
            return math.inf, math.inf
        return model.for_step(step).step_and_peak(*self.decision_lists(choices))

    def plan(self, choices) -> Plan:
        plan = Plan.replicated(self.analysis, self.mesh)
        overrides_of: dict[int, list[int]] = {}
        for p in self._overrides:
            if choices[p]:
                overrides_of.setdefault(self.decisions[p].parent, []).append(p)
        for p in self._rank_positions:  # rank order: the plan's decision order
            d = self.decisions[p]
            for o in overrides_of.get(p, ()):  # places its class in the order, replicated
                od = self.decisions[o]
                plan = plan.with_axes(od.index, od.choices[choices[o]], domain=od.domain)
            if choices[p]:
                plan = plan.with_axes(d.index, d.choices[choices[p]])
        for p in self._conflicts:
            d = self.decisions[p]
            if choices[d.parent]:
                plan = plan.with_resolution(d.index, d.choices[choices[p]])
        step = self.step_of(choices)
        if step.pipeline is not None:
            p = step.pipeline
            plan = plan.with_pipeline(p.group, p.axis, p.stages, p.schedule, chunks=p.chunks)
        plan = replace(plan, step=step)
        pinned = [d.name for d in self.decisions if d.pinned >= 0]
        return plan.pin(*pinned) if pinned else plan

    def choices_of(self, plan: Plan) -> np.ndarray:
        """The choice vector of a plan (plans outside the space snap to the nearest choice;
        the rank order is the space's, see `order`)."""
        out = np.zeros(len(self.decisions), np.int64)
        bit = live_axis_bits(self.mesh)
        own = plan.override_axes
        for pos, d in enumerate(self.decisions):
            if d.kind == CLASS:
                m = sum(bit[a] for a in plan.axes_of(d.index))
                out[pos] = d.masks.index(m) if m in d.masks else 0
            elif d.kind == STEP:
                value = (plan.step.micro_batches if d.name == MICRO_BATCHES
                         else plan.step.pipeline if d.name.startswith(PIPELINE_PREFIX)
                         else plan.step.policy_of(d.name[len(REMAT_PREFIX):]))
                out[pos] = d.choices.index(value) if value in d.choices else 0
            elif d.kind == OVERRIDE:
                if d.name in own:
                    m = sum(bit[a] for a in own[d.name])
                    out[pos] = d.masks.index(m, 1) if m in d.masks[1:] else 0
            else:
                out[pos] = d.choices.index(plan.resolution_of(d.index))
        return out


def _step_decisions(an, pins: Mapping, mesh=None) -> list[Decision]:
    """The STEP decisions of an analysis (module docstring), with their pins; pipeline
    stages only with a mesh to put them on (and then micro-batch counts up to
    MICRO_BATCHES_PER_STAGE per stage too)."""
    out = []
    stages = [] if mesh is None else _stage_decisions(an, pins, mesh)
    most = max([MAX_MICRO_BATCHES] + [MICRO_BATCHES_PER_STAGE * c.stages
                                      for d in stages for c in d.choices if c is not None])
    for g in an.layer_groups:
        if g.kind == SCOPE or g.kind == SCANNED and g.checkpointed:
            continue
        out.append(_step_decision(f"{REMAT_PREFIX}{g.name}", REMAT_POLICIES, pins))
    mb = an.micro_batching
    counts = tuple(k for k in mb.counts if k <= most) if mb.legal else (1,)
    if len(counts) > 1 or MICRO_BATCHES in pins:
        out.append(_step_decision(MICRO_BATCHES, counts, pins))
    return out + stages


def _stage_decisions(an, pins: Mapping, mesh) -> list[Decision]:
    """pipeline@<group> for each scanned stack a pipeline can cut: none, or the live mesh axes
    whose size divides its layers (module docstring)."""
    bit = live_axis_bits(mesh)
    out = []
    for g in an.layer_groups:
        if g.kind != SCANNED:
            continue
        stages = []
        for a in (a for a in mesh.axis_names if bit[a]):
            n = mesh.axis_size(a)
            for pipeline in (Pipeline(g.name, a, n), Pipeline(g.name, a, n, CIRCULAR, 2)):
                try:
                    stages.append(stack_pipeline(an, pipeline).pipeline)
                except PipelineRefused:
                    continue
        if stages:
            out.append(_step_decision(f"{PIPELINE_PREFIX}{g.name}", (None, *stages), pins))
    return out


def _check_micro_batch_pins(an, mesh, pins: Mapping) -> None:
    """A PlanError where the pins fix a micro-batch count and the batch's axes that cannot go
    together (each micro-batch's examples must divide over the batch's devices)."""
    mb = an.micro_batching
    count = pins.get(MICRO_BATCHES, 1)
    if count == 1 or not mb.legal or mb.batch not in pins or count not in mb.counts:
        return  # (a count the analysis refuses: _step_decision says so)
    plan = Plan.replicated(an).with_axes(mb.batch, _axes(pins[mb.batch]))
    try:
        plan.with_micro_batches(count).validate(mesh)
    except PlanError as err:
        raise PlanError(f"contradictory pins {MICRO_BATCHES}={count} and "
                        f"{mb.batch}={_axes(pins[mb.batch])}: {err}") from None


def _step_decision(name: str, choices: tuple, pins: Mapping) -> Decision:
    """A STEP decision; a pin names its choice as the choice itself or as its text
    ("stage:4" for stages, "none" for no pipeline)."""
    pinned = -1
    if name in pins:
        spoken = {("none" if c is None else str(c)): c for c in choices}
        want = spoken.get(pins[name], pins[name]) if isinstance(pins[name], str) else pins[name]
        if want not in choices:
            raise PlanError(f"pin {name}={pins[name]!r}: choose one of {list(spoken)}")
        pinned = choices.index(want)
    return Decision(STEP, 0, name, tuple(choices), pinned=pinned)


def plan_order(plan: Plan) -> tuple[int, ...]:
    """A plan's classes in its decision order (for `Space(order=)`)."""
    return tuple(k for k, _ in plan.assignments)


def _domain_bytes(an) -> dict[tuple[int, str], int]:
    """{(class id, domain): bytes of that domain's values the class is on}."""

    def build():
        of = domains(an).of_value
        out: dict[tuple[int, str], int] = {}
        for v, classes in enumerate(an.value_classes):
            d = DOMAINS[of[v]]
            nbytes = an.program.values[v].nbytes
            for c in set(classes):
                if c >= 0:
                    out[(c, d)] = out.get((c, d), 0) + nbytes
        return out

    return an.derived("plan_search.domain_bytes", build)


def _axes(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


def _current_names(an, pins: dict) -> dict:
    """`pins` with each class (or override of a class) named as it is now: a class's former
    name (its argument path, a plan file's older name) or origin reads as the class."""
    exact = {c.name for c in an.classes} | {c.name for c in an.conflicts}
    out = {}
    for name, value in pins.items():
        if name in exact:
            out[name] = value
            continue
        cls, _, domain = str(name).rpartition("@") if "@" in str(name) else (name, "", "")
        try:
            current = an.class_named(cls).name
        except KeyError:
            out[name] = value  # a conflict, or unknown: _check_pins says which
            continue
        out[f"{current}@{domain}" if domain else current] = value
    return out
