"""A plan as JAX objects: NamedShardings, sharding constraints, jax.jit (DESIGN.md §8)."""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..program import as_function, state_inputs, trace
from ..rules import NEED_REPLICATION, REDUCTION

# Where plan.jit pins values with `with_sharding_constraint`:
#   "conflicts": only the values of conflicts whose class is sharded (XLA cannot guess those);
#   "compute":   also every result of an op with a contracting (reduction) factor — matmuls,
#                convolutions, reductions — so XLA follows the plan where the flops are;
#   "all":       every value (slow to compile; for debugging the cost model);
#   "none":      only the in/out shardings.
CONSTRAINT_POLICIES = ("none", "conflicts", "compute", "all")


def spec_of(dim_axes) -> PartitionSpec:
    """The PartitionSpec of per-dim mesh axes: P("data") rather than P("data", None, None)."""
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in dim_axes]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def shardings(plan, jax_mesh):
    """(in_shardings, out_shardings): NamedSharding pytrees shaped like the function's
    positional arguments and its result."""
    prog = plan.analysis.program
    flat_in = [NamedSharding(jax_mesh, plan.partition_spec(v)) for v in prog.inputs]
    args_sh, _ = jax.tree_util.tree_unflatten(prog.in_tree, flat_in)
    flat_out = [NamedSharding(jax_mesh, plan.partition_spec(v)) for v in prog.outputs]
    return tuple(args_sh), jax.tree_util.tree_unflatten(prog.out_tree, flat_out)


def partition_specs(plan):
    """(in_specs, out_specs): PartitionSpec pytrees, for code that builds its own shardings."""
    prog = plan.analysis.program
    args, _ = jax.tree_util.tree_unflatten(prog.in_tree,
                                           [plan.partition_spec(v) for v in prog.inputs])
    out = jax.tree_util.tree_unflatten(prog.out_tree,
                                       [plan.partition_spec(v) for v in prog.outputs])
    return tuple(args), out


def constraint_values(plan, policy: str = "compute") -> frozenset[int]:
    """The values plan.jit constrains under `policy` (see CONSTRAINT_POLICIES)."""
    if policy not in CONSTRAINT_POLICIES:
        raise ValueError(f"constraints={policy!r}: choose one of {CONSTRAINT_POLICIES}")
    an = plan.analysis
    prog = an.program
    if policy == "none":
        return frozenset()
    if policy == "all":
        return frozenset(v.id for v in prog.values if v.origin == "result" and v.ndim)
    out: set[int] = set()
    sharded = {k for k, axes in plan.assignments if axes}
    for c in an.conflicts:
        if c.class_id in sharded:
            out.update(c.values)
    if policy == "compute":
        for op, rule in zip(prog.ops, an.op_rules):
            if op.body or REDUCTION not in rule.kinds:
                continue
            out.update(r for r in op.results if prog.values[r].ndim)
    # Region outputs are constrained by their bodies; inputs by in_shardings.
    return frozenset(v for v in out if prog.values[v].origin == "result"
                     and not prog.ops[prog.values[v].producer].body)


def gathered_operands(plan) -> dict[tuple[int, int], object]:
    """{(op, operand index): PartitionSpec} where the op needs a sharded dim whole.

    A need-replication factor (the window of a convolution or a pooling, a sorted or scanned
    dim) makes the op read that operand dim whole: the plan gathers it just before the op, as
    the cost model charges. Saying so explicitly also keeps XLA off partitioning paths it gets
    wrong (jax 0.10.2 all-reduces a spatially sharded convolution's weight gradient over every
    device on a multi-axis mesh; see tests/test_property.py).
    """
    an = plan.analysis
    prog = an.program
    out = {}
    for op, rule in zip(prog.ops, an.op_rules):
        if op.body or NEED_REPLICATION not in rule.kinds or rule.fallback:
            continue
        for t, dims in enumerate(rule.operands):
            u = op.operands[t]
            axes = plan.value_axes(u)
            whole = [d for d, fs in enumerate(dims)
                     if fs and axes[d] and rule.kinds[fs[0]] is NEED_REPLICATION]
            if whole:
                out[(op.id, t)] = spec_of(() if d in whole else a for d, a in enumerate(axes))
    return out


