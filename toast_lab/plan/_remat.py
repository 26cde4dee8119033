"""Remat as a rewrite of the traced, already differentiated step: which values each layer
group stops keeping, and what its backward pass recomputes instead.

The traced step holds JAX's forward pass, whose ops hand residuals to the backward pass
(analysis/_layer_groups.py). A remat policy says which of a group's residuals stay (its
inputs always; under "dots_with_no_batch_dims" also the results of its matmuls without batch
dims, as `jax.checkpoint_policies.dots_with_no_batch_dims_saveable` decides); the others are
computed again, in the backward pass, from what stays. As in `jax.checkpoint`'s transpose
(jax/_src/ad_checkpoint.py, `remat_transpose` and its lowering), the recomputation reads what
stays through one `optimization_barrier` together with the cotangents that reach the group's
backward pass first, so XLA neither merges it with the forward pass nor runs it before the
backward pass needs it.

- An unrolled unit (a layer, a scope: `UnitRemat`) recomputes just before the first backward
  op that reads one of its dropped residuals (the `trigger`).
- A unit the user wraps in `jax.checkpoint` keeps the user's choice, unless the plan overrides
  it: then the backward ops that recompute a forward op's result (the same primitive, params
  and operands: what XLA's CSE would merge, were it not for the barrier) read the forward
  op's result instead (`aliases`; those ops no longer run), and the plan's policy applies to
  the unit as to any other.
- A scanned stack (`ScanRemat`): the forward scan stops writing the dropped residual stacks
  and writes what the recomputation reads instead (each layer's carried input, the kept
  matmul results); the backward scan reads those stacks, and each of its iterations first
  recomputes its layer's residuals.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..analysis import BACKWARD, SCANNED, dot_without_batch_dims, passes
from ..program import BODY_INPUT, CONST, LITERAL, NO_OP
from ._decisions import DOTS, EVERYTHING


@dataclass(frozen=True)
class UnitRemat:
    """One unrolled unit's recomputation: before op `trigger` runs, `ops` (top-level forward
    ops, program order) run again from `leaves` (what stays, passed through one barrier with
    `cotangents`), and the `recomputed` values take their new values."""

    group: str
    trigger: int
    ops: tuple[int, ...]
    leaves: tuple[int, ...]
    cotangents: tuple[int, ...]
    recomputed: tuple[int, ...]


@dataclass(frozen=True)
class ScanRemat:
    """One scanned stack's recomputation (module docstring).

    forward / backward: the two scan ops. dropped: the forward scan's results no longer made
    (residual stacks only the backward scan reads). emitted: forward body values written as
    new stacks (a layer's carried input, kept matmul results). recompute_ops: forward body
    ops the backward body runs first. rebound: (backward body input, forward body value) for
    each dropped stack's slice, which the recomputation gives. consts / stacks: the forward
    scan's const operands and xs stacks the recomputation reads ((operand position, body
    input) pairs). kept_leaves: (backward body input, forward body value) for residual slices
    the backward scan still reads that the recomputation reads too.
    """

    group: str
    forward: int
    backward: int
    dropped: tuple[int, ...]
    emitted: tuple[int, ...]
    recompute_ops: tuple[int, ...]
    rebound: tuple[tuple[int, int], ...]
    consts: tuple[tuple[int, int], ...]
    stacks: tuple[tuple[int, int], ...]
    kept_leaves: tuple[tuple[int, int], ...]


@dataclass(frozen=True)
class RematRewrite:
    """Every group's recomputation for one plan: `units` by trigger op, `scans` by the ids
    of their forward and backward scan ops (both map to the same ScanRemat). aliases: {value
    a user's jax.checkpoint recomputes: the forward value it equals}, for the groups whose
    checkpoint the plan overrides; dead: the ops that made those values, which do not run.
    user_checkpoints: {cse group: (first op, values read through a barrier)} for the users'
    checkpoints kept as written."""

    units: dict
    scans: dict
    aliases: dict
    dead: frozenset
    user_checkpoints: dict


def remat_rewrite(analysis, step) -> RematRewrite:
    """The recomputation each group's policy asks for (none where it keeps everything, or
    where the user's own jax.checkpoint covers the group and the plan does not override it)."""
    prog = analysis.program
    of = passes(prog)
    units: dict[int, list[UnitRemat]] = {}
    scans: dict[int, ScanRemat] = {}
    aliases: dict[int, int] = {}
    for group in analysis.layer_groups:
        if group.checkpointed and group.name in step.override and group.kind != SCANNED:
            for unit in group.units:
                aliases.update(_twins(prog, of, unit))
    dead = frozenset(o for o in range(len(prog.ops))
                     if prog.ops[o].results and all(r in aliases for r in prog.ops[o].results))
    for group in analysis.layer_groups:
        policy = step.policy_of(group.name)
        if policy == EVERYTHING or (group.checkpointed and group.name not in step.override):
            continue
        if group.kind == SCANNED:
            for (fwd,), bwd in zip(group.units, group.backward_scans):
                plan = _scan_remat(prog, group.name, prog.ops[fwd], bwd, policy)
                if plan is not None:
                    scans[fwd] = scans[bwd] = plan
            continue
        readers = _readers(prog, aliases, dead)
        for unit in group.units:
            plan = _unit_remat(prog, of, group.name, unit, policy, readers, aliases)
            if plan is not None:
                units.setdefault(plan.trigger, []).append(plan)
    return RematRewrite({k: tuple(v) for k, v in units.items()}, scans, aliases, dead,
                        _user_checkpoints(prog, of, dead))


def _user_checkpoints(prog, of, dead) -> dict[int, tuple[int, tuple[int, ...]]]:
    """{cse group: (its first op, the values it reads from outside)} for each recomputation a
    user's jax.checkpoint put in the backward pass (and the plan does not override): the
    replay reads those values through one optimization_barrier, as JAX's lowering of the
    differentiated checkpoint does, so XLA does not merge the recomputation with the forward
    pass."""
    overridden = {prog.ops[o].cse_group for o in dead}
    ops_of: dict[int, list] = {}
    for op in prog.ops:
        if op.cse_group and of[op.id] == BACKWARD and op.cse_group not in overridden:
            ops_of.setdefault(op.cse_group, []).append(op)
    out = {}
    for group, ops in ops_of.items():
        first = ops[0]
        level = [op for op in ops if op.region == first.region]
        made = {r for op in level for r in prog.ops[op.id].results}
        reads = sorted({v for op in level for v in op.operands if v not in made
                        and prog.values[v].origin not in (LITERAL, CONST)})
        if reads:
            out[group] = (first.id, tuple(reads))
    return out


def _twins(prog, of, unit) -> dict[int, int]:
    """{result of a backward op that recomputes a forward op of `unit`: that op's result}:
    value numbering over the unit's forward ops, then over the backward pass's recomputing
    ops (those inlined from a remat, `Op.cse_group`), operands compared through what has been
    numbered. A forward value equal to an earlier one (layer norm's x - mean, taken twice)
    is numbered as that one."""
    number: dict[int, int] = {}  # value -> the first forward value equal to it

    def key(op):
        return (op.primitive, repr(sorted(op.params.items(), key=lambda kv: kv[0])),
                tuple(_operand_key(prog, number.get(v, v)) for v in op.operands))

    table: dict = {}
    for o in unit:
        op = prog.ops[o]
        if not op.body:
            first = table.setdefault(key(op), op)
            number.update((r, f) for r, f in zip(op.results, first.results) if r != f)
    twins: dict[int, int] = {}
    for op in prog.ops:
        if op.region != NO_OP or op.body or not op.cse_group or of[op.id] != BACKWARD:
            continue
        found = table.get(key(op))
        if found is not None:
            pairs = [(r, number.get(f, f)) for r, f in zip(op.results, found.results)]
            twins.update(pairs)
            number.update(pairs)
    return twins


def _operand_key(prog, v: int):
    """A literal or a captured constant by its value (each use has its own value id)."""
    val = prog.values[v]
    if val.origin == LITERAL:
        c = prog.constants[v]
        return ("literal", str(val.dtype), c.tobytes() if hasattr(c, "tobytes") else repr(c))
    if val.origin == CONST:
        return ("const", id(prog.constants[v]))
    return v


def _readers(prog, aliases: dict, dead: frozenset):
    """readers(value): the ops that read it, directly or through an alias, that still run."""
    through: dict[int, list[int]] = {}
    for b, f in aliases.items():
        through.setdefault(f, []).append(b)

    def readers(v: int) -> list[int]:
        out = [u for w in (v, *through.get(v, ())) for u in prog.users(w)]
        return sorted({u for u in out if u not in dead})

    return readers


def _kept_dots(prog, op_ids, policy: str) -> set[int]:
    """The results of the matmuls without batch dims among `op_ids`, where the policy keeps
    them (jax's `dots_with_no_batch_dims_saveable`)."""
    if policy != DOTS:
        return set()
    return {r for o in op_ids for r in prog.ops[o].results if dot_without_batch_dims(prog.ops[o])}


def _cone(prog, targets, leaves, allowed) -> list[int]:
    """The ops among `allowed` that compute `targets` from `leaves`, in program order."""
    need, stack, seen = set(), list(targets), set()
    while stack:
        v = stack.pop()
        if v in seen or v in leaves:
            continue
        seen.add(v)
        o = prog.values[v].producer
        if o == NO_OP or o not in allowed:
            continue
        op = prog.ops[o]
        if prog.values[v].origin == BODY_INPUT:  # a body input of the region op: a leaf
            continue
        if o not in need:
            need.add(o)
            stack.extend(op.operands)
    return sorted(need)


def _reads(prog, ops) -> set[int]:
    return {v for o in ops for v in prog.ops[o].operands}


def _unit_remat(prog, of, group: str, unit, policy: str, readers_of,
                aliases) -> UnitRemat | None:
    members = set(unit)
    made = {r: o for o in unit for r in prog.ops[o].results}
    outputs = set(prog.outputs)
    residuals, kept = [], set()
    for r in made:
        readers = readers_of(r)
        if not any(of[u] == BACKWARD for u in readers):
            continue
        if r in outputs or any(u not in members and of[u] != BACKWARD for u in readers):
            kept.add(r)  # the unit's output, which the rest of the forward pass reads anyway
        else:
            residuals.append(r)
    dots = _kept_dots(prog, unit, policy)
    stays = {v for v in _reads(prog, unit) if v not in made} | kept | dots
    dropped = [r for r in residuals if r not in stays]
    if not dropped:
        return None
    ops = _cone(prog, dropped, stays, members)
    leaves = sorted({v for v in _reads(prog, ops) if v not in {r for o in ops
                                                               for r in prog.ops[o].results}
                     and prog.values[v].origin not in (LITERAL, CONST)})
    readers = [u for r in dropped for u in readers_of(r) if of[u] == BACKWARD]
    trigger = min(readers)
    cotangents = sorted({v for u in readers for v in prog.ops[u].operands
                         if prog.values[v].producer != NO_OP
                         and of[prog.values[v].producer] == BACKWARD
                         and prog.values[v].producer < trigger and v not in aliases})
    return UnitRemat(group, trigger, tuple(ops), tuple(leaves), tuple(cotangents),
                     tuple(dropped))


def _scan_remat(prog, group: str, fwd, bwd_id: int, policy: str) -> ScanRemat | None:
    if bwd_id == NO_OP:
        return None
    bwd = prog.ops[bwd_id]
    nc, nk, n_in = fwd.params["num_consts"], fwd.params["num_carry"], len(fwd.operands)
    f_in, f_out = fwd.body[:n_in], fwd.body[n_in:]
    body_ops = {o for o in range(*fwd.body_ops) if prog.ops[o].region == fwd.id}
    dots = _kept_dots(prog, body_ops, policy)
    leaves_ok = set(f_in) | dots
    b_xs = range(bwd.params["num_consts"] + bwd.params["num_carry"], len(bwd.operands))
    b_in = bwd.body[:len(bwd.operands)]
    slices = []  # (backward body input, forward body value, forward result)
    for p in b_xs:
        u = bwd.operands[p]
        if u in fwd.results[nk:] and prog.values[u].producer == fwd.id:
            j = fwd.results.index(u)
            slices.append((b_in[p], f_out[j], u))
    only_bwd = {u for _, _, u in slices if set(prog.users(u)) == {bwd.id}}
    rebound = [(b, w, u) for b, w, u in slices
               if u in only_bwd and w not in leaves_ok and prog.values[w].producer in body_ops]
    if not rebound:
        return None
    kept = [(b, w) for b, w, u in slices if (b, w, u) not in rebound]
    kept_values = {w for _, w in kept}
    ops = _cone(prog, [w for _, w, _ in rebound], leaves_ok, body_ops)
    made = {r for o in ops for r in prog.ops[o].results}
    needed = {v for v in _reads(prog, ops) if v not in made}
    consts = tuple((i, f_in[i]) for i in range(nc) if f_in[i] in needed)
    stacks = tuple((i, f_in[i]) for i in range(nc + nk, n_in) if f_in[i] in needed)
    carry_in = [f_in[i] for i in range(nc, nc + nk) if f_in[i] in needed]
    emitted = tuple(dict.fromkeys(
        [v for v in carry_in if v not in kept_values]
        + sorted(d for d in dots if d in needed and d not in kept_values)))
    kept_leaves = tuple((b, w) for b, w in kept if w in needed)
    return ScanRemat(group, fwd.id, bwd.id, tuple(u for _, _, u in rebound), emitted,
                     tuple(ops), tuple((b, w) for b, w, _ in rebound), consts, stacks,
                     kept_leaves)
