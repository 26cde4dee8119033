"""The cost of decisions beyond sharding: remat policies and micro-batches priced on the step
as plan.jit rewrites it (cost/_step_models.py), checked against what XLA compiles; and the
search taking them, so that a step written without remat gets a plan that fits."""

from __future__ import annotations

import functools

import jax
import pytest

import toast_lab as tl
from toast_lab.verification import FAST_COMPILE, read_compiled

MESH = tl.Mesh({"data": 2, "model": 4}, device="cpu")
SHAPE = dict(layers=2, batch=16, seq=64)


@functools.cache
def analysed(name: str = "gpt_scan"):
    fn, args = tl.zoo.get(name, **SHAPE)
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _layers(an) -> str:
    (group,) = [g.name for g in an.layer_groups if g.kind != "scope"]
    return group


def _plan(an, policy="everything", count=1, strategy="fsdp+tp"):
    plan = tl.strategies.expert(an, MESH)[strategy].with_remat(_layers(an), policy)
    return plan.with_micro_batches(count) if count > 1 else plan


@pytest.mark.slow
@pytest.mark.parametrize("name, policy, count", [
    ("gpt_scan", "everything", 2), ("gpt_scan", "dots_with_no_batch_dims", 1),
    ("gpt_scan", "full", 1), ("gpt_scan", "full", 4),
    ("gpt", "dots_with_no_batch_dims", 1), ("gpt", "full", 2),
    ("llama", "full", 1), ("llama", "dots_with_no_batch_dims", 2),
    ("moe", "full", 1)])
def test_remat_and_micro_batches_are_priced_as_xla_compiles_them(name, policy, count):
    """Peak memory within 20% and flops (loop bodies once, as XLA counts them) within 10% of
    XLA's compile of plan.jit's rewritten step. The unrolled GPT and the MoE: XLA:CPU removes
    the barrier before its breadth-first schedule and runs the recomputation in the forward
    pass, at the top level and inside the micro-batch loop alike, so it saves no memory
    there (the estimate had it saving half). Llama: the logits freed once the exp is
    written, jnp.where's fill made inside the layer loops, the residual stacks kept whole
    through the backward scan."""
    fn, args, an = analysed(name)
    plan = _plan(an, policy, count)
    est = tl.cost_model(an, MESH).estimate(plan)
    jax_mesh = MESH.jax_mesh(jax.devices()[:MESH.size])
    xla = read_compiled(plan.jit(fn, jax_mesh, compiler_options=FAST_COMPILE)
                        .lower(*args).compile(), jax_mesh)
    assert est.peak_memory_bytes == pytest.approx(xla.peak_bytes, rel=0.20)
    assert est.flops_loop_bodies_once == pytest.approx(xla.flops, rel=0.10)


def test_recomputing_costs_flops_and_saves_memory():
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    kept, dots, full = (model.estimate(_plan(an, p))
                        for p in ("everything", "dots_with_no_batch_dims", "full"))
    assert kept.flops < dots.flops < full.flops  # the forward pass again, less what is kept
    assert full.peak_memory_bytes < 0.6 * kept.peak_memory_bytes
    assert dots.peak_memory_bytes < 0.6 * kept.peak_memory_bytes


