"""A decoder whose MLPs are mixtures of experts: top-k routing with a capacity (GShard, Switch).

Each sequence is a routing group: its tokens fill each expert's buffer of `capacity` slots in
order (every token's first choice before any second choice, as in GShard), and assignments past
the capacity are dropped (the residual connection carries those tokens). Dispatch and combine
are one-hot einsums, so the whole layer is dense matmuls.

Shapes: b = batch, s = seq, v = vocab, d = embed, h = heads, e = head_dim, E = experts,
C = capacity = ceil(top_k * seq * capacity_factor / experts), m = mlp.
Params: wte [v, d], wpe [s, d], ln_f, and `blocks`, a list of
    {ln1, attn: {wq, wk, wv [d, h, e], wo [h, e, d]}, ln2,
     moe: {router [d, E], w_in [E, d, m], b_in [E, m], w_out [E, m, d]}}.
Batch: {"tokens": [b, s] int32, "labels": [b, s] int32}.
Loss: next-token cross-entropy + aux_loss_coef * (Switch load-balancing loss, summed over layers).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from . import _gpt
from ._common import Model, TrainConfig, layer_norm, layer_norm_params, normal


@dataclasses.dataclass(frozen=True)
class MoEConfig(TrainConfig):
    batch: int = 8
    seq: int = 32
    vocab: int = 256
    embed: int = 64
    heads: int = 4
    layers: int = 2
    experts: int = 8
    top_k: int = 2
    capacity_factor: float = 2.0
    mlp: int = 128
    aux_loss_coef: float = 0.01

    def __post_init__(self):
        super().__post_init__()
        if self.embed % self.heads:
            raise ValueError(f"embed={self.embed} is not divisible by heads={self.heads}.")
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k={self.top_k} must be in [1, experts={self.experts}].")

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads

    @property
    def capacity(self) -> int:
        """Slots per expert per sequence."""
        return max(1, math.ceil(self.top_k * self.seq * self.capacity_factor / self.experts))


def _moe_params(key, cfg: MoEConfig) -> dict:
    kr, ki, ko = jax.random.split(key, 3)
    E, d, m = cfg.experts, cfg.embed, cfg.mlp
    return {
        "router": normal(kr, (d, E), 0.02, cfg.dtype),
        "w_in": normal(ki, (E, d, m), 0.02, cfg.dtype),
        "b_in": jnp.zeros((E, m), cfg.dtype),
        "w_out": normal(ko, (E, m, d), 0.02 / math.sqrt(2 * cfg.layers), cfg.dtype),
    }


def route(x: jax.Array, router: jax.Array, cfg: MoEConfig):
    """Top-k routing of `x [b, s, d]`. Returns `dispatch [b, s, E, C]` (0/1: token to slot),
    `combine [b, s, E, C]` (gate weight of each kept slot) and the load-balancing loss."""
    E, C = cfg.experts, cfg.capacity
    probs = jax.nn.softmax(jnp.einsum("bsd,dE->bsE", x, router).astype(jnp.float32), axis=-1)
    gates, expert = jax.lax.top_k(probs, cfg.top_k)  # [b, s, k]
    gates = gates / jnp.sum(gates, axis=-1, keepdims=True)
    choice = jax.nn.one_hot(expert, E, dtype=jnp.float32)  # [b, s, k, E]
    # Slot of each assignment in its expert's buffer: assignments to that expert by earlier
    # tokens with the same choice rank k, plus all its assignments of lower rank.
    earlier_tokens = jnp.cumsum(choice, axis=1) - choice
    per_rank = jnp.sum(choice, axis=1, keepdims=True)  # [b, 1, k, E]
    lower_ranks = jnp.cumsum(per_rank, axis=2) - per_rank
    position = jnp.sum((earlier_tokens + lower_ranks) * choice, axis=-1)  # [b, s, k]
    keep = (position < C).astype(jnp.float32)
    slot = jax.nn.one_hot(position.astype(jnp.int32), C, dtype=jnp.float32)  # [b, s, k, C]
    slot = slot * keep[..., None]
    dispatch = jnp.einsum("bskE,bskC->bsEC", choice, slot)
    combine = jnp.einsum("bsk,bskE,bskC->bsEC", gates, choice, slot)
    # Switch Transformer (arXiv 2101.03961, eq. 4):
    # E * sum_e (share of first choices going to e) * (mean router prob of e); 1 when balanced.
    first_choice_share = jnp.mean(choice[:, :, 0, :], axis=(0, 1))
    aux = E * jnp.sum(first_choice_share * jnp.mean(probs, axis=(0, 1)))
    return dispatch, combine, aux


def moe(p: dict, x: jax.Array, cfg: MoEConfig):
    """Mixture-of-experts MLP, `x [b, s, d] -> ([b, s, d], aux loss)`."""
    with jax.named_scope("router"):
        dispatch, combine, aux = route(x, p["router"], cfg)
    with jax.named_scope("dispatch"):
        expert_in = jnp.einsum("bsEC,bsd->bECd", dispatch.astype(x.dtype), x)
    with jax.named_scope("experts"):
        hidden = jnp.einsum("bECd,Edm->bECm", expert_in, p["w_in"])
        hidden = jax.nn.gelu(hidden + p["b_in"][None, :, None, :])
        expert_out = jnp.einsum("bECm,Emd->bECd", hidden, p["w_out"])
    with jax.named_scope("combine"):
        return jnp.einsum("bsEC,bECd->bsd", combine.astype(x.dtype), expert_out), aux


def init(key, cfg: MoEConfig) -> dict:
    k_wte, k_wpe, *k_blocks = jax.random.split(key, 2 + cfg.layers)
    blocks = []
    for k in k_blocks:
        ka, km = jax.random.split(k)
        blocks.append({
            "ln1": layer_norm_params(cfg.embed, cfg.dtype),
            "attn": _gpt.attention_params(ka, cfg),
            "ln2": layer_norm_params(cfg.embed, cfg.dtype),
            "moe": _moe_params(km, cfg),
        })
    return {
        "wte": normal(k_wte, (cfg.vocab, cfg.embed), 0.02, cfg.dtype),
        "wpe": normal(k_wpe, (cfg.seq, cfg.embed), 0.01, cfg.dtype),
        "blocks": blocks,
        "ln_f": layer_norm_params(cfg.embed, cfg.dtype),
    }


def loss(params: dict, batch: dict, cfg: MoEConfig) -> jax.Array:
    x = _gpt.embed(params, batch["tokens"])
    aux_total = jnp.zeros((), jnp.float32)
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"block{i}"):
            with jax.named_scope("ln1"):
                y = layer_norm(p["ln1"], x)
            with jax.named_scope("attn"):
                x = x + _gpt.attention(p["attn"], y)
            with jax.named_scope("ln2"):
                y = layer_norm(p["ln2"], x)
            with jax.named_scope("moe"):
                y, aux = moe(p["moe"], y, cfg)
            x = x + y
            aux_total = aux_total + aux
    ce = _gpt.unembed_loss(params, x, batch["labels"])
    return ce + cfg.aux_loss_coef * aux_total


def param_names(cfg) -> dict:
    def block():
        ln = {"scale": ("embed",), "bias": ("embed",)}
        return {
            "ln1": ln,
            "attn": dict(_gpt.ATTENTION_NAMES),
            "ln2": dict(ln),
            "moe": {
                "router": ("embed", "experts"),
                "w_in": ("experts", "embed", "mlp"),
                "b_in": ("experts", "mlp"),
                "w_out": ("experts", "mlp", "embed"),
            },
        }

    return {
        "wte": ("vocab", "embed"),
        "wpe": ("seq", "embed"),
        "blocks": [block() for _ in range(cfg.layers)],
        "ln_f": {"scale": ("embed",), "bias": ("embed",)},
    }


MOE = Model("moe", MoEConfig, init, _gpt.batch, loss, param_names, _gpt.batch_names)
