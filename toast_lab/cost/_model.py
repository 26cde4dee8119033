"""CostModel: per-device step time and memory of a plan, vectorized (DESIGN.md §6).

The model, per op, with every value in exactly one sharding (its plan spec):
- the op computes its result where the result's shards live ("owner computes"); an operand
  dim must match the result dim its factor maps to, operands of a contraction must agree, and
  a need-replication factor wants its dim whole. Axes an operand has but the op does not want
  are all-gathered; axes that move from one dim to another are an all-to-all; axes the op wants
  but the operand lacks are a free local slice.
- a sharded contraction (reduction factor sharded alike on all its operands) leaves partial
  sums: reduce-scattered over the axes its result is sharded on, then all-reduced (the shard
  only) over the others; partial sums added together are reduced once where the compiler
  reassociates them (GPU, TPU).
- compute is a roofline per device: max(flops / rate, bytes moved / HBM bandwidth). Matmuls run
  at the device's measured ceiling times the useful share of the tiles their per-device shape
  fills; fused attention at its kernel's rate; values fused away (_fusion.py) move no bytes.
- collectives follow an alpha-beta model per mesh-axis mask built from the network
  (_collectives.py: levels, torus dimensions, trees across nodes).
- step time: compute plus the communication left exposed when collectives overlap compute as
  XLA's scheduler runs them (_kernel.schedule); or their sum, or their max (`overlap`).
- memory is liveness at per-device sizes over the order the compiler runs the ops (program
  order, or XLA:CPU's breadth-first schedule: _order.py): arguments (donated training state
  shares its buffers with the new state), outputs from their definition, temporaries while
  live (less the output space not yet written), gathered buffers from the reshard (at the
  op, or as soon as the value is made) to the op, a local slice a dot reads from when the
  value is made (the whole value then lives only while read whole), partial sums until
  their all-reduce, and compiler workspace.
Ops inside a scan body count `length` times for time, once for memory.
"""

from __future__ import annotations

import numpy as np

from ..plan import Plan, donated_arguments
from ..program import NO_OP, state_inputs
from . import _kernel
from ._collectives import collective_costs
from ._compiler import compiler_profile
from ._estimate import COLLECTIVE_KINDS, CollectiveCost, Estimate
from ._plan_arrays import (PlanArrays, as_plan_arrays, axes_mask, live_axis_bits, plan_arrays,
                           split_classes)
from ._order import memory_order, ready_positions, workspace_temps
from ._static import (_LINEAR, ROW_REPLICATE, ROW_RESULT, select_and_scatter_pieces,
                      static_tables)
from ._manual import manual_collectives
from ._fusion import (NOT_FUSIBLE, fused_live_ends, launches, library_inputs,
                      memory_traffic, own_fusions)
from ._op_collectives import OpCollective, op_charges, op_collectives
from ._timeline import MemoryTimeline, memory_timeline
from ._tables import (ALIAS, DEVICE, INPUT, OPERAND_READ, OUTPUT, SLICE_READ, SPAN, TEMP,
                      TEMP_SLICES, MemoryTables, ScheduleTables)
from ._types import build_types

# How communication and compute add up: "scheduled" overlaps collectives with compute the way
# XLA's scheduler runs them (_kernel.schedule), "none" adds them, "perfect" takes their max.
OVERLAP_MODES = ("scheduled", "none", "perfect")


def overlap_mode(overlap) -> str:
    """One of OVERLAP_MODES; True and False mean "perfect" and "none" (the old switch)."""
    if overlap is True or overlap is False:
        return "perfect" if overlap else "none"
    if overlap not in OVERLAP_MODES:
        raise ValueError(f"overlap={overlap!r}: choose one of {OVERLAP_MODES}")
    return overlap


