"""The memory sweep, the overlap schedule and the shared reads over compressed positions: each
run of repeated blocks (_repeats.py) kept once.

Applied where the compiler runs the ops in program order and reduces partial sums as they come
(CompilerProfile: GPU, TPU); XLA:CPU's breadth-first schedule and combined all-reduces tie
distant layers together, and its tables stay position by position.

- Positions: found from a key per position of what the sweeps meet there (the op's type, the
  temporaries starting and ending, the outputs written, the shared reads); runs containing a
  loop are not compressed (the schedule walks a run the way it walks a loop body).
- Temporaries and outputs: each record moves to its compressed positions and counts its start
  and end where they are counted (PositionMap.counted); records alike are merged, their
  weights added.
- Shared reads: values whose reads are alike, read at the same compressed positions in the same
  order (one per repeated layer), form a class priced once with its reads' `trip` counting
  every member; its buffers start and end at the compressed positions, weighted by the members
  counted there. The schedule meets each member's counted reads.
"""

from __future__ import annotations

from collections import defaultdict
from typing import NamedTuple

import numpy as np

from ._repeats import MIN_COPIES, PositionMap, find_runs, position_map
from ._tables import INPUT, OUTPUT, RUN, SHARED_READ, SPAN, TEMP, TEMP_SLICES

_I = np.int64


class Compressed(NamedTuple):
    """What compression gives: the position map, the compressed MemoryTables, ScheduleTables,
    shared values and reads, and for each of Static's operands its shared read (class slot)
    and the share of that slot's charges it pays (1 / the class's members)."""

    positions: PositionMap
    memory: object
    schedule: object
    shared_values: np.ndarray
    shared_reads: np.ndarray
    operand_read: np.ndarray
    read_share: np.ndarray


def compress(memory, schedule, types, min_copies: int = MIN_COPIES) -> Compressed | None:
    """The Compressed tables of a model whose memory order is program order, or None where no
    run is worth compressing."""
    runs = _runs(memory, schedule, types, min_copies)
    if not runs:
        return None
    pm = position_map(len(memory.op_type), runs)
    values, reads, schedule_reads, slot_of, share = _read_classes(types, pm)
    return Compressed(pm, _memory(memory, pm), _schedule(schedule, pm, reads, schedule_reads),
                      values, reads, _slots(types.operand_read, slot_of), share)


def _runs(memory, schedule, types, min_copies):
    """The runs of the positions' keys (the op type, the temporaries' and outputs' events,
    the shared reads), without those containing a loop body's first or last op."""
    n = len(memory.op_type)
    events = [[] for _ in range(n + 2)]
    for t in memory.temps:
        key = (int(t["value_type"]), float(t["nbytes"]), float(t["min_nbytes"]))
        events[t["start"]].append((0, *key, 1))
        events[t["end"]].append((0, *key, -1))
    for o in memory.outputs:
        events[o["position"]].append((1, int(o["value_type"]), float(o["nbytes"]),
                                      int(o["alias_type"])))
    values, reads = types.tables.shared_values, types.tables.shared_reads
    for v in range(len(values)):
        span = reads[values[v]["start"]:values[v]["end"]]
        signature = _read_signature(span)
        for j, r in enumerate(span):
            events[r["position"]].append((2, signature, j))
    loop = schedule.body_first | (schedule.body_last_trip > 1.0)
    # and without those inside a loop body (unrolled blocks in a micro-batch loop): the
    # schedule walks a run as a loop of its own, and it walks one loop at a time
    last = schedule.body_last_trip > 0.0
    inside = (np.cumsum(schedule.body_first) - np.concatenate(([0], np.cumsum(last)[:-1]))) > 0
    keys = [(int(memory.op_type[p]), bool(loop[p]), tuple(sorted(events[p])))
            for p in range(n)]
    return tuple(r for r in find_runs(keys, min_copies)
                 if not (loop[r.start:r.end].any() or inside[r.start:r.end].any()))


