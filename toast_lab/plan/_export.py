"""A plan as JAX objects: NamedShardings, sharding constraints, jax.jit (DESIGN.md §8)."""

from __future__ import annotations

from typing import Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec

from ..analysis import DOMAINS, crossing_reads, domain_boundaries
from ..program import as_function, check_args, trace, updated_inputs
from ..rules import NEED_REPLICATION, PASS_THROUGH, REDUCTION
from ._step_replay import StepReplay

# Where plan.jit pins values with `with_sharding_constraint`:
#   "conflicts": only the values of conflicts whose class is sharded (XLA cannot guess those),
#                and, in a plan with per-domain overrides, the values on both sides of every
#                op that crosses domains (a weight read by a matmul, the update read by the
#                parameter step): where the plan reshards, XLA must too;
#   "compute":   also every result of an op with a contracting (reduction) factor — matmuls,
#                convolutions, reductions — so XLA follows the plan where the flops are, and
#                every reshape the plan reshards at (see _resharding_reshapes) and both
#                sides of every reshape or concatenate it slices at (see _local_slices);
#   "all":       every value (slow to compile; for debugging the cost model);
#   "none":      only the in/out shardings.
CONSTRAINT_POLICIES = ("none", "conflicts", "compute", "all")


def spec_of(dim_axes) -> PartitionSpec:
    """The PartitionSpec of per-dim mesh axes: P("data") rather than P("data", None, None)."""
    entries = [None if not a else a[0] if len(a) == 1 else tuple(a) for a in dim_axes]
    while entries and entries[-1] is None:
        entries.pop()
    return PartitionSpec(*entries)


def as_jax_mesh(plan, jax_mesh):
    """The jax Mesh to export to, after checking the plan fits it: a toast_lab Mesh is turned
    into one (`mesh.jax_mesh()`); a PlanError names a class whose axes the mesh lacks or whose
    size they do not divide, before JAX meets it at compile time."""
    from ._mesh import Mesh

    if isinstance(jax_mesh, Mesh):
        mesh, jax_mesh = jax_mesh, jax_mesh.jax_mesh()
    else:
        shape = getattr(jax_mesh, "shape", None)
        if not hasattr(jax_mesh, "axis_names") or not hasattr(shape, "items"):
            raise TypeError(f"expected a jax.sharding.Mesh (or a toast_lab Mesh), got "
                            f"{type(jax_mesh).__name__}: make one with mesh.jax_mesh()")
        mesh = Mesh(tuple(shape.items()))
        jax_mesh = _auto_axes(jax_mesh)
    plan.validate(mesh)
    return jax_mesh


def _auto_axes(jax_mesh):
    """The mesh with every axis Auto: jax.make_mesh declares its axes Explicit (jax >= 0.7),
    where sharding follows the types and with_sharding_constraint is refused; the plan's
    shardings and constraints are what say where each value lives."""
    types = getattr(jax_mesh, "axis_types", None)
    auto = jax.sharding.AxisType.Auto
    if types is None or all(t == auto for t in types):
        return jax_mesh
    return jax.sharding.Mesh(jax_mesh.devices, jax_mesh.axis_names,
                             axis_types=(auto,) * len(jax_mesh.axis_names))


def shardings(plan, jax_mesh):
    """(in_shardings, out_shardings): NamedSharding pytrees shaped like the function's
    positional arguments and its result."""
    jax_mesh = as_jax_mesh(plan, jax_mesh)
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
    active = plan.conflict_resolutions
    for c in an.conflicts:
        if c.name in active:
            out.update(c.values)
    if plan.overrides:
        out.update(domain_boundaries(an))
    if policy == "compute":
        for op, rule in zip(prog.ops, an.op_rules):
            if op.body or REDUCTION not in rule.kinds:
                continue
            out.update(r for r in op.results if prog.values[r].ndim)
        out.update(_resharding_reshapes(plan))
        out.update(_local_slices(plan))
    # Region outputs are constrained by their bodies; inputs by in_shardings.
    out = {v for v in out if prog.values[v].origin == "result"
           and not prog.ops[prog.values[v].producer].body}
    # but for a stack a scan hands on (per-layer gradients) sharded unlike its slices: pinned,
    # XLA reshards it once after the loop, as the cost model charges; unpinned, its readers
    # each reshard it (jax 0.10.2: an all-to-all of llama's kv-projection gradients before
    # each of Adam's moments)
    for _, r, b in prog.handed_on_stacks():
        if plan.value_axes(r) != ((),) + tuple(plan.value_axes(b)):
            out.add(r)
    return frozenset(out)


