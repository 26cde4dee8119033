"""tl.diff(a, b): what differs between two plans of one program, and what it costs.

    d = tl.diff(experts["dp"], experts["fsdp"], names=("dp", "fsdp"))
    print(d)                 # classes and conflicts that differ; Δ step time, memory, collectives
    d.classes, d.steps, d.collectives, d.delta_step_time_s, d.to_dict()
    d                        # in JupyterLab: the two plans side by side, the differences marked

Decisions are compared by class and conflict name (names are deterministic for a program, so
two analyses of the same program compare too), and the decisions beyond sharding by their
names: "remat@<layer group>" (its policy), "micro_batches" (the count) and
"pipeline@<scanned stack>" (its stages, "stage:4", or "none"). Costs come from
the cost model on the mesh given, else each plan's own mesh (a plan from search, the experts,
the Lab or a plan file remembers it); with no mesh at all the diff has the decisions and no
costs, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..cost import cost_model
from ..plan import PIPELINE_PREFIX, PLAN_MIME, Plan
from ..plan import check_mesh, echo

DIFF_MIME = "application/vnd.toast-lab.plan-diff+json"


@dataclass(frozen=True)
class ClassChange:
    """A class sharded differently: mesh axes before (plan a) and after (plan b); () is
    replicated."""

    id: int
    name: str
    before: tuple[str, ...]
    after: tuple[str, ...]


@dataclass(frozen=True)
class ConflictChange:
    """A conflict resolved differently; None where its class is replicated (nothing to
    resolve)."""

    id: int
    name: str
    class_name: str
    before: str | None
    after: str | None


@dataclass(frozen=True)
class StepChange:
    """A decision beyond sharding made differently: "remat@<group>" (its policy, with
    " overriding jax.checkpoint" where the plan replaces the group's own), "micro_batches"
    (the count) or "pipeline@<stack>" (stages over a mesh axis, "stage:4"; "none")."""

    name: str
    before: str | int
    after: str | int


@dataclass(frozen=True)
class CollectiveChange:
    """One kind of collective over one set of mesh axes, per device per step, in both plans."""

    kind: str
    axes: tuple[str, ...]
    count: tuple[float, float]
    bytes: tuple[float, float]
    time_s: tuple[float, float]

    @property
    def delta_count(self) -> float:
        return self.count[1] - self.count[0]

    @property
    def delta_bytes(self) -> float:
        return self.bytes[1] - self.bytes[0]

    @property
    def delta_time_s(self) -> float:
        return self.time_s[1] - self.time_s[0]


@dataclass(frozen=True)
class PlanDiff:
    """Two plans of one program compared (a: before, b: after). Pairs are (a, b).

    classes / conflicts: the decisions that differ. steps: the decisions beyond sharding that
    differ (remat policies, micro-batches, pipeline stages). order: the classes sharded in
    both plans, in each plan's decision order, when that order differs (where two classes
    meet on a tensor and want one mesh axis, the class decided first keeps it), else None.
    step_time_s, compute_s, communication_s, peak_memory_bytes: None without a mesh.
    collectives: the (kind, axes) whose count or bytes differ. memory_breakdown: {category:
    (a bytes, b bytes)} at each plan's peak. note: what the comparison could not do, or None.
    """

    program: str
    names: tuple[str, str]
    classes: tuple[ClassChange, ...]
    conflicts: tuple[ConflictChange, ...]
    step_time_s: tuple[float, float] | None
    compute_s: tuple[float, float] | None
    communication_s: tuple[float, float] | None
    peak_memory_bytes: tuple[float, float] | None
    feasible: tuple[bool, bool] | None
    collectives: tuple[CollectiveChange, ...]
    order: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    steps: tuple[StepChange, ...] = ()
    memory_breakdown: dict = field(default_factory=dict)
    meshes: tuple[object, object] = field(default=(None, None), repr=False, compare=False)
    plans: tuple[object, object] = field(default=(None, None), repr=False, compare=False)
    note: str | None = None

    @property
    def same(self) -> bool:
        """Whether the two plans make the same decisions."""
        return not self.classes and not self.conflicts and self.order is None \
            and not self.steps

    @property
    def delta_step_time_s(self) -> float | None:
        return None if self.step_time_s is None else self.step_time_s[1] - self.step_time_s[0]

    @property
    def delta_peak_memory_bytes(self) -> float | None:
        p = self.peak_memory_bytes
        return None if p is None else p[1] - p[0]

    # --- JSON and text ----------------------------------------------------------------------

    def to_dict(self) -> dict:
        """Plain JSON types; pairs as [a, b] lists."""
        pair = lambda p: None if p is None else list(p)  # noqa: E731
        return {
            "format": "toast-lab-plan-diff", "version": 1,
            "program": self.program, "names": list(self.names),
            "meshes": [_mesh_doc(m) for m in self.meshes],
            "classes": [{"id": c.id, "name": c.name, "before": list(c.before),
                         "after": list(c.after)} for c in self.classes],
            "conflicts": [{"id": c.id, "name": c.name, "class_name": c.class_name,
                           "before": c.before, "after": c.after} for c in self.conflicts],
            "order": None if self.order is None else [list(o) for o in self.order],
            "steps": [{"name": c.name, "before": c.before, "after": c.after}
                      for c in self.steps],
            "step_time_s": pair(self.step_time_s), "compute_s": pair(self.compute_s),
            "communication_s": pair(self.communication_s),
            "peak_memory_bytes": pair(self.peak_memory_bytes),
            "feasible": pair(self.feasible),
            "collectives": [{"kind": c.kind, "axes": list(c.axes), "count": list(c.count),
                             "bytes": list(c.bytes), "time_s": list(c.time_s)}
                            for c in self.collectives],
            "memory_breakdown": {k: list(v) for k, v in self.memory_breakdown.items()},
            "note": self.note,
        }

    def to_text(self) -> str:
        a, b = self.names
        lines = [f"toast-lab plan diff of {self.program}: {a} → {b}"
                 + _meshes_text(self.meshes)]
        if self.same:
            lines.append("  the plans make the same decisions")
        if self.classes:
            lines.append(f"  classes that differ ({len(self.classes)}):")
            w = max(len(c.name) for c in self.classes)
            for c in self.classes:
                lines.append(f"    {c.name:<{w}}  {_axes(c.before):>12} → {_axes(c.after)}")
        if self.conflicts:
            lines.append(f"  conflicts that differ ({len(self.conflicts)}):")
            for c in self.conflicts:
                lines.append(f"    {c.name}: {c.before or 'inactive'} → {c.after or 'inactive'}")
        if self.steps:
            lines.append(f"  decisions beyond sharding that differ ({len(self.steps)}):")
            for c in self.steps:
                lines.append(f"    {c.name}: {c.before} → {c.after}")
        if self.order is not None:
            lines.append("  decision order differs (the class decided first keeps a mesh axis "
                         "two classes want on one tensor):")
            lines.append(f"    {', '.join(self.order[0])} → {', '.join(self.order[1])}")
        if self.step_time_s is not None:
            lines.append(_pair_line("step time", self.step_time_s, _ms, relative=True))
            lines.append(_pair_line("  compute", self.compute_s, _ms))
            lines.append(_pair_line("  communication", self.communication_s, _ms))
            fits = "" if all(self.feasible) else "  (" + ", ".join(
                f"{n} does not fit" for n, ok in zip(self.names, self.feasible) if not ok) + ")"
            lines.append(_pair_line("peak memory", self.peak_memory_bytes, _gib) + fits)
        if self.collectives:
            lines.append("  collectives per device per step that differ:")
            for c in self.collectives:
                lines.append(
                    f"    {c.kind:<15}{'×'.join(c.axes) or '-':<12}"
                    f"{c.count[0]:6.0f} × {_mib(c.bytes[0]):>11} → {c.count[1]:6.0f} × "
                    f"{_mib(c.bytes[1]):>11}   ({_signed(c.delta_count, '{:.0f}')}, "
                    f"{_signed(c.delta_bytes / 2**20, '{:,.1f} MiB')}, "
                    f"{_signed(c.delta_time_s * 1e3, '{:.3f} ms')})")
        elif self.step_time_s is not None:
            lines.append("  collectives: the same")
        if self.note:
            lines.append(f"  ({self.note})")
        return "\n".join(lines)

    __str__ = to_text

    def __repr__(self) -> str:
        d = self.delta_step_time_s
        step = "" if d is None else f", Δstep {d * 1e3:+.3f} ms"
        m = self.delta_peak_memory_bytes
        mem = "" if m is None else f", Δpeak {m / 2**30:+.2f} GiB"
        steps = f", {len(self.steps)} step decisions" if self.steps else ""
        return (f"PlanDiff({self.names[0]} → {self.names[1]}: {len(self.classes)} classes, "
                f"{len(self.conflicts)} conflicts{steps} differ{step}{mem})")

    def _repr_mimebundle_(self, include=None, exclude=None, **kwargs):
        """In JupyterLab: the two plans side by side (the graph view of each, read-only), the
        differing classes marked, and this diff's table; the output alone draws it again."""
        a, b = (plan._repr_mimebundle_()[PLAN_MIME] for plan in self.plans)  # {plan, view}
        data = {"diff": self.to_dict(), "a": a, "b": b}
        return {DIFF_MIME: data, "text/plain": self.to_text()}


