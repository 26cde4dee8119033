"""The expert strategies: data, fully-sharded data, tensor (Megatron) and sequence parallelism,
and their 2-D combinations, each a Plan built from the class roles."""

from __future__ import annotations

from ..plan import Plan
from ._roles import Roles, find_roles

_MODEL_AXIS_NAMES = ("model", "tensor", "tp", "mp")


class Strategies(dict):
    """{name: Plan} in a fixed order, with `.skipped`: {name: why it does not apply}."""

    def __init__(self, plans, skipped, roles: Roles):
        super().__init__(plans)
        self.skipped = dict(skipped)
        self.roles = roles

    def __repr__(self) -> str:
        lines = [f"  {name}: {plan!r}" for name, plan in self.items()]
        lines += [f"  {name}: skipped ({why})" for name, why in self.skipped.items()]
        return "Strategies(\n" + "\n".join(lines) + "\n)"


def split_axes(mesh) -> tuple[tuple[str, ...], str | None]:
    """(data axes, model axis) of a mesh; a 1-D mesh has no separate model axis."""
    names = tuple(mesh.axis_names)
    if len(names) == 1:
        return names, None
    model = next((a for a in names if a.lower() in _MODEL_AXIS_NAMES), names[-1])
    return tuple(a for a in names if a != model), model


def _fit(an, mesh, cls: int, axes: tuple[str, ...]) -> tuple[str, ...]:
    """The longest prefix of `axes` whose devices divide the class (may be empty)."""
    size = an.classes[cls].size
    while axes:
        ways = 1
        for a in axes:
            ways *= mesh.axis_size(a)
        if size % ways == 0:
            return axes
        axes = axes[:-1]
    return ()


class _Builder:
    def __init__(self, an, mesh):
        self.an, self.mesh = an, mesh
        self.plan = Plan.replicated(an)
        self.placed = 0

    def put(self, cls, axes) -> bool:
        if cls is None or not axes:
            return False
        fitted = _fit(self.an, self.mesh, cls, tuple(axes))
        if not fitted:
            return False
        self.plan = self.plan.with_axes(cls, fitted)
        self.placed += 1
        return True


def expert(an, mesh) -> Strategies:
    """The expert strategies that apply to this program and mesh, as plans."""
    roles = find_roles(an)
    data_axes, model_axis = split_axes(mesh)
    every = tuple(mesh.axis_names)
    plans: dict[str, Plan] = {}
    skipped: dict[str, str] = {}

    def make(name, steps, needs):
        missing = [why for ok, why in needs if not ok]
        if missing:
            skipped[name] = "; ".join(missing)
            return
        b = _Builder(an, mesh)
        for step in steps:
            kind, cls, axes = step
            if kind == "one":
                ok = b.put(cls, axes)
                if not ok and step is steps[0]:
                    skipped[name] = (f"class {an.classes[cls].name!r} (size "
                                     f"{an.classes[cls].size}) cannot be split over {axes}")
                    return
            else:
                for c in cls:
                    b.put(c, axes)
        if b.placed == 0:
            skipped[name] = "no class divides over the mesh"
            return
        plans[name] = b.plan.with_mesh(mesh)

    has_batch = (roles.batch is not None, "the program has no batch-like class")
    has_seq = (roles.sequence is not None, "the program has no sequence class")
    has_tp = (bool(roles.tensor_parallel), "no parameter classes to split (no weights)")
    has_fsdp = (bool(roles.fsdp), "no parameters to shard")
    two_d = (model_axis is not None, "needs a mesh with two or more axes")

    make("dp", [("one", roles.batch, every)], [has_batch])
    make("fsdp", [("one", roles.batch, every), ("many", roles.fsdp, every)],
         [has_batch, has_fsdp])
    make("megatron", [("many", roles.tensor_parallel, every)], [has_tp])
    make("sp", [("one", roles.sequence, every)], [has_seq])
    if model_axis is not None:
        make("dp+tp", [("one", roles.batch, data_axes),
                       ("many", roles.tensor_parallel, (model_axis,))],
             [has_batch, has_tp, two_d])
        make("fsdp+tp", [("one", roles.batch, data_axes),
                         ("many", roles.tensor_parallel, (model_axis,)),
                         ("many", roles.fsdp, data_axes)],
             [has_batch, has_tp, has_fsdp, two_d])
        make("dp+sp", [("one", roles.batch, data_axes), ("one", roles.sequence, (model_axis,))],
             [has_batch, has_seq, two_d])
        if len(data_axes) >= 2:  # batch over every data axis, parameters over the innermost
            make("dp+fsdp+tp", [("one", roles.batch, data_axes),
                                ("many", roles.tensor_parallel, (model_axis,)),
                                ("many", roles.fsdp, data_axes[-1:])],
                 [has_batch, has_tp, has_fsdp])
    else:
        for name in ("dp+tp", "fsdp+tp", "dp+sp"):
            skipped[name] = "needs a mesh with two or more axes"
    return Strategies(plans, skipped, roles)
