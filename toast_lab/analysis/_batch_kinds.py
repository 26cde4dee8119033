"""The kinds of values in a step split into micro-batches (_micro_batching.py): which values
carry examples, which sum over them, which follow the sums, read off the program in one walk
(regions to a fixed point), with the user's line of the first op that couples examples.

Kinds: INDEPENDENT (no batch), ZERO (an independent zero: what a gradient is scattered into),
EXAMPLE (carries the batch dim, each example's entries its own), SUM (a linear reduction over
the batch, or a linear map of sums), AFTER (computed from sums); BOTTOM before a loop's
carried values are known.
"""

from __future__ import annotations

from collections import defaultdict

import jax.numpy as jnp
import numpy as np

from ..program import CONST, INPUT, LITERAL, NO_OP, user_line
from ..rules import NEED_REPLICATION, REDUCTION, ResizeError, Shapes, resized_params
from ._domains import region_links

BOTTOM, INDEPENDENT, ZERO, EXAMPLE, SUM, AFTER = -1, 0, 1, 2, 3, 4
KIND_NAMES = {INDEPENDENT: "independent", ZERO: "zero", EXAMPLE: "per-example", SUM: "sum",
              AFTER: "after"}

_CONTRACTIONS = frozenset({"dot_general", "conv_general_dilated", "ragged_dot_general"})
_SCATTER_ADDS = frozenset({"scatter-add", "scatter_add"})
# Maps that are linear in their operands that are sums (the others batch-independent).
_LINEAR_UNARY = frozenset({"neg", "convert_element_type", "reshape", "transpose",
                           "broadcast_in_dim", "squeeze", "expand_dims", "copy", "copy_p",
                           "reduce_sum", "slice", "rev", "reduce_precision", "dynamic_slice",
                           "gather", "sharding_constraint", "optimization_barrier"})
_ADDITIVE = frozenset({"add", "sub", "add_any", "concatenate"})
_KEEPS_ZERO = frozenset({"broadcast_in_dim", "convert_element_type", "reshape", "transpose",
                         "squeeze", "expand_dims", "copy", "neg"})


class Refusal(Exception):
    """Why the batch cannot be split, and the user's line that says so."""

    def __init__(self, reason: str, source: str):
        super().__init__(reason)
        self.reason, self.source = reason, source


def batch_dims(an, b: int) -> dict[int, tuple[int, ...]]:
    """Per value: its dims that hold class `b`, whole or merged with others (a factor of a
    compound dim, as the op rules place it). Raises Refusal where a dim of `b` is cut into
    parts (a reshape of the examples into [micro, examples / micro])."""
    prog = an.program
    dims: dict[int, set[int]] = defaultdict(set)
    for v, classes in enumerate(an.value_classes):
        for d, c in enumerate(classes):
            if c == b:
                dims[v].add(d)
    for op, rule, classes in zip(prog.ops, an.op_rules, an.op_factor_classes):
        for tensors, layout in ((op.operands, rule.operands), (op.results, rule.results),
                                (op.body, rule.boundary)):
            for v, per_dim in zip(tensors, layout):
                for d, factors in enumerate(per_dim):
                    if any(classes[f] == b for f in factors):
                        dims[v].add(d)
                    elif factors and an.value_classes[v][d] == b:
                        raise Refusal(f"{lines_of(op)}: {op.primitive} cuts the batch dim into "
                                      f"parts, which a micro-batch would cut differently",
                                      user_line(op.source_info))
    return {v: tuple(sorted(ds)) for v, ds in dims.items()}


