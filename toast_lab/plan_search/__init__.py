"""Stage 7, the plan search (DESIGN.md §7): Monte Carlo Tree Search over the decisions (one per
class and conflict, ordered by bytes at stake, per-domain overrides where they matter, and the
decisions beyond sharding: remat per layer group, micro-batches; kind STEP)
around pinned ones, with a memory cap, an anytime budget, a stop event and progress callbacks,
starting from the expert strategies; exhaustive enumeration and random search are reference
points on the same cost model. Takes an Analysis, a Mesh and pins; gives a `SearchResult` (the
best plan that fits, its estimate, the history of improvements).
"""

from ._baselines import EXHAUSTIVE_LIMIT, enumerate_choices, exhaustive, random_search
from ._search import INFEASIBLE_PENALTY, StepModels, reward, search
from ._tracker import SearchProgress, SearchResult
from ._space import STEP, Decision, Space

__all__ = ["search", "exhaustive", "random_search", "SearchResult", "SearchProgress", "Space",
           "Decision", "STEP", "StepModels", "reward", "enumerate_choices", "EXHAUSTIVE_LIMIT",
           "INFEASIBLE_PENALTY"]
