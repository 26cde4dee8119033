"""The cost model's inner loops, compiled with numba.

`evaluate_types` costs a plan over the type tables of _types.py (ragged ones as CSR: indptr +
indices), given as three small arrays; `add_temps` / `move_temps` and `peak_live` do the
liveness sweep, and `arguments_and_outputs` the argument and output bytes. CostModel._run
strings them together. The model itself is documented in _model.py. Masks are integers with
one bit per mesh axis; `ways`, `bw` and `lat` are indexed by mask.
"""

from __future__ import annotations

import numpy as np
from numba import njit

ROW_RESULT, ROW_GROUP = 0, 1
AR, AG, RS, A2A = 0, 1, 2, 3
# totals[...] layout
T_COMPUTE, T_COMM, T_FLOPS, T_TEMP, T_ARG, T_OUT, T_ALIAS, T_STATE = range(8)
NUM_TOTALS = 8


@njit(cache=True, inline="always")
def _ring(nbytes, n, bw, lat, factor):
    if nbytes <= 0.0 or n <= 1.0:
        return 0.0
    return factor * ((n - 1.0) / n * nbytes / bw + (n - 1.0) * lat)


@njit(cache=True, inline="always")
def _charge(coll, kind, mask, weight, nbytes, seconds):
    """Adds `weight` collectives of one kind over `mask`, each moving nbytes in seconds."""
    coll[kind, mask, 0] += weight
    coll[kind, mask, 1] += nbytes * weight
    coll[kind, mask, 2] += seconds * weight


@njit(cache=True)
def type_masks(mask, rank, res, vt_class, vt_tag, tag_conflict, tag_dropped, conflict_class):
    """eff[T, D] bit masks per value type and dim; vmask[T] their union.

    Where a conflict resolution drops a dim, it is replicated; where two classes want one axis,
    the class decided first (lower rank) keeps it.
    """
    T, D = vt_class.shape
    eff = np.zeros((T, D), np.int64)
    vmask = np.zeros(T, np.int64)
    ranks = np.empty(D, np.int64)
    dims = np.empty(D, np.int64)
    for t in range(T):
        n = 0
        for d in range(D):
            c = vt_class[t, d]
            if c < 0 or mask[c] == 0:
                continue
            tag = vt_tag[t, d]
            if tag >= 0:
                k = tag_conflict[tag]
                if mask[conflict_class[k]] != 0 and tag_dropped[tag, res[k]]:
                    continue
            # insertion by rank
            r = rank[c]
            j = n
            while j > 0 and ranks[j - 1] > r:
                ranks[j] = ranks[j - 1]
                dims[j] = dims[j - 1]
                j -= 1
            ranks[j] = r
            dims[j] = d
            n += 1
        used = 0
        for i in range(n):
            d = dims[i]
            m = mask[vt_class[t, d]]
            if m & used == 0:
                eff[t, d] = m
                used |= m
        vmask[t] = used
    return eff, vmask