def test_micro_batches_divide_the_activations_and_gather_the_weights_each_time():
    """Under FSDP each micro-batch gathers the weights again: more communication, the same
    flops, less memory."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    one, four = model.estimate(_plan(an)), model.estimate(_plan(an, count=4))
    assert four.peak_memory_bytes < 0.6 * one.peak_memory_bytes
    assert four.flops == pytest.approx(one.flops, rel=0.02)
    gathers = [sum(c.count for (kind, _), c in e.collectives.items() if kind == "all-gather")
               for e in (one, four)]
    assert gathers[1] > 2 * gathers[0]


def test_the_estimate_of_a_rewritten_step_is_split_by_the_scopes_as_written():
    """by_scope names the step's own scopes (a recomputation counts in its layer's), and what
    the rewrite adds (the micro-batches' cuts and accumulators) under a name of its own."""
    _, _, an = analysed("gpt")
    model = tl.CostModel(an, MESH)
    written = set(model.estimate(_plan(an)).by_scope)
    for plan in (_plan(an, "full"), _plan(an, count=2)):
        est = model.estimate(plan)
        added = set(est.by_scope) - written
        assert added <= {"(micro-batches, stages)"}, added
        assert bool(added) == (plan.step.micro_batches > 1)
        assert sum(c for c, _ in est.by_scope.values()) == pytest.approx(est.compute_s)
    plain = model.estimate(_plan(an)).by_scope
    full = model.estimate(_plan(an, "full")).by_scope
    more = {k: full[k][0] - plain[k][0] for k in plain}
    blocks = sum(d for k, d in more.items() if k.startswith("block"))
    assert blocks > 0.9 * sum(more.values())  # the recomputation is in the layers


def test_the_plans_classes_carry_over_to_the_rewritten_step():
    """Every class the plan shards reaches the rewritten step; a replicated plan stays free of
    collectives there, and the sharded one pays on the axes it uses."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    step = _plan(an, "full", 2).step
    rewrite = model.for_step(step).rewrite
    plan = _plan(an)
    for k, axes in plan.assignments:
        assert axes == () or rewrite.classes[k], an.classes[k].name
    replicated = model.estimate(tl.Plan.replicated(an).with_micro_batches(2))
    assert replicated.collectives == {}
    sharded = model.estimate(_plan(an, "full", 2))
    axes = {a for (_, over), _ in sharded.collectives.items() for a in over}
    assert axes == {"data", "model"}


def test_micro_batches_whose_examples_do_not_divide_over_the_batch_devices_are_refused():
    """16 examples over 8 devices (the batch on data x model) in 4 micro-batches leave 4
    per micro-batch: the search sees no price, an estimate says why."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    batch = an.micro_batching.batch
    plan = tl.Plan.replicated(an).with_axes(batch, ("data", "model")).with_micro_batches(4)
    step = model.for_step(plan.step)
    masks = [(an.class_named(batch).id, 0b11)]
    assert step.step_and_peak(masks) == (float("inf"), float("inf"))
    with pytest.raises(ValueError, match="micro-batch"):
        model.estimate(plan)


def test_micro_batches_of_one_example_over_a_sharded_batch_are_refused():
    """16 examples in 16 micro-batches leave one each, a batch dim of size 1 in the rewritten
    step that no class of it carries: the batch over the 2 data devices has no price, and
    the search never answers with it."""
    fn, args = tl.zoo.get("gpt_scan", **{**SHAPE, "batch": 8})
    an = tl.analyze(tl.trace(fn, *args))
    model = tl.cost_model(an, MESH)
    plan = tl.Plan.replicated(an).with_axes(an.micro_batching.batch, ("data",))
    assert model.price(plan.with_micro_batches(8)) == (float("inf"), float("inf"))
    assert model.price(plan.with_micro_batches(4))[0] < float("inf")
    pins = {"micro_batches": 8, an.micro_batching.batch: ("data",)}
    with pytest.raises(tl.PlanError, match="contradictory pins micro_batches=8 and batch="):
        tl.search(an, MESH, pins=pins, simulations=50, seed=0)


def test_the_search_makes_a_step_written_without_remat_fit():
    """A memory cap under every expert plan's peak as written: the search finds a plan that
    fits by recomputing or micro-batching, and says so in the plan."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    smallest = min(model.estimate(p).peak_memory_bytes
                   for p in tl.strategies.expert(an, MESH).values())
    cap = 0.6 * smallest
    result = tl.search(an, MESH, simulations=400, memory_cap=cap, seed=0)
    assert result.feasible, result.message
    assert not result.plan.step.is_default
    assert result.estimate.peak_memory_bytes <= cap
    assert model.estimate(result.plan) == result.estimate


def test_pinned_step_decisions_hold_and_no_plan_fits_names_the_closest():
    _, _, an = analysed()
    group = _layers(an)
    pins = {f"remat@{group}": "everything", "micro_batches": 1}
    held = tl.search(an, MESH, simulations=150, pins=pins, seed=0)
    assert held.plan.step.is_default
    tiny = tl.search(an, MESH, simulations=150, memory_cap=2**16, seed=0)
    assert not tiny.feasible
    assert "remat policies and micro-batch counts" in tiny.message
    assert f"remat@{group}=" in tiny.message or "micro_batches=" in tiny.message
    with pytest.raises(tl.PlanError, match="choose one of"):
        tl.search(an, MESH, simulations=10, pins={f"remat@{group}": "most"})


def test_the_lab_session_pins_step_decisions_prices_them_and_searches_around_them():
    """A pinned remat policy changes the session's estimate as tl.estimate does, the class
    choices are priced with it, and a search keeps it."""
    from toast_lab.lab import Session

    _, _, an = analysed()
    group = _layers(an)
    session = Session(an, MESH, _plan(an))
    before = session.estimate
    plan = session.pin(f"remat@{group}", "full")
    assert plan.step.policy_of(group) == "full" and f"remat@{group}" in plan.pinned
    after = session.estimate
    assert after == tl.cost_model(an, MESH).estimate(plan)
    assert after.peak_memory_bytes < before.peak_memory_bytes and after.flops > before.flops
    with pytest.raises(tl.lab.PinError, match="remat policy 'most'"):
        session.pin(f"remat@{group}", "most")
    session.search(budget_s=None, simulations=60, background=False)
    assert session.plan.step.policy_of(group) == "full"
    session.unpin(f"remat@{group}")
    assert f"remat@{group}" not in session.plan.pinned


def test_a_search_builds_rewritten_step_models_only_while_its_budget_affords_them():
    """Past the point where one more build would likely overrun the budget, a plan whose
    rewritten step has no model yet goes unpriced; the step as written, and the rewritten
    steps already built, are still priced."""
    import threading
    import time

    import numpy as np

    from toast_lab.plan_search import STEP, Space, StepModels

    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    space = Space(an, MESH)
    as_written = np.zeros(len(space.decisions), np.int64)
    full = as_written.copy()
    full[[p for p, d in enumerate(space.decisions) if d.kind == STEP][0]] = 2
    assert space.step_of(full).remat == ((_layers(an), "full"),)
    late = StepModels(model, deadline=time.perf_counter() - 1.0)
    late.longest_s = 1.0
    assert late.price(space, full) == (float("inf"), float("inf"))
    assert np.isfinite(late.price(space, as_written)).all()
    free = StepModels(model, deadline=None)
    assert free.price(space, full) == model.price(space.plan(full))
    assert free.longest_s > 0 and space.step_of(full) in free.built
    # a stop during a build ends the wait at once (the build goes on on its own thread); a
    # fresh analysis, whose rewritten steps no other test has built
    fn, args, _ = analysed()
    fresh = tl.analyze(tl.trace(fn, *args))
    stop = threading.Event()
    stop.set()
    stopped = StepModels(tl.cost_model(fresh, MESH), deadline=None, stop=stop)
    fresh_space = Space(fresh, MESH)
    assert stopped.price(fresh_space, full) == (float("inf"), float("inf"))


def test_every_price_a_seeded_search_takes_is_what_a_fresh_model_prices(monkeypatch):
    """Each plan a search prices, as written or with remat and micro-batches (the rewritten
    steps' models built as it runs, every model's state reused plan after plan), is priced
    the same by the models of a fresh analysis asked in the reverse order: no evaluation
    leaves behind anything that the next one reads."""
    import math

    from toast_lab.cost import plan_arrays
    from toast_lab.plan_search import StepModels

    fn, args, an = analysed()
    model = tl.cost_model(an, MESH)
    cap = 0.6 * min(model.estimate(p).peak_memory_bytes
                    for p in tl.strategies.expert(an, MESH).values())
    priced = []
    price = StepModels.price

    def recording(self, space, choices):
        got = price(self, space, choices)
        priced.append((space.step_of(choices), space.decision_lists(choices), got))
        return got

    monkeypatch.setattr(StepModels, "price", recording)
    tl.search(an, MESH, simulations=120, budget_s=None, memory_cap=cap, seed=1)
    assert len({step for step, _, _ in priced}) > 3
    again = tl.analyze(tl.trace(fn, *args))
    fresh = tl.cost_model(again, MESH)
    for step, lists, got in reversed(priced):
        if step.is_default:
            assert fresh.step_and_peak(*plan_arrays(again, *lists)) == got
        elif math.isfinite(got[0]):
            assert fresh.for_step(step).step_and_peak(*lists) == got


def test_random_plans_priced_in_turn_by_two_models_are_priced_as_a_fresh_model_does():
    """Random plans (conflicts resolved every way, classes over every axis set) priced in
    turn as written and with remat or micro-batches, each model's state reused plan after
    plan, are priced the same by the models of a fresh analysis asked in the reverse
    order."""
    import math

    import numpy as np

    from toast_lab.cost import plan_arrays
    from toast_lab.plan_search import STEP, Space

    fn, args, an = analysed()
    model = tl.cost_model(an, MESH)
    space = Space(an, MESH)
    steps = [p for p, d in enumerate(space.decisions) if d.kind == STEP]
    rng = np.random.default_rng(0)
    priced = []
    for i in range(120):
        choices = np.array([rng.integers(len(d.choices)) for d in space.decisions])
        choices[steps] = 0
        step = steps[i % len(steps)]  # as written, or one remat, count or pipeline each
        choices[step] = (i // len(steps)) % len(space.decisions[step].choices)
        priced.append((space.step_of(choices), space.decision_lists(choices),
                       space.price(model, choices)))
    assert sum(not step.is_default for step, _, _ in priced) > 60
    again = tl.analyze(tl.trace(fn, *args))
    fresh = tl.cost_model(again, MESH)
    for step, lists, got in reversed(priced):
        if step.is_default:
            assert fresh.step_and_peak(*plan_arrays(again, *lists)) == got
        elif math.isfinite(got[0]):
            assert fresh.for_step(step).step_and_peak(*lists) == got


def test_the_memory_timeline_of_a_rewritten_step_names_the_ops_as_written():
    """The memory chart of a plan with remat shows the rewritten step (its peak the
    estimate's, lower than the step as written), each position an op of the program as
    written, the recomputed forward ops among them twice."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    kept, full = (model.memory_timeline(_plan(an, p)) for p in ("everything", "full"))
    assert full.peak_bytes == pytest.approx(model.estimate(_plan(an, "full")).peak_memory_bytes)
    assert full.peak_bytes < kept.peak_bytes
    n = len(an.program.ops)
    assert ((full.ops >= -1) & (full.ops < n)).all() and 0 <= full.peak_op < n
    assert len(full.ops) > len(kept.ops)  # the recomputation runs more ops


def test_a_rewritten_full_remat_prices_like_the_users_own_checkpoint():
    """The zoo's Llama with jax.checkpoint on its layer, and the same step written without it
    under remat@layer=full, on TPUs (where XLA fuses the causal attention): the same flops
    and compute time. The rewritten step's ops keep their innermost scope (the attention
    einsums are the fused kernel they are), its barrier copies nothing, and the causal mask
    JAX moves out of the loop without a checkpoint is seen as causal."""
    mesh = tl.Mesh({"data": 8}, device="tpu-v5p")
    cfg = dict(batch=8, seq=512, embed=256, heads=4, kv_heads=4, mlp=512, layers=2,
               dtype="bfloat16")
    estimates = []
    for remat in (True, False):
        fn, args = tl.zoo.get("llama", remat=remat, **cfg)
        an = tl.analyze(tl.trace(fn, *args))
        plan = tl.Plan.from_decisions(an, {"batch": ("data",), "embed": ("data",)})
        estimates.append(tl.estimate(an, plan if remat else plan.with_remat("layer", "full"),
                                     mesh))
    checkpointed, rewritten = estimates
    assert rewritten.flops == pytest.approx(checkpointed.flops, rel=0.01)
    assert rewritten.compute_s == pytest.approx(checkpointed.compute_s, rel=0.02)
