"""What each op wants of its operands' shardings, read from its sharding rule: one *row* per
(op, operand dim) that a factor maps, saying whether the op wants that dim sharded like a
result dim ("result" rows), like the other operands of a contraction ("group" rows:
reduction and operand-only factors), or whole ("replicate" rows: need-replication factors);
one *operand* per (op, operand tensor) with rows; one *group* per shared factor of an op.

Region ops add the reshards XLA runs at a loop's boundary: a scan's stacks gathered to their
slice's layout before the loop, its stacked outputs resharded after it.

Built from the analysis's op rules, its values' split classes (_value_facts.py) and its
constant folding (_folding.py), once per analysis (_static.py). The kernel prices each row
under a plan (_kernel/_operands.py); the types compress them (_types.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..analysis import crossing_reads
from ..program import NO_OP
from ..rules import NEED_REPLICATION, PASS_THROUGH, REDUCTION
from ._value_facts import ValueFacts

# An operand row wants its dim sharded like a result's dim (ROW_RESULT), like its group's
# consensus (ROW_GROUP) or whole (ROW_REPLICATE); ROW_FROM_WHOLE: the operand holds the dim
# whole (a stack a loop writes slice by slice, along the scanned dim; the minor part of a
# compound dim, whose sharding is its major part's) and the op wants it sharded like the
# source dim.
ROW_RESULT, ROW_GROUP, ROW_REPLICATE, ROW_FROM_WHOLE = 0, 1, 2, 3


@dataclass(frozen=True, eq=False)
class Rows:
    """[R] int32 each (kind: int8); the rows of one operand are contiguous."""

    op: np.ndarray
    value: np.ndarray
    dim: np.ndarray
    kind: np.ndarray            # ROW_RESULT / ROW_GROUP / ROW_REPLICATE / ROW_FROM_WHOLE
    src_value: np.ndarray       # result rows: the result value whose dim it follows (-1)
    src_dim: np.ndarray
    group: np.ndarray           # group rows: their group (-1 otherwise)
    # on a compound dim whose first minor part the result shards, the size of its major part,
    # on the major part's row and the first minor part's (0 otherwise)
    compound: np.ndarray
    # on a result dim that merges an operand's dims ([4, 8] -> [32]), the size of its major
    # part: positive on the major part's row, negative on the first minor part's (which wants
    # the axes left over: the kernel's _compound_split); 0 otherwise
    src_compound: np.ndarray
    operand: np.ndarray         # its operand (an index into Operands)


@dataclass(frozen=True, eq=False)
class Groups:
    """[G]: the factors an op's operands must agree on."""

    op: np.ndarray              # int32
    is_reduction: np.ndarray    # bool: partial sums when the group is sharded


@dataclass(frozen=True, eq=False)
class Operands:
    """[O]: one per (op, operand tensor) with rows; a region op's loop-boundary reshards too."""

    op: np.ndarray              # int32
    value: np.ndarray           # int32
    slot: np.ndarray            # int32: its position among the op's operands (-1: none)
    nbytes: np.ndarray          # float64: whole-tensor bytes of what it reshards
    # bool: it reads a constant holding one number throughout (a broadcast literal, such as
    # optax.set_to_zero's update of a frozen parameter), which XLA all-gathers for free
    uniform: np.ndarray
    # bool: a reduce op (not a matmul, convolution or gather) reads it from another domain,
    # where plan.jit pins the read sliced like the result (plan._export.boundary_reads): the
    # axes it sums over reach the result's dims after that slice (the kernel's _out_of_order)
    sliced_first: np.ndarray


class OperandRows(NamedTuple):
    rows: Rows
    groups: Groups
    operands: Operands


