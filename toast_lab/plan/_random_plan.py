"""Random valid plans for property tests and the fidelity benchmark.

Wider than the search space (search/_space.py): classes are decided in a random order and get
*ordered* axis tuples, so export is exercised on plans the search would never produce. Random
search, the search's baseline, draws from the search space instead (search/_baselines.py).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..analysis import DOMAINS
from ._plan import Plan


def random_plan(analysis, mesh, rng: np.random.Generator, shard_prob: float = 0.5,
                override_prob: float = 0.0) -> Plan:
    """A random plan that `plan.validate(mesh)` accepts.

    Classes are decided in a random order (the order breaks ties where two classes want one
    mesh axis on a value, see Plan). Each class, with probability `shard_prob`, gets a random
    non-empty ordered subset of the mesh axes whose sizes multiply to a divisor of the class
    size, drawn uniformly from all such subsets (it stays replicated when there is none); then,
    with probability `override_prob`, an override in a random domain with random axes (possibly
    none: replicated there). Every conflict gets one of its resolutions, uniformly. The same
    rng state gives the same plan (and, with override_prob=0, the same as before overrides).
    """
    if not 0.0 <= shard_prob <= 1.0:
        raise ValueError(f"shard_prob must be within [0, 1], got {shard_prob}")
    if not 0.0 <= override_prob <= 1.0:
        raise ValueError(f"override_prob must be within [0, 1], got {override_prob}")
    choices = _ordered_axis_subsets(mesh)
    plan = Plan.replicated(analysis)
    for i in rng.permutation(len(analysis.classes)):
        cls = analysis.classes[int(i)]
        fitting = [axes for axes, ways in choices if cls.size % ways == 0]
        if rng.random() < shard_prob and fitting:
            plan = plan.with_axes(cls.id, fitting[int(rng.integers(len(fitting)))])
        if override_prob and rng.random() < override_prob:
            options = [()] + fitting
            domain = DOMAINS[int(rng.integers(len(DOMAINS)))]
            plan = plan.with_axes(cls.id, options[int(rng.integers(len(options)))],
                                  domain=domain)
    for conflict in analysis.conflicts:
        options = conflict.resolutions
        plan = plan.with_resolution(conflict.id, options[int(rng.integers(len(options)))])
    return plan.validate(mesh)


def _ordered_axis_subsets(mesh) -> list[tuple[tuple[str, ...], int]]:
    """(axes, devices they span) for every non-empty ordered subset of the mesh axes."""
    names = mesh.axis_names
    out = []
    for k in range(1, len(names) + 1):
        for axes in itertools.permutations(names, k):
            out.append((axes, math.prod(mesh.axis_size(a) for a in axes)))
    return out
