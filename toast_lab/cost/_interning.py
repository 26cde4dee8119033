"""Small helpers the type builders share (_types.py, _op_types.py, _shared_reads.py): numbering
distinct keys in the order first seen, runs of members, and record arrays from columns."""

from __future__ import annotations

import numpy as np


class Interner(dict):
    """{key: its number}, numbered 0, 1, ... in the order keys are first seen."""

    def id(self, key) -> int:
        i = self.get(key)
        if i is None:
            i = self[key] = len(self)
        return i


def records(dtype, **columns) -> np.ndarray:
    """A record array of `dtype` whose named fields are `columns` (equal lengths)."""
    n = len(next(iter(columns.values())))
    out = np.zeros(n, dtype)
    for name, column in columns.items():
        out[name] = column
    return out


def runs(lists) -> tuple[np.ndarray, np.ndarray, list]:
    """(start, end, flattened members) of a list of member lists."""
    lengths = np.array([len(lst) for lst in lists], np.int64)
    end = np.cumsum(lengths)
    return end - lengths, end, [m for lst in lists for m in lst]
