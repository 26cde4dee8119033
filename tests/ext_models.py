"""Training steps built with flax.nnx and equinox, for tests that trace models written outside
the zoo. Each is a pure `step(params, opt_state, batch) -> (params, opt_state, loss)` with optax.

    fn, args = nnx_train_step()      # args: ShapeDtypeStruct pytrees
    concrete = nnx_sample()          # the same structure, real arrays

Batch for both: {"x": [BATCH, FEATURES] float32, "labels": [BATCH] int32 in [0, CLASSES)}.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import optax
from flax import nnx

BATCH, FEATURES, HIDDEN, CLASSES = 16, 32, 64, 8


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _batch(seed: int) -> dict:
    kx, ky = jax.random.split(jax.random.key(seed))
    return {
        "x": jax.random.normal(kx, (BATCH, FEATURES), jnp.float32),
        "labels": jax.random.randint(ky, (BATCH,), 0, CLASSES, jnp.int32),
    }


def _cross_entropy(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


# ---- flax.nnx ------------------------------------------------------------------------------


class _NnxMLP(nnx.Module):
    """Linear -> LayerNorm -> GELU -> Linear, `[b, FEATURES] -> [b, CLASSES]`."""

    def __init__(self, rngs: nnx.Rngs):
        self.dense_in = nnx.Linear(FEATURES, HIDDEN, rngs=rngs)
        self.norm = nnx.LayerNorm(HIDDEN, rngs=rngs)
        self.dense_out = nnx.Linear(HIDDEN, CLASSES, rngs=rngs)

    def __call__(self, x):
        return self.dense_out(jax.nn.gelu(self.norm(self.dense_in(x))))


def _nnx_parts(seed: int):
    graphdef, params = nnx.split(_NnxMLP(nnx.Rngs(seed)), nnx.Param)
    return graphdef, params, optax.adamw(1e-3, weight_decay=0.01)


def _nnx_step(graphdef, opt):
    def step(params, opt_state, batch):
        def loss_fn(params):
            model = nnx.merge(graphdef, params)
            return _cross_entropy(model(batch["x"]), batch["labels"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step


def nnx_sample(seed: int = 0) -> tuple:
    """Concrete `(params, opt_state, batch)` for `nnx_train_step`; params is an `nnx.State`."""
    _, params, opt = _nnx_parts(seed)
    return params, opt.init(params), _batch(seed)


def nnx_train_step() -> tuple:
    """`(step, args)` for a flax.nnx MLP trained with AdamW, split into graphdef and params."""
    graphdef, _, opt = _nnx_parts(0)
    return _nnx_step(graphdef, opt), _abstract(nnx_sample())


# ---- equinox -------------------------------------------------------------------------------


def _eqx_parts(seed: int):
    model = eqx.nn.MLP(FEATURES, CLASSES, HIDDEN, depth=2, key=jax.random.key(seed))
    params, static = eqx.partition(model, eqx.is_array)
    return params, static, optax.adamw(1e-3, weight_decay=0.01)


def _eqx_step(static, opt):
    def step(params, opt_state, batch):
        def loss_fn(params):
            model = eqx.combine(params, static)
            return _cross_entropy(jax.vmap(model)(batch["x"]), batch["labels"])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return step


def equinox_sample(seed: int = 0) -> tuple:
    """Concrete `(params, opt_state, batch)` for `equinox_train_step`; params is the array
    half of an `eqx.nn.MLP` (non-arrays are `None`)."""
    params, _, opt = _eqx_parts(seed)
    return params, opt.init(params), _batch(seed)


def equinox_train_step() -> tuple:
    """`(step, args)` for an `eqx.nn.MLP` (depth 2) trained with AdamW via partition/combine."""
    _, static, opt = _eqx_parts(0)
    return _eqx_step(static, opt), _abstract(equinox_sample())
