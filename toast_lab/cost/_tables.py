"""The tables the compiled kernel reads, by name: numpy structured arrays (one record per row,
its fields below) gathered in named tuples.

- `TypeTables`: the program compressed into types (built by _types.py): value types, contraction
  groups, operand rows, operands, op types and shared reads. A type's list of members (an op's
  operands, a group's dims) is a contiguous run `[start, end)` of a member table.
- `MemoryTables`: temporaries with their live ranges, arguments and outputs (liveness sweep).
- `ScheduleTables`: program order, for overlapping collectives with compute.
- `MESH`: one record per mesh-axis mask; `DEVICE`: the device, one record.
- `PlanArrays` (_plan_arrays.py): the plan.

Python passes each named tuple to the kernel as a plain tuple, which numba's dispatcher types
in C, and the kernel wraps it again (`TypeTables(*tables)`): names in the code, and half the
per-call cost of passing named tuples.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

_I, _F = np.int64, np.float64


def record(**fields) -> np.dtype:
    """The dtype of one table row, fields in the order given (aligned: numba loads each field
    with one instruction)."""
    return np.dtype(list(fields.items()), align=True)


# Contraction groups: the operand dims a factor ties together; their consensus (the axes they
# all share) is what the op computes on. Members are (value type, dim) pairs.
GROUP = record(start=_I, end=_I, is_reduction=np.bool_)
GROUP_MEMBER = record(value_type=_I, dim=_I)
# Operand rows: one (operand value type, dim) an op wants sharded like a result dim (`source`),
# like its group's consensus (`group`), or whole (ROW_REPLICATE); a ROW_FROM_WHOLE row is of a
# dim the operand holds whole, wanted like `source` (_operand_rows.py); `compound`: on a
# compound dim, the size of its major part (Static.rows.compound; the kernel's _compound_split);
# `src_compound`: the same for a source dim that merges the operand's dims (+ on the major
# part's row, - on the minor part's: Static.rows.src_compound).
ROW = record(value_type=_I, dim=_I, kind=_I, source_type=_I, source_dim=_I, group=_I,
             compound=_I, src_compound=_I)
# Operands: a value type and its rows (indices into the row table, in operand_rows[start:end]);
# uniform: a constant of one number throughout (a broadcast literal, optax.set_to_zero's update
# of a frozen parameter), whose all-gather XLA compiles to nothing, though it moves it by
# all-to-all like any value (jax 0.10.2; a broadcast of a scalar argument, a constant of
# several numbers and a broadcast constant row are gathered); sliced_first: a reduction's read
# that plan.jit pins sliced like the result (Static.operands.sliced_first).
OPERAND = record(value_type=_I, start=_I, end=_I, uniform=np.bool_, sliced_first=np.bool_)
# Op types: weight = instances x trip count (time); count = instances; peak = FLOP/s of its
# dtype; result_type -1 when no result has dims; groups, io and operands are member runs;
# matmul_k > 0 for matmuls and convolutions: their contraction length, and dims (a run of
# op_dims) says what each result dim is to the matmul unit; kernel: _fusion.KERNEL_* (a fused
# attention's matmul, or an op inside such a kernel), flop_scale the share of flops it runs;
# sum_leader: the op type that reduces this one's partial sums with its own (-1: none);
# workspace: bytes the compiler allocates inside the op, sharded like workspace_type;
# a combining scatter's indices and updates (whole-tensor bytes and value types; bytes 0
# for other ops) and its operand's pass-through dims (bit d: dim d of the result type); an
# explicitly batched gather's operand or scatter's result (batch: bytes, value type, batching
# dims and dims indexed one row at a time) and its indices (value type, batching dims, bytes;
# 0: none);
# gathered_partials: whole-tensor bytes of the partial results a variadic reduce (an argmax)
# all-gathers where its reduced dims are sharded, instead of all-reducing (0: other ops).
# copies: the copies XLA compiles of each instance (an unrolled scan body's, _unroll.py).
# launches: the kernels each instance launches (1 where it writes a result, _fusion.launches).
# gather, gather_indices: a gather's operand and indices types + 1 (0: not a gather).
# A convolution whose windowed dims its result may shard (halos[halo_start:halo_end], HALO
# records in the order of the input's dims; an empty run for other ops) exchanges halos of its
# input: halo_nbytes its input's whole-tensor bytes, halo_batch its result's batch dim, which
# shards the rows it sends (_kernel._halo_exchange).
OP = record(weight=_F, count=_F, flops=_F, peak=_F, result_type=_I, result_nbytes=_F,
            groups_start=_I, groups_end=_I, io_start=_I, io_end=_I, operands_start=_I,
            operands_end=_I, matmul_k=_F, dims_start=_I, dims_end=_I, kernel=_I,
            flop_scale=_F, sum_leader=_I, workspace=_F, workspace_type=_I,
            scatter_indices=_F, scatter_indices_type=_I, scatter_updates=_F,
            scatter_updates_type=_I, scatter_window=_I,
            batch_nbytes=_F, batch_type=_I, batch_dims=_I, batch_indexed=_I,
            batch_indices_type=_I, batch_index_dims=_I, batch_indices_nbytes=_F,
            gathered_partials=_F, copies=_F,
            launches=_F, halo_start=_I, halo_end=_I, halo_nbytes=_F, halo_batch=_I, gather=_I,
            gather_indices=_I)
# One windowed dim of a convolution (OP.halo_start): its result dim, the input's size and the
# result's on it, and the window: size, stride, dilation of the window (rhs) and of the input
# (lhs, a transposed convolution's), low padding.
HALO = record(result_dim=_I, in_size=_I, out_size=_I, window=_I, stride=_I,
              window_dilation=_I, base_dilation=_I, padding_low=_I)
# A matmul's result dim: its index, its role (_op_facts.DIM_BATCH / DIM_M / DIM_N), its size.
OP_DIM = record(dim=_I, role=_I, size=_F)
# What an op moves between HBM and its kernel (_fusion.memory_traffic), by value type.
OP_IO = record(value_type=_I, nbytes=_F)
# An op's operands that are not shared reads: operand type, whole-tensor bytes, whether
# the value is known before any compute (a parameter: its gather can be prefetched), and
# whether it is the updates of a combining scatter into a broadcast (_kernel, updates-sharded
# scatters).
OP_OPERAND = record(operand_type=_I, nbytes=_F, early=np.bool_, scatter_updates=np.bool_)
# Values read by several ops of one CSE group: XLA gathers such a value once per sharding and
# reuses the buffer, so each read is costed per instance, in program order, deduplicated. A
# read of a relayout of the value counts as a read of the value (_shared_reads.gather_sources);
# `pinned` is what it counts as a read of in a plan with per-domain overrides, where plan.jit
# pins the values on domain boundaries (a pinned relayout is gathered itself, apart).
# memory_position: the reading op's place in the order the compiler runs them (_order.py),
# ready: where in that order the compiler reshards the value (at the read, or as soon as
# the value is made where it runs each op as soon as it can). copy_of: where the read is of a
# relayout the compiler writes out from the gathered value (a `rev`:
# _shared_reads.materialised), that relayout's value (-1: none): one more gathered-size
# buffer, from `ready` to the read.
# Where its buffer starts and ends in the memory sweep: ready_at and ready_weight for a buffer
# starting at `ready`, end_at and end_weight for one ending after the read (memory_position
# + 1), ready_end_at and ready_end_weight for one ending after `ready` (the weights count
# buffers as TEMP's do: 1 where every position is its own; where a record stands for a value
# of every repeated layer, _repeats.py, `trip` counts all of them and the positions are
# compressed ones).
SPAN = record(start=_I, end=_I)
SHARED_READ = record(operand_type=_I, op_type=_I, position=_I, trip=_F, nbytes=_F,
                     early=np.bool_, pinned=_I, memory_position=_I, ready=_I, copy_of=_I,
                     ready_at=_I, ready_weight=_F, end_at=_I, end_weight=_F,
                     ready_end_at=_I, ready_end_weight=_F)
# An op's operand that is not a shared read, where the compiler reshards it as soon as the
# value is made: the op's position, the reshard's, and the operand (an index into op_operands).
OPERAND_READ = record(position=_I, ready=_I, member=_I)
# A collective a shard_map body runs whatever the plan (_manual.py): the op type it runs in,
# its kind, mesh-axis mask, how many per step, and the bytes and seconds of one.
FIXED = record(op_type=_I, kind=_I, mask=_I, count=_F, nbytes=_F, seconds=_F, scale_type=_I)


class Fanout(NamedTuple):
    """Per source i, its targets: items[start[i]:start[i + 1]] (start has one more entry than
    there are sources)."""

    start: np.ndarray
    items: np.ndarray


class ChangeMaps(NamedTuple):
    """What an edit of a plan reaches (built by _change_maps.py, followed by _kernel/_dirty.py):
    per source, the targets whose costs read it."""

    class_types: Fanout     # [S] split class -> value types whose masks read its mask or rank
    conflict_types: Fanout  # [C] conflict -> value types whose masks read its resolution
    type_groups: Fanout     # [T] -> contraction groups with a member of the type
    type_rows: Fanout       # [T] -> operand rows of the type, or wanted like one of its dims
    group_rows: Fanout      # [G] -> operand rows wanted like the group's consensus
    type_operands: Fanout   # [T] -> operands of the type or with one of its type_rows
    group_operands: Fanout  # [G] -> operands with one of its group_rows
    type_ops: Fanout        # [T] -> op types whose result axes or costs read its masks, or
                            #   reading one of its type_operands
    group_ops: Fanout       # [G] -> op types reducing over the group, or reading one of its
                            #   group_operands
    sum_followers: Fanout   # [P] -> op types whose partial sums the op type reduces
    batched: np.ndarray     # op types recosted at every edit


class TypeTables(NamedTuple):
    """What the kernel needs of a program's types (shapes: T value types, D dims, K conflict
    sides, R resolutions, C conflicts)."""

    value_classes: np.ndarray   # [T, D] class of each dim (-1: none)
    value_tags: np.ndarray      # [T, D] conflict-side tag of each dim (-1: none)
    held_type: np.ndarray       # [T] the type whose masks size its values' buffers (itself
                                #   but where Static.passes.held_like says otherwise)
    tag_conflict: np.ndarray    # [K] the conflict of each tag
    tag_dropped: np.ndarray     # [K, R] bool: the tag's dim is replicated under resolution r
    conflict_class: np.ndarray  # [C] the class of each conflict
    groups: np.ndarray          # GROUP records
    group_members: np.ndarray   # GROUP_MEMBER records
    rows: np.ndarray            # ROW records
    operands: np.ndarray        # OPERAND records
    operand_rows: np.ndarray    # int64 indices into rows
    ops: np.ndarray             # OP records
    op_groups: np.ndarray       # int64: the reduction groups of each op (indices into groups)
    op_io: np.ndarray           # OP_IO records
    op_operands: np.ndarray     # OP_OPERAND records
    op_dims: np.ndarray         # OP_DIM records
    shared_values: np.ndarray   # SPAN records: the reads of each shared value
    shared_reads: np.ndarray    # SHARED_READ records
    split_base: np.ndarray      # [S] the class of each split class (_plan_arrays.py)
    halos: np.ndarray           # HALO records: convolutions' windowed dims (OP.halo_start)
    # SPAN records per op type into op_depends_on: the value types whose masks its costs read
    # beyond its operands' (its result, what it moves, its workspace, a scatter's or gather's
    # indices and updates): an incremental evaluation recosts the op when one changes
    op_depends: np.ndarray
    op_depends_on: np.ndarray
    changes: ChangeMaps         # what an edit reaches (incremental evaluations)
    num_ops: int
    # the collectives shard_map bodies run whatever the plan (FIXED records, by op type), and
    # each op type's run of them (SPAN records [P]; none where the program has no shard_map)
    fixed: np.ndarray = np.zeros(0, FIXED)
    fixed_by_op: np.ndarray = np.zeros(0, SPAN)


# One record per mesh-axis mask: its devices, and what a collective over its axes costs
# (_collectives.py): seconds per byte of the whole buffer of an all-gather or reduce-scatter,
# their latency (s), seconds per byte of a device's shard in an all-to-all, and seconds per
# byte and latency of a collective-permute (one hop over the slowest link it may cross).
MESH = record(ways=_F, gather_beta=_F, gather_alpha=_F, a2a_beta=_F, permute_beta=_F,
              permute_alpha=_F)
# The device, one record: its Efficiency (plan/_hardware.py), HBM bandwidth (B/s), and
# whether its compiler emits real reduce-scatters (XLA:CPU all-reduces the whole buffer and
# slices it: ReduceScatterDecomposer).
DEVICE = record(matmul=_F, tile_m=_F, tile_n=_F, tile_k=_F, units=_F, attention=_F,
                memory_bandwidth=_F, reduce_scatter=np.bool_, launch_s=_F)
# Temporaries: live over positions [start, end) of the sweep's order, written only from
# min_nbytes per device on (0: always; a value a library fusion reads from memory once it is
# large enough, see _cpu_fusion.library_inputs); start_weight and end_weight: how many temporaries
# start and end there, counted (1 each where every position is its own; where repeated blocks
# are compressed, _repeats.py, a record stands for several temporaries of one shape and a
# later copy's start or end is not counted).
TEMP = record(start=_I, end=_I, nbytes=_F, value_type=_I, min_nbytes=_F, start_weight=_F,
              end_weight=_F)
# A temporary some of whose readers may take a local slice of it (TEMP_SLICES, one per
# temporary, in the order of MemoryTables.temps): where its last reader that reads it whole
# runs (+1), and its reads by ops XLA:CPU does not fuse a slice into (reads[start:end] of
# MemoryTables.slice_reads: each the reader's position and the operand type it reads).
TEMP_SLICES = record(whole_end=_I, start=_I, end=_I)
SLICE_READ = record(position=_I, operand_type=_I)
# `count` arguments of one size and value type.
INPUT = record(nbytes=_F, value_type=_I, is_state=np.bool_, count=_F)
# `count` outputs of one size and value type, and the position of the op that writes them (0:
# an argument returned as it is): written there by `position_weight` of them (counted, as
# TEMP's weights), free from the start until then for `zero_weight`; alias_type: the value type
# of the donated argument XLA may write them into (same shape and dtype; -1: none): the buffer
# is shared when both are sharded alike.
OUTPUT = record(nbytes=_F, value_type=_I, position=_I, count=_F, position_weight=_F,
                zero_weight=_F, alias_type=_I)
# A repeated block of the compressed positions (_repeats.py): its first position, its length,
# and how many copies of it the step runs in a row.
RUN = record(start=_I, length=_I, copies=_I)


class ScheduleTables(NamedTuple):
    """Program order, for the overlap of collectives with compute (see _kernel.schedule)."""

    op_type: np.ndarray         # [N] the type of each op
    ready: np.ndarray           # [N] the latest op making a non-early operand (-1: none)
    # [N] the same in a loop body's first walk (a run of repeated blocks' first copy reads
    # what came before the run, the others the copy before theirs: _compress.py)
    ready_first: np.ndarray
    deadline: np.ndarray        # [N] the first op reading a result (N: an output, none)
    body_first: np.ndarray      # [N] bool: the first op of a top-level loop body
    body_last_trip: np.ndarray  # [N] the loop's trip count at the last op of its body
    nested: np.ndarray          # [N] its runs per trip of its top-level loop (1: once)
    event: np.ndarray           # [N] bool: a loop's first or last op, or a shared read's op
    # [N] bool, at a loop body's last op: the body is a run of repeated blocks (_repeats.py),
    # whose last copy's results later ops read (_kernel/_schedule.py)
    body_is_run: np.ndarray
    # the shared reads the walk meets, by position: each one's SHARED_READ record (whose
    # seconds it waits for) and its position
    read_slot: np.ndarray
    read_at: np.ndarray


class MemoryTables(NamedTuple):
    op_type: np.ndarray         # [N] the type of the op at each position
    temps: np.ndarray           # TEMP records: values neither argument nor output, not fused
    temps_by_type: np.ndarray   # SPAN records per value type, into temps_of_type
    temps_of_type: np.ndarray   # int64 indices into temps, grouped by value type
    inputs: np.ndarray          # INPUT records
    outputs: np.ndarray         # OUTPUT records (an output returned twice counts twice)
    num_outputs: int            # outputs of the step (a tuple of pointers where several)
    instances_by_type: np.ndarray  # SPAN records per op type, into instances
    instances: np.ndarray       # int64 op positions, grouped by op type
    deadline: np.ndarray        # [N] the first op reading each op's result (N: none)
    combine_all_reduces: bool   # the compiler combines every all-reduce into one (XLA:CPU)
    # Where the compiler runs each op (the sweep's order, see _order.py): op_type above and
    # temps, outputs and shared reads are in these positions; instances and deadline are in
    # program order.
    position: np.ndarray        # [N] each op's position
    result_end: np.ndarray      # [N] where each op's first result stops being live
    operand_reads: np.ndarray   # OPERAND_READ records (none where reshards run at their op)
    # [N] (program order) the computation each op runs in: 0 the step's own, k > 0 the body of
    # the k-th region (a compiler combines collectives within one computation); how many
    computation: np.ndarray
    num_computations: int
    # [N] (program order) the copies of each op one execution of its computation holds (an
    # unrolled scan body's iterations, _unroll.py): each holds partial sums of its own
    iteration_copies: np.ndarray
    # (program order) the ops reading each op's results: readers[reader_start[n]:
    # reader_start[n + 1]], so that the kernel can tell which all-reduces feed others
    reader_start: np.ndarray
    readers: np.ndarray
    # [N] (program order) the position of the last op reading each op's result where every
    # reader can fuse a slice of it, -1 elsewhere: how long the whole buffer of an all-reduce
    # XLA:CPU slices for a reduce-scatter stays live
    sliced_read: np.ndarray
    # TEMP_SLICES records (one per temporary; all runs empty where the compiler does not run
    # each op as soon as it can) and SLICE_READ records: see _kernel.early_slices
    temp_slices: np.ndarray
    slice_reads: np.ndarray
    # [T] mesh axes each value type's buffers are divided over whatever the plan: a shard_map's
    # results, written as their out_specs shards (0 elsewhere)
    fixed_held: np.ndarray
    # RUN records over the positions (none where every position is its own: _repeats.py)
    runs: np.ndarray
