"""The ledger: one row per place the kernel may charge a collective, so that every charge can be
read back to the op (and operand) that pays it (cost/_op_collectives.py, the Lab's labels).

A row is a LEDGER record: the collective's kind (_charge.AR ...), its mesh-axis mask, how many
(count, 0: no charge), the bytes and seconds of one, and the partitioner pattern that charged
it (_patterns.py). The rows come in sections, each a run of rows per table entry; where each
section starts is a LedgerLayout, built once per model (`ledger_layout`), and every reader
indexes the ledger through it:

- `member`: per op-type operand member m (TypeTables.op_operands), rows member + 2m (its
  all-gather) and + 2m + 1 (its all-to-all or permute);
- `group`: per reduction entry g of an op type (TypeTables.op_groups), rows group + 2g (its
  reduce-scatter) and + 2g + 1 (its all-reduce); a variadic reduce's all-gather of its partial
  results is in its first entry's first row;
- `read`: per shared read s, rows read + 2s (all-gather) and + 2s + 1 (all-to-all, permute);
- `op`: per op type p, OP_ROWS rows at op + OP_ROWS p, by the OP_* offsets below;
- `member_reorder`: per member m, the permute that puts its axes in order;
- `halo`: per halo record h (TypeTables.halos), its halo exchange's permutes;
- `read_reorder`: per shared read s, the permute that puts its axes in order;
- `fixed`: per FIXED record (TypeTables.fixed), a shard_map body's collective;
- `rows`: the ledger's length.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# One charge: kind, mesh-axis mask, count (0: none), bytes and seconds of one, pattern.
LEDGER = np.dtype([("kind", np.int64), ("mask", np.int64), ("count", np.float64),
                   ("bytes", np.float64), ("seconds", np.float64), ("pattern", np.int64)],
                  align=True)

# The rows of each op type (section `op`), and the operand each is charged to (-1: the op's
# partial sums, or its result).
OP_SCATTER_UPDATES = 0     # the all-to-all of a scatter's updates (operand passthrough)
OP_SCATTER_INDICES = 1     # the all-gather of its indices (operand passthrough; regrouped)
OP_BATCHED_OPERAND = 2     # the all-to-all re-tiling a batched gather's operand or result
OP_SLICED_RESULT = 3       # the permute of a matmul's or row gather's reduced slice
OP_REGROUPED_PERMUTE = 4   # the permute of a scatter's regrouped indices
OP_REGROUPED_GATHER = 5    # the group's all-gather of those indices
OP_REGROUPED_REDUCE = 6    # the group's all-reduce of the scatter's table
OP_RETILED_INDICES = 7     # the permute of re-tiled batched indices
OP_RETILED_UPDATES = 8     # ... of a re-tiled scatter's updates
OP_RETILED_RESULT = 9      # ... of a re-tiled gather's picks
OP_ROWS = 10
OP_ROW_OPERANDS = (2, 1, 0, -1, 1, 1, -1, 1, 2, -1)


class LedgerLayout(NamedTuple):
    """Where each section of the ledger starts (see the module docstring)."""

    member: int
    group: int
    read: int
    op: int
    member_reorder: int
    halo: int
    read_reorder: int
    fixed: int
    rows: int


def ledger_layout(tables) -> LedgerLayout:
    """The LedgerLayout of a model's TypeTables."""
    members = len(tables.op_operands)
    group = 2 * members
    read = group + 2 * len(tables.op_groups)
    op = read + 2 * len(tables.shared_reads)
    member_reorder = op + OP_ROWS * len(tables.ops)
    halo = member_reorder + members
    read_reorder = halo + len(tables.halos)
    fixed = read_reorder + len(tables.shared_reads)
    return LedgerLayout(0, group, read, op, member_reorder, halo, read_reorder, fixed,
                        fixed + len(tables.fixed))
