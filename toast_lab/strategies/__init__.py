"""Expert strategies written as plans on the same cost model (DESIGN.md §7).

    plans = tl.strategies.expert(an, mesh)     # {"dp": Plan, "fsdp": Plan, "megatron": Plan, ...}
    plans.skipped                              # {"sp": "the model has no sequence class", ...}
    plans.variant_of                           # {"fsdp (remat full)": "fsdp", ...}

Classes are picked by their role in the program (`toast_lab.analysis.find_roles`: the
analysis finds the roles once, and names classes by them too), never by zoo names. On a mesh
with several axes the last one is the model axis (innermost: the fastest links) unless an axis
is named like one ("model", "tensor", "tp", "mp"); the others are data axes.

Where a strategy's plan does not fit in memory as written, the strategies also offer it with
its recipe's remat and micro-batches, as MaxText and torchtitan climb them
(`remat_ladder(an)`: "minimal" remat, "full" remat, then gradient accumulation), the first
rung that fits, named after the strategy: "fsdp (remat minimal)",
"megatron (remat full, 4 micro-batches)". `faster_with_remat(plan, mesh, cap, model)`: a plan
that fits as written with the remat rung that makes it faster, where one does.
"""

from __future__ import annotations

from ..analysis import Roles, find_roles
from ._expert import Strategies, expert
from ._ladder import faster_with_remat, remat_ladder

__all__ = ["expert", "Strategies", "Roles", "find_roles", "remat_ladder", "faster_with_remat"]
