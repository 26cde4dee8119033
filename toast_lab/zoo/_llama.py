"""A Llama-style decoder: RMSNorm, rotary positions, grouped-query attention through
`jax.nn.dot_product_attention`, SwiGLU MLPs, untied embeddings; layers under `lax.scan`.

Mixed precision as the published recipes train: parameters and AdamW state in `dtype`
(float32 by default), matmuls and activations in `compute_dtype` (the presets: bfloat16; the
tiny test size computes in `dtype`). `remat=True` recomputes each layer in the backward pass
(full activation checkpointing).

Shapes: b = batch, s = seq, v = vocab, d = embed, h = heads, k = kv_heads, e = head_dim,
m = mlp, L = layers.
Params: embed [v, d], unembed [d, v], final_norm [d], and `layers` with a leading [L] dim:
    {attn_norm [d], wq [d, h, e], wk [d, k, e], wv [d, k, e], wo [h, e, d],
     mlp_norm [d], w_gate [d, m], w_up [d, m], w_down [m, d]}.
Batch: {"tokens": [b, s] int32, "labels": [b, s] int32 (the next tokens)}.
Presets: Llama-2-7B and Llama-3.1-8B (Touvron et al. 2023; Meta's Llama 3.1 model card).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ._cudnn import causal_attention
from ._common import Model, TrainConfig, cross_entropy, normal, trailing


@dataclasses.dataclass(frozen=True)
class LlamaConfig(TrainConfig):
    size: str = "tiny"
    batch: int = 8
    seq: int = 32
    vocab: int = 256
    embed: int = 64
    heads: int = 4
    kv_heads: int = 2
    mlp: int = 128
    layers: int = 2
    rope_theta: float = 10000.0
    compute_dtype: str | None = None  # None: dtype
    remat: bool = False
    # jax.nn.dot_product_attention's implementation: None (XLA's ops, as JAX picks by default),
    # "xla", or "cudnn": cuDNN's flash kernel (runs on a GPU; elsewhere it traces as on a GPU,
    # for estimates, and does not run)
    attention: str | None = None

    def __post_init__(self):
        super().__post_init__()
        if self.embed % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"embed={self.embed} must divide by heads={self.heads}, and heads "
                             f"by kv_heads={self.kv_heads}.")

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads


PRESETS = {
    "tiny": dict(batch=8, seq=32, vocab=256, embed=64, heads=4, kv_heads=2, mlp=128, layers=2),
    # Touvron et al., "Llama 2", arXiv 2307.09288, table 2 and the released config
    "llama2-7b": dict(batch=8, seq=4096, vocab=32000, embed=4096, heads=32, kv_heads=32,
                      mlp=11008, layers=32, compute_dtype="bfloat16"),
    # Meta's Llama 3.1 8B config: GQA with 8 kv heads, 14336 MLP, 128256 vocab, theta 5e5
    "llama3.1-8b": dict(batch=8, seq=8192, vocab=128256, embed=4096, heads=32, kv_heads=8,
                        mlp=14336, layers=32, rope_theta=500000.0, compute_dtype="bfloat16"),
    # Meta's Llama 3.1 405B config ("The Llama 3 Herd of Models", arXiv 2407.21783, table 3)
    "llama3.1-405b": dict(batch=8, seq=8192, vocab=128256, embed=16384, heads=128, kv_heads=8,
                          mlp=53248, layers=126, rope_theta=500000.0,
                          compute_dtype="bfloat16"),
}


def init(key, cfg: LlamaConfig) -> dict:
    d, h, k, e, m, L = cfg.embed, cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.mlp, cfg.layers
    keys = iter(jax.random.split(key, 9))
    std, out_std = 0.02, 0.02 / math.sqrt(2 * L)
    return {
        "embed": normal(next(keys), (cfg.vocab, d), std, cfg.dtype),
        "unembed": normal(next(keys), (d, cfg.vocab), std, cfg.dtype),
        "final_norm": jnp.ones((d,), cfg.dtype),
        "layers": {
            "attn_norm": jnp.ones((L, d), cfg.dtype),
            "wq": normal(next(keys), (L, d, h, e), std, cfg.dtype),
            "wk": normal(next(keys), (L, d, k, e), std, cfg.dtype),
            "wv": normal(next(keys), (L, d, k, e), std, cfg.dtype),
            "wo": normal(next(keys), (L, h, e, d), out_std, cfg.dtype),
            "mlp_norm": jnp.ones((L, d), cfg.dtype),
            "w_gate": normal(next(keys), (L, d, m), std, cfg.dtype),
            "w_up": normal(next(keys), (L, d, m), std, cfg.dtype),
            "w_down": normal(next(keys), (L, m, d), out_std, cfg.dtype),
        },
    }


def batch(key, cfg) -> dict:
    tokens = jax.random.randint(key, (cfg.batch, cfg.seq + 1), 0, cfg.vocab, jnp.int32)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def rms_norm(scale: jax.Array, x: jax.Array, eps: float = 1e-5) -> jax.Array:
    """RMSNorm over the last dim, statistics in float32."""
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(jnp.square(x32), axis=-1, keepdims=True) + eps)
    return (y * trailing(scale.astype(jnp.float32), x.ndim)).astype(x.dtype)


def rope(x: jax.Array, theta: float) -> jax.Array:
    """Rotary position embedding of `x [b, s, heads, e]` (rotate-half form)."""
    s, e = x.shape[1], x.shape[-1]
    freqs = theta ** (-jnp.arange(0, e, 2, dtype=jnp.float32) / e)
    angles = jnp.arange(s, dtype=jnp.float32)[:, None] * freqs[None, :]  # [s, e/2]
    cos = jnp.cos(angles)[None, :, None, :].astype(x.dtype)
    sin = jnp.sin(angles)[None, :, None, :].astype(x.dtype)
    x1, x2 = x[..., : e // 2], x[..., e // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _layer(p: dict, x: jax.Array, cfg: LlamaConfig) -> jax.Array:
    """One pre-norm decoder layer, `x [b, s, d] -> [b, s, d]`, in the compute dtype."""
    cd = jnp.dtype(cfg.compute_dtype or cfg.dtype)
    w = {name: v.astype(cd) for name, v in p.items()}
    with jax.named_scope("attn"):
        y = rms_norm(w["attn_norm"], x)
        q = rope(jnp.einsum("bsd,dhe->bshe", y, w["wq"]), cfg.rope_theta)
        k = rope(jnp.einsum("bsd,dke->bske", y, w["wk"]), cfg.rope_theta)
        v = jnp.einsum("bsd,dke->bske", y, w["wv"])
        if cfg.attention == "cudnn" and jax.default_backend() != "gpu":
            o = causal_attention(q, k, v)  # the kernel a GPU trace holds (traced only)
        else:
            o = jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                             implementation=cfg.attention)
        x = x + jnp.einsum("bshe,hed->bsd", o, w["wo"])
    with jax.named_scope("mlp"):
        y = rms_norm(w["mlp_norm"], x)
        gate = jax.nn.silu(jnp.einsum("bsd,dm->bsm", y, w["w_gate"]))
        up = jnp.einsum("bsd,dm->bsm", y, w["w_up"])
        x = x + jnp.einsum("bsm,md->bsd", gate * up, w["w_down"])
    return x


def loss(params: dict, batch: dict, cfg: LlamaConfig) -> jax.Array:
    cd = jnp.dtype(cfg.compute_dtype or cfg.dtype)
    with jax.named_scope("embed"):
        x = params["embed"].astype(cd)[batch["tokens"]]
    layer = jax.checkpoint(_layer, static_argnums=2) if cfg.remat else _layer

    def body(x, p):
        with jax.named_scope("layer"):
            return layer(p, x, cfg), None

    x, _ = jax.lax.scan(body, x, params["layers"])
    with jax.named_scope("unembed"):
        x = rms_norm(params["final_norm"].astype(cd), x)
        logits = jnp.einsum("bsd,dv->bsv", x, params["unembed"].astype(cd))
    with jax.named_scope("loss"):
        return cross_entropy(logits, batch["labels"])


def param_names(cfg) -> dict:
    return {
        "embed": ("vocab", "embed"),
        "unembed": ("embed", "vocab"),
        "final_norm": ("embed",),
        "layers": {
            "attn_norm": ("layers", "embed"),
            "wq": ("layers", "embed", "heads", "head_dim"),
            "wk": ("layers", "embed", "kv_heads", "head_dim"),
            "wv": ("layers", "embed", "kv_heads", "head_dim"),
            "wo": ("layers", "heads", "head_dim", "embed"),
            "mlp_norm": ("layers", "embed"),
            "w_gate": ("layers", "embed", "mlp"),
            "w_up": ("layers", "embed", "mlp"),
            "w_down": ("layers", "mlp", "embed"),
        },
    }


def batch_names(cfg) -> dict:
    return {"tokens": ("batch", "seq"), "labels": ("batch", "seq")}


LLAMA = Model("llama", LlamaConfig, init, batch, loss, param_names, batch_names, PRESETS)
