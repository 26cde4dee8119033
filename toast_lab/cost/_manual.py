"""The collectives a `shard_map` body runs: fixed by the user's code, whatever the plan.

Inside a shard_map the user partitions by hand: each psum, pmax, all_gather, psum_scatter,
all_to_all and ppermute over named mesh axes lowers to one XLA collective over those axes, on
the shapes the body sees (one device's shard), and no plan changes it. The estimate charges
them as they are, inside the op that runs them (its step in the schedule waits for them:
they block the body), priced by verify's convention: an all-gather by its gathered result,
the others by their operand (jax 0.10.2 on XLA:CPU: a psum of an f32[4, 8] shard over model
is one all-reduce of 128 B over the model groups; a tiled all_gather of f32[4, 16] over
data, one all-gather of 1024 B; a ring shift of f32[16, 8] over data, one
collective-permute of 512 B, whatever pairs its perm lists: XLA sizes it by its operand on
every device, those that send nothing too; tests/test_cost_manual.py).

Not charged: collectives over axes the toast_lab Mesh lacks or of size 1 (XLA drops a
one-device group), and those whose results nothing reads (XLA removes them). Charged but
not run: a psum XLA proves to sum a value every device holds alike (AllReduceSimplifier makes
it a multiply; seen on the cotangent of `kernel(x).sum()`, a broadcast constant).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ._kernel._charge import a2a_time, gather_time, permute_time
from ..rules import permutes_shards
from ._tables import FIXED, SPAN

# primitive -> (collective kind, the parameter naming its mesh axes, priced by its result)
_MANUAL_COLLECTIVES = {
    "psum": ("all-reduce", "axes", False),
    "psum_invariant": ("all-reduce", "axes", False),
    "pmax": ("all-reduce", "axes", False),
    "pmin": ("all-reduce", "axes", False),
    "all_gather": ("all-gather", "axis_name", True),
    "all_gather_invariant": ("all-gather", "axis_name", True),
    "reduce_scatter": ("reduce-scatter", "axis_name", False),
    "all_to_all": ("all-to-all", "axis_name", False),
    "ppermute": ("collective-permute", "axis_name", False),
}


class ManualCollective(NamedTuple):
    """One collective of a shard_map body: the program op it runs in, its kind (one of
    COLLECTIVE_KINDS), its mesh axes (as the body names them), how often per step and the
    bytes one run moves per device. sharded_by: for a body that only permutes shards (a ring
    shift, a pipeline's hand-off; rules.permutes_shards), the operand it moves, whose sharding
    over the axes the shard_map leaves to the partitioner divides the bytes under each plan
    (-1 for any other body, whose shapes the body fixes)."""

    op: int
    kind: str
    axes: tuple
    count: float
    nbytes: float
    sharded_by: int = -1


def _nbytes(avals) -> float:
    return float(sum(np.prod(a.shape, dtype=np.float64) * np.dtype(a.dtype).itemsize
                     for a in avals))


def _inner_jaxprs(eqn):
    return [getattr(v, "jaxpr", v) for p in eqn.params.values()
            for v in (p if isinstance(p, (tuple, list)) else (p,))
            if hasattr(v, "eqns") or hasattr(getattr(v, "jaxpr", None), "eqns")]


def _used_eqns(jaxpr, used=None):
    """The equations of `jaxpr` whose results reach its outputs (those `used` says are read,
    where given) or that have effects."""
    live = {v for i, v in enumerate(jaxpr.outvars)
            if not hasattr(v, "val") and (used is None or used[i])}
    kept = []
    for eqn in reversed(jaxpr.eqns):
        if eqn.effects or any(v in live for v in eqn.outvars):
            kept.append(eqn)
            live.update(v for v in eqn.invars if not hasattr(v, "val"))
    return kept[::-1]


def body_collectives(jaxpr, used=None, times: float = 1.0):
    """[(kind, axes, count, nbytes)] of one run of a manual body (`used`: which of its outputs
    are read; None: all): a scan's body `length` times, a while loop's once (its trip count
    is unknown here), a cond's branch moving most."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out = []
    for eqn in _used_eqns(jaxpr, used):
        name = eqn.primitive.name
        inner = _inner_jaxprs(eqn)
        if inner:
            parts = [body_collectives(j, None, times * float(eqn.params.get("length", 1)))
                     for j in inner]
            if name == "cond":
                parts = [max(parts, key=lambda p: sum(c * b for _, _, c, b in p))]
            out.extend(c for p in parts for c in p)
            continue
        if name not in _MANUAL_COLLECTIVES:
            continue
        kind, key, by_result = _MANUAL_COLLECTIVES[name]
        axes = eqn.params.get(key, ())
        axes = (axes,) if isinstance(axes, str) else tuple(axes)
        avals = [v.aval for v in (eqn.outvars if by_result else eqn.invars)]
        out.append((kind, axes, times, _nbytes(avals)))
    return out


def _live_ops(prog) -> set[int]:
    """The ops whose results reach the step's outputs (XLA removes the others), ops without
    results, and every op in the body of a live region op."""
    outputs = set(prog.outputs)
    work = [op.id for op in prog.ops if not op.results or outputs.intersection(op.results)]
    live = set()
    while work:
        n = work.pop()
        if n in live:
            continue
        live.add(n)
        op = prog.ops[n]
        work.extend(prog.values[v].producer for v in (*op.operands, *op.body)
                    if prog.values[v].producer >= 0)
        work.extend(range(*op.body_ops))
    return live


def manual_collectives(prog) -> list[ManualCollective]:
    """Every collective the shard_map bodies of `prog` run, per step (an op in a scan body
    runs its trip count times), leaving out what computes only results nothing reads."""
    if not any(op.primitive == "shard_map" for op in prog.ops):
        return []
    live, outputs = _live_ops(prog), set(prog.outputs)
    out = []
    for op in prog.ops:
        if op.primitive != "shard_map" or op.id not in live:
            continue
        used = [v in outputs or any(u in live for u in prog.users(v)) for v in op.results]
        moved = _moved_operands(op)
        out.extend(ManualCollective(op.id, kind, axes, count * op.trip_count, nbytes,
                                    moved[k] if moved else -1)
                   for k, (kind, axes, count, nbytes)
                   in enumerate(body_collectives(op.params["jaxpr"], used)))
    return out


def _moved_operands(op) -> list[int]:
    """For a shard_map whose body only permutes shards, the operand each of its collectives
    moves, in body order; [] otherwise."""
    if not permutes_shards(op.params):
        return []
    jaxpr = getattr(op.params["jaxpr"], "jaxpr", op.params["jaxpr"])
    position = {id(v): i for i, v in enumerate(jaxpr.invars)}
    return [op.operands[position[id(eqn.invars[0])]] for eqn in jaxpr.eqns]


class FixedCharges(NamedTuple):
    """The collectives shard_map bodies run whatever the plan, priced on a mesh: `records`
    (FIXED, ordered by op type: what the kernel charges, _kernel/_ops.py), `by_op` (SPAN [P]:
    each op type's records) and `op` (the program op each record runs in)."""

    records: np.ndarray
    by_op: np.ndarray
    op: np.ndarray


_KERNEL_KINDS = {"all-reduce": 0, "all-gather": 1, "reduce-scatter": 2, "all-to-all": 3,
                 "collective-permute": 4}  # (_kernel's AR, AG, RS, A2A, CP)


def _one_run(kind, nbytes, mask, mesh_table) -> float:
    """Seconds of one collective of `kind` moving nbytes per device over the axes of `mask`,
    priced as the kernel prices its own (_kernel/_charge.py)."""
    if kind == "all-to-all":
        return a2a_time(nbytes, mask, mesh_table)
    if kind == "collective-permute":  # point to point, one hop
        return permute_time(nbytes, mask, mesh_table)
    one = gather_time(nbytes, mask, mesh_table)
    return 2.0 * one if kind == "all-reduce" else one  # (a reduce-scatter and an all-gather)


def fixed_charges(prog, axis_bit, mesh_table, op_type, num_op_types,
                  value_type) -> FixedCharges:
    """The FixedCharges of `prog`'s shard_map bodies on a mesh (`axis_bit` {axis: its bit},
    its MESH table), per op type (`op_type` [N]; `value_type` [V] for the operands a
    permute moves, ManualCollective.sharded_by). A collective over axes the mesh lacks, or of
    one device, is none (XLA drops a one-device group)."""
    rows = []
    for c in manual_collectives(prog):
        mask = sum(axis_bit.get(a, 0) for a in set(c.axes))
        cost = mesh_table[mask]
        if mask == 0 or cost["ways"] <= 1.0 or c.nbytes <= 0:
            continue
        scale = int(value_type[c.sharded_by]) if c.sharded_by >= 0 else -1
        rows.append((c.op, (int(op_type[c.op]), _KERNEL_KINDS[c.kind], mask, c.count,
                            c.nbytes, _one_run(c.kind, float(c.nbytes), mask, mesh_table),
                            scale)))
    rows.sort(key=lambda r: r[1][0])  # (stable: each op type's in program order)
    records = np.array([r for _, r in rows], FIXED)
    by_op = np.zeros(num_op_types if rows else 0, SPAN)  # (none: the kernel skips the lookup)
    if rows:
        counts = np.bincount(records["op_type"], minlength=num_op_types)
        by_op["end"] = np.cumsum(counts)
        by_op["start"] = by_op["end"] - counts
    return FixedCharges(records, by_op, np.array([op for op, _ in rows], np.int64))


def out_spec_masks(prog, value_type, axis_bit, num_value_types) -> np.ndarray:
    """[T] per value type, the mesh axes a shard_map's out_specs shard its result over (XLA
    writes each device's shard and keeps it so; each result is a type of its own,
    _types.build_types), 0 for other types."""
    fixed = np.zeros(num_value_types, np.int64)
    for op in prog.ops:
        if op.primitive != "shard_map":
            continue
        for r, spec in zip(op.results, op.params["out_specs"]):
            for entry in tuple(spec):
                axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
                for a in axes:
                    fixed[value_type[r]] |= axis_bit.get(a, 0)
    return fixed