def _resharding_reshapes(plan) -> set[int]:
    """The results of reshapes that read their operand on fewer axes than it holds (read_axes:
    an axis the result does not shard, or one that moves from a compound dim's major part to a
    minor one): the plan gathers or moves it there, and so does the cost model. Unpinned, XLA
    carries the operand's sharding through the reshape on sub-axes where it can (a GQA reshape
    of 4 heads sharded over 4 devices into 2 kv heads x 2: 2 x 2 sub-axes) and reshards
    piecemeal downstream instead: llama megatron (jax 0.10.2) paid 42 all-gathers, 1.8 MB, in
    its attention, against the 4 of 262 KB it pays pinned, which the model predicts exactly;
    a batch split into 4 micro-batches whose examples are sharded on (data, model) was
    gathered over `data` every micro-batch (4 KB, and 31 KB of permutes), against one
    all-to-all of the tokens' 256 B shard pinned."""
    an = plan.analysis
    prog = an.program
    out: set[int] = set()
    for op, rule in zip(prog.ops, an.op_rules):
        if op.primitive != "reshape" or op.body:
            continue
        own = plan.value_axes(op.operands[0])
        if rule.fallback:  # no factors to follow: where an axis leaves the value altogether
            lost = {a for d in own for a in d} - {a for d in plan.value_axes(op.results[0])
                                                  for a in d}
        else:
            lost = {a for have, want in zip(own, read_axes(plan, op, rule, 0))
                    for a in set(have) - set(want)}
        if lost:
            out.add(op.results[0])
    return out


def _local_slices(plan) -> set[int]:
    """Both sides of every reshape or concatenate whose result holds mesh axes an operand does
    not: the plan computes that operand whole on them and slices it locally.

    Unpinned, XLA carries the result's sharding back through the reshape onto sub-axes of the
    split dims (a group norm's [B, T, C] on 8 devices over C read as [B, T, G=4, C/G]: G on 4,
    C/G on 2) and on to the elementwise ops before it, which the plan computes whole: on a 1-D
    conv autoencoder under Megatron (jax 0.10.2) XLA ran 0.73 of the flops the plan says,
    all-reduced and gathered the group statistics, and gathered the gradient of the group
    norm's input again before the convolution's backward that needs it whole (all-gather bytes
    2.0x the plan's); with the operand pinned XLA compiles what the plan says, the estimate's
    collectives exactly. A concatenate likewise: llama's rotate-half, whose result shards the
    head dim where its halves do not, was carried back into the halves and cut from the input
    as windows, 8 collective-permutes (60 KiB) a step the plan never pays.

    The result is pinned too: left to XLA, propagation picks the sliced value's sharding from
    its readers (haiku-transformer random0's queries went on their heads over "model", against
    the plan, and the attention matmuls moved k to match: all-to-alls and all-reduces the
    plan does not pay)."""
    an = plan.analysis
    prog = an.program
    out: set[int] = set()
    for op in prog.ops:
        if op.primitive not in ("reshape", "concatenate") or op.body:
            continue
        r = op.results[0]
        for u in op.operands:
            held = {a for d in plan.value_axes(u) for a in d}
            if any(a not in held for d in plan.value_axes(r) for a in d):
                out.update((u, r))
    return out