@njit(cache=True)
def evaluate_types(mask, rank, res,
                   vt_class, vt_tag, tag_conflict, tag_dropped, conflict_class,
                   ways, bw, lat,
                   gt_ptr, gm_vt, gm_d, gt_is_reduction,
                   rt_vt, rt_d, rt_kind, rt_src_vt, rt_src_d, rt_group,
                   ot_ptr, ot_rows, ot_vt,
                   pt_weight, pt_count, pt_flops, pt_peak, pt_res_vt, pt_res_nbytes,
                   pt_gptr, pt_groups, pt_ioptr, io_vt, io_nbytes, pt_optr, po_ot, po_nbytes,
                   mem_bw, sv_ptr, si_ot, si_pt, si_pos, si_trip, si_nbytes, num_ops):
    """Everything but the liveness sweep: per-type, so cheap whatever the depth."""
    eff, vmask = type_masks(mask, rank, res, vt_class, vt_tag, tag_conflict, tag_dropped,
                            conflict_class)
    nmask = ways.shape[0]
    totals = np.zeros(NUM_TOTALS)
    coll = np.zeros((4, nmask, 3))  # count, bytes, time
    # Contractions: the axes all operands of a factor share.
    G = gt_ptr.shape[0] - 1
    consensus = np.zeros(G, np.int64)
    for g in range(G):
        c = -1
        for i in range(gt_ptr[g], gt_ptr[g + 1]):
            c &= eff[gm_vt[i], gm_d[i]]
        consensus[g] = c
    # Operand rows: what each has, what the op wants.
    R = rt_vt.shape[0]
    removed = np.zeros(R, np.int64)
    added = np.zeros(R, np.int64)
    for r in range(R):
        actual = eff[rt_vt[r], rt_d[r]]
        kind = rt_kind[r]
        if kind == ROW_RESULT:
            want = eff[rt_src_vt[r], rt_src_d[r]]
        elif kind == ROW_GROUP:
            want = consensus[rt_group[r]]
        else:
            want = 0
        removed[r] = actual & ~want
        added[r] = want & ~actual
    O = ot_ptr.shape[0] - 1
    ag = np.zeros(O, np.int64)
    a2a = np.zeros(O, np.int64)
    for o in range(O):
        rem = 0
        add = 0
        for i in range(ot_ptr[o], ot_ptr[o + 1]):
            rem |= removed[ot_rows[i]]
            add |= added[ot_rows[i]]
        ag[o] = rem & ~add
        a2a[o] = rem & add
    # Op types.
    P = pt_weight.shape[0]
    pt_compute = np.zeros(P)
    pt_comm = np.zeros(P)
    gathered = np.zeros(P)
    for p in range(P):
        w = pt_weight[p]
        gtime = 0.0
        gbytes = 0.0
        for i in range(pt_optr[p], pt_optr[p + 1]):
            ot = po_ot[i]
            pdb = po_nbytes[i] / ways[vmask[ot_vt[ot]]]
            m = ag[ot]
            if m != 0:
                b = pdb * ways[m]
                t = _ring(b, ways[m], bw[m], lat[m], 1.0)
                gtime += t
                gbytes += b
                _charge(coll, AG, m, w, b, t)
            m = a2a[ot]
            if m != 0:
                t = _ring(pdb, ways[m], bw[m], lat[m], 1.0)
                gtime += t
                gbytes += pdb
                _charge(coll, A2A, m, w, pdb, t)
        gathered[p] = gbytes
        psum = 0
        for i in range(pt_gptr[p], pt_gptr[p + 1]):
            g = pt_groups[i]
            if gt_is_reduction[g]:
                psum |= consensus[g]
        res_mask = 0
        if pt_res_vt[p] >= 0:
            res_mask = vmask[pt_res_vt[p]]
        ptime = 0.0
        if psum != 0:
            # One collective per sharded contraction factor, as XLA emits them: a weight
            # gradient contracted over batch (on `data`) and sequence (on `model`) is reduced
            # over `data`, then over `model`.
            partial = pt_res_nbytes[p] / ways[res_mask] * ways[psum & res_mask]
            # before a reduce-scatter the partial sums are whole on the scattered dims: a
            # temporary larger than the result, at this op
            gathered[p] += partial - pt_res_nbytes[p] / ways[res_mask]
            done = 0
            for i in range(pt_gptr[p], pt_gptr[p + 1]):
                g = pt_groups[i]
                m = consensus[g]
                if not gt_is_reduction[g] or m == 0 or m & done == m:
                    continue
                m &= ~done
                done |= m
                rs = m & res_mask
                ar = m & ~res_mask
                if ar != 0:
                    t = _ring(partial, ways[ar], bw[ar], lat[ar], 2.0)
                    ptime += t
                    _charge(coll, AR, ar, w, partial, t)
                if rs != 0:
                    t = _ring(partial, ways[rs], bw[rs], lat[rs], 1.0)
                    ptime += t
                    _charge(coll, RS, rs, w, partial, t)
        flops = pt_flops[p] / ways[res_mask | psum]
        traffic = 0.0
        for i in range(pt_ioptr[p], pt_ioptr[p + 1]):
            traffic += io_nbytes[i] / ways[vmask[io_vt[i]]]
        compute = max(flops / pt_peak[p], traffic / mem_bw) * w
        pt_compute[p] = compute
        pt_comm[p] = (gtime + ptime) * w
        totals[T_COMPUTE] += compute
        totals[T_COMM] += pt_comm[p]
        totals[T_FLOPS] += flops * w
    # Values read by several ops: gathered once per sharding, the buffer kept until its last
    # reader (XLA's CSE of all-gathers: FSDP gathers a weight once for forward and backward).
    gdelta = np.zeros(num_ops + 2)
    kg = np.empty(16, np.int64)
    ka = np.empty(16, np.int64)
    kbytes = np.empty(16)
    kstart = np.empty(16, np.int64)
    kend = np.empty(16, np.int64)
    for v in range(sv_ptr.shape[0] - 1):
        nk = 0
        for j in range(sv_ptr[v], sv_ptr[v + 1]):
            ot = si_ot[j]
            g = ag[ot]
            a = a2a[ot]
            if g == 0 and a == 0:
                continue
            found = -1
            for k in range(nk):
                if kg[k] == g and ka[k] == a:
                    found = k
                    break
            if found >= 0:
                kend[found] = si_pos[j] + 1
                continue
            pdb = si_nbytes[j] / ways[vmask[ot_vt[ot]]]
            w = si_trip[j]
            t_all = 0.0
            b_all = 0.0
            if g != 0:
                b = pdb * ways[g]
                t = _ring(b, ways[g], bw[g], lat[g], 1.0)
                t_all += t
                b_all += b
                _charge(coll, AG, g, w, b, t)
            if a != 0:
                t = _ring(pdb, ways[a], bw[a], lat[a], 1.0)
                t_all += t
                b_all += pdb
                _charge(coll, A2A, a, w, pdb, t)
            pt_comm[si_pt[j]] += t_all * w
            totals[T_COMM] += t_all * w
            if nk < 16:
                kg[nk] = g
                ka[nk] = a
                kbytes[nk] = b_all
                kstart[nk] = si_pos[j]
                kend[nk] = si_pos[j] + 1
                nk += 1
        for k in range(nk):
            gdelta[kstart[k]] += kbytes[k]
            gdelta[kend[k]] -= kbytes[k]
    return totals, coll, pt_compute, pt_comm, gathered, vmask, gdelta


