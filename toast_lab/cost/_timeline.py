"""Live bytes per device over one step, by category: the picture behind the estimate's peak.

The cost model's peak is the largest, over the ops in the order the compiler runs them, of the
arguments, the outputs and everything live at that op (MemoryTables, _kernel/_memory.py).
`memory_timeline` gives that sum at every op, split the way a chart stacks it, so that a view
can show where the peak is and what makes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# the categories, bottom of the stack first
CATEGORIES = ("parameters and optimizer state", "other arguments", "outputs", "temporaries",
              "gathered and resharded buffers")


@dataclass(frozen=True, eq=False)
class MemoryTimeline:
    """Live bytes per device at each op of one plan's step.

    ops: [N] the op id at each position, in the order the compiler runs them;
    categories: {name in CATEGORIES: [N] bytes at each position} — parameters and optimizer
    state and other arguments (live throughout), outputs (their buffers, less those donated
    arguments hold, less those not written yet, whose space holds temporaries), temporaries
    (values written to memory while live), gathered and resharded buffers (what the plan's
    collectives make, and what an op holds while it runs);
    peak_position, peak_op: where the sum is largest; peak_bytes: that sum, the estimate's
    peak_memory_bytes.
    """

    ops: np.ndarray
    categories: dict = field(default_factory=dict)
    peak_position: int = 0
    peak_op: int = -1
    peak_bytes: float = 0.0

    @property
    def total(self) -> np.ndarray:
        """[N] bytes live at each position, all categories."""
        return sum(self.categories.values(), np.zeros(len(self.ops)))

    def at(self, position: int) -> dict:
        """{category: bytes} at one position."""
        return {k: float(v[position]) for k, v in self.categories.items()}


def memory_timeline(temps, added, outputs, held, result, position) -> MemoryTimeline:
    """The MemoryTimeline of one kernel run (_kernel.live_bytes: deltas [N + 2] of the
    temporaries, of the buffers the plan adds and of the outputs, bytes held at each op [N],
    the RESULT record) under the compiler's order `position` ([N] each op's place)."""
    n = len(held)
    ops = np.empty(n, np.int64)
    ops[position] = np.arange(n)
    state = float(result["state_bytes"])
    arguments = float(result["argument_bytes"])
    out = float(result["output_bytes"]) - float(result["alias_bytes"])
    categories = {
        CATEGORIES[0]: np.full(n, state),
        CATEGORIES[1]: np.full(n, arguments - state),
        CATEGORIES[2]: out + np.cumsum(outputs[:n]),
        CATEGORIES[3]: np.cumsum(temps[:n]),
        CATEGORIES[4]: np.cumsum(added[:n]) + held,
    }
    total = sum(categories.values(), np.zeros(n))
    peak = int(np.argmax(total)) if n else 0
    return MemoryTimeline(ops, categories, peak, int(ops[peak]) if n else -1,
                          float(total[peak]) if n else arguments + out)
