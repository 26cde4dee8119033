"""The model zoo: every model's training step runs, keeps its shapes, learns, and names its dims."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from . import ext_models
from toast_lab import zoo

MODELS = ("mlp", "gpt", "gpt_scan", "cnn", "moe", "gnn", "llama")

# XLA's CPU backend optimizations triple the compile time of these steps (most of this file's
# runtime) and change nothing the tests look at: the HLO and the results are the same.
jit = functools.partial(jax.jit, compiler_options={"xla_backend_optimization_level": 0})


def is_dim_names(x) -> bool:
    """A leaf of `fn.dim_names`: a plain tuple of `str | None` (optax states are NamedTuples)."""
    return type(x) is tuple and all(n is None or isinstance(n, str) for n in x)


@functools.cache
def built(name):
    """`(fn, args, sample, jitted fn, first step's outputs)`, shared by the tests of one model."""
    fn, args = zoo.get(name)
    sample = zoo.sample(name, seed=0)
    step = jit(fn)
    return fn, args, sample, step, step(*sample)


def test_names():
    assert zoo.names() == MODELS


@pytest.mark.parametrize("name", MODELS)
def test_step_runs_and_keeps_shapes(name):
    fn, args, sample, _, (params, opt_state, loss) = built(name)
    assert loss.shape == () and np.isfinite(float(loss))
    for before, after in ((sample[0], params), (sample[1], opt_state)):
        assert jax.tree.structure(before) == jax.tree.structure(after)
        for x, y in zip(jax.tree.leaves(before), jax.tree.leaves(after)):
            assert (x.shape, x.dtype) == (y.shape, y.dtype)


@pytest.mark.parametrize("name", MODELS)
def test_args_are_abstract_and_match_sample(name):
    fn, args, sample, _, _ = built(name)
    assert len(args) == len(sample) == 3
    assert jax.tree.structure(args) == jax.tree.structure(sample)
    for a, s in zip(jax.tree.leaves(args), jax.tree.leaves(sample)):
        assert isinstance(a, jax.ShapeDtypeStruct)
        assert (a.shape, a.dtype) == (s.shape, s.dtype)


@pytest.mark.parametrize("name", MODELS)
def test_dim_names_cover_every_dim(name):
    fn, args, _, _, _ = built(name)
    assert len(fn.dim_names) == len(args)
    for i, (arg, names) in enumerate(zip(args, fn.dim_names)):
        if names is None:
            assert i == 1, "params and batch must have names"
            continue
        assert jax.tree.structure(names, is_leaf=is_dim_names) == jax.tree.structure(arg)
        for leaf, dims in zip(jax.tree.leaves(arg), jax.tree.leaves(names, is_leaf=is_dim_names)):
            assert is_dim_names(dims) and len(dims) == leaf.ndim, (leaf, dims)
            named = [d for d in dims if d is not None]
            assert len(named) == len(set(named)), f"repeated name in {dims}"
    assert fn.dim_names[2] is not None and fn.dim_names[0] is not None


def test_dim_names_say_what_gpt_dims_are():
    fn, _, _, _, _ = built("gpt")
    params, opt_state, batch = fn.dim_names
    assert params["blocks"][0]["attn"]["wq"] == ("embed", "heads", "head_dim")
    assert params["blocks"][1]["mlp"]["w_in"] == ("embed", "mlp")
    assert params["wte"] == ("vocab", "embed")
    assert batch["tokens"] == ("batch", "seq")
    assert opt_state[0].mu["wte"] == ("vocab", "embed")  # AdamW moments follow the params
    scan_names = built("gpt_scan")[0].dim_names[0]
    assert scan_names["blocks"]["attn"]["wo"] == ("layers", "heads", "head_dim", "embed")
    assert built("moe")[0].dim_names[0]["blocks"][0]["moe"]["w_in"] == ("experts", "embed", "mlp")


@pytest.mark.parametrize("name", ["gpt", "mlp"])
def test_steps_lower_the_loss_on_a_fixed_batch(name):
    _, _, sample, step, (params, opt_state, loss0) = built(name)
    _, _, loss1 = step(params, opt_state, sample[2])
    assert float(loss1) < float(loss0)


def test_initial_losses_are_near_chance():
    gpt_loss = float(built("gpt")[4][2])
    assert abs(gpt_loss - np.log(zoo.config("gpt").vocab)) < 0.5


def test_gpt_scan_matches_gpt():
    gpt, scan = built("gpt"), built("gpt_scan")
    np.testing.assert_allclose(float(scan[4][2]), float(gpt[4][2]), rtol=1e-5)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *gpt[2][0]["blocks"])
    np.testing.assert_array_equal(stacked["attn"]["wq"], scan[2][0]["blocks"]["attn"]["wq"])


def test_sample_has_valid_integer_ranges():
    cfg = zoo.config("gpt")
    tokens = built("gpt")[2][2]["tokens"]
    assert tokens.dtype == jnp.int32 and 0 <= int(tokens.min()) and int(tokens.max()) < cfg.vocab
    g = zoo.config("gnn")
    graph = built("gnn")[2][2]
    for key in ("senders", "receivers"):
        assert 0 <= int(graph[key].min()) and int(graph[key].max()) < g.nodes
    assert int(graph["labels"].max()) < g.classes


def test_presets_are_abstract_and_shardable():
    fn, (params, opt_state, batch) = zoo.get("gpt", size="gpt3-175b")
    n_params = sum(np.prod(x.shape) for x in jax.tree.leaves(params))
    assert 174e9 < n_params < 176e9
    for size in ("gpt2-small", "gpt2-medium", "gpt2-large", "gpt2-xl"):
        fn, args = zoo.get("gpt_scan", size=size)
        for arg, names in zip(args, fn.dim_names):
            name_leaves = jax.tree.leaves(names, is_leaf=is_dim_names)
            for leaf, dims in zip(jax.tree.leaves(arg), name_leaves):
                # Depth stays as published (12, 36 layers); every other dim shards 8 ways.
                assert all(d % 8 == 0 for d, n in zip(leaf.shape, dims) if n != "layers"), size
    assert zoo.get("gpt", size="gpt2-small", layers=3)[0].config.layers == 3


def test_bfloat16():
    fn, args = zoo.get("gpt", dtype="bfloat16")
    assert args[0]["wte"].dtype == args[1][0].mu["wte"].dtype == jnp.bfloat16
    params, _, loss = jax.eval_shape(fn, *args)  # traces the whole step; compiling is slow
    assert params["wte"].dtype == jnp.bfloat16 and loss.dtype == jnp.float32
    fn = zoo.get("mlp", dtype="bfloat16")[0]
    params, _, loss = jit(fn)(*zoo.sample("mlp", dtype="bfloat16"))
    assert params["dense0"]["w"].dtype == jnp.bfloat16 and np.isfinite(float(loss))


def test_config_errors_are_clear():
    with pytest.raises(TypeError, match=r"'gpt'.*unknown config key 'hiddn'.*Valid keys:.*embed"):
        zoo.get("gpt", hiddn=3)
    with pytest.raises(TypeError, match="unknown config key 'seed'"):
        zoo.config("mlp", seed=1)  # the seed is `sample`'s argument, not a config key
    with pytest.raises(TypeError, match="no size 'gpt5'.*'gpt2-small'"):
        zoo.get("gpt", size="gpt5")
    with pytest.raises(KeyError, match="No zoo model 'resnet'.*gpt_scan"):
        zoo.get("resnet")
    with pytest.raises(ValueError, match="not divisible by heads"):
        zoo.get("gpt", embed=60, heads=8)


@pytest.mark.parametrize("build", ["nnx", "equinox"])
def test_external_models_run_under_jit(build):
    fn, args = getattr(ext_models, f"{build}_train_step")()
    sample = getattr(ext_models, f"{build}_sample")()
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in jax.tree.leaves(args))
    assert jax.tree.structure(args) == jax.tree.structure(sample)
    step = jit(fn)
    params, opt_state, loss0 = step(*sample)
    _, _, loss1 = step(params, opt_state, sample[2])
    assert jax.tree.structure(params) == jax.tree.structure(sample[0])
    assert float(loss1) < float(loss0)


@pytest.mark.parametrize("capacity_factor", [0.5, 4.0])
def test_moe_routing_respects_capacity(capacity_factor):
    from toast_lab.zoo import _moe

    cfg = zoo.config("moe", capacity_factor=capacity_factor)
    kx, kr = jax.random.split(jax.random.key(1))
    x = jax.random.normal(kx, (cfg.batch, cfg.seq, cfg.embed))
    router = jax.random.normal(kr, (cfg.embed, cfg.experts))
    dispatch, combine, aux = jax.jit(_moe.route, static_argnums=2)(x, router, cfg)
    assert dispatch.shape == (cfg.batch, cfg.seq, cfg.experts, cfg.capacity)
    per_slot = np.asarray(dispatch.sum(axis=1))  # tokens in each (sequence, expert, slot)
    assert set(np.unique(per_slot)) <= {0.0, 1.0}
    assert (np.diff(per_slot, axis=-1) <= 0).all(), "each expert fills its slots in order"
    per_token = np.asarray(dispatch.sum(axis=(2, 3)))  # kept assignments of each token
    assert per_token.max() <= cfg.top_k
    weights = np.asarray(combine.sum(axis=(2, 3)))
    if capacity_factor == 4.0:  # room for every assignment: nothing dropped
        assert (per_token == cfg.top_k).all()
        np.testing.assert_allclose(weights, 1.0, rtol=1e-5)
    else:  # half the room: assignments are dropped
        assert per_token.sum() < cfg.batch * cfg.seq * cfg.top_k
    assert np.isfinite(float(aux)) and float(aux) >= 1.0 - 1e-5  # 1 when perfectly balanced
