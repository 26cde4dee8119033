"""tl.verify: expert plans of the tiny GPT compile, match the unsharded step, and show the
collectives their strategy implies; the comparison rule and the report's table; leaves that are
rounding noise (zero-gradient parameters under Adam) are loosened by the reference's own spread,
and real errors next to them still fail."""

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import toast_lab as tl
from tests import ill_conditioned as ill
from toast_lab.verification import (
    TOLERANCES, VerifyReport, compare_outputs, concrete_args, tolerance_of, verify,
)
from toast_lab.verification._sensitivity import (PERTURBATION_ULPS, SPREAD_FACTOR,
                                                 perturb_inputs)
from toast_lab.verification._verify import _loosened_lines

MESH = tl.Mesh({"data": 4, "model": 2})


@functools.cache
def gpt():
    fn, args = tl.zoo.get("gpt")
    return fn, args, tl.analyze(tl.trace(fn, *args)), tl.zoo.sample("gpt")


def plan_named(name):
    _, _, an, _ = gpt()
    plan = tl.Plan.replicated(an)
    if name == "dp":
        return plan.with_axes("batch", ("data", "model"))
    if name == "megatron":
        return (plan.with_axes("batch", "data").with_axes("heads", "model")
                .with_axes("mlp", "model").with_axes("vocab", "model"))
    if name == "fsdp":  # batch first: activations keep it, parameters are gathered
        return plan.with_axes("batch", ("data",)).with_axes("embed", ("data",))
    assert name == "replicated"
    return plan


@functools.cache
def report(name) -> VerifyReport:
    """One compile per plan, shared by the tests. The replicated plan gets abstract args."""
    fn, args, _, sample = gpt()
    return verify(fn, args if name == "replicated" else sample, plan_named(name), MESH)


def collectives(rep, kind):
    return {axes: total for (k, axes), total in rep.stats.collective_summary().items()
            if k == kind}


@pytest.mark.slow
def test_data_parallel_all_reduces_gradients_over_data():
    rep = report("dp")
    assert rep.ok and rep.numerics_ok, rep
    reduced = collectives(rep, "all-reduce")
    assert any("data" in axes for axes in reduced), rep
    assert not collectives(rep, "all-gather"), rep  # nothing is sharded but the batch


@pytest.mark.slow
def test_megatron_all_reduces_over_model():
    rep = report("megatron")
    assert rep.ok, rep
    reduced = collectives(rep, "all-reduce")
    assert ("model",) in reduced and reduced[("model",)].count >= 2, rep  # per layer, fwd+bwd
    assert ("data",) in reduced, rep  # and the gradients over the batch


@pytest.mark.slow
def test_fsdp_all_gathers_parameters_over_data():
    rep = report("fsdp")
    assert rep.ok, rep
    gathered = collectives(rep, "all-gather")
    assert ("data",) in gathered and gathered[("data",)].count >= 4, rep
    # Parameters live sharded: less argument memory per device than data parallel.
    assert rep.stats.argument_bytes < report("dp").stats.argument_bytes


@pytest.mark.slow
def test_replicated_plan_from_abstract_args_has_no_collectives():
    rep = report("replicated")
    assert rep.ok, rep
    assert rep.stats.collectives == ()
    assert rep.stats.flops > report("dp").stats.flops  # every device does the whole step
    assert rep.compile_s > 0 and rep.run_s > 0
    # Integer inputs were zeros and the Adam moments random: some outputs are NaN in both runs,
    # at the same places, and the check compares the rest.
    assert all(c.ok for c in rep.checks)


@pytest.mark.slow
def test_report_prints_memory_flops_and_collectives():
    rep = report("megatron")
    text = str(rep)
    assert "numerics: ok" in text
    for row in ("argument memory", "output memory", "temp memory", "peak memory", "flops"):
        assert row in text
    assert "MiB" in text
    assert "collective" in text and "mesh axes" in text and "count" in text
    line = next(ln for ln in text.splitlines() if ln.startswith("all-reduce") and " model " in ln)
    total = rep.stats.collective_summary()[("all-reduce", ("model",))]
    assert f"{total.bytes:,}" in line and str(total.count) in line
    assert "estimated" not in text
    assert "ok=True" in repr(rep)
    assert "(none)" in str(report("replicated"))


