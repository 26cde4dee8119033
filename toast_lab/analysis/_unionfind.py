"""A growable union-find over integer nodes, with path halving and union by size."""

from __future__ import annotations


class UnionFind:
    __slots__ = ("parent", "size")

    def __init__(self, n: int = 0):
        self.parent = list(range(n))
        self.size = [1] * n

    def add(self) -> int:
        node = len(self.parent)
        self.parent.append(node)
        self.size.append(1)
        return node

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, a: int, b: int) -> int:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return ra
        if self.size[ra] < self.size[rb]:
            ra, rb = rb, ra
        self.parent[rb] = ra
        self.size[ra] += self.size[rb]
        return ra

    def union_all(self, nodes) -> None:
        it = iter(nodes)
        first = next(it, None)
        for n in it:
            self.union(first, n)
