"""IncrementalEstimator: one plan under edit, each edit costing only what it changes
(_kernel/_dirty.py)."""

from __future__ import annotations

import numpy as np

from ..plan import Plan
from . import _kernel
from ._plan_arrays import PlanArrays, axes_mask, split_classes


class IncrementalEstimator:
    """One plan under edit: each change re-costs the per-type tables (a few hundred entries,
    whatever the depth) and moves only the live ranges of the values whose sharding changed.

        inc = model.incremental(plan)
        step_s, peak_bytes = inc.set_axes(class_id, ("data",))
        step_s, peak_bytes = inc.set_axes(class_id, ("fsdp",), domain="parameters")

    mask, rank and res are the kernel's arrays (per split class, see _plan_arrays.py).
    """

    def __init__(self, model, plan=None):
        self.model = model
        an = model.analysis
        if plan is None:
            plan = Plan.replicated(an)
        self.mask, self.rank, self.res = (a.copy() for a in model.plan_arrays(plan))
        self._next_rank = len(plan.assignments)
        self._split = split_classes(an)
        # Per class: its own mask, whether it holds a place in the decision order, and which
        # of its split classes an override sets (they keep their mask when the class changes).
        self._own = np.zeros(len(an.classes), np.int64)
        for k, axes in plan.assignments:
            self._own[k] = axes_mask(model.axis_bit, axes)
        self._overridden = {self._split.index[(k, d)] for k, d, _ in plan.overrides
                            if (k, d) in self._split.index}
        self._held = {k for k, _, _ in plan.overrides}
        self._axes_masks: dict = {}  # {axes: mask}: a search asks for a few, many times
        # a workspace of its own, which keeps what the last edit left unchanged, and the
        # temporaries' live ranges, sized replicated to begin with
        self._live = _kernel.liveness(model.ty.tables, model.memory)
        self._state = model.new_state(PlanArrays(self.mask, self.rank, self.res), self._live)
        _kernel.fill_temps(self._state, self._live, self._live.held)
        self._evaluate = _kernel.edit_evaluator(self._state, model._overlap_code)
        self.result = self._update()

    def set_axes(self, cls: int, axes, domain: str | None = None) -> tuple[float, float]:
        """Shards class id `cls` over `axes` (names) — decided after every earlier decision
        if it was not decided yet — or, with `domain`, only that domain's values of it (an
        override; its class keeps or takes a place in the decision order)."""
        m = self._axes_mask(axes)
        splits = self._split.splits_of[cls]
        was = bool(self._own[cls]) or cls in self._held
        if domain is None:
            self._own[cls] = m
            for s in splits:
                if s not in self._overridden:
                    self.mask[s] = m
        else:
            self._held.add(cls)
            s = self._split.index.get((cls, domain))
            if s is not None:  # else the class has no value there: nothing changes
                self._overridden.add(s)
                self.mask[s] = m
        if not was and (self._own[cls] or cls in self._held):
            self.rank[list(splits)] = self._next_rank
            self._next_rank += 1
        self.result = self._update()
        return self.result

    def _axes_mask(self, axes) -> int:
        """axes_mask of `axes` under the model's axis bits, kept by axes where they hash."""
        try:
            return self._axes_masks[axes]
        except KeyError:
            m = self._axes_masks[axes] = axes_mask(self.model.axis_bit, axes)
            return m
        except TypeError:  # (a list of names)
            return axes_mask(self.model.axis_bit, axes)

    def set_resolution(self, conflict: int, index: int) -> tuple[float, float]:
        self.res[conflict] = index
        self.result = self._update()
        return self.result

    def _update(self) -> tuple[float, float]:
        step, peak = self._evaluate()
        return float(step), float(peak)
