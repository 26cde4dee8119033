"""Micro-batching (gradient accumulation): whether a step's batch can be split, and how.

Split into k micro-batches, a step runs its per-example work k times on B/k examples each,
sums what it reduces over the batch, and runs the rest once, on the sums. That is the step's
own result, up to the order of the additions, exactly when every value computed from the
batch is of one of three kinds:

- EXAMPLE: it carries the batch dim and each example's entries depend on that example alone
  (elementwise ops, matmuls and reductions over other dims, a layer stack's scan);
- SUM: a linear reduction of per-example values over the batch dim (a reduce_sum, a matmul
  contracting it: a weight gradient; a scatter-add of per-example values into zeros: an
  embedding gradient), or a linear map of sums. A mean is a sum times 1/B, and the replay keeps
  the traced 1/B, so each micro-batch contributes its share and the shares add up to the mean:
  accumulating means adding the micro-batches' results, nothing else;
- AFTER: computed from sums and batch-independent values only (the optimizer's update, a
  gradient norm for clipping, the log of a loss), run once, on the accumulated sums.

Batch-independent values (INDEPENDENT; ZERO for the zeros a gradient is scattered into) are
computed once before the loop. Refused, with the user's source line: a per-example value that
reads a sum or what follows one (BatchNorm's batch statistics; a loss normalised by a count
over the batch, whose gradient reads the count; a load-balancing loss that multiplies two
batch means), a reduction over the batch that is not a sum (max, sort, a cumulative sum along
the examples), a value that pairs examples (in-batch negatives: the batch on two dims), and an
op that cannot run on fewer examples (rules/_resize.py: random numbers in the batch's shape, a
slice that keeps some examples).

The batch is the analysis's batch class (roles.py). Dims that hold the batch merged with
another (a [B*S, V] reshape of the logits) scale with it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from ..program import CONST, INPUT, LITERAL, NO_OP, user_line
from ..rules import NEED_REPLICATION, REDUCTION, ResizeError, Shapes, resized_params
from ._domains import region_links
from ._roles import find_roles

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


@dataclass(frozen=True, eq=False)
class MicroBatching:
    """Whether, and how, the step's batch splits into micro-batches (module docstring).

    batch: the batch class's name (None without one); examples: its size. reason: why it
    cannot be split, naming the user's source line (`source`); "" where it can. Where it can:
    split: (value, dim) of the inputs and constants cut along the batch; pre_ops / loop_ops /
    post_ops: the top-level ops run once before the loop, once per micro-batch, and once after
    it; accumulated: the sums the loop hands on (summed over micro-batches); stacked: the
    per-example outputs of the step (put back together after the loop); batch_dims: per value
    the loop computes, the dims that hold the batch (their size divides by the count).
    """

    batch: str | None
    examples: int
    reason: str = ""
    source: str = ""
    split: tuple[tuple[int, int], ...] = ()
    pre_ops: tuple[int, ...] = ()
    loop_ops: tuple[int, ...] = ()
    post_ops: tuple[int, ...] = ()
    accumulated: tuple[int, ...] = ()
    stacked: tuple[int, ...] = ()
    batch_dims: Mapping[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    @property
    def legal(self) -> bool:
        return not self.reason

    @property
    def counts(self) -> tuple[int, ...]:
        """The micro-batch counts that split the examples evenly (1 always)."""
        if not self.legal:
            return (1,)
        return tuple(k for k in range(1, self.examples + 1) if self.examples % k == 0)

    def shape(self, value: int, shape: tuple[int, ...], count: int) -> tuple[int, ...]:
        """`shape` (value's) with the dims that hold the batch divided by `count`."""
        dims = self.batch_dims.get(value, ())
        return tuple(n // count if d in dims else n for d, n in enumerate(shape))

    def __repr__(self) -> str:
        if not self.legal:
            return f"MicroBatching(refused: {self.reason})"
        return (f"MicroBatching(batch {self.batch!r} of {self.examples}: "
                f"{', '.join(map(str, self.counts))} micro-batches; {len(self.loop_ops)} ops "
                f"per micro-batch, {len(self.accumulated)} sums accumulated)")


class _Refused(Exception):
    def __init__(self, reason: str, source: str):
        super().__init__(reason)
        self.reason, self.source = reason, source


def micro_batching(an) -> MicroBatching:
    """The MicroBatching of `an`'s step (found once per analysis)."""
    return an.derived("micro_batching", lambda: _find(an))


def _find(an) -> MicroBatching:
    roles = find_roles(an)
    b = roles.batch
    if b is None:
        return MicroBatching(None, 1, "the step has no batch: no data input has a leading "
                                      "dim of examples to split")
    cls = an.classes[b]
    if roles.micro_batched:
        return MicroBatching(cls.name, cls.size, f"the step already splits its batch into "
                             f"micro-batches (a lax.scan over {cls.name!r}'s examples)")
    if cls.size < 2:
        return MicroBatching(cls.name, cls.size, "a batch of one example has nothing to split")
    try:
        walk = _Walk(an, b)
        walk.run()
        return walk.partition(cls)
    except _Refused as why:
        return MicroBatching(cls.name, cls.size, why.reason, why.source)


def batch_dims(an, b: int) -> dict[int, tuple[int, ...]]:
    """Per value: its dims that hold class `b`, whole or merged with others (a factor of a
    compound dim, as the op rules place it). Raises _Refused where a dim of `b` is cut into
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
                        raise _Refused(f"{_where(op)}: {op.primitive} cuts the batch dim into "
                                       f"parts, which a micro-batch would cut differently",
                                       user_line(op.source_info))
    return {v: tuple(sorted(ds)) for v, ds in dims.items()}


class _Walk:
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
            raise _Refused(self._coupling(op, coupled[0]), user_line(op.source_info))
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
            raise _Refused(f"{_where(op)}: toast-lab has no sharding rule for {op.primitive}, "
                           f"so it cannot tell how {op.primitive} treats the examples",
                           user_line(op.source_info))
        for f, c in enumerate(classes):
            if c == self.b and rule.kinds[f] is NEED_REPLICATION:
                raise _Refused(f"{_where(op)}: {op.primitive} needs every example at once (it "
                               f"scans, sorts, accumulates or indexes along the batch), so a "
                               f"micro-batch would compute another result",
                               user_line(op.source_info))
        for r in op.results:
            if len(self.bdims.get(r, ())) > 1:
                raise _Refused(f"{_where(op)}: {op.primitive} pairs examples with each other "
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
            raise _Refused(f"{_where(op)}: {op.primitive} {err}; splitting the batch would "
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
        raise _Refused(f"{_where(op)}: {op.primitive} {what}, so the micro-batches' results "
                       f"would not add up to the step's", user_line(op.source_info))

    def _coupling(self, op, value: int) -> str:
        origin = int(self.origin[value])
        made = self.prog.ops[origin] if origin != NO_OP else None
        where = f" at {_where(made)}" if made is not None else ""
        what = "a value reduced over the batch" if self.kind[value] == SUM else \
            "a value computed from sums over the batch"
        return (f"{_where(op)}: a per-example value reads {what}{where}, so each example "
                f"depends on the others (batch statistics, a loss normalised by a count over "
                f"the batch, a product of batch means): micro-batches would compute another "
                f"result")

    def partition(self, cls) -> MicroBatching:
        prog, kind = self.prog, self.kind
        top = [op for op in prog.ops if op.region == NO_OP]
        loop: set[int] = set()
        for op in top:
            inner = [r for o in prog.ops[op.body_ops[0]:op.body_ops[1]] for r in o.results]
            if any(kind[v] == EXAMPLE for v in (*op.operands, *op.results, *op.body, *inner)):
                loop.add(op.id)
        for op in top:  # linear maps of the loop's sums stay in the loop: fewer accumulators
            if op.id not in loop and op.results and all(kind[r] == SUM for r in op.results):
                if all(kind[v] != SUM or prog.values[v].producer in loop for v in op.operands):
                    loop.add(op.id)
        outputs = set(prog.outputs)
        for o in sorted(loop):
            op = prog.ops[o]
            if any(kind[r] == AFTER for r in op.results):
                raise _Refused(f"{_where(op)}: {op.primitive} computes from the whole batch "
                               f"inside a loop that also runs per example",
                               user_line(op.source_info))
            if any(kind[r] in (INDEPENDENT, ZERO) and (r in outputs or any(
                    u not in loop for u in prog.users(r))) for r in op.results):
                raise _Refused(f"{_where(op)}: {op.primitive} computes a batch-independent "
                               f"value together with per-example ones, and the step reads it "
                               f"after them", user_line(op.source_info))
        pre = [op.id for op in top if op.id not in loop
               and all(kind[r] in (INDEPENDENT, ZERO) for r in op.results)]
        post = [op.id for op in top if op.id not in loop and op.id not in set(pre)]
        accumulated = [r for o in sorted(loop) for r in prog.ops[o].results
                       if kind[r] == SUM and (r in outputs or any(
                           u not in loop for u in prog.users(r)))]
        stacked = [v for v in prog.outputs if kind[v] == EXAMPLE
                   and prog.values[v].producer in loop]
        for v in stacked:  # put back together along the one dim that holds the examples
            dims = self.bdims[v]
            if len(dims) != 1 or self.an.value_classes[v][dims[0]] != self.b:
                op = prog.ops[prog.values[v].producer]
                raise _Refused(f"{_where(op)}: the step returns a value holding the batch "
                               f"merged with another dim (dims {list(dims)} of "
                               f"{list(prog.values[v].shape)}), which micro-batches cannot "
                               f"put back together", user_line(op.source_info))
        split = self._split(loop)
        in_loop = {v for o in loop for op in (prog.ops[o], *prog.ops[slice(
            *prog.ops[o].body_ops)]) for v in (*op.operands, *op.results, *op.body)}
        dims = {v: d for v, d in self.bdims.items() if v in in_loop or v in set(prog.inputs)}
        return MicroBatching(cls.name, cls.size, split=split, pre_ops=tuple(pre),
                             loop_ops=tuple(sorted(loop)), post_ops=tuple(post),
                             accumulated=tuple(dict.fromkeys(accumulated)),
                             stacked=tuple(dict.fromkeys(stacked)), batch_dims=dims)

    def _split(self, loop) -> tuple[tuple[int, int], ...]:
        """(value, dim) of each input and constant the loop reads per example: cut along the
        dim that holds the whole batch."""
        prog, out = self.prog, []
        read = {v for o in loop for v in prog.ops[o].operands}
        for v in prog.values:
            if v.origin not in (INPUT, CONST) or v.id not in read or self.kind[v.id] != EXAMPLE:
                continue
            dims = self.bdims[v.id]
            whole = [d for d in dims if self.an.value_classes[v.id][d] == self.b]
            if len(dims) != 1 or len(whole) != 1:
                what = f"argument {v.name}" if v.name else "a constant"
                raise _Refused(f"{what} holds the batch merged with another dim (dims "
                               f"{list(dims)} of {list(v.shape)}): cut it into examples first",
                               v.name or "")
            out.append((v.id, whole[0]))
        return tuple(out)


def _where(op) -> str:
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
        return not (src.kind in "fc" and dst.kind not in "fc")
    if name in _LINEAR_UNARY:
        return sums[0] and not any(sums[1:])
    if name in ("mul", "dot_general"):
        return sum(sums) == 1
    if name == "div":
        return sums[0] and not sums[1]
    return False

