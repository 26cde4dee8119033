"""What every zoo model shares: its config, the training step around its loss, and small layers.

A zoo model is a `Model`: a frozen config dataclass, an `init(key, cfg) -> params`, a
`batch(key, cfg) -> batch`, a `loss(params, batch, cfg) -> scalar`, and the logical dim names of
its params and batch. `toast_lab.zoo.get` turns it into `step(params, opt_state, batch)`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import optax

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Keys every zoo model accepts: the AdamW settings and the parameter dtype."""

    learning_rate: float = 1e-3
    weight_decay: float = 0.01
    dtype: Any = "float32"

    def __post_init__(self):
        dtype = jnp.dtype(self.dtype)
        if dtype.name not in _DTYPES:
            raise TypeError(f"dtype={self.dtype!r} is not supported; use one of {_DTYPES}.")
        object.__setattr__(self, "dtype", dtype)


@dataclasses.dataclass(frozen=True)
class Model:
    """One zoo entry. `param_names(cfg)` and `batch_names(cfg)` give a tuple of logical dim
    names (`str | None`) per leaf, in pytrees shaped like `init`'s and `batch`'s outputs."""

    name: str
    config: type  # a TrainConfig subclass; its fields are the valid keys
    init: Callable[[jax.Array, Any], Any]
    batch: Callable[[jax.Array, Any], Any]
    loss: Callable[[Any, Any, Any], jax.Array]
    param_names: Callable[[Any], Any]
    batch_names: Callable[[Any], Any]
    presets: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    def make_config(self, **overrides) -> Any:
        """The model's config: defaults, then the `size=` preset if any, then `overrides`."""
        valid = [f.name for f in dataclasses.fields(self.config)]
        unknown = [k for k in overrides if k not in valid]
        if unknown:
            raise TypeError(
                f"zoo model {self.name!r} got unknown config key {unknown[0]!r}. "
                f"Valid keys: {', '.join(valid)}."
            )
        values = {}
        if self.presets:
            size = overrides.get("size", self.config.size)
            if size not in self.presets:
                raise TypeError(
                    f"zoo model {self.name!r} has no size {size!r}. "
                    f"Sizes: {', '.join(map(repr, self.presets))}."
                )
            values.update(self.presets[size])
        values.update(overrides)
        return self.config(**values)


def make_step(model: Model, cfg: Any, opt: optax.GradientTransformation) -> Callable:
    """`step(params, opt_state, batch) -> (params, opt_state, loss)`: one AdamW step on `loss`."""

    def step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(model.loss)(params, batch, cfg)
        with jax.named_scope("optimizer"):
            updates, opt_state = opt.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
        return params, opt_state, loss

    step.__name__ = step.__qualname__ = f"{model.name}_train_step"
    return step


def opt_state_names(opt: optax.GradientTransformation, opt_state: Any, param_names: Any) -> Any:
    """Dim names for an optimizer state: params-shaped parts (AdamW's `mu`, `nu`) take the
    params' names; everything else (the step `count`) gets `None` per dim."""
    return optax.tree_map_params(
        opt,
        lambda _, names: names,
        opt_state,
        param_names,
        transform_non_params=lambda leaf: (None,) * leaf.ndim,
    )


# ---- initializers and layers, shared by the models ----------------------------------------


def normal(key: jax.Array, shape: tuple[int, ...], std: float, dtype) -> jax.Array:
    """`std * N(0, 1)` drawn in float32, then cast to `dtype`."""
    return (std * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def fan_in_normal(key, shape, fan_in: int, dtype, gain: float = 1.0) -> jax.Array:
    """LeCun (gain 1) or He (gain 2) normal: variance `gain / fan_in`."""
    return normal(key, shape, math.sqrt(gain / fan_in), dtype)


def trailing(v: jax.Array, ndim: int) -> jax.Array:
    """`v` with leading unit dims up to rank `ndim`, e.g. a bias `[d]` as `[1, 1, d]`.
    Explicit, because the tests run with `jax_numpy_rank_promotion="raise"`."""
    return v[(None,) * (ndim - v.ndim) + (...,)]


def layer_norm_params(dim: int, dtype) -> dict:
    """`{"scale": [dim] ones, "bias": [dim] zeros}`."""
    return {"scale": jnp.ones((dim,), dtype), "bias": jnp.zeros((dim,), dtype)}


def layer_norm(p: dict, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """LayerNorm over the last dim of `x`, statistics in float32."""
    x32 = x.astype(jnp.float32)
    mean = jnp.mean(x32, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
    y = ((x32 - mean) * jax.lax.rsqrt(var + eps)).astype(x.dtype)
    return y * trailing(p["scale"], x.ndim) + trailing(p["bias"], x.ndim)


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Mean softmax cross-entropy in float32; `labels` are integer class ids."""
    losses = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
    return jnp.mean(losses)
