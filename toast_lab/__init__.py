"""toast-lab: automatic, inspectable sharding plans for JAX programs.

This module is the one place that says what is public. The subpackages follow the pipeline of
DESIGN.md, each stage importing only earlier ones:

    program/      trace a function into a Program                       (stage 1)
    rules/        one sharding rule per primitive                       (stage 2)
    analysis/     sharding-equivalence classes and conflicts            (stage 3)
    plan/         meshes and devices, plans, export, plan files         (stages 4, 5, 8)
    cost/         the cost model: step time and memory of a plan        (stage 6)
    strategies/   expert plans (data, FSDP, Megatron, sequence ...)     (stage 7)
    plan_search/  MCTS, exhaustive and random search                    (stage 7)
    verification/ compile on simulated devices and read what XLA did    (stage 9)
    lab/          the notebook widget                                   (stage 10)
    zoo/          built-in training steps
    progress      long stages (tracing, compiling the cost model...) told to a listener
"""

from . import progress, rules, strategies, zoo
from .analysis import (REPLICATE, Analysis, Conflict, ConflictSide, DimClass, ToastWarning,
                       UnknownPrimitiveError, analyze)
from .cost import CostModel, Estimate, IncrementalEstimator, cost_model, estimate
from .lab import Lab, PlanDiff, diff
from .plan import (DeviceSpec, Efficiency, Link, Mesh, Plan, PlanError, PlanFileError,
                   StepDecisions, devices, get_device, random_plan)
from .plan_search import SearchProgress, SearchResult, exhaustive, random_search, search
from .program import Op, Program, Value, trace
from .verification import VerifyReport, verify

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where the built JupyterLab extension is, for `jupyter labextension develop .` (a
    development install links it instead of copying it)."""
    return [{"src": "labextension", "dest": "toast-lab"}]

__all__ = [
    "trace", "analyze", "Program", "Value", "Op", "Analysis", "DimClass", "Conflict",
    "ConflictSide", "REPLICATE", "ToastWarning", "UnknownPrimitiveError", "rules", "strategies",
    "zoo", "Mesh", "DeviceSpec", "Efficiency", "Link", "devices", "get_device", "Plan",
    "PlanError", "PlanFileError", "StepDecisions", "random_plan", "estimate", "cost_model",
    "Estimate", "CostModel", "IncrementalEstimator", "search", "exhaustive", "random_search",
    "SearchResult", "SearchProgress", "verify", "VerifyReport", "Lab", "diff", "PlanDiff",
    "progress",
]
