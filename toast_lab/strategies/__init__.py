"""Expert strategies written as plans on the same cost model (DESIGN.md §7).

    plans = tl.strategies.expert(an, mesh)     # {"dp": Plan, "fsdp": Plan, "megatron": Plan, ...}
    plans.skipped                              # {"sp": "the model has no sequence class", ...}

Classes are picked by their role in the program (`toast_lab.analysis.find_roles`: the
analysis finds the roles once, and names classes by them too), never by zoo names. On a mesh
with several axes the last one is the model axis (innermost: the fastest links) unless an axis
is named like one ("model", "tensor", "tp", "mp"); the others are data axes.
"""

from __future__ import annotations

from ..analysis import Roles, find_roles
from ._expert import Strategies, expert

__all__ = ["expert", "Strategies", "Roles", "find_roles"]
