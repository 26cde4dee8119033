"""Decisions beyond sharding: what each layer group keeps for the backward pass, and how many
micro-batches the batch is split into (DESIGN.md, "Decisions beyond sharding").

`StepDecisions` is a frozen record a Plan carries (`Plan.step`); its default (save
everything, one micro-batch) is the step as written. Remat policies, per layer group
(`Analysis.layer_groups`), in the words of `jax.checkpoint_policies`:

- "everything": keep every residual the forward pass makes (the step as written);
- "dots_with_no_batch_dims": keep the group's inputs and the results of its matmuls without
  batch dims, recompute the rest in the backward pass
  (`jax.checkpoint_policies.dots_with_no_batch_dims_saveable`; MaxText's "minimal");
- "full": keep only the group's inputs, recompute the rest (`nothing_saveable`; MaxText's
  and Megatron's "full").

Offloading what is kept to host memory (`offload_dot_with_no_batch_dims`) is refused: JAX
lowers a `device_put` to another memory kind inside `jit` only on GPU and TPU (jax 0.10.2's
CPU lowering drops it), so on the simulated devices that check every plan it would be a
no-op that no test could tell from "dots_with_no_batch_dims".

A group the user already wraps in `jax.checkpoint` keeps the user's choice unless the plan
overrides it (`override`; an unrolled group's only: a scanned stack's checkpoint lives in the
scan's bodies, which the rewrite does not undo). `micro_batches`: k splits the batch class
into k micro-batches whose gradients (and other sums over the batch) are accumulated before
one optimizer update; legal only where `Analysis.micro_batching` says so, and only for
counts that divide the batch. `pipeline` cuts a scanned stack into stages over a mesh axis
(_pipeline.py). Plans name these decisions "remat@<group>", "micro_batches" and
"pipeline@<group>" (pins, plan files, tl.diff; a pipeline's value reads "<mesh axis>:<stages>"
or "none", `parse_pipeline`).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace

from ._pipeline import CIRCULAR, Pipeline, PipelineRefused, stack_pipeline

EVERYTHING = "everything"
DOTS = "dots_with_no_batch_dims"
OFFLOAD_DOTS = "offload_dots_with_no_batch_dims"
FULL = "full"
REMAT_POLICIES = (EVERYTHING, DOTS, FULL)
REFUSED_POLICIES = {
    OFFLOAD_DOTS: "offloading kept residuals to host memory is not available: JAX lowers memory "
                  "kinds inside jit only on GPU and TPU, and toast-lab checks every plan on "
                  "simulated CPU devices, where it would do nothing; keep them on the device "
                  "with 'dots_with_no_batch_dims'",
}
MICRO_BATCHES = "micro_batches"   # the decision's name in pins, plan files and diffs
REMAT_PREFIX = "remat@"           # "remat@<group>"
PIPELINE_PREFIX = "pipeline@"     # "pipeline@<group>": "<mesh axis>:<stages>"


class StepDecisionError(ValueError):
    """A step decision that does not fit the analysis: names the field and the fix."""


@dataclass(frozen=True)
class StepDecisions:
    """A plan's decisions beyond sharding (module docstring).

    remat: (group name, policy) for the groups that do not save everything, in the order
    made. micro_batches: how many micro-batches the batch splits into (1: as written).
    override: the groups whose own jax.checkpoint the plan's policy replaces.
    """

    remat: tuple[tuple[str, str], ...] = ()
    micro_batches: int = 1
    override: frozenset[str] = frozenset()
    pipeline: Pipeline | None = None

    @property
    def is_default(self) -> bool:
        """The step as written: every group saves everything, one micro-batch."""
        return (not self.remat and self.micro_batches == 1 and not self.override
                and self.pipeline is None)

    @property
    def refusal(self) -> str:
        """Why these decisions cannot run together, whatever the sharding ("" where they
        can): a circular pipeline with fewer micro-batches than stages."""
        p = self.pipeline
        if p is not None and p.chunks > 1 and self.micro_batches < p.stages:
            return (f"pipeline@{p.group}: a circular schedule sends each micro-batch round "
                    f"the {p.stages} stages again, so it needs at least {p.stages} "
                    f"micro-batches; the plan has {self.micro_batches}")
        return ""

    def policy_of(self, group: str) -> str:
        return dict(self.remat).get(group, EVERYTHING)

    def with_remat(self, group: str, policy: str, override: bool = False) -> "StepDecisions":
        remat = tuple((g, p) for g, p in self.remat if g != group)
        if policy != EVERYTHING or override:
            remat += ((group, policy),)
        held = self.override | {group} if override else self.override - {group}
        return replace(self, remat=remat, override=frozenset(held))

    def with_micro_batches(self, count: int) -> "StepDecisions":
        return replace(self, micro_batches=count)

    def names(self) -> dict[str, object]:
        """{decision name: value} of the decisions that differ from the step as written."""
        out: dict[str, object] = {f"{REMAT_PREFIX}{g}": p for g, p in self.remat}
        if self.micro_batches != 1:
            out[MICRO_BATCHES] = self.micro_batches
        if self.pipeline is not None:
            out[f"{PIPELINE_PREFIX}{self.pipeline.group}"] = str(self.pipeline)
        return out

    def __repr__(self) -> str:
        parts = [f"{n}={v}" for n, v in self.names().items()]
        parts += [f"override={sorted(self.override)}"] if self.override else []
        return f"StepDecisions({', '.join(parts) or 'as written'})"


def check_policy(policy) -> str:
    if policy in REFUSED_POLICIES:
        raise StepDecisionError(f"remat policy {policy!r}: {REFUSED_POLICIES[policy]}")
    if policy not in REMAT_POLICIES:
        close = difflib.get_close_matches(str(policy), REMAT_POLICIES, n=1, cutoff=0.5)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise StepDecisionError(
            f"remat policy {policy!r} is not one of {list(REMAT_POLICIES)}{hint}: "
            f"'dots_with_no_batch_dims' is MaxText's 'minimal', 'full' keeps only each layer's "
            f"input")
    return policy


def check_group(analysis, group) -> object:
    """The LayerGroup named `group`, or a StepDecisionError listing the groups there are."""
    groups = {g.name: g for g in analysis.layer_groups}
    if isinstance(group, str) and group in groups:
        return groups[group]
    names = list(groups)
    close = difflib.get_close_matches(str(group), names, n=3, cutoff=0.5)
    close += [n for n in names if str(group) and n.rstrip("*") == str(group) and n not in close]
    hint = f" Did you mean {close}?" if close else ""
    raise StepDecisionError(
        f"remat: no layer group named {group!r} in {analysis.program.fn_name!r}.{hint} Layer "
        f"groups: {names or 'none (the step has no named scopes or scans in its forward pass)'}")


def check_override(analysis, group) -> None:
    """A StepDecisionError where the plan cannot replace the group's own jax.checkpoint."""
    g = check_group(analysis, group)
    if g.kind == "scanned" and g.checkpointed:
        raise StepDecisionError(
            f"remat: the scanned stack {g.name!r} ({g.source}) wraps its layer in its own "
            f"jax.checkpoint, which toast-lab keeps as written inside the scan; choose its "
            f"policy there (jax.checkpoint(..., policy=...)), or pass override only for "
            f"unrolled groups")