def _tensor_float32(op, dtype, dev) -> bool:
    """Whether a float32 matmul runs on the tensor cores as TF32: JAX's default precision
    lets XLA:GPU do so (an 8192^3 float32 dot ran at 384 TFLOP/s on an H100, 78% of the TF32
    peak and 5.7x the float32 one; benchmarks/device_rates.py --grid, jax 0.11.2); precision
    HIGHEST keeps float32 (jax_default_matmul_precision="highest" too: the trace records it
    in the dot's params)."""
    if dev.platform != "gpu" or "tensorfloat32" not in dev.peak_flops:
        return False
    if op.primitive not in ("dot_general", "conv_general_dilated") or dtype != np.float32:
        return False
    precision = op.params.get("precision")
    names = [str(p) for p in (precision if isinstance(precision, tuple) else (precision,))]
    return not any(k in n for n in names for k in ("HIGHEST", "FLOAT32", "F32_F32_F32"))


def cost_model(analysis, mesh, donate: bool = True, overlap="scheduled") -> "CostModel":
    """The CostModel of `analysis` on `mesh`, built once and kept with the analysis (the Lab's
    UI and search threads share it; building is thread-safe)."""
    overlap = overlap_mode(overlap)
    return analysis.derived(("cost.model", mesh, donate, overlap),
                            lambda: CostModel(analysis, mesh, donate=donate, overlap=overlap))


