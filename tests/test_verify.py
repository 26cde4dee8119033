"""tl.verify: expert plans of the tiny GPT compile, match the unsharded step, and show the
collectives their strategy implies; the comparison rule and the report's table."""

import dataclasses
import functools
import math

import jax
import ml_dtypes
import numpy as np
import pytest

import toast_lab as tl
from toast_lab.verification import (
    TOLERANCES, VerifyReport, compare_outputs, concrete_args, tolerance_of, verify,
)

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
