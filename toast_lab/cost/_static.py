"""The program compiled into flat arrays for the cost model, built once per analysis.

Everything an estimate needs that does not depend on the plan lives here as numpy arrays, so
evaluating a plan is a walk over small tables (DESIGN.md §6). `Static` composes one record per
concern, each built in its own module from the analysis:

- values    ValueFacts (_value_facts.py): split classes per dim, bytes, arguments and outputs,
            liveness in program order;
- ops       OpFacts (_op_facts.py): trip counts, unrolled copies, results, matmul shapes,
            workspace, the partitioner's geometry of scatters, gathers and convolutions;
- rows, groups, operands   (_operand_rows.py): what each op wants of its operands' shardings,
            from its sharding rule, and the reshards at loop boundaries;
- flops     FlopCounts (_flops.py): each op's flops as HloCostAnalysis counts them;
- passes    PassAnalyses (_xla_passes.py): what XLA's fusion, reassociation, scheduling and
            loop passes make of the program.

Mesh-independent: mesh axes enter only as bit masks at evaluation time. The types (_types.py)
compress these tables for one device's compiler.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._flops import FlopCounts, flop_counts
from ._folding import constant_folding
from ._op_facts import OpFacts, op_facts
from ._operand_rows import Groups, Operands, Rows, operand_rows
from ._value_facts import ValueFacts, value_facts
from ._xla_passes import PassAnalyses, early_values, pass_analyses


@dataclass(frozen=True, eq=False)
class Static:
    """The plan-independent tables of one analysis ([V] per value, [N] per op, [R] per operand
    row, [G] per group, [O] per operand)."""

    values: ValueFacts          # what each value is
    ops: OpFacts                # what each op is
    rows: Rows                  # what each op wants of each operand dim
    groups: Groups              # the factors an op's operands must agree on
    operands: Operands          # the tensors each op reads and may reshard
    flops: FlopCounts           # each op's flops, as XLA counts them
    passes: PassAnalyses        # what XLA's passes make of the program

    @property
    def num_values(self) -> int:
        return len(self.values.nbytes)

    @property
    def num_ops(self) -> int:
        return len(self.ops.trip)


def static_tables(an) -> Static:
    """The tables of `an`, built once and kept with it: every CostModel of it shares them."""
    return an.derived("cost.static", lambda: build_static(an))


def build_static(an) -> Static:
    """The Static of analysis `an`, built afresh (static_tables keeps one per analysis)."""
    prog = an.program
    folding = constant_folding(prog)
    values = value_facts(an)
    ops = op_facts(an, folding.folded)
    rows, groups, operands = operand_rows(an, values, early_values(prog), folding.uniform)
    # the ops leaving partial sums XLA all-reduces (a variadic reduce's are all-gathered)
    reducers = {int(n) for n, red in zip(groups.op, groups.is_reduction)
                if red and not ops.gathered_partials[n]}
    return Static(values=values, ops=ops, rows=rows, groups=groups, operands=operands,
                  flops=flop_counts(prog, folding), passes=pass_analyses(prog, reducers, folding.uniform))
