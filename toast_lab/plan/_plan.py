"""Plan: class -> mesh axes, plus each conflict's resolution (DESIGN.md §5).

Every value's sharding follows from the plan: dim d of value v takes the axes of its class,
except where
- a conflict's resolution drops it (the side not kept, or every side under "replicate"), or
- another class on the same value already took one of those mesh axes: the class decided
  first keeps the axis and the later one is replicated on that value (so FSDP reads naturally:
  batch on `data` first, then parameters on `data`; activations keep batch, parameters are
  gathered where they meet activations).

A class can also take other axes in one *domain* of a training step (analysis/_domains.py:
compute, parameters, optimizer): an override. MaxText's FSDP x TP shards the activations'
`embed` over the tensor axis and the weights' over FSDP:

    plan.with_axes("embed", "tensor").with_axes("embed", "fsdp", domain="parameters")

and ZeRO-1 shards only the optimizer state over the data devices:

    plan.with_axes("batch", "data").with_axes("embed", "data", domain="optimizer")

A value's dims take their class's axes in the value's domain. An override does not move its
class in the decision order; a class with an override is a decision even when its own axes
are replicated (it stays in `assignments`, with ()).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Iterable, Mapping

from ..analysis import DOMAINS, REPLICATE, Analysis, Conflict, DimClass, domains
from ..program import Program
from . import _decisions, _display, _export, _planfile
from ._decisions import (MICRO_BATCHES, PIPELINE_PREFIX, REMAT_PREFIX, StepDecisionError,
                         StepDecisions)
from ._mesh import check_mesh
from ._pipeline import Pipeline, PipelineRefused, stack_pipeline

Axes = tuple[str, ...]


class PlanError(ValueError):
    """A plan that cannot be applied: the message names the class, a value and a source line."""


def check_analysis(analysis, caller: str) -> Analysis:
    """`analysis` when it is an Analysis; otherwise a TypeError naming `caller` and what to pass
    (a traced Program is one `tl.analyze` away). The one check every entry point that takes an
    analysis makes."""
    if isinstance(analysis, Analysis):
        return analysis
    if isinstance(analysis, Program):
        raise TypeError(f"{caller}: expected an Analysis, got the Program of "
                        f"{analysis.fn_name!r} (what tl.trace returns); call "
                        f"tl.analyze(program) and pass the Analysis it returns")
    raise TypeError(f"{caller}: expected an Analysis, e.g. an = tl.analyze(tl.trace(fn, *args)), "
                    f"got {type(analysis).__name__}")


def override_name(name) -> tuple[str, str] | None:
    """(class name, domain) of an override's name, "<class>@<domain>" (e.g. "embed@optimizer",
    as pins and plan files name it), or None for any other name (a conflict's name has an @
    too: "seq@block0/attn/...", whose tail is no domain)."""
    if not isinstance(name, str):
        return None
    cls, _, domain = name.rpartition("@")
    return (cls, domain) if cls and domain in DOMAINS else None


def _as_axes(axes) -> Axes:
    if axes is None:
        return ()
    if isinstance(axes, str):
        axes = (axes,)
    elif isinstance(axes, (tuple, list)):
        axes = tuple(axes)
    else:
        raise TypeError(f"mesh axes are a mesh axis name, a tuple of names (major to minor), or "
                        f"() / None to replicate, e.g. \"data\" or (\"data\", \"model\"); got "
                        f"{type(axes).__name__} {_planfile.echo(axes)}")
    for a in axes:
        if not isinstance(a, str):
            raise PlanError(f"mesh axes are names (str), got {a!r} in {axes!r}")
        if not a:
            raise PlanError(f"mesh axes are non-empty names, got an empty name in {axes!r}; "
                            f"pass () or None to replicate")
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
    keep their first side. pinned: names of the classes, conflicts and overrides a person
    fixed. overrides: (class id, domain, mesh axes) — the class's axes on the values of one
    domain, in the order made (see the module docstring); the override's name is
    "<class>@<domain>".
    mesh: the Mesh the plan was made for, when one was (search, the expert strategies, the
    Lab, `with_mesh`, a plan file with a mesh section); `save` and `display(plan)` price the
    plan on it. It is not part of the plan's identity (equal plans may remember other meshes).
    step: the decisions beyond sharding (StepDecisions: a remat policy per layer group, the
    micro-batch count), applied by `jit`; the default is the step as written. Pins name them
    "remat@<group>" and "micro_batches".
    """

    analysis: object = field(repr=False)
    assignments: tuple[tuple[int, Axes], ...] = ()
    resolutions: tuple[tuple[int, str], ...] = ()
    pinned: frozenset[str] = frozenset()
    overrides: tuple[tuple[int, str, Axes], ...] = ()
    mesh: object = field(default=None, repr=False, compare=False)
    step: StepDecisions = StepDecisions()

    # --- construction ---------------------------------------------------------------------

    @classmethod
    def replicated(cls, analysis, mesh=None) -> "Plan":
        """Every class replicated: the unsharded program on every device (for `mesh`, when
        given)."""
        check_analysis(analysis, "Plan.replicated")
        return cls(analysis, mesh=None if mesh is None else check_mesh(mesh, "Plan.replicated"))

    @classmethod
    def from_decisions(cls, analysis, classes: Mapping | Iterable = (),
                       conflicts: Mapping | Iterable = (), pinned: Iterable[str] = (),
                       overrides: Iterable = (), step: StepDecisions | None = None) -> "Plan":
        """From {class name or id: axes} and {conflict name or id: resolution}, in order, and
        (class name or id, domain, axes) overrides (each made right after its class); `step`:
        the decisions beyond sharding (checked against the analysis)."""
        plan = cls(check_analysis(analysis, "Plan.from_decisions"))
        if step is not None:
            try:
                plan = replace(plan, step=_decisions.check_decisions(analysis, step))
            except StepDecisionError as err:
                raise PlanError(str(err)) from None
        items = classes.items() if isinstance(classes, Mapping) else classes
        pending = list(overrides)
        for name, axes in items:
            plan = plan.with_axes(name, axes)
            k = plan._class(name).id
            for o in [o for o in pending if plan._class(o[0]).id == k]:
                plan = plan.with_axes(o[0], o[2], domain=o[1])
                pending.remove(o)
        for name, domain, axes in pending:
            plan = plan.with_axes(name, axes, domain=domain)
        items = conflicts.items() if isinstance(conflicts, Mapping) else conflicts
        for name, res in items:
            plan = plan.with_resolution(name, res)
        # pins are held by the decisions' names now (a file may hold a class's former name)
        return replace(plan, pinned=frozenset(plan._current_name(name) for name in pinned))

    def with_axes(self, cls, axes, pin: bool = False, domain: str | None = None) -> "Plan":
        """A new plan with class `cls` (name, id or DimClass) sharded over `axes`.

        axes: a mesh axis name, a tuple of them (major to minor), or () / None to replicate.
        A class already decided keeps its place in the decision order.
        domain: "compute", "parameters" or "optimizer" to set the class's axes on that
        domain's values only (an override, kept until `without_override`); None sets the
        class's own axes, which every domain without an override takes.
        """
        c = self._class(cls)
        axes = _as_axes(axes)
        if domain is not None:
            return self._with_override(c, _domain(domain), axes, pin)
        assigned = dict(self.assignments)
        if c.id in assigned:
            new = tuple((k, axes if k == c.id else v) for k, v in self.assignments)
        else:
            new = self.assignments + ((c.id, axes),)
        held = self._overridden
        new = tuple((k, v) for k, v in new if v or k == c.id and pin or k in held)
        pinned = self.pinned | {c.name} if pin else self.pinned
        return replace(self, assignments=new, pinned=pinned)

    def _with_override(self, c: DimClass, domain: str, axes: Axes, pin: bool) -> "Plan":
        key = (c.id, domain)
        if any((k, d) == key for k, d, _ in self.overrides):
            new = tuple((k, d, axes if (k, d) == key else a) for k, d, a in self.overrides)
        else:
            new = self.overrides + ((c.id, domain, axes),)
        assignments = self.assignments
        if c.id not in dict(assignments):  # the override makes its class a decision
            assignments += ((c.id, ()),)
        pinned = self.pinned | {f"{c.name}@{domain}"} if pin else self.pinned
        return replace(self, assignments=assignments, overrides=new, pinned=pinned)

    def without_override(self, cls, domain: str) -> "Plan":
        """A new plan where class `cls` takes its own axes in `domain` again."""
        c, domain = self._class(cls), _domain(domain)
        new = tuple(o for o in self.overrides if (o[0], o[1]) != (c.id, domain))
        held = {k for k, _, _ in new}
        assignments = tuple((k, v) for k, v in self.assignments
                            if v or k in held or k != c.id or c.name in self.pinned)
        return replace(self, overrides=new, assignments=assignments,
                       pinned=self.pinned - {f"{c.name}@{domain}"})

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

    def with_remat(self, group: str, policy: str, pin: bool = False,
                   override: bool = False) -> "Plan":
        """A new plan where layer group `group` (`Analysis.layer_groups`: "block*", "layer")
        keeps what `policy` says for the backward pass: "everything" (as written),
        "dots_with_no_batch_dims", "offload_dots_with_no_batch_dims" or "full" (see
        _decisions.py). override: replace the group's own jax.checkpoint, which is otherwise
        kept as written."""
        try:
            g = _decisions.check_group(self.analysis, group)
            _decisions.check_policy(policy)
            if override:
                _decisions.check_override(self.analysis, group)
        except StepDecisionError as err:
            raise PlanError(str(err)) from None
        step = self.step.with_remat(g.name, policy, override)
        pinned = self.pinned | {f"{REMAT_PREFIX}{g.name}"} if pin else self.pinned
        return replace(self, step=step, pinned=pinned)

    def with_micro_batches(self, count: int, pin: bool = False) -> "Plan":
        """A new plan that splits the batch into `count` micro-batches, accumulating the
        gradients before one update (legal where `Analysis.micro_batching` says so)."""
        try:
            _decisions.check_micro_batches(self.analysis, count)
        except StepDecisionError as err:
            raise PlanError(str(err)) from None
        pinned = self.pinned | {MICRO_BATCHES} if pin else self.pinned
        return replace(self, step=self.step.with_micro_batches(count), pinned=pinned)

    def with_pipeline(self, group: str, axis: str, stages: int, schedule: str = "gpipe",
                      pin: bool = False, chunks: int | None = None) -> "Plan":
        """A new plan that cuts scanned layer group `group` into `stages` pipeline stages over
        mesh axis `axis` (see _pipeline.py), the micro-batches (`with_micro_batches`) flowing
        through them: schedule "gpipe", or "circular" with `chunks` runs of layers per stage
        (default 2). The axis holds the stages and nothing else: the stack's layer class is
        sharded over it, and every other class and override loses it."""
        if chunks is None:
            chunks = 2 if schedule == "circular" else 1
        pipeline = Pipeline(group, axis, stages, schedule, chunks)
        try:
            sp = stack_pipeline(self.analysis, pipeline)
        except PipelineRefused as err:
            raise PlanError(str(err)) from None
        plan = self
        for k, axes in self.assignments:
            if axis in axes and k != sp.layer_class:
                plan = plan.with_axes(k, tuple(a for a in axes if a != axis))
        for k, domain, axes in self.overrides:
            if axis in axes:
                plan = plan.with_axes(k, tuple(a for a in axes if a != axis), domain=domain)
        plan = plan.with_axes(sp.layer_class, (axis,))
        step = replace(plan.step, pipeline=pipeline)
        pinned = plan.pinned | {f"{PIPELINE_PREFIX}{group}"} if pin else plan.pinned
        return replace(plan, step=step, pinned=pinned)

    def without_pipeline(self) -> "Plan":
        return replace(self, step=replace(self.step, pipeline=None))

    def remat_of(self, group: str) -> str:
        """The remat policy of layer group `group` ("everything" unless the plan says)."""
        try:
            return self.step.policy_of(_decisions.check_group(self.analysis, group).name)
        except StepDecisionError as err:
            raise PlanError(str(err)) from None

    @property
    def micro_batches(self) -> int:
        return self.step.micro_batches

    # --- reading --------------------------------------------------------------------------

    def axes_of(self, cls, domain: str | None = None) -> Axes:
        """The axes of class `cls`: its own, or those it takes in `domain` (its override
        there, else its own). `cls` may also name an override, "<class>@<domain>"."""
        try:
            k = self._class(cls).id
        except PlanError:
            override = override_name(cls)
            if domain is not None or override is None:
                raise
            k, domain = self._class(override[0]).id, override[1]
        if domain is not None:
            axes = self._override_axes.get((k, _domain(domain)))
            if axes is not None:
                return axes
        return dict(self.assignments).get(k, ())

    def resolution_of(self, conflict) -> str:
        c = self._conflict(conflict)
        return dict(self.resolutions).get(c.id, c.resolutions[0])

    @property
    def class_axes(self) -> dict[str, Axes]:
        """{class name: axes} for the sharded classes, in decision order."""
        classes = self.analysis.classes
        return {classes[k].name: v for k, v in self.assignments if v}

    @property
    def override_axes(self) -> dict[str, Axes]:
        """{"<class>@<domain>": axes} for every override, in the order made."""
        classes = self.analysis.classes
        return {f"{classes[k].name}@{d}": a for k, d, a in self.overrides}

    @property
    def conflict_resolutions(self) -> dict[str, str]:
        """{conflict name: resolution} for every conflict whose class is sharded (in the
        domain of the conflict's values)."""
        an = self.analysis
        out = {}
        for c in an.conflicts:
            if self._conflict_active(c):
                out[c.name] = self.resolution_of(c)
        return out

    def mesh_axes_used(self) -> set[str]:
        return ({a for _, axes in self.assignments for a in axes}
                | {a for _, _, axes in self.overrides for a in axes})

    @cached_property
    def _rank(self) -> dict[int, int]:
        return {k: i for i, (k, _) in enumerate(self.assignments)}

    @cached_property
    def _axes_by_class(self) -> dict[int, Axes]:
        return {k: v for k, v in self.assignments if v}

    @cached_property
    def _overridden(self) -> frozenset[int]:
        return frozenset(k for k, _, _ in self.overrides)

    @cached_property
    def _override_axes(self) -> dict[tuple[int, str], Axes]:
        return {(k, d): a for k, d, a in self.overrides}

    @cached_property
    def _axes_by_domain(self) -> tuple[dict[int, Axes], ...]:
        """Per domain (DOMAINS order): {class id: axes} of the classes sharded there."""
        out = []
        for d in DOMAINS:
            axes = dict(self._axes_by_class)
            for (k, dom), a in self._override_axes.items():
                if dom == d:
                    axes[k] = a
            out.append({k: a for k, a in axes.items() if a})
        return tuple(out)

    @cached_property
    def _domain_of(self):
        """[V] the domain index (DOMAINS order) of every value."""
        return domains(self.analysis).of_value

    def _conflict_active(self, c: Conflict) -> bool:
        """The conflict's class is sharded in the domain of the conflict's values."""
        if not self.overrides:
            return c.class_id in self._axes_by_class
        return c.class_id in self._axes_by_domain[self._domain_of[c.site_value]]

    @cached_property
    def dropped(self) -> frozenset[tuple[int, int]]:
        """(value, dim) pairs that conflict resolutions replicate."""
        out = set()
        for c in self.analysis.conflicts:
            if not self._conflict_active(c):
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
        """Per dim of `value`: the mesh axes it is sharded over under this plan (its classes'
        axes in the value's domain)."""
        classes = self.analysis.value_classes[value]
        rank, dropped = self._rank, self.dropped
        axes_by_class = self._axes_by_class
        if self.overrides:
            axes_by_class = self._axes_by_domain[self._domain_of[value]]
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

    def logical_axis_rules(self, domain: str | None = None):
        """(class name, mesh axes or None) pairs, like flax's logical axis rules: the classes'
        own axes, or those they take in `domain` (e.g. "parameters" for the weights' rules)."""
        return _export.logical_axis_rules(self, domain)

    def logical_axis_rules_by_domain(self):
        """{domain: its logical axis rules} for the domains where this plan overrides a class
        (ZeRO-1's "optimizer", MaxText's "parameters"): the rules those arrays take."""
        return _export.logical_axis_rules_by_domain(self)

    # --- plan files (see _planfile.py) ------------------------------------------------------

    def save(self, path, mesh=None, estimate: dict | None = None, view: dict | None = None,
             *, overwrite: bool = False):
        """Writes this plan as versioned JSON; returns the path.

        mesh: what the plan is for (default: the mesh it remembers). With one, the file also
        carries the estimate, the expert strategies on the same cost model and the view model
        that JupyterLab draws when the file is opened, with no kernel. estimate / view: ones
        already built, written instead (the Lab passes the view it shows).

        The write is atomic: a failure midway (a full disk) leaves the previous file whole. A
        plan file (an earlier save) or an empty file at `path` is replaced; any other file only
        with overwrite=True (else FileExistsError, naming it).
        """
        return _planfile.write(self.to_dict(mesh, estimate, view), path, overwrite)

    def to_dict(self, mesh=None, estimate: dict | None = None, view: dict | None = None) -> dict:
        """The plan file's document (see `save`)."""
        mesh = self.mesh if mesh is None else mesh
        if view is None:
            shown = _display.display_of(self, mesh)
        else:  # the Lab's: the estimate and expert rows it shows are in it
            shown = _display.PlanDisplay(view, view.get("estimate"), view.get("experts") or [])
        return _planfile.plan_to_dict(self, mesh, shown.estimate if estimate is None else estimate,
                                      shown.experts, shown.view)

    @classmethod
    def load(cls, path, analysis, check_fingerprint: bool = True, mesh=None) -> "Plan":
        """Reads a plan file for `analysis`; never executes code from the file.

        mesh: the Mesh the plan will run on; the file's mesh section and every axis it names
        are checked against it (without it, against the file's own mesh section). The plan
        remembers `mesh`, else the file's mesh when the file says its device: a preset
        (`tl.devices()`) or the figures the file records for any other (see _planfile.py).
        Raises TypeError when `analysis` is not an Analysis or `mesh` not a Mesh.
        """
        return cls.from_dict(_planfile.read(path), analysis, source=str(path),
                             check_fingerprint=check_fingerprint, mesh=mesh)

    @classmethod
    def from_dict(cls, doc, analysis, source: str = "<dict>",
                  check_fingerprint: bool = True, mesh=None) -> "Plan":
        """The Plan of a plan-file document; raises PlanFileError naming `source`."""
        check_analysis(analysis, "Plan.load")
        if mesh is not None:
            check_mesh(mesh, "Plan.load")
        classes, conflicts, pinned = _planfile.decisions(doc, analysis.program, source,
                                                         check_fingerprint, mesh)
        overrides = _planfile.overrides(doc, source, mesh)
        step = _planfile.step_decisions(doc, source)
        file_mesh = _planfile.file_mesh(doc, source, warn=mesh is None)
        empty = cls(analysis)
        try:
            for what, names in (("the file's \"classes\" section", [n for n, _ in classes]),
                                ("the file's \"overrides\" section",
                                 [n for n, _, _ in overrides])):
                for name in names:
                    _in_section(what, empty._class, name)
            for what, name, axes in ([("classes", n, a) for n, a in classes]
                                     + [("overrides", f"{n}@{d}", a) for n, d, a in overrides]):
                _in_section(f"the file's \"{what}\" section, {_planfile.echo(name)}", _as_axes,
                            axes)
            for name, resolution in conflicts.items():
                _in_section("the file's \"conflicts\" section",
                            lambda n, r=resolution: empty.with_resolution(n, r), name)
            for name in pinned:
                _in_section("the file's \"pinned\" list", empty._decision, name)
            _in_section("the file's \"step\" section", lambda s: cls.from_decisions(
                analysis, step=s), step)
            plan = cls.from_decisions(analysis, classes, conflicts, pinned, overrides, step)
            if mesh is not None:
                return plan.with_mesh(mesh)
        except PlanError as err:
            raise _planfile.PlanFileError(f"{source}: {_planfile.shorten(str(err))}") from None
        if file_mesh is None:
            return plan
        try:
            return plan.with_mesh(file_mesh)
        except PlanError as err:
            axes = _planfile.axes_text(file_mesh.shape)
            raise _planfile.PlanFileError(_planfile.shorten(
                f"{source}: the decisions do not fit the file's \"mesh\" section {axes} (fix "
                f"that section or the decisions, or pass the mesh the plan is for: "
                f"Plan.load(path, analysis, mesh=...)): {err}", 600)) from None

    # --- display (see _display.py) ----------------------------------------------------------

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        """`display(plan)`: the graph coloured by this plan, its decisions, the estimate and the
        expert strategies, drawn by the JupyterLab extension from the output alone (no kernel
        or widget needed to show it again); text for everything else."""
        return _display.mime_bundle(self)

    # --- validation -----------------------------------------------------------------------

    def with_mesh(self, mesh) -> "Plan":
        """This plan, remembering `mesh` (what `save` and `display(plan)` price it on). Raises
        PlanError when the plan does not fit the mesh."""
        self.validate(mesh)
        return self if self.mesh is mesh else replace(self, mesh=mesh)

    def validate(self, mesh) -> "Plan":
        """Raises PlanError when the plan does not fit `mesh`; returns self otherwise."""
        check_mesh(mesh)
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
        for k, domain, axes in self.overrides:
            c = an.classes[k]
            unknown = [a for a in axes if a not in names]
            if unknown:
                raise PlanError(f"override {c.name}@{domain} shards class {c.name!r} over "
                                f"{unknown}, which the mesh {mesh} does not have; mesh axes: "
                                f"{sorted(names)}")
            ways = 1
            for a in axes:
                ways *= mesh.axis_size(a)
            if c.size % ways:
                raise PlanError(f"override {c.name}@{domain}: "
                                + _not_divisible(an, c, axes, ways))
        try:
            _decisions.check_sharded_micro_batches(self, mesh)
        except StepDecisionError as err:
            raise PlanError(str(err)) from None
        self._check_pipeline(mesh)
        return self

    def _check_pipeline(self, mesh) -> None:
        """A PlanError where the plan's pipeline does not fit `mesh` or its own sharding: the
        stage axis holds the stages, and nothing else."""
        p = self.step.pipeline
        if p is None:
            return
        an = self.analysis
        try:
            sp = stack_pipeline(an, p)
        except PipelineRefused as err:
            raise PlanError(str(err)) from None
        if p.axis not in mesh.axis_names or mesh.axis_size(p.axis) != p.stages:
            raise PlanError(f"pipeline@{p.group}: {p.stages} stages over mesh axis {p.axis!r} "
                            f"need an axis of that size; the mesh is {mesh}")
        if self.step.refusal:
            raise PlanError(self.step.refusal)
        layer = an.classes[sp.layer_class]
        if self.axes_of(layer.id) != (p.axis,):
            raise PlanError(f"pipeline@{p.group}: the stages hold the layers of class "
                            f"{layer.name!r}, which must be sharded over {p.axis!r} alone")
        others = [an.classes[k].name for k, axes in self.assignments
                  if k != layer.id and p.axis in axes]
        others += [f"{an.classes[k].name}@{d}" for k, d, axes in self.overrides
                   if p.axis in axes]
        if others:
            raise PlanError(f"pipeline@{p.group}: mesh axis {p.axis!r} holds the pipeline's "
                            f"stages, so no other class may be sharded over it; {others} are")

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
        # a plan file saved when the class had another name ("<old class>@<where>")
        for c in an.conflicts:
            where = c.name[len(c.class_name):]
            if any(conflict == f"{old}{where}" for old in an.classes[c.class_id].formerly):
                return c
        raise PlanError(f"no conflict named {conflict!r}; conflicts: "
                        f"{[c.name for c in an.conflicts]}")

    def _decision(self, name: str):
        if not isinstance(name, (str, int, DimClass, Conflict)) or isinstance(name, bool):
            raise PlanError(f"decisions are named by str (a class, a conflict, or an override "
                            f"\"<class>@<domain>\"), got {type(name).__name__} {name!r}")
        try:
            return self._class(name)
        except PlanError:
            pass
        try:
            return self._conflict(name)
        except PlanError:
            override = override_name(name)
            if override:
                return self._class(override[0])  # an override's name: "<class>@<domain>"
            step = self._step_decision(name)
            if step is not None:
                return step
            raise PlanError(_no_decision(self.analysis, name)) from None

    def _step_decision(self, name):
        """The LayerGroup a "remat@<group>" or "pipeline@<group>" names, MICRO_BATCHES
        itself, or None."""
        if name == MICRO_BATCHES:
            return name
        for prefix in (REMAT_PREFIX, PIPELINE_PREFIX):
            if not isinstance(name, str) or not name.startswith(prefix):
                continue
            try:
                return _decisions.check_group(self.analysis, name[len(prefix):])
            except StepDecisionError as err:
                raise PlanError(str(err)) from None
        return None

    def _current_name(self, name) -> str:
        """The name this analysis gives the decision `name` names (a class's, a conflict's or
        an override's), which may be a former one."""
        decision = self._decision(name)
        if isinstance(decision, Conflict):
            return decision.name
        if not isinstance(decision, DimClass):  # a step decision: named as given
            return name
        override = override_name(name)
        if override and name != decision.name and name not in decision.formerly:
            return f"{decision.name}@{override[1]}"
        return decision.name

    def __eq__(self, other) -> bool:
        if not isinstance(other, Plan):
            return NotImplemented
        return (self.analysis is other.analysis
                and dict(self.assignments) == dict(other.assignments)
                and self._order() == other._order()
                and self._override_axes == other._override_axes
                and self.conflict_resolutions == other.conflict_resolutions
                and self.step == other.step)

    def _order(self) -> list[int]:
        """The decision order of the classes that can hold an axis somewhere."""
        return [k for k, v in self.assignments if v or k in self._overridden]

    def __hash__(self) -> int:
        return hash((tuple((k, v) for k, v in self.assignments if v),
                     tuple(sorted(self._override_axes.items())),
                     tuple(sorted(self.conflict_resolutions.items())), self.step))

    def __repr__(self) -> str:
        parts = [f"{n}={axes}" for n, axes in self.class_axes.items()]
        parts += [f"{n}={axes}" for n, axes in self.override_axes.items()]
        parts += [f"{n}: {r}" for n, r in self.conflict_resolutions.items()]
        parts += [f"{n}={v}" for n, v in self.step.names().items()]
        return f"Plan({', '.join(parts) or 'replicated'})"


