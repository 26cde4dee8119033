"""The cost model: per-device step time and memory of a plan (DESIGN.md §6)."""

from __future__ import annotations

from ._estimate import COLLECTIVE_KINDS, CollectiveCost, Estimate
from ._model import CostModel


def estimate(analysis, plan, mesh, donate: bool = False, overlap: bool = False) -> Estimate:
    """Step time and peak memory per device of `plan` on `mesh`.

    Builds a CostModel (cached on the analysis per mesh and options); for many plans on one
    mesh, use `CostModel(analysis, mesh)` and its `estimate(plan)` directly.
    """
    cache = analysis.__dict__.setdefault("_cost_models", {})
    key = (mesh, donate, overlap)
    model = cache.get(key)
    if model is None:
        model = cache[key] = CostModel(analysis, mesh, donate=donate, overlap=overlap)
    return model.estimate(plan)


__all__ = ["estimate", "Estimate", "CostModel", "CollectiveCost", "COLLECTIVE_KINDS"]
