"""The memory sweep's tables (MemoryTables, _tables.py): the temporaries with their live ranges,
the arguments and outputs, and what XLA:CPU's schedule adds, in the order the compiler runs the
ops (_order.py).

The model (_kernel/_memory.py) keeps a buffer from the op that writes it to the last op that
reads it: arguments (donated training state shares its buffers with the new state), outputs
from their definition, temporaries while live (less the output space not yet written),
gathered buffers from the reshard (at the op, or as soon as the value is made) to the op, a
local slice a dot reads from when the value is made, partial sums until their all-reduce, and
compiler workspace.
"""

from __future__ import annotations

import numpy as np

from ..plan import donated_arguments
from ..program import NO_OP
from ._cpu_fusion import _YNN_MIN_ELEMENTS, library_inputs, own_fusions
from ._fusion import NOT_FUSIBLE, fused_live_ends
from ._order import ready_positions, workspace_temps
from ._xla_passes import LINEAR
from ._tables import (INPUT, OPERAND_READ, OUTPUT, RUN, SLICE_READ, SPAN, TEMP, TEMP_SLICES,
                      MemoryTables)


def memory_tables(an, st, ty, compiler, dev_ops, order, donate, is_state,
                  fixed_held, devices: int) -> MemoryTables:
    """The MemoryTables of analysis `an` (static tables `st`, types `ty`) as `compiler` runs
    it (dev_ops: _device_tables.DeviceOps; order: (position, live_start, live_end) from
    _order.memory_order); donate: the step donates its state; is_state [V]; fixed_held [T]
    (a shard_map's results' out_specs axes); devices: the mesh's. Sets the shared reads'
    memory positions (where their buffers live) in ty.tables.shared_reads."""
    prog = an.program
    position, live_start, live_end = order
    temps, temp, live_end = _temporaries(an, st, ty, compiler, dev_ops, position, live_start,
                                         live_end, devices)
    counts = np.bincount(temps["value_type"], minlength=len(ty.tables.value_classes))
    pruned = _unused_inputs(prog)
    inputs, outputs = _arguments_and_outputs(prog, st, ty, position, pruned, is_state, donate)
    operand_reads = _shared_read_positions(prog, st, ty, compiler, position)
    temp_slices = np.zeros(len(temps), TEMP_SLICES)
    temp_slices["whole_end"] = temps["end"]
    slice_reads = np.zeros(0, SLICE_READ)
    if compiler.schedules_breadth_first:
        slice_reads = _slice_reads(prog, st, ty, temp, position, live_end,
                                   temp_slices[:len(temp)])
    type_at = np.empty(st.num_ops, np.int64)  # the op type at each position
    type_at[position] = ty.op_type
    computation = _computations(st.ops.computation)
    return MemoryTables(
        op_type=type_at, temps=temps, temps_by_type=_spans(counts),
        temps_of_type=np.argsort(temps["value_type"], kind="stable").astype(np.int64),
        inputs=inputs, outputs=outputs, num_outputs=len(outputs),
        instances_by_type=_spans(np.bincount(ty.op_type, minlength=len(ty.tables.ops))),
        instances=np.argsort(ty.op_type, kind="stable").astype(np.int64),
        deadline=st.passes.deadline, combine_all_reduces=compiler.combines_all_reduces,
        position=position.astype(np.int64),
        result_end=np.where(st.ops.result >= 0, live_end[st.ops.result],
                            position + 1).astype(np.int64),
        operand_reads=operand_reads, computation=computation,
        num_computations=int(computation.max(initial=0)) + 1,
        iteration_copies=st.ops.iteration_copies, sliced_read=_sliced_reads(prog, position),
        temp_slices=temp_slices, slice_reads=slice_reads, fixed_held=fixed_held,
        runs=np.zeros(0, RUN), **_readers(prog))


def _spans(counts) -> np.ndarray:
    """SPAN records of consecutive runs of the given lengths."""
    ends = np.cumsum(counts)
    spans = np.zeros(len(counts), SPAN)
    spans["start"], spans["end"] = ends - counts, ends
    return spans


# The expensive ops whose own fusion frees what it reads once it has written them: the
# softmax's exp, read by the loss and by its gradient (a Llama step's logits are freed once
# it is written, checked against XLA:CPU in tests/test_step_cost.py). A tanh read by several
# fusions keeps its input live until its last reader, as XLA:CPU's temporaries show
# (tests/test_cost.py's layer norm and tanh layers).
FREES_INPUTS = frozenset({"exp"})