@pytest.mark.slow
def test_report_compares_an_estimate():
    rep = report("megatron")
    s = rep.stats
    data = rep.stats.collective_summary()[("all-reduce", ("data",))]

    class Estimate:  # a stand-in for the cost model's result: only some fields
        argument_bytes = s.argument_bytes
        peak_memory_bytes = 2 * s.peak_bytes
        flops = s.flops / 2
        collective_bytes = {("all-reduce", "data"): data.bytes,
                            ("all-to-all", ("model",)): 1000}

    with_est = dataclasses.replace(rep, estimate=Estimate())
    rows = with_est.comparison()
    assert rows["argument"] == (s.argument_bytes, s.argument_bytes, 1.0)
    assert rows["peak"][2] == pytest.approx(2.0)
    assert rows["flops"][2] == pytest.approx(0.5)
    assert rows["temp"] == (s.temp_bytes, None, None)
    assert rows["all-reduce over data"][2] == pytest.approx(1.0)
    assert rows["all-to-all over model"] == (0, 1000.0, math.inf)
    text = str(with_est)
    assert "estimated" in text and "est/meas" in text
    peak = next(ln for ln in text.splitlines() if ln.startswith("peak memory"))
    assert peak.rstrip().endswith("2.00")
    assert any(ln.startswith("all-to-all") for ln in text.splitlines())
    # Anything else is shown without estimates, never an error.
    assert "estimated" in str(dataclasses.replace(rep, estimate=object()))


def test_too_few_devices_says_how_to_simulate_more():
    fn, _, an, sample = gpt()
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count=16"):
        verify(fn, sample, tl.Plan.replicated(an), tl.Mesh({"data": 16}))


def test_plan_is_validated_against_the_mesh():
    fn, _, an, sample = gpt()
    plan = tl.Plan.replicated(an).with_axes("heads", ("data", "model"))  # 4 heads, 8 devices
    with pytest.raises(tl.PlanError, match="not divisible"):
        verify(fn, sample, plan, MESH)


# --- the comparison rule ----------------------------------------------------------------------


def test_tolerances_by_dtype():
    assert tolerance_of(np.float32) == TOLERANCES["float32"] == 1e-2
    assert tolerance_of(ml_dtypes.bfloat16) == TOLERANCES["bfloat16"]
    assert tolerance_of(np.float16) == TOLERANCES["float16"]
    assert tolerance_of(np.complex64) == TOLERANCES["float32"]
    assert tolerance_of(ml_dtypes.float8_e4m3fn) > TOLERANCES["bfloat16"]
    assert tolerance_of(np.int32) == tolerance_of(np.bool_) == 0


def test_compare_outputs_relative_2norm():
    rng = np.random.default_rng(0)
    ref = {"w": rng.normal(size=(64, 64)).astype(np.float32), "n": np.arange(5, dtype=np.int32)}
    same = compare_outputs(ref, jax.tree.map(np.copy, ref))
    assert [c.path for c in same] == ["['n']", "['w']"] and all(c.ok for c in same)
    assert all(c.error == 0 for c in same)

    # One element off by a lot is a small 2-norm error; everything off by 2x is not.
    one = dict(ref, w=ref["w"].copy())
    one["w"][3, 4] += 0.1
    assert compare_outputs(one, ref)[1].ok
    doubled = compare_outputs(dict(ref, w=2 * ref["w"]), ref)[1]
    assert not doubled.ok and doubled.error == pytest.approx(1.0)
    assert doubled.ratio == pytest.approx(100.0)
    assert compare_outputs(dict(ref, w=2 * ref["w"]), ref, tolerance=2.0)[1].ok

    # Integers are exact: the error is the fraction of elements that differ.
    ints = compare_outputs(dict(ref, n=np.array([0, 1, 2, 3, 5], np.int32)), ref)[0]
    assert not ints.ok and ints.error == pytest.approx(0.2) and ints.tolerance == 0


