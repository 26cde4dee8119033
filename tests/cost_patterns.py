"""Which of the XLA partitioner's patterns (cost/_kernel/_patterns.py) charged a plan's
collectives: the tests that check a pattern against XLA on a minimal reproducer assert with
this that the pattern really decided the charges there.

    assert HALO_EXCHANGE in patterns_charged(plan, mesh, primitive="conv_general_dilated")
"""

from __future__ import annotations

from toast_lab.cost import cost_model
from toast_lab.cost._kernel import PATTERN_NAMES
from toast_lab.cost._kernel._patterns import (  # noqa: F401  (re-exported for the tests)
    ALL_TO_ALL, AXIS_ORDER, BATCHED_RETILE, COMPATIBLE_GATHER, COMPATIBLE_SLICE,
    DOT_SLICED_RESULT, FULL_REMAT, GATHER, GATHER_MAJOR_AXIS, HALO_EXCHANGE, HANDED_DIM,
    OPERAND_PASSTHROUGH, PARTIAL_SUMS, REGROUPED_INDICES, REPLICATED_COPY, ROW_GATHER,
    SHARD_MAP_BODY, SPLIT_FINER, UPDATES_KEEP_SHARDING, VARIADIC_REDUCE)

_CODES = {name: code for code, name in enumerate(PATTERN_NAMES)}


def patterns_charged(plan, mesh, primitive: str | None = None,
                     kind: str | None = None) -> frozenset[int]:
    """The codes of the patterns that charged the collectives of `plan` on `mesh`
    (CostModel.op_collectives of the plan's analysis): at the ops of `primitive` only (e.g.
    "dot_general", "scatter-add"; None: every op), of collective `kind` only (e.g.
    "all-to-all"; None: every kind)."""
    an = plan.analysis
    prog = an.program
    found = set()
    for op, charges in cost_model(an, mesh).op_collectives(plan).items():
        if primitive is not None and prog.ops[op].primitive != primitive:
            continue
        for c in charges:
            if kind is None or c.kind == kind:
                found.update(_CODES[name] for name in c.patterns)
    return frozenset(found)