def read_axes(plan, op, rule, t: int) -> tuple[tuple[str, ...], ...]:
    """Per dim of operand `t` of `op`: the mesh axes the op reads it in, as the cost model
    charges it (cost/_operand_rows.py's rows): a dim whose factor maps to a result dim like that
    result dim, a contracted dim (or one only operands share) on the axes all its operands
    share, a dim the op needs whole on none; other dims as the operand is. Where that would use
    an axis twice, a contracted dim keeps it (its partial sums are reduce-scattered into the
    result instead)."""
    on_result: dict[int, tuple[int, int, bool]] = {}
    for j, dims in enumerate(rule.results):
        for e, factors in enumerate(dims):
            for k, f in enumerate(factors):
                on_result.setdefault(f, (op.results[j], e, k == 0))
    own = plan.value_axes(op.operands[t])
    want = list(own)
    follow = []
    for d, factors in enumerate(rule.operands[t]):
        if not factors:
            continue
        f = factors[0]  # a compound dim is sharded like its major factor
        kind = rule.kinds[f]
        if kind is NEED_REPLICATION:
            want[d] = ()
        elif kind is PASS_THROUGH and f in on_result:
            r, e, major = on_result[f]
            want[d] = ()
            if major:
                follow.append((d, plan.value_axes(r)[e]))
        else:
            shared = set(own[d])
            for s, dims in enumerate(rule.operands):
                for d2, fs in enumerate(dims):
                    if fs and fs[0] == f:
                        shared &= set(plan.value_axes(op.operands[s])[d2])
            want[d] = tuple(a for a in own[d] if a in shared)
    used = {a for axes in want for a in axes}
    for d, axes in follow:
        want[d] = tuple(a for a in axes if a not in used)
        used.update(want[d])
    return tuple(want)


def boundary_reads(plan) -> dict[tuple[int, int], object]:
    """{(op, operand index): PartitionSpec} for the operands an op reads from another domain
    than its results' (a weight read by a matmul, a gradient by the optimizer, the update by
    the parameter step), where the plan reshards them: the spec the op reads them in.

    Without it XLA picks its own way between the two shardings, which costs what the plan does
    not say: on the tiny GPT it gathers Megatron-SP's FSDP weights again in the backward (25%
    more collective bytes than the estimate; with it, 3%), and on some convolutions it computes
    wrong gradients (jax 0.10.2: a conv whose kernel's input features are sharded over the
    axes of the input's batch and height). With it, every read of a weight asks for the same
    gathered spec, and XLA gathers it once."""
    an = plan.analysis
    prog = an.program
    crossing = crossing_reads(an)
    out = {}
    for op, rule in zip(prog.ops, an.op_rules):
        if op.body or rule.fallback:
            continue
        for t, u in enumerate(op.operands):
            if (op.id, u) not in crossing:
                continue
            spec = spec_of(read_axes(plan, op, rule, t))
            if spec != plan.partition_spec(u):
                out[(op.id, t)] = spec
    return out


def gathered_operands(plan) -> dict[tuple[int, int], object]:
    """{(op, operand index): PartitionSpec} where the op needs a sharded dim whole.

    A need-replication factor (the window of a convolution or a pooling, a sorted or scanned
    dim) makes the op read that operand dim whole: the plan gathers it just before the op, as
    the cost model charges, and reads the other dims as the cost model does too (read_axes: a
    dim the result shards, sharded like it, so an axis leaving the window for the batch moves
    there rather than being gathered as well). Saying so explicitly also keeps XLA off
    partitioning paths it gets wrong (jax 0.10.2 all-reduces a spatially sharded
    convolution's weight gradient over every device on a multi-axis mesh; see
    tests/test_property.py).
    """
    an = plan.analysis
    prog = an.program
    out = {}
    for op, rule in zip(prog.ops, an.op_rules):
        if op.body or NEED_REPLICATION not in rule.kinds or rule.fallback:
            continue
        for t, dims in enumerate(rule.operands):
            if _sharded_whole_dims(rule, dims, plan.value_axes(op.operands[t])):
                out[(op.id, t)] = spec_of(read_axes(plan, op, rule, t))
    return out


def _sharded_whole_dims(rule, dims, axes) -> list[int]:
    """The dims of one operand or result of `rule` (its factors per dim, `dims`) that the op
    needs whole (a need-replication factor) and the plan shards (`axes`, per dim)."""
    return [d for d, fs in enumerate(dims)
            if fs and axes[d] and rule.kinds[fs[0]] is NEED_REPLICATION]


# Windowed reductions: pooling and the ops of its gradient. Partitioned along a sharded window
# dim, even from whole operands, XLA computes some of them wrong (jax 0.10.2: the gradient of
# an average pool whose pooled width is sharded, of a 3x3 stride-1 max pool sharded on height
# or width), so plan.jit has them computed whole on those dims, then sliced (see
# whole_results). Convolutions are not among them: from whole operands XLA slices their window
# correctly and computes only the result's shard.
WINDOWED_REDUCTIONS = frozenset({"reduce_window_sum", "reduce_window_max", "reduce_window_min",
                                 "reduce_window", "select_and_scatter_add",
                                 "select_and_gather_add"})