def _memory(memory, pm: PositionMap):
    """The MemoryTables over compressed positions."""
    at, counted = pm.compressed, pm.counted.astype(np.float64)
    merged = defaultdict(lambda: [0.0, 0.0])
    for t in memory.temps:
        key = (int(at[t["start"]]), int(at[t["end"]]), float(t["nbytes"]),
               int(t["value_type"]), float(t["min_nbytes"]))
        merged[key][0] += counted[t["start"]] * t["start_weight"]
        merged[key][1] += counted[t["end"]] * t["end_weight"]
    temps = np.array([(*k, *w) for k, w in merged.items() if w[0] or w[1]], TEMP).reshape(-1)
    order = np.argsort(temps["value_type"], kind="stable").astype(_I)
    counts = np.bincount(temps["value_type"], minlength=len(memory.temps_by_type))
    ends = np.cumsum(counts)
    by_type = np.zeros(len(counts), SPAN)
    by_type["start"], by_type["end"] = ends - counts, ends
    slices = np.zeros(len(temps), TEMP_SLICES)
    slices["whole_end"] = temps["end"]
    runs = np.array([(pm.run_start[i], r.length, r.copies) for i, r in enumerate(pm.runs)],
                    RUN).reshape(-1)
    return memory._replace(
        op_type=_at_compressed(memory.op_type, pm), temps=temps, temps_by_type=by_type,
        temps_of_type=order, temp_slices=slices, inputs=_inputs(memory.inputs),
        outputs=_outputs(memory.outputs, pm), runs=runs)


def _at_compressed(per_position: np.ndarray, pm: PositionMap) -> np.ndarray:
    """[size] the values of a per-position array at each compressed position (a run's first
    copy for its block)."""
    out = np.empty(pm.size, per_position.dtype)
    first = pm.counted[:pm.n]
    out[pm.compressed[:pm.n][first]] = per_position[first]
    return out


def _inputs(inputs) -> np.ndarray:
    """INPUT records merged: one per size, value type and kind, counting its arguments."""
    merged = defaultdict(float)
    for i in inputs:
        merged[(float(i["nbytes"]), int(i["value_type"]), bool(i["is_state"]))] += i["count"]
    return np.array([(*k, c) for k, c in merged.items()], INPUT).reshape(-1)


def _outputs(outputs, pm: PositionMap) -> np.ndarray:
    """OUTPUT records at compressed positions, merged with their weights added."""
    merged = defaultdict(lambda: [0.0, 0.0, 0.0])
    for o in outputs:
        p = int(o["position"])
        key = (float(o["nbytes"]), int(o["value_type"]), int(pm.compressed[p]) if p else 0,
               int(o["alias_type"]))
        w = merged[key]
        w[0] += o["count"]
        w[1] += pm.counted[p] * o["position_weight"]
        w[2] += o["zero_weight"]
    rows = [(nbytes, vt, p, c, wp, wz, alias) for (nbytes, vt, p, alias), (c, wp, wz)
            in merged.items()]
    return np.array(rows, OUTPUT).reshape(-1)


def _schedule(schedule, pm: PositionMap, reads, schedule_reads):
    """The ScheduleTables over compressed positions: a run is walked as a loop of `copies`
    trips (its first position the body's first, its last the body's last)."""
    at = pm.compressed
    ready = np.where(_periodic(schedule.ready, pm), at[np.maximum(schedule.ready, 0)], -1)
    deadline = np.where(_periodic(schedule.deadline, pm), at[schedule.deadline], pm.size)
    # a run's first copy's operands may come from before it (ready_first); every other copy's
    # from the copy before it: the walk before
    ready_first = _at_compressed(ready, pm)
    ready_c = ready_first.copy()
    for i, run in enumerate(pm.runs):
        second = ready[run.start + run.length:run.start + 2 * run.length]
        ready_c[pm.run_start[i]:pm.run_start[i] + run.length] = second
    body_first = _at_compressed(schedule.body_first, pm)
    trip = _at_compressed(schedule.body_last_trip, pm)
    is_run = np.zeros(pm.size, bool)
    for i, run in enumerate(pm.runs):
        body_first[pm.run_start[i]] = True
        trip[pm.run_start[i] + run.length - 1] = run.copies
        is_run[pm.run_start[i] + run.length - 1] = True
    slot, position = (np.array(x, _I) for x in zip(*schedule_reads)) if schedule_reads \
        else (np.zeros(0, _I), np.zeros(0, _I))
    order = np.argsort(position, kind="stable")
    event = body_first | (trip > 1.0)
    event[position] = True
    return schedule._replace(
        op_type=_at_compressed(schedule.op_type, pm), ready=ready_c, ready_first=ready_first,
        deadline=_at_compressed(deadline, pm), body_first=body_first,
        body_last_trip=trip, nested=_at_compressed(schedule.nested, pm), event=event,
        body_is_run=is_run, read_slot=slot[order],
        read_at=position[order])