def diff(a, b, mesh=None, names: tuple[str, str] = ("a", "b")) -> PlanDiff:
    """Compares plans `a` (before) and `b` (after) of one program: see the module docstring.

    mesh: what both are priced on; default each plan's own (else the other's). Raises
    ValueError for plans of different programs, PlanError when a plan does not fit its mesh,
    TypeError for what is not a Plan (or a Mesh).
    """
    for which, plan in (("a", a), ("b", b)):
        if not isinstance(plan, Plan):
            raise TypeError(f"tl.diff compares two Plans of one program, e.g. "
                            f"tl.diff(plans['dp'], plans['fsdp']); {which} is a "
                            f"{type(plan).__name__}: {echo(plan)}")
    if mesh is not None:
        check_mesh(mesh, "tl.diff")
    an_a, an_b = a.analysis, b.analysis
    fa, fb = an_a.program.fingerprint(), an_b.program.fingerprint()
    if fa != fb:
        raise ValueError(f"these plans are for different programs ({an_a.program.fn_name!r}, "
                         f"fingerprint {fa}; {an_b.program.fn_name!r}, fingerprint {fb}): a "
                         f"diff compares two plans of one traced function and argument shapes")
    mesh_a = mesh or a.mesh or b.mesh
    mesh_b = mesh or b.mesh or a.mesh
    if mesh_a is not None:
        a, b = a.with_mesh(mesh_a), b.with_mesh(mesh_b)
    classes = []
    for c in an_a.classes:
        before, after = a.axes_of(c.id), b.axes_of(c.name)
        if before != after:
            classes.append(ClassChange(c.id, c.name, before, after))
    conflicts = []
    for c in an_a.conflicts:
        before = a.resolution_of(c.id) if a.axes_of(c.class_id) else None
        after = b.resolution_of(c.name) if b.axes_of(c.class_name) else None
        if before != after:
            conflicts.append(ConflictChange(c.id, c.name, c.class_name, before, after))
    steps = _step_changes(a.step, b.step)
    out = dict(program=an_a.program.fn_name, names=(str(names[0]), str(names[1])),
               classes=tuple(classes), conflicts=tuple(conflicts), order=_order(a, b),
               steps=steps, meshes=(mesh_a, mesh_b), plans=(a, b))
    if mesh_a is None:
        return PlanDiff(**out, step_time_s=None, compute_s=None, communication_s=None,
                        peak_memory_bytes=None, feasible=None, collectives=(),
                        note="no mesh: the decisions only; pass mesh= (or plans made for one) "
                             "to compare step time, memory and collectives")
    ea, eb = cost_model(an_a, mesh_a).estimate(a), cost_model(an_b, mesh_b).estimate(b)
    pair = lambda f: (float(getattr(ea, f)), float(getattr(eb, f)))  # noqa: E731
    notes = []
    if mesh_a != mesh_b:
        notes.append("each plan is priced on its own mesh")
    if steps:
        notes.append("the estimates price the step as remat, micro-batches and stages "
                     "rewrite it (plan.jit's rewrite; tl.verify measures it)")
    note = "; ".join(notes) or None
    return PlanDiff(**out, step_time_s=pair("step_time_s"), compute_s=pair("compute_s"),
                    communication_s=pair("communication_s"),
                    peak_memory_bytes=pair("peak_memory_bytes"),
                    feasible=(ea.feasible, eb.feasible),
                    collectives=_collective_changes(ea.collectives, eb.collectives),
                    memory_breakdown=_breakdown(ea.memory_breakdown, eb.memory_breakdown),
                    note=note)