class CostModel:
    """Estimates for one analysis on one mesh. Build once, evaluate many plans.

    donate: the step donates its training-state arguments, as training loops and plan.jit do
        (XLA writes the new state into their buffers); False keeps both copies.
    overlap: "scheduled" (collectives overlap compute as XLA schedules them), "none" (they add
        up) or "perfect" (step = max of the two); see OVERLAP_MODES.
    """

    def __init__(self, analysis, mesh, donate: bool = True, overlap="scheduled"):
        self.analysis = analysis
        self.mesh = mesh
        self.donate = donate
        self.overlap = overlap_mode(overlap)
        self.compiler = compiler_profile(mesh.device)  # the XLA passes the estimates follow
        self.st = static_tables(analysis)  # mesh-independent: one set per analysis
        self._mesh_tables(mesh)
        self._device_tables(analysis, mesh)
        self._manual_tables(analysis.program)
        self._scratch = _kernel.liveness(self.ty.tables)  # a full evaluation's live ranges
        self._overlap_code = {"scheduled": _kernel.OVERLAP_SCHEDULED,
                              "none": _kernel.OVERLAP_NONE,
                              "perfect": _kernel.OVERLAP_PERFECT}[self.overlap]

    # --- static tables ----------------------------------------------------------------------

    def _mesh_tables(self, mesh):
        names = tuple(mesh.axis_names)
        self.axis_bit = live_axis_bits(mesh)  # plans are read with size-1 axes cleared
        self.mesh_table, self.axis_shares = collective_costs(mesh)
        self.ways = self.mesh_table["ways"]
        self.mask_axes = [tuple(a for i, a in enumerate(names) if m >> i & 1)
                          for m in range(len(self.ways))]

    def _device_tables(self, an, mesh):
        prog, st = an.program, self.st
        dev, compiler = mesh.device, self.compiler
        peak = np.empty(st.num_ops)
        cache = {}
        for op in prog.ops:
            dt = prog.values[op.operands[0]].dtype if op.operands else np.dtype("float32")
            key = dt
            if _tensor_float32(op, dt, dev):
                key = dt = "tensorfloat32"
            if key not in cache:
                try:
                    cache[key] = dev.peak_flops_for(dt)
                except (ValueError, TypeError):  # PRNG keys and other extended dtypes
                    cache[key] = dev.peak_flops_for("float32")
            peak[op.id] = cache[key]
        e = dev.efficiency
        # what a streaming kernel reaches of the datasheet bandwidth (Efficiency.memory)
        self.memory_bandwidth = float(dev.memory_bandwidth) * e.memory
        self.device_table = np.array([(e.matmul, *map(float, e.tile), float(e.units), e.attention,
                                       self.memory_bandwidth, compiler.reduce_scatters,
                                       e.launch_s)], DEVICE)
        self.capacity = float(dev.memory_bytes)
        state = state_inputs(prog)
        self.is_state = np.zeros(st.num_values, bool)
        self.is_state[list(state)] = True
        scopes = {}
        self.op_scope = np.array([scopes.setdefault(op.name_scope.split("/")[0] or "(top)",
                                                    len(scopes)) for op in prog.ops], np.int64)
        self.scope_names = list(scopes)
        # Fusion follows the device's compiler: XLA's attention fuses where its profile says
        # so (a shard_map's body and cuDNN's attention are kernels of their own everywhere)
        fused, kernel = st.fused, st.op_kernel_own
        if compiler.fuses_attention:
            fused, kernel = st.fused | st.attention_inside, st.op_kernel
        self.fused = fused
        leaders = st.op_sum_leader if compiler.reassociates_all_reduce else \
            np.full(st.num_ops, -1, np.int64)
        workspace = st.op_workspace if compiler.allocates_op_workspace else np.zeros(st.num_ops)
        pieces = []  # workspace that lives longer than its op (_order.workspace_temps)
        if compiler.allocates_op_workspace and compiler.schedules_breadth_first:
            pieces = select_and_scatter_pieces(prog)
            workspace = workspace.copy()
            workspace[[op for op, *_ in pieces]] = 0.0
        flops = st.op_flops
        if compiler.clones_fused_producers:  # each copy after the first: the op's cloned flops
            flops = flops + st.op_clone_flops * (st.op_fusion_copies - 1.0)
        # ops the compiler computes whole want their operands whole: all-gathered, as XLA
        # does, and the result sliced locally
        row_kind = st.row_kind
        if not compiler.partitions_top_k:
            whole = st.op_replicated_on_cpu[st.row_op] & (st.row_kind == ROW_RESULT)
            row_kind = np.where(whole, ROW_REPLICATE, st.row_kind).astype(st.row_kind.dtype)
        self.ty = build_types(st, an, peak, memory_traffic(prog, fused), kernel,
                              st.op_flop_scale, leaders, workspace, flops, row_kind,
                              launches(prog, fused, kernel))
        ty = self.ty
        self.op_count = ty.tables.ops["count"]
        # Memory: temporaries (not arguments, not outputs) with their live ranges, in the order
        # the compiler runs the ops (position: each op's place in it; _order.py).
        # A fused value a library fusion reads is written once large enough (min_nbytes), and
        # lives until the last library fusion reading it (loop fusions recompute it).
        position, live_start, live_end = memory_order(an, dev)
        min_nbytes = np.where(fused, np.inf, 0.0)
        if compiler.clones_fused_producers:  # an expensive op read by several fusions is written
            own = an.derived("cost.own_fusions", lambda: own_fusions(prog))
            for op in np.nonzero(own)[0]:
                min_nbytes[list(prog.ops[op].results)] = 0.0
        readers = {}
        if compiler.reduces_in_library:
            threshold, readers = an.derived("cost.library_inputs",
                                            lambda: library_inputs(prog, st.fused))
            min_nbytes = np.minimum(min_nbytes, threshold)
        temp = np.nonzero(~st.is_input & ~st.is_output & np.isfinite(min_nbytes)
                          & (st.nbytes > 0) & ~st.outside_buffer)[0]
        temps = np.zeros(len(temp) + len(pieces), TEMP)
        live_end = fused_live_ends(prog, live_end, fused)
        for v, ops in readers.items():
            if fused[v]:
                live_end[v] = max(position[r] for r in ops) + 1
        k = len(temp)
        temps["start"][:k], temps["end"][:k] = live_start[temp], live_end[temp]
        temps["nbytes"][:k], temps["value_type"][:k] = st.nbytes[temp], ty.value_type[temp]
        temps["min_nbytes"][:k] = min_nbytes[temp]
        workspace_temps(temps[k:], pieces, prog, position, ty.value_type)
        for op, *_ in pieces:  # the scatter writes into zeros made before any compute
            temps["start"][:k][temp == prog.ops[op].results[0]] = 0
        # the temporaries of each value type, so a change moves only its own
        counts = np.bincount(temps["value_type"], minlength=len(ty.tables.value_classes))
        ends = np.cumsum(counts)
        by_type = np.zeros(len(counts), SPAN)
        by_type["start"], by_type["end"] = ends - counts, ends
        ins, outs = st.input_values, st.output_values
        inputs = np.zeros(len(ins), INPUT)
        # jax.jit drops the arguments the step never reads or returns (keep_unused=False):
        # no buffer of theirs reaches XLA
        pruned = _unused_inputs(prog)
        inputs["nbytes"] = np.where([v in pruned for v in ins], 0.0, st.nbytes[ins])
        inputs["value_type"] = ty.value_type[ins]
        inputs["is_state"] = self.is_state[ins]
        outputs = np.zeros(len(outs), OUTPUT)
        outputs["nbytes"], outputs["value_type"] = st.nbytes[outs], ty.value_type[outs]
        outputs["position"] = [position[prog.values[v].producer]
                               if prog.values[v].producer >= 0 else 0 for v in outs]
        pairs = _aliases(prog, pruned) if self.donate else []
        aliases = np.zeros(len(pairs), ALIAS)
        for i, (u, o) in enumerate(pairs):
            aliases[i] = (ty.value_type[u], ty.value_type[outs[o]], st.nbytes[u], o)
        # the instances of each op type, in program order
        counts = np.bincount(ty.op_type, minlength=len(ty.tables.ops))
        ends = np.cumsum(counts)
        instances_by_type = np.zeros(len(counts), SPAN)
        instances_by_type["start"], instances_by_type["end"] = ends - counts, ends
        # the sweep's order: the op type at each position, where each op's result dies
        type_at = np.empty(st.num_ops, np.int64)
        type_at[position] = ty.op_type
        result_end = np.where(st.op_result >= 0, live_end[st.op_result], position + 1)
        reads = ty.tables.shared_reads
        reads["memory_position"] = reads["ready"] = position[reads["position"]]
        operand_reads = np.zeros(0, OPERAND_READ)
        if compiler.schedules_breadth_first:  # a reshard runs as soon as its value is made
            ready = ready_positions(prog, position)
            shared = np.nonzero(ty.operand_read >= 0)[0]
            at = ty.operand_read[shared]
            reads["ready"][at] = np.minimum(ready[st.operand_value[shared]],
                                            reads["memory_position"][at])
            o = np.nonzero(ty.operand_member >= 0)[0]
            operand_reads = np.zeros(len(o), OPERAND_READ)
            operand_reads["position"] = position[st.operand_op[o]]
            operand_reads["ready"] = np.minimum(ready[st.operand_value[o]],
                                                operand_reads["position"])
            operand_reads["member"] = ty.operand_member[o]
        # a reshard hoisted out of a loop (Types.read_loop) runs before it; its buffer is read
        # by every iteration, so it lives until the loop's last op
        hoisted = ty.read_loop >= 0
        loop = ty.read_loop[hoisted]
        body_end = np.array([prog.ops[n].body_ops[1] for n in loop.tolist()], np.int64)
        reads["ready"][hoisted] = position[loop]
        reads["memory_position"][hoisted] = position[loop] + body_end - loop - 1
        temp_slices = np.zeros(len(temps), TEMP_SLICES)
        temp_slices["whole_end"] = temps["end"]
        slice_reads = np.zeros(0, SLICE_READ)
        if compiler.schedules_breadth_first:
            slice_reads = _slice_reads(prog, st, ty, temp, position, live_end,
                                       temp_slices[:k])
        computation = _computations(self.st.op_computation)
        self.memory = MemoryTables(
            op_type=type_at, temps=temps, temps_by_type=by_type,
            temps_of_type=np.argsort(temps["value_type"], kind="stable").astype(np.int64),
            inputs=inputs, outputs=outputs, aliases=aliases,
            instances_by_type=instances_by_type,
            instances=np.argsort(ty.op_type, kind="stable").astype(np.int64),
            deadline=st.op_deadline, combine_all_reduces=compiler.combines_all_reduces,
            position=position.astype(np.int64), result_end=result_end.astype(np.int64),
            operand_reads=operand_reads, computation=computation,
            num_computations=int(computation.max(initial=0)) + 1,
            iteration_copies=self.st.op_iteration_copies,
            sliced_read=_sliced_reads(prog, position), temp_slices=temp_slices,
            slice_reads=slice_reads, fixed_held=self._out_spec_masks(prog), **_readers(prog))
        self.schedule = ScheduleTables(
            op_type=ty.op_type, ready=st.op_ready, deadline=st.op_deadline,
            body_first=st.body_first, body_last_trip=st.body_last_trip,
            event=_events(st, ty.tables.shared_reads),
            reads_in_order=np.argsort(ty.tables.shared_reads["position"],
                                      kind="stable").astype(np.int64))
        self.state = _kernel.model_state(ty.tables, self.memory, self.schedule,
                                         self.mesh_table, self.device_table)
        self.layout = _kernel.ledger_layout(ty.tables)

    def _out_spec_masks(self, prog) -> np.ndarray:
        """[T] per value type, the mesh axes a shard_map's out_specs shard its result over
        (XLA writes each device's shard and keeps it so; each result is a type of its own,
        build_types), 0 for other types."""
        fixed = np.zeros(len(self.ty.tables.value_classes), np.int64)
        for op in prog.ops:
            if op.primitive != "shard_map":
                continue
            for r, spec in zip(op.results, op.params["out_specs"]):
                for entry in tuple(spec):
                    axes = (entry,) if isinstance(entry, str) else tuple(entry or ())
                    for a in axes:
                        fixed[self.ty.value_type[r]] |= self.axis_bit.get(a, 0)
        return fixed

    def _manual_tables(self, prog):
        """The collectives shard_map bodies run whatever the plan (_manual.py), as rows of
        fixed charges: op, kernel kind, mesh-axis mask, count, bytes and seconds of one run;
        and their sum as the kernel's collectives array."""
        kinds = {"all-reduce": _kernel.AR, "all-gather": _kernel.AG,
                 "reduce-scatter": _kernel.RS, "all-to-all": _kernel.A2A,
                 "collective-permute": _kernel.CP}
        rows = []
        for c in manual_collectives(prog):
            mask = sum(self.axis_bit.get(a, 0) for a in set(c.axes))
            cost = self.mesh_table[mask]
            if mask == 0 or cost["ways"] <= 1.0 or c.nbytes <= 0:
                continue
            one = c.nbytes * cost["gather_beta"] + cost["gather_alpha"]
            if c.kind == "all-reduce":  # a reduce-scatter and an all-gather
                one *= 2.0
            elif c.kind == "all-to-all":
                one = c.nbytes * cost["a2a_beta"] + cost["gather_alpha"]
            elif c.kind == "collective-permute":  # point to point, one hop (_collectives.py)
                one = c.nbytes * cost["permute_beta"] + cost["permute_alpha"]
            rows.append((c.op, kinds[c.kind], mask, c.count, c.nbytes, one))
        self._fixed = np.array(rows, np.float64).reshape(-1, 6)
        self._fixed_coll = np.zeros((_kernel.NUM_KINDS, len(self.ways), 3))
        op, kind, mask = (self._fixed[:, i].astype(np.int64) for i in range(3))
        count, nbytes, seconds = self._fixed[:, 3], self._fixed[:, 4], self._fixed[:, 5]
        for col, w in enumerate((count, count * nbytes, count * seconds)):
            np.add.at(self._fixed_coll[:, :, col], (kind, mask), w)
        self._fixed_s = float((count * seconds).sum())
        self._fixed_op_comm = np.bincount(self.ty.op_type[op], weights=count * seconds,
                                          minlength=len(self.op_count))

    # --- plan -> arrays -----------------------------------------------------------------------

    def plan_arrays(self, plan) -> PlanArrays:
        """(split-class masks, ranks, conflict resolution indices) of a Plan."""
        an = self.analysis
        masks = ((k, axes_mask(self.axis_bit, axes)) for k, axes in plan.assignments)
        resolutions = ((c.id, list(c.resolutions).index(plan.resolution_of(c)))
                       for c in an.conflicts)
        overrides = ((k, d, axes_mask(self.axis_bit, axes))
                     for k, d, axes in plan.overrides)
        return plan_arrays(an, masks, resolutions, overrides)

    # --- evaluation -----------------------------------------------------------------------------

    def estimate(self, plan) -> Estimate:
        return self.evaluate(*self.plan_arrays(plan))

    def evaluate(self, mask, rank, res, details: bool = True) -> Estimate:
        """The Estimate for plan arrays (see plan_arrays); details: collectives and scopes."""
        result, coll, op_compute, op_comm = self._evaluate(as_plan_arrays(mask, rank, res))
        compute_s, comm_s = float(result["compute_s"]), float(result["communication_s"])
        step = self._step_and_peak(result)[0]
        arg, out = float(result["argument_bytes"]), float(result["output_bytes"])
        temp, alias = float(result["temp_bytes"]), float(result["alias_bytes"])
        state = float(result["state_bytes"])
        collectives, by_scope, by_axis = {}, {}, {}
        if self.overlap == "scheduled":
            exposed = float(result["exposed_s"])
        elif self.overlap == "perfect":
            exposed = max(0.0, comm_s - compute_s)
        else:
            exposed = comm_s
        if details:
            for kind_index, kind in enumerate(COLLECTIVE_KINDS):  # _kernel.AR, AG, ... CP
                for m in np.nonzero(coll[kind_index, :, 0])[0]:
                    c = coll[kind_index, m]
                    collectives[(kind, self.mask_axes[m])] = CollectiveCost(
                        float(c[0]), float(c[1]), float(c[2]))
                    for axis, share in self.axis_shares[m].items():
                        by_axis[axis] = by_axis.get(axis, 0.0) + share * float(c[2])
            per_op = self.ty.op_type  # each instance carries its type's share
            n = len(self.scope_names)
            sc = np.bincount(self.op_scope, weights=(op_compute / self.op_count)[per_op],
                             minlength=n)
            sm = np.bincount(self.op_scope, weights=(op_comm / self.op_count)[per_op],
                             minlength=n)
            by_scope = {k: (float(a), float(b)) for k, a, b in zip(self.scope_names, sc, sm)}
        return Estimate(
            step_time_s=step, compute_s=compute_s, communication_s=comm_s,
            flops=float(result["flops"]),
            flops_loop_bodies_once=float(result["flops_loop_bodies_once"]),
            peak_memory_bytes=arg + out + temp - alias,
            argument_bytes=arg, output_bytes=out, temp_bytes=temp, alias_bytes=alias,
            memory_capacity_bytes=self.capacity, collectives=collectives,
            # Outputs written into donated argument buffers take no memory of their own: the
            # categories add up to the peak, with none negative, so a chart can stack them.
            memory_breakdown={"parameters and optimizer state": state,
                              "other arguments": arg - state,
                              "outputs (not donated)": out - alias,
                              "temporaries (peak)": temp},
            by_scope=by_scope, overlap=self.overlap, device=self.mesh.device.name,
            exposed_communication_s=exposed, communication_by_axis=by_axis)

    def step_and_peak(self, mask, rank, res) -> tuple[float, float]:
        """(step time s, peak memory bytes): the search's hot path."""
        step, peak = _kernel.step_and_peak(self.state, as_plan_arrays(mask, rank, res),
                                           self._scratch, True, self._overlap_code,
                                           self._fixed_s)
        return float(step), float(peak)

    def _evaluate(self, plan):
        """One plan (PlanArrays) through the kernel: (its RESULT record, its collectives
        [kind, mask, count | bytes | seconds], compute and communication seconds per op
        type), a shard_map body's own collectives added (on the critical path)."""
        totals, coll, op_compute, op_comm = _kernel.evaluate(self.state, plan, self._scratch,
                                                             True)
        if len(self._fixed):
            coll += self._fixed_coll
            op_comm += self._fixed_op_comm
            for field in ("communication_s", "scheduled_s", "exposed_s"):
                totals[_kernel.RESULT.names.index(field)] += self._fixed_s
        return _kernel.as_result(totals), coll, op_compute, op_comm

    def _step_and_peak(self, result) -> tuple[float, float]:
        compute, comm = result["compute_s"], result["communication_s"]
        if self.overlap == "scheduled":
            step = result["scheduled_s"]
        elif self.overlap == "perfect":
            step = max(compute, comm)
        else:
            step = compute + comm
        peak = (result["argument_bytes"] + result["output_bytes"] + result["temp_bytes"]
                - result["alias_bytes"])
        return float(step), float(peak)

    def op_costs(self, plan) -> tuple[np.ndarray, np.ndarray]:
        """(compute s, communication s) per op of the program, for views that colour the
        graph by cost. Ops of one type share their type's compute evenly; communication is
        each op's own collectives (op_collectives: a value read by several ops is gathered
        at the first that needs it)."""
        compute, comm, _ = self.op_breakdown(plan, collectives=False)
        return compute, comm

    def op_collectives(self, plan) -> dict[int, tuple[OpCollective, ...]]:
        """{op id: the collectives it pays under `plan`}, for every op that pays one: the
        estimate's `collectives` read back to the ops that charge them (the kernel's ledger,
        _op_collectives.py). Over all ops, the count, bytes and seconds of each (kind, mesh
        axes) add up to `estimate(plan).collectives[(kind, axes)]`. Slower than `estimate`
        (a second kernel entry that records every charge): for views, not for search."""
        return self.op_breakdown(plan)[2]

    def op_breakdown(self, plan, collectives: bool = True):
        """(compute s per op, communication s per op, op_collectives or None) from one run of
        the kernel: what a view of the program's ops needs, at once."""
        charges, op_compute = op_charges(self, self.plan_arrays(plan))
        compute = (op_compute / self.op_count)[self.ty.op_type]
        comm = np.bincount(charges.op, weights=charges.seconds, minlength=self.st.num_ops)
        return compute, comm, op_collectives(charges, self.mask_axes) if collectives else None

    def memory_timeline(self, plan) -> MemoryTimeline:
        """Live bytes per device at each op of `plan`'s step, by category, and where the peak
        is (_timeline.py): what the estimate's peak is made of, for charts. Not the hot path."""
        temps, added, outputs, held, totals = _kernel.live_bytes(
            self.state, self.plan_arrays(plan), _kernel.liveness(self.ty.tables))
        return memory_timeline(temps, added, outputs, held, _kernel.as_result(totals),
                               self.memory.position)

    def incremental(self, plan=None) -> "IncrementalEstimator":
        """An estimator for editing one plan a decision at a time (search, what-if sliders)."""
        return IncrementalEstimator(self, plan)

    def value_type_masks(self, mask, rank, res):
        """(eff[T, D], vmask[T]): per value type, the mesh-axis bits of each dim."""
        return _kernel.value_type_masks(self.state, as_plan_arrays(mask, rank, res))


