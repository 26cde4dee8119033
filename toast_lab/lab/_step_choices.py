"""The decisions beyond sharding the Lab offers, priced before they are made: a remat policy per
layer group the search may rematerialise, the micro-batch count where the batch splits, and
pipeline stages per scanned stack.

The decisions offered are the search's own (`plan_search.Space`'s STEP decisions): remat for
repeated layer groups (unrolled, or scanned where the user wrote no jax.checkpoint), the
legal micro-batch counts up to the search's limit, and "pipeline@<stack>": "none" or stages
over a mesh axis whose size divides the stack's layers ("stage:4"; values are that text, as
pins and plan files write it). Each choice is priced as `tl.estimate` prices the plan with
that one decision changed (`CostModel.price`: the rewritten step's cost model, built once per
distinct StepDecisions and cached by the analysis). A micro-batch count whose examples per
micro-batch do not divide over the batch's devices prices at (inf, inf): it is refused, with
that reason; so are stages the plan cannot take (Plan.with_pipeline's and validate's reasons).

Each distinct StepDecisions is a rewrite of the traced step, analysed and given a cost model of
its own: about a second on a small program, but minutes on larger ones (a GPT-2-small of 6
unrolled layers, 2,700 ops, on 2 busy cores). Beyond PRICED_OPS ops the view shows these
choices unpriced rather than stall every pin; pinning one prices it (the session's estimate).
"""

from __future__ import annotations

import math

import numpy as np

from ..plan import MICRO_BATCHES, PIPELINE_PREFIX, REMAT_PREFIX, PlanError, parse_pipeline
from ..plan_search import STEP, Space
from ._viewmodel import ChoiceView, StepDecisionView

PRICED_OPS = 2_000  # the largest program whose step choices the view prices

# What each remat policy keeps for the backward pass (the rest is recomputed there).
POLICY_LABELS = {"everything": "everything", "dots_with_no_batch_dims": "matmul outputs",
                 "full": "full"}
POLICY_NOTES = {
    "everything": "keeps every residual of the forward pass (the step as written)",
    "dots_with_no_batch_dims": "keeps the matmul results without batch dims (the projections) "
                               "and recomputes the rest in the backward pass; MaxText's "
                               "\"minimal\"",
    "full": "keeps only each layer's input and recomputes the whole layer in the backward "
            "pass; Megatron's and MaxText's \"full\"",
}


def offered(analysis, mesh) -> tuple:
    """The search's STEP decisions (plan_search.Decision) of `analysis` on `mesh`, unpinned."""
    return tuple(d for d in Space(analysis, mesh).decisions if d.kind == STEP)


def step_label(analysis, name: str) -> str:
    """A decision in words: "remat: block (scanned ×4)", "micro-batches", "pipeline stages:
    block (scanned ×4)"."""
    if name == MICRO_BATCHES:
        return "micro-batches"
    pipeline = name.startswith(PIPELINE_PREFIX)
    group = name[len(PIPELINE_PREFIX if pipeline else REMAT_PREFIX):]
    what = "pipeline stages" if pipeline else "remat"
    g = next((g for g in analysis.layer_groups if g.name == group), None)
    return f"{what}: {group} ({g.kind} ×{g.layers})" if g is not None else f"{what}: {group}"


def step_value(plan, name: str):
    """The plan's value of a step decision: a policy, a micro-batch count, or stages as text
    ("stage:4", "none")."""
    if name == MICRO_BATCHES:
        return plan.step.micro_batches
    if name.startswith(PIPELINE_PREFIX):
        p = plan.step.pipeline
        return str(p) if p is not None and p.group == name[len(PIPELINE_PREFIX):] else "none"
    return plan.step.policy_of(name[len(REMAT_PREFIX):])


def with_step(plan, name: str, value, mesh=None):
    """`plan` with one step decision changed (its pins kept); PlanError if it cannot take it
    (stages named by a mesh axis alone need `mesh`, default the plan's)."""
    if name == MICRO_BATCHES:
        return plan.with_micro_batches(value)
    if name.startswith(PIPELINE_PREFIX):
        group = name[len(PIPELINE_PREFIX):]
        try:
            p = parse_pipeline(group, value, mesh or plan.mesh)
        except ValueError as err:
            raise PlanError(str(err)) from None
        if p is None:
            return plan.without_pipeline()
        return plan.with_pipeline(group, p.axis, p.stages, p.schedule, chunks=p.chunks)
    return plan.with_remat(name[len(REMAT_PREFIX):], value)


