"""The cases of XLA's SPMD partitioner the cost model prices, as a table of named patterns.

A plan says where every value lives; the partitioner decides how each op gets its operands
there and what it does with partial results. Where it has a choice, or a trick, the model
follows the case XLA takes, and each case is a pattern here: a code (what a ledger row
records, so every charge says which case made it), a name, the XLA function it models
(xla/service/spmd/, as of the jaxlib the tests run: jax 0.10.2), and the test that checks it
against what XLA compiles on a minimal reproducer on 8 simulated CPU devices.

The kernel code of each pattern lives with its phase: the operand reshards in _reshard.py
(and their classification in _operands.py), a scatter's methods in _scatter.py, re-tiled
explicitly batched indexing in _indexing.py, halo exchanges in _halo.py, and the reductions
of partial sums in _reductions.py.
"""

from __future__ import annotations

from typing import NamedTuple

# --- codes (the ledger's `pattern` column) --------------------------------------------------
PARTIAL_SUMS = 0          # a sharded contraction's reduce-scatter and all-reduce
GATHER = 1                # axes an operand has and its op does not want: all-gathered
ALL_TO_ALL = 2            # axes that move from one dim to another
HANDED_DIM = 3            # a dim whose axes all leave for axes the operand lacks
COMPATIBLE_GATHER = 4     # axes move between dims, every dim's tiles divide
COMPATIBLE_SLICE = 5      # axes move between dims, every dim's tiles multiply
FULL_REMAT = 6            # an axis leaving a dim with one moving: gathered whole, sliced
SPLIT_FINER = 7           # every dim split finer: a local slice and a permute
AXIS_ORDER = 8            # a dim's axes arrive in another order than the plan's
GATHER_MAJOR_AXIS = 9     # gathering a dim's major axis that keeps a minor one
REPLICATED_COPY = 10      # a shared read sliced from a copy the step gathered whole
UPDATES_KEEP_SHARDING = 11  # a scatter whose updates outweigh its result moves the result
OPERAND_PASSTHROUGH = 12  # a scatter partitioned along its operand's pass-through dims
REGROUPED_INDICES = 13    # its indices regrouped and each device group partitioned again
BATCHED_RETILE = 14       # an explicitly batched gather/scatter re-tiled like its indices
HALO_EXCHANGE = 15        # a convolution's windowed dims exchange halos
ROW_GATHER = 16           # a gather of rows sliced over the axes its result's features hold
DOT_SLICED_RESULT = 17    # a matmul all-reducing a slice of its result and moving it
VARIADIC_REDUCE = 18      # an argmax's partial results all-gathered and reduced again
SHARD_MAP_BODY = 19       # a collective a shard_map body runs, whatever the plan
NUM_PATTERNS = 20


class Pattern(NamedTuple):
    code: int
    name: str
    xla: str      # the partitioner function (or pass) it models
    summary: str  # what XLA does there, as the model prices it
    test: str     # the test that checks it against XLA: "tests/<file>.py::<test>"


