"""The program compiled into flat arrays for the cost model (built once per analysis).

Everything the estimate needs that does not depend on the plan lives here as numpy arrays, so
evaluating a plan is a handful of vectorized passes (DESIGN.md §6):

- slots      [V, D]  split class (class in the value's domain, see _plan_arrays.py) of dim d
                     of value v (-1: size 1, or padding past its rank)
- rows               one per (op, operand dim) that a factor maps: where the op needs that
                     dim sharded like a result dim ("result" rows), like the other operands of
                     a contraction ("group" rows, reduction and operand-only factors), or
                     whole ("replicate" rows, need-replication factors)
- op arrays          static flops, trip counts, first result
- liveness           each value's first and last position in program order

Mesh-independent: mesh axes enter only as bit masks at evaluation time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import crossing_reads
from ..program import NO_OP
from ..rules import NEED_REPLICATION, PASS_THROUGH, REDUCTION
from ._flops import FlopCounts, flop_counts
from ._folding import constant_folding
from ._op_facts import OpFacts, op_facts
from ._value_facts import ValueFacts, value_facts
from ._xla_passes import PassAnalyses, early_values, pass_analyses

# An operand row wants its dim sharded like a result's dim (ROW_RESULT), like its group's
# consensus (ROW_GROUP) or whole (ROW_REPLICATE); ROW_FROM_WHOLE: the operand holds the dim
# whole (a stack a loop writes slice by slice, along the scanned dim; the minor part of a
# compound dim, whose sharding is its major part's) and the op wants it sharded like the
# source dim.
ROW_RESULT, ROW_GROUP, ROW_REPLICATE, ROW_FROM_WHOLE = 0, 1, 2, 3


@dataclass(frozen=True, eq=False)
class Static:
    values: ValueFacts          # what each value is (_value_facts.py)
    # rows
    row_op: np.ndarray          # [R] int32
    row_value: np.ndarray       # [R] int32
    row_dim: np.ndarray         # [R] int32
    row_kind: np.ndarray        # [R] int8: ROW_RESULT / ROW_GROUP / ROW_REPLICATE / ...
    row_src_value: np.ndarray   # [R] int32: result rows: the result value whose dim it follows
    row_src_dim: np.ndarray     # [R] int32
    row_group: np.ndarray       # [R] int32: group rows: their group (-1 otherwise)
    # [R] int32: on a compound dim whose first minor part the result shards, the size of its
    # major part, on the major part's row and the first minor part's (0 otherwise)
    row_compound: np.ndarray
    # [R] int32: on a result dim that merges an operand's dims ([4, 8] -> [32]), the size of its
    # major part: positive on the major part's row, negative on the first minor part's (which
    # wants the axes left over: the kernel's _compound_split); 0 otherwise
    row_src_compound: np.ndarray
    group_is_reduction: np.ndarray  # [G] bool: partial sums when the group is sharded
    group_op: np.ndarray        # [G] int32
    # operands: one per (op, operand tensor); rows of one operand are contiguous
    row_operand: np.ndarray     # [R] int32 index into operand arrays
    operand_op: np.ndarray      # [O] int32
    operand_value: np.ndarray   # [O] int32
    operand_slot: np.ndarray    # [O] int32: its position among the op's operands (-1: none)
    operand_nbytes: np.ndarray  # [O] float64: whole-tensor bytes of what it reshards
    # [O] bool: it reads a constant holding one number throughout (a broadcast literal, such
    # as optax.set_to_zero's update of a frozen parameter), which XLA all-gathers for free
    operand_uniform: np.ndarray
    # [O] bool: a reduce op (not a matmul, convolution or gather) reads it from another domain,
    # where plan.jit pins the read sliced like the result (plan._export.boundary_reads): the
    # axes it sums over reach the result's dims after that slice (the kernel's _out_of_order)
    operand_sliced_first: np.ndarray
    # ops
    num_ops: int
    flops: FlopCounts           # each op's flops, as XLA counts them (_flops.py)
    ops: OpFacts                # what each op is (_op_facts.py)
    passes: PassAnalyses        # what XLA's passes make of the program (_xla_passes.py)

    @property
    def num_values(self) -> int:
        return len(self.values.nbytes)


def _sliced_first(an, operand_op, operand_value) -> np.ndarray:
    """Static.operand_sliced_first: the reads of a reduce op (reduce_sum, reduce_max, ...; not
    a matmul's, a convolution's or a gather's, whose handlers place the partial sums
    themselves: _kernel's slice-and-move) from another domain than its result's (a bias
    gradient summed from the compute domain into the parameters'). plan.jit pins such a read
    in the axes the op reads it in (boundary_reads), so XLA's partitioner slices it like the
    result before it reduces, and the reduced axes come after (jax 0.10.2). Unpinned, XLA
    reduces it whole on the result's dims and slices the all-reduced sums as the plan lists
    them."""
    prog = an.program
    crossing = crossing_reads(an)
    out = np.zeros(len(operand_op), bool)
    for o, (n, u) in enumerate(zip(operand_op, operand_value)):
        op, rule = prog.ops[n], an.op_rules[n]
        out[o] = ((int(n), int(u)) in crossing and op.primitive.startswith("reduce_")
                  and not rule.fallback and REDUCTION in rule.kinds)
    return out


def static_tables(an) -> Static:
    """The tables of `an`, built once and kept with it: every CostModel of it shares them."""
    return an.derived("cost.static", lambda: build_static(an))


def build_static(an) -> Static:
    prog = an.program
    values, ops = prog.values, prog.ops
    N = len(ops)
    value = value_facts(an)
    slot_class, nbytes = value.slot_class, value.nbytes

    rows = {k: [] for k in ("op", "value", "dim", "kind", "src_value", "src_dim", "group",
                            "compound", "src_compound", "operand")}
    group_is_reduction, group_op = [], []
    operand_op, operand_value, operand_slot, operand_nbytes = [], [], [], []
    early = early_values(prog)

    def add_operand(op_id, value, slot, size, dims):
        """An operand `op_id` reshards (`value`, its position `slot` among the op's operands,
        -1 for none, and the whole-tensor bytes `size` it moves) with its rows, one per
        (dim, row kind, source value, source dim, group[, compound[, src_compound]]) of
        `dims` (see row_compound, row_src_compound); nothing without rows."""
        if not dims:
            return
        for d, kind, src_v, src_d, group, *compound in dims:
            for key, val in (("op", op_id), ("value", value), ("dim", d), ("kind", kind),
                             ("src_value", src_v), ("src_dim", src_d), ("group", group),
                             ("compound", compound[0] if compound else 0),
                             ("src_compound", compound[1] if len(compound) > 1 else 0),
                             ("operand", len(operand_op))):
                rows[key].append(val)
        operand_op.append(op_id)
        operand_value.append(value)
        operand_slot.append(slot)
        operand_nbytes.append(size)

    written: dict[int, list] = {}
    for w in prog.handed_on_stacks():
        written.setdefault(w[0], []).append(w)
    folding = constant_folding(prog)
    folded, uniform = folding
    for op, rule in zip(ops, an.op_rules):
        if op.body:
            # Region boundaries tie the same classes: no reshard is modelled there, but for a
            # scan's stacks (xs), parameters or computed outside loops (an RNN's x @ w, the
            # cotangent of its outputs). The loop reads them a slice per iteration, so XLA
            # reshards the stack whole to its slice's sharding, hoisted out of the while
            # body, once per loop (the forward and the backward scan each): an all-gather
            # where the scanned dim is sharded (gpt_scan with `layers` sharded, an RNN with
            # its sequence sharded), an all-to-all where the slice takes those axes on
            # another dim (llama, a stack on `layers` whose slice has `kv_heads` on the same
            # axis; jax 0.10.2). A stack another loop wrote is whole in both loops' state,
            # and is not gathered.
            for t in _scan_stacks(op):
                u = op.operands[t]
                if not early[u] and _loop_made(prog, u):
                    continue
                dims = [(0, ROW_REPLICATE, -1, -1, -1)] + [
                    (d, ROW_RESULT, op.body[t], d - 1, -1) for d in range(1, values[u].ndim)]
                add_operand(op.id, u, t, nbytes[u],
                            [x for x in dims if slot_class[u, x[0]] >= 0])
            # Its stacked outputs that no loop reads mirror that: the loop writes each slice
            # into a stack sharded like the slice (the scanned dim whole), and plan.jit pins
            # the result to the plan's sharding after it, where XLA reshards the stack whole,
            # once: an all-to-all where the stack's scanned dim takes axes its slice has on
            # another dim (llama's kv-projection gradients, with `layers` and `kv_heads` on
            # one axis, before the optimizer reads them; jax 0.10.2), nothing where it only
            # adds axes (a local slice). Costed as the scan op's read of its body's output.
            for _, r, b in written.get(op.id, ()):
                dims = [(0, ROW_FROM_WHOLE, r, 0, -1)] * int(slot_class[r, 0] >= 0) + [
                    (d - 1, ROW_RESULT, r, d, -1) for d in range(1, values[r].ndim)
                    if slot_class[b, d - 1] >= 0]
                add_operand(op.id, b, -1, nbytes[r], dims)
            continue
        # Where each factor lands on the results: (result value, dim, is the major part).
        on_result: dict[int, tuple[int, int, bool]] = {}
        for j, dims in enumerate(rule.results):
            for e, factors in enumerate(dims):
                for k, f in enumerate(factors):
                    on_result.setdefault(f, (op.results[j], e, k == 0))
        groups: dict[int, int] = {}
        for t, dims in enumerate(rule.operands):
            u = op.operands[t]
            merged = _merged_parts(rule, t, dims, [slot_class[u, d] >= 0
                                                   for d in range(len(dims))])
            wanted = []
            for d, factors in enumerate(dims):
                if not factors or slot_class[u, d] < 0:
                    continue
                f = factors[0]  # a compound dim is sharded like its major factor
                kind = rule.kinds[f]
                src_v = src_d = group = -1
                src_compound = merged.get(f, 0)
                if kind is NEED_REPLICATION:
                    row_kind = ROW_REPLICATE
                elif kind is PASS_THROUGH and f in on_result:
                    r, e, major = on_result[f]
                    if major or src_compound < 0:
                        row_kind, src_v, src_d = ROW_RESULT, r, e
                    else:
                        row_kind = ROW_REPLICATE
                else:  # reduction, or a factor only the operands share: they must agree
                    if f not in groups:
                        groups[f] = len(group_op)
                        group_op.append(op.id)
                        group_is_reduction.append(kind is REDUCTION)
                    row_kind, group = ROW_GROUP, groups[f]
                # The minor parts of a compound dim (a batch split into micro-batches, [32] ->
                # [4, 8]) hold the axes left over once the major part is tiled whole: the
                # dim's axes tile it major first, so where the leading axes' ways make up the
                # major part's size exactly ([32] on (data=4, model=2): data tiles the 4
                # micro-batches, model halves each one's 8 examples), the rest lie on the
                # first minor part (row_compound, the kernel's _compound_split); otherwise all
                # are the major part's. A minor part the result shards takes the axes it lacks
                # from other devices' blocks: with the major part's row losing them, an
                # all-to-all (tokens on data to each micro-batch's examples on data: jax
                # 0.10.2 moves the tokens' shard so).
                minor = [f2 for f2 in factors[1:] if rule.kinds[f2] is PASS_THROUGH
                         and on_result.get(f2, (0, 0, False))[2]]
                compound = rule.sizes[f] if minor and minor[0] == factors[1] else 0
                wanted.append((d, row_kind, src_v, src_d, group, compound,
                               src_compound if row_kind == ROW_RESULT else 0))
                for f2 in minor:
                    r, e, _ = on_result[f2]
                    wanted.append((d, ROW_FROM_WHOLE, r, e, -1, compound if f2 == minor[0]
                                   else 0))
            add_operand(op.id, u, t, nbytes[u], wanted)

    facts = op_facts(an, folding.folded)
    passes = pass_analyses(prog, {n for g, n in enumerate(group_op)
                                  if group_is_reduction[g] and not facts.gathered_partials[n]})
    arr = lambda k, dt=np.int32: np.array(rows[k], dt)  # noqa: E731
    return Static(
        values=value,
        passes=passes,
        row_op=arr("op"), row_value=arr("value"), row_dim=arr("dim"),
        row_kind=arr("kind", np.int8), row_src_value=arr("src_value"),
        row_src_dim=arr("src_dim"), row_group=arr("group"), row_compound=arr("compound"),
        row_src_compound=arr("src_compound"),
        group_is_reduction=np.array(group_is_reduction, bool),
        group_op=np.array(group_op, np.int32), row_operand=arr("operand"),
        operand_op=np.array(operand_op, np.int32),
        operand_value=np.array(operand_value, np.int32),
        operand_slot=np.array(operand_slot, np.int32),
        operand_nbytes=np.array(operand_nbytes, np.float64),
        operand_uniform=np.array([u in uniform for u in operand_value], bool),
        operand_sliced_first=_sliced_first(an, operand_op, operand_value),
        num_ops=N, flops=flop_counts(prog, folding), ops=facts)


def _scan_stacks(op) -> range:
    """The operand positions of a scan's stacks (xs), scanned along dim 0; none elsewhere."""
    if op.primitive != "scan":
        return range(0)
    return range(op.params["num_consts"] + op.params["num_carry"], len(op.operands))


def _loop_made(prog, v: int) -> bool:
    """Whether v is a result of a loop (the stack a forward scan writes for the backward)."""
    producer = prog.values[v].producer
    return producer != NO_OP and bool(prog.ops[producer].body)


def _merged_parts(rule, t, dims, has_class) -> dict:
    """{factor: row_src_compound} for operand `t` of a reshape that merges two of its dims into
    one result dim ([4 heads, 8] -> [32]): the merged dim's axes tile it major first, so where
    the leading ones make up the major part exactly ((data=4, model=2) on [32]: data the 4
    heads, model each head's 8) the major dim wants those and the first minor dim the rest
    (the kernel's _compound_split); the model had wanted the minor dim whole, an all-to-all
    XLA does not run (jax 0.10.2: [8, 4, 8] with 8 on model read as [8, 32] on (data,
    model) moves nothing)."""
    own = {}
    for d, factors in enumerate(dims):
        if factors and has_class[d] and rule.kinds[factors[0]] is PASS_THROUGH:
            own[factors[0]] = d
    out = {}
    for rdims in rule.results:
        for factors in rdims:
            if (len(factors) >= 2 and factors[0] in own and factors[1] in own
                    and own[factors[0]] != own[factors[1]]):
                out[factors[0]] = rule.sizes[factors[0]]
                out[factors[1]] = -rule.sizes[factors[0]]
    return out
