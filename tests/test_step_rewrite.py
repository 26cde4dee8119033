"""plan.jit with decisions beyond sharding: every remat policy and micro-batch count on the
zoo's GPT (unrolled and scanned), Llama and MoE compiles on 8 simulated devices and computes
the step as written (tl.verify), under a plan that shards the batch, the weights and the heads
(so the sharding constraints hold inside the rewritten step); XLA's peak memory goes down
with remat and with micro-batches; a user's own jax.checkpoint is kept, or replaced where the
plan overrides it."""

from __future__ import annotations

import functools

import jax
import pytest

import toast_lab as tl
from toast_lab.verification import FAST_COMPILE, read_compiled

MESH = tl.Mesh({"data": 2, "model": 4}, device="cpu")
POLICIES = ("everything", "dots_with_no_batch_dims", "full")
CASES = [(model, policy, count) for model in ("gpt", "gpt_scan", "llama")
         for policy in POLICIES for count in (1, 2, 4) if (policy, count) != ("everything", 1)]
# the MoE's load-balancing loss couples the examples: one micro-batch only
# (tests/test_step_decisions.py)
CASES += [("moe", policy, 1) for policy in POLICIES[1:]]


@functools.cache
def analysed(name: str, **config):
    fn, args = tl.zoo.get(name, **config)
    return fn, args, tl.analyze(tl.trace(fn, *args))


def _layers(an) -> str:
    """The model's repeated layers: its scanned stack or its unrolled blocks."""
    (group,) = [g.name for g in an.layer_groups if g.kind != "scope"]
    return group


def _plan(an, policy: str, count: int, mesh=MESH):
    """FSDP x tensor parallelism (the batch on data, the weights' embed on data, heads and
    MLP on model) with the layers' remat policy and the micro-batches."""
    plan = tl.strategies.expert(an, mesh)["fsdp+tp"].with_remat(_layers(an), policy)
    return plan.with_micro_batches(count) if count > 1 else plan


def _compiled(fn, args, plan, mesh=MESH):
    jax_mesh = mesh.jax_mesh(jax.devices()[:mesh.size])
    lowered = plan.jit(fn, jax_mesh, compiler_options=FAST_COMPILE).lower(*args)
    return read_compiled(lowered.compile(), jax_mesh)


@pytest.mark.slow
@pytest.mark.parametrize("model, policy, count", CASES)
def test_every_policy_and_micro_batch_count_computes_the_step_as_written(model, policy, count):
    fn, _, an = analysed(model, layers=2)
    plan = _plan(an, policy, count)
    report = tl.verify(fn, tl.zoo.sample(model, layers=2), plan, MESH)
    assert report.numerics_ok, str(report)
    assert f"{_layers(an)}={policy}" in repr(report.plan) or policy == "everything"
    assert report.stats.peak_bytes > 0 and report.stats.flops > 0


BIG = dict(layers=4, batch=16, seq=128)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt_scan", "llama"])
def test_remat_and_micro_batches_lower_xla_peak_memory(model):
    """A scanned stack keeps each layer's residuals as stacks the backward scan reads; under
    "full" the forward scan writes each layer's input only, and the backward scan recomputes
    the rest (more flops); the matmuls' results in between. Micro-batches divide what is left
    by the count."""
    fn, args, an = analysed(model, **BIG)
    stats = {(p, k): _compiled(fn, args, _plan(an, p, k)) for p in POLICIES for k in (1, 4)}
    peak = {key: s.peak_bytes for key, s in stats.items()}
    assert peak["full", 1] < peak["dots_with_no_batch_dims", 1] < 0.5 * peak["everything", 1]
    assert stats["full", 1].flops > stats["dots_with_no_batch_dims", 1].flops > \
        stats["everything", 1].flops
    for policy in POLICIES:
        assert peak[policy, 4] < peak[policy, 1]


@pytest.mark.slow
def test_unrolled_layers_are_recomputed_in_the_backward_pass():
    """The unrolled GPT's blocks recompute their residuals in the backward pass (XLA's flops
    rise as under jax.checkpoint). XLA:CPU's default scheduler runs such recomputations early,
    for its threads, so on CPU they save no memory (nor does jax.checkpoint's own: the same
    figures), while its memory-minimizing scheduler (xla_cpu_enable_concurrency_optimized_
    scheduler=false) lowers the peak; the scanned stack above needs no scheduler's help."""
    fn, args, an = analysed("gpt", **BIG)
    flops = {p: _compiled(fn, args, _plan(an, p, 1)).flops for p in POLICIES}
    assert flops["full"] > flops["dots_with_no_batch_dims"] > flops["everything"]


@pytest.mark.slow
def test_a_users_checkpoint_is_kept_unless_the_plan_overrides_it():
    """jax.checkpoint on every block: the rewritten step keeps its recomputation (read through
    an optimization barrier, as JAX lowers it). Overridden, the recomputation reads the
    forward pass's values instead, and the plan's policy decides: the step then compiles to
    what the same policy gives the GPT written without jax.checkpoint."""
    fn, args, an = analysed("gpt", layers=2, remat=True)
    plain_fn, plain_args, plain = analysed("gpt", layers=2)

    def flops(f, a, anl, policy, override=False):
        plan = tl.strategies.expert(anl, MESH)["fsdp+tp"].with_remat(
            "block*", policy, override=override)
        return _compiled(f, a, plan).flops

    written = flops(plain_fn, plain_args, plain, "everything")
    assert flops(fn, args, an, "full") > written  # the user's recomputation stays
    assert flops(fn, args, an, "everything", override=True) == written
    assert flops(fn, args, an, "dots_with_no_batch_dims", override=True) == \
        flops(plain_fn, plain_args, plain, "dots_with_no_batch_dims")
    plan = tl.strategies.expert(an, MESH)["fsdp+tp"].with_remat(
        "block*", "dots_with_no_batch_dims", override=True).with_micro_batches(2)
    report = tl.verify(fn, tl.zoo.sample("gpt", layers=2, remat=True), plan, MESH)
    assert report.numerics_ok, str(report)


@pytest.mark.slow
def test_a_step_computing_in_bfloat16_micro_batches():
    """A step computing in bfloat16 (whose numpy dtype kind is "V", not "f"): the casts of its
    gradient sums to bfloat16 are linear maps of the sums, so it splits into micro-batches,
    and plan.jit accumulates them in float32 and computes the step as written."""
    config = dict(layers=2, compute_dtype="bfloat16")
    fn, _, an = analysed("llama", **config)
    assert an.micro_batching.legal, an.micro_batching
    plan = _plan(an, "everything", 2)
    report = tl.verify(fn, tl.zoo.sample("llama", **config), plan, MESH)
    assert report.numerics_ok, str(report)
