"""The expert strategies: data, fully-sharded data, tensor (Megatron) and sequence parallelism,
their 2-D combinations, the published recipes that shard one class differently in two
domains of the step (ZeRO-1/2, MaxText), and those that add pipeline stages (_pipelined.py),
each a Plan built from the class roles; where one as written does not fit in memory, also the
same sharding with its recipe's remat and micro-batches (_ladder.py)."""

from __future__ import annotations

import math
import numbers

from ..analysis import OPTIMIZER, PARAMETERS, Roles, domains, find_roles
from ..cost import cost_model as build_cost_model
from ..plan import Plan
from ..plan import check_analysis, check_mesh
from ._pipelined import add_pipelined
from ._ladder import climb, remat_ladder, variant_name

_MODEL_AXIS_NAMES = ("model", "tensor", "tp", "mp")


class Strategies(dict):
    """{name: Plan} in a fixed order, with `.skipped`: {name: why it does not apply} and
    `.variant_of`: {name of a plan with its recipe's remat or micro-batches: the strategy
    whose sharding it keeps}."""

    def __init__(self, plans, skipped, roles: Roles, variant_of=None):
        super().__init__(plans)
        self.skipped = dict(skipped)
        self.roles = roles
        self.variant_of = dict(variant_of or {})

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

    def put(self, cls, axes, domain=None) -> bool:
        if cls is None or not axes:
            return False
        fitted = _fit(self.an, self.mesh, cls, tuple(axes))
        if not fitted:
            return False
        self.plan = self.plan.with_axes(cls, fitted, domain=domain)
        self.placed += 1
        return True

    def free(self, cls, domain=None) -> bool:
        """The class holds no axes yet (in `domain`, where its own axes count too)."""
        return not self.plan.axes_of(cls, domain)


def expert(an, mesh, memory_cap: float | None = None, cost_model=None,
           fit: bool = True) -> Strategies:
    """The expert strategies that apply to this program and mesh, as plans.

    fit: where a strategy's plan as written (without stages) does not fit in `memory_cap`
    bytes per device (default: the device's memory), also offer it with its recipe's remat
    and micro-batches, the first rung of the ladder that fits (_ladder.py), named
    "<strategy> (remat full)" etc. next to it; priced on `cost_model` (default:
    tl.cost_model(an, mesh)). fit=False: the recipes alone, nothing priced.
    """
    check_analysis(an, "tl.strategies.expert")
    check_mesh(mesh, "tl.strategies.expert")
    cap = _cap(mesh, memory_cap)
    plans, skipped, roles = _sharded(an, mesh)
    ladder = remat_ladder(an) if fit else ()
    if not ladder:
        return Strategies(plans, skipped, roles)
    model = cost_model or build_cost_model(an, mesh)
    out, variant_of = {}, {}
    for name, plan in plans.items():  # each variant right after its strategy
        out[name] = plan
        # (a recipe with stages carries its own micro-batches: _pipelined.py)
        if not plan.step.is_default or model.price(plan)[1] <= cap:
            continue
        fitted = climb(plan, mesh, cap, model, ladder)
        if fitted is not None:
            variant = variant_name(name, fitted.step)
            out[variant], variant_of[variant] = fitted, name
    return Strategies(out, skipped, roles, variant_of)


def _cap(mesh, memory_cap) -> float:
    if memory_cap is None:
        return float(mesh.device.memory_bytes)
    if (isinstance(memory_cap, bool) or not isinstance(memory_cap, numbers.Real)
            or not math.isfinite(memory_cap) or memory_cap <= 0):
        raise ValueError(f"tl.strategies.expert: memory_cap must be a positive, finite number "
                         f"of bytes per device (e.g. 16 * 2**30) or None for the device's "
                         f"memory, got {memory_cap!r}")
    return float(memory_cap)


