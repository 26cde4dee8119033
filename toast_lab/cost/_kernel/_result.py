"""What one evaluation of a plan gives: the totals, as a record with named fields.

The kernel adds into a float array indexed by the T_* constants (the fields of RESULT, in
order), and hands it back viewed as one RESULT record: `result["compute_s"]`.
"""

from __future__ import annotations

import numpy as np

RESULT = np.dtype([
    ("compute_s", np.float64),          # compute seconds per step, every op's roofline
    ("communication_s", np.float64),    # every collective's seconds, hidden or not
    ("flops", np.float64),              # per device per step
    ("temp_bytes", np.float64),         # the peak of live temporaries (and gathered buffers)
    ("argument_bytes", np.float64),     # per device
    ("output_bytes", np.float64),       # per device, with XLA's tuple of output pointers
    ("alias_bytes", np.float64),        # outputs written into donated argument buffers
    ("state_bytes", np.float64),        # the arguments that are training state
    ("scheduled_s", np.float64),        # the step with collectives overlapped as XLA does
    ("exposed_s", np.float64),          # the communication that overlap leaves exposed
    ("flops_loop_bodies_once", np.float64),  # flops counting a loop body once
])
T_COMPUTE, T_COMM, T_FLOPS, T_TEMP, T_ARG, T_OUT, T_ALIAS, T_STATE, T_SCHEDULED, T_EXPOSED, \
    T_FLOPS_ONCE = range(11)
NUM_TOTALS = len(RESULT.names)


def as_result(totals: np.ndarray) -> np.void:
    """The totals array of one evaluation as a RESULT record."""
    return totals.view(RESULT)[0]