def _temporaries(an, st, ty, compiler, dev_ops, position, live_start, live_end, devices):
    """(TEMP records, the values they are (the workspace pieces after them), the live ends
    fusion gives): temporaries (not arguments, not outputs) with their live ranges. A fused
    value a library fusion reads is written once large enough (min_nbytes), and lives until
    the last library fusion reading it (loop fusions recompute it). The inputs of a fused
    value live until its last reader, which recomputes it, unless a fusion of its own writes
    it."""
    prog, fused, pieces = an.program, dev_ops.fused, dev_ops.pieces
    min_nbytes = np.where(fused, np.inf, 0.0)
    recomputed = fused.copy()  # fused values whose readers' fusions recompute them
    readers, broadcasts = {}, []
    taken_in = np.zeros(len(prog.ops), bool)
    if compiler.reduces_in_library:
        threshold, readers, broadcasts, elements = an.derived(
            "cost.library_inputs", lambda: library_inputs(prog, st.passes.fused))
        # an op a reduction's library fusion takes in is computed there, where the reduction
        # stays YNNPACK's however the plan shards it (a smaller one may run as XLA's own
        # reduce, its producer written as fusion_copies counts it: a 4,096-element layer
        # norm's square split 8 ways)
        taken_in = elements >= _YNN_MIN_ELEMENTS * devices
    if compiler.clones_fused_producers:  # an expensive op read by several fusions is written
        own = an.derived("cost.own_fusions", lambda: own_fusions(prog))
        for op in np.nonzero(own & ~taken_in)[0]:
            results = list(prog.ops[op].results)
            min_nbytes[results] = 0.0
            if prog.ops[op].primitive in FREES_INPUTS:
                recomputed[results] = False
    if compiler.reduces_in_library:
        min_nbytes = np.minimum(min_nbytes, threshold)
    temp = np.nonzero(~st.values.is_input & ~st.values.is_output & np.isfinite(min_nbytes)
                      & (st.values.nbytes > 0) & ~st.passes.outside_buffer)[0]
    temps = np.zeros(len(temp) + len(pieces) + len(broadcasts), TEMP)
    # a fused value its readers' fusions recompute keeps its inputs until the last of them;
    # an expensive one written by a fusion of its own (an exp read by several) frees them
    # once written
    live_end = fused_live_ends(prog, live_end, recomputed)
    for v, ops in readers.items():
        if fused[v]:
            live_end[v] = max(position[r] for r in ops) + 1
    k = len(temp)
    temps["start"][:k], temps["end"][:k] = live_start[temp], live_end[temp]
    temps["nbytes"][:k], temps["value_type"][:k] = st.values.nbytes[temp], ty.value_type[temp]
    temps["min_nbytes"][:k] = min_nbytes[temp]
    workspace_temps(temps[k:], pieces, prog, position, ty.value_type)
    _library_broadcasts(temps[k + len(pieces):], broadcasts, prog, st, position, ty.value_type)
    for op, *_ in pieces:  # the scatter writes into zeros made before any compute
        temps["start"][:k][temp == prog.ops[op].results[0]] = 0
    temps["start_weight"] = temps["end_weight"] = 1.0
    return temps, temp, live_end


def _library_broadcasts(temps, broadcasts, prog, st, position, value_type) -> None:
    """Fills `temps` with the broadcasts XLA:CPU's YNNPACK reductions read from memory
    (_cpu_fusion.LibraryBroadcast): a breadth-first schedule makes each as soon as its operand
    is ready, sized and sharded like the elementwise result it matches, and it lives until the
    last reduction reading it."""
    for i, b in enumerate(broadcasts):
        producer = prog.values[b.operand].producer
        temp = temps[i]  # (a record view)
        temp["start"] = position[producer] if producer != NO_OP else 0
        temp["end"] = max(position[r] for r in b.readers) + 1
        temp["nbytes"], temp["value_type"] = st.values.nbytes[b.like], value_type[b.like]
        temp["min_nbytes"] = b.min_nbytes