def _sharded(an, mesh) -> tuple[dict, dict, Roles]:
    """({name: Plan}, {name: why skipped}, roles) of the recipes: their sharding, and the
    stages and micro-batches of those that pipeline."""
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
            kind, cls, axes, *domain = step
            domain = domain[0] if domain else None
            if kind == "one":
                ok = b.put(cls, axes, domain)
                if not ok and step is steps[0]:
                    skipped[name] = (f"class {an.classes[cls].name!r} (size "
                                     f"{an.classes[cls].size}) cannot be split over {axes}")
                    return
            elif kind == "rest":  # those of the classes that hold no axes there yet
                for c in cls:
                    if b.free(c, domain):
                        b.put(c, axes, domain)
            elif kind == "like":  # the axes class `axes` got (where they divide these too)
                for c in cls:
                    b.put(c, b.plan.axes_of(axes), domain)
            else:
                for c in cls:
                    b.put(c, axes, domain)
        if b.placed == 0:
            skipped[name] = "no class divides over the mesh"
            return
        plans[name] = b.plan.with_mesh(mesh)

    has_batch = (roles.batch is not None, "the program has no batch-like class")
    has_seq = (roles.sequence is not None, "the program has no sequence class")
    has_tp = (bool(roles.tensor_parallel), "no parameter classes to split (no weights)")
    has_fsdp = (bool(roles.fsdp), "no parameters to shard")
    two_d = (model_axis is not None, "needs a mesh with two or more axes")
    has_opt = (bool(domains(an).optimizer_state),
               "the step has no optimizer state (no state input that only the update reads)")
    has_width = (roles.width is not None, "the model has no width class (a residual stream)")

    # a batch split into micro-batches: the inputs' leading dims go where the batch goes
    micro = ("like", roles.micro_batched, roles.batch)
    make("dp", [("one", roles.batch, every), micro], [has_batch])
    make("fsdp", [("one", roles.batch, every), micro, ("many", roles.fsdp, every)],
         [has_batch, has_fsdp])
    make("megatron", [("many", roles.tensor_parallel, every)], [has_tp])
    make("sp", [("one", roles.sequence, every)], [has_seq])
    # ZeRO-1/2 (Megatron's distributed optimizer): data parallel, with the optimizer state —
    # and the weight gradients that feed it — sharded over the same devices; the gradients are
    # reduce-scattered into it and the updated parameters all-gathered back.
    make("zero1", [("one", roles.batch, every), micro,
                   ("rest", roles.fsdp, every, OPTIMIZER)],
         [has_batch, has_fsdp, has_opt])
    if model_axis is not None:
        batch = [("one", roles.batch, data_axes), ("like", roles.micro_batched, roles.batch)]
        make("dp+tp", [*batch, ("many", roles.tensor_parallel, (model_axis,))],
             [has_batch, has_tp, two_d])
        # FSDP takes the classes tensor parallelism left (a bias's hidden dim is the only
        # class of its parameter, so FSDP lists it too)
        make("fsdp+tp", [*batch, ("many", roles.tensor_parallel, (model_axis,)),
                         ("rest", roles.fsdp, data_axes)],
             [has_batch, has_tp, has_fsdp, two_d])
        make("dp+sp", [*batch, ("one", roles.sequence, (model_axis,))],
             [has_batch, has_seq, two_d])
        if len(data_axes) >= 2:  # batch over every data axis, parameters over the innermost
            make("dp+fsdp+tp", [*batch, ("many", roles.tensor_parallel, (model_axis,)),
                                ("rest", roles.fsdp, data_axes[-1:])],
                 [has_batch, has_tp, has_fsdp])
        _published(make, roles, data_axes, model_axis,
                   [has_batch, has_tp, has_fsdp, has_seq, has_opt, has_width])
    else:
        for name in ("dp+tp", "fsdp+tp", "dp+sp", "zero1+tp", "fsdp+tp+sp", "maxtext"):
            skipped[name] = "needs a mesh with two or more axes"
    add_pipelined(an, mesh, plans, skipped)
    return plans, skipped, roles


def _published(make, roles, data_axes, model_axis, needs) -> None:
    """The 2-D recipes of published large-model runs. Tensor parallelism is decided before
    FSDP, which takes only the classes it left (so a weight is split once over each axis)."""
    has_batch, has_tp, has_fsdp, has_seq, has_opt, has_width = needs
    batch = ("one", roles.batch, data_axes)
    micro = ("like", roles.micro_batched, roles.batch)
    tp = ("many", roles.tensor_parallel, (model_axis,))
    make("zero1+tp", [batch, micro, tp, ("rest", roles.fsdp, data_axes, OPTIMIZER)],
         [has_batch, has_tp, has_fsdp, has_opt])
    # Megatron-SP (Korthikanti et al., 2022) with FSDP: activations between the tensor-parallel
    # regions sharded by position over the model axis (decided after the tensor-parallel
    # classes, which keep the axis inside attention and the MLP): an all-gather before and a
    # reduce-scatter after each region instead of an all-reduce; weights FSDP over the data
    # axes (every one; over the innermost only in the `dp+` variant).
    sp = ("one", roles.sequence, (model_axis,))
    make("fsdp+tp+sp", [batch, micro, tp, sp, ("rest", roles.fsdp, data_axes)],
         [has_batch, has_tp, has_fsdp, has_seq])
    if len(data_axes) >= 2:
        make("dp+fsdp+tp+sp", [batch, micro, tp, sp, ("rest", roles.fsdp, data_axes[-1:])],
             [has_batch, has_tp, has_fsdp, has_seq])
    # MaxText's default rules: activations' embed ("activation_embed") on the tensor axis,
    # the weights' and optimizer state's embed on the innermost data axis ("fsdp"), heads, MLP
    # and vocabulary on the tensor axis, the batch over every data axis.
    fsdp = data_axes[-1:]
    make("maxtext", [batch, micro, ("one", roles.width, (model_axis,)), tp,
                     ("one", roles.width, fsdp, PARAMETERS), ("one", roles.width, fsdp, OPTIMIZER),
                     ("rest", roles.fsdp, fsdp)],
         [has_batch, has_tp, has_width, has_opt])
