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

from typing import TYPE_CHECKING

import numpy as np

from ..program import state_inputs
from . import _kernel
from ._collectives import collective_costs
from ._compress import compress
from ._compiler import compiler_profile
from ._device_tables import device_ops, device_record
from ._estimate import COLLECTIVE_KINDS, CollectiveCost, Estimate, scope_index, top_scope
from ._manual import fixed_charges, out_spec_masks
from ._memory_tables import memory_tables
from ._op_collectives import OpCollective, op_charges, op_collectives
from ._order import memory_order
from ._repeats import position_map
from ._plan_arrays import PlanArrays, as_plan_arrays, axes_mask, live_axis_bits, plan_arrays
from ._schedule_tables import schedule_tables
from ._static import static_tables
from ._step_models import StepCostModel, rewritten
from ._timeline import MemoryTimeline, memory_timeline
from ._types import build_types

if TYPE_CHECKING:
    from ._incremental import IncrementalEstimator

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
        self._steps: dict = {}  # for_step's models, by StepDecisions
        self.st = static_tables(analysis)  # mesh-independent: one set per analysis
        self._mesh_tables(mesh)
        self._device_tables(analysis, mesh)
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
        """The tables of the program as the mesh's device and its compiler run it."""
        prog, st, dev = an.program, self.st, mesh.device
        dev_ops = device_ops(an, st, dev, self.compiler)
        self.fused = dev_ops.fused
        self.device_table = device_record(dev, self.compiler)
        self.memory_bandwidth = float(self.device_table["memory_bandwidth"][0])
        self.capacity = float(dev.memory_bytes)
        self.is_state = np.zeros(st.num_values, bool)
        self.is_state[list(state_inputs(prog))] = True
        self.count_in_scopes(top_scope(op) for op in prog.ops)
        self.ty = build_types(static=st, analysis=an, device_ops=dev_ops)
        tables = self.ty.tables
        self.op_count = tables.ops["count"]
        held = out_spec_masks(prog, self.ty.value_type, self.axis_bit, len(tables.value_classes))
        self.memory = memory_tables(an, st, self.ty, self.compiler, dev_ops,
                                    memory_order(an, dev), self.donate, self.is_state, held,
                                    mesh.size)
        self.schedule = schedule_tables(st, self.ty)
        self.positions = position_map(st.num_ops)
        self.read_share = np.ones(len(tables.shared_reads))
        if not (self.compiler.schedules_breadth_first or self.compiler.combines_all_reduces):
            self._compress()
        tables = self.ty.tables
        _kernel.wait_for_compile()  # (compiled code from here on)
        self.fixed = fixed_charges(prog, self.axis_bit, self.mesh_table, self.ty.op_type,
                                   len(tables.ops), self.ty.value_type)
        self.ty = self.ty._replace(tables=tables._replace(fixed=self.fixed.records,
                                                          fixed_by_op=self.fixed.by_op))
        self.state = self.new_state()
        self.layout = _kernel.ledger_layout(self.ty.tables)

    def new_state(self, plan=None, live=None):
        """A ModelState of this model's tables with a workspace of its own (_kernel); plan
        and live: the PlanArrays and Liveness an incremental estimator edits in place."""
        return _kernel.model_state(self.ty.tables, self.memory, self.schedule, self.mesh_table,
                                   self.device_table, plan, live)

    def _compress(self):
        """Each run of repeated blocks kept once (_compress.py), where there is one."""
        c = compress(self.memory, self.schedule, self.ty)
        if c is None:
            return
        self.memory, self.schedule, self.positions = c.memory, c.schedule, c.positions
        self.read_share = c.read_share
        tables = self.ty.tables._replace(shared_values=c.shared_values,
                                         shared_reads=c.shared_reads)
        self.ty = self.ty._replace(tables=tables, operand_read=c.operand_read)

    # --- plan -> arrays -----------------------------------------------------------------------

    def plan_arrays(self, plan) -> PlanArrays:
        """(split-class masks, ranks, conflict resolution indices) of a Plan."""
        return plan_arrays(self.analysis, *self.decision_lists(plan))

    def decision_lists(self, plan):
        """plan_arrays' arguments for a Plan: (class, mask) in its decision order, (conflict,
        resolution index), (class, domain, mask) overrides."""
        masks = [(k, axes_mask(self.axis_bit, axes)) for k, axes in plan.assignments]
        resolutions = [(c.id, list(c.resolutions).index(plan.resolution_of(c)))
                       for c in plan.analysis.conflicts]
        overrides = [(k, d, axes_mask(self.axis_bit, axes)) for k, d, axes in plan.overrides]
        return masks, resolutions, overrides

    # --- evaluation -----------------------------------------------------------------------------

    def count_in_scopes(self, names) -> None:
        """Makes Estimate.by_scope add up each op's time under `names` (one per op; by
        default its top-level name scope). A rewritten step's model counts its ops in the
        scopes of the step as written (_step_models.StepCostModel)."""
        self.op_scope, self.scope_names = scope_index(names)

    def estimate(self, plan) -> Estimate:
        if not plan.step.is_default:  # remat, micro-batches: the step as they rewrite it
            return self.for_step(plan.step).estimate(plan)
        return self.evaluate(*self.plan_arrays(plan))

    def price(self, plan) -> tuple[float, float]:
        """(step time s, peak bytes) of a Plan, its decisions beyond sharding included ((inf,
        inf) where the rewritten step cannot run it): `estimate`'s figures, faster."""
        if not plan.step.is_default:
            return self.for_step(plan.step).price(plan)
        return self.step_and_peak(*self.plan_arrays(plan))

    def for_step(self, step) -> "StepCostModel":
        """The estimates of plans with StepDecisions `step` (remat policies, micro-batches):
        the rewritten step's own cost model (_step_models.py), built once per step; a
        ValueError for decisions that cannot run together (`StepDecisions.refusal`)."""
        if step.refusal:
            raise ValueError(step.refusal)

        def build():
            rewrite = rewritten(self.analysis, step)
            return StepCostModel(rewrite, cost_model(rewrite.analysis, self.mesh, self.donate,
                                                     self.overlap), self)

        found = self._steps.get(step)
        if found is None:  # (a mesh hashes slowly: its device's tables)
            found = self._steps[step] = self.analysis.derived(
                ("cost.step", self.mesh, self.donate, self.overlap, step), build)
        return found

    def evaluate(self, mask, rank, res, details: bool = True) -> Estimate:
        """The Estimate for plan arrays (see plan_arrays); details: collectives and scopes."""
        result, coll, op_compute, op_comm = self._evaluate(_int64_plan(mask, rank, res))
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
        # (the state's own live ranges take the plan's, sized afresh: none are kept)
        step, peak = _kernel.step_and_peak(self.state, _int64_plan(mask, rank, res), None,
                                           True, self._overlap_code)
        return float(step), float(peak)

    def _evaluate(self, plan):
        """One plan (PlanArrays) through the kernel: (its RESULT record, its collectives
        [kind, mask, count | bytes | seconds], compute and communication seconds per op
        type)."""
        totals, coll, op_compute, op_comm = _kernel.evaluate(self.state, plan, None, True)
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
        is (_timeline.py): what the estimate's peak is made of, for charts. Not the hot path.
        A plan with decisions beyond sharding: the rewritten step's, its positions named by
        the ops as written they run (StepCostModel.memory_timeline)."""
        if not plan.step.is_default:
            return self.for_step(plan.step).memory_timeline(plan)
        return self.timeline_of(self.plan_arrays(plan))

    def timeline_of(self, arrays: PlanArrays) -> MemoryTimeline:
        """memory_timeline of plan arrays."""
        temps, added, outputs, held, totals = _kernel.live_bytes(
            self.state, arrays, _kernel.liveness(self.ty.tables, self.memory))
        at = self.positions.compressed  # a run's every copy changes what its first does
        return memory_timeline(temps[at], added[at], outputs[at], held[at[:-2]],
                               _kernel.as_result(totals), self.memory.position)

    def incremental(self, plan=None) -> "IncrementalEstimator":
        """An estimator for editing one plan a decision at a time (search, what-if sliders)."""
        from ._incremental import IncrementalEstimator  # (it builds on this module)
        return IncrementalEstimator(self, plan)

    def value_type_masks(self, mask, rank, res):
        """(eff[T, D], vmask[T]): per value type, the mesh-axis bits of each dim."""
        return _kernel.value_type_masks(self.state, as_plan_arrays(mask, rank, res))


_INT64 = np.dtype(np.int64)


def _int64_plan(mask, rank, res) -> PlanArrays:
    """as_plan_arrays, without its conversions where the arrays are int64 already (the
    search's): the kernel's entry copies them into arrays of its own (_driver._run)."""
    if (type(mask) is np.ndarray and type(rank) is np.ndarray and type(res) is np.ndarray
            and mask.dtype is _INT64 and rank.dtype is _INT64 and res.dtype is _INT64):
        return PlanArrays(mask, rank, res)
    return as_plan_arrays(mask, rank, res)