@njit(cache=True)
def add_temps(delta, vmask, ways, temp_start, temp_end, temp_nbytes, temp_vt):
    """Adds the live range of every temporary, at its size under `vmask`, to `delta`."""
    for i in range(temp_start.shape[0]):
        s = temp_nbytes[i] / ways[vmask[temp_vt[i]]]
        delta[temp_start[i]] += s
        delta[temp_end[i]] -= s


@njit(cache=True)
def peak_live(delta, gdelta, gathered, op_type):
    """The largest live temporary bytes at any op, gathered buffers included."""
    live = 0.0
    peak = 0.0
    for n in range(op_type.shape[0]):
        live += delta[n] + gdelta[n]
        here = live + gathered[op_type[n]]
        if here > peak:
            peak = here
    return peak


@njit(cache=True)
def arguments_and_outputs(totals, vmask, ways, in_nbytes, in_vt, in_state, out_nbytes, out_vt,
                          out_is_input, donate):
    arg = 0.0
    state = 0.0
    for i in range(in_nbytes.shape[0]):
        b = in_nbytes[i] / ways[vmask[in_vt[i]]]
        arg += b
        if in_state[i]:
            state += b
    out = 0.0
    fresh = 0.0
    for i in range(out_nbytes.shape[0]):
        b = out_nbytes[i] / ways[vmask[out_vt[i]]]
        out += b
        if not out_is_input[i]:
            fresh += b
    totals[T_ARG] = arg
    # XLA returns several outputs as a tuple: a table of 8-byte buffer pointers
    totals[T_OUT] = out + (8.0 * out_nbytes.shape[0] if out_nbytes.shape[0] > 1 else 0.0)
    totals[T_STATE] = state
    totals[T_ALIAS] = min(arg, fresh) if donate else 0.0


@njit(cache=True)
def move_temps(delta, old_vmask, new_vmask, ways, by_type_ptr, by_type, temp_start, temp_end,
               temp_nbytes, temp_vt):
    """Re-sizes the live ranges of the temporaries whose value type changed sharding."""
    for t in range(old_vmask.shape[0]):
        if old_vmask[t] == new_vmask[t]:
            continue
        scale = 1.0 / ways[new_vmask[t]] - 1.0 / ways[old_vmask[t]]
        for j in range(by_type_ptr[t], by_type_ptr[t + 1]):
            i = by_type[j]
            s = temp_nbytes[i] * scale
            delta[temp_start[i]] += s
            delta[temp_end[i]] -= s
