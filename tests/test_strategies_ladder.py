"""The expert strategies climb their recipes' remat ladder where they do not fit as written:
"minimal" remat, "full" remat, then micro-batches, the first rung that fits, named after the
strategy; the variants compile, compute the step as written, and the search treats them as
experts (its answer is never worse than any of them)."""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import optax
import pytest

import toast_lab as tl
from toast_lab.strategies import remat_ladder
from toast_lab.verification import FAST_COMPILE, read_compiled

MESH = tl.Mesh({"data": 2, "model": 4}, device="cpu")
SHAPE = dict(layers=2, batch=16, seq=64)
NAME = re.compile(r"^(?P<base>[a-z0-9+]+) \((?P<words>.+)\)$")


@functools.cache
def analysed(name: str = "gpt_scan", **config):
    fn, args = tl.zoo.get(name, **{**SHAPE, **config})
    return fn, args, tl.analyze(tl.trace(fn, *args))


class CountingModel:
    """A cost model that records the StepDecisions of every plan it prices."""

    def __init__(self, model):
        self.model, self.priced = model, []

    def price(self, plan):
        self.priced.append(plan.step)
        return self.model.price(plan)


def _written_peaks(an) -> dict[str, float]:
    model = tl.cost_model(an, MESH)
    return {k: model.price(p)[1]
            for k, p in tl.strategies.expert(an, MESH, fit=False).items()}


def test_plans_that_fit_as_written_get_no_variant_and_price_no_rewritten_step():
    _, _, an = analysed()
    counting = CountingModel(tl.cost_model(an, MESH))
    plans = tl.strategies.expert(an, MESH, cost_model=counting)  # 16 GiB: everything fits
    assert plans.variant_of == {}
    assert all(p.step.is_default for p in plans.values())
    assert counting.priced and all(step.is_default for step in counting.priced)
    assert plans == tl.strategies.expert(an, MESH, fit=False)


def test_where_no_plan_fits_as_written_each_strategy_climbs_its_recipes_ladder():
    """A cap under every expert plan's peak as written: each strategy keeps its plan as written
    and gains a variant with its sharding and the first rung of the ladder that fits (else
    the rung with the smallest peak), named after what it adds."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    written = tl.strategies.expert(an, MESH, fit=False)
    cap = 0.6 * min(_written_peaks(an).values())
    counting = CountingModel(model)
    plans = tl.strategies.expert(an, MESH, memory_cap=cap, cost_model=counting)
    ladder = remat_ladder(an)
    assert {s for s in counting.priced if not s.is_default} <= set(ladder)
    assert {k: p for k, p in plans.items() if k in written} == dict(written)
    assert set(plans.variant_of.values()) == set(written)
    fitting = 0
    for name, base in plans.variant_of.items():
        plan, shape = plans[name], NAME.match(name)
        assert shape and shape["base"] == base, name
        assert (plan.assignments, plan.overrides) == (written[base].assignments,
                                                     written[base].overrides)
        words = shape["words"].split(", ")
        policies = {p for _, p in plan.step.remat}
        assert ("remat minimal" in words) == (policies == {"dots_with_no_batch_dims"})
        assert ("remat full" in words) == (policies == {"full"})
        count = plan.step.micro_batches
        assert (f"{count} micro-batches" in words) == (count > 1)
        # the first rung that fits: no rung before it (that the plan's devices can run) does
        rung = ladder.index(plan.step)
        earlier = [model.price(written[base].with_remat("block", s.policy_of("block"))
                               .with_micro_batches(s.micro_batches))[1]
                   for s in ladder[:rung]]
        assert all(peak > cap for peak in earlier), name
        fitting += model.price(plan)[1] <= cap
    assert fitting >= 3
    assert "fsdp (remat minimal)" in plans  # FSDP's activations fit with MaxText's "minimal"


def test_the_ladder_stops_at_the_first_rung_that_fits():
    """A cap that only one strategy misses as written, by a little: that one strategy prices
    "minimal" remat and stops there; the others price nothing rewritten."""
    _, _, an = analysed()
    peaks = _written_peaks(an)
    largest = max(peaks, key=peaks.get)
    cap = 0.99 * peaks[largest]
    assert sorted(peaks.values())[-2] <= cap  # (the others fit)
    counting = CountingModel(tl.cost_model(an, MESH))
    plans = tl.strategies.expert(an, MESH, memory_cap=cap, cost_model=counting)
    assert plans.variant_of == {f"{largest} (remat minimal)": largest}
    assert [s for s in counting.priced if not s.is_default] == [remat_ladder(an)[0]]


def test_a_stack_the_user_checkpoints_keeps_its_remat_and_climbs_micro_batches_only():
    _, _, an = analysed(remat=True)
    assert all(not s.remat and s.micro_batches > 1 for s in remat_ladder(an))
    cap = 0.8 * min(_written_peaks(an).values())
    plans = tl.strategies.expert(an, MESH, memory_cap=cap)
    assert plans.variant_of
    for name in plans.variant_of:
        assert re.fullmatch(r"[a-z0-9+]+ \(\d micro-batches\)", name), name
        assert not plans[name].step.remat


def test_a_step_with_neither_repeated_layers_nor_a_splittable_batch_has_no_ladder():
    """An MLP with no named scopes and a loss normalised by a count over the batch: nothing to
    recompute or accumulate, so the strategies stay as written however small the cap."""
    def step(params, x, y):
        def loss_fn(p):
            h = jax.nn.relu(x @ p["w1"])
            loss = optax.softmax_cross_entropy_with_integer_labels(h @ p["w2"], y)
            return loss.sum() / jnp.maximum(jnp.sum(y >= 0), 1)
        grads = jax.grad(loss_fn)(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

    params = {"w1": jnp.zeros((64, 256)), "w2": jnp.zeros((256, 10))}
    an = tl.analyze(tl.trace(step, params, jnp.ones((32, 64)), jnp.zeros((32,), jnp.int32)))
    assert not an.micro_batching.legal and remat_ladder(an) == ()
    plans = tl.strategies.expert(an, MESH, memory_cap=1024)
    assert plans.variant_of == {} and all(p.step.is_default for p in plans.values())


def test_a_bad_memory_cap_is_refused_naming_it():
    _, _, an = analysed()
    for bad in (0, -1.0, float("nan"), "16GiB", True):
        with pytest.raises(ValueError, match="memory_cap must be a positive, finite number"):
            tl.strategies.expert(an, MESH, memory_cap=bad)


def test_the_search_is_never_worse_than_a_strategy_with_its_recipes_remat():
    """Caps where the fastest expert plan that fits is a remat variant, though some fit as
    written: the search decides remat and micro-batches too, and beats or matches every
    expert plan that fits, the variants among them."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    peaks = sorted(_written_peaks(an).values())
    for cap in (0.6 * peaks[0], 1.01 * peaks[0]):  # none fits as written; one does
        plans = tl.strategies.expert(an, MESH, memory_cap=cap)
        priced = {k: model.price(p) for k, p in plans.items()}
        fits = {k: step for k, (step, peak) in priced.items() if peak <= cap}
        assert min(fits, key=fits.get) in plans.variant_of
        result = tl.search(an, MESH, memory_cap=cap, simulations=300, seed=0)
        assert result.feasible, result.message
        for name, step in fits.items():
            assert result.estimate.step_time_s <= step * (1 + 1e-9), (cap, name)