def check_micro_batches(analysis, count) -> int:
    """`count` where the analysis allows that many micro-batches; a StepDecisionError naming
    why not otherwise."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise StepDecisionError(f"micro_batches must be a positive integer (1: the batch as "
                                f"written), got {count!r}")
    if count == 1:
        return count
    mb = analysis.micro_batching
    if not mb.legal:
        raise StepDecisionError(f"micro_batches={count}: the batch of "
                                f"{analysis.program.fn_name!r} cannot be split: {mb.reason}")
    if count not in mb.counts:
        raise StepDecisionError(f"micro_batches={count} does not divide the {mb.examples} "
                                f"examples of class {mb.batch!r}; choose one of "
                                f"{list(mb.counts)}")
    return count


def check_sharded_micro_batches(plan, mesh) -> None:
    """Each micro-batch's examples divide over the mesh axes the plan shards the batch on
    (8 examples in 4 micro-batches leave 2, which 8 data-parallel devices cannot split)."""
    count = plan.step.micro_batches
    mb = plan.analysis.micro_batching
    if count == 1 or not mb.legal:
        return
    batch = plan.analysis.class_named(mb.batch)
    axes = plan.axes_of(batch.id, "compute")  # the examples are activations
    ways = 1
    for a in axes:
        ways *= mesh.axis_size(a)
    if (mb.examples // count) % ways:
        raise StepDecisionError(
            f"micro_batches={count} leaves {mb.examples // count} examples of class "
            f"{mb.batch!r} per micro-batch, which its {ways} devices over mesh axes "
            f"{tuple(axes)} cannot split evenly; use fewer micro-batches or shard "
            f"{mb.batch!r} over fewer devices")


def parse_pipeline(group: str, value, mesh=None) -> Pipeline | None:
    """The pipeline a pin of "pipeline@<group>" names, in the words of `str(Pipeline)`: None
    for "none" (or None); a Pipeline as given; "<mesh axis>:<stages>" ("stage:4", GPipe);
    "<mesh axis>:<stages>x<runs>" ("stage:4x2", circular, that many runs of layers per
    stage); "<mesh axis>" alone, given `mesh`, for GPipe over all the axis's devices. A
    StepDecisionError naming the forms otherwise (whether the stack and the mesh take it is
    for `Plan.with_pipeline` and `validate`)."""
    if value is None or value == "none":
        return None
    if isinstance(value, Pipeline):
        return value
    forms = ('stages are written "<mesh axis>:<stages>" (e.g. "stage:4"), '
             '"<mesh axis>:<stages>x<runs>" for a circular schedule (e.g. "stage:4x2") or "none"')
    if not isinstance(value, str) or not value:
        raise StepDecisionError(f"{forms}, got {value!r}")
    axis, sep, count = value.rpartition(":")
    if not sep:
        if mesh is None or value not in mesh.axis_names:
            known = f"; mesh axes: {list(mesh.axis_names)}" if mesh is not None else ""
            raise StepDecisionError(f"{forms}, got {value!r}{known}")
        return Pipeline(group, value, mesh.axis_size(value))
    stages, x, runs = count.partition("x")
    if not axis or not stages.isdigit() or (x and not runs.isdigit()):
        raise StepDecisionError(f"{forms}, got {value!r}")
    if mesh is not None and axis not in mesh.axis_names:
        raise StepDecisionError(f"the mesh has no axis {axis!r}; its axes are "
                                f"{list(mesh.axis_names)}")
    if x and int(runs) > 1:
        return Pipeline(group, axis, int(stages), CIRCULAR, int(runs))
    return Pipeline(group, axis, int(stages))


def check_decisions(analysis, step: StepDecisions) -> StepDecisions:
    """Raises StepDecisionError for a group, policy or count the analysis does not allow."""
    for group, policy in step.remat:
        check_group(analysis, group)
        check_policy(policy)
    for group in step.override:
        check_override(analysis, group)
    check_micro_batches(analysis, step.micro_batches)
    if step.pipeline is not None:
        try:
            stack_pipeline(analysis, step.pipeline)
        except PipelineRefused as err:
            raise StepDecisionError(str(err)) from None
    return step
