"""The published recipes that add pipeline stages to data, tensor and fully-sharded data
parallelism, as plans: `dp+pp`, `tp+pp+dp` (Megatron-LM's 3-D parallelism; Llama 3 405B's
TP8 x PP16 x DP) and `fsdp+tp+pp` (torchtitan's 405B recipe, FSDP8 x TP8 x PP8).

Each is its 2-D recipe on the mesh's other axes, with the step's scanned layer stack cut into
stages over one axis (Plan.with_pipeline, plan/_pipeline.py: GPipe; the stage axis holds the
stages and nothing else). The stage axis is one named like it ("stage", "pipeline", "pp");
otherwise, on a mesh whose outermost axis crosses slower links than the innermost (several
nodes), that outermost axis, as published runs pipeline across nodes; otherwise there is none
and the recipes do not apply. The micro-batches flowing through the stages: as many as keep
each one's examples divisible over the batch's devices, up to MICRO_BATCHES_PER_STAGE per
stage (what the search offers too), so that the bubble, (S - 1) / (M + S - 1) of the step,
stays small.
"""

from __future__ import annotations

from ..analysis import SCANNED
from ..plan import MICRO_BATCHES_PER_STAGE, Pipeline, PipelineRefused, PlanError, stack_pipeline

_STAGE_AXIS_NAMES = ("stage", "stages", "pipeline", "pp")
# the recipes with stages, and the 2-D (or 1-D) recipe each one adds them to
RECIPES = (("dp+pp", "dp"), ("tp+pp+dp", "dp+tp"), ("fsdp+tp+pp", "fsdp+tp"))


def stage_axis(mesh) -> str | None:
    """The mesh axis a recipe pipelines over (module docstring), or None."""
    names = tuple(mesh.axis_names)
    named = [a for a in names if a.lower() in _STAGE_AXIS_NAMES and mesh.axis_size(a) > 1]
    if named:
        return named[0]
    if len(names) < 2 or mesh.axis_size(names[0]) < 2:
        return None
    outer, inner = mesh.link(names[0]), mesh.link(names[-1])
    return names[0] if outer.bandwidth < inner.bandwidth else None


def add_pipelined(an, mesh, plans: dict, skipped: dict) -> None:
    """Adds the recipes of RECIPES to `plans` (their reasons to `skipped` where they do not
    apply); `plans` holds the 2-D recipes on the whole mesh."""
    axis = stage_axis(mesh)
    stacks = [g for g in an.layer_groups if g.kind == SCANNED]
    why = None
    if axis is None:
        why = ("needs a mesh axis to pipeline over: one named 'stage' or 'pipeline', or an "
               "outer axis across slower links (several nodes)")
    elif not stacks:
        why = "needs a scanned layer stack (a lax.scan over stacked layers) to cut into stages"
    else:
        pipeline = Pipeline(stacks[0].name, axis, mesh.axis_size(axis))
        try:
            stack_pipeline(an, pipeline)
        except PipelineRefused as err:
            why = str(err)
    for name, base in RECIPES:
        if why is not None:
            skipped[name] = why
        elif base not in plans:
            skipped[name] = f"its recipe without stages, {base!r}, does not apply"
        else:
            try:
                plans[name] = _staged(plans[base], pipeline, mesh)
            except PlanError as err:
                skipped[name] = str(err)


def _staged(plan, pipeline, mesh):
    """`plan` with `pipeline`, and the most micro-batches its batch sharding divides (module
    docstring)."""
    staged = plan.with_pipeline(pipeline.group, pipeline.axis, pipeline.stages)
    mb = plan.analysis.micro_batching
    most = MICRO_BATCHES_PER_STAGE * pipeline.stages
    for count in sorted((k for k in mb.counts if k <= most), reverse=True):
        candidate = staged.with_micro_batches(count)
        try:
            return candidate.validate(mesh).with_mesh(mesh)
        except PlanError:
            continue
    raise PlanError(f"no micro-batch count up to {most} divides the batch over its devices")
