"""The published recipes' memory ladder: where an expert plan does not fit in device memory as
written, the remat and micro-batch choices large training runs reach for, in the order they
reach for them, as the same plan with step decisions (DESIGN.md, "Decisions beyond sharding").

MaxText (`remat_policy`, then `gradient_accumulation_steps`) and torchtitan
(`activation_checkpoint.mode`: "selective", then "full") climb the same ladder:

1. "minimal" remat (MaxText's name; torchtitan's selective op-level checkpointing keeps the
   matmul outputs too): every repeated layer group keeps its matmul results without batch
   dims and recomputes the rest (`dots_with_no_batch_dims`);
2. "full" remat: every repeated layer group keeps only its input;
3. full remat with 2, 4, then 8 micro-batches (gradient accumulation steps).

A strategy takes the first rung that fits; where none does, the one with the smallest peak
(the closest the recipe gets). Rungs the step does not allow are left out: remat where it has
no repeated layer group of its own (a scope, or a stack the user already wraps in
`jax.checkpoint`), micro-batch counts the analysis refuses or the plan's batch devices cannot
split. Each rung priced is a rewritten step with a cost model of its own (a second or two),
built once per rung and shared by every strategy, and only for strategies that need it.

A variant is named after its strategy and what it adds, in the recipes' words:
"fsdp (remat minimal)", "fsdp (remat full)", "fsdp (remat full, 4 micro-batches)"; a step with
no group to recompute climbs micro-batches only, "dp (2 micro-batches)".
"""

from __future__ import annotations

import math

from ..analysis import SCOPE
from ..plan import Plan, PlanError, StepDecisions

# The policies (Plan.with_remat's words) the recipes' rungs take.
EVERYTHING, DOTS, FULL = "everything", "dots_with_no_batch_dims", "full"
# The recipes' words for the policies, in variant names.
POLICY_WORDS = {DOTS: "remat minimal", FULL: "remat full"}
# Gradient accumulation steps the ladder climbs after full remat (the search offers the same).
MICRO_BATCH_RUNGS = (2, 4, 8)


def remat_groups(an) -> tuple[str, ...]:
    """The layer groups a recipe's remat policy covers: the repeated layers (a scanned stack,
    unrolled layers) whose backward pass the user has not already chosen with jax.checkpoint."""
    return tuple(g.name for g in an.layer_groups if g.kind != SCOPE and not g.checkpointed)


def remat_ladder(an) -> tuple[StepDecisions, ...]:
    """The ladder's StepDecisions in the order a recipe climbs it (module docstring); empty
    where the step allows neither remat nor micro-batches."""
    groups = remat_groups(an)
    mb = an.micro_batching
    counts = tuple(k for k in MICRO_BATCH_RUNGS if mb.legal and k in mb.counts)
    policies = (DOTS, FULL) if groups else ()
    out = []
    for policy, count in [(p, 1) for p in policies] + [(FULL if groups else EVERYTHING, k)
                                                         for k in counts]:
        step = StepDecisions()
        for g in groups:
            step = step.with_remat(g, policy)
        out.append(step.with_micro_batches(count))
    return tuple(out)


def variant_name(name: str, step: StepDecisions) -> str:
    """'fsdp (remat full, 4 micro-batches)': strategy `name` with the ladder's rung `step`."""
    policies = {p for _, p in step.remat}
    words = [POLICY_WORDS[p] for p in sorted(policies)]
    if step.micro_batches > 1:
        words.append(f"{step.micro_batches} micro-batches")
    return f"{name} ({', '.join(words)})"


def climb(plan: Plan, mesh, cap: float, model, ladder) -> Plan | None:
    """The first plan of `ladder` (StepDecisions) over `plan`'s sharding whose peak fits under
    `cap` bytes, else the one with the smallest peak; None where no rung can run on `mesh`.
    model: the CostModel of the plan's analysis on `mesh` (its `price`)."""
    closest, closest_peak = None, math.inf
    for step in ladder:
        candidate = _with_step(plan, step)
        try:
            candidate.validate(mesh)
        except PlanError:  # micro-batches the batch's devices cannot split
            continue
        _, peak = model.price(candidate)
        if peak <= cap:
            return candidate
        if peak < closest_peak:
            closest, closest_peak = candidate, peak
    return closest


def faster_with_remat(plan: Plan, mesh, cap: float, model) -> Plan | None:
    """`plan` (one that fits as written) with the remat rung of its recipe's ladder that makes
    it fastest, where one fits under `cap` and is faster than as written, else None. It can
    be: what is recomputed is never written and read back, and the recomputation gives the
    communication of the backward pass compute to hide behind. Prices the ladder's remat
    rungs only (micro-batches add a loop and save memory alone)."""
    step_s, _ = model.price(plan)
    fastest = None
    for step in remat_ladder(plan.analysis):
        if step.micro_batches > 1:
            continue
        candidate = _with_step(plan, step)
        s, peak = model.price(candidate)
        if peak <= cap and s < step_s:
            fastest, step_s = candidate, s
    return fastest


def _with_step(plan: Plan, step: StepDecisions) -> Plan:
    for group, policy in step.remat:
        plan = plan.with_remat(group, policy)
    return plan.with_micro_batches(step.micro_batches)
