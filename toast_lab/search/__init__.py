"""Plan search (DESIGN.md §7): MCTS, with exhaustive enumeration and random search as
reference points on the same cost model."""

from ._baselines import EXHAUSTIVE_LIMIT, enumerate_choices, exhaustive, random_search
from ._search import INFEASIBLE_PENALTY, SearchProgress, SearchResult, reward, search
from ._space import Decision, Space

__all__ = ["search", "exhaustive", "random_search", "SearchResult", "SearchProgress", "Space",
           "Decision", "reward", "enumerate_choices", "EXHAUSTIVE_LIMIT", "INFEASIBLE_PENALTY"]