def _periodic(target: np.ndarray, pm: PositionMap) -> np.ndarray:
    """[n] bool: where position p's reference `target[p]` (a position, or -1 / n: none) can be
    kept among compressed positions: p outside every run, or the reference as far from p in
    every copy of p's run (an op of the same layer, or of the one before). A reference that is
    not (a backward op reading what the forward pass made long before, its mirror layer's; a
    gradient first read by the optimizer) is dropped: the value was made long before, or the
    reduction is waited for at the step's end."""
    p = np.arange(pm.n)
    ok = np.ones(pm.n, bool)
    for run in pm.runs:
        block = slice(run.start, run.end)
        offset = target[block] - p[block]
        first = offset[:run.length]
        same = (offset.reshape(run.copies, run.length) == first).all(axis=0)
        valid = (target[block] >= 0).reshape(run.copies, run.length).all(axis=0)
        ok[block] = np.tile(same & valid, run.copies)
    return ok


def _read_signature(reads) -> tuple:
    """What pricing a shared value's reads (SHARED_READ records, in program order) reads of
    them, but their positions: two values of one signature are resharded and kept alike under
    every plan."""
    pins = {p: k for k, p in enumerate(dict.fromkeys(reads["pinned"].tolist()))}
    copies = {c: k for k, c in enumerate(dict.fromkeys(reads["copy_of"].tolist())) if c >= 0}
    return tuple((int(r["operand_type"]), int(r["op_type"]), float(r["trip"]),
                  float(r["nbytes"]), bool(r["early"]), pins[int(r["pinned"])],
                  copies.get(int(r["copy_of"]), -1)) for r in reads)


def _value_key(reads, pm: PositionMap):
    """The key of one shared value's reads (SHARED_READ records, in program order): what the
    pricing and the memory sweep read of each, with its positions compressed and the order of
    its start and end candidates (so that every member of a class picks the same read)."""
    at = pm.compressed
    ready = reads["ready"]
    ends = np.where(reads["copy_of"] < 0, reads["memory_position"] + 1, reads["ready"] + 1)
    ready_rank = np.unique(ready, return_inverse=True)[1]
    end_rank = np.unique(np.r_[reads["memory_position"] + 1, ends], return_inverse=True)[1]
    return _read_signature(reads) + tuple(
        (int(at[r["position"]]), int(at[r["ready"]]), int(at[r["memory_position"] + 1]),
         int(at[r["ready"] + 1]), int(ready_rank[j]), int(end_rank[j]),
         int(end_rank[len(reads) + j])) for j, r in enumerate(reads))


def _read_classes(types, pm: PositionMap):
    """(SPAN records per class, its SHARED_READ slots, the schedule's (slot, compressed
    position) of every counted read, each uncompressed read's slot, each slot's share)."""
    values, reads = types.tables.shared_values, types.tables.shared_reads
    classes: dict = {}
    for v in range(len(values)):
        span = reads[values[v]["start"]:values[v]["end"]]
        classes.setdefault(_value_key(span, pm), []).append(v)
    out_values = np.zeros(len(classes), SPAN)
    slots, schedule_reads = [], []
    slot_of = np.empty(len(reads), _I)
    share = []
    counted = pm.counted
    at = pm.compressed
    for c, members in enumerate(classes.values()):
        first = values[members[0]]
        out_values[c] = (len(slots), len(slots) + first["end"] - first["start"])
        for j in range(first["end"] - first["start"]):
            member_reads = [reads[values[v]["start"] + j] for v in members]
            rep = member_reads[0].copy()
            rep["trip"] = rep["trip"] * len(members)
            rep["position"] = at[rep["position"]]
            rep["ready_at"], rep["end_at"] = at[rep["ready"]], at[rep["memory_position"] + 1]
            rep["ready_end_at"] = at[rep["ready"] + 1]
            rep["ready_weight"] = sum(counted[r["ready"]] for r in member_reads)
            rep["end_weight"] = sum(counted[r["memory_position"] + 1] for r in member_reads)
            rep["ready_end_weight"] = sum(counted[r["ready"] + 1] for r in member_reads)
            for v in members:
                slot_of[values[v]["start"] + j] = len(slots)
            schedule_reads += [(len(slots), int(at[r["position"]])) for r in member_reads
                               if counted[r["position"]]]
            slots.append(rep)
            share.append(1.0 / len(members))
    return (out_values, np.array(slots, SHARED_READ).reshape(-1), schedule_reads, slot_of,
            np.array(share))


def _slots(operand_read: np.ndarray, slot_of: np.ndarray) -> np.ndarray:
    """Static's operands' shared reads, as class slots (-1 stays -1)."""
    if len(slot_of) == 0:  # no shared reads: nothing to map
        return np.full_like(operand_read, -1)
    return np.where(operand_read >= 0, slot_of[np.maximum(operand_read, 0)], -1)
