"""Plan: class -> mesh axes, plus each conflict's resolution (DESIGN.md §5).

Every value's sharding follows from the plan: dim d of value v takes the axes of its class,
except where
- a conflict's resolution drops it (the side not kept, or every side under "replicate"), or
- another class on the same value already took one of those mesh axes: the class decided
  first keeps the axis and the later one is replicated on that value (so FSDP reads naturally:
  batch on `data` first, then parameters on `data`; activations keep batch, parameters are
  gathered where they meet activations).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable, Mapping

from ..analysis import REPLICATE, Conflict, DimClass
from . import _export, _planfile

Axes = tuple[str, ...]


class PlanError(ValueError):
    """A plan that cannot be applied: the message names the class, a value and a source line."""


def _as_axes(axes) -> Axes:
    if axes is None:
        return ()
    if isinstance(axes, str):
        return (axes,)
    axes = tuple(axes)
    for a in axes:
        if not isinstance(a, str):
            raise PlanError(f"mesh axes are names (str), got {a!r} in {axes!r}")
    if len(set(axes)) != len(axes):
        raise PlanError(f"mesh axes {axes} use an axis twice: a dim can be sharded over each "
                        f"mesh axis at most once")
    return axes


@dataclass(frozen=True, eq=False)
class Plan:
    """An immutable sharding plan for one Analysis.

    assignments: (class id, mesh axes) in decision order — the order breaks ties where two
    classes meet on one value and want the same axis. Classes not listed are replicated.
    resolutions: (conflict id, resolution) — `keep_dimK` or `replicate`; unlisted conflicts
    keep their first side. pinned: names of the classes and conflicts a person fixed.
    """

    analysis: object = field(repr=False)
    assignments: tuple[tuple[int, Axes], ...] = ()
    resolutions: tuple[tuple[int, str], ...] = ()
    pinned: frozenset[str] = frozenset()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def replicated(cls, analysis) -> "Plan":
        """Every class replicated: the unsharded program on every device."""
        return cls(analysis)

    @classmethod
    def from_decisions(cls, analysis, classes: Mapping | Iterable = (),
                       conflicts: Mapping | Iterable = (), pinned: Iterable[str] = ()) -> "Plan":
        """From {class name or id: axes} and {conflict name or id: resolution}, in order."""
        plan = cls(analysis)
        items = classes.items() if isinstance(classes, Mapping) else classes
        for name, axes in items:
            plan = plan.with_axes(name, axes)
        items = conflicts.items() if isinstance(conflicts, Mapping) else conflicts
        for name, res in items:
            plan = plan.with_resolution(name, res)
        pinned = frozenset(pinned)
        for name in pinned:
            plan._decision(name)
        return replace(plan, pinned=pinned)

    def with_axes(self, cls, axes, pin: bool = False) -> "Plan":
        """A new plan with class `cls` (name, id or DimClass) sharded over `axes`.

        axes: a mesh axis name, a tuple of them (major to minor), or () / None to replicate.
        A class already decided keeps its place in the decision order.
        """
        c = self._class(cls)
        axes = _as_axes(axes)
        assigned = dict(self.assignments)
        if c.id in assigned:
            new = tuple((k, axes if k == c.id else v) for k, v in self.assignments)
        else:
            new = self.assignments + ((c.id, axes),)
        new = tuple((k, v) for k, v in new if v or k == c.id and pin)
        pinned = self.pinned | {c.name} if pin else self.pinned
        return replace(self, assignments=new, pinned=pinned)

    def with_resolution(self, conflict, resolution: str, pin: bool = False) -> "Plan":
        """A new plan resolving `conflict` (name, id or Conflict) with `resolution`."""
        c = self._conflict(conflict)
        if resolution not in c.resolutions:
            raise PlanError(f"conflict {c.name!r} ({c.source or 'argument'}) has no resolution "
                            f"{resolution!r}; choose one of {list(c.resolutions)}")
        new = tuple((k, v) for k, v in self.resolutions if k != c.id) + ((c.id, resolution),)
        pinned = self.pinned | {c.name} if pin else self.pinned
        return replace(self, resolutions=new, pinned=pinned)

    def pin(self, *names: str) -> "Plan":
        """Marks decisions as fixed by a person (search keeps them)."""
        for n in names:
            self._decision(n)
        return replace(self, pinned=self.pinned | frozenset(names))

    # --- reading --------------------------------------------------------------------------

    def axes_of(self, cls) -> Axes:
        return dict(self.assignments).get(self._class(cls).id, ())

    def resolution_of(self, conflict) -> str:
        c = self._conflict(conflict)
        return dict(self.resolutions).get(c.id, c.resolutions[0])

    @property
    def class_axes(self) -> dict[str, Axes]:
        """{class name: axes} for the sharded classes, in decision order."""
        classes = self.analysis.classes
        return {classes[k].name: v for k, v in self.assignments if v}

    @property
    def conflict_resolutions(self) -> dict[str, str]:
        """{conflict name: resolution} for every conflict whose class is sharded."""
        an = self.analysis
        out = {}
        for c in an.conflicts:
            if self.axes_of(c.class_id):
                out[c.name] = self.resolution_of(c)
        return out

    def mesh_axes_used(self) -> set[str]:
        return {a for _, axes in self.assignments for a in axes}

    @cached_property
    def _rank(self) -> dict[int, int]:
        return {k: i for i, (k, _) in enumerate(self.assignments)}

    @cached_property
    def _axes_by_class(self) -> dict[int, Axes]:
        return {k: v for k, v in self.assignments if v}

    @cached_property
    def dropped(self) -> frozenset[tuple[int, int]]:
        """(value, dim) pairs that conflict resolutions replicate."""
        out = set()
        for c in self.analysis.conflicts:
            if c.class_id not in self._axes_by_class:
                continue
            res = self.resolution_of(c)
            for side in c.sides:
                if res == REPLICATE or side.resolution != res:
                    out.update(side.members)
            if not c.sides:  # only replication resolves it
                vc = self.analysis.value_classes
                out.update((v, d) for v in c.values for d, k in enumerate(vc[v])
                           if k == c.class_id)
        return frozenset(out)

    def value_axes(self, value: int) -> tuple[Axes, ...]:
        """Per dim of `value`: the mesh axes it is sharded over under this plan."""
        classes = self.analysis.value_classes[value]
        axes_by_class, rank, dropped = self._axes_by_class, self._rank, self.dropped
        out: list[Axes] = [()] * len(classes)
        wanted = sorted((rank[c], d) for d, c in enumerate(classes) if c in axes_by_class)
        used: set[str] = set()
        for _, d in wanted:
            if (value, d) in dropped:
                continue
            axes = axes_by_class[classes[d]]
            if used.isdisjoint(axes):
                out[d] = axes
                used.update(axes)
        return tuple(out)

    def partition_spec(self, value: int):
        """The jax PartitionSpec of `value` under this plan."""
        return _export.spec_of(self.value_axes(value))

    # --- export (DESIGN.md §8) ---------------------------------------------------------------

    def shardings(self, jax_mesh):
        """(in_shardings, out_shardings): NamedSharding pytrees for jax.jit."""
        return _export.shardings(self, jax_mesh)

    def partition_specs(self):
        """(in_specs, out_specs): PartitionSpec pytrees of the arguments and the result."""
        return _export.partition_specs(self)

    def jit(self, fn, jax_mesh, constraints: str = "compute", donate: bool = True,
            **jit_kwargs):
        """jax.jit(fn) with this plan's shardings and constraints, donating the training state
        like tl.estimate assumes (see _export.jit)."""
        return _export.jit(self, fn, jax_mesh, constraints, donate, **jit_kwargs)

    def logical_axis_rules(self):
        """(class name, mesh axes or None) pairs, like flax's logical axis rules."""
        return _export.logical_axis_rules(self)

    # --- plan files (see _planfile.py) ------------------------------------------------------

    def save(self, path, mesh=None, estimate: dict | None = None):
        """Writes this plan as versioned JSON; returns the path."""
        return _planfile.write(self.to_dict(mesh, estimate), path)

    def to_dict(self, mesh=None, estimate: dict | None = None) -> dict:
        return _planfile.plan_to_dict(self, mesh, estimate)

    @classmethod
    def load(cls, path, analysis, check_fingerprint: bool = True) -> "Plan":
        """Reads a plan file for `analysis`; never executes code from the file."""
        return cls.from_dict(_planfile.read(path), analysis, source=str(path),
                             check_fingerprint=check_fingerprint)

    @classmethod
    def from_dict(cls, doc, analysis, source: str = "<dict>",
                  check_fingerprint: bool = True) -> "Plan":
        """The Plan of a plan-file document; raises PlanFileError naming `source`."""
        classes, conflicts, pinned = _planfile.decisions(doc, analysis.program, source,
                                                         check_fingerprint)
        try:
            return cls.from_decisions(analysis, classes, conflicts, pinned)
        except PlanError as err:
            raise _planfile.PlanFileError(f"{source}: {err}") from None

    # --- validation -----------------------------------------------------------------------

    def validate(self, mesh) -> "Plan":
        """Raises PlanError when the plan does not fit `mesh`; returns self otherwise."""
        an = self.analysis
        names = set(mesh.axis_names)
        for k, axes in self.assignments:
            c = an.classes[k]
            unknown = [a for a in axes if a not in names]
            if unknown:
                raise PlanError(f"class {c.name!r} is sharded over {unknown}, which the mesh "
                                f"{mesh} does not have; mesh axes: {sorted(names)}")
            ways = 1
            for a in axes:
                ways *= mesh.axis_size(a)
            if c.size % ways:
                raise PlanError(_not_divisible(an, c, axes, ways))
        return self

    # --- helpers --------------------------------------------------------------------------

    def _class(self, cls) -> DimClass:
        an = self.analysis
        if isinstance(cls, DimClass):
            return an.classes[cls.id]
        if isinstance(cls, int):
            if not 0 <= cls < len(an.classes):
                raise PlanError(f"no class with id {cls}; the analysis has {len(an.classes)}")
            return an.classes[cls]
        try:
            return an.class_named(cls)
        except KeyError as err:
            raise PlanError(err.args[0]) from None

    def _conflict(self, conflict) -> Conflict:
        an = self.analysis
        if isinstance(conflict, Conflict):
            return an.conflicts[conflict.id]
        if isinstance(conflict, int):
            if not 0 <= conflict < len(an.conflicts):
                raise PlanError(f"no conflict with id {conflict}; the analysis has "
                                f"{len(an.conflicts)}")
            return an.conflicts[conflict]
        for c in an.conflicts:
            if c.name == conflict:
                return c
        raise PlanError(f"no conflict named {conflict!r}; conflicts: "
                        f"{[c.name for c in an.conflicts]}")

    def _decision(self, name: str):
        try:
            return self._class(name)
        except PlanError:
            return self._conflict(name)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (self.analysis is other.analysis
                and dict(self.assignments) == dict(other.assignments)
                and [k for k, v in self.assignments if v] == [k for k, v in other.assignments if v]
                and self.conflict_resolutions == other.conflict_resolutions)

    def __hash__(self) -> int:
        return hash((tuple((k, v) for k, v in self.assignments if v),
                     tuple(sorted(self.conflict_resolutions.items()))))

    def __repr__(self) -> str:
        parts = [f"{n}={axes}" for n, axes in self.class_axes.items()]
        parts += [f"{n}: {r}" for n, r in self.conflict_resolutions.items()]
        return f"Plan({', '.join(parts) or 'replicated'})"


def _not_divisible(an, c: DimClass, axes: Axes, ways: int) -> str:
    prog = an.program
    example = ""
    if c.members:
        v, d = c.members[0]
        val = prog.values[v]
        where = (f"argument {val.name}" if val.name else
                 f"{prog.ops[val.producer].primitive} at {prog.ops[val.producer].source}"
                 if val.producer >= 0 else "a constant")
        example = f" (e.g. dim {d} of {val.dtype.name}{list(val.shape)}, {where})"
    return (f"class {c.name!r} has size {c.size}{example}, which is not divisible by the "
            f"{ways} devices of mesh axes {axes}; choose axes whose sizes multiply to a "
            f"divisor of {c.size}, or replicate it")
