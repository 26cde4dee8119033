"""Every collective explained: which op and which classes ask for it, the user's source line,
its bytes and time, and the choice that would remove it, with that choice's price.

The cost model reads its charges back to the ops that pay them (CostModel.op_collectives: the
kind, the mesh axes, the operand moved or the op's partial results). Each is explained from
the analysis and the plan:

- a moved operand (all-gather, all-to-all, collective-permute): the classes of the operand's
  dims that the plan shards over the collective's axes, and why the op cannot take them as
  they come (it needs the dim whole; the class meets itself there, a conflict; or the op
  computes with the class laid out otherwise);
- partial results (all-reduce, reduce-scatter): the classes the op sums over (its reduction
  factors) that the plan shards over those axes.

A choice removes a collective when the cost model no longer charges the op that collective
(same kind, axes and operand) under the plan with the choice. The candidates are the asking
classes over mesh axes without the collective's, and the other resolutions of their active
conflicts, tried cheapest first (at most MAX_TRIED); their prices are the Decisions tab's
counterfactuals (the incremental estimator, equal to `tl.estimate` of the changed plan).
"""

from __future__ import annotations

from collections import defaultdict

from ..rules import NEED_REPLICATION, REDUCTION
from ._counterfactuals import axes_label, class_options, refusal
from ._details import spec_text
from ._graph import type_label
from ._viewmodel import CollectiveView, RemedyView

MAX_TRIED = 6  # candidate choices checked for removing one collective (a kernel run each)


