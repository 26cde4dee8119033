"""Stage 6, the cost model (DESIGN.md §6): per-device step time and memory of a plan.

Takes an Analysis, a Mesh and a Plan; gives an `Estimate` (compute by roofline, collectives by
an alpha-beta model per mesh axis, peak memory by liveness). The program is compiled once into
flat tables (_static.py: value and op facts, operand rows, flop counts, XLA's passes),
compressed into types (_types.py) and evaluated by a numba kernel (_kernel/), fast enough for
thousands of plans a second; `CostModel.incremental` edits one plan a decision at a time, and
`CostModel.op_collectives` reads the estimate's collectives back to the ops that pay them (for
views). `compiler_profile` says which of XLA's passes (per
backend: cpu, gpu, tpu) the model follows for a device (`CompilerProfile`).
"""

from __future__ import annotations

from ._compiler import CompilerProfile, compiler_profile
from ._estimate import COLLECTIVE_KINDS, CollectiveCost, Estimate
from ._incremental import IncrementalEstimator
from ._model import OVERLAP_MODES, CostModel, cost_model
from ._op_collectives import OpCollective
from ._timeline import CATEGORIES as MEMORY_CATEGORIES, MemoryTimeline
from ..plan import PlanError, check_analysis
from ._plan_arrays import PlanArrays, axis_bits, live_axis_bits, plan_arrays

from . import _kernel
from ._kernel import compile_done, compile_running, compile_seconds

# The kernel compiles on a thread of its own from the first import (unless it is cached, or
# TOAST_LAB_COMPILE_AHEAD=0), while the user writes, traces and analyses: _kernel/_ahead.py.
_kernel.start_compile()


def estimate(analysis, plan, mesh, donate: bool = True, overlap="scheduled") -> Estimate:
    """Step time and peak memory per device of `plan` on `mesh` (see CostModel). donate: the
    step donates its training state, as plan.jit does by default; overlap: how communication
    and compute add up (OVERLAP_MODES).

    Raises PlanError when the plan is for another analysis or does not fit the mesh (an axis
    the mesh lacks, a class its axes do not divide), before the cost model sees it.
    """
    check_analysis(analysis, "tl.estimate")
    if not hasattr(plan, "assignments") and hasattr(mesh, "assignments"):
        raise TypeError("tl.estimate takes (analysis, plan, mesh), in that order: the plan "
                        "came third")
    if getattr(plan, "analysis", None) is not analysis:
        raise PlanError(f"tl.estimate: the plan was made for another analysis "
                        f"({getattr(plan, 'analysis', None)!r}) than {analysis!r}; build it "
                        f"with tl.Plan.replicated(an) or load it with tl.Plan.load(path, an)")
    plan.validate(mesh)
    return cost_model(analysis, mesh, donate, overlap).estimate(plan)


__all__ = ["estimate", "cost_model", "Estimate", "CostModel", "IncrementalEstimator",
           "CollectiveCost", "OpCollective", "MemoryTimeline", "MEMORY_CATEGORIES",
           "COLLECTIVE_KINDS", "OVERLAP_MODES", "PlanArrays",
           "axis_bits", "live_axis_bits", "plan_arrays", "CompilerProfile", "compiler_profile",
           "compile_running", "compile_seconds", "compile_done"]