def micro_batch_refusal(analysis, mesh, plan, count: int) -> str | None:
    """Why `count` micro-batches cannot run under `plan`'s sharding, or None: each
    micro-batch's examples must divide over the devices the batch class is sharded on."""
    mb = analysis.micro_batching
    if not mb.legal:
        return mb.reason
    if mb.examples % count:
        return f"{mb.examples} examples do not split into {count} equal micro-batches"
    axes = plan.axes_of(mb.batch) if mb.batch is not None else ()
    ways = int(np.prod([mesh.axis_size(a) for a in axes])) if axes else 1
    each = mb.examples // count
    if each % ways:
        return (f"each micro-batch's {each} examples do not divide over the {ways} devices "
                f"of {mb.batch}'s axes {'×'.join(axes)}")
    return None


def step_choices(analysis, mesh, model, plan, current, decision, price: bool
                 ) -> tuple[ChoiceView, ...]:
    """The choices of one offered decision (a plan_search.Decision from `offered`), each
    priced from `plan` (current: its (step s, peak bytes)) when `price`; the plan's own
    value is among them even where the search would not offer it."""
    name = decision.name
    now = step_value(plan, name)
    price = price and len(analysis.program.ops) <= PRICED_OPS
    values = list(decision.choices)
    if name.startswith(PIPELINE_PREFIX):  # the text pins and plan files use
        values = ["none" if v is None else str(v) for v in values]
    values += [now] if now not in values else []
    return tuple(_choice(analysis, mesh, model, plan, current, name, v, v == now, price)
                 for v in values)


def step_view(analysis, plan, name: str, choices) -> StepDecisionView:
    """The StepDecisionView of decision `name` under `plan` (whether it is pinned is the
    plan's: the choices' prices do not change with it)."""
    return StepDecisionView(name=name, label=step_label(analysis, name),
                            value=step_value(plan, name), pinned=name in plan.pinned,
                            choices=tuple(choices))


def _choice(analysis, mesh, model, plan, current, name, value, is_now, price) -> ChoiceView:
    changed = None
    if name == MICRO_BATCHES:
        reason = micro_batch_refusal(analysis, mesh, plan, value)
    else:
        reason = None
        if not is_now:
            try:  # stages the plan or the mesh cannot take are refused, priced or not
                changed = with_step(plan, name, value, mesh).validate(mesh)
            except PlanError as err:
                reason = str(err)
    step = peak = None
    if is_now:
        step, peak = current
    elif price and reason is None:
        try:
            step, peak = model.price(changed or with_step(plan, name, value, mesh))
        except PlanError as err:
            reason = str(err)
        else:
            if not (math.isfinite(step) and math.isfinite(peak)):
                reason, step, peak = ("the rewritten step cannot run this plan: a class it "
                                      "shards does not divide over its devices"), None, None
    label, note = _words(analysis, plan, name, value)
    return ChoiceView(label=label, value=value, current=is_now, valid=reason is None,
                      reason=reason, step_time_s=step, peak_memory_bytes=peak,
                      note=note if reason is None else None)


def _words(analysis, plan, name: str, value) -> tuple[str, str]:
    """(label, note) of one choice: what it keeps, how the batch splits, how the stages cut."""
    if name == MICRO_BATCHES:
        each = analysis.micro_batching.examples // value if value else 0
        return str(value), ("the whole batch at once (the step as written)" if value == 1 else
                            f"{value} micro-batches of {each} examples, their gradients "
                            f"accumulated before one optimizer update")
    if not name.startswith(PIPELINE_PREFIX):
        return POLICY_LABELS[value], POLICY_NOTES[value]
    group = name[len(PIPELINE_PREFIX):]
    if value == "none":
        return "none", f"no stages: every device runs all of {group}'s layers"
    p = parse_pipeline(group, value)
    s, v, m = p.stages, p.chunks, plan.step.micro_batches
    each = next((g.layers for g in analysis.layer_groups if g.name == group), s * v) // (s * v)
    layers = f"{each} layer{'s' if each > 1 else ''}"
    how = (f"{layers} each" if v == 1 else
           f"circular: {v} runs of {layers} per stage, each micro-batch going round the "
           f"stages {v} times (at least {s} micro-batches)")
    return value, (f"{s} stages over mesh axis {p.axis}, {how}; {m} micro-batch"
                   f"{'es' if m > 1 else ''} leave the {'GPipe ' if v == 1 else ''}bubble "
                   f"{s - 1}/{v * m + s - 1} = {p.bubble(m):.0%} of each loop; {p.axis} holds "
                   f"only the stages")
