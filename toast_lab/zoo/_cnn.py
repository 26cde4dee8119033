"""A small convolutional classifier on NHWC images.

Each block: 3x3 convolution (stride 1, SAME) -> LayerNorm over channels -> ReLU -> 2x2 max pool
(stride 2, by `lax.reduce_window`). Then a global average pool and a dense head.

Shapes: b = batch, H x W = image, c0 = image channels, c_i = `channels[i]`, k = kernel, n = classes.
Params: {"blocks": list of {"conv": {"w": [k, k, c_in, c_out], "b": [c_out]},
                            "norm": {"scale": [c_out], "bias": [c_out]}},
         "head": {"w": [c_last, n], "b": [n]}}.
Batch: {"images": [b, H, W, c0] float, "labels": [b] int32 in [0, n)}.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ._common import (
    Model, TrainConfig, cross_entropy, fan_in_normal, layer_norm, layer_norm_params, trailing,
)


@dataclasses.dataclass(frozen=True)
class CNNConfig(TrainConfig):
    batch: int = 8
    image: int = 16  # height = width
    in_channels: int = 3
    channels: tuple[int, ...] = (16, 32, 64)  # one conv block per entry
    kernel: int = 3
    classes: int = 16

    def __post_init__(self):
        super().__post_init__()
        object.__setattr__(self, "channels", tuple(self.channels))
        if self.image % 2 ** len(self.channels):
            raise ValueError(
                f"image={self.image} must be divisible by 2**{len(self.channels)}: "
                "each block halves the height and width."
            )


def init(key, cfg: CNNConfig) -> dict:
    *k_blocks, k_head = jax.random.split(key, len(cfg.channels) + 1)
    k = cfg.kernel
    blocks = []
    for key_i, c_in, c_out in zip(k_blocks, (cfg.in_channels, *cfg.channels), cfg.channels):
        fan_in = k * k * c_in
        blocks.append({
            "conv": {
                "w": fan_in_normal(key_i, (k, k, c_in, c_out), fan_in, cfg.dtype, gain=2.0),
                "b": jnp.zeros((c_out,), cfg.dtype),
            },
            "norm": layer_norm_params(c_out, cfg.dtype),
        })
    c_last = cfg.channels[-1]
    head = {
        "w": fan_in_normal(k_head, (c_last, cfg.classes), c_last, cfg.dtype),
        "b": jnp.zeros((cfg.classes,), cfg.dtype),
    }
    return {"blocks": blocks, "head": head}


def batch(key, cfg: CNNConfig) -> dict:
    ki, kl = jax.random.split(key)
    shape = (cfg.batch, cfg.image, cfg.image, cfg.in_channels)
    return {
        "images": jax.random.normal(ki, shape, jnp.float32).astype(cfg.dtype),
        "labels": jax.random.randint(kl, (cfg.batch,), 0, cfg.classes, jnp.int32),
    }


def _block(p: dict, x: jax.Array) -> jax.Array:
    """`[b, H, W, c_in] -> [b, H/2, W/2, c_out]`."""
    with jax.named_scope("conv"):
        x = jax.lax.conv_general_dilated(
            x, p["conv"]["w"], window_strides=(1, 1), padding="SAME",
            dimension_numbers=("NHWC", "HWIO", "NHWC"),
        ) + trailing(p["conv"]["b"], 4)
    with jax.named_scope("norm"):
        x = jax.nn.relu(layer_norm(p["norm"], x))
    with jax.named_scope("pool"):
        return jax.lax.reduce_window(
            x, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID"
        )


def loss(params: dict, batch: dict, cfg: CNNConfig) -> jax.Array:
    x = batch["images"]
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"block{i}"):
            x = _block(p, x)
    with jax.named_scope("head"):
        x = jnp.mean(x, axis=(1, 2))  # global average pool: [b, c]
        logits = x @ params["head"]["w"] + trailing(params["head"]["b"], 2)
    with jax.named_scope("loss"):
        return cross_entropy(logits, batch["labels"])


def param_names(cfg) -> dict:
    # A conv's input channels are the previous block's "channels"; one name cannot serve both
    # dims of a weight, so only the first conv names its input dim (the image's channels).
    def block(i):
        c_in = "in_channels" if i == 0 else None
        return {
            "conv": {
                "w": ("kernel_height", "kernel_width", c_in, "channels"),
                "b": ("channels",),
            },
            "norm": {"scale": ("channels",), "bias": ("channels",)},
        }

    return {
        "blocks": [block(i) for i in range(len(cfg.channels))],
        "head": {"w": ("channels", "classes"), "b": ("classes",)},
    }


def batch_names(cfg) -> dict:
    return {"images": ("batch", "height", "width", "in_channels"), "labels": ("batch",)}


CNN = Model("cnn", CNNConfig, init, batch, loss, param_names, batch_names)
