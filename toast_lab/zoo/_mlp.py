"""A 3-layer MLP classifier.

Shapes: b = batch, f = features, h0, h1 = hidden widths, c = classes.
Params: {"dense0": {"w": [f, h0], "b": [h0]}, "dense1": {"w": [h0, h1], "b": [h1]},
         "dense2": {"w": [h1, c], "b": [c]}}.
Batch: {"x": [b, f] float, "labels": [b] int32 in [0, c)}.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ._common import Model, TrainConfig, cross_entropy, fan_in_normal, trailing


@dataclasses.dataclass(frozen=True)
class MLPConfig(TrainConfig):
    batch: int = 32
    features: int = 64
    hidden: tuple[int, int] = (128, 128)
    classes: int = 16

    def __post_init__(self):
        super().__post_init__()
        if len(self.hidden) != 2:
            raise ValueError(f"hidden={self.hidden!r}: give two widths, one per hidden layer.")
        object.__setattr__(self, "hidden", tuple(self.hidden))

    @property
    def widths(self) -> tuple[int, ...]:
        return (self.features, *self.hidden, self.classes)


def init(key, cfg: MLPConfig) -> dict:
    keys = jax.random.split(key, 3)
    params = {}
    for i, (k, fan_in, fan_out) in enumerate(zip(keys, cfg.widths[:-1], cfg.widths[1:])):
        gain = 2.0 if i < 2 else 1.0  # He init before a ReLU
        params[f"dense{i}"] = {
            "w": fan_in_normal(k, (fan_in, fan_out), fan_in, cfg.dtype, gain),
            "b": jnp.zeros((fan_out,), cfg.dtype),
        }
    return params


def batch(key, cfg: MLPConfig) -> dict:
    kx, ky = jax.random.split(key)
    return {
        "x": jax.random.normal(kx, (cfg.batch, cfg.features), jnp.float32).astype(cfg.dtype),
        "labels": jax.random.randint(ky, (cfg.batch,), 0, cfg.classes, jnp.int32),
    }


def loss(params: dict, batch: dict, cfg: MLPConfig) -> jax.Array:
    x = batch["x"]
    for i in range(3):
        with jax.named_scope(f"dense{i}"):
            p = params[f"dense{i}"]
            x = x @ p["w"] + trailing(p["b"], 2)
            if i < 2:
                x = jax.nn.relu(x)
    with jax.named_scope("loss"):
        return cross_entropy(x, batch["labels"])


def param_names(cfg) -> dict:
    dims = ("features", "hidden0", "hidden1", "classes")
    return {f"dense{i}": {"w": dims[i : i + 2], "b": dims[i + 1 : i + 2]} for i in range(3)}


def batch_names(cfg) -> dict:
    return {"x": ("batch", "features"), "labels": ("batch",)}


MLP = Model("mlp", MLPConfig, init, batch, loss, param_names, batch_names)