class KindWalk:
    """Gives every value a kind (module docstring), in program order, regions included."""

    def __init__(self, an, b: int):
        self.an, self.prog, self.b = an, an.program, b
        self.bdims = batch_dims(an, b)
        self.size = an.classes[b].size
        self.factor = next(p for p in range(2, self.size + 1) if self.size % p == 0)
        self.kind = np.full(len(self.prog.values), BOTTOM, np.int8)
        self.origin = np.full(len(self.prog.values), NO_OP, np.int64)

    def run(self) -> None:
        for v in self.prog.values:
            if v.origin in (INPUT, CONST, LITERAL):
                self.kind[v.id] = self._leaf_kind(v)
        self._walk(0, len(self.prog.ops))

    def _leaf_kind(self, v) -> int:
        if self.bdims.get(v.id):
            return EXAMPLE
        value = self.prog.constants.get(v.id)
        if value is not None and np.size(value) and not np.any(np.asarray(value)):
            return ZERO
        return INDEPENDENT

    def _walk(self, start: int, stop: int) -> None:
        ops, i = self.prog.ops, start
        while i < stop:
            op = ops[i]
            if op.body:
                self._region(op)
                i = op.body_ops[1]
            else:
                self._op(op)
                i += 1

    def _region(self, op) -> None:
        self._check_batch_factors(op)
        links = region_links(op)
        results = set(op.results)
        for _ in range(8):  # loop-carried kinds rise to a fixed point (a small lattice)
            before = self.kind.copy()
            for a, b in links:
                if b not in results:
                    self._join(b, a)
            self._walk(*op.body_ops)
            if np.array_equal(before, self.kind):
                break
        for a, b in links:
            if b in results:
                self._join(b, a)

    def _join(self, dst: int, src: int) -> None:
        a, b = int(self.kind[dst]), int(self.kind[src])
        if self.bdims.get(dst):
            new = EXAMPLE
        elif a == BOTTOM or a == b:
            new = b
        elif b == BOTTOM:
            new = a
        elif {a, b} == {ZERO, INDEPENDENT}:
            new = INDEPENDENT
        elif {a, b} == {ZERO, SUM}:
            new = SUM
        else:  # a batch-independent start plus sums, or anything of what follows the sums
            new = AFTER
        if new != a:
            self.kind[dst] = new
            self.origin[dst] = self.origin[src] if self.origin[src] != NO_OP else \
                self.prog.values[src].producer

    def _op(self, op) -> None:
        ins = [int(self.kind[v]) for v in op.operands]
        batched = [bool(self.bdims.get(r)) for r in op.results]
        if EXAMPLE not in ins and not any(batched):
            self._after_or_independent(op, ins)
            return
        self._check_batch_factors(op)
        coupled = [v for v, k in zip(op.operands, ins) if k in (SUM, AFTER)]
        if coupled:
            raise Refusal(self._coupling(op, coupled[0]), user_line(op.source_info))
        self._check_resizable(op)
        for r, has in zip(op.results, batched):
            if has:
                self.kind[r] = EXAMPLE
            else:
                self.kind[r] = self._reduction_kind(op, ins)
                self.origin[r] = op.id

    def _after_or_independent(self, op, ins) -> None:
        if AFTER in ins or SUM in ins:
            kind = AFTER if AFTER in ins or not _linear(op, ins, self.prog) else SUM
            src = next(v for v, k in zip(op.operands, ins) if k in (SUM, AFTER))
            for r in op.results:
                self.kind[r] = kind
                self.origin[r] = self.origin[src] if kind == SUM else op.id
            return
        zero = op.primitive in _KEEPS_ZERO and ins and ins[0] == ZERO or (
            op.primitive == "mul" and ZERO in ins)
        for r in op.results:
            self.kind[r] = ZERO if zero else INDEPENDENT

    def _check_batch_factors(self, op) -> None:
        rule, classes = self.an.op_rules[op.id], self.an.op_factor_classes[op.id]
        if rule.fallback and any(self.kind[v] == EXAMPLE for v in op.operands):
            raise Refusal(f"{lines_of(op)}: toast-lab has no sharding rule for {op.primitive}, "
                          f"so it cannot tell how {op.primitive} treats the examples",
                          user_line(op.source_info))
        for f, c in enumerate(classes):
            if c == self.b and rule.kinds[f] is NEED_REPLICATION:
                raise Refusal(f"{lines_of(op)}: {op.primitive} needs every example at once (it "
                              f"scans, sorts, accumulates or indexes along the batch), so a "
                              f"micro-batch would compute another result",
                              user_line(op.source_info))
        for r in op.results:
            if len(self.bdims.get(r, ())) > 1:
                raise Refusal(f"{lines_of(op)}: {op.primitive} pairs examples with each other "
                              f"(the batch on two dims of one value, as in-batch negatives), "
                              f"and a micro-batch would miss the pairs across micro-batches",
                              user_line(op.source_info))

    def _check_resizable(self, op) -> None:
        prog, k = self.prog, self.factor
        old = Shapes(tuple(prog.values[v].shape for v in op.operands),
                     tuple(prog.values[v].shape for v in op.results))
        new = Shapes(tuple(self._micro(v, k) for v in op.operands),
                     tuple(self._micro(v, k) for v in op.results))
        try:
            resized_params(op.primitive, op.params, old, new)
        except ResizeError as err:
            raise Refusal(f"{lines_of(op)}: {op.primitive} {err}; splitting the batch would "
                          f"change what it computes", user_line(op.source_info)) from None

    def _micro(self, v: int, k: int) -> tuple[int, ...]:
        dims = self.bdims.get(v, ())
        return tuple(n // k if d in dims else n for d, n in enumerate(self.prog.values[v].shape))

    def _reduction_kind(self, op, ins) -> int:
        """The kind of a result without the batch dim of an op that reads examples: a sum
        where the op sums over the examples linearly; refused otherwise."""
        rule, classes = self.an.op_rules[op.id], self.an.op_factor_classes[op.id]
        over_batch = [rule.kinds[f] for f, c in enumerate(classes) if c == self.b]
        summed = over_batch and all(kind is REDUCTION for kind in over_batch)
        if summed and (op.primitive == "reduce_sum" or op.primitive in _CONTRACTIONS):
            return SUM
        if op.primitive in _SCATTER_ADDS and ins[0] in (ZERO, SUM):
            return SUM
        what = ("adds the examples into a value that is not zero" if op.primitive
                in _SCATTER_ADDS else "reduces over the batch with something other than a sum")
        raise Refusal(f"{lines_of(op)}: {op.primitive} {what}, so the micro-batches' results "
                      f"would not add up to the step's", user_line(op.source_info))

    def _coupling(self, op, value: int) -> str:
        origin = int(self.origin[value])
        made = self.prog.ops[origin] if origin != NO_OP else None
        where = f" at {lines_of(made)}" if made is not None else ""
        what = "a value reduced over the batch" if self.kind[value] == SUM else \
            "a value computed from sums over the batch"
        return (f"{lines_of(op)}: a per-example value reads {what}{where}, so each example "
                f"depends on the others (batch statistics, a loss normalised by a count over "
                f"the batch, a product of batch means): micro-batches would compute another "
                f"result")


def lines_of(op) -> str:
    """The user's line that led to `op`, and the library's line where the op is a library's
    ('model.py:12 (Net.__call__), in flax/linen/normalization.py:205 (_normalize)')."""
    user, own = user_line(op.source_info), op.source
    return user if user == own else f"{user}, in {own}"


def _linear(op, ins, prog) -> bool:
    """Whether `op` maps sums to a sum: linear in its SUM operands, its others batch-independent
    (a sum plus a nonzero independent value is not: k micro-batches would add it k times)."""
    name = op.primitive
    sums = [k == SUM for k in ins]
    if AFTER in ins or EXAMPLE in ins:
        return False
    if name in _ADDITIVE:
        return all(k in (SUM, ZERO) for k in ins)
    if name == "select_n":
        return ins[0] in (INDEPENDENT, ZERO) and all(k in (SUM, ZERO) for k in ins[1:])
    if name == "pad":
        return ins[0] == SUM and ins[1] == ZERO
    if name in ("scatter-add", "scatter_add"):
        return ins[0] in (SUM, ZERO) and ins[2] in (SUM, ZERO) and ins[1] != SUM
    if name == "convert_element_type":
        src, dst = prog.values[op.operands[0]].dtype, prog.values[op.results[0]].dtype
        # (bfloat16's numpy kind is "V": jnp.issubdtype knows it is a float)
        return not (jnp.issubdtype(src, jnp.inexact) and not jnp.issubdtype(dst, jnp.inexact))
    if name in _LINEAR_UNARY:
        return sums[0] and not any(sums[1:])
    if name in ("mul", "dot_general"):
        return sum(sums) == 1
    if name == "div":
        return sums[0] and not sums[1]
    return False