class Explainer:
    """Explains the collectives of one plan. prices: {("class", id, axes) or ("conflict", id,
    resolution): (step s, peak bytes)} of the choices already priced; words: {conflict id:
    {resolution: its words}}; rep: per op, the op drawn for it (folded layers)."""

    def __init__(self, analysis, mesh, model, plan, op_collectives: dict, prices: dict,
                 words: dict, rep):
        self.analysis, self.mesh, self.model, self.plan = analysis, mesh, model, plan
        self.colls, self.prices, self.words, self.rep = op_collectives, prices, words, rep
        self._removed: dict = {}  # candidate plan -> its op_collectives

    def op(self, op: int) -> tuple[CollectiveView, ...]:
        """The collectives of op `op` and of the ops drawn as it (its other layers)."""
        r = int(self.rep[op])
        found = [(o, c) for o, cs in self.colls.items() if int(self.rep[o]) == r for c in cs]
        return self._grouped(found)

    def pairs(self, pairs) -> tuple[CollectiveView, ...]:
        """The collectives paid on the tensors (op, operand position) of a drawn edge."""
        wanted = set(pairs)
        found = [(o, c) for o, slot in wanted for c in self.colls.get(o, ())
                 if c.operand == slot]
        return self._grouped(found)

    def _grouped(self, found) -> tuple[CollectiveView, ...]:
        groups: dict[tuple, list] = defaultdict(list)
        for o, c in found:
            groups[(int(self.rep[o]), c.kind, c.axes, c.operand)].append((o, c))
        views = [self._view(key[0], items) for key, items in groups.items()]
        return tuple(sorted(views, key=lambda v: (-v.time_s, v.op, v.label)))

    def _view(self, op: int, items) -> CollectiveView:
        an, plan = self.analysis, self.plan
        first = items[0][1]
        o = an.program.ops[op]
        value = o.operands[first.operand] if first.operand is not None else None
        tensor = (f"{type_label(an.program.values[value])} {spec_text(plan.partition_spec(value))}"
                  if value is not None else
                  ", ".join(type_label(an.program.values[v]) for v in o.results[:1]))
        classes, why = self._why(op, first, value)
        patterns = tuple(dict.fromkeys(p for _, c in items for p in getattr(c, "patterns", ())))
        return CollectiveView(
            op=op, primitive=o.primitive, source=o.source, scope=o.name_scope, kind=first.kind,
            axes=tuple(first.axes), label=first.label, operand=first.operand, tensor=tensor,
            classes=tuple(an.classes[k].name for k in classes), why=why,
            count=float(sum(c.count for _, c in items)),
            bytes=float(sum(c.bytes for _, c in items)),
            time_s=float(sum(c.time_s for _, c in items)),
            layers=len({o for o, _ in items}), patterns=patterns,
            remedy=self._remedy(op, first, classes))

    # --- why ------------------------------------------------------------------------------------

    def _why(self, op: int, c, value) -> tuple[tuple[int, ...], str]:
        an, plan = self.analysis, self.plan
        prim = an.program.ops[op].primitive
        rule, factor_class = an.op_rules[op], an.op_factor_classes[op]
        axes = set(c.axes)
        over = axes_label(c.axes)
        if value is not None:
            vaxes, vc = plan.value_axes(value), an.value_classes[value]
            dims = [d for d, a in enumerate(vaxes) if set(a) & axes and vc[d] >= 0]
            classes = tuple(dict.fromkeys(vc[d] for d in dims))
            names = _names(an, classes) or "its dims"
            tensor = f"operand {c.operand} ({type_label(an.program.values[value])})"
            factors = [f for d in dims if c.operand < len(rule.operands)
                       for f in rule.operands[c.operand][d]]
            if c.kind == "all-to-all":
                return classes, (f"{names} of {tensor} moves to another dim across {over}: "
                                 f"{prim} wants it there")
            if c.kind == "collective-permute":
                return classes, (f"the shards of {tensor} are exchanged over {over}, to lay "
                                 f"{names} out in the order {prim} needs")
            if any(rule.kinds[f] is NEED_REPLICATION for f in factors):
                return classes, (f"{prim} needs {names} whole, and the plan shards it over "
                                 f"{over} on {tensor}: each device gathers the other shards "
                                 f"first")
            conflict = self._conflict_here(op, classes)
            if conflict is not None:
                words = self.words[conflict.id][plan.resolution_of(conflict)].label
                return classes, (f"{conflict.class_name} meets itself at {prim} (a conflict, "
                                 f"resolved: {words}): the side it does not keep is gathered "
                                 f"over {over}")
            holders = self._holders(op, axes, classes)
            if holders:
                return classes, (f"{tensor} comes sharded over {over} on {names}, but {prim} "
                                 f"gives {over} to {_names(an, holders)} on its result (decided "
                                 f"first): {names} is gathered first")
            return classes, (f"{tensor} comes sharded over {over} on {names}, but {prim} "
                             f"computes with {names} laid out otherwise: it is gathered first")
        summed = []
        for f in rule.factors_of_kind(REDUCTION):
            k = factor_class[f] if f < len(factor_class) else -1
            if k >= 0 and self._sharded_at(op, f) & axes:
                summed.append(k)
        classes = tuple(dict.fromkeys(summed))
        if classes:
            return classes, (f"{prim} sums over {_names(an, classes)}, which the plan shards "
                             f"over {over}: each device holds partial results, combined by "
                             f"{c.kind}")
        classes = tuple(k for k in dict.fromkeys(factor_class)
                        if k >= 0 and set(plan.axes_of(k)) & axes)
        return classes, (f"the results of {prim} are combined over {over} "
                         f"({_names(an, classes) or 'no class of its own'} sharded there)")

    def _holders(self, op: int, axes: set[str], classes) -> tuple[int, ...]:
        """The other classes that hold any of `axes` on the results of `op`."""
        vc, out = self.analysis.value_classes, []
        for r in self.analysis.program.ops[op].results:
            for d, a in enumerate(self.plan.value_axes(r)):
                if set(a) & axes and vc[r][d] >= 0 and vc[r][d] not in classes:
                    out.append(vc[r][d])
        return tuple(dict.fromkeys(out))

    def _sharded_at(self, op: int, factor: int) -> set[str]:
        """The mesh axes factor `factor` of `op` comes sharded over on its operands."""
        o, rule = self.analysis.program.ops[op], self.analysis.op_rules[op]
        out: set[str] = set()
        for slot, dims in enumerate(rule.operands[:len(o.operands)]):
            vaxes = self.plan.value_axes(o.operands[slot])
            for d, fs in enumerate(dims):
                if factor in fs and d < len(vaxes):
                    out |= set(vaxes[d])
        return out

    def _conflict_here(self, op: int, classes):
        results = set(self.analysis.program.ops[op].results)
        for c in self.analysis.conflicts:
            if c.class_id in classes and results & set(c.values) and self.plan.axes_of(c.class_id):
                return c
        return None

    # --- the choice that removes it ---------------------------------------------------------------

    def _remedy(self, op: int, c, classes) -> RemedyView | None:
        tried = 0
        for price, name, value, label, plan in sorted(self._candidates(c, classes),
                                                      key=lambda t: (t[0][0], t[3])):
            if tried >= MAX_TRIED:
                break
            tried += 1
            if not self._charges(plan, op, c):
                return RemedyView(name=name, value=value, label=label, step_time_s=price[0],
                                  peak_memory_bytes=price[1])
        return None

    def _candidates(self, c, classes):
        an, plan = self.analysis, self.plan
        axes = set(c.axes)
        for k in classes:
            cls = an.classes[k]
            now = tuple(plan.axes_of(k))
            for option in class_options(self.mesh):
                if (option == now or set(option) & axes
                        or refusal(an, self.mesh, cls, option, plan)):
                    continue
                changed = plan.with_axes(k, option)
                yield (self._price(("class", k, option), changed), cls.name, option,
                       f"{cls.name} → {axes_label(option)}", changed)
            for conflict in an.conflicts:
                if conflict.class_id != k or not now:
                    continue
                for res in conflict.resolutions:
                    if res == plan.resolution_of(conflict):
                        continue
                    changed = plan.with_resolution(conflict.id, res)
                    words = self.words[conflict.id][res].label
                    yield (self._price(("conflict", conflict.id, res), changed), conflict.name,
                           res, f"{conflict.class_name} conflict: {words}", changed)

    def _price(self, key, plan) -> tuple[float, float]:
        price = self.prices.get(key)
        if price is None or price[0] is None:
            price = self.prices[key] = self.model.price(plan)
        return price

    def _charges(self, plan, op: int, c) -> bool:
        """Whether the cost model charges `op` the collective `c` (kind, axes, operand) under
        `plan`."""
        colls = self._removed.get(plan)
        if colls is None:
            colls = self._removed[plan] = self.model.op_collectives(plan)
        return any(x.kind == c.kind and tuple(x.axes) == tuple(c.axes) and x.operand == c.operand
                   for x in colls.get(op, ()))


def _names(an, classes) -> str:
    """'seq', 'batch and seq', 'batch, seq and embed'; '' for none."""
    names = [an.classes[k].name for k in classes]
    if len(names) <= 1:
        return "".join(names)
    return f"{', '.join(names[:-1])} and {names[-1]}"


__all__ = ["Explainer", "MAX_TRIED"]