def _arguments_and_outputs(prog, st, ty, position, pruned, is_state, donate):
    """(INPUT records, OUTPUT records), one per argument and per output. jax.jit drops the
    arguments the step never reads or returns (keep_unused=False): no buffer of theirs
    reaches XLA."""
    ins, outs = st.values.inputs, st.values.outputs
    inputs = np.zeros(len(ins), INPUT)
    inputs["nbytes"] = np.where([v in pruned for v in ins], 0.0, st.values.nbytes[ins])
    inputs["value_type"] = ty.value_type[ins]
    inputs["is_state"] = is_state[ins]
    inputs["count"] = 1.0
    outputs = np.zeros(len(outs), OUTPUT)
    outputs["nbytes"], outputs["value_type"] = st.values.nbytes[outs], ty.value_type[outs]
    outputs["position"] = [position[prog.values[v].producer]
                           if prog.values[v].producer >= 0 else 0 for v in outs]
    outputs["count"] = outputs["position_weight"] = 1.0
    outputs["zero_weight"] = (outputs["position"] > 0).astype(np.float64)
    outputs["alias_type"] = -1
    for u, o in _aliases(prog, pruned) if donate else []:
        outputs["alias_type"][o] = ty.value_type[u]
    return inputs, outputs


def _shared_read_positions(prog, st, ty, compiler, position) -> np.ndarray:
    """Sets where each shared read's reshard runs (`ready`) and its buffer is read last
    (`memory_position`) in the compiler's order, and returns the OPERAND_READ records of the
    other operands (where the compiler reshards as soon as a value is made)."""
    reads = ty.tables.shared_reads
    reads["memory_position"] = reads["ready"] = position[reads["position"]]
    operand_reads = np.zeros(0, OPERAND_READ)
    if compiler.schedules_breadth_first:  # a reshard runs as soon as its value is made
        ready = ready_positions(prog, position)
        shared = np.nonzero(ty.operand_read >= 0)[0]
        at = ty.operand_read[shared]
        reads["ready"][at] = np.minimum(ready[st.operands.value[shared]],
                                        reads["memory_position"][at])
        o = np.nonzero(ty.operand_member >= 0)[0]
        operand_reads = np.zeros(len(o), OPERAND_READ)
        operand_reads["position"] = position[st.operands.op[o]]
        operand_reads["ready"] = np.minimum(ready[st.operands.value[o]],
                                            operand_reads["position"])
        operand_reads["member"] = ty.operand_member[o]
    # a reshard hoisted out of a loop (Types.read_loop) runs before it; its buffer is read by
    # every iteration, so it lives until the loop's last op
    hoisted = ty.read_loop >= 0
    loop = ty.read_loop[hoisted]
    body_end = np.array([prog.ops[n].body_ops[1] for n in loop.tolist()], np.int64)
    reads["ready"][hoisted] = position[loop]
    reads["memory_position"][hoisted] = position[loop] + body_end - loop - 1
    reads["ready_at"], reads["end_at"] = reads["ready"], reads["memory_position"] + 1
    reads["ready_end_at"] = reads["ready"] + 1
    reads["ready_weight"] = reads["end_weight"] = reads["ready_end_weight"] = 1.0
    return operand_reads


def _unused_inputs(prog) -> set[int]:
    """Input values no op reads and no output returns: jax.jit prunes them."""
    outputs = set(prog.outputs)
    return {v for v in prog.inputs if v not in outputs and not prog.users(v)}


def _aliases(prog, pruned: set[int]) -> list[tuple[int, int]]:
    """(donated input value, output index) pairs, matched as jax does (mlir._set_up_aliases):
    each output, in order, takes the first unused donated input of its shape and dtype (of
    those jax.jit keeps: a `pruned` argument is no buffer to reuse)."""
    donated = set(donated_arguments(prog))
    args = prog.in_tree.children()[0]
    free: dict[tuple, list[int]] = {}
    first = 0
    for i, arg in enumerate(args.children()):
        if i in donated:
            for u in prog.inputs[first:first + arg.num_leaves]:
                if u in pruned:
                    continue
                key = (prog.values[u].shape, prog.values[u].dtype)
                free.setdefault(key, []).append(u)
        first += arg.num_leaves
    pairs = []
    for o, v in enumerate(prog.outputs):
        waiting = free.get((prog.values[v].shape, prog.values[v].dtype))
        if waiting:
            pairs.append((waiting.pop(0), o))
    return pairs


