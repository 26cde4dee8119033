"""search(): MCTS around pins, with a memory cap, stop requests, progress and reference points."""

import threading
import time

import jax
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.plan_search import STEP, Space, exhaustive, random_search, search

# Sizes where sharding pays on an H100 mesh (the default tiny sizes are so small that the
# replicated plan wins, which would make "finds the optimum" trivial).
BIG = {
    "mlp": dict(batch=4096, features=1024, hidden=(4096, 4096), classes=1024),
    "gpt": dict(size="gpt2-small", layers=2),
    "moe": dict(batch=64, seq=512, embed=512, heads=8, mlp=2048, vocab=8192),
    "gnn": dict(nodes=65536, edges=262144, features=256, hidden=512, mlp=1024),
}


def _analysis(name, **config):
    fn, args = tl.zoo.get(name, **config)
    return fn, args, tl.analyze(tl.trace(fn, *args))


@pytest.fixture(scope="module")
def gpt_big():
    return _analysis("gpt", **BIG["gpt"])


MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")


def test_same_seed_same_result(gpt_big):
    _, _, an = gpt_big
    a = search(an, MESH, simulations=300, budget_s=None, seed=3)
    b = search(an, MESH, simulations=300, budget_s=None, seed=3)
    assert a.plan == b.plan and a.estimate.step_time_s == b.estimate.step_time_s
    assert a.simulations == 300 and a.tree_nodes > 10


def test_search_beats_or_matches_every_expert_strategy(gpt_big):
    _, _, an = gpt_big
    res = search(an, MESH, budget_s=3, seed=0)
    experts = tl.strategies.expert(an, MESH)
    best_expert = min(tl.estimate(an, p, MESH).step_time_s for p in experts.values())
    assert res.feasible and res.estimate.step_time_s <= best_expert * 1.0001
    assert res.history and res.history[-1][2] == pytest.approx(res.estimate.step_time_s)


def test_search_fits_where_data_parallel_does_not(gpt_big):
    _, _, an = gpt_big
    peaks = {k: tl.estimate(an, p, MESH).peak_memory_bytes
             for k, p in tl.strategies.expert(an, MESH).items()}
    dp = tl.estimate(an, tl.strategies.expert(an, MESH)["dp"], MESH)
    assert min(peaks.values()) < 0.95 * peaks["dp"]
    cap = 0.5 * (min(peaks.values()) + peaks["dp"])  # some plan fits, data parallel does not
    res = search(an, MESH, memory_cap=cap, budget_s=2, seed=0)
    assert res.feasible and res.estimate.peak_memory_bytes <= cap < dp.peak_memory_bytes


def test_pins_are_kept(gpt_big):
    _, _, an = gpt_big
    (conflict,) = an.conflicts
    pins = {"batch": ("data",), "seq": "model", conflict.name: "keep_dim3"}
    res = search(an, MESH, pins=pins, simulations=200, budget_s=None)
    assert res.plan.axes_of("batch") == ("data",) and res.plan.axes_of("seq") == ("model",)
    assert res.plan.resolution_of(conflict) == "keep_dim3"
    assert {"batch", "seq", conflict.name} <= set(res.plan.pinned)


def test_a_pinned_class_keeps_its_axes_on_every_tensor_of_the_class():
    # The batch of tanh(x @ w) pinned to data: w's columns, unpinned and bigger, once ranked
    # first and took data on every activation, leaving the pin on the input x alone.
    import jax.numpy as jnp

    def step(p, x):
        g = jax.grad(lambda p: jnp.sum(jnp.tanh(x @ p["w"])))(p)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g)

    an = tl.analyze(tl.trace(step, {"w": jnp.ones((16, 32))}, jnp.ones((8, 16))))
    batch = an.class_named("x[0]")
    res = search(an, tl.Mesh({"data": 8}, device="h100"), pins={"x[0]": "data"},
                 simulations=300, budget_s=None, seed=0)
    assert len(batch.members) > 1
    assert all(res.plan.value_axes(v)[d] == ("data",) for v, d in batch.members)


@pytest.mark.parametrize("mesh, pins, message", [
    (MESH, {"bogus": "data"}, "name no class"),
    (tl.Mesh({"data": 3}), {"heads": "data"}, "size 16, not divisible by the 3 devices"),
    (MESH, {"batch": "pipeline"}, "no axes"),
])
def test_bad_pins_are_refused_clearly(gpt_big, mesh, pins, message):
    _, _, an = gpt_big
    with pytest.raises(tl.PlanError, match=message):
        search(an, mesh, pins=pins, simulations=10, budget_s=None)


