"""Rules for static and dynamic slicing, gather and scatter.

A dim that is only partly read or written (a slice smaller than the dim, an indexed dim) needs
replication; a dim taken whole passes through. jax 0.10 always puts gather's and scatter's index
vector in the last dim of the indices.
"""

from __future__ import annotations

from ._core import NEED_REPLICATION, REDUCTION, RuleBuilder
from ._helpers import expect, guarded, resized_dim
from ._table import register


@register("slice")
@guarded
def slice_rule(ins, outs, params):
    """A dim sliced to its full extent passes through; a sliced dim needs replication on each
    side (sizes differ, so untied)."""
    x, y = ins[0], outs[0]
    starts, limits = params["start_indices"], params["limit_indices"]
    strides = params.get("strides") or (1,) * len(x)
    expect(len(starts) == len(limits) == len(strides) == len(x) == len(y))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if starts[d] == 0 and limits[d] == n and strides[d] == 1:
            b.factor(n, operands={0: d}, results={0: d})
        else:
            resized_dim(b, n, y[d], operands=(0,), results=(0,), in_dim=d, out_dim=d)
    return b.build()


@register("dynamic_slice")
@guarded
def dynamic_slice_rule(ins, outs, params):
    """(operand, *scalar start indices) -> slice. A dim sliced to less than its size needs
    replication, one factor per side; a whole dim passes through."""
    x, y = ins[0], outs[0]
    sizes = params["slice_sizes"]
    expect(len(sizes) == len(x) == len(y))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if sizes[d] == n:
            b.factor(n, operands={0: d}, results={0: d})
        else:
            resized_dim(b, n, y[d], operands=(0,), results=(0,), in_dim=d, out_dim=d)
    return b.build()


@register("dynamic_update_slice")
@guarded
def dynamic_update_slice_rule(ins, outs, params):
    """(operand, update, *scalar start indices) -> operand's shape. Where the update covers the
    whole dim, operand, update and result pass through together; elsewhere the operand and
    result dim (same size, kept) need replication, and the update's dim separately."""
    x, u = ins[0], ins[1]
    expect(outs[0] == x and len(u) == len(x))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if u[d] == n:
            b.factor(n, operands={0: d, 1: d}, results={0: d})
        else:
            b.factor(n, NEED_REPLICATION, operands={0: d}, results={0: d})
            b.factor(u[d], NEED_REPLICATION, operands={1: d})
    return b.build()


@register("gather")
@guarded
def gather_rule(ins, outs, params):
    """(operand, indices) -> result.

    - operand batching dims <-> indices batching dims <-> their result dims: pass-through;
    - other indices batch dims <-> result batch dims: pass-through (each device gathers for
      its own indices, with the operand whole);
    - operand window dims taken whole <-> result offset dims: pass-through (indexed or not:
      the start is clamped to 0);
    - indexed dims taken one index at a time (collapsed): reduction — masked local gathers and
      an all-reduce, as Shardy and XLA do; other collapsed dims and partly-sliced window dims
      need replication on the operand. A partly-sliced result offset dim gets its own
      need-replication factor;
    - the index vector dim of the indices needs replication (usually size 1: no factor).
    """
    dn = params["dimension_numbers"]
    offset_dims = tuple(dn.offset_dims)
    collapsed = set(dn.collapsed_slice_dims)
    indexed = set(dn.start_index_map)
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    idx_batch = tuple(getattr(dn, "start_indices_batching_dims", ()))
    sizes = params["slice_sizes"]
    x, idx = ins[0], ins[1]
    y = outs[0]
    expect(len(idx) >= 1 and len(sizes) == len(x))
    result_batch = [d for d in range(len(y)) if d not in offset_dims]
    window = [d for d in range(len(x)) if d not in collapsed and d not in op_batch]
    expect(len(result_batch) == len(idx) - 1 and len(window) == len(offset_dims))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if d in op_batch:
            k = idx_batch[op_batch.index(d)]
            expect(idx[k] == n == y[result_batch[k]])
            b.factor(n, operands={0: d, 1: k}, results={0: result_batch[k]})
        elif d in collapsed and d in indexed:
            # An indexed dim read one row at a time: each device gathers the rows it holds
            # (masking the rest to zero) and an all-reduce combines them, as XLA's SPMD
            # partitioner and Shardy do; cheaper than gathering a vocabulary-sized table.
            b.factor(n, REDUCTION, operands={0: d})
        elif d in collapsed:
            b.factor(n, NEED_REPLICATION, operands={0: d})
        else:
            o = offset_dims[window.index(d)]
            expect(y[o] == sizes[d])
            # a window as large as its dim is the whole dim even where indexed: gather
            # clamps each start so that the window fits, to 0 (a vmapped dynamic_slice
            # indexes every dim)
            if sizes[d] == n:
                b.factor(n, operands={0: d}, results={0: o})
            else:
                b.factor(n, NEED_REPLICATION, operands={0: d})
                b.factor(y[o], NEED_REPLICATION, results={0: o})
    for k in range(len(idx) - 1):
        if k not in idx_batch:
            expect(idx[k] == y[result_batch[k]])
            b.factor(idx[k], operands={1: k}, results={0: result_batch[k]})
    b.factor(idx[-1], NEED_REPLICATION, operands={1: len(idx) - 1})
    return b.build()


