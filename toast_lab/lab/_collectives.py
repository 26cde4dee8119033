"""Which collectives an op pays under a plan, and on which operand: the labels of the graph.

The cost model says *how long* each op communicates (`CostModel.op_costs`) but not which
collective it is; the graph needs the kind and the mesh axes ("all-gather data" on the edge that
carries the gathered operand). This module reads them off the op's sharding rule and the plan's
PartitionSpecs with the cost model's own conventions (cost/_model.py):

- an operand dim wants what its factor has on the result (owner computes); a factor without a
  result dim (a contraction) wants the axes every operand agrees on; a need-replication factor
  wants the dim whole;
- axes an operand has but the op does not want are all-gathered, axes that move to another dim
  are an all-to-all;
- a contraction sharded alike on every operand leaves partial sums: an all-reduce, or a
  reduce-scatter over the axes the result is sharded on.

It labels only ops the cost model charges communication for; the seconds stay the cost
model's.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..rules import NEED_REPLICATION, REDUCTION

ALL_GATHER, ALL_TO_ALL = "all-gather", "all-to-all"
ALL_REDUCE, REDUCE_SCATTER = "all-reduce", "reduce-scatter"
UNLABELLED = "communication"  # charged by the cost model, not matched by the rule reading


@dataclass(frozen=True)
class OpCollective:
    """One collective of one op: kind, mesh axes (mesh order), and the operand it moves
    (None for partial sums of the result)."""

    kind: str
    axes: tuple[str, ...]
    operand: int | None

    @property
    def label(self) -> str:
        return f"{self.kind} {'×'.join(self.axes)}" if self.axes else self.kind


def op_collectives(analysis, plan, op_id: int, mesh_axes: tuple[str, ...]
                   ) -> tuple[OpCollective, ...]:
    """The collectives op `op_id` pays under `plan` (empty for region ops: their bodies pay)."""
    prog = analysis.program
    op = prog.ops[op_id]
    if op.body:
        return ()
    rule = analysis.op_rules[op_id]
    order = {a: i for i, a in enumerate(mesh_axes)}
    sort = lambda axes: tuple(sorted(axes, key=order.get))  # noqa: E731
    on_result: dict[int, set[str]] = {}
    result_axes: set[str] = set()
    for r, dims in zip(op.results, rule.results):
        axes = plan.value_axes(r)
        for d, factors in enumerate(dims):
            result_axes.update(axes[d])
            if factors and factors[0] not in on_result:
                on_result[factors[0]] = set(axes[d])
    operand_axes = [plan.value_axes(v) for v in op.operands]
    agreed: dict[int, set[str]] = {}
    for dims, axes in zip(rule.operands, operand_axes):
        for d, factors in enumerate(dims):
            if factors and factors[0] not in on_result:
                f = factors[0]
                agreed[f] = agreed[f] & set(axes[d]) if f in agreed else set(axes[d])
    out: list[OpCollective] = []
    for i, (dims, axes) in enumerate(zip(rule.operands, operand_axes)):
        removed, added = set(), set()
        for d, factors in enumerate(dims):
            have = set(axes[d])
            if not factors:
                want = set()
            elif rule.kinds[factors[0]] is NEED_REPLICATION:
                want = set()
            else:
                want = on_result.get(factors[0], agreed.get(factors[0], set()))
            removed |= have - want
            added |= want - have
        if removed - added:
            out.append(OpCollective(ALL_GATHER, sort(removed - added), i))
        if removed & added:
            out.append(OpCollective(ALL_TO_ALL, sort(removed & added), i))
    # One collective per sharded contraction factor, as XLA emits them (and the cost model
    # charges them): a weight gradient contracted over batch on `data` and sequence on `model`
    # is reduced over `data`, then over `model`.
    done: set[str] = set()
    for f in sorted(agreed):
        axes = agreed[f] - done
        if rule.kinds[f] is not REDUCTION or not axes:
            continue
        done |= axes
        if axes - result_axes:
            out.append(OpCollective(ALL_REDUCE, sort(axes - result_axes), None))
        if axes & result_axes:
            out.append(OpCollective(REDUCE_SCATTER, sort(axes & result_axes), None))
    return tuple(out)
