"""CostModel: per-device step time and memory of a plan, vectorized (DESIGN.md §6).

The model, per op, with every value in exactly one sharding (its plan spec):
- the op computes its result where the result's shards live ("owner computes"); an operand
  dim must match the result dim its factor maps to, operands of a contraction must agree, and
  a need-replication factor wants its dim whole. Axes an operand has but the op does not want
  are all-gathered; axes that move from one dim to another are an all-to-all; axes the op wants
  but the operand lacks are a free local slice.
- a sharded contraction (reduction factor sharded alike on all its operands) leaves partial
  sums: an all-reduce, or a reduce-scatter where the result is sharded on those axes.
- compute is a roofline: max(flops / peak, bytes moved / HBM bandwidth), per device; values
  XLA would fuse away move no bytes.
- collectives follow an alpha-beta ring model per mesh axis: all-reduce 2(n-1)/n·S/B +
  2(n-1)α, all-gather and reduce-scatter (n-1)/n·S/B + (n-1)α, all-to-all (n-1)/n·S/B +
  (n-1)α; over several axes, the slowest link's bandwidth and latency.
- memory is liveness over program order at per-device sizes: arguments (all step long unless
  donated), outputs from their definition, temporaries while live, plus gathered buffers at
  the op that gathers them.
Ops inside a scan body count `length` times for time, once for memory.
"""

from __future__ import annotations

import numpy as np

from ..strategies._roles import state_inputs
from ._estimate import COLLECTIVE_KINDS, CollectiveCost, Estimate
from ._static import ROW_GROUP, ROW_REPLICATE, ROW_RESULT, build_static

AR, AG, RS, A2A = range(4)  # indices into COLLECTIVE_KINDS