def whole_results(plan) -> dict[int, PartitionSpec]:
    """{value: PartitionSpec} for the results of windowed reductions (WINDOWED_REDUCTIONS)
    whose window dims the plan shards: the spec they are computed in, whole on those dims.
    The op then runs on whole windows from its whole operands (gathered_operands), and its
    result is sliced to the plan's sharding, a local slice without communication."""
    an = plan.analysis
    prog = an.program
    out = {}
    for op, rule in zip(prog.ops, an.op_rules):
        if op.body or op.primitive not in WINDOWED_REDUCTIONS or rule.fallback:
            continue
        for j, dims in enumerate(rule.results):
            r = op.results[j]
            axes = plan.value_axes(r)
            whole = _sharded_whole_dims(rule, dims, axes)
            if whole:
                out[r] = spec_of(() if d in whole else a for d, a in enumerate(axes))
    return out


def constrained(plan, jax_mesh, policy: str = "compute", program=None) -> Callable:
    """The traced function, re-run op by op with sharding constraints at the chosen values
    (and, unless the policy is "none", on the operands the plan reshards just before their
    op: dims it needs whole, and what it reads from another domain, see boundary_reads; and
    on the results of windowed reductions, computed whole on their window dims before they
    take the plan's sharding, see whole_results).

    program: the program to re-run (default: the plan's own), one with the same ops and
    wiring (`same_structure`), e.g. the user's function traced again with other constants.
    The function checks, when jax traces it, that it is called with the shapes traced.
    A plan with decisions beyond sharding (`plan.step`: remat, micro-batches) runs the
    program rewritten by them (_step_replay.py), with the same constraints.
    """
    targets = constraint_values(plan, policy)
    whole = whole_results(plan) if policy != "none" else {}
    targets = targets | frozenset(whole)
    cache: dict[int, NamedSharding] = {}

    def constrain(vid, x):
        if vid in whole:
            x = jax.lax.with_sharding_constraint(x, NamedSharding(jax_mesh, whole[vid]))
        sharding = cache.get(vid)
        if sharding is None:
            sharding = cache[vid] = NamedSharding(jax_mesh, plan.partition_spec(vid))
        return jax.lax.with_sharding_constraint(x, sharding)

    uses = gathered_operands(plan) if policy != "none" else {}
    if policy != "none":
        uses.update(boundary_reads(plan))

    def gather(op_id, t, x):
        return jax.lax.with_sharding_constraint(x, NamedSharding(jax_mesh, uses[(op_id, t)]))

    program = plan.analysis.program if program is None else program
    runner = None
    if not plan.step.is_default:  # remat and micro-batches: the step rewritten as it runs
        runner = StepReplay(plan, program, jax_mesh, constrain, targets, gather,
                            frozenset(uses), plan.partition_spec)
    return _checking_shapes(program, as_function(program, constrain, targets, gather,
                                                 frozenset(uses), runner))


def _checking_shapes(program, fn: Callable) -> Callable:
    """fn, refusing arguments of other shapes or dtypes than the program was traced with."""

    def checked(*args, **kwargs):
        check_args(program, args, kwargs, "plan.jit",
                   "A plan is for the shapes it was made for: trace, analyse and plan these "
                   "shapes.")
        return fn(*args, **kwargs)

    checked.__name__ = fn.__name__
    return checked


def donated_arguments(program) -> tuple[int, ...]:
    """The positional arguments a training loop donates: those holding training state the step
    returns updated (parameters, optimizer state), so that XLA may write the new state into
    their buffers. A forward pass or a loss donates nothing: its parameters are read again by
    the next call. The cost model's `donate` and `plan.jit` agree on these."""
    state = updated_inputs(program)
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
    jax_mesh = as_jax_mesh(plan, jax_mesh)
    # A function other than the traced one (a fresh closure, another learning rate) runs as
    # itself: its own program, re-traced, once it has the plan's ops and wiring.
    own = _retraced(fn, prog) if fn is not None and fn is not prog.fn else prog
    in_sh, out_sh = shardings(plan, jax_mesh)
    body = constrained(plan, jax_mesh, constraints, own)
    if donate and "donate_argnums" not in jit_kwargs and "donate_argnames" not in jit_kwargs:
        jit_kwargs["donate_argnums"] = donated_arguments(prog)
    if not _has_kwargs(prog):
        return jax.jit(body, in_shardings=in_sh, out_shardings=out_sh, **jit_kwargs)
    # jax.jit takes no in_shardings with keyword arguments: pass them as one more positional
    # pytree after the positional arguments (whose indices, and so donation, are unchanged).
    _, kw_sh = jax.tree_util.tree_unflatten(
        prog.in_tree, [NamedSharding(jax_mesh, plan.partition_spec(v)) for v in prog.inputs])
    packed = jax.jit(lambda *args: body(*args[:-1], **args[-1]),
                     in_shardings=(*in_sh, kw_sh), out_shardings=out_sh, **jit_kwargs)
    return KeywordStep(packed)