def _step_changes(a, b) -> tuple[StepChange, ...]:
    """The decisions beyond sharding (StepDecisions) that differ between a and b."""
    def remat(step, group):
        policy = step.policy_of(group)
        return f"{policy} overriding jax.checkpoint" if group in step.override else policy

    out = []
    for group in dict.fromkeys([g for g, _ in a.remat] + [g for g, _ in b.remat]
                               + sorted(a.override | b.override)):
        before, after = remat(a, group), remat(b, group)
        if before != after:
            out.append(StepChange(f"remat@{group}", before, after))
    if a.micro_batches != b.micro_batches:
        out.append(StepChange("micro_batches", a.micro_batches, b.micro_batches))
    for group in dict.fromkeys(p.group for p in (a.pipeline, b.pipeline) if p is not None):
        before, after = _stages(a, group), _stages(b, group)
        if before != after:
            out.append(StepChange(f"{PIPELINE_PREFIX}{group}", before, after))
    return tuple(out)


def _stages(step, group: str) -> str:
    """The stages of scanned stack `group` under StepDecisions `step`: "stage:4", "none"."""
    p = step.pipeline
    return str(p) if p is not None and p.group == group else "none"


def _order(a, b) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The classes sharded in both plans, in each one's decision order, if the orders differ."""
    both = set(a.class_axes) & set(b.class_axes)
    oa = tuple(n for n in a.class_axes if n in both)
    ob = tuple(n for n in b.class_axes if n in both)
    return None if oa == ob else (oa, ob)


