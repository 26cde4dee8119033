"""A training step as people write it without a module library: no name scopes, layers in a
Python loop over a list of parameter dicts, einsum attention, optax's AdamW. The Lab must draw
it as readably as the zoo's scoped models (tests/test_lab_viewmodel.py, tests/e2e)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax

V, D, H, F, S, B, LAYERS = 64, 32, 4, 64, 16, 8, 2


def init(key):
    ks = iter(jax.random.split(key, 6 * LAYERS + 2))
    n = lambda *shape: 0.02 * jax.random.normal(next(ks), shape)  # noqa: E731
    layers = [{"wq": n(D, H, D // H), "wk": n(D, H, D // H), "wv": n(D, H, D // H),
               "wo": n(H, D // H, D), "w1": n(D, F), "w2": n(F, D),
               "ln1": jnp.ones(D), "ln2": jnp.ones(D)} for _ in range(LAYERS)]
    return {"emb": n(V, D), "layers": layers, "lnf": jnp.ones(D)}


def rms(x, g):
    return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * g[None, None]


def loss_fn(p, tokens, labels):
    x = p["emb"][tokens]
    mask = jnp.tril(jnp.ones((S, S), bool))
    for lp in p["layers"]:
        h = rms(x, lp["ln1"])
        q, k, v = (jnp.einsum("bsd,dhk->bshk", h, lp[w]) for w in ("wq", "wk", "wv"))
        s = jnp.where(mask[None, None], jnp.einsum("bqhk,bthk->bhqt", q, k), -1e9)
        o = jnp.einsum("bhqt,bthk->bqhk", jax.nn.softmax(s, -1), v)
        x = x + jnp.einsum("bqhk,hkd->bqd", o, lp["wo"])
        x = x + jax.nn.gelu(rms(x, lp["ln2"]) @ lp["w1"]) @ lp["w2"]
    logits = rms(x, p["lnf"]) @ p["emb"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


opt = optax.adamw(1e-3)


def step(params, opt_state, tokens, labels):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, labels)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss


def example_args():
    params = init(jax.random.PRNGKey(0))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, V, (B, S)), jnp.int32)
    labels = jnp.asarray(rng.integers(0, V, (B, S)), jnp.int32)
    return params, opt.init(params), tokens, labels
