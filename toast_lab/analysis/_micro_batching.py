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

from dataclasses import dataclass, field
from typing import Mapping

from ..program import CONST, INPUT, NO_OP, user_line
from ._batch_kinds import AFTER, EXAMPLE, INDEPENDENT, SUM, ZERO, KindWalk, Refusal, lines_of
from ._roles import find_roles


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
        walk = KindWalk(an, b)
        walk.run()
        return _partition(walk, cls)
    except Refusal as why:
        return MicroBatching(cls.name, cls.size, why.reason, why.source)


def _partition(walk, cls) -> MicroBatching:
    """The loop's ops and values, from the walk's kinds (the module docstring)."""
    prog, kind = walk.prog, walk.kind
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
            raise Refusal(f"{lines_of(op)}: {op.primitive} computes from the whole batch "
                          f"inside a loop that also runs per example",
                          user_line(op.source_info))
        if any(kind[r] in (INDEPENDENT, ZERO) and (r in outputs or any(
                u not in loop for u in prog.users(r))) for r in op.results):
            raise Refusal(f"{lines_of(op)}: {op.primitive} computes a batch-independent "
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
        dims = walk.bdims[v]
        if len(dims) != 1 or walk.an.value_classes[v][dims[0]] != walk.b:
            op = prog.ops[prog.values[v].producer]
            raise Refusal(f"{lines_of(op)}: the step returns a value holding the batch "
                          f"merged with another dim (dims {list(dims)} of "
                          f"{list(prog.values[v].shape)}), which micro-batches cannot "
                          f"put back together", user_line(op.source_info))
    split = _split(walk, loop)
    in_loop = {v for o in loop for op in (prog.ops[o], *prog.ops[slice(
        *prog.ops[o].body_ops)]) for v in (*op.operands, *op.results, *op.body)}
    dims = {v: d for v, d in walk.bdims.items() if v in in_loop or v in set(prog.inputs)}
    return MicroBatching(cls.name, cls.size, split=split, pre_ops=tuple(pre),
                         loop_ops=tuple(sorted(loop)), post_ops=tuple(post),
                         accumulated=tuple(dict.fromkeys(accumulated)),
                         stacked=tuple(dict.fromkeys(stacked)), batch_dims=dims)


def _split(walk, loop) -> tuple[tuple[int, int], ...]:
    """(value, dim) of each input and constant the loop reads per example: cut along the
    dim that holds the whole batch."""
    prog, out = walk.prog, []
    read = {v for o in loop for v in prog.ops[o].operands}
    for v in prog.values:
        if v.origin not in (INPUT, CONST) or v.id not in read or walk.kind[v.id] != EXAMPLE:
            continue
        dims = walk.bdims[v.id]
        whole = [d for d in dims if walk.an.value_classes[v.id][d] == walk.b]
        if len(dims) != 1 or len(whole) != 1:
            what = f"argument {v.name}" if v.name else "a constant"
            raise Refusal(f"{what} holds the batch merged with another dim (dims "
                          f"{list(dims)} of {list(v.shape)}): cut it into examples first",
                          v.name or "")
        out.append((v.id, whole[0]))
    return tuple(out)
