"""The overlap schedule's tables (ScheduleTables, _tables.py): program order, where each op's
operands are ready and its results first read, loop bodies, and the shared reads in order."""

from __future__ import annotations

import numpy as np

from ._tables import ScheduleTables


def schedule_tables(st, ty) -> ScheduleTables:
    """The ScheduleTables of static tables `st` and types `ty` (_kernel/_schedule.py reads
    them)."""
    reads, passes = ty.tables.shared_reads, st.passes
    order = np.argsort(reads["position"], kind="stable").astype(np.int64)
    event = passes.body_first | (passes.body_last_trip > 1.0)  # where the walk has more to do
    event[reads["position"]] = True
    return ScheduleTables(op_type=ty.op_type, ready=passes.ready, ready_first=passes.ready,
                          deadline=passes.deadline,
                          body_first=passes.body_first, body_last_trip=passes.body_last_trip,
                          nested=passes.nested.astype(np.float64),
                          event=event, body_is_run=np.zeros(len(event), bool),
                          read_slot=order,
                          read_at=reads["position"][order].astype(np.int64))
