"""A user's step with the awkward parts (a PRNG key argument, dropout, fori_loop, sort,
cumsum, cond, jax.nn.dot_product_attention) through the whole pipeline without a crash:
trace, analyze (no fallback), estimate, search, and verified random and searched plans."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import toast_lab as tl
from toast_lab import random_plan


def step(params, x, key):
    def loss(p):
        h = jax.nn.relu(x @ p["w1"])
        keep = jax.random.bernoulli(key, 0.9, h.shape)
        h = jnp.where(keep, h / 0.9, 0.0)
        h = jax.lax.fori_loop(0, 3, lambda i, h: jnp.tanh(h @ p["w2"]), h)
        c = jnp.cumsum(jnp.sort(h, axis=-1), axis=0)
        y = jax.lax.cond(c.sum() > 0, lambda c: c * 2.0, lambda c: c - 1.0, c)
        q = x.reshape(x.shape[0], 4, -1)[:, None]
        return (y ** 2).mean() + jax.nn.dot_product_attention(q, q, q).sum()

    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


ARGS = ({"w1": jnp.full((32, 64), 0.01), "w2": jnp.full((64, 64), 0.01)},
        jnp.asarray(np.random.default_rng(0).normal(size=(16, 32)), jnp.float32),
        jax.random.key(0))
MESH = tl.Mesh({"data": 4, "model": 2}, device="h100")


@pytest.fixture(scope="module")
def an():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tl.ToastWarning)
        return tl.analyze(tl.trace(step, *ARGS))


def test_estimate_and_search_handle_a_key_argument(an):
    assert not an.fallback_ops
    est = tl.estimate(an, tl.Plan.replicated(an), MESH)
    assert est.feasible and est.flops > 0
    res = tl.search(an, MESH, simulations=200, budget_s=None)
    assert res.feasible


@pytest.mark.slow
def test_random_and_searched_plans_verify(an):
    plans = [random_plan(an, MESH, np.random.default_rng(s)) for s in range(3)]
    plans.append(tl.search(an, MESH, simulations=200, budget_s=None).plan)
    for plan in plans:
        rep = tl.verify(step, ARGS, plan, MESH)
        assert rep.ok, (plan, rep.worst_error)
