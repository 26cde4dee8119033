"""GPT-2-style decoder: `gpt` unrolls its layers, `gpt_scan` runs the same layers under `lax.scan`.

Shapes: b = batch, s = seq, v = vocab, d = embed, h = heads, e = head_dim = d / h, m = mlp.
Params (`gpt`):
    wte [v, d] (tied with the unembedding), wpe [s, d],
    blocks: list of {ln1, attn: {wq, wk, wv [d, h, e], wo [h, e, d]}, ln2,
                     mlp: {w_in [d, m], b_in [m], w_out [m, d], b_out [d]}},
    ln_f: {scale [d], bias [d]}.
`gpt_scan` holds `blocks` as one dict whose leaves have a leading `layers` dim.
Batch: {"tokens": [b, s] int32, "labels": [b, s] int32 (the next tokens)}.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from ._common import (
    Model, TrainConfig, cross_entropy, layer_norm, layer_norm_params, normal, trailing,
)


@dataclasses.dataclass(frozen=True)
class GPTConfig(TrainConfig):
    size: str = "tiny"
    batch: int = 8
    seq: int = 32
    vocab: int = 256
    embed: int = 64
    heads: int = 4
    layers: int = 2
    mlp: int | None = None  # None: 4 * embed
    remat: bool = False  # jax.checkpoint each block: keep its input, recompute the rest

    def __post_init__(self):
        super().__post_init__()
        if self.mlp is None:
            object.__setattr__(self, "mlp", 4 * self.embed)
        if self.embed % self.heads:
            raise ValueError(f"embed={self.embed} is not divisible by heads={self.heads}.")

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads


# Published GPT-2 / GPT-3 widths and depths. Head counts are changed to multiples of 8 (GPT-2
# small has 12, large 20, xl 25) so that every dim shards 8 ways; weight shapes other than the
# heads/head_dim split, and so parameter counts and matmul flops, are unchanged.
PRESETS = {
    "tiny": dict(batch=8, seq=32, vocab=256, embed=64, heads=4, layers=2),
    "gpt2-small": dict(batch=32, seq=1024, vocab=50304, embed=768, heads=16, layers=12),
    "gpt2-medium": dict(batch=32, seq=1024, vocab=50304, embed=1024, heads=16, layers=24),
    "gpt2-large": dict(batch=32, seq=1024, vocab=50304, embed=1280, heads=16, layers=36),
    "gpt2-xl": dict(batch=32, seq=1024, vocab=50304, embed=1600, heads=40, layers=48),
    "gpt3-175b": dict(batch=64, seq=2048, vocab=50304, embed=12288, heads=96, layers=96),
}


# ---- layers shared with the MoE model ------------------------------------------------------


def attention_params(key, cfg) -> dict:
    """q/k/v `[d, h, e]` and output `[h, e, d]`; the output is scaled down by depth (GPT-2)."""
    d, h, e = cfg.embed, cfg.heads, cfg.head_dim
    kq, kk, kv, ko = jax.random.split(key, 4)
    out_std = 0.02 / math.sqrt(2 * cfg.layers)
    return {
        "wq": normal(kq, (d, h, e), 0.02, cfg.dtype),
        "wk": normal(kk, (d, h, e), 0.02, cfg.dtype),
        "wv": normal(kv, (d, h, e), 0.02, cfg.dtype),
        "wo": normal(ko, (h, e, d), out_std, cfg.dtype),
    }


ATTENTION_NAMES = {
    "wq": ("embed", "heads", "head_dim"),
    "wk": ("embed", "heads", "head_dim"),
    "wv": ("embed", "heads", "head_dim"),
    "wo": ("heads", "head_dim", "embed"),
}


def attention(p: dict, x: jax.Array) -> jax.Array:
    """Causal multi-head self-attention, `x [b, s, d] -> [b, s, d]`."""
    q = jnp.einsum("bsd,dhe->bshe", x, p["wq"])
    k = jnp.einsum("bsd,dhe->bshe", x, p["wk"])
    v = jnp.einsum("bsd,dhe->bshe", x, p["wv"])
    logits = jnp.einsum("bqhe,bkhe->bhqk", q, k).astype(jnp.float32)
    logits = logits / math.sqrt(q.shape[-1])
    s = x.shape[1]
    causal = jnp.tril(jnp.ones((s, s), jnp.bool_))
    logits = jnp.where(causal[None, None], logits, jnp.finfo(jnp.float32).min)
    probs = jax.nn.softmax(logits, axis=-1).astype(x.dtype)
    out = jnp.einsum("bhqk,bkhe->bqhe", probs, v)
    return jnp.einsum("bqhe,hed->bqd", out, p["wo"])


def embed(params: dict, tokens: jax.Array) -> jax.Array:
    """Token embedding by gather plus learned positions: `tokens [b, s] -> [b, s, d]`."""
    with jax.named_scope("embed"):
        return params["wte"][tokens] + params["wpe"][None]


def unembed_loss(params: dict, x: jax.Array, labels: jax.Array) -> jax.Array:
    """Final LayerNorm, tied unembedding (`x @ wte.T`, `[b, s, v]`), mean cross-entropy."""
    with jax.named_scope("unembed"):
        x = layer_norm(params["ln_f"], x)
        logits = jnp.einsum("bsd,vd->bsv", x, params["wte"])
    with jax.named_scope("loss"):
        return cross_entropy(logits, labels)


# ---- GPT ------------------------------------------------------------------------------------


def _block_params(key, cfg) -> dict:
    ka, ki, ko = jax.random.split(key, 3)
    d, m = cfg.embed, cfg.mlp
    return {
        "ln1": layer_norm_params(d, cfg.dtype),
        "attn": attention_params(ka, cfg),
        "ln2": layer_norm_params(d, cfg.dtype),
        "mlp": {
            "w_in": normal(ki, (d, m), 0.02, cfg.dtype),
            "b_in": jnp.zeros((m,), cfg.dtype),
            "w_out": normal(ko, (m, d), 0.02 / math.sqrt(2 * cfg.layers), cfg.dtype),
            "b_out": jnp.zeros((d,), cfg.dtype),
        },
    }


def _block(p: dict, x: jax.Array) -> jax.Array:
    """One pre-LayerNorm transformer layer, `[b, s, d] -> [b, s, d]`."""
    with jax.named_scope("ln1"):
        y = layer_norm(p["ln1"], x)
    with jax.named_scope("attn"):
        x = x + attention(p["attn"], y)
    with jax.named_scope("ln2"):
        y = layer_norm(p["ln2"], x)
    with jax.named_scope("mlp"):
        mlp = p["mlp"]
        hidden = jnp.einsum("bsd,dm->bsm", y, mlp["w_in"]) + trailing(mlp["b_in"], 3)
        hidden = jax.nn.gelu(hidden)
        x = x + jnp.einsum("bsm,md->bsd", hidden, mlp["w_out"]) + trailing(mlp["b_out"], 3)
    return x


def init(key, cfg: GPTConfig) -> dict:
    k_wte, k_wpe, *k_blocks = jax.random.split(key, 2 + cfg.layers)
    return {
        "wte": normal(k_wte, (cfg.vocab, cfg.embed), 0.02, cfg.dtype),
        "wpe": normal(k_wpe, (cfg.seq, cfg.embed), 0.01, cfg.dtype),
        "blocks": [_block_params(k, cfg) for k in k_blocks],
        "ln_f": layer_norm_params(cfg.embed, cfg.dtype),
    }


def batch(key, cfg) -> dict:
    """Random tokens `[b, s + 1]`, split into inputs and next-token labels."""
    tokens = jax.random.randint(key, (cfg.batch, cfg.seq + 1), 0, cfg.vocab, jnp.int32)
    return {"tokens": tokens[:, :-1], "labels": tokens[:, 1:]}


def _maybe_remat(cfg: GPTConfig):
    return jax.checkpoint(_block) if cfg.remat else _block


def loss(params: dict, batch: dict, cfg: GPTConfig) -> jax.Array:
    x = embed(params, batch["tokens"])
    block = _maybe_remat(cfg)
    for i, p in enumerate(params["blocks"]):
        with jax.named_scope(f"block{i}"):
            x = block(p, x)
    return unembed_loss(params, x, batch["labels"])


def _block_names() -> dict:
    ln = {"scale": ("embed",), "bias": ("embed",)}
    return {
        "ln1": ln,
        "attn": dict(ATTENTION_NAMES),
        "ln2": dict(ln),
        "mlp": {
            "w_in": ("embed", "mlp"),
            "b_in": ("mlp",),
            "w_out": ("mlp", "embed"),
            "b_out": ("embed",),
        },
    }


def param_names(cfg) -> dict:
    return {
        "wte": ("vocab", "embed"),
        "wpe": ("seq", "embed"),
        "blocks": [_block_names() for _ in range(cfg.layers)],
        "ln_f": {"scale": ("embed",), "bias": ("embed",)},
    }


def batch_names(cfg) -> dict:
    return {"tokens": ("batch", "seq"), "labels": ("batch", "seq")}


GPT = Model("gpt", GPTConfig, init, batch, loss, param_names, batch_names, PRESETS)


# ---- GPT with a scanned layer stack ---------------------------------------------------------


def init_scan(key, cfg: GPTConfig) -> dict:
    """`gpt`'s params with the blocks stacked on a leading `layers` dim (same values)."""
    params = init(key, cfg)
    params["blocks"] = jax.tree.map(lambda *layers: jnp.stack(layers), *params["blocks"])
    return params


def loss_scan(params: dict, batch: dict, cfg: GPTConfig) -> jax.Array:
    block = _maybe_remat(cfg)

    def body(x, p):
        with jax.named_scope("block"):
            return block(p, x), None

    x = embed(params, batch["tokens"])
    x, _ = jax.lax.scan(body, x, params["blocks"])
    return unembed_loss(params, x, batch["labels"])


def param_names_scan(cfg) -> dict:
    names = param_names(cfg)
    names["blocks"] = jax.tree.map(
        lambda dims: ("layers", *dims), _block_names(), is_leaf=lambda x: type(x) is tuple
    )
    return names


GPT_SCAN = Model(
    "gpt_scan", GPTConfig, init_scan, batch, loss_scan, param_names_scan, batch_names, PRESETS
)
