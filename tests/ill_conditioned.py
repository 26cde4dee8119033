"""Training steps with output leaves that are rounding noise: a parameter whose exact gradient
is zero, which Adam normalises into a learning-rate-sized update of random sign. Correct plans
of these steps disagree with the unsharded step on those leaves by O(100%); tl.verify must pass
them (and report the leaves as ill-conditioned) while still failing real errors next to them.

Used by tests/test_verify.py and benchmarks/verify_sensitivity.py. Every builder returns
`(step, args)` with concrete arrays, seeded.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax

BATCH, SEQ, WIDTH, HEADS, HEAD_DIM, CLASSES = 8, 16, 32, 4, 8, 8


def nnx_bias_before_batchnorm():
    """flax.nnx: Linear (with bias) -> BatchNorm -> ReLU -> Linear, Adam. BatchNorm subtracts
    the batch mean, so the first Linear's bias has an exact gradient of zero: its computed
    gradient is rounding noise, and so are the bias after the step and its Adam moments."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            self.l1 = nnx.Linear(WIDTH, 64, use_bias=True, rngs=rngs)
            self.bn = nnx.BatchNorm(64, rngs=rngs)
            self.l2 = nnx.Linear(64, CLASSES, rngs=rngs)

        def __call__(self, x):
            return self.l2(nnx.relu(self.bn(self.l1(x))))

    net = Net(nnx.Rngs(0))
    opt = nnx.Optimizer(net, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((net, opt))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(BATCH, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, (BATCH,)).astype(np.int32)

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(
            lambda m: optax.softmax_cross_entropy_with_integer_labels(m(x), y).mean())(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return step, (state, x, y)


def attention_with_key_bias(drop_shard: int | None = None):
    """Keras-style multi-head attention (query, key and value projections with biases) on a
    residual stream, mean-pooled into a classifier; optax.adam with Keras' eps of 1e-7. Softmax
    ignores a constant added to every logit of a query, and the key bias adds q . bk to all of
    them: bk's exact gradient is zero, so bk after the step and its Adam moments are noise.

    drop_shard: a deliberately wrong step for the tests: the loss leaves out the examples of
    that shard of 4 along the batch (what a data-parallel step computes when one device's
    partial sum of the gradients is dropped); None is the correct step.
    """
    rng = np.random.default_rng(0)

    def weight(*shape):
        return (rng.normal(size=shape) / np.sqrt(shape[0])).astype(np.float32)

    params = {
        "wq": weight(WIDTH, HEADS, HEAD_DIM), "bq": np.zeros((HEADS, HEAD_DIM), np.float32),
        "wk": weight(WIDTH, HEADS, HEAD_DIM), "bk": np.zeros((HEADS, HEAD_DIM), np.float32),
        "wv": weight(WIDTH, HEADS, HEAD_DIM), "bv": np.zeros((HEADS, HEAD_DIM), np.float32),
        "wo": weight(HEADS * HEAD_DIM, WIDTH).reshape(HEADS, HEAD_DIM, WIDTH),
        "head": weight(WIDTH, CLASSES),
    }
    tx = optax.adam(1e-3, eps=1e-7)
    x = rng.normal(size=(BATCH, SEQ, WIDTH)).astype(np.float32)
    y = rng.integers(0, CLASSES, (BATCH,)).astype(np.int32)
    keep = np.ones(BATCH, np.float32)
    if drop_shard is not None:
        keep[drop_shard * BATCH // 4:(drop_shard + 1) * BATCH // 4] = 0.0

    def step(params, opt_state, x, y):
        def loss_fn(p):
            q = jnp.einsum("bsd,dhe->bshe", x, p["wq"]) + p["bq"][None, None]
            k = jnp.einsum("bsd,dhe->bshe", x, p["wk"]) + p["bk"][None, None]
            v = jnp.einsum("bsd,dhe->bshe", x, p["wv"]) + p["bv"][None, None]
            logits = jnp.einsum("bqhe,bkhe->bhqk", q, k) / np.sqrt(HEAD_DIM)
            h = jnp.einsum("bhqk,bkhe->bqhe", jax.nn.softmax(logits, axis=-1), v)
            h = x + jnp.einsum("bqhe,hed->bqd", h, p["wo"])
            per_example = optax.softmax_cross_entropy_with_integer_labels(
                h.mean(axis=1) @ p["head"], y)
            return jnp.sum(per_example * keep) / BATCH

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), x, y)
