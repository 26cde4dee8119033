"""The memory chart's data: a plan's live bytes per device over the step (the cost model's
MemoryTimeline), sampled for the view model.

A step of a large model has tens of thousands of ops; the chart is a few hundred pixels wide
and the view model travels with every change and is saved in notebooks and plan files. So a
step longer than MAX_SAMPLES ops is drawn from the most and the least live position of each
equal stretch of it (min-max decimation: every peak and valley a pixel column holds stays
visible), with its first and last position and the peak itself, whose bytes are exactly the
estimate's peak.
"""

from __future__ import annotations

import numpy as np

from ._viewmodel import MemoryView

MAX_SAMPLES = 400  # about one per pixel of the chart across the Lab's side panel, twice


def sample_positions(total: np.ndarray, max_samples: int = MAX_SAMPLES) -> np.ndarray:
    """The positions to draw of a step whose live bytes are `total` ([N] bytes at each
    position), ascending: all of them when N <= max_samples; else the largest and the smallest
    of each of max_samples // 2 equal stretches, the first and the last position, and the
    peak (the first position of the largest total, as the cost model reports it)."""
    n = len(total)
    if n <= max_samples:
        return np.arange(n)
    stretches = max(1, (max_samples - 3) // 2)
    bounds = np.linspace(0, n, stretches + 1).astype(np.int64)
    keep = [0, n - 1, int(np.argmax(total))]
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        if hi > lo:
            part = total[lo:hi]
            keep += [lo + int(np.argmax(part)), lo + int(np.argmin(part))]
    return np.unique(np.asarray(keep, np.int64))


def memory_view(analysis, timeline, max_samples: int = MAX_SAMPLES) -> MemoryView:
    """The MemoryView of `timeline` (CostModel.memory_timeline of a plan of `analysis`'s
    program): its positions sampled (sample_positions), bytes rounded to whole bytes, the peak
    op named."""
    at = sample_positions(timeline.total, max_samples)
    peak_op = int(timeline.peak_op)
    op = analysis.program.ops[peak_op] if peak_op >= 0 else None
    return MemoryView(
        steps=len(timeline.ops),
        positions=tuple(at.tolist()),
        ops=tuple(int(o) for o in timeline.ops[at]),
        categories={name: tuple(np.rint(values[at]).astype(np.int64).tolist())
                    for name, values in timeline.categories.items()},
        peak_position=int(timeline.peak_position), peak_op=peak_op,
        peak_bytes=float(timeline.peak_bytes),
        peak_primitive=op.primitive if op is not None else "",
        peak_source=op.source if op is not None else "",
        peak_scope=op.name_scope if op is not None else "")


__all__ = ["MAX_SAMPLES", "sample_positions", "memory_view"]
