"""toast-lab: automatic, inspectable sharding plans for JAX programs.

This module is the one place that says what is public.
"""

from . import rules, strategies, zoo
from .search import SearchProgress, SearchResult, exhaustive, random_search, search
from ._analysis import Analysis, ToastWarning, UnknownPrimitiveError, analyze
from ._classes import REPLICATE, Conflict, ConflictSide, DimClass
from ._hardware import DeviceSpec, Link, devices, get_device
from ._mesh import Mesh
from ._plan import Plan, PlanError
from ._planfile import PlanFileError
from ._program import Op, Program, Value
from ._trace import trace
from .cost import CostModel, Estimate, estimate
from .verify import verify, VerifyReport

__version__ = "0.1.0"

__all__ = [
    "trace", "analyze", "Program", "Value", "Op", "Analysis", "DimClass", "Conflict",
    "ConflictSide", "REPLICATE", "ToastWarning", "UnknownPrimitiveError", "rules", "strategies", "zoo",
    "Mesh", "DeviceSpec", "Link", "devices", "get_device", "Plan", "PlanError", "PlanFileError",
    "estimate", "Estimate", "CostModel", "search", "exhaustive", "random_search",
    "SearchResult", "SearchProgress", "verify", "VerifyReport",
]
