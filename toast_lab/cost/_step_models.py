"""The cost of decisions beyond sharding (remat policies, micro-batches): the step as they
rewrite it, priced by a cost model of its own.

What remat changes is which values live across the backward pass and which forward ops run a
second time, just before the backward ops that read them; what micro-batches change is a loop
over slices of the batch, its accumulators, and what each iteration gathers again. The cost
model already prices programs like these, against XLA, when a user writes them by hand (a
`jax.checkpoint`, an accumulation scan). So the rewritten step is traced exactly as `plan.jit`
runs it (`toast_lab.plan.rewritten_step`), analysed, and given a CostModel on the same mesh:
its estimate is that program's, op by op, with no correction factors.

The sharding carries over by the classes. Each op of the rewritten program replays an op of
the step as written (its named scope OP_SCOPE<id>), so each dim of its values is a dim of a
value as written; a rewritten class takes the decisions of the class as written that most of
its dims come from, and a rewritten conflict the resolution of the conflict its value came
from. What the rewrite adds without a counterpart (the micro-batch index of the cut inputs)
stays replicated, as plan.jit leaves it.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, replace

import jax
import numpy as np

from ..analysis import NO_CLASS, analyze
from ..plan import OP_SCOPE, STAGE_SCOPE, Plan, rewritten_step, stack_pipeline
from ..program import trace
from ._estimate import top_scope
from ._plan_arrays import plan_arrays

_TAG = re.compile(re.escape(OP_SCOPE) + r"(\d+)")
# Estimate.by_scope's key for the ops a rewrite adds: no op as written runs them
REWRITE_SCOPE = "(micro-batches, stages)"


@dataclass(frozen=True, eq=False)
class RewrittenStep:
    """The step rewritten by `step`, and how the original plan's decisions map onto it.

    analysis: the rewritten program's Analysis. classes[c]: the rewritten classes that take
    class c's decisions (c: a class id as written). conflicts[k]: (rewritten conflict id,
    {resolution index as written: its index there}) pairs for conflict k as written.
    op_origin[o]: the op as written that rewritten op o runs (a recomputation runs its forward
    op again); for an op the rewrite adds, the op as written it was added at (the last one
    run before it, -1 before any).
    """

    step: object
    analysis: object
    classes: tuple[tuple[int, ...], ...]
    conflicts: tuple[tuple[tuple[int, dict[int, int]], ...], ...]
    op_origin: tuple[int, ...] = ()
    stage_merged: tuple[int, ...] = ()
    layer_class: int = -1

    def translate(self, class_masks, resolutions=(), overrides=()):
        """The (class, mask), (conflict, index) and (class, domain, mask) decisions of a plan
        as written (plan_arrays' arguments, in rank order) as the rewritten program's. A
        class that folds the pipeline's stages into another dim (stage_merged) takes the
        stage axes of the stack's layer class as well, stage-major as the fold lays them."""
        masks = [(n, m) for c, m in class_masks for n in self.classes[c]]
        if self.stage_merged:
            stage = next((m for c, m in class_masks if c == self.layer_class), 0)
            masks = [(n, m | stage) if n in self.stage_merged else (n, m) for n, m in masks]
            given = {n for n, _ in masks}
            masks += [(n, stage) for n in self.stage_merged if stage and n not in given]
        res = [(n, index.get(r, 0)) for k, r in resolutions for n, index in self.conflicts[k]]
        over = [(n, d, m) for c, d, m in overrides for n in self.classes[c]]
        return masks, res, over


def rewritten(analysis, step) -> RewrittenStep:
    """The RewrittenStep of `analysis` under StepDecisions `step`, built once per analysis
    and step (a trace and an analysis of the rewritten step: about a second for GPT-2)."""
    return analysis.derived(("cost.rewritten", step), lambda: _rewrite(analysis, step))


def _rewrite(analysis, step) -> RewrittenStep:
    prog = analysis.program
    fn = rewritten_step(Plan(analysis, step=step))
    args, kwargs = jax.tree_util.tree_unflatten(
        prog.in_tree, [jax.ShapeDtypeStruct(prog.values[v].shape, prog.values[v].dtype)
                       for v in prog.inputs])
    new = analyze(trace(fn, *args, **kwargs))
    origin = _value_origin(prog, new.program)
    classes = _class_map(analysis, new, origin)
    merged, layer = (), -1
    if step.pipeline is not None:
        layer = stack_pipeline(analysis, step.pipeline).layer_class
        classes = _with_stages(classes, new, layer)
        classes, merged = _with_folds(classes, new, layer)
    return RewrittenStep(step, new, classes,
                         _conflict_map(analysis, new, origin), _op_origin(new.program),
                         merged, layer)


def _op_origin(new_prog) -> tuple[int, ...]:
    out, last = [], -1
    for op in new_prog.ops:
        tags = _TAG.findall(op.name_scope)
        last = int(tags[-1]) if tags else last
        out.append(last)
    return tuple(out)


def _value_origin(prog, new_prog) -> dict[int, int]:
    """{rewritten value: the value as written it is a copy of} (a recomputed value, one
    micro-batch's slice of a value, a body value of a rewritten scan)."""
    origin = dict(zip(new_prog.inputs, prog.inputs))
    for op in new_prog.ops:
        tags = _TAG.findall(op.name_scope)
        if not tags:
            continue
        was = prog.ops[int(tags[-1])]
        if was.primitive != op.primitive:  # a helper the rewrite runs inside the op's scope
            continue
        pairs = []
        if len(was.results) == len(op.results):
            pairs += zip(op.results, was.results)
        if len(was.body) == len(op.body):
            pairs += zip(op.body, was.body)
        for v, w in pairs:
            if len(new_prog.values[v].shape) - len(prog.values[w].shape) in (0, 1):
                origin.setdefault(v, w)
    return origin


def _class_map(analysis, new, origin) -> tuple[tuple[int, ...], ...]:
    votes: dict[int, Counter] = {}
    for v, w in origin.items():
        # a value with one dim more than its original leads with it (the pipeline's stages,
        # which a vmap runs together): its other dims are the original's
        lead = new.program.values[v].ndim - analysis.program.values[w].ndim
        for c_new, c_was in zip(new.value_classes[v][lead:], analysis.value_classes[w]):
            if c_new != NO_CLASS and c_was != NO_CLASS:
                votes.setdefault(c_new, Counter())[c_was] += 1
    out: list[list[int]] = [[] for _ in analysis.classes]
    for c_new in sorted(votes):
        out[votes[c_new].most_common(1)[0][0]].append(c_new)
    return tuple(tuple(c) for c in out)


def _with_stages(classes, new, layer_class: int):
    """`classes` with the pipeline's stage dim (the class of its stage index, STAGE_SCOPE)
    taking the decisions of the stack's layer class, which the stage axis shards."""
    stage = {new.value_classes[op.results[0]][0] for op in new.program.ops
             if op.primitive == "iota" and STAGE_SCOPE in op.name_scope}
    stage.discard(NO_CLASS)
    out = [tuple(n for n in c if n not in stage) for c in classes]
    out[layer_class] += tuple(sorted(stage))
    return tuple(out)


def _with_folds(classes, new, layer_class: int):
    """(classes, merged): `classes` with the dims that fold the pipeline's stage dim into
    another dim, or unfold it again, taking the decisions of what they hold; merged: the
    rewritten classes of the folded dims. cuDNN attention's batching rule folds the stages
    its vmap runs together into the rows of its batch, (stages, rows, ...) -> (stages x
    rows, ...), stage-major, and unfolds its results. A folded dim takes the rows' class's
    decisions and the stage axes too (RewrittenStep.translate); an unfolded stage dim the
    layer class's, its rows the folded dim's. Sharded like the rows alone, the fold would
    gather every stage's rows onto each stage, and an unfold left without a counterpart
    would gather them back."""
    taker = {n: c for c, taken in enumerate(classes) for n in taken}
    out = [list(c) for c in classes]
    merged: dict[int, int] = {}  # folded class: the class as written its rows take

    def take(n, c):
        if n != NO_CLASS and n not in taker:
            out[c].append(n)
            taker[n] = c

    prog = new.program
    for op in prog.ops:  # in program order: a fold comes before its unfolds
        if op.primitive != "reshape":
            continue
        src, dst = op.operands[0], op.results[0]
        src_cls, dst_cls = new.value_classes[src], new.value_classes[dst]
        src_shape, dst_shape = prog.values[src].shape, prog.values[dst].shape
        for j, i in _merges(src_shape, dst_shape):  # a fold: src j, j + 1 -> dst i
            stage, rows = src_cls[j], src_cls[j + 1]
            if taker.get(stage) == layer_class and rows in taker and dst_cls[i] != NO_CLASS:
                merged[dst_cls[i]] = taker[rows]
                take(dst_cls[i], taker[rows])
        for i, j in _merges(dst_shape, src_shape):  # an unfold: src i -> dst j, j + 1
            if src_cls[i] in merged:
                take(dst_cls[j], layer_class)
                take(dst_cls[j + 1], merged[src_cls[i]])
    return tuple(tuple(c) for c in out), tuple(sorted(merged))


def _merges(wide, narrow):
    """(j, i) pairs where a reshape between shapes `wide` and `narrow` joins dims j and
    j + 1 of `wide` into dim i of `narrow` (equal sizes before them, the product after)."""
    found, before = [], 1
    for j in range(len(wide) - 1):
        size = 1
        for i, n in enumerate(narrow):
            if size == before and n == wide[j] * wide[j + 1] and wide[j] > 1 and wide[j + 1] > 1:
                found.append((j, i))
            size *= n
        before *= wide[j]
    return found


def _conflict_map(analysis, new, origin):
    of_value = {v: k for k in analysis.conflicts for v in k.values}
    out: list[list] = [[] for _ in analysis.conflicts]
    for k in new.conflicts:
        was = of_value.get(origin.get(k.site_value, -1))
        if was is None:
            was = next((of_value[origin[v]] for v in k.values
                        if origin.get(v, -1) in of_value), None)
        if was is None:
            continue
        names = k.resolutions
        index = {i: names.index(r) for i, r in enumerate(was.resolutions) if r in names}
        out[was.id].append((k.id, index))
    return tuple(tuple(c) for c in out)


class StepCostModel:
    """A CostModel's estimates for plans with decisions beyond sharding (`Plan.step`): the
    CostModel of the rewritten step (module docstring), fed the plan as written.

        model.for_step(plan.step).estimate(plan)
        model.for_step(step).step_and_peak(class_masks, resolutions, overrides)
    """

    def __init__(self, rewrite: RewrittenStep, model, written):
        """rewrite: the RewrittenStep; model: the CostModel of its analysis; written: the
        CostModel of the step as written (which reads plans)."""
        self.written = written
        self.step = rewrite.step
        self.rewrite = rewrite
        self.model = model
        # the estimate's scopes are the step's as written: each rewritten op counts in the
        # scope of the op as written it runs; what the rewrite adds (the micro-batches' cuts
        # and accumulators, the stages' hand-offs) in REWRITE_SCOPE
        ops, new = written.analysis.program.ops, rewrite.analysis.program.ops
        model.count_in_scopes(top_scope(ops[o]) if _TAG.search(op.name_scope) else REWRITE_SCOPE
                              for op, o in zip(new, rewrite.op_origin))
        self._sizes = [c.size for c in self.rewrite.analysis.classes]
        self._devices = {}
        # (batch class id as written, examples per micro-batch) where the step splits it
        mb = written.analysis.micro_batching
        self._micro = ((written.analysis.class_named(mb.batch).id,
                        mb.examples // self.step.micro_batches)
                       if self.step.micro_batches > 1 else None)

    def arrays(self, class_masks, resolutions=(), overrides=()):
        """The rewritten program's PlanArrays, or None where the plan splits a class of the
        rewritten step over devices that do not divide it (a micro-batch of 2 examples over
        4 data-parallel devices: checked on the batch class as written too, as a micro-batch
        of one example has no batch dim the rewritten step could see)."""
        if self._micro is not None:
            batch, examples = self._micro
            mask = next((m for c, m in class_masks if c == batch), 0)
            if mask and examples % self._ways(mask):
                return None
        masks, res, over = self.rewrite.translate(class_masks, resolutions, overrides)
        for c, m in [(c, m) for c, m in masks] + [(c, m) for c, _, m in over]:
            if m and self._sizes[c] % self._ways(m):
                return None
        return plan_arrays(self.rewrite.analysis, masks, res, over)

    def _ways(self, mask: int) -> int:
        ways = self._devices.get(mask)
        if ways is None:
            ways = 1
            for i, a in enumerate(self.model.mesh.axis_names):
                if (mask >> i) & 1:
                    ways *= self.model.mesh.axis_size(a)
            self._devices[mask] = ways
        return ways

    def step_and_peak(self, class_masks, resolutions=(), overrides=()) -> tuple[float, float]:
        """(step time s, peak bytes) of the plan as written under this step's decisions;
        (inf, inf) where the plan cannot run the rewritten step (see `arrays`)."""
        arrays = self.arrays(class_masks, resolutions, overrides)
        if arrays is None:
            return math.inf, math.inf
        return self.model.step_and_peak(*arrays)

    def price(self, plan) -> tuple[float, float]:
        """step_and_peak of `plan` (a plan of the analysis as written)."""
        return self.step_and_peak(*self.written.decision_lists(plan))

    def _plan_arrays(self, plan):
        """arrays() of a Plan as written; a ValueError saying why where there are none."""
        arrays = self.arrays(*self.written.decision_lists(plan))
        if arrays is None:
            raise ValueError(
                f"{plan.step}: the plan shards a class of the rewritten step over devices "
                f"that do not divide it (each micro-batch's examples must divide over the "
                f"batch's mesh axes); use fewer micro-batches or shard the batch less")
        return arrays

    def memory_timeline(self, plan):
        """The MemoryTimeline of `plan` under this step's decisions: the rewritten step's live
        bytes, each position named by the op as written it runs (RewrittenStep.op_origin), so
        that a chart of the program as written can point at it."""
        timeline = self.model.timeline_of(self._plan_arrays(plan))
        origin = np.asarray(self.rewrite.op_origin, np.int64)
        return replace(timeline, ops=origin[timeline.ops],
                       peak_op=int(origin[timeline.peak_op]) if timeline.peak_op >= 0 else -1)

    def estimate(self, plan):
        """The Estimate of `plan` (a plan of the analysis as written) with this step's
        decisions."""
        return self.model.evaluate(*self._plan_arrays(plan))