def constrained(plan, jax_mesh, policy: str = "compute") -> Callable:
    """The traced function, re-run op by op with sharding constraints at the chosen values
    (and, unless the policy is "none", on operands the plan gathers before their op)."""
    targets = constraint_values(plan, policy)
    cache: dict[int, NamedSharding] = {}

    def constrain(vid, x):
        sharding = cache.get(vid)
        if sharding is None:
            sharding = cache[vid] = NamedSharding(jax_mesh, plan.partition_spec(vid))
        return jax.lax.with_sharding_constraint(x, sharding)

    uses = gathered_operands(plan) if policy != "none" else {}

    def gather(op_id, t, x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(jax_mesh, uses[(op_id, t)]))

    return as_function(plan.analysis.program, constrain, targets, gather, frozenset(uses))


def donated_arguments(program) -> tuple[int, ...]:
    """The positional arguments a training loop donates: those holding training state (the
    parameters and optimizer state the step returns updated), so that XLA may write the new
    state into their buffers. The cost model's `donate` and `plan.jit` agree on these."""
    state = state_inputs(program)
    args = program.in_tree.children()[0]  # in_tree is the treedef of (args, kwargs)
    out, first = [], 0
    for i, arg in enumerate(args.children()):
        leaves = program.inputs[first:first + arg.num_leaves]
        if any(v in state for v in leaves):
            out.append(i)
        first += arg.num_leaves
    return tuple(out)


def jit(plan, fn: Callable | None, jax_mesh, constraints: str = "compute", donate: bool = True,
        **jit_kwargs):
    """jax.jit of the plan's function with its in/out shardings and sharding constraints.

    fn: the function that was traced (checked against the program's fingerprint), or None to
    use the traced program itself. donate: donate the training-state arguments
    (`donated_arguments`), as training loops do and as the cost model assumes by default; the
    arrays passed for them are consumed by the call. Extra keyword arguments go to jax.jit
    (an explicit donate_argnums or donate_argnames wins over `donate`).
    """
    prog = plan.analysis.program
    if fn is not None and fn is not prog.fn:
        _check_same_program(fn, prog)
    in_sh, out_sh = shardings(plan, jax_mesh)
    body = constrained(plan, jax_mesh, constraints)
    if donate and "donate_argnums" not in jit_kwargs and "donate_argnames" not in jit_kwargs:
        jit_kwargs["donate_argnums"] = donated_arguments(prog)
    return jax.jit(body, in_shardings=in_sh, out_shardings=out_sh, **jit_kwargs)


def _check_same_program(fn, prog) -> None:
    args, kwargs = jax.tree_util.tree_unflatten(
        prog.in_tree, [jax.ShapeDtypeStruct(prog.values[v].shape, prog.values[v].dtype)
                       for v in prog.inputs])
    other = trace(fn, *args, **kwargs)
    if other.fingerprint() != prog.fingerprint():
        raise ValueError(
            f"plan.jit: {getattr(fn, '__name__', fn)!r} is not the function this plan was made "
            f"for ({prog.fn_name!r}: program fingerprints {other.fingerprint()} != "
            f"{prog.fingerprint()}); trace and analyse it first")


def logical_axis_rules(plan) -> tuple[tuple[str, str | tuple[str, ...] | None], ...]:
    """(class name, mesh axes) pairs in the style of flax's logical axis rules, every class
    listed (None for replicated), in decision order first."""
    an = plan.analysis
    rules = []
    seen = set()
    for k, axes in plan.assignments:
        seen.add(k)
        rules.append((an.classes[k].name, None if not axes else axes[0] if len(axes) == 1
                      else tuple(axes)))
    rules += [(c.name, None) for c in an.classes if c.id not in seen]
    return tuple(rules)