def test_contradictory_pins_are_refused(gpt_big):
    _, _, an = gpt_big
    (conflict,) = an.conflicts
    with pytest.raises(tl.PlanError, match="contradictory pins"):
        search(an, MESH, pins={"seq": (), conflict.name: "keep_dim2"}, simulations=10,
               budget_s=None)


def test_no_plan_fits_says_the_smallest_peak(gpt_big):
    _, _, an = gpt_big
    res = search(an, MESH, memory_cap=1 << 20, simulations=300, budget_s=None)
    assert res.plan is None and not res.feasible
    assert res.closest is not None and res.closest_estimate.peak_memory_bytes > 1 << 20
    assert "no plan fits" in res.message and "smallest peak" in res.message


@pytest.mark.slow  # asserts wall-clock latency: the Lab's Stop button promises 0.2 s
def test_stop_request_from_another_thread_is_honoured_quickly(gpt_big):
    _, _, an = gpt_big
    stop = threading.Event()
    out = {}

    def run():
        out["res"] = search(an, MESH, budget_s=60, stop=stop)
        out["end"] = time.perf_counter()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(1.0)
    asked = time.perf_counter()
    stop.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert out["end"] - asked < 0.2
    assert out["res"].feasible


def test_callback_reports_progress(gpt_big):
    _, _, an = gpt_big
    seen = []
    search(an, MESH, budget_s=1.0, callback=seen.append, callback_every_s=0.05)
    assert len(seen) >= 3 and seen[-1].done and not any(p.done for p in seen[:-1])
    last = seen[-1]
    assert last.plan is not None and last.estimate is not None
    assert last.simulations > 1 and last.sims_per_s == pytest.approx(
        last.simulations / last.elapsed_s)
    steps = [p.estimate.step_time_s for p in seen]
    assert steps == sorted(steps, reverse=True)  # the best so far only improves


@pytest.mark.parametrize("name, shape", [
    # With collectives overlapping compute, plans with the batch on either axis of this mesh
    # come within 3% of each other: the search must still settle on the right one.
    ("mlp", {"data": 4, "model": 2}),
    ("mlp", {"data": 2, "fsdp": 2, "model": 2}),
    ("moe", {"data": 8}), ("gnn", {"data": 4, "model": 2}),
])
def test_mcts_reaches_the_exhaustive_optimum_in_a_tenth_of_the_plans(name, shape):
    _, _, an = _analysis(name, **BIG[name])
    mesh = tl.Mesh(shape, device="h100")
    # the sharding decisions alone: the step as written (its remat and micro-batch decisions
    # pinned), so that the exhaustive optimum stays within reach
    pins = {d.name: d.choices[0] for d in Space(an, mesh).decisions if d.kind == STEP}
    space = Space(an, mesh, pins)
    assert 1000 <= space.size <= 1e5
    best = exhaustive(an, mesh, pins)
    assert best.plan.class_axes, "the optimum should shard something"
    res = search(an, mesh, pins, simulations=int(space.size // 10), budget_s=None, seed=0)
    assert res.estimate.step_time_s <= best.estimate.step_time_s * 1.01
    rnd = random_search(an, mesh, pins, simulations=int(space.size // 10), budget_s=None,
                        seed=0)
    assert rnd.estimate.step_time_s >= best.estimate.step_time_s


@pytest.mark.slow
@pytest.mark.parametrize("name, shape", [("gpt", {"data": 4, "model": 2}),
                                         ("mlp", {"data": 2, "fsdp": 2, "model": 2})])
def test_searched_plans_compile_and_match_the_unsharded_step(name, shape):
    # tiny sizes, which compile in seconds; as many heads as the mesh has devices, so any
    # sharding of them the search finds at scale divides here too
    fn, args, an = _analysis(name, **({"heads": 8} if name == "gpt" else {}))
    big = _analysis(name, **BIG[name])[2]
    mesh = tl.Mesh(shape, device="h100")
    res = search(big, mesh, simulations=500, budget_s=None)
    # Apply the decisions found at scale to the small model (same classes, same names).
    plan = tl.Plan.from_decisions(an, res.plan.class_axes, res.plan.conflict_resolutions)
    sample = tl.zoo.sample(name, **({"heads": 8} if name == "gpt" else {}))
    want = jax.jit(fn)(*sample)
    got = plan.jit(fn, mesh.jax_mesh())(*sample)  # donates sample's training state
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-3, atol=2e-4)