def _has_kwargs(prog) -> bool:
    _, kwargs = jax.tree_util.tree_unflatten(prog.in_tree, [None] * len(prog.inputs))
    return bool(kwargs)


class KeywordStep:
    """plan.jit's result for a function traced with keyword arguments: call it like the
    function (`step(*args, **kwargs)`); `lower(*args, **kwargs)` gives a Lowered whose
    compiled step takes `(*args, kwargs)`."""

    def __init__(self, packed):
        self.packed = packed

    def __call__(self, *args, **kwargs):
        return self.packed(*args, kwargs)

    def lower(self, *args, **kwargs):
        return self.packed.lower(*args, kwargs)


def _retraced(fn, prog):
    """fn traced on the program's argument shapes; it must have the program's ops, wiring and
    shapes (its constants may differ: they are its own), else the plan is not for it."""
    args, kwargs = jax.tree_util.tree_unflatten(
        prog.in_tree, [jax.ShapeDtypeStruct(prog.values[v].shape, prog.values[v].dtype)
                       for v in prog.inputs])
    other = trace(fn, *args, **kwargs)
    if not same_structure(other, prog):
        raise ValueError(
            f"plan.jit: {getattr(fn, '__name__', fn)!r} is not the function this plan was made "
            f"for ({prog.fn_name!r}: program fingerprints {other.fingerprint()} vs "
            f"{prog.fingerprint()}, or the same ops wired differently); trace and analyse it "
            f"first")
    return other


def same_structure(a, b) -> bool:
    """The same inputs, ops (primitive, operands, results) and value shapes and dtypes: a plan
    for one, keyed by value ids, holds for the other. Constants and literals may differ."""
    if a.fingerprint() != b.fingerprint() or len(a.values) != len(b.values) \
            or a.inputs != b.inputs or a.outputs != b.outputs or a.in_tree != b.in_tree:
        return False
    return all(x.operands == y.operands and x.results == y.results
               for x, y in zip(a.ops, b.ops)) and \
        all(u.shape == v.shape and str(u.dtype) == str(v.dtype)
            for u, v in zip(a.values, b.values))


# (class name, mesh axes: one name, a tuple of them, or None for replicated) pairs
AxisRules = tuple[tuple[str, str | tuple[str, ...] | None], ...]


def logical_axis_rules(plan, domain: str | None = None) -> AxisRules:
    """(class name, mesh axes) pairs in the style of flax's logical axis rules, every class
    listed (None for replicated), in decision order first. domain: the axes the classes take
    in that domain (a MaxText-style plan has one set of rules for the weights, "parameters",
    and one for the activations, "compute")."""
    an = plan.analysis
    rules = []
    seen = set()
    for k, axes in plan.assignments:
        seen.add(k)
        if domain is not None:
            axes = plan.axes_of(k, domain)
        rules.append((an.classes[k].name, None if not axes else axes[0] if len(axes) == 1
                      else tuple(axes)))
    rules += [(c.name, None) for c in an.classes if c.id not in seen]
    return tuple(rules)


def logical_axis_rules_by_domain(plan) -> dict[str, AxisRules]:
    """{domain: logical_axis_rules(plan, domain)} for each domain in which the plan overrides
    a class's axes (e.g. "optimizer" for ZeRO-1's embed@optimizer), in DOMAINS order: the
    complete rules for that domain's arrays (its parameters, its optimizer state), which the
    plan's own rules do not say. Empty for a plan without overrides."""
    used = {domain for _, domain, _ in plan.overrides}
    return {d: logical_axis_rules(plan, d) for d in DOMAINS if d in used}
