"""The estimate's collectives read back to the ops that pay them (the Lab's labels and badges).

The kernel costs op *types* (_types.py), so `Estimate.collectives` has no op in it. Its ledger
(_kernel.charges) records each charge at the place that made it: an operand member of an op
type, a reduction of an op type, or a shared read (one op, one operand). Here each is handed
back to ops: an op type's charges to each of its instances (an equal share: instances of one
type cost alike), a shared read's to its op. Summed over ops, every (kind, mesh axes) gives
back the estimate's count, bytes and seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from . import _kernel
from ._estimate import COLLECTIVE_KINDS

# the kernel's kind indices (_kernel.AR ...) -> COLLECTIVE_KINDS
_KIND_NAMES = {_kernel.AR: "all-reduce", _kernel.AG: "all-gather",
               _kernel.RS: "reduce-scatter", _kernel.A2A: "all-to-all",
               _kernel.CP: "collective-permute"}
# (CostModel.evaluate reads the kernel's kinds in COLLECTIVE_KINDS order)
assert tuple(_KIND_NAMES[k] for k in range(_kernel.NUM_KINDS)) == COLLECTIVE_KINDS


@dataclass(frozen=True)
class OpCollective:
    """One collective one op pays under a plan, per device per step.

    kind: one of COLLECTIVE_KINDS; axes: mesh axes, in mesh order; operand: the position among
    the op's operands of the value it moves (all-gather, all-to-all, the collective-permute of
    a dim handed to other axes or of one whose axes a reshard left out of order), None for
    the op's partial sums (all-reduce, reduce-scatter, a matmul's permuted shard; the
    all-gather of an argmax's partial results),
    for the collectives a shard_map's body runs (_manual.py) and for a scan's stacked output
    it reshards after the loop (_operand_rows.py); count: how many per step (an op in a loop body
    pays once per iteration); bytes and time_s: all of them together, by the estimate's
    conventions (an all-gather counts its output); patterns: the names of the XLA partitioner
    cases that decided it (cost/_kernel/_patterns.py; "shard_map body" for a shard_map body's
    own).
    """

    kind: str
    axes: tuple[str, ...]
    operand: int | None
    count: float
    bytes: float
    time_s: float
    patterns: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        """"all-gather data", "all-reduce data×model": the kind and its mesh axes."""
        return f"{self.kind} {'×'.join(self.axes)}" if self.axes else self.kind


class Charges(NamedTuple):
    """Every collective charge of one plan, one row per (op, place it is charged): [K] arrays.
    operand: the operand position (-1: partial sums); kind: _kernel.AR/AG/RS/A2A/CP; mask: mesh
    axes as bits; count, bytes and seconds: per step, all the op's runs; pattern: the
    partitioner pattern that charged it (_kernel.PATTERNS)."""

    op: np.ndarray
    operand: np.ndarray
    kind: np.ndarray
    mask: np.ndarray
    count: np.ndarray
    bytes: np.ndarray
    seconds: np.ndarray
    pattern: np.ndarray


def op_charges(model, plan_arrays) -> tuple[Charges, np.ndarray]:
    """The charges of `plan_arrays` (PlanArrays) under `model` (a CostModel), per op, and the
    compute seconds per op type from the same kernel run."""
    ledger, op_compute = _kernel.charges(model.state, plan_arrays,
                                         _kernel.empty_ledger(model.layout))
    st, ty = model.st, model.ty
    tables = ty.tables
    per_instance = 1.0 / tables.ops["count"]  # an op type's charge, shared by its instances
    layout = model.layout
    group_rows, read_rows, first = layout.group, layout.read, layout.op
    reorder, halos, read_reorder = layout.member_reorder, layout.halo, layout.read_reorder
    counts = ledger["count"]
    parts = []  # (op, operand, ledger row, scale)
    # operands of op types: rows 2m (all-gather) and 2m + 1 (all-to-all) of member m
    o = np.nonzero(ty.operand_member >= 0)[0]
    op = st.operands.op[o].astype(np.int64)
    for row in (2 * ty.operand_member[o], 2 * ty.operand_member[o] + 1,
                reorder + ty.operand_member[o]):  # + the permute putting its axes in order
        parts.append((op, st.operands.slot[o], row, per_instance[ty.op_type[op]]))
    def at_every_instance(row, of_type, operand):
        # a charge of op type `of_type[i]` in ledger row `row[i]`, shared by its instances
        spans = model.memory.instances_by_type[of_type]
        lengths = spans["end"] - spans["start"]
        at = np.repeat(spans["start"] - np.cumsum(lengths) + lengths, lengths) \
            + np.arange(lengths.sum())
        op = model.memory.instances[at]
        parts.append((op, np.repeat(operand, lengths), np.repeat(row, lengths),
                      per_instance[ty.op_type[op]]))

    # reductions of op types: rows 2M + 2g (reduce-scatter) and + 1 (all-reduce) of group
    # entry g, at every instance of the type
    row = group_rows + np.nonzero(counts[group_rows:read_rows] > 0)[0]
    if len(row):
        entry = (row - group_rows) // 2
        ops = tables.ops
        entry_type = np.repeat(np.arange(len(ops)), ops["groups_end"] - ops["groups_start"])
        at_every_instance(row, entry_type[entry], np.full(len(row), -1))
    # shared reads: rows 2M + 2G + 2s and + 1 of read s, at its own op
    # (a read standing for a value of each repeated layer pays a share of its charges: _compress)
    o = np.nonzero(ty.operand_read >= 0)[0]
    for row in (read_rows + 2 * ty.operand_read[o], read_rows + 2 * ty.operand_read[o] + 1,
                read_reorder + ty.operand_read[o]):  # + the permute putting its axes in order
        parts.append((st.operands.op[o].astype(np.int64), st.operands.slot[o], row,
                      model.read_share[ty.operand_read[o]]))
    # gathers and scatters partitioned as XLA picks, rows 2M + 2G + 2S + OP_ROWS p and on: + 0
    # the all-to-all of a scatter's updates (operand 2) and + 1 the all-gather of its indices
    # (operand 1) in operand passthrough; + 2 the all-to-all of a gather's operand or of a
    # scatter's result (operand 0, the buffer it updates); + 3 the collective-permute of a
    # matmul's reduced shard (its partial sums: -1); + 4 and + 5 the permute and the group's
    # all-gather of a scatter's regrouped indices (operand 1), + 6 its table's all-reduce (-1);
    # + 7, + 8, + 9 the permutes of a re-tiled batched gather's or scatter's indices (1),
    # updates (2) and result (-1)
    row = first + np.nonzero(counts[first:reorder] > 0)[0]
    if len(row):
        at_every_instance(row, (row - first) // _kernel.OP_ROWS,
                          np.array(_kernel.OP_ROW_OPERANDS)[(row - first) % _kernel.OP_ROWS])
    # a convolution's halo exchanges, rows 2M + 2G + 2S + OP_ROWS P + M + h of halo record h:
    # of its input (operand 0), at every instance of the type
    row = halos + np.nonzero(counts[halos:read_reorder] > 0)[0]
    if len(row):
        ops = tables.ops
        halo_type = np.repeat(np.arange(len(ops)), ops["halo_end"] - ops["halo_start"])
        at_every_instance(row, halo_type[row - halos], np.zeros(len(row), np.int64))
    # a shard_map body's own collectives, rows from `fixed`: at the shard_map running them
    n = len(model.fixed.op)
    parts.append((model.fixed.op, np.full(n, -1), layout.fixed + np.arange(n), np.ones(n)))
    op, operand, row, scale = (np.concatenate([p[i] for p in parts]) for i in range(4))
    charged = counts[row] > 0
    op, operand, row, scale = op[charged], operand[charged], row[charged], scale[charged]
    count = counts[row] * scale
    return Charges(op=op, operand=operand.astype(np.int64),
                   kind=ledger["kind"][row].astype(np.int64),
                   mask=ledger["mask"][row].astype(np.int64), count=count,
                   bytes=count * ledger["bytes"][row], seconds=count * ledger["seconds"][row],
                   pattern=ledger["pattern"][row].astype(np.int64)), op_compute


def op_collectives(charges: Charges, mask_axes) -> dict[int, tuple[OpCollective, ...]]:
    """{op id: its OpCollectives} of `charges`, for the ops that pay any; `mask_axes[m]` the
    mesh axes of mask m. Charges of one kind, axes and operand at one op are added up."""
    found: dict[int, dict[tuple, list]] = {}
    for n, t, k, m, c, b, s, pat in zip(charges.op.tolist(), charges.operand.tolist(),
                                        charges.kind.tolist(), charges.mask.tolist(),
                                        charges.count.tolist(), charges.bytes.tolist(),
                                        charges.seconds.tolist(), charges.pattern.tolist()):
        total = found.setdefault(n, {}).setdefault((_KIND_NAMES[k], m, t),
                                                   [0.0, 0.0, 0.0, []])
        total[0] += c
        total[1] += b
        total[2] += s
        name = _kernel.PATTERN_NAMES[pat]
        if name not in total[3]:
            total[3].append(name)
    return {n: tuple(OpCollective(kind, mask_axes[m], None if t < 0 else t, c, b, s,
                                  tuple(names))
                     for (kind, m, t), (c, b, s, names) in sorted(by.items(), key=lambda kv: (
                         kv[0][2] < 0, kv[0][2], kv[0][0], kv[0][1])))
            for n, by in sorted(found.items())}