def _compiled_peak(fn, args, plan) -> float:
    jax_mesh = MESH.jax_mesh(jax.devices()[:MESH.size])
    lowered = plan.jit(fn, jax_mesh, compiler_options=FAST_COMPILE).lower(*args)
    return read_compiled(lowered.compile(), jax_mesh).peak_bytes


@pytest.mark.slow
def test_a_strategys_remat_variant_compiles_and_computes_the_step_as_written():
    """The variants plan.jit compiles on 8 simulated devices and tl.verify checks against the
    step as written (one with remat alone, one with micro-batches), and XLA's peak memory
    is below the strategy's as written."""
    fn, args, an = analysed()
    cap = 0.6 * min(_written_peaks(an).values())
    plans = tl.strategies.expert(an, MESH, memory_cap=cap)
    chosen = {}
    for name in plans.variant_of:
        chosen.setdefault(plans[name].step.micro_batches > 1, name)
    assert set(chosen) == {False, True}
    sample = tl.zoo.sample("gpt_scan", **SHAPE)
    for name in chosen.values():
        plan, base = plans[name], plans[plans.variant_of[name]]
        report = tl.verify(fn, sample, plan, MESH)
        assert report.numerics_ok, str(report)
        assert report.stats.peak_bytes < _compiled_peak(fn, args, base), name


def test_the_search_tries_remat_where_it_makes_the_fastest_expert_faster():
    """Every strategy fits as written, and the fastest of them is faster still with its
    recipe's remat (on this memory-bound step the recomputed values are never written and
    read back): the search, held to that plan's sharding, takes the remat too."""
    _, _, an = analysed()
    model = tl.cost_model(an, MESH)
    plans = tl.strategies.expert(an, MESH)
    assert plans.variant_of == {}
    fastest = min(plans.values(), key=lambda p: model.price(p)[0])
    faster = tl.strategies.faster_with_remat(fastest, MESH, MESH.device.memory_bytes, model)
    assert faster is not None and faster.assignments == fastest.assignments
    assert model.price(faster)[0] < model.price(fastest)[0]
    pins = {c.name: fastest.axes_of(c.id) for c in an.classes}
    pins.update(fastest.override_axes)
    pins.update(fastest.conflict_resolutions)
    result = tl.search(an, MESH, pins=pins, simulations=50, seed=0)
    assert not result.plan.step.is_default
    assert result.estimate.step_time_s <= model.price(faster)[0] * (1 + 1e-9)
