"""The user's mesh: which mesh axes a group of global device ids spans (DESIGN.md §9).

XLA's groups are matched against the user's mesh, not XLA's own: `device_grid` says which
global device id sits at each mesh position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np


@dataclass(frozen=True)
class _MeshGrid:
    """The user's mesh: which (global) device id sits at which mesh coordinates."""

    axis_names: tuple[str, ...]
    shape: tuple[int, ...]
    coords: Mapping[int, tuple[int, ...]]

    @staticmethod
    def of(device_grid: Any, axis_names: Sequence[str]) -> _MeshGrid:
        grid = np.asarray(device_grid)
        names = tuple(axis_names)
        if grid.ndim != len(names):
            raise ValueError(
                f"device_grid has {grid.ndim} dimensions {grid.shape} but {len(names)} axis "
                f"names {names} were given; give one name per mesh dimension."
            )
        coords = {int(grid[index]): index for index in np.ndindex(grid.shape)}
        if len(coords) != grid.size:
            raise ValueError(f"device_grid repeats device ids:\n{grid}")
        return _MeshGrid(names, grid.shape, coords)

    def axes_of_groups(self, groups: Sequence[Sequence[int]]) -> tuple[str, ...]:
        """The mesh axes each group spans, if every group is a whole slice along the same axes."""
        spanned: set[int] | None = None
        for group in groups:
            if any(d not in self.coords for d in group) or len(set(group)) != len(group):
                return ()
            points = np.array([self.coords[d] for d in group])
            varying = {k for k in range(len(self.shape)) if len(set(points[:, k])) > 1}
            if spanned is None:
                spanned = varying
            if varying != spanned or len(group) != math.prod(self.shape[k] for k in varying):
                return ()
        return tuple(self.axis_names[k] for k in sorted(spanned or ()))

    def axes_of_pairs(self, pairs: Sequence[tuple[int, int]]) -> tuple[str, ...]:
        """The mesh axes along which a permutation moves data."""
        moved: set[int] = set()
        for source, target in pairs:
            if source not in self.coords or target not in self.coords:
                return ()
            moved |= {
                k
                for k, (a, b) in enumerate(zip(self.coords[source], self.coords[target]))
                if a != b
            }
        return tuple(self.axis_names[k] for k in sorted(moved))