def test_compare_outputs_non_finite_and_low_precision():
    ref = np.array([1.0, np.nan, np.inf, -2.0], np.float32)
    assert compare_outputs([ref.copy()], [ref])[0].ok
    moved = np.array([np.nan, 1.0, np.inf, -2.0], np.float32)
    assert compare_outputs([moved], [ref])[0].error == math.inf
    flipped = np.array([1.0, np.nan, -np.inf, -2.0], np.float32)
    assert compare_outputs([flipped], [ref])[0].error == math.inf
    assert compare_outputs([np.full(3, np.nan, np.float32)], [np.ones(3, np.float32)])[0].error \
        == math.inf

    x = np.linspace(-1, 1, 100).astype(ml_dtypes.bfloat16)
    near = (x.astype(np.float32) * 1.01).astype(ml_dtypes.bfloat16)
    check = compare_outputs([near], [x])[0]
    assert check.dtype == "bfloat16" and check.ok and check.error > 0
    assert compare_outputs([np.zeros(0, np.float32)], [np.zeros(0, np.float32)])[0].error == 0
    with pytest.raises(ValueError, match="shaped differently"):
        compare_outputs([x], (x,))


def test_concrete_args():
    args = ({"w": jax.ShapeDtypeStruct((256, 4), np.float32),
             "h": jax.ShapeDtypeStruct((8,), ml_dtypes.bfloat16)},
            {"tokens": jax.ShapeDtypeStruct((2, 3), np.int32), "kept": np.ones(2)})
    a = concrete_args(args, seed=1)
    assert jax.tree.structure(a) == jax.tree.structure(args)
    assert a[0]["w"].dtype == np.float32 and a[0]["h"].dtype == ml_dtypes.bfloat16
    assert 0.015 < float(np.std(a[0]["w"])) < 0.025
    assert np.array_equal(a[1]["tokens"], np.zeros((2, 3), np.int32))
    assert a[1]["kept"] is args[1]["kept"]
    assert np.array_equal(concrete_args(args, seed=1)[0]["w"], a[0]["w"])
    assert not np.array_equal(concrete_args(args, seed=2)[0]["w"], a[0]["w"])


@pytest.mark.slow
def test_report_with_the_cost_models_estimate():
    rep = report("megatron")
    _, _, an, _ = gpt()
    with_est = dataclasses.replace(rep, estimate=tl.estimate(an, rep.plan, MESH))
    rows = with_est.comparison()
    for row in ("argument", "output", "temp", "peak", "flops", "all-reduce over model"):
        measured, estimated, ratio = rows[row]
        assert estimated is not None and ratio is not None, row
    assert "est/meas" in str(with_est)


# --- ill-conditioned leaves: the perturbed reference ----------------------------------------


