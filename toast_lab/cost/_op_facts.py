"""What each op of the program is, whatever the plan: its trip count and the copies XLA
compiles of it, its result, its matmul shape, the workspace XLA:CPU allocates inside it, and
the geometry the SPMD partitioner's handlers read (a combining scatter's pass-through dims, an
explicitly batched gather's or scatter's batching dims, a gather's operand and indices, a
convolution's halo, a variadic reduce's gathered partial results).

Built from the program's ops and shapes, once per analysis (_static.py); the types (_types.py)
key ops by these facts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..analysis import crossing_reads
from ._flops import random_bits_width
from ._unroll import unrolled_copies

# What a result dim of a matmul is to the hardware: a batch of independent matmuls, the rows
# (M, from the lhs) or the columns (N, from the rhs) of one.
DIM_BATCH, DIM_M, DIM_N = 0, 1, 2

_NUMERIC_KINDS = ("f", "i", "u", "c", "b")


@dataclass(frozen=True, eq=False)
class OpFacts:
    """Per op ([N], program order) of the program; values are whole tensors."""

    trip: np.ndarray            # [N] float64: the times one step runs it (a scan body's: length)
    # [N] copies of the op XLA compiles (an unrolled scan body's: _unroll.py), and the copies
    # one execution of the computation it runs in holds; [N] that computation's region op
    # (NO_OP: the step's own), past fully unrolled scans
    copies: np.ndarray
    iteration_copies: np.ndarray
    computation: np.ndarray
    result: np.ndarray          # [N] int32: first result with dims, else a lone scalar
    #                             result (-1: none)
    is_region: np.ndarray       # [N] bool
    matmul: tuple               # per op: None, or (K, ((result dim, DIM_*, size), ...))
    workspace: np.ndarray       # [N] bytes XLA:CPU allocates inside the op (whole tensors)
    workspace_value: np.ndarray  # [N] the value whose sharding divides that workspace
    scatter_indices: np.ndarray  # [N] a combining scatter's indices value (-1: not one)
    scatter_updates: np.ndarray  # [N] its updates value (-1: not one)
    scatter_window: np.ndarray   # [N] bit d set: operand dim d is a whole window dim
    batch_value: np.ndarray      # [N] an explicitly batched gather's operand or scatter's
    #                              result (-1: none; _batched_indexing)
    batch_dims: np.ndarray       # [N] bits: its batching dims
    batch_indexed: np.ndarray    # [N] bits: its dims indexed one row at a time
    batch_indices: np.ndarray    # [N] the indices value (-1: none)
    batch_index_dims: np.ndarray  # [N] bits: the indices' batching dims
    replicated_on_cpu: np.ndarray  # [N] bool: XLA:CPU computes the op whole (_CPU_WHOLE)
    gathered_partials: np.ndarray  # [N] bytes of the partial results a variadic reduce
    #                                all-gathers, whole-tensor (0: none; _gathered_partials)
    gather: np.ndarray           # [N, 2] a gather's operand and indices values (-1: not a
    #                              gather): its partial sums come from rows sliced over the
    #                              operand's indexed dims
    # per op: None, or a convolution's halo geometry (_halos): (its input's whole-tensor
    # bytes, its result's batch dim, ((result dim, input size, result size, window, stride,
    # window dilation, input dilation, low padding), ...) per windowed dim in the input's dim
    # order)
    halo: tuple


def op_facts(an, folded: np.ndarray) -> OpFacts:
    """The OpFacts of analysis `an`; `folded`: [V] bool, the values XLA folds from constants
    (_folding.py)."""
    prog = an.program
    values, ops = prog.values, prog.ops
    copies, iteration_copies, computation = unrolled_copies(prog)
    workspace, workspace_value = _workspace(prog)
    scatter_indices, scatter_updates, scatter_window = _scatters(prog)
    batch_value, batch_dims, batch_indexed, batch_indices, batch_index_dims = \
        _batched_indexing(prog, crossing_reads(an))
    return OpFacts(
        trip=np.array([op.trip_count for op in ops], np.float64), copies=copies,
        iteration_copies=iteration_copies, computation=computation,
        result=_op_results(prog, folded), is_region=np.array([bool(op.body) for op in ops], bool),
        matmul=tuple(_matmul_shape(op, values) for op in ops),
        workspace=workspace, workspace_value=workspace_value, scatter_indices=scatter_indices,
        scatter_updates=scatter_updates, scatter_window=scatter_window,
        batch_value=batch_value, batch_dims=batch_dims, batch_indexed=batch_indexed,
        batch_indices=batch_indices, batch_index_dims=batch_index_dims,
        replicated_on_cpu=np.array([op.primitive in _CPU_WHOLE for op in ops], bool),
        gathered_partials=np.array([_gathered_partials(op, values) for op in ops], np.float64),
        gather=np.array([op.operands[:2] if op.primitive == "gather" else (-1, -1)
                         for op in ops], np.int64).reshape(-1, 2),
        halo=_halos(prog))


def _op_results(prog, folded: np.ndarray) -> np.ndarray:
    """OpFacts.result: each op's first result with dims, else its lone numeric scalar result
    (a loss summed over a sharded batch: its all-reduce moves its bytes), -1 for none."""
    values = prog.values
    out = np.full(len(prog.ops), -1, np.int32)
    for op in prog.ops:
        with_dims = [r for r in op.results if values[r].ndim]
        if with_dims:
            out[op.id] = with_dims[0]
        elif len(op.results) == 1 and getattr(values[op.results[0]].dtype, "kind", None) \
                in _NUMERIC_KINDS and not folded[op.results[0]]:
            # not a PRNG key's, whose extended dtype has no kind; not one of constants alone,
            # such as a product of shape entries, which XLA folds before partitioning
            out[op.id] = op.results[0]
    return out


# Ops XLA:CPU lowers to a custom call (top_k: the TopK custom call), which the SPMD partitioner
# cannot split: it all-gathers the operand and computes the op whole on every device.
_CPU_WHOLE = frozenset({"top_k"})
# random_bits lowers to jax's threefry2x32, whose rounds XLA:CPU runs in a while loop whose
# state holds the two counter words and a key word per element: 12 bytes of workspace per
# element of 32- or 64-bit bits, 16 for 8- or 16-bit ones (a u32 word narrowed after the
# loop): the memory_analysis() temp of jax.random.bits jitted alone, whose bits are its
# output (jax 0.10.2; tests/test_cost.py).
_THREEFRY_WORKSPACE = {8: 16.0, 16: 16.0, 32: 12.0, 64: 12.0}


def _gathered_partials(op, values) -> float:
    """Bytes of a variadic reduce's partial results, whole-tensor (0 for other ops).

    XLA's all-reduce takes one array and one combiner, so a reduce of several arrays at once
    (argmax and argmin lower to one of the value and its index; lax.reduce of a tuple) whose
    reduced dims are sharded is partitioned otherwise: each shard reduces locally keeping the
    reduced dims at size 1, the partial results are all-gathered along them, and reduced again
    (XLA's SPMD partitioner, which every backend runs; seen on XLA:CPU, jax 0.10.2: an argmax
    of f32[16, 8] over 8 devices all-gathers an f32[16, 8] and an s32[16, 8]). So the
    all-gather moves, per device, the result's elements x the devices reduced over x the bytes
    of one element of every partial result: the value (of the operand's dtype) and the index,
    for an argmax."""
    if op.body:
        return 0.0
    if op.primitive in ("argmax", "argmin"):
        r = values[op.results[0]]
        return float(r.nbytes // r.dtype.itemsize
                     * (r.dtype.itemsize + values[op.operands[0]].dtype.itemsize))
    if op.primitive == "reduce" and len(op.results) > 1:
        return float(sum(values[r].nbytes for r in op.results))
    return 0.0


def _matmul_shape(op, values):
    """(K, ((result dim, role, size), ...)) of a dot_general or convolution: the contraction
    length and what each result dim is to the matmul unit; None for other ops. A convolution
    is an implicit GEMM: batch and spatial dims are rows, output features columns, and input
    features (of one group) times the window the contraction."""
    if op.body or not op.results:
        return None
    out = values[op.results[0]].shape
    if op.primitive == "dot_general":
        (lc, _), (lb, _) = op.params["dimension_numbers"]
        lhs = values[op.operands[0]].shape
        k = float(np.prod([lhs[d] for d in lc], dtype=np.float64))
        n_lhs_free = len(lhs) - len(lc) - len(lb)
        roles = [DIM_BATCH if e < len(lb) else DIM_M if e < len(lb) + n_lhs_free else DIM_N
                 for e in range(len(out))]
        return k, tuple((e, r, out[e]) for e, r in enumerate(roles))
    if op.primitive == "conv_general_dilated":
        _, rhs_spec, out_spec = op.params["dimension_numbers"]
        rhs = values[op.operands[1]].shape
        k = float(rhs[rhs_spec[1]]) * float(np.prod([rhs[d] for d in rhs_spec[2:]]))
        return k, tuple((e, DIM_N if e == out_spec[1] else DIM_M, out[e])
                        for e in range(len(out)))
    return None


def _workspace(prog) -> tuple[np.ndarray, np.ndarray]:
    """Workspace XLA:CPU allocates inside an op. Its SelectAndScatterExpander rewrites a
    max-pool gradient (select_and_scatter_add) as: an s32 iota per operand dim, a reduce-window
    carrying the window maxima and their rank indices, their concatenation, and a scatter
    (seen in its buffer assignment: rank x operand + (2 rank + 1) x window-output 4-byte
    elements live together). random_bits holds its threefry loop's state
    (_THREEFRY_WORKSPACE), sharded like the bits."""
    values, ops = prog.values, prog.ops
    workspace = np.zeros(len(ops))
    value = np.zeros(len(ops), np.int64)
    for op in ops:
        if op.primitive == "random_bits" and op.results and not op.body:
            bits = values[op.results[0]]
            per = _THREEFRY_WORKSPACE.get(random_bits_width(op), 12.0)
            workspace[op.id] = per * float(np.prod(bits.shape, dtype=np.float64))
            value[op.id] = op.results[0]
        elif op.primitive == "select_and_scatter_add" and len(op.operands) >= 2:
            source, operand = op.operands[0], op.operands[1]
            rank = values[operand].ndim
            numel = lambda v: float(np.prod(values[v].shape))  # noqa: E731
            workspace[op.id] = 4.0 * (rank * numel(operand) + (2 * rank + 1) * numel(source))
            value[op.id] = operand
    return workspace, value


def select_and_scatter_pieces(prog) -> list:
    """The buffers of XLA's SelectAndScatterExpander, per max-pool gradient (the same bytes
    as _workspace's, apart): (op, kind, value whose sharding divides it, whole-tensor bytes).
    kind "iota": an s32 iota per operand dim, made from nothing; "window": the reduce-window
    of the operand carrying the window maxima and their indices (1 + rank window outputs);
    "indices": their concatenation, which the scatter reads. The scatter itself writes into a
    broadcast of zeros shaped like its result."""
    values, pieces = prog.values, []
    for op in prog.ops:
        if op.primitive != "select_and_scatter_add" or len(op.operands) < 2:
            continue
        source, operand = op.operands[0], op.operands[1]
        rank = values[operand].ndim
        numel = lambda v: float(np.prod(values[v].shape))  # noqa: E731
        pieces.append((op.id, "iota", operand, 4.0 * rank * numel(operand)))
        pieces.append((op.id, "window", source, 4.0 * (rank + 1) * numel(source)))
        pieces.append((op.id, "indices", source, 4.0 * rank * numel(source)))
    return pieces


# The combining scatters, whose partitioning XLA chooses by a cost of its own (_kernel).
_COMBINING_SCATTERS = frozenset({"scatter-add", "scatter-sub", "scatter-mul", "scatter-min",
                                 "scatter-max"})


def _scatters(prog) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The indices and updates of each combining scatter (operands 1 and 2), -1 elsewhere,
    and its operand's pass-through dims: window dims the updates cover whole and that are
    not indexed (XLA's "operand passthrough" dims)."""
    values = prog.values
    indices = np.full(len(prog.ops), -1, np.int64)
    updates = np.full(len(prog.ops), -1, np.int64)
    window = np.zeros(len(prog.ops), np.int64)
    for op in prog.ops:
        if op.primitive not in _COMBINING_SCATTERS or op.body or len(op.operands) != 3:
            continue
        dn = op.params["dimension_numbers"]
        x, u = values[op.operands[0]].shape, values[op.operands[2]].shape
        skip = set(dn.inserted_window_dims) | set(getattr(dn, "operand_batching_dims", ()))
        dims = [d for d in range(len(x)) if d not in skip]
        for d, ud in zip(dims, dn.update_window_dims):
            if u[ud] == x[d] and d not in dn.scatter_dims_to_operand_dims:
                window[op.id] |= 1 << d
        indices[op.id], updates[op.id] = op.operands[1], op.operands[2]
    return indices, updates, window


def _batched_indexing(prog, crossing) -> tuple:
    """Gathers and combining scatters with explicit batching dims (take_along_axis, and its
    gradient; a router's top-k and its gradient): the value XLA may re-tile (the gather's
    operand, the scatter's result), its batching dims, its dims indexed one row at a time,
    and the indices with their batching dims, paired in increasing order on both sides; -1
    and zeros elsewhere. What XLA does with them is _kernel._batched_indexing.

    XLA partitions them by their explicit batch dims whatever the picks per position: that
    method and index-parallel are its preferred ones, dry-run cost (0, 0), ahead of every
    other (ScatterPartitionMethodCostModel, gather_scatter_handler.cc; the dry runs logged
    on jax 0.10.2), and the MoE's top-2 router gradient is re-tiled like a top-1 loss's.
    Not where some op reads the indices from another domain than its result's (`crossing`:
    analysis.crossing_reads): plan.jit pins that read (plan/_export.py, boundary_reads) to the
    result's sharding, which holds no axis of the indexed dim, and XLA's propagation gives the
    indices that sharding for every reader, so they arrive gathered and nothing is re-tiled
    (a descent step on logits, take_along_axis of two labels per token: the scatter-add is
    the parameter's gradient, the labels gathered at their reshape for the forward gather
    too; tests/test_indexing_reshards.py)."""
    N = len(prog.ops)
    # indices some op reads from another domain than its result's: plan.jit pins that read,
    # and XLA's propagation carries the pinned sharding back to the value for every reader
    pinned = {u for _, u in crossing}
    value = np.full(N, -1, np.int64)
    dims = np.zeros(N, np.int64)
    indexed = np.zeros(N, np.int64)
    indices = np.full(N, -1, np.int64)
    index_dims = np.zeros(N, np.int64)
    for op in prog.ops:
        if op.body:
            continue
        if op.primitive == "gather" and len(op.operands) == 2:
            dn = op.params["dimension_numbers"]
            batch = tuple(getattr(dn, "operand_batching_dims", ()))
            index_batch = tuple(getattr(dn, "start_indices_batching_dims", ()))
            rows = set(dn.collapsed_slice_dims) & set(dn.start_index_map)
            target = op.operands[0]
        elif op.primitive in _COMBINING_SCATTERS and len(op.operands) == 3:
            dn = op.params["dimension_numbers"]
            batch = tuple(getattr(dn, "operand_batching_dims", ()))
            index_batch = tuple(getattr(dn, "scatter_indices_batching_dims", ()))
            rows = set(dn.inserted_window_dims) & set(dn.scatter_dims_to_operand_dims)
            target = op.results[0]
        else:
            continue
        if not batch or not rows or op.operands[1] in pinned \
                or list(batch) != sorted(batch) or list(index_batch) != sorted(index_batch):
            continue
        value[op.id], indices[op.id] = target, op.operands[1]
        dims[op.id] = sum(1 << d for d in batch)
        indexed[op.id] = sum(1 << d for d in rows)
        index_dims[op.id] = sum(1 << k for k in index_batch)
    return value, dims, indexed, indices, index_dims


def _halos(prog) -> tuple:
    """Per op: the geometry of a convolution's windowed dims (OpFacts.halo), None for other
    ops and for grouped convolutions (feature_group_count or batch_group_count > 1, depthwise
    ones and their kernel gradients): XLA's convolution handler does not exchange halos for
    those once their features are split (PartitionConvolutionTiledOutput gives up), and it
    gathered instead on every sharding tried (3x3 convolutions of 2 and 4 groups with height,
    width, batch or features sharded: no collective-permute; jax 0.10.2). Whether and how
    much a convolution exchanges under a plan is _kernel._halo_exchange."""
    values = prog.values
    out = []
    for op in prog.ops:
        p = op.params
        if op.primitive != "conv_general_dilated" or op.body or \
                p.get("batch_group_count", 1) != 1 or p.get("feature_group_count", 1) != 1:
            out.append(None)
            continue
        lhs_spec, rhs_spec, out_spec = p["dimension_numbers"]
        lhs, rhs = values[op.operands[0]].shape, values[op.operands[1]].shape
        res = values[op.results[0]].shape
        dims = sorted(
            (ld, (od, lhs[ld], res[od], rhs[rd], p["window_strides"][j], p["rhs_dilation"][j],
                  p["lhs_dilation"][j], p["padding"][j][0]))
            for j, (ld, rd, od) in enumerate(zip(lhs_spec[2:], rhs_spec[2:], out_spec[2:])))
        out.append((float(values[op.operands[0]].nbytes), int(out_spec[0]),
                    tuple(tuple(int(x) for x in d) for _, d in dims)))
    return tuple(out)
