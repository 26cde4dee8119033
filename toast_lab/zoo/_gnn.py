"""A message-passing graph network for node classification (one graph per batch).

Each round (a "block"): an edge MLP turns the two endpoints of every edge into a message,
`relu(h[senders] @ w_send + h[receivers] @ w_recv + b_in) @ w_out + b_out` (the first layer is
a dense layer on the concatenated endpoints, written as two matmuls); messages are summed
into their receivers with `jax.ops.segment_sum`; a node update adds `relu(agg @ w + b)` to `h`
and LayerNorms it.

Shapes: n = nodes, f = input features, d = hidden (node latent width), m = edge-MLP width,
E = edges, c = classes.
Params: {"encoder": {"w": [f, d], "b": [d]},
         "blocks": list of {"edge_mlp": {"w_send", "w_recv": [d, m], "b_in": [m],
                                         "w_out": [m, d], "b_out": [d]},
                            "node_mlp": {"w": [d, d], "b": [d]}, "norm": {scale, bias [d]}},
         "decoder": {"w": [d, c], "b": [c]}}.
Batch: {"nodes": [n, f] float, "senders", "receivers": [E] int32 in [0, n),
        "labels": [n] int32 in [0, c)}.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from ._common import (
    Model, TrainConfig, cross_entropy, fan_in_normal, layer_norm, layer_norm_params, trailing,
)


@dataclasses.dataclass(frozen=True)
class GNNConfig(TrainConfig):
    nodes: int = 64
    edges: int = 256
    features: int = 16
    hidden: int = 32
    mlp: int = 64
    classes: int = 8
    rounds: int = 3


def _dense(key, fan_in: int, fan_out: int, dtype, gain: float = 1.0) -> dict:
    return {
        "w": fan_in_normal(key, (fan_in, fan_out), fan_in, dtype, gain),
        "b": jnp.zeros((fan_out,), dtype),
    }


def init(key, cfg: GNNConfig) -> dict:
    k_enc, k_dec, *k_blocks = jax.random.split(key, 2 + cfg.rounds)
    d, m = cfg.hidden, cfg.mlp
    blocks = []
    for k in k_blocks:
        ks, kr, ko, kn = jax.random.split(k, 4)
        blocks.append({
            "edge_mlp": {
                # He init over the concatenated endpoints: fan-in 2d.
                "w_send": fan_in_normal(ks, (d, m), 2 * d, cfg.dtype, gain=2.0),
                "w_recv": fan_in_normal(kr, (d, m), 2 * d, cfg.dtype, gain=2.0),
                "b_in": jnp.zeros((m,), cfg.dtype),
                "w_out": fan_in_normal(ko, (m, d), m, cfg.dtype),
                "b_out": jnp.zeros((d,), cfg.dtype),
            },
            "node_mlp": _dense(kn, d, d, cfg.dtype, gain=2.0),
            "norm": layer_norm_params(d, cfg.dtype),
        })
    return {
        "encoder": _dense(k_enc, cfg.features, d, cfg.dtype),
        "blocks": blocks,
        "decoder": _dense(k_dec, d, cfg.classes, cfg.dtype),
    }


def batch(key, cfg: GNNConfig) -> dict:
    """A random graph: uniform endpoints, Gaussian node features, uniform labels."""
    kf, ks, kr, kl = jax.random.split(key, 4)
    return {
        "nodes": jax.random.normal(kf, (cfg.nodes, cfg.features), jnp.float32).astype(cfg.dtype),
        "senders": jax.random.randint(ks, (cfg.edges,), 0, cfg.nodes, jnp.int32),
        "receivers": jax.random.randint(kr, (cfg.edges,), 0, cfg.nodes, jnp.int32),
        "labels": jax.random.randint(kl, (cfg.nodes,), 0, cfg.classes, jnp.int32),
    }


def _round(p: dict, h: jax.Array, senders: jax.Array, receivers: jax.Array) -> jax.Array:
    """One message-passing round, `h [n, d] -> [n, d]`."""
    with jax.named_scope("edge_mlp"):
        e = p["edge_mlp"]
        msg = h[senders] @ e["w_send"] + h[receivers] @ e["w_recv"] + trailing(e["b_in"], 2)
        msg = jax.nn.relu(msg) @ e["w_out"] + trailing(e["b_out"], 2)  # [E, d]
    with jax.named_scope("aggregate"):
        agg = jax.ops.segment_sum(msg, receivers, num_segments=h.shape[0])  # [n, d]
    with jax.named_scope("node_mlp"):
        update = jax.nn.relu(agg @ p["node_mlp"]["w"] + trailing(p["node_mlp"]["b"], 2))
    with jax.named_scope("norm"):
        return layer_norm(p["norm"], h + update)


def loss(params: dict, batch: dict, cfg: GNNConfig) -> jax.Array:
    with jax.named_scope("encoder"):
        h = batch["nodes"] @ params["encoder"]["w"] + trailing(params["encoder"]["b"], 2)
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"block{i}"):
            h = _round(p, h, batch["senders"], batch["receivers"])
    with jax.named_scope("decoder"):
        logits = h @ params["decoder"]["w"] + trailing(params["decoder"]["b"], 2)
    with jax.named_scope("loss"):
        return cross_entropy(logits, batch["labels"])


def param_names(cfg) -> dict:
    # "hidden" is the node latent width; "messages" the width of the messages and their sums,
    # a separate dim (of the same size) until the node update adds it back to `h`.
    def block():
        return {
            "edge_mlp": {
                "w_send": ("hidden", "mlp"),
                "w_recv": ("hidden", "mlp"),
                "b_in": ("mlp",),
                "w_out": ("mlp", "messages"),
                "b_out": ("messages",),
            },
            "node_mlp": {"w": ("messages", "hidden"), "b": ("hidden",)},
            "norm": {"scale": ("hidden",), "bias": ("hidden",)},
        }

    return {
        "encoder": {"w": ("features", "hidden"), "b": ("hidden",)},
        "blocks": [block() for _ in range(cfg.rounds)],
        "decoder": {"w": ("hidden", "classes"), "b": ("classes",)},
    }


def batch_names(cfg) -> dict:
    return {
        "nodes": ("nodes", "features"),
        "senders": ("edges",),
        "receivers": ("edges",),
        "labels": ("nodes",),
    }


GNN = Model("gnn", GNNConfig, init, batch, loss, param_names, batch_names)
