"""The schedule of a pipelined plan: which micro-batch each stage runs at each tick, for the
Lab's schedule chart, its text, and the graph's words for the pipelined stack.

The schedules as plan.jit runs them (plan/_pipeline.py): two loops of T = V M + S - 1 ticks
(M micro-batches, S stages, V runs of layers per stage: 1 for GPipe, `chunks` for a circular
schedule). A stage's work items are w = r M + m, micro-batch m in its run r (stage s's run r
holds layer chunk r S + s of the stack's S V). In the forward loop stage s runs item t - s at
tick t; in the backward loop, the last stage first and the items in reverse, it runs
V M + S - 2 - u - s at tick u. A stage with no item at a tick idles: S - 1 of its T ticks
in each loop, the bubble, (S - 1) / (V M + S - 1). Each tick ends with one hand-off, a
collective-permute over the stage axis: the estimate's count of those is 2T, and one
hand-off's bytes and seconds are the estimate's over that count.
"""

from __future__ import annotations

from ..plan import PIPELINE_PREFIX
from ._scopes import ROOT
from ._viewmodel import ScheduleView

IDLE = -1  # a stage with no work item at a tick


def pipeline_ticks(stages: int, micro_batches: int, chunks: int = 1) -> tuple[tuple, tuple]:
    """(forward, backward): [S][T] the work item (run * M + micro-batch) stage s runs at
    tick t of each loop, IDLE where it has none (the module docstring's schedule)."""
    items = chunks * micro_batches
    ticks = items + stages - 1

    def run(w: int) -> int:
        return w if 0 <= w < items else IDLE

    forward = tuple(tuple(run(t - s) for t in range(ticks)) for s in range(stages))
    backward = tuple(tuple(run(items + stages - 2 - u - s) for u in range(ticks))
                     for s in range(stages))
    return forward, backward


def stack_scope(analysis, tree, group: str) -> str | None:
    """The scope-tree group that holds every op of layer group `group`'s layer (the deepest
    common one), or None where that is the whole program."""
    g = next((g for g in analysis.layer_groups if g.name == group), None)
    if g is None or not g.units:
        return None
    scan = analysis.program.ops[g.units[0][0]]
    start, end = scan.body_ops if scan.body_ops else (scan.id, scan.id + 1)
    common: list[str] | None = None
    for gid in {tree.group_of(o).id for o in range(start, end)}:
        chain = []  # ROOT first, down to gid
        while gid is not None:
            chain.append(gid)
            gid = tree.groups[gid].parent
        chain.reverse()
        if common is None:
            common = chain
        else:
            n = 0
            while n < min(len(common), len(chain)) and common[n] == chain[n]:
                n += 1
            common = common[:n]
    deepest = common[-1] if common else ROOT
    return None if deepest == ROOT else deepest


def schedule_view(analysis, plan, estimate, tree) -> ScheduleView | None:
    """The ScheduleView of `plan` (None without stages); `estimate`: its Estimate, whose
    collective-permutes over the stage axis are the hand-offs (None: unpriced)."""
    p = plan.step.pipeline
    if p is None:
        return None
    m = plan.step.micro_batches
    forward, backward = pipeline_ticks(p.stages, m, p.chunks)
    layers = next((g.layers for g in analysis.layer_groups if g.name == p.group), p.stages)
    handoff = None if estimate is None else estimate.collectives.get(
        ("collective-permute", (p.axis,)))
    return ScheduleView(
        name=f"{PIPELINE_PREFIX}{p.group}", group=p.group,
        scope=stack_scope(analysis, tree, p.group), axis=p.axis, stages=p.stages,
        layers=layers, micro_batches=m, schedule=p.schedule, ticks=len(forward[0]),
        bubble=p.bubble(m), forward=forward, backward=backward, chunks=p.chunks,
        handoff_bytes=None if handoff is None else handoff.bytes / handoff.count,
        handoff_s=None if handoff is None else handoff.time_s / handoff.count,
        handoffs=None if handoff is None else int(round(handoff.count)))


__all__ = ["IDLE", "pipeline_ticks", "stack_scope", "schedule_view"]
