"""The search tree as data (in the manner of mctx): preallocated arrays, one row per node.

Shapes (N = capacity, C = the most choices any decision has):
    parent  [N]     int32   the parent node (NO_PARENT at the root)
    action  [N]     int32   the choice that led here from the parent
    depth   [N]     int32   how many decisions are fixed at this node
    visits  [N]     int64   simulations through this node
    value   [N]     float64 the best reward seen below this node (max backup: the search
                            optimizes one deterministic objective, so a node is as good as
                            the best plan under it)
    total   [N]     float64 the sum of rewards below (for the mean, reported in stats)
    children[N, C]  int32   child per choice, UNEXPANDED where none yet
A transposition table maps a partial assignment to its node, so the same assignment reached
in different orders (decisions skipped as irrelevant) shares one set of statistics.
"""

from __future__ import annotations

import numpy as np

NO_PARENT = -1
UNEXPANDED = -1


class Tree:
    def __init__(self, capacity: int, max_choices: int):
        self.parent = np.full(capacity, NO_PARENT, np.int32)
        self.action = np.full(capacity, -1, np.int32)
        self.depth = np.zeros(capacity, np.int32)
        self.visits = np.zeros(capacity, np.int64)
        self.value = np.full(capacity, -np.inf)
        self.total = np.zeros(capacity)
        self.children = np.full((capacity, max_choices), UNEXPANDED, np.int32)
        self.size = 1  # node 0 is the root
        self.table: dict[tuple, int] = {(): 0}

    def grow(self) -> None:
        cap = len(self.parent) * 2
        for name in ("parent", "action", "depth", "visits", "value", "total"):
            old = getattr(self, name)
            new = np.empty(cap, old.dtype)
            new[:len(old)] = old
            fill = {"parent": NO_PARENT, "action": -1, "value": -np.inf}.get(name, 0)
            new[len(old):] = fill
            setattr(self, name, new)
        ch = np.full((cap, self.children.shape[1]), UNEXPANDED, np.int32)
        ch[:len(self.children)] = self.children
        self.children = ch

    def child(self, node: int, choice: int, key: tuple) -> tuple[int, bool]:
        """The child of `node` for `choice` (created if new); True when it was created."""
        c = self.children[node, choice]
        if c != UNEXPANDED:
            return int(c), False
        existing = self.table.get(key)
        if existing is not None:  # reached before by another order
            self.children[node, choice] = existing
            return existing, False
        if self.size == len(self.parent):
            self.grow()
        c = self.size
        self.size += 1
        self.parent[c] = node
        self.action[c] = choice
        self.depth[c] = self.depth[node] + 1
        self.children[node, choice] = c
        self.table[key] = c
        return c, True