def _computations(region: np.ndarray) -> np.ndarray:
    """[N] the computation each op runs in (MemoryTables.computation), from the region op
    whose body it is (Static.ops.computation: a fully unrolled scan's body runs in the
    computation around it)."""
    regions = sorted(set(region[region >= 0].tolist()))
    index = {r: k + 1 for k, r in enumerate(regions)}
    return np.array([index.get(r, 0) for r in region.tolist()], np.int64)


def _readers(prog) -> dict:
    """MemoryTables.reader_start and .readers: the ops reading each op's results (CSR)."""
    lists = [sorted({r for v in op.results for r in prog.users(v)}) for op in prog.ops]
    start = np.zeros(len(lists) + 1, np.int64)
    start[1:] = np.cumsum([len(x) for x in lists])
    flat = np.array([r for x in lists for r in x], np.int64)
    return {"reader_start": start, "readers": flat}


def _sliced_reads(prog, position) -> np.ndarray:
    """MemoryTables.sliced_read: [N] (program order) where the last op reading each op's result
    runs, when every reader is a loop fusion that can take a slice of it in (through changes of
    layout, LINEAR); -1 where one cannot (a dot, a gather, an output). XLA:CPU writes a
    reduce-scatter as an all-reduce and a dynamic slice, and fuses the slice into such readers:
    the whole all-reduced buffer then lives until the last of them (an FSDP weight gradient read
    by the global norm early and by Adam's moments after it); a reader that cannot fuse it
    slices the shard right after the all-reduce."""
    outputs = set(prog.outputs)
    readers: list = [None] * len(prog.ops)  # the fusible readers, or None
    for n in range(len(prog.ops) - 1, -1, -1):  # readers come later in program order
        found, fusible = set(), True
        for v in prog.ops[n].results:
            fusible &= v not in outputs
            for r in prog.users(v):
                op = prog.ops[r]
                if op.primitive in LINEAR:
                    fusible &= readers[r] is not None
                    found |= readers[r] or set()
                elif op.body or op.primitive in NOT_FUSIBLE:
                    fusible = False
                else:
                    found.add(r)
        readers[n] = found if fusible and found else None
    last = np.full(len(prog.ops), -1, np.int64)
    for n, found in enumerate(readers):
        if found:
            last[n] = max(position[r] for r in found)
    return last


def _slice_reads(prog, st, ty, temp, position, live_end, out) -> np.ndarray:
    """Fills `out` (TEMP_SLICES of the temporaries `temp`, value ids) and returns the
    SLICE_READ records they index: the reads of each temporary by an op that XLA:CPU does not
    fuse a slice into (NOT_FUSIBLE: a dot, a gather...), and where its last other reader runs.

    Only temporaries whose last reader ends their life are listed (not one read in a loop, nor
    the input of a fused value, kept for the fusions that recompute it). What the kernel does
    with them: _kernel.early_slices."""
    operand_type = {}  # (op, value) -> the operand types it is read as
    for o in range(len(st.operands.op)):
        if ty.operand_member[o] >= 0:
            t = ty.tables.op_operands[ty.operand_member[o]]["operand_type"]
        elif ty.operand_read[o] >= 0:
            t = ty.tables.shared_reads[ty.operand_read[o]]["operand_type"]
        else:
            continue
        operand_type.setdefault((int(st.operands.op[o]), int(st.operands.value[o])),
                                []).append(int(t))
    rows = []
    for i, v in enumerate(temp.tolist()):
        readers = sorted(set(prog.users(v)))
        if not readers or prog.values[v].producer == NO_OP \
                or any(prog.ops[r].region != NO_OP for r in readers) \
                or live_end[v] != max(position[r] for r in readers) + 1:
            continue
        whole = int(position[prog.values[v].producer]) + 1
        start = len(rows)
        for r in readers:
            op = prog.ops[r]
            types = operand_type.get((r, v), ())
            if op.primitive in NOT_FUSIBLE and not op.body and types:
                rows += [(int(position[r]), t) for t in types]
            else:
                whole = max(whole, int(position[r]) + 1)
        if len(rows) > start:
            out[i] = (whole, start, len(rows))
    reads = np.zeros(len(rows), SLICE_READ)
    if rows:
        reads["position"], reads["operand_type"] = np.array(rows, np.int64).T
    return reads