class _Found:
    """The rows, groups and operands in the order the walk finds them: tuples in the order
    of Rows', Groups' and Operands' fields (Operands' first four)."""

    def __init__(self):
        self.rows: list[tuple] = []
        self.groups: list[tuple] = []
        self.operands: list[tuple] = []

    def operand(self, op: int, value: int, slot: int, nbytes: float, wanted: list) -> None:
        """An operand `op` reshards (`value`, its position `slot` among the op's operands, -1
        for none, and the whole-tensor bytes it moves) with its rows, one per (dim, row kind,
        source value, source dim, group[, compound[, src_compound]]) of `wanted`; nothing
        without rows."""
        if not wanted:
            return
        for d, kind, src_v, src_d, group, *compound in wanted:
            self.rows.append((op, value, d, kind, src_v, src_d, group,
                              compound[0] if compound else 0,
                              compound[1] if len(compound) > 1 else 0, len(self.operands)))
        self.operands.append((op, value, slot, nbytes))

    def group(self, op: int, is_reduction: bool) -> int:
        """A new group of `op`'s operands (a factor they share); its index."""
        self.groups.append((op, is_reduction))
        return len(self.groups) - 1


def operand_rows(an, values: ValueFacts, early: np.ndarray, uniform: dict) -> OperandRows:
    """The OperandRows of analysis `an`: `values` its value facts, `early` [V] bool the
    values known before any compute (_xla_passes.early_values), `uniform` {value: the one
    number a constant holds throughout} (_folding.Folding)."""
    prog = an.program
    found = _Found()
    written: dict[int, list] = {}  # per scan op, the stacks it hands on (Program)
    for w in prog.handed_on_stacks():
        written.setdefault(w[0], []).append(w)
    for op, rule in zip(prog.ops, an.op_rules):
        if op.body:
            _loop_operands(found, prog, op, values, early, written.get(op.id, ()))
        else:
            _rule_operands(found, op, rule, values)
    return _tables(found, an, uniform)


def _loop_operands(found: _Found, prog, op, values: ValueFacts, early, written) -> None:
    """The reshards at a region op's boundary. Region boundaries tie the same classes: no
    reshard is modelled there, but for a scan's stacks (xs), parameters or computed outside
    loops (an RNN's x @ w, the cotangent of its outputs). The loop reads them a slice per
    iteration, so XLA reshards the stack whole to its slice's sharding, hoisted out of the
    while body, once per loop (the forward and the backward scan each): an all-gather where
    the scanned dim is sharded (gpt_scan with `layers` sharded, an RNN with its sequence
    sharded), an all-to-all where the slice takes those axes on another dim (llama, a stack
    on `layers` whose slice has `kv_heads` on the same axis; jax 0.10.2). A stack another
    loop wrote is whole in both loops' state, and is not gathered."""
    slot_class, nbytes = values.slot_class, values.nbytes
    for t in _scan_stacks(op):
        u = op.operands[t]
        if not early[u] and _loop_made(prog, u):
            continue
        dims = [(0, ROW_REPLICATE, -1, -1, -1)] + [
            (d, ROW_RESULT, op.body[t], d - 1, -1) for d in range(1, prog.values[u].ndim)]
        found.operand(op.id, u, t, nbytes[u], [x for x in dims if slot_class[u, x[0]] >= 0])
    # Its stacked outputs that no loop reads (`written`: (scan, result, body output)) mirror
    # that: the loop writes each slice into a stack sharded like the slice (the scanned dim
    # whole), and plan.jit pins the result to the plan's sharding after it, where XLA
    # reshards the stack whole, once: an all-to-all where the stack's scanned dim takes axes
    # its slice has on another dim (llama's kv-projection gradients, with `layers` and
    # `kv_heads` on one axis, before the optimizer reads them; jax 0.10.2), nothing where it
    # only adds axes (a local slice). Costed as the scan op's read of its body's output.
    for _, r, b in written:
        dims = [(0, ROW_FROM_WHOLE, r, 0, -1)] * int(slot_class[r, 0] >= 0) + [
            (d - 1, ROW_RESULT, r, d, -1) for d in range(1, prog.values[r].ndim)
            if slot_class[b, d - 1] >= 0]
        found.operand(op.id, b, -1, nbytes[r], dims)