PATTERNS = (
    Pattern(PARTIAL_SUMS, "partial sums", "dot_handler.cc PartitionDot; AllReduceAlongShard"
            "ingDims, ReduceScatter", "a contraction sharded on all its operands leaves "
            "partial sums: reduce-scattered over the axes its result holds, then all-reduced "
            "over the others (XLA:CPU writes the reduce-scatter as an all-reduce and a slice)",
            "tests/test_cost.py::"
            "test_xla_cpu_all_reduces_only_the_slice_its_reduce_scatter_leaves"),
    Pattern(GATHER, "all-gather", "PartitionedHlo::ReshardNoCache: Replicate / AllGatherShards",
            "axes an operand holds on a dim its op wants whole or sharded otherwise are "
            "all-gathered (after a local slice of the axes only added)",
            "tests/test_gathers.py::"
            "test_a_reshard_slices_the_axes_it_adds_before_it_moves_the_others"),
    Pattern(ALL_TO_ALL, "all-to-all", "PartitionedHlo::ReshardWithAllToAll",
            "axes that leave one dim for another move by one all-to-all of the shard (after "
            "the gathers a reshard also needs)",
            "tests/test_cost.py::test_a_merged_dims_axes_tile_its_parts_major_first"),
    Pattern(HANDED_DIM, "dim handed to other axes",
            "PartitionedHlo::ReshardWithCollectivePermute",
            "a dim whose axes all leave for axes the operand does not hold is permuted shard "
            "by shard (a local slice first where the new axes have more ways, an all-gather "
            "over part of the old ones where they have more)",
            "tests/test_cost.py::test_a_dim_handed_to_other_axes_is_permuted_not_gathered_whole"),
    Pattern(COMPATIBLE_GATHER, "compatible reshard (gather)",
            "ReshardToPartialReplicateWithAllGather (PartialReplicateReshardCompatibleSharding)",
            "axes move between dims while every dim keeps a number of tiles dividing what it "
            "has: the shard is permuted onto the compatible sharding, then all-gathered dim by "
            "dim, the last dim first",
            "tests/test_gathers.py::"
            "test_an_axis_moving_to_a_dim_with_fewer_tiles_is_permuted_then_gathered"),
    Pattern(COMPATIBLE_SLICE, "compatible reshard (slice)",
            "ReshardFromPartialReplicateWithDynamicSlice",
            "a partially replicated operand whose dims all end with a multiple of their tiles "
            "slices its new tile locally and permutes it into place",
            "tests/test_gathers.py::"
            "test_an_axis_moving_to_a_dim_with_fewer_tiles_is_permuted_then_gathered"),
    Pattern(FULL_REMAT, "involuntary full rematerialization",
            "PartitionedHlo::ReshardNoCache's fallback: Replicate, then a local slice",
            "an axis that leaves a dim together with one that moves to another dim cannot be "
            "split: the operand is all-gathered whole and the target sliced out",
            "tests/test_cost.py::"
            "test_an_axis_leaving_a_dim_with_one_that_moves_gathers_the_operand_whole"),
    Pattern(SPLIT_FINER, "split finer", "PartitionedHlo::ReshardNoCache: dynamic-slice, "
            "ReshardWithCollectivePermute", "every dim only split finer: each device's new "
            "tile lies inside an old one, sliced there and collective-permuted",
            "tests/test_cost.py::"
            "test_a_split_dim_whose_parts_only_split_finer_is_sliced_and_permuted"),
    Pattern(AXIS_ORDER, "axis order", "PartitionedHlo::ReshardWithCollectivePermute (tile "
            "assignment transposed)", "a reshard only subdivides a dim's tiles: where the "
            "plan lists a dim's axes in another order than they arrive, a permute of the shard "
            "puts the tiles in place",
            "tests/test_cost.py::test_a_split_dims_axes_tile_its_parts_and_come_back_in_order"),
    Pattern(GATHER_MAJOR_AXIS, "gather of a major axis", "AllGatherShards (device order)",
            "an all-gather concatenates tiles in device order: gathering a dim's major axis "
            "while keeping a minor one first permutes the shard into kept-first order",
            "tests/test_cost.py::test_a_dim_gathered_over_its_major_axis_is_permuted_first"),
    Pattern(REPLICATED_COPY, "replicated copy", "PartitionedHlo reshard cache: Replicate()",
            "a reshard that gathers and moves axes of a value the step already gathered whole "
            "slices that copy locally",
            "tests/test_gathers.py::"
            "test_a_table_gathered_whole_for_one_matmul_is_sliced_for_the_next"),
    Pattern(UPDATES_KEEP_SHARDING, "scatter updates keep their sharding",
            "aggressive_factor_propagation.h (Shardy: the larger tensor's factor wins)",
            "a scatter whose updates outweigh its result runs on the updates' sharding and "
            "reshards its result: an all-to-all, or a gather of the whole result",
            "tests/test_gathers.py::test_segment_sum_collectives_agree_with_xla"),
    Pattern(OPERAND_PASSTHROUGH, "scatter operand passthrough",
            "gather_scatter_handler.cc: PartitionScatterOperandPassthroughDimensions, chosen by "
            "ScatterPartitionMethodCostModel", "a combining scatter contested on an axis moves "
            "its updates to the operand's sharding (all-to-all) and gathers its indices, "
            "where that dry run is cheaper than index passthrough's partial sums",
            "tests/test_gathers.py::"
            "test_an_fsdp_embedding_gradient_is_partitioned_the_way_xla_picks"),
    Pattern(REGROUPED_INDICES, "regrouped indices",
            "gather_scatter_handler.cc: GroupShardingOnReplicatedDim",
            "after operand passthrough the indices are regrouped over the replicated axes (a "
            "permute, and a gather where it borrows their ways) and each group's scatter "
            "partitioned again: its table's rows split, or all-reduced",
            "tests/test_gathers.py::"
            "test_a_table_gradient_after_operand_passthrough_is_partitioned_as_xla_regroups_it"),
    Pattern(BATCHED_RETILE, "re-tiled batched indexing",
            "gather_scatter_handler.cc: GatherScatterOperandsShardedAcrossParallelDims",
            "an explicitly batched gather or scatter whose indexed dim is sharded like its "
            "indices frees those axes from the indices: the operand is re-tiled by all-to-all "
            "and the indices, updates and picks permuted",
            "tests/test_indexing_reshards.py::"
            "test_xla_moves_what_the_take_along_axis_rule_charges"),
    Pattern(HALO_EXCHANGE, "halo exchange", "PartitionedHlo::ReshardAsWindowedInput, "
            "ExchangeHalo", "a convolution whose result shards a windowed dim exchanges the "
            "rows each shard's windows need with its neighbours: a permute per side and hop",
            "tests/test_cost_halo.py::"
            "test_a_convolution_sharded_on_its_rows_exchanges_halos_as_xla_does"),
    Pattern(ROW_GATHER, "row gather slice-and-move",
            "gather_scatter_handler.cc: PartitionGatherTrivialSlicedOperandDimensions",
            "a gather of rows sliced over axes its result's features hold all-reduces a slice "
            "of the masked result and permutes the tile into place (no reduce-scatter)",
            "tests/test_gathers.py::"
            "test_a_row_gather_reduces_a_slice_and_moves_the_tile_as_xla_does"),
    Pattern(DOT_SLICED_RESULT, "matmul sliced result", "dot_handler.cc: PartitionDot (result "
            "sliced over free axes)", "a matmul whose partial sums go to its result's axes, "
            "with replicated axes of a multiple of their ways, computes its result sliced over "
            "those, all-reduces the slice and permutes it into place",
            "tests/test_cost.py::"
            "test_a_matmul_reduced_onto_its_result_axes_all_reduces_a_shard_and_permutes_it"),
    Pattern(VARIADIC_REDUCE, "variadic reduce", "spmd_partitioner.cc HandleReduce (tuple "
            "reduce)", "an argmax sharded on its reduced dims all-gathers each shard's "
            "partial results and reduces them again",
            "tests/test_cost.py::"
            "test_an_argmax_over_a_sharded_dim_all_gathers_its_partial_results"),
    Pattern(SHARD_MAP_BODY, "shard_map body", "(none: the user's own collectives)",
            "a psum, all_gather, psum_scatter, all_to_all or ppermute a shard_map body runs "
            "lowers to one collective on the shapes it sees, whatever the plan, inside the op",
            "tests/test_cost_manual.py::test_a_ring_attention_kernel_pays_its_permutes_every_step"),
)
assert [p.code for p in PATTERNS] == list(range(NUM_PATTERNS))
PATTERN_NAMES = tuple(p.name for p in PATTERNS)
