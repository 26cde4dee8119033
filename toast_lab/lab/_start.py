"""The plan a session starts on: already an answer, and saying which one.

A Lab that opens on the replicated plan shows a grey graph and a plan that rarely fits; the
expert strategies (tl.strategies.expert) are priced on the same cost model anyway, so the
session starts on the fastest of them that fits in memory ("start: fsdp, 31.8 ms"). Pins the
person gives at the start are kept: the expert plans they rule out (an expert that decides a
pinned class, override or conflict otherwise) are not candidates, and the rest get the pins
on top. Where no candidate fits, a short search under the pins starts from all of them
(SEARCH_SIMULATIONS, at most SEARCH_BUDGET_S); where that finds nothing that fits either, the
candidate with the smallest peak memory is the start, and the start says nothing fits.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..plan import Plan, PlanError
from ..plan_search import search
from ..progress import stage

SEARCH_SIMULATIONS = 2000   # the short search's simulations (seeded: the same start each time)
SEARCH_BUDGET_S = 5.0       # ... and its wall-clock limit, on a model too large for them
# Before the expert plans can be priced (a Lab's first view while the cost model's kernel
# compiles), the view shows the expert plan the pins contradict least, the first of these
# among equals: fsdp shards the weights, the optimizer state and the batch over the data
# axes, the recipe that fits most often; the priced start replaces it.
UNPRICED_ORDER = ("fsdp", "fsdp+tp", "dp")


@dataclass(frozen=True)
class Start:
    """How the session's first plan was chosen.

    name: the expert strategy ("fsdp"), "search" or "your plan"; how: "expert", "search",
    "given", "smallest" (nothing fits: the candidate with the smallest peak) or "unpriced"
    (shown until the prices come: `unpriced`); step_time_s and peak_memory_bytes: its
    estimate (s, bytes per device; None while unpriced); note: why it is this one, in words
    ("the fastest of 11 expert plans that fit", ...).
    """

    name: str
    how: str
    step_time_s: float | None
    peak_memory_bytes: float | None
    note: str

    @property
    def label(self) -> str:
        """'start: fsdp, 31.8 ms' (the header's words); 'start until priced: fsdp'."""
        if self.how == "unpriced":
            return f"start until priced: {self.name}"
        return f"start: {self.name}, {_ms(self.step_time_s)}"


def ruled_out(plan, pins: dict) -> tuple[str, ...]:
    """The names in `pins` ({class, "<class>@<domain>" or conflict name: axes or resolution},
    as Session.pins gives them) that `plan` decides otherwise: a search under those pins can
    never reach it. A conflict pin rules out only a plan that shards its class (elsewhere the
    conflict never arises)."""
    an = plan.analysis
    out = []
    for name, value in pins.items():
        conflict = next((c for c in an.conflicts if c.name == name), None)
        if conflict is not None:
            if plan.axes_of(conflict.class_id) and plan.resolution_of(conflict) != value:
                out.append(name)
            continue
        try:
            axes = plan.axes_of(name)
        except PlanError:  # not a decision of this analysis: nothing to compare
            continue
        if tuple(axes) != tuple(value):
            out.append(name)
    return tuple(out)


def fits(estimate, memory_cap: float | None) -> bool:
    """Whether `estimate` fits in `memory_cap` bytes (None: the device's memory)."""
    if memory_cap is None:
        return bool(estimate.feasible)
    return estimate.peak_memory_bytes <= memory_cap


def best_expert(experts: dict, pins: dict, memory_cap: float | None):
    """(name, plan, estimate) of the fastest expert plan that `pins` do not rule out and that
    fits, else None. experts: {name: (Plan, Estimate)}."""
    found = [(est.step_time_s, name, plan, est) for name, (plan, est) in experts.items()
             if not ruled_out(plan, pins) and fits(est, memory_cap)]
    if not found:
        return None
    _, name, plan, est = min(found, key=lambda t: (t[0], t[1]))
    return name, plan, est


def smallest(experts: dict, pins: dict):
    """(name, plan, estimate) of the expert plan with the smallest peak memory among those
    `pins` do not rule out (all of them where the pins rule out every one), else None."""
    pool = {n: pe for n, pe in experts.items() if not ruled_out(pe[0], pins)} or experts
    if not pool:
        return None
    name = min(pool, key=lambda n: (pool[n][1].peak_memory_bytes, n))
    return (name, *pool[name])


def unpriced(experts: dict, pins: dict):
    """(name, plan, the pins that overrule it) of the expert plan a Lab shows before anything
    is priced: of `experts` ({name: Plan}), the one `pins` rule out the least of, the first of
    UNPRICED_ORDER and then of `experts` among equals; None where there is no expert plan.
    The caller puts the pins on top."""
    names = [n for n in UNPRICED_ORDER if n in experts]
    names += [n for n in experts if n not in names]
    if not names:
        return None
    overruled = {n: ruled_out(experts[n], pins) for n in names}
    name = min(names, key=lambda n: len(overruled[n]))  # (the first of equals)
    return name, experts[name], overruled[name]


def unpriced_start(name: str, overruled=()) -> Start:
    """The Start of the plan `unpriced` chose, saying it waits for the prices (and which pins
    overrule it)."""
    mine = f", with your pins of {', '.join(overruled)} on top" if overruled else ""
    return Start(name, "unpriced", None, None,
                 f"{name}{mine} is shown until the expert plans are priced, as the recipe that "
                 f"fits most often; then the Lab starts on the fastest plan that fits")


def first_plan(session, pins: dict, with_pins):
    """(plan, its estimate, Start) for `session` (a Session) under `pins` (as Session.pins
    gives them); `with_pins(plan)` puts the pins on an expert plan (the session's pin rules)."""
    experts = session.expert_plans()
    cap, mesh, model = session.memory_cap, session.mesh, session.model
    mine = " under your pins" if pins else ""
    found = best_expert(experts, pins, cap)
    if found is not None:
        name, plan, _ = found
        plan = with_pins(plan.with_mesh(mesh))
        est = model.estimate(plan)
        fitting = sum(1 for p, e in experts.values() if not ruled_out(p, pins) and fits(e, cap))
        return plan, est, Start(name, "expert", est.step_time_s, est.peak_memory_bytes,
                                f"the fastest of the {fitting} expert plans that fit{mine}")
    with stage("start search", "no expert plan fits: a short search for one"):
        result = search(session.analysis, mesh, pins=pins, simulations=SEARCH_SIMULATIONS,
                        budget_s=SEARCH_BUDGET_S, seed=session.seed, memory_cap=cap,
                        cost_model=model, warm_start={n: p for n, (p, _) in experts.items()})
    if result.plan is not None:
        est = result.estimate
        return result.plan.with_mesh(mesh), est, Start(
            "search", "search", est.step_time_s, est.peak_memory_bytes,
            f"no expert plan fits{mine}: the best of a {result.simulations:,}-simulation search")
    least = smallest(experts, pins)
    name, plan = least[:2] if least else ("replicated", Plan.replicated(session.analysis))
    plan = with_pins(plan.with_mesh(mesh))
    est = model.estimate(plan)
    return plan, est, Start(name, "smallest", est.step_time_s, est.peak_memory_bytes,
                            f"no plan found fits in memory{mine}: the expert plan with the "
                            f"smallest peak")


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    if ms >= 100:
        return f"{ms:,.0f} ms"
    if ms >= 10:
        return f"{ms:.1f} ms"
    return f"{ms:.3g} ms"


__all__ = ["Start", "first_plan", "ruled_out", "fits", "best_expert", "smallest", "unpriced",
           "unpriced_start", "UNPRICED_ORDER",
           "SEARCH_SIMULATIONS", "SEARCH_BUDGET_S"]