def _rule_operands(found: _Found, op, rule, values: ValueFacts) -> None:
    """The operands of an op that is no region, with their rows, from its sharding rule."""
    slot_class = values.slot_class
    on_result = _result_places(op, rule)
    groups: dict[int, int] = {}  # factor -> its group, made at the first dim it maps
    for t, dims in enumerate(rule.operands):
        u = op.operands[t]
        merged = _merged_parts(rule, t, dims, [slot_class[u, d] >= 0
                                               for d in range(len(dims))])
        wanted = []
        for d, factors in enumerate(dims):
            if factors and slot_class[u, d] >= 0:
                wanted += _dim_rows(found, op, rule, d, factors, on_result, merged, groups)
        found.operand(op.id, u, t, values.nbytes[u], wanted)


def _result_places(op, rule) -> dict[int, tuple[int, int, bool]]:
    """Where each factor lands on the op's results, first place only: {factor: (result value,
    dim, whether it is the dim's major part)}."""
    on_result: dict[int, tuple[int, int, bool]] = {}
    for j, dims in enumerate(rule.results):
        for e, factors in enumerate(dims):
            for k, f in enumerate(factors):
                on_result.setdefault(f, (op.results[j], e, k == 0))
    return on_result


def _dim_rows(found: _Found, op, rule, d: int, factors, on_result, merged, groups) -> list:
    """The rows of operand dim `d`, which `factors` map (major first): tuples as
    _Found.operand takes them."""
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
            groups[f] = found.group(op.id, kind is REDUCTION)
        row_kind, group = ROW_GROUP, groups[f]
    # The minor parts of a compound dim (a batch split into micro-batches, [32] -> [4, 8])
    # hold the axes left over once the major part is tiled whole: the dim's axes tile it
    # major first, so where the leading axes' ways make up the major part's size exactly
    # ([32] on (data=4, model=2): data tiles the 4 micro-batches, model halves each one's 8
    # examples), the rest lie on the first minor part (Rows.compound, the kernel's
    # _compound_split); otherwise all are the major part's. A minor part the result shards
    # takes the axes it lacks from other devices' blocks: with the major part's row losing
    # them, an all-to-all (tokens on data to each micro-batch's examples on data: jax 0.10.2
    # moves the tokens' shard so).
    minor = [f2 for f2 in factors[1:] if rule.kinds[f2] is PASS_THROUGH
             and on_result.get(f2, (0, 0, False))[2]]
    compound = rule.sizes[f] if minor and minor[0] == factors[1] else 0
    wanted = [(d, row_kind, src_v, src_d, group, compound,
               src_compound if row_kind == ROW_RESULT else 0)]
    for f2 in minor:
        r, e, _ = on_result[f2]
        wanted.append((d, ROW_FROM_WHOLE, r, e, -1, compound if f2 == minor[0] else 0))
    return wanted


def _tables(found: _Found, an, uniform: dict) -> OperandRows:
    """The arrays of what the walk found."""
    r, g, o = found.rows, found.groups, found.operands
    def col(records, i, dtype=np.int32):
        return np.array([x[i] for x in records], dtype)

    rows = Rows(op=col(r, 0), value=col(r, 1), dim=col(r, 2), kind=col(r, 3, np.int8),
                src_value=col(r, 4), src_dim=col(r, 5), group=col(r, 6), compound=col(r, 7),
                src_compound=col(r, 8), operand=col(r, 9))
    groups = Groups(op=col(g, 0), is_reduction=col(g, 1, bool))
    operand_op, operand_value = [x[0] for x in o], [x[1] for x in o]
    operands = Operands(op=col(o, 0), value=col(o, 1), slot=col(o, 2),
                        nbytes=col(o, 3, np.float64),
                        uniform=np.array([u in uniform for u in operand_value], bool),
                        sliced_first=_sliced_first(an, operand_op, operand_value))
    return OperandRows(rows, groups, operands)


def _sliced_first(an, operand_op, operand_value) -> np.ndarray:
    """Operands.sliced_first: the reads of a reduce op (reduce_sum, reduce_max, ...; not
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
    """{factor: Rows.src_compound} for operand `t` of a reshape that merges two of its dims into
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
