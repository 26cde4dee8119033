"""Repeated blocks of the program, found once, so that a plan costs the same whatever the depth.

Grouped layers cost one type each (_types.py), but the sweeps over the program (the overlap
schedule, the live bytes at each op) and the values read by several ops still walk every
position: a 96-layer step has eight times the positions of a 12-layer one. Those positions
repeat: a transformer's forward pass is one layer's ops, once per layer, in the same order,
with the same temporaries starting and ending at the same offsets; so is its backward pass and
its optimizer update. A *run* is such a block of positions repeated `copies` times in a row.

`find_runs` finds them from a key per position (what the sweeps do there, in plan-independent
terms). `PositionMap` then maps each position to a *compressed* position: a run keeps one copy
(its first), everything else stays as it is. A sweep over the compressed positions gives the
same answer as over all of them when what happens at each position of a run is the same in
every copy (which the keys ensure): the live bytes after copy i of a run are those before it
plus i times one copy's net change, so the peak over the copies is at the first or the last,
and the schedule walks a run the way it walks a loop (_kernel/_schedule.py).

What each compressed position stands for is counted once: an event (a temporary starting, a
buffer freed) at a position of the first copy or outside every run is *counted*; the same
event in a later copy is the first copy's again and is dropped; an event counted at a
position outside the runs adds up every copy's (a gradient of every layer freed at the
optimizer's end).

Only runs of at least MIN_COPIES copies are compressed: shorter ones save little, and a step
of a few layers keeps every figure summed position by position.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MIN_COPIES = 4
# The longest block looked for, in positions (a layer's forward or backward ops).
MAX_PERIOD = 8192
# How many later occurrences of a position's key are tried as the period of a run there.
CANDIDATES = 6


@dataclass(frozen=True)
class Run:
    """Positions [start, start + length * copies): one block of `length`, `copies` times."""

    start: int
    length: int
    copies: int

    @property
    def end(self) -> int:
        return self.start + self.length * self.copies


def _hashes(x: np.ndarray):
    """Prefix hashes of the int sequence x (mod 2**64) and the powers of their base, for
    comparing windows in O(1) (a match is confirmed element by element)."""
    base = np.uint64(0x9E3779B97F4A7C15)
    n = len(x)
    h = np.zeros(n + 1, np.uint64)
    p = np.ones(n + 1, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):  # (a Python loop: once per program, ~1 s per million positions)
            h[i + 1] = h[i] * base + np.uint64(x[i]) + np.uint64(1)
            p[i + 1] = p[i] * base
    return h, p


def find_runs(keys, min_copies: int = MIN_COPIES) -> tuple[Run, ...]:
    """The runs of `keys` (one hashable per position), left to right, each as long as it goes:
    at each position the period that covers the most positions (ties: the shortest) among the
    distances to the next few positions of the same key."""
    ids: dict = {}
    x = np.array([ids.setdefault(k, len(ids)) for k in keys], np.int64)
    n = len(x)
    if n == 0:
        return ()
    h, p = _hashes(x)

    def window(i, length):
        with np.errstate(over="ignore"):
            return h[i + length] - h[i] * p[length]

    later: dict[int, list[int]] = {}
    for i in range(n - 1, -1, -1):
        later.setdefault(int(x[i]), []).append(i)
    for positions in later.values():
        positions.reverse()
    where = {}
    for key, positions in later.items():
        for rank, i in enumerate(positions):
            where[i] = (key, rank)
    runs = []
    i = 0
    while i < n:
        key, rank = where[i]
        best = (0, 0)  # (positions covered, -length)
        for j in later[key][rank + 1:rank + 1 + CANDIDATES]:
            length = j - i
            if length > MAX_PERIOD or i + min_copies * length > n:
                break
            first = window(i, length)
            copies = 1
            while i + (copies + 1) * length <= n and window(i + copies * length, length) == first:
                copies += 1
            if copies >= min_copies and (copies * length, -length) > best:
                block = x[i:i + length]
                if all(np.array_equal(block, x[i + c * length:i + (c + 1) * length])
                       for c in range(1, copies)):
                    best = (copies * length, -length)
        if best[0]:
            length = -best[1]
            runs.append(Run(i, length, best[0] // length))
            i += best[0]
        else:
            i += 1
    return tuple(runs)


@dataclass(frozen=True, eq=False)
class PositionMap:
    """Positions [0, n) (and n, n + 1: past the end) mapped to compressed positions.

    compressed[p]: the compressed position of p; counted[p]: whether an event at p counts
    (p outside every run or in a run's first copy); runs: the runs; run_start[r]: where run r's
    copy starts among the compressed positions; size: how many compressed positions (past
    the end: size and size + 1)."""

    n: int
    runs: tuple[Run, ...]
    compressed: np.ndarray
    counted: np.ndarray
    run_start: np.ndarray
    size: int

    @property
    def trivial(self) -> bool:
        return not self.runs


def position_map(n: int, runs: tuple[Run, ...] = ()) -> PositionMap:
    """The PositionMap of n positions with `runs` (none: every position its own)."""
    compressed = np.empty(n + 2, np.int64)
    counted = np.ones(n + 2, bool)
    run_start = np.empty(len(runs), np.int64)
    c = 0
    at = 0
    for r, run in enumerate(runs):
        compressed[at:run.start] = np.arange(c, c + run.start - at)
        c += run.start - at
        run_start[r] = c
        offsets = np.arange(run.length * run.copies) % run.length
        compressed[run.start:run.end] = c + offsets
        counted[run.start + run.length:run.end] = False
        c += run.length
        at = run.end
    compressed[at:n] = np.arange(c, c + n - at)
    c += n - at
    compressed[n], compressed[n + 1] = c, c + 1
    return PositionMap(n, tuple(runs), compressed, counted, run_start, c)
