"""The schedule of a pipelined plan: which micro-batch each stage runs at each tick, for the
Lab's schedule chart, its text, and the graph's words for the pipelined stack.

The GPipe schedule as plan.jit runs it (plan/_pipeline.py): two loops of T = M + S - 1 ticks
(M micro-batches, S stages). In the forward loop stage s runs micro-batch t - s at tick t; in
the backward loop, the last stage first and the micro-batches in reverse, stage s runs
M + S - 2 - u - s at tick u. A stage with no micro-batch at a tick idles: S - 1 of its T
ticks in each loop, the bubble, (S - 1) / (M + S - 1). Each tick ends with one hand-off, a
collective-permute over the stage axis: the estimate's count of those is 2T, and one
hand-off's bytes and seconds are the estimate's over that count.
"""

from __future__ import annotations

from ..plan import PIPELINE_PREFIX
from ._scopes import ROOT
from ._viewmodel import ScheduleView

IDLE = -1  # a stage with no micro-batch at a tick


def gpipe_ticks(stages: int, micro_batches: int) -> tuple[tuple, tuple]:
    """(forward, backward): [S][T] the micro-batch stage s runs at tick t of each loop, IDLE
    where it has none (the module docstring's schedule)."""
    s_count, m_count = stages, micro_batches
    ticks = m_count + s_count - 1

    def run(m: int) -> int:
        return m if 0 <= m < m_count else IDLE

    forward = tuple(tuple(run(t - s) for t in range(ticks)) for s in range(s_count))
    backward = tuple(tuple(run(m_count + s_count - 2 - u - s) for u in range(ticks))
                     for s in range(s_count))
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
    forward, backward = gpipe_ticks(p.stages, m)
    ticks = m + p.stages - 1
    layers = next((g.layers for g in analysis.layer_groups if g.name == p.group), p.stages)
    handoff = None if estimate is None else estimate.collectives.get(
        ("collective-permute", (p.axis,)))
    return ScheduleView(
        name=f"{PIPELINE_PREFIX}{p.group}", group=p.group,
        scope=stack_scope(analysis, tree, p.group), axis=p.axis, stages=p.stages,
        layers=layers, micro_batches=m, schedule=p.schedule, ticks=ticks,
        bubble=(p.stages - 1) / ticks, forward=forward, backward=backward,
        handoff_bytes=None if handoff is None else handoff.bytes / handoff.count,
        handoff_s=None if handoff is None else handoff.time_s / handoff.count,
        handoffs=None if handoff is None else int(round(handoff.count)))


__all__ = ["IDLE", "gpipe_ticks", "stack_scope", "schedule_view"]