def scatter_rule(ins, outs, params, update_kind):
    """(operand, indices, updates) -> operand's shape.

    - every operand dim is kept in the result (one factor each);
    - dims scattered into one row at a time (inserted and indexed): pass-through between
      operand and result (masked local scatters, as XLA partitions them); other inserted and
      partly covered window dims need replication on operand and result; a partly covered
      update window dim gets its own need-replication factor;
    - update window dims covering a whole operand dim pass through to operand and result;
    - operand batching dims <-> indices batching dims <-> updates: pass-through;
    - the updates' other scatter dims <-> the indices batch dims: `update_kind`. Those dims
      are not in the result. A scatter whose combiner is an all-reduce's (add, mul, min, max)
      makes them a reduction: each device applies its own updates to a full-size local
      result, every device but the first starting from the combiner's identity instead of the
      operand, and an all-reduce with the combiner merges the partial results, so
      `jnp.bincount` of a batch-sharded input costs local counts and an all-reduce of the
      bins, not an all-gather of the indices. That is XLA's
      PartitionScatterIndexPassthroughDimensions (spmd/gather_scatter_handler.cc), which takes
      the combiners MatchReductionComputation recognizes. min and max qualify like add: they
      are associative and commutative with an identity (+-inf, or the integer limits), so the
      partial results merge in any order to the same value. A subtracting scatter does not:
      its combiner, old - update, is neither, and XLA gathers the indices and updates first
      (measured on jax 0.10.2, tests/test_scatter.py: 64 KiB all-gathered where scatter-add
      all-reduces 1 KiB), as it must for an overwrite, whose partial results have no
      combiner at all. Both need replication.
    """
    dn = params["dimension_numbers"]
    window_of_updates = tuple(dn.update_window_dims)
    inserted = set(dn.inserted_window_dims)
    scattered = set(dn.scatter_dims_to_operand_dims)
    op_batch = tuple(getattr(dn, "operand_batching_dims", ()))
    idx_batch = tuple(getattr(dn, "scatter_indices_batching_dims", ()))
    expect(len(ins) == 3 and len(outs) == 1)
    x, idx, u = ins
    expect(outs[0] == x and len(idx) >= 1)
    update_scatter = [d for d in range(len(u)) if d not in window_of_updates]
    window = [d for d in range(len(x)) if d not in inserted and d not in op_batch]
    expect(len(update_scatter) == len(idx) - 1 and len(window) == len(window_of_updates))
    b = RuleBuilder(ins, outs)
    for d, n in enumerate(x):
        if d in op_batch:
            k = idx_batch[op_batch.index(d)]
            ud = update_scatter[k]
            expect(idx[k] == n == u[ud])
            b.factor(n, operands={0: d, 1: k, 2: ud}, results={0: d})
        elif d in inserted and d in scattered:
            # A row-at-a-time scattered dim: each device applies the updates that fall in its
            # own rows and drops the rest (masked local scatter), so operand and result shard
            # alike for free — the embedding gradient into a vocabulary-sharded table.
            b.factor(n, operands={0: d}, results={0: d})
        elif d in inserted:
            b.factor(n, NEED_REPLICATION, operands={0: d}, results={0: d})
        else:
            ud = window_of_updates[window.index(d)]
            if u[ud] == n and d not in scattered:
                b.factor(n, operands={0: d, 2: ud}, results={0: d})
            else:
                b.factor(n, NEED_REPLICATION, operands={0: d}, results={0: d})
                b.factor(u[ud], NEED_REPLICATION, operands={2: ud})
    for k in range(len(idx) - 1):
        if k not in idx_batch:
            ud = update_scatter[k]
            expect(u[ud] == idx[k])
            b.factor(idx[k], update_kind, operands={1: k, 2: ud})
    b.factor(idx[-1], NEED_REPLICATION, operands={1: len(idx) - 1})
    return b.build()


@register("scatter-add", "scatter-mul", "scatter-min", "scatter-max")
@guarded
def reducing_scatter_rule(ins, outs, params):
    """A scatter whose combiner is an all-reduce's: the update batch dims are a reduction."""
    return scatter_rule(ins, outs, params, REDUCTION)


@register("scatter", "scatter-sub")
@guarded
def gathering_scatter_rule(ins, outs, params):
    """An overwrite or a subtraction: XLA gathers the indices and updates first."""
    return scatter_rule(ins, outs, params, NEED_REPLICATION)