class CostModel:
    """Estimates for one analysis on one mesh. Build once, evaluate many plans.

    donate: the step donates its arguments (XLA may reuse their memory for the outputs).
    overlap: communication overlaps compute perfectly (step = max) instead of adding up.
    """

    def __init__(self, analysis, mesh, donate: bool = False, overlap: bool = False):
        self.analysis = analysis
        self.mesh = mesh
        self.donate = donate
        self.overlap = overlap
        st = getattr(analysis, "_cost_static", None)
        if st is None:
            st = build_static(analysis)
            analysis._cost_static = st  # mesh-independent: shared by every CostModel
        self.st = st
        self._mesh_tables(mesh)
        self._device_tables(analysis, mesh)
        self._conflict_tables(analysis)
        self._prepare_reductions()

    # --- static tables ----------------------------------------------------------------------

    def _mesh_tables(self, mesh):
        names = tuple(mesh.axis_names)
        self.axis_bit = {a: 1 << i for i, a in enumerate(names)}
        n = 1 << len(names)
        ways = np.ones(n, np.float64)
        bw = np.full(n, np.inf)
        lat = np.zeros(n)
        for m in range(1, n):
            for i, a in enumerate(names):
                if m >> i & 1:
                    link = mesh.link(a)
                    ways[m] *= mesh.axis_size(a)
                    bw[m] = min(bw[m], link.bandwidth)
                    lat[m] = max(lat[m], link.latency)
        self.ways, self.bw, self.lat = ways, bw, lat
        self.mask_axes = [tuple(a for i, a in enumerate(names) if m >> i & 1) for m in range(n)]

    def _device_tables(self, an, mesh):
        prog, st = an.program, self.st
        dev = mesh.device
        peak = np.empty(st.num_ops)
        cache = {}
        for op in prog.ops:
            dt = prog.values[op.operands[0]].dtype if op.operands else np.dtype("float32")
            if dt not in cache:
                try:
                    cache[dt] = dev.peak_flops_for(dt)
                except ValueError:
                    cache[dt] = dev.peak_flops_for("float32")
            peak[op.id] = cache[dt]
        self.peak = peak
        self.mem_bw = float(dev.memory_bandwidth)
        self.capacity = float(dev.memory_bytes)
        # Every (op, value) it reads or writes, for the bytes-moved side of the roofline.
        io_op, io_val = [], []
        for op in prog.ops:
            if op.body:
                continue
            for v in set(op.operands) | set(op.results):
                if prog.values[v].ndim:
                    io_op.append(op.id)
                    io_val.append(v)
        self.io_op = np.array(io_op, np.int32)
        self.io_val = np.array(io_val, np.int32)
        state = state_inputs(prog)
        self.is_state = np.zeros(st.num_values, bool)
        self.is_state[list(state)] = True
        scopes = {}
        self.op_scope = np.array([scopes.setdefault(op.name_scope.split("/")[0] or "(top)",
                                                    len(scopes)) for op in prog.ops], np.int32)
        self.scope_names = list(scopes)

    def _conflict_tables(self, an):
        """Per conflict and resolution: the (value, dim) slots it replicates."""
        self.conflicts = []
        for c in an.conflicts:
            per_res = []
            for res in c.resolutions:
                slots = set()
                for side in c.sides:
                    if res == "replicate" or side.resolution != res:
                        slots.update(side.members)
                if not c.sides:
                    vc = an.value_classes
                    slots.update((v, d) for v in c.values for d, k in enumerate(vc[v])
                                 if k == c.class_id)
                arr = np.array(sorted(slots), np.int32).reshape(-1, 2)
                per_res.append((arr[:, 0], arr[:, 1]))
            self.conflicts.append((c.class_id, tuple(c.resolutions), per_res))

    def _prepare_reductions(self):
        st = self.st
        # group rows sorted by group, for bitwise_and.reduceat
        gr = np.nonzero(st.row_kind == ROW_GROUP)[0]
        order = gr[np.argsort(st.row_group[gr], kind="stable")]
        self.group_rows = order
        groups = st.row_group[order]
        self.group_starts = np.r_[0, np.nonzero(np.diff(groups))[0] + 1].astype(np.int64)
        self.group_ids = groups[self.group_starts] if len(order) else np.zeros(0, np.int32)
        # rows are contiguous per operand
        ro = st.row_operand
        self.operand_starts = np.r_[0, np.nonzero(np.diff(ro))[0] + 1].astype(np.int64)
        self.result_rows = np.nonzero(st.row_kind == ROW_RESULT)[0]

    # --- plan -> arrays -----------------------------------------------------------------------

    def plan_arrays(self, plan):
        """(class masks, class ranks, conflict resolution indices) of a Plan."""
        an = self.analysis
        mask = np.zeros(len(an.classes), np.int64)
        rank = np.full(len(an.classes), 1 << 30, np.int64)
        for i, (k, axes) in enumerate(plan.assignments):
            m = 0
            for a in axes:
                m |= self.axis_bit[a]
            mask[k] = m
            rank[k] = i
        res = np.array([list(c.resolutions).index(plan.resolution_of(c))
                        for c in an.conflicts], np.int64)
        return mask, rank, res

    # --- evaluation -----------------------------------------------------------------------------

    def value_masks(self, mask, rank, res):
        """eff[V, D]: the mesh-axis bit mask of each value dim; vmask[V]: their union."""
        st = self.st
        cls = st.slot_class
        valid = cls >= 0
        safe = np.where(valid, cls, 0)
        m = np.where(valid, mask[safe], 0)
        for (cid, _, per_res), r in zip(self.conflicts, res):
            if mask[cid]:
                vi, di = per_res[r]
                m[vi, di] = 0
        if st.width == 1:
            return m, m[:, 0].copy()
        r = np.where(valid, rank[safe], 1 << 40)
        order = np.argsort(r, axis=1, kind="stable")
        ms = np.take_along_axis(m, order, axis=1)
        used = np.zeros(len(m), np.int64)
        out = np.empty_like(ms)
        for j in range(st.width):  # the class decided first keeps a contested axis
            mj = ms[:, j]
            keep = np.where((mj & used) == 0, mj, 0)
            out[:, j] = keep
            used |= keep
        eff = np.empty_like(out)
        np.put_along_axis(eff, order, out, axis=1)
        return eff, used

    def estimate(self, plan) -> Estimate:
        return self.evaluate(*self.plan_arrays(plan))

    def evaluate(self, mask, rank, res, details: bool = True) -> Estimate:
        st = self.st
        ways, bw, lat = self.ways, self.bw, self.lat
        eff, vmask = self.value_masks(mask, rank, res)
        pdb = st.nbytes / ways[vmask]

        # Required sharding of each operand row.
        actual = eff[st.row_value, st.row_dim]
        required = np.zeros_like(actual)
        rr = self.result_rows
        required[rr] = eff[st.row_src_value[rr], st.row_src_dim[rr]]
        consensus = np.zeros(len(st.group_op), np.int64)
        if len(self.group_rows):
            consensus[self.group_ids] = np.bitwise_and.reduceat(actual[self.group_rows],
                                                                self.group_starts)
            required[self.group_rows] = consensus[st.row_group[self.group_rows]]
        removed = actual & ~required
        added = required & ~actual
        if len(actual):
            rem = np.bitwise_or.reduceat(removed, self.operand_starts)
            add = np.bitwise_or.reduceat(added, self.operand_starts)
        else:
            rem = add = np.zeros(0, np.int64)
        a2a = rem & add
        ag = rem & ~add
        opnd_pdb = pdb[st.operand_value]
        ag_bytes = np.where(ag != 0, opnd_pdb * ways[ag], 0.0)
        a2a_bytes = np.where(a2a != 0, opnd_pdb, 0.0)
        ag_time = _ring(ag_bytes, ways[ag], bw[ag], lat[ag], 1.0)
        a2a_time = _ring(a2a_bytes, ways[a2a], bw[a2a], lat[a2a], 1.0)

        # Partial sums of sharded contractions.
        N = st.num_ops
        psum = np.zeros(N, np.int64)
        red = st.group_is_reduction & (consensus != 0)
        np.bitwise_or.at(psum, st.group_op[red], consensus[red])
        res_v = st.op_result
        has_res = res_v >= 0
        res_mask = np.where(has_res, vmask[np.maximum(res_v, 0)], 0)
        res_pdb = np.where(has_res, pdb[np.maximum(res_v, 0)], 0.0)
        rs = psum & res_mask
        ar = psum & ~res_mask
        partial = res_pdb * ways[rs]
        ar_bytes = np.where(ar != 0, partial, 0.0)
        rs_bytes = np.where(rs != 0, partial, 0.0)
        ar_time = _ring(ar_bytes, ways[ar], bw[ar], lat[ar], 2.0)
        rs_time = _ring(rs_bytes, ways[rs], bw[rs], lat[rs], 1.0)

        # Compute: roofline per op.
        trip = st.op_trip
        iter_ways = ways[res_mask | psum]
        flops = st.op_flops / iter_ways
        moved = np.where(st.fused, 0.0, pdb)
        traffic = np.bincount(self.io_op, weights=moved[self.io_val], minlength=N)
        compute = np.maximum(flops / self.peak, traffic / self.mem_bw) * trip

        opnd_op = st.operand_op
        comm = (np.bincount(opnd_op, weights=ag_time + a2a_time, minlength=N)
                + ar_time + rs_time) * trip
        compute_s = float(compute.sum())
        comm_s = float(comm.sum())
        step = max(compute_s, comm_s) if self.overlap else compute_s + comm_s

        # Memory.
        gathered = np.bincount(opnd_op, weights=ag_bytes + a2a_bytes, minlength=N)
        mem = self._memory(pdb, gathered)

        collectives = {}
        by_scope = {}
        if details:
            collectives = self._collectives(
                (AG, opnd_op, ag, ag_bytes, ag_time), (A2A, opnd_op, a2a, a2a_bytes, a2a_time),
                (AR, None, ar, ar_bytes, ar_time), (RS, None, rs, rs_bytes, rs_time))
            sc = np.bincount(self.op_scope, weights=compute, minlength=len(self.scope_names))
            sm = np.bincount(self.op_scope, weights=comm, minlength=len(self.scope_names))
            by_scope = {n: (float(a), float(b)) for n, a, b in zip(self.scope_names, sc, sm)}
        return Estimate(
            step_time_s=step, compute_s=compute_s, communication_s=comm_s,
            flops=float((flops * trip).sum()), collectives=collectives, by_scope=by_scope,
            overlap=self.overlap, device=self.mesh.device.name,
            memory_capacity_bytes=self.capacity, **mem)

    def _memory(self, pdb, gathered) -> dict:
        st = self.st
        N = st.num_ops
        size = np.where(st.fused, 0.0, pdb)
        start, end = st.live_start, st.live_end.copy()
        inputs, outputs = st.is_input, st.is_output
        if not self.donate:
            end[inputs] = N + 1
        temp = ~inputs & ~outputs
        delta = (np.bincount(start[temp], weights=size[temp], minlength=N + 2)
                 - np.bincount(end[temp], weights=size[temp], minlength=N + 2))
        live = np.cumsum(delta)[:N + 1]
        live[:N] += gathered
        temp_bytes = float(live.max()) if len(live) else 0.0
        arg = float(pdb[st.input_values].sum())
        out_vals = np.unique(st.output_values)
        out = float(pdb[out_vals].sum())
        alias = 0.0
        if self.donate:  # outputs written over donated arguments of the same size
            alias = min(arg, float(pdb[out_vals][~inputs[out_vals]].sum()))
        state = float(pdb[st.input_values][self.is_state[st.input_values]].sum())
        return dict(peak_memory_bytes=arg + out + temp_bytes - alias, argument_bytes=arg,
                    output_bytes=out, temp_bytes=temp_bytes, alias_bytes=alias,
                    memory_breakdown={"parameters and optimizer state": state,
                                      "other arguments": arg - state, "outputs": out,
                                      "temporaries (peak)": temp_bytes,
                                      "aliased": -alias})

    def _collectives(self, *parts) -> dict:
        st = self.st
        out = {}
        nmask = len(self.ways)
        for kind, ops_of, masks, nbytes, times in parts:
            if not len(masks):
                continue
            trip = st.op_trip[ops_of] if ops_of is not None else st.op_trip
            on = masks != 0
            if not on.any():
                continue
            cnt = np.bincount(masks[on], weights=trip[on], minlength=nmask)
            byt = np.bincount(masks[on], weights=(nbytes * trip)[on], minlength=nmask)
            tim = np.bincount(masks[on], weights=(times * trip)[on], minlength=nmask)
            for m in np.nonzero(cnt)[0]:
                out[(COLLECTIVE_KINDS[kind], self.mask_axes[m])] = CollectiveCost(
                    float(cnt[m]), float(byt[m]), float(tim[m]))
        return out


def _ring(nbytes, n, bw, lat, factor):
    """Alpha-beta ring time: factor·(n-1)/n·S/B + factor·(n-1)·α (0 where nothing moves)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        t = factor * ((n - 1) / n * nbytes / bw + (n - 1) * lat)
    return np.where(nbytes > 0, t, 0.0)