class IncrementalEstimator:
    """One plan under edit: each change re-costs the per-type tables (a few hundred entries,
    whatever the depth) and moves only the live ranges of the values whose sharding changed.

        inc = model.incremental(plan)
        step_s, peak_bytes = inc.set_axes(class_id, ("data",))
        step_s, peak_bytes = inc.set_axes(class_id, ("fsdp",), domain="parameters")

    mask, rank and res are the kernel's arrays (per split class, see _plan_arrays.py).
    """

    def __init__(self, model: CostModel, plan=None):
        self.model = model
        an = model.analysis
        if plan is None:
            plan = Plan.replicated(an)
        self.mask, self.rank, self.res = (a.copy() for a in model.plan_arrays(plan))
        self._next_rank = len(plan.assignments)
        self._split = split_classes(an)
        # Per class: its own mask, whether it holds a place in the decision order, and which
        # of its split classes an override sets (they keep their mask when the class changes).
        self._own = np.zeros(len(an.classes), np.int64)
        for k, axes in plan.assignments:
            self._own[k] = axes_mask(model.axis_bit, axes)
        self._overridden = {self._split.index[(k, d)] for k, d, _ in plan.overrides
                            if (k, d) in self._split.index}
        self._held = {k for k, _, _ in plan.overrides}
        # the temporaries' live ranges, sized replicated to begin with
        self._live = _kernel.liveness(model.ty.tables)
        _kernel.fill_temps(model.state, self._live, self._live.held)
        self.result = self._update()

    def set_axes(self, cls: int, axes, domain: str | None = None) -> tuple[float, float]:
        """Shards class id `cls` over `axes` (names) — decided after every earlier decision
        if it was not decided yet — or, with `domain`, only that domain's values of it (an
        override; its class keeps or takes a place in the decision order)."""
        m = axes_mask(self.model.axis_bit, axes)
        splits = self._split.splits_of[cls]
        was = bool(self._own[cls]) or cls in self._held
        if domain is None:
            self._own[cls] = m
            for s in splits:
                if s not in self._overridden:
                    self.mask[s] = m
        else:
            self._held.add(cls)
            s = self._split.index.get((cls, domain))
            if s is not None:  # else the class has no value there: nothing changes
                self._overridden.add(s)
                self.mask[s] = m
        if not was and (self._own[cls] or cls in self._held):
            self.rank[list(splits)] = self._next_rank
            self._next_rank += 1
        self.result = self._update()
        return self.result

    def set_resolution(self, conflict: int, index: int) -> tuple[float, float]:
        self.res[conflict] = index
        self.result = self._update()
        return self.result

    def _update(self) -> tuple[float, float]:
        model = self.model
        step, peak = _kernel.step_and_peak(model.state, PlanArrays(self.mask, self.rank,
                                                                   self.res),
                                           self._live, False, model._overlap_code,
                                           model._fixed_s)
        return float(step), float(peak)


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
    whose body it is (Static.op_computation: a fully unrolled scan's body runs in the
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
    layout, _LINEAR); -1 where one cannot (a dot, a gather, an output). XLA:CPU writes a
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
                if op.primitive in _LINEAR:
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
    for o in range(len(st.operand_op)):
        if ty.operand_member[o] >= 0:
            t = ty.tables.op_operands[ty.operand_member[o]]["operand_type"]
        elif ty.operand_read[o] >= 0:
            t = ty.tables.shared_reads[ty.operand_read[o]]["operand_type"]
        else:
            continue
        operand_type.setdefault((int(st.operand_op[o]), int(st.operand_value[o])),
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


def _events(st, shared_reads) -> np.ndarray:
    """[N] bool: the ops where the schedule has more to do than run the op."""
    event = st.body_first | (st.body_last_trip > 1.0)
    event[shared_reads["position"]] = True
    return event