def _collective_changes(ca: dict, cb: dict) -> tuple[CollectiveChange, ...]:
    """The (kind, axes) whose count or bytes differ, largest time change first."""
    zero = (0.0, 0.0, 0.0)
    out = []
    for key in dict.fromkeys(list(ca) + list(cb)):
        x = ca.get(key)
        y = cb.get(key)
        x = zero if x is None else (x.count, x.bytes, x.time_s)
        y = zero if y is None else (y.count, y.bytes, y.time_s)
        if x[0] == y[0] and x[1] == y[1]:
            continue
        kind, axes = key
        out.append(CollectiveChange(kind, tuple(axes), (float(x[0]), float(y[0])),
                                    (float(x[1]), float(y[1])), (float(x[2]), float(y[2]))))
    out.sort(key=lambda c: (-abs(c.delta_time_s), -abs(c.delta_bytes), c.kind, c.axes))
    return tuple(out)


def _breakdown(a: dict, b: dict) -> dict:
    return {k: (float(a.get(k, 0.0)), float(b.get(k, 0.0))) for k in dict.fromkeys([*a, *b])}


def _mesh_doc(mesh) -> dict | None:
    if mesh is None:
        return None
    return {"axes": dict(mesh.shape), "device": mesh.device.name}


def _meshes_text(meshes) -> str:
    def one(m):
        return " × ".join(f"{a}={n}" for a, n in m.shape.items()) + f" ({m.device.name})"
    a, b = meshes
    if a is None:
        return " (no mesh)"
    return f" on {one(a)}" if a == b else f" on {one(a)} and {one(b)}"


def _axes(axes) -> str:
    return "×".join(axes) if axes else "replicated"


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def _gib(b: float) -> str:
    return f"{b / 2**30:.2f} GiB"


def _mib(b: float) -> str:
    return f"{b / 2**20:,.1f} MiB"


def _signed(x: float, fmt: str) -> str:
    text = fmt.format(abs(x))
    return ("±" if x == 0 else "+" if x > 0 else "−") + text


# Below this a difference of seconds or bytes is rounding in the sums, not a change (the
# extension's format.ts uses the same).
NEGLIGIBLE = 1e-12


def _pair_line(label: str, pair, unit, relative: bool = False) -> str:
    a, b = pair
    d = b - a
    delta = ("±0" if abs(d) < NEGLIGIBLE else ("+" if d > 0 else "−") + unit(abs(d)))
    if relative and a:
        delta += f", {d / a * 100:+.1f}%".replace("-", "−")
    return f"  {label:<15}{unit(a):>12} → {unit(b):>12}   ({delta})"


__all__ = ["diff", "PlanDiff", "ClassChange", "ConflictChange", "StepChange", "CollectiveChange",
           "DIFF_MIME"]