def test_perturb_inputs_moves_floats_by_a_few_ulps_and_nothing_else():
    rng = np.random.default_rng(0)
    key = jax.random.key(0)
    args = ({"w": rng.normal(size=(64, 64)).astype(np.float32), "zero": np.zeros(8, np.float32),
             "h": np.linspace(1, 2, 512).astype(ml_dtypes.bfloat16),
             "d": rng.normal(size=256), "c": (rng.normal(size=64) + 1j).astype(np.complex64)},
            {"tokens": np.arange(6, dtype=np.int32), "mask": np.ones(3, bool), "key": key,
             "lr": 1e-3, "dev": jax.numpy.ones(4, jax.numpy.float32)})
    moved = perturb_inputs(args, seed=0)
    assert jax.tree.structure(moved) == jax.tree.structure(args)
    for a, b in zip(jax.tree.leaves(args), jax.tree.leaves(moved)):
        assert np.shape(a) == np.shape(b) and getattr(a, "dtype", None) == getattr(b, "dtype", None)
    w, w2 = args[0]["w"], moved[0]["w"]
    relative = (w2 - w) / w
    eps = np.finfo(np.float32).eps
    assert 0.7 * PERTURBATION_ULPS * eps < np.std(relative) < 1.3 * PERTURBATION_ULPS * eps
    assert np.all(np.sign(w2) == np.sign(w))
    assert np.array_equal(moved[0]["zero"], args[0]["zero"])  # zeros stay zero
    # float64 by its own ulps; bfloat16 by about one of its own
    d = (moved[0]["d"] - args[0]["d"]) / args[0]["d"]
    assert np.std(d) < 20 * np.finfo(np.float64).eps and np.any(d != 0)
    h, h2 = (x.astype(np.float32) for x in (args[0]["h"], moved[0]["h"]))
    steps = np.abs(h2 - h) / 2.0 ** -7  # one bfloat16 ulp in [1, 2)
    assert 0.3 < np.mean(steps > 0) < 0.95 and steps.max() <= 5
    c = moved[0]["c"] - args[0]["c"]
    assert np.any(c.real != 0) and np.any(c.imag != 0)
    # integers, booleans, keys and weakly typed scalars are returned as they are
    for name in ("tokens", "mask", "key", "lr"):
        assert moved[1][name] is args[1][name], name
    assert isinstance(moved[1]["dev"], jax.Array) and np.any(moved[1]["dev"] != 1)
    # seeded
    assert np.array_equal(perturb_inputs(args, seed=0)[0]["w"], w2)
    assert not np.array_equal(perturb_inputs(args, seed=1)[0]["w"], w2)


def test_the_perturbed_reference_reuses_the_compile():
    """Same dtypes, shapes and weak types: the second reference run compiles nothing."""
    compiles = []

    def count(event, duration, **_):
        if event == "/jax/core/compile/backend_compile_duration":
            compiles.append(duration)

    def step(params, x, lr):
        return jax.tree.map(lambda p: p - lr * jax.numpy.mean(x) * p, params)

    args = ({"w": np.ones((4, 4), np.float32), "b": np.zeros(4, ml_dtypes.bfloat16)},
            np.arange(8, dtype=np.float32), 0.1)
    reference = jax.jit(step)
    jax.monitoring.register_event_duration_secs_listener(count)
    try:
        jax.block_until_ready(reference(*args))
        first = len(compiles)
        jax.block_until_ready(reference(*perturb_inputs(args, seed=3)))
    finally:
        jax.monitoring.unregister_event_duration_listener(count)
    assert first == 1 and len(compiles) == first


