"""The cost model: per-device step time and memory of a plan (DESIGN.md §6)."""

from __future__ import annotations

from ._estimate import COLLECTIVE_KINDS, CollectiveCost, Estimate
from ._model import CostModel


def model_for(analysis, mesh, donate: bool = False, overlap: bool = False) -> CostModel:
    """The CostModel of `analysis` on `mesh`, built once and cached on the analysis."""
    cache = analysis.__dict__.setdefault("_cost_models", {})
    key = (mesh, donate, overlap)
    model = cache.get(key)
    if model is None:
        model = cache[key] = CostModel(analysis, mesh, donate=donate, overlap=overlap)
    return model


def estimate(analysis, plan, mesh, donate: bool = False, overlap: bool = False) -> Estimate:
    """Step time and peak memory per device of `plan` on `mesh` (see CostModel)."""
    return model_for(analysis, mesh, donate, overlap).estimate(plan)


__all__ = ["estimate", "model_for", "Estimate", "CostModel", "CollectiveCost", "COLLECTIVE_KINDS"]
