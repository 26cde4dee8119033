"""One tiny training step per library, written the way that library's docs write one.

Every builder returns `(step, args)`: `step(*args)` is one optimizer step on concrete arrays.
Sizes are small (batch 8) so each plan compiles in about a second on 8 simulated devices.
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # before keras is first imported

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

BATCH, SEQ, VOCAB, WIDTH, CLASSES = 8, 16, 64, 32, 8


def _tokens(seed=0, shape=(BATCH, SEQ)):
    return np.random.default_rng(seed).integers(0, VOCAB, shape).astype(np.int32)


def _images(seed=0):
    return np.random.default_rng(seed).normal(size=(BATCH, 16, 16, 3)).astype(np.float32)


def _labels(seed=0):
    return np.random.default_rng(seed + 1).integers(0, CLASSES, (BATCH,)).astype(np.int32)


def _xent(logits, labels):
    return optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()


def linen_scan_remat():
    """flax.linen: an embedding, three residual MLP blocks under `nn.scan(nn.remat(...))`,
    AdamW with a warmup-cosine schedule and global-norm clipping."""
    import flax.linen as nn

    class Block(nn.Module):
        @nn.compact
        def __call__(self, x, _):
            h = nn.Dense(2 * WIDTH, name="up")(nn.LayerNorm()(x))
            return x + nn.Dense(WIDTH, name="down")(nn.gelu(h)), None

    class Model(nn.Module):
        @nn.compact
        def __call__(self, tokens):
            x = nn.Embed(VOCAB, WIDTH)(tokens)
            blocks = nn.scan(nn.remat(Block), variable_axes={"params": 0},
                             split_rngs={"params": True}, length=3)
            x, _ = blocks(name="blocks")(x, None)
            return nn.Dense(VOCAB, name="head")(x)

    model = Model()
    tokens = _tokens()
    params = model.init(jax.random.key(0), tokens)
    tx = optax.chain(optax.clip_by_global_norm(1.0),
                     optax.adamw(optax.warmup_cosine_decay_schedule(0.0, 1e-3, 10, 100)))

    def step(params, opt_state, tokens):
        def loss_fn(p):
            logits = model.apply(p, tokens[:, :-1])
            return _xent(logits, tokens[:, 1:])

        loss, grads = jax.value_and_grad(loss_fn)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), tokens)


def nnx_dropout_batchnorm():
    """flax.nnx: Linear -> BatchNorm -> ReLU -> Dropout -> Linear with `nnx.Rngs` (the step
    returns the advanced RNG key and the batch statistics), trained with nnx.Optimizer."""
    from flax import nnx

    class Net(nnx.Module):
        def __init__(self, rngs):
            # no bias before BatchNorm (it would be subtracted out: its gradient is rounding
            # noise, which Adam scales up to a learning-rate-sized update; see verify's limits)
            self.l1 = nnx.Linear(WIDTH, 64, use_bias=False, rngs=rngs)
            self.bn = nnx.BatchNorm(64, rngs=rngs)
            self.drop = nnx.Dropout(0.1, rngs=rngs)
            self.l2 = nnx.Linear(64, CLASSES, rngs=rngs)

        def __call__(self, x):
            return self.l2(self.drop(nnx.relu(self.bn(self.l1(x)))))

    net = Net(nnx.Rngs(0, dropout=1))
    opt = nnx.Optimizer(net, optax.adam(1e-3), wrt=nnx.Param)
    graphdef, state = nnx.split((net, opt))
    x = np.random.default_rng(0).normal(size=(BATCH, WIDTH)).astype(np.float32)

    def step(state, x, y):
        model, optimizer = nnx.merge(graphdef, state)
        loss, grads = nnx.value_and_grad(lambda m: _xent(m(x), y))(model)
        optimizer.update(model, grads)
        return nnx.state((model, optimizer)), loss

    return step, (state, x, _labels())


def equinox_filter():
    """equinox: an eqx.Module MLP, `eqx.filter_value_and_grad`, params and static split with
    `eqx.partition` (the params tree has `None` leaves), AdamW."""
    import equinox as eqx

    class MLP(eqx.Module):
        layers: list
        act: object = eqx.field(static=True)

        def __init__(self, key):
            k1, k2 = jax.random.split(key)
            self.layers = [eqx.nn.Linear(WIDTH, 64, key=k1), eqx.nn.Linear(64, CLASSES, key=k2)]
            self.act = jax.nn.relu

        def __call__(self, x):
            return self.layers[1](self.act(self.layers[0](x)))

    model = MLP(jax.random.key(0))
    params, static = eqx.partition(model, eqx.is_array)
    tx = optax.adamw(1e-3)
    x = np.random.default_rng(0).normal(size=(BATCH, WIDTH)).astype(np.float32)

    def step(params, opt_state, x, y):
        @eqx.filter_value_and_grad
        def loss_fn(model):
            return _xent(jax.vmap(model)(x), y)

        loss, grads = loss_fn(eqx.combine(params, static))
        updates, opt_state = tx.update(grads, opt_state, params)
        return eqx.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params), x, _labels())


def haiku_resnet():
    """haiku: a tiny ResNet (hk.nets.ResNet, 4 stages of 2 blocks, 8..64 channels) with batch
    norm under `hk.transform_with_state`, Adam."""
    import haiku as hk

    def forward(x, is_training):
        net = hk.nets.ResNet(blocks_per_group=(2, 2, 2, 2), num_classes=CLASSES,
                             bottleneck=False, channels_per_group=(8, 16, 32, 64),
                             use_projection=(False, True, True, True), name="res_net18",
                             initial_conv_config={"output_channels": 8})
        return net(x, is_training)

    net = hk.transform_with_state(forward)
    images = _images()
    params, state = net.init(jax.random.key(0), images, True)
    tx = optax.adam(1e-3)

    def step(params, state, opt_state, images, labels):
        def loss_fn(p):
            logits, new_state = net.apply(p, state, None, images, True)
            return _xent(logits, labels), new_state

        (loss, state), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), state, opt_state, loss

    return step, (params, state, tx.init(params), images, _labels())


def keras_transformer():
    """Keras 3 on JAX: token embedding, multi-head attention, an MLP and layer norms, trained
    with `model.stateless_call` and `optimizer.stateless_apply` (state as lists of arrays).
    Keras broadcasts biases by rank promotion, which the tests' strict mode forbids: the model
    is built and the step runs with it allowed."""
    with jax.numpy_rank_promotion("allow"):
        return _keras_transformer()


def _keras_transformer():
    import keras

    if keras.backend.backend() != "jax":
        import pytest

        pytest.skip("keras is configured for another backend")
    # layer names come from a process-wide counter: a fresh session names them as a new
    # process would ("embedding", not "embedding_1"), whatever was built before
    keras.backend.clear_session()
    inp = keras.Input((SEQ,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, WIDTH)(inp)
    h = keras.layers.LayerNormalization()(h + keras.layers.MultiHeadAttention(4, 8)(h, h))
    f = keras.layers.Dense(WIDTH, activation="gelu")(keras.layers.Dense(64)(h))
    h = keras.layers.LayerNormalization()(h + f)
    model = keras.Model(inp, keras.layers.Dense(VOCAB)(h))
    opt = keras.optimizers.Adam(1e-3)
    opt.build(model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    def compute_loss(trainable, non_trainable, x, y):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, logits), non_trainable

    grad_fn = jax.value_and_grad(compute_loss, has_aux=True)

    def step(state, data):
        with jax.numpy_rank_promotion("allow"):
            trainable, non_trainable, opt_vars = state
            x, y = data
            (loss, non_trainable), grads = grad_fn(trainable, non_trainable, x, y)
            trainable, opt_vars = opt.stateless_apply(opt_vars, grads, trainable)
            return loss, (trainable, non_trainable, opt_vars)

    state = ([v.value for v in model.trainable_variables],
             [v.value for v in model.non_trainable_variables],
             [v.value for v in opt.variables])
    tokens = _tokens()
    return step, (state, (tokens, np.roll(tokens, -1, axis=1)))


BUILDERS = {
    "linen": (linen_scan_remat, "flax"),
    "nnx": (nnx_dropout_batchnorm, "flax"),
    "equinox": (equinox_filter, "equinox"),
    "haiku": (haiku_resnet, "haiku"),
    "keras": (keras_transformer, "keras"),
}