def _noise_case(seed=0):
    """A well-conditioned leaf, an Adam-moment-sized one (tiny next to the others but exact)
    and a rounding-noise leaf, as three runs (sharded, reference, perturbed reference) see
    them: the noise leaf is a fresh draw in every run, the others move by ~1e-6 relative."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(64, 64))
    nu = 1e-9 * rng.random(size=(64, 64))

    def run():
        return {"w": (w * (1 + 1e-6 * rng.normal(size=w.shape))).astype(np.float32),
                "nu": (nu * (1 + 1e-6 * rng.normal(size=nu.shape))).astype(np.float32),
                "bk": (1e-3 * np.sign(rng.normal(size=32))).astype(np.float32),
                "loss": np.float32(4.2)}

    return run(), run(), run()


def test_compare_outputs_loosens_only_the_leaves_the_reference_cannot_reproduce():
    out, ref, moved = _noise_case()
    checks = {c.path: c for c in compare_outputs(out, ref, perturbed=moved)}
    bk = checks["['bk']"]
    assert bk.loosened and bk.ok
    assert bk.error > TOLERANCES["float32"]  # a correct build that the dtype tolerance fails
    assert bk.spread > 0.5 and bk.tolerance == pytest.approx(SPREAD_FACTOR * bk.spread)
    assert bk.base_tolerance == TOLERANCES["float32"]
    for name in ("['w']", "['nu']", "['loss']"):
        c = checks[name]
        assert not c.loosened and c.ok and c.tolerance == TOLERANCES["float32"], c
        assert 0 <= c.spread < 1e-5
    # Without a perturbed reference nothing is loosened, and the noise leaf fails.
    plain = {c.path: c for c in compare_outputs(out, ref)}
    assert not plain["['bk']"].ok and plain["['bk']"].spread == 0
    assert not any(c.loosened for c in plain.values())


@pytest.mark.parametrize("leaf, corrupt", [
    ("w", lambda x: x * 1.02),            # 2% off, next to the loosened noise leaf
    ("nu", lambda x: x * 2),              # a tiny leaf is checked at its own scale
    ("loss", lambda x: x * 1.05),
    ("bk", lambda x: x * 50),             # the noise leaf itself: gross errors still fail
    ("bk", lambda x: np.where(np.arange(x.size) == 3, np.nan, x).astype(x.dtype)),
])
def test_compare_outputs_still_fails_real_errors(leaf, corrupt):
    out, ref, moved = _noise_case()
    out = dict(out, **{leaf: corrupt(out[leaf])})
    checks = {c.path: c for c in compare_outputs(out, ref, perturbed=moved)}
    failed = [p for p, c in checks.items() if not c.ok]
    assert failed == [f"['{leaf}']"], checks


def test_a_zero_reference_is_compared_at_the_step_scale():
    ref = {"w": np.ones(16, np.float32), "g": np.zeros(16, np.float32)}
    noise = dict(ref, g=np.full(16, 1e-9, np.float32))  # rounding where the reference had 0
    assert all(c.ok for c in compare_outputs(noise, ref, perturbed=ref))
    wrong = dict(ref, g=np.full(16, 0.1, np.float32))
    assert [c.path for c in compare_outputs(wrong, ref, perturbed=ref) if not c.ok] == ["['g']"]


def test_leaves_whose_non_finite_entries_move_are_not_compared_and_say_so():
    ref = {"x": np.array([1.0, np.nan, 2.0], np.float32)}
    moved = {"x": np.array([1.0, 2.0, np.nan], np.float32)}
    out = {"x": np.array([np.nan, 1.0, 2.0], np.float32)}
    (x,) = compare_outputs(out, ref, perturbed=moved)
    assert x.loosened and math.isinf(x.tolerance) and x.ok
    assert "['x']: float32[3] not compared" in "\n".join(_loosened_lines((x,)))


def test_integer_leaves_that_move_under_perturbation():
    """An integer output computed from floats (an argmax near a tie): the fraction of entries
    the perturbation moves, times the factor, is what it is checked at."""
    ref = {"n": np.arange(100, dtype=np.int32), "k": np.arange(4, dtype=np.uint32)}
    moved = {"n": np.where(np.arange(100) == 7, -1, ref["n"]).astype(np.int32), "k": ref["k"]}
    k, n = compare_outputs(ref, ref, perturbed=moved)
    assert n.spread == pytest.approx(0.01) and n.tolerance == pytest.approx(SPREAD_FACTOR * 0.01)
    assert n.loosened and not k.loosened and k.tolerance == 0
    few = {"n": np.where(np.arange(100) < 5, -1, ref["n"]).astype(np.int32), "k": ref["k"]}
    many = {"n": np.where(np.arange(100) < 20, -1, ref["n"]).astype(np.int32), "k": ref["k"]}
    assert compare_outputs(few, ref, perturbed=moved)[1].ok
    assert not compare_outputs(many, ref, perturbed=moved)[1].ok
    text = "\n".join(_loosened_lines((n,)))
    assert "['n']: int32[100] spread 0.01, checked at 0.08 (not exact)" in text


# --- steps with zero-gradient parameters, compiled ------------------------------------------


@functools.cache
def ill_conditioned(name):
    builder = {"nnx": ill.nnx_bias_before_batchnorm, "attention": ill.attention_with_key_bias}
    if name == "nnx":
        pytest.importorskip("flax")
    fn, args = builder[name]()
    an = tl.analyze(tl.trace(fn, *args))
    return fn, args, an, tl.strategies.expert(an, MESH)


@functools.cache
def ill_report(name, plan_name) -> VerifyReport:
    fn, args, _, plans = ill_conditioned(name)
    return verify(fn, args, plans[plan_name], MESH)


NOISE_LEAVES = {
    "nnx": ("[0][0]['l1']['bias'].value", "[0][1]['opt_state'][0]['mu']['l1']['bias'].value",
            "[0][1]['opt_state'][0]['nu']['l1']['bias'].value"),
    "attention": ("[0]['bk']", "[1][0].mu['bk']", "[1][0].nu['bk']"),
}


@pytest.mark.slow
@pytest.mark.parametrize("plan_name", ["dp", "megatron", "fsdp+tp"])
@pytest.mark.parametrize("name", ["nnx", "attention"])
def test_correct_plans_pass_on_zero_gradient_parameters(name, plan_name):
    """(a) a flax.nnx bias before BatchNorm, (b) a Keras-style attention key bias: the bias,
    its Adam moments are noise; they are loosened (and would fail at float32's tolerance),
    nothing else is."""
    rep = ill_report(name, plan_name)
    assert rep.ok, rep
    assert tuple(c.path for c in rep.loosened) == NOISE_LEAVES[name], rep
    assert max(c.error for c in rep.loosened) > TOLERANCES["float32"], rep
    for c in rep.checks:
        if not c.loosened:
            assert c.tolerance in (TOLERANCES["float32"], 0.0) and c.spread < 1e-3, c
    text = str(rep)
    assert "numerics: ok" in text and "ill-conditioned: 3 output leaves" in text
    for path in NOISE_LEAVES[name]:
        line = next(ln for ln in text.splitlines() if ln.strip().startswith(path + ":"))
        check = next(c for c in rep.checks if c.path == path)
        assert f"checked at {check.tolerance:.2g}" in line and "(not 1e-02)" in line, line


def _wrong_step(monkeypatch, build_wrong):
    """Make Plan.jit compile `build_wrong(fn)` with the plan's shardings: a sharded build that
    computes something else than the function the reference runs."""

    def jit(plan, fn, jax_mesh, constraints="compute", **kwargs):
        in_shardings, out_shardings = plan.shardings(jax_mesh)
        return jax.jit(build_wrong(fn), in_shardings=in_shardings, out_shardings=out_shardings,
                       **kwargs)

    monkeypatch.setattr(tl.Plan, "jit", jit)


@pytest.mark.slow
def test_a_dropped_partial_sum_still_fails(monkeypatch):
    """(c) the gradients miss one data shard's examples (one device's partial sum dropped):
    the well-conditioned leaves around the key bias fail; the key bias stays loosened, since
    its allowance comes from the unsharded reference only."""
    fn, args, _, plans = ill_conditioned("attention")
    wrong, _ = ill.attention_with_key_bias(drop_shard=0)
    _wrong_step(monkeypatch, lambda fn: wrong)
    rep = verify(fn, args, plans["dp"], MESH)
    assert not rep.ok
    failed = {c.path for c in rep.checks if not c.ok}
    # Adam's update is scale-free and small next to the weights, so the parameters themselves
    # hardly move; their moments and the loss show the lost examples.
    assert {"[1][0].mu['wk']", "[1][0].nu['wk']", "[1][0].mu['wq']", "[2]"} <= failed, rep
    assert tuple(c.path for c in rep.loosened) == NOISE_LEAVES["attention"]
    assert "MISMATCH" in str(rep)


@pytest.mark.slow
@pytest.mark.parametrize("leaf, scale", [("wk", 1.03), ("bk", 50.0)])
def test_a_corrupted_leaf_fails_next_to_an_ill_conditioned_one(monkeypatch, leaf, scale):
    """(c) one output leaf of the sharded step corrupted: Adam's first moment of the key
    kernel by 3% (a well-conditioned leaf beside the loosened key bias), or of the key bias
    itself by 50x. That leaf, and only it, fails."""
    fn, args, _, plans = ill_conditioned("attention")

    def corrupted(fn):
        def step(*a):
            params, (adam, *rest), loss = fn(*a)
            mu = dict(adam.mu, **{leaf: adam.mu[leaf] * scale})
            return params, (adam._replace(mu=mu), *rest), loss
        return step

    _wrong_step(monkeypatch, corrupted)
    rep = verify(fn, args, plans["megatron"], MESH)
    assert [c.path for c in rep.checks if not c.ok] == [f"[1][0].mu['{leaf}']"], rep
    assert "[1][0].mu['bk']" in {c.path for c in rep.loosened}


def test_a_float32_leaf_computed_in_bfloat16_is_checked_at_bfloat16s_tolerance():
    # mixed precision: the float32 master weights are updated from gradients computed in
    # bfloat16, so two summation orders differ in them as bfloat16 does
    from toast_lab.verification._verify import computed_in_tolerances

    def step(w, x):
        g = jax.grad(lambda w: jnp.sum((x.astype(jnp.bfloat16) @ w.astype(jnp.bfloat16))
                                       .astype(jnp.float32) ** 2))(w)
        return w - 0.1 * g, jnp.sum(x * 2.0)

    prog = tl.trace(step, jnp.ones((8, 4)), jnp.ones((2, 8)))
    assert computed_in_tolerances(prog) == [5e-2, 1e-2]


def test_a_scalar_of_rounding_noise_gets_its_spread_from_more_draws():
    """A bias before a softmax over the same axis: its exact gradient is 0, computed as 2.4e-6.
    The one perturbed run verify drew moved it by 6%, correct plans move it by 80-98%: five
    draws size its noise, and correct plans pass. A gross error in it still fails."""
    def step(p, x, y):
        def loss(p):
            a = jax.nn.softmax(x @ p["w"] + p["b"][None, None], axis=1)
            return jnp.mean(((a * x).sum(1) @ p["out"] - y) ** 2)
        g = jax.grad(loss)(p)
        return jax.tree.map(lambda a, b: a - 0.1 * b, p, g), g

    key = jax.random.PRNGKey
    p = {"w": jax.random.normal(key(0), (16, 1)), "b": jnp.zeros((1,)),
         "out": jax.random.normal(key(1), (16, 4))}
    args = (p, jax.random.normal(key(2), (16, 12, 16)), jax.random.normal(key(3), (16, 4)))
    an = tl.analyze(tl.trace(step, *args))
    plans = tl.strategies.expert(an, MESH)
    for name in ("dp", "fsdp"):  # 0.82 and 0.90 off, against 8 x the first draw's 0.06
        rep = verify(step, args, plans[name], MESH)
        assert rep.ok, (name, rep)
        grad_b = next(c for c in rep.checks if c.path == "[1]['b']")
        assert grad_b.loosened and grad_b.spread > 0.3
        # the well-conditioned leaves are untouched
        assert all(c.tolerance == TOLERANCES["float32"] for c in rep.checks
                   if math.prod(c.shape) > 8)
    f = jax.jit(step)
    ref, moved = f(*args), f(*perturb_inputs(args, 0))
    more = [f(*perturb_inputs(args, s)) for s in (2, 4, 6, 8)]
    wrong = (ref[0], dict(ref[1], b=ref[1]["b"] * 50))
    checks = compare_outputs(wrong, ref, perturbed=moved, resampled=more)
    assert [c.path for c in checks if not c.ok] == ["[1]['b']"]