def _domain(domain) -> str:
    if domain not in DOMAINS:
        raise PlanError(f"no domain {domain!r}: a class can take other axes in one of "
                        f"{list(DOMAINS)} (see toast_lab.analysis.domains)")
    return domain


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


def _in_section(what: str, find, name) -> None:
    """find(name), its PlanError saying where in the file the name is."""
    try:
        find(name)
    except PlanError as err:
        raise PlanError(f"in {what}: {err}") from None


_SHOWN = 20  # names an error message lists before it says how many more there are


def _listed(names: list[str]) -> str:
    shown = ", ".join(repr(n) for n in names[:_SHOWN])
    more = f", ... ({len(names) - _SHOWN} more)" if len(names) > _SHOWN else ""
    return f"[{shown}{more}]"


def _no_decision(an, name) -> str:
    """What to say for a decision name that is not a class, a conflict or an override."""
    classes = [c.name for c in an.classes]
    conflicts = [c.name for c in an.conflicts]
    text = str(name)
    close = difflib.get_close_matches(text, classes + conflicts, n=5, cutoff=0.6)
    close += [n for n in classes + conflicts if text.lower() in n.lower() and n not in close]
    # a class's former names (its argument path, older plan files') point to it too
    former = {f: c.name for c in an.classes for f in getattr(c, "formerly", ())}
    close += [former[f] for f in difflib.get_close_matches(text, list(former), n=5, cutoff=0.6)
              if former[f] not in close]
    hint = f" Did you mean {_listed(close[:5])}?" if close else ""
    return (f"no class, conflict or override named {_planfile.echo(name)}.{hint} Classes: "
            f"{_listed(classes)}; conflicts: {_listed(conflicts)}; an override is named "
            f"\"<class>@<domain>\" (domains: {', '.join(DOMAINS)})")
